"""The coordinator's outcome folding (coordinator/outcomes.py): a leftover round added to its shard, and the
clients' phase times summed."""
import pytest

from tunekit.coordinator.outcomes import fold_extra, sum_phases


def test_fold_extra_adds_a_leftover_round_to_the_shard():
    outcome = {"tasks": [{"name": "conv", "trials": 4, "failed": 1, "extra": 0, "tuned_us": 10.0, "untuned_us": 40.0,
                          "fell_at": [[100.0, 20.0], [110.0, 10.0]], "measured_at": [[100.0, 2], [110.0, 4]]},
                         {"name": "dense", "trials": 4, "failed": 0, "tuned_us": 3.0, "untuned_us": 6.0}],
               "trials_done": 8, "trials_failed": 1, "trials_cached": 0}
    extra = {"tasks": [{"name": "conv", "trials": 2, "failed": 1, "extra": 2, "tuned_us": 8.0, "exhausted": True,
                        "fell_at": [[120.0, 12.0], [130.0, 8.0]], "measured_at": [[120.0, 1], [130.0, 2]]},
                       {"name": "dense", "trials": 1, "failed": 0, "tuned_us": 4.0, "fell_at": [[125.0, 4.0]]},
                       {"name": "unknown", "trials": 5, "failed": 5, "tuned_us": 1.0}],
             "trials_done": 3, "trials_failed": 1, "trials_cached": 2}
    fold_extra(outcome, extra)
    conv, dense = outcome["tasks"]
    assert (conv["trials"], conv["failed"], conv["extra"], conv["exhausted"]) == (6, 2, 2, True)
    assert conv["tuned_us"] == 8.0 and conv["speedup"] == 5.0  # a better best replaces the old one
    assert conv["fell_at"] == [[100.0, 20.0], [110.0, 10.0], [130.0, 8.0]]  # the round's falls below the shard's
    assert conv["measured_at"] == [[100.0, 2], [110.0, 4], [120.0, 5], [130.0, 6]]  # counted on from the shard's 4
    assert "measured_at" not in dense  # neither the shard nor the round kept its batches' times
    assert dense["fell_at"] == []  # 4 us is no fall where the shard had reached 3
    assert dense["trials"] == 5 and dense["tuned_us"] == 3.0 and "speedup" not in dense  # a worse one does not
    assert dense["exhausted"] is False and dense["extra"] == 0
    assert len(outcome["tasks"]) == 2  # a task of another shard is not added
    assert (outcome["trials_done"], outcome["trials_failed"], outcome["trials_cached"]) == (11, 2, 2)


def test_sum_phases_adds_clients_and_measures_overhead_over_client_seconds():
    phases = sum_phases([{"total_s": {"search_s": 3.0, "build_s": 2.0, "run_s": 1.0}},
                         {"total_s": {"build_s": 1.0, "run_s": 1.0}}, {}], wall_s=5.0, trials=10)
    assert phases["total_s"] == {"search_s": 3.0, "build_s": 3.0, "run_s": 2.0}
    assert phases["per_trial_s"] == {"search_s": 0.3, "build_s": 0.3, "run_s": 0.2}
    assert phases["clients"] == 3 and phases["wall_s"] == 5.0
    assert phases["overhead_fraction"] == pytest.approx(1 - 5.0 / 15.0, abs=1e-3)  # 3 clients x 5 s
    assert sum_phases([], wall_s=0.0, trials=0)["overhead_fraction"] is None
    busy = sum_phases([{"total_s": {"build_s": 9.0, "run_s": 9.0}}], wall_s=4.0, trials=1)
    assert busy["overhead_fraction"] == 0.0  # work capped at the client-seconds
