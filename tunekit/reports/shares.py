"""The report of a run that tuned several shares: each share's result side by side, per task too."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def compare_shares(results) -> dict:
    """`results`: TuneResults of one model, one per share. Returns report.json's content."""
    shares = [r.share for r in results]
    rows = [{"share": r.share, "untuned_ms": round(r.untuned_ms, 4), "tuned_ms": round(r.tuned_ms, 4),
             "speedup": round(r.speedup, 3), "trials": r.trials,
             "tuning_wall_s": r.report.get("tuning_wall_s"), "records_dir": r.records_dir,
             "artifact": r.artifact, "report": r.report_path} for r in results]
    per_task: dict[str, dict] = {}
    best_of: dict[str, dict] = {}  # task -> {share: its best trace key (its latency where there is none)}
    for r in results:
        for task in r.report.get("tasks", []):
            entry = per_task.setdefault(task.get("workload_hash") or task["name"], {"name": task["name"]})
            entry[r.share] = task.get("tuned_us")
            key = task.get("workload_hash") or task["name"]
            best_of.setdefault(key, {})[r.share] = task.get("best_trace") or task.get("tuned_us")
    # A task's best differs when another schedule won at another share (its trace key; the latency
    # where the report has no trace key).
    differing = [key for key, best in best_of.items() if len({v for v in best.values() if v is not None}) > 1]
    launches = _launches(results)
    for key, entry in per_task.items():
        if key in launches:
            entry["launch"] = launches[key]
    launch_differs = [key for key, by_share in launches.items()
                      if len({(v["blocks"], v["threads"]) for v in by_share.values()}) > 1]
    lines = ["| share | untuned ms | tuned ms | speedup | trials | tuning s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['share']} | {r['untuned_ms']} | {r['tuned_ms']} | {r['speedup']} | {r['trials']} | "
              f"{r['tuning_wall_s']} |" for r in rows]
    return {"model": results[0].report.get("model") if results else None, "shares": rows,
            "tasks_best_us": list(per_task.values()), "tasks_whose_best_differs": len(differing),
            "tasks_whose_launch_differs": len(launch_differs),
            "table_md": "\n".join(lines),
            "environment": results[0].report.get("environment") if results else None,
            "per_share": {r.share: r.report for r in results}}


def _launches(results) -> dict[str, dict]:
    """{task: {share: blocks, threads and waves on the share's SMs}} of each GPU share's best records:
    does the best schedule at a small share launch differently from the best at 100%?"""
    from ..records.launch import best_launches, with_waves

    launches: dict[str, dict] = {}
    for r in results:
        if not (r.records_dir and r.share.startswith("gpu")):
            continue
        sm_count = (r.report.get("environment") or {}).get("sm_count_at_share")
        try:
            shapes = best_launches(r.records_dir)
        except Exception as exc:  # a report extra: it never fails a run whose artifacts are written
            log.warning("launch shapes of %s left out: %s", r.share, str(exc).splitlines()[-1][:200] if str(exc) else exc)
            continue
        for key, shape in shapes.items():
            launches.setdefault(key, {})[r.share] = with_waves(shape, sm_count)
    return launches
