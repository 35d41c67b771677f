"""The several-shares comparison (reports/shares.py) on hand-made results."""
from tunekit.reports.shares import compare_shares
from tunekit.results import TuneResult


def _result(share, untuned_ms, tuned_ms, tasks, trials=8):
    report = {"model": "m.onnx", "tasks": tasks, "tuning_wall_s": 3.5, "environment": {"share": share}}
    return TuneResult(share=share, out_dir="o", records_dir=f"o/records-{share}", artifact=f"o/m-{share}.so",
                      report_path=f"o/report-{share}.json", untuned_ms=untuned_ms, tuned_ms=tuned_ms, trials=trials,
                      wall_s=1.0, report=report)


def test_compare_shares_counts_tasks_whose_best_differs():
    a = _result("cpu50", 2.0, 1.0, [{"name": "conv", "workload_hash": "h1", "tuned_us": 10.0},
                                     {"name": "dense", "workload_hash": "h2", "tuned_us": 5.0},
                                     {"name": "pool", "workload_hash": "h3", "tuned_us": None},
                                     {"name": "relu", "tuned_us": 1.0},
                                     {"name": "add", "workload_hash": "h4", "tuned_us": 4.0, "best_trace": "t1"},
                                     {"name": "mul", "workload_hash": "h5", "tuned_us": 3.0, "best_trace": "t2"}])
    b = _result("cpu100", 1.5, 0.5, [{"name": "conv", "workload_hash": "h1", "tuned_us": 7.0},
                                      {"name": "dense", "workload_hash": "h2", "tuned_us": 5.0},
                                      {"name": "pool", "workload_hash": "h3", "tuned_us": 3.0},
                                      {"name": "relu", "tuned_us": 2.0},
                                      {"name": "add", "workload_hash": "h4", "tuned_us": 6.0, "best_trace": "t1"},
                                      {"name": "mul", "workload_hash": "h5", "tuned_us": 3.0, "best_trace": "t3"}])
    report = compare_shares([a, b])
    # conv (10 vs 7) and relu (keyed by name: 1 vs 2) differ; dense is equal; pool is tuned at one share only;
    # with trace keys (measure every share) the schedule decides: add is one schedule timed at two shares,
    # mul two schedules that happen to time alike
    assert report["tasks_whose_best_differs"] == 3
    by_name = {t["name"]: t for t in report["tasks_best_us"]}
    assert by_name["conv"] == {"name": "conv", "cpu50": 10.0, "cpu100": 7.0}
    assert [r["share"] for r in report["shares"]] == ["cpu50", "cpu100"]  # in the order given
    assert report["shares"][1]["speedup"] == 3.0 and report["shares"][0]["records_dir"] == "o/records-cpu50"
    table = report["table_md"].splitlines()
    assert table[0].startswith("| share |") and len(table) == 4
    assert table[2] == "| cpu50 | 2.0 | 1.0 | 2.0 | 8 | 3.5 |"
    assert table[3] == "| cpu100 | 1.5 | 0.5 | 3.0 | 8 | 3.5 |"
    assert list(report["per_share"]) == ["cpu50", "cpu100"] and report["model"] == "m.onnx"
    reversed_report = compare_shares([b, a])
    assert [line.split("|")[1].strip() for line in reversed_report["table_md"].splitlines()[2:]] == ["cpu100", "cpu50"]
    same = compare_shares([a, _result("cpu100", 1.5, 0.5, a.report["tasks"])])
    assert same["tasks_whose_best_differs"] == 0
