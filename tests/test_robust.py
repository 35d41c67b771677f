"""The share-robust choice on synthetic latency matrices (no TVM)."""
import math

from tunekit.records.robust import robust_choice

SHARES = ["gpu20", "gpu40", "gpu100"]


def test_the_choice_minimizes_the_worst_regret_not_any_single_share():
    latency = {
        "fast-at-100": {"gpu20": 30.0, "gpu40": 16.0, "gpu100": 5.0},   # best at 100%, 1.5x at 20%
        "fast-at-20": {"gpu20": 20.0, "gpu40": 12.0, "gpu100": 9.0},    # best at 20% and 40%, 1.8x at 100%
        "balanced": {"gpu20": 22.0, "gpu40": 12.5, "gpu100": 6.0},      # never the best, never far from it
    }
    choice = robust_choice(latency, SHARES)
    assert choice.candidate == "balanced"
    assert math.isclose(choice.worst_regret, 1.2) and math.isclose(choice.regret["gpu100"], 1.2)
    assert math.isclose(choice.regret["gpu20"], 1.1)


def test_a_candidate_best_everywhere_has_no_regret_and_missing_measurements_are_left_out():
    latency = {"a": {"gpu20": 10.0, "gpu40": 5.0, "gpu100": 2.0}, "b": {"gpu20": 11.0, "gpu40": 6.0, "gpu100": 3.0},
               "unmeasured-at-100": {"gpu20": 1.0, "gpu40": 1.0}}
    choice = robust_choice(latency, SHARES)
    assert choice.candidate == "a" and choice.worst_regret == 1.0
    assert robust_choice({"x": {"gpu20": 1.0}}, SHARES) is None
    assert robust_choice({}, SHARES) is None


def test_ties_go_to_the_smaller_total_regret():
    latency = {"p": {"gpu20": 10.0, "gpu40": 10.0, "gpu100": 12.0},   # regrets 1.0, 1.0, 1.2
               "q": {"gpu20": 12.0, "gpu40": 12.0, "gpu100": 10.0}}   # regrets 1.2, 1.2, 1.0
    assert robust_choice(latency, SHARES).candidate == "p"
