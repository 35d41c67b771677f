"""The benchmark scripts' own arithmetic: what a committed table claims comes from these functions."""
import importlib
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def scaling():
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("coordinator_scaling")
    finally:
        sys.path.remove(BENCHMARKS)


def _row(label, trials, wall):
    return {"label": label, "ray": True, "clients": 2, "servers": 2, "cores": 16, "tuning_wall_s": wall,
            "process_wall_s": wall + 90, "trials": trials, "trials_per_s": round(trials / wall, 3),
            "tuned_ms": 0.5, "tuned_std_ms": 0.01, "cpu_speed": [100.0, 90.0]}


def test_a_setup_run_twice_is_pooled_over_its_runs_and_compared_with_the_first(scaling):
    """Runs in the order 1, 2, 2, 1 GPUs (a drift of the machine's speed falls on both setups): each setup's
    trials/s is all its trials over all its tuning walls, not the mean of its runs' rates."""
    rows = [_row("2 client(s) x 2 server(s) x 1 GPU(s)", 768, 160.0),
            _row("4 client(s) x 2 server(s) x 2 GPU(s)", 768, 100.0),
            _row("4 client(s) x 2 server(s) x 2 GPU(s) (run 2)", 768, 92.0),
            _row("2 client(s) x 2 server(s) x 1 GPU(s) (run 2)", 768, 180.0),
            {**_row("1 process, no Ray", 768, 300.0), "ray": False}]  # not a coordinator setup: not pooled
    one, two = scaling.pooled(rows)
    assert (one["setup"], one["runs"], one["trials"], one["tuning_wall_s"]) == \
        ("2 client(s) x 2 server(s) x 1 GPU(s)", 2, 1536, 340.0)
    assert two["trials_per_s"] == round(1536 / 192.0, 3) and two["each_trials_per_s"] == [7.68, 8.348]
    text = scaling.table(rows)
    assert f"| {two['trials_per_s'] / one['trials_per_s']:.2f}x |" in text.splitlines()[-1]  # 1.77x
    assert "| 1.00, 0.90 |" in text  # each setup's CPU speed before and after, against the first's before
    # one run of each: no pooled table
    assert "pooled" not in scaling.table(rows[:2])
