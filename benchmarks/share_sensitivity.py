"""Share sensitivity (issue 5): does a model tuned at the share it runs on beat the one tuned at 100%?

For each model: tune at every share of --tuned (default 20,40,100), each with --trials measured
candidates, into one out dir (`<results>/<model>/tune/records-<share>`: one database per share);
then evaluate every tuned variant at every share of --run (default 20,40,60,100) with tunekit's
evaluate (numerics checked against onnxruntime) and render the matrix (matrix.json / .md / .png,
report.html). `<results>/share_sensitivity.md` (and .json) sums it up: for each run share that was
also tuned at (20 and 40 by default), the latency of the variant tuned there vs the one tuned at
100%, their ratio, and whether "tuned-at-share is >= 10% faster than tuned-at-100%" holds
(latency_share <= 0.9 x latency_100); and, for the heaviest tasks, each share's best record (µs,
measured at the share it was tuned at), whether the two shares picked the same schedule, and that
schedule's launch config read from the record's trace (threads per block, blocks, vthreads,
unroll, tile sizes on GPU; parallel / vector extents on CPU).

On the H100. Every call may be cut at 600 s, so give --time-limit-s (a polite stop, then exit 75) and
repeat the *same* command until it exits 0; each call resumes from the results dir. $OUT starts empty
on every call, so keep the results dir in the working tree (carried to the device) and copy it back:

    R=benchmarks/results/share-sensitivity-h100
    python benchmarks/share_sensitivity.py --gpu --model resnet18 --trials 160 --results $R \
        --time-limit-s 540; rc=$?; cp -r $R $OUT/; exit $rc
    (then copy $OUT/share-sensitivity-h100 over $R here, and repeat; then the same with --model transformer)

Estimate (H100, from benchmarks/results/h100-resnet18-gpu40-tuning-time: ~0.9 s per trial at 16 per
batch, ~95 s fixed per tune for import, task extraction, per-task baselines, compiles, latency):
ResNet-18 ~4 min per tuned share at 160 trials, ~2-3 min to evaluate 3 x 4 cells: ~15 min in 2-3
calls; the transformer is smaller (less per trial and per compile): ~10 min. Both fit one
30-minute device budget only just; --trials 128 leaves margin. In one go, where no command limit applies:

    python benchmarks/share_sensitivity.py --gpu --model resnet18,transformer --trials 160 \
        --results $OUT/share_sensitivity

A share is done when `<results>/<model>/report-<share>.json` exists: it is skipped next time. A
share cut off mid-tuning (time limit, SIGTERM, Ctrl-C: a polite stop after the batch in flight)
keeps its records and is resumed up to --trials in total. The evaluation is redone only when the
set of tuned or run shares changed. Results dirs stay small: compiled .so files, MetaSchedule's
work dirs and the generated ONNX models (re-generated, byte-identical, from their seed) are not
kept there. Exit code 0 when done, 75 when stopped early (re-run the same command to continue).

CPU smoke test (pcts are shares of the cores):

    python benchmarks/share_sensitivity.py --cpu --model tiny_cnn --tuned 50,100 --run 50,100 --trials 4
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

EXIT_INCOMPLETE = 75
CLAIM_FASTER = 0.10  # the claim: latency(tuned at share) <= (1 - 0.10) x latency(tuned at 100)
_STARTED = time.time()


def log(msg: str) -> None:
    print(f"[share_sensitivity {time.time() - _STARTED:6.0f}s] {msg}", file=sys.stderr, flush=True)


def _pcts(text: str) -> list[int]:
    try:
        pcts = sorted({int(p) for p in str(text).split(",") if p.strip()})
    except ValueError:
        raise SystemExit(f"share_sensitivity: not a list of integer percentages: {text!r}") from None
    if not pcts or not all(1 <= p <= 100 for p in pcts):
        raise SystemExit(f"share_sensitivity: percentages must be in 1..100: {text!r}")
    return pcts


def _write_json(path: str, data) -> None:
    from tunekit.atomic import write_json_atomic

    write_json_atomic(path, data)


def _read_json(path: str):
    with open(path) as fh:
        return json.load(fh)


# ---------------------------------------------------------------- records: best schedule per task

_BIND = re.compile(r'T\.thread_binding\((?:T\.int\d+\()?(\d+)\)?, thread="([\w.]+)"')
_LOOP = re.compile(r'T\.(parallel|vectorized|unroll)\((?:T\.int\d+\()?(\d+)\)?')
_UNROLL = re.compile(r'"pragma_auto_unroll_max_step": (\d+)')


def schedule_config(workload_mod, trace) -> dict:
    """Launch config of a record: the trace applied to its workload (no build), read off the TIR."""
    from tvm import s_tir

    config: dict = {}
    try:
        decisions = trace.decisions
        config["tiles"] = [list(map(int, decisions[i])) for i in trace.insts
                           if i.kind.name == "SamplePerfectTile" and i in decisions]
        config["categorical"] = [int(decisions[i]) for i in trace.insts
                                 if i.kind.name == "SampleCategorical" and i in decisions]
        sch = s_tir.Schedule(workload_mod)
        trace.apply_to_schedule(sch, remove_postproc=False)
        text = sch.mod.script()
    except Exception as exc:  # a diagnostic only: never fail the benchmark over it
        config["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:120] if str(exc).strip() else ''}"
        return config
    threads: dict[str, int] = {}  # the first binding of each tag: the launch of the (first) kernel
    for extent, tag in _BIND.findall(text):
        threads.setdefault(tag, int(extent))
    if threads:
        config["threads"] = threads
        per_block = 1
        for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            per_block *= threads.get(tag, 1)
        config["threads_per_block"] = per_block
        config["blocks"] = threads.get("blockIdx.x", 1) * threads.get("blockIdx.y", 1) * threads.get("blockIdx.z", 1)
    loops: dict[str, list[int]] = {}  # every distinct extent, in program order (main loop nest first)
    for kind, extent in _LOOP.findall(text):
        if int(extent) not in loops.setdefault(kind, []):
            loops[kind].append(int(extent))
    if loops:
        config["loops"] = loops
    unroll = [int(u) for u in _UNROLL.findall(text)]
    if unroll:
        config["auto_unroll_max_step"] = max(unroll)
    return config


def config_text(cfg: dict | None) -> str:
    if not cfg:
        return "–"
    if "error" in cfg and "tiles" not in cfg:
        return f"({cfg['error']})"
    parts = []
    if "threads_per_block" in cfg:
        parts.append(f"{cfg['threads_per_block']} thr/blk x {cfg['blocks']} blk")
        vthread = cfg["threads"].get("vthread.x")
        if vthread and vthread > 1:
            parts.append(f"vthread {vthread}")
    for kind, extents in cfg.get("loops", {}).items():
        parts.append(f"{kind} {'/'.join(map(str, extents))}")
    if "auto_unroll_max_step" in cfg:
        parts.append(f"unroll {cfg['auto_unroll_max_step']}")
    if cfg.get("tiles"):
        parts.append("tiles " + " ".join("x".join(map(str, t)) for t in cfg["tiles"]))
    return ", ".join(parts) or "–"


def best_records(db_dir: str) -> dict[str, dict]:
    """workload hash -> best record of that workload in one share's database: µs, trace key, config."""
    from tvm.s_tir import meta_schedule as ms

    from tunekit.records.trace_keys import trace_key
    from tunekit.records.baselines import workload_key
    from tunekit.records.database import mean_run_us

    db = ms.database.JSONDatabase(work_dir=db_dir, module_equality="structural")
    best: dict[str, tuple] = {}
    trials: dict[str, int] = {}
    for record in db.get_all_tuning_records():
        key = workload_key(record.workload.mod)
        trials[key] = trials.get(key, 0) + 1
        us = mean_run_us(record.run_secs)
        if us is not None and (key not in best or us < best[key][0]):
            best[key] = (us, record)
    return {key: {"best_us": round(us, 3), "trials": trials[key], "trace_key": trace_key(record.trace),
                  "config": schedule_config(record.workload.mod, record.trace)}
            for key, (us, record) in best.items()}


# ---------------------------------------------------------------- one model

class Stop(Exception):
    pass


def tune_share(model_path: str, model_dir: str, kind: str, pct: int, args) -> dict:
    """Tune one share (resuming its records if a cut-off run left some); the report is kept per share."""
    from tunekit import api
    from tunekit.config import TuneConfig
    from tunekit.records.database import count_trials, database_dir

    label = f"{kind}{pct}"
    tune_dir = os.path.join(model_dir, "tune")
    db_dir = database_dir(tune_dir, label)
    existing = count_trials(db_dir)
    remaining = max(1, args.trials - existing)
    log(f"{os.path.basename(model_dir)}: tuning at {label}: {remaining} trials"
        + (f" (resuming: {existing} already in {db_dir})" if existing else "")
        + f", {args.trials_per_iter} per batch")
    config = TuneConfig(trials=remaining, trials_per_iter=args.trials_per_iter, seed=args.seed,
                        resume=existing > 0, allow_unenforced_share=args.allow_unenforced_share)
    # MetaSchedule's first TuneContext leaves its logger at DEBUG: quiet it again for every share.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    result = api.tune(model_path, **{f"{kind}_pct": pct}, out=tune_dir, config=config)
    report = dict(result.report)
    report["share_sensitivity"] = {"trials_target": args.trials, "trials_in_records": count_trials(db_dir),
                                   "resumed_from_trials": existing}
    # Bulky and re-creatable: evaluate compiles from the records. Keeping them would blow the results dir.
    for path in (result.artifact, os.path.join(tune_dir, "untuned.so"), os.path.join(tune_dir, "report.json")):
        if os.path.isfile(path):
            os.remove(path)
    shutil.rmtree(os.path.join(tune_dir, "work"), ignore_errors=True)
    _write_json(os.path.join(model_dir, f"report-{label}.json"), report)
    log(f"{os.path.basename(model_dir)}: {label} done: {result.untuned_ms:.4f} -> {result.tuned_ms:.4f} ms, "
        f"{report['share_sensitivity']['trials_in_records']} trials in records, {result.wall_s:.0f} s")
    return report


def done_shares(model_dir: str, kind: str) -> list[str]:
    labels = [os.path.basename(p)[len("report-"):-len(".json")]
              for p in glob.glob(os.path.join(model_dir, f"report-{kind}*.json"))]
    return sorted(labels, key=lambda s: int(s[3:]))


def evaluate_model(model_path: str, model_dir: str, kind: str, run_pcts: list[int], args) -> dict | None:
    """evaluate + write_matrix over every finished share; skipped when matrix.json is up to date."""
    from tunekit import api
    from tunekit.reports.matrix import write_matrix

    tuned = done_shares(model_dir, kind)
    run = [f"{kind}{p}" for p in run_pcts]
    matrix_path = os.path.join(model_dir, "matrix.json")
    if os.path.isfile(matrix_path) and not args.re_eval:
        old = _read_json(matrix_path)
        if sorted({r["tuned_at"] for r in old["results"]}) == sorted(tuned) and \
                sorted({r["run_at"] for r in old["results"]}) == sorted(run):
            log(f"{os.path.basename(model_dir)}: matrix up to date ({len(tuned)} tuned x {len(run)} run shares)")
            return old
    log(f"{os.path.basename(model_dir)}: evaluating tuned {tuned} at {run} ({args.repeats} repeats)")
    with tempfile.TemporaryDirectory(prefix="share-sens-records-") as gathered:
        # Only finished shares: a share cut off mid-tuning has records but is not a tuned variant yet.
        for label in tuned:
            os.symlink(os.path.abspath(os.path.join(model_dir, "tune", f"records-{label}")),
                       os.path.join(gathered, f"records-{label}"))
        result = api.evaluate(model_path, records=gathered, **{f"{kind}_pct": ",".join(map(str, run_pcts))},
                              repeats=args.repeats, allow_unenforced_share=args.allow_unenforced_share)
    result["records"] = os.path.join(model_dir, "tune")
    result["trials_per_share"] = args.trials
    files = write_matrix(result, model_dir)
    log(f"{os.path.basename(model_dir)}: wrote {', '.join(os.path.basename(p) for p in files.values())}")
    return _read_json(matrix_path)


def model_summary(name: str, model_dir: str, kind: str, args) -> dict:
    """Claim check from the matrix, per-task record comparison from the databases."""
    tuned = done_shares(model_dir, kind)
    reports = {label: _read_json(os.path.join(model_dir, f"report-{label}.json")) for label in tuned}
    summary: dict = {"model": name, "kind": kind, "tuned": tuned,
                     "trials": {label: {"target": r.get("share_sensitivity", {}).get("trials_target"),
                                        "in_records": r.get("share_sensitivity", {}).get("trials_in_records"),
                                        "tuning_wall_s": r.get("tuning_wall_s"), "wall_s": r.get("wall_s"),
                                        "tuned_ms_at_share": r["latency_ms"]["tuned"]["median_ms"],
                                        "untuned_ms_at_share": r["latency_ms"]["untuned"]["median_ms"],
                                        "environment": r.get("environment")}
                                for label, r in reports.items()}}
    if not tuned:
        return summary
    reference = f"{kind}100" if f"{kind}100" in tuned else tuned[-1]
    summary["reference"] = reference
    matrix_path = os.path.join(model_dir, "matrix.json")
    rows = _read_json(matrix_path)["results"] if os.path.isfile(matrix_path) else []
    cells = {(r["tuned_at"], r["run_at"]): r for r in rows}
    claims = []
    for label in tuned:
        if label == reference or (label, label) not in cells or (reference, label) not in cells:
            continue
        own, ref = cells[(label, label)], cells[(reference, label)]
        claims.append({"run_at": label, "tuned_at_share_ms": own["median_ms"], "tuned_at_share_std_ms": own["std_ms"],
                       "tuned_at_ref_ms": ref["median_ms"], "tuned_at_ref_std_ms": ref["std_ms"],
                       "ratio_ref_over_share": round(ref["median_ms"] / own["median_ms"], 4),
                       "faster_pct": round(100 * (1 - own["median_ms"] / ref["median_ms"]), 2),
                       "claim_holds": own["median_ms"] <= (1 - CLAIM_FASTER) * ref["median_ms"],
                       "difference_exceeds_spread": abs(ref["median_ms"] - own["median_ms"])
                       > own["std_ms"] + ref["std_ms"],
                       "numerics_ok": bool(own.get("numerics_ok", True) and ref.get("numerics_ok", True))})
    summary["claims"] = claims

    # Per task: where the time goes at the reference share (weight x its untuned µs), heaviest first.
    try:
        bests = {label: best_records(os.path.join(model_dir, "tune", f"records-{label}")) for label in tuned}
    except Exception as exc:
        log(f"{name}: reading records failed ({type(exc).__name__}: {exc}); no per-task table")
        bests = {}
    ref_tasks = {t["workload_hash"]: t for t in reports[reference]["tasks"] if t.get("workload_hash")}
    heavy = sorted(ref_tasks.values(), key=lambda t: -(t["weight"] * (t.get("untuned_us") or 0)))[:args.top_tasks]
    tasks = []
    for task in heavy:
        key = task["workload_hash"]
        row = {"task": task["name"], "workload_hash": key, "weight": task["weight"], "shares": {}}
        for label in tuned:
            rep_task = next((t for t in reports[label]["tasks"] if t.get("workload_hash") == key), {})
            best = bests.get(label, {}).get(key)
            row["shares"][label] = {"untuned_us": rep_task.get("untuned_us"), "best_us": best and best["best_us"],
                                    "trials": best["trials"] if best else 0, "record_applied": rep_task.get("record_applied"),
                                    "trace_key": best and best["trace_key"], "config": best and best["config"]}
        tasks.append(row)
    summary["heavy_tasks"] = tasks
    return summary


def _ms(value, std=None) -> str:
    return "–" if value is None else f"{value:.4f}" + (f" ± {std:.4f}" if std is not None else "") + " ms"


def _us(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def render(summaries: list[dict], args) -> str:
    from tunekit.reports.matrix import matrix_markdown

    lines = ["# Share sensitivity: tuned at the share vs tuned at 100%", "",
             f"Claim: at a share S, the model tuned at S is at least {CLAIM_FASTER:.0%} faster than the one tuned "
             f"at 100% (latency_S <= {1 - CLAIM_FASTER:.1f} x latency_100, both run at S; medians of "
             f"{args.repeats} runs).", "", f"Command: `python benchmarks/share_sensitivity.py {' '.join(sys.argv[1:])}`",
             ""]
    for s in summaries:
        lines += [f"## {s['model']} ({s['kind']})", ""]
        if not s["tuned"]:
            lines += ["Nothing tuned yet.", ""]
            continue
        trials = s["trials"]
        lines += ["| tuned at | trials (target / in records) | tuning wall | untuned -> tuned at that share | device |",
                  "| --- | ---: | ---: | --- | --- |"]
        for label, t in trials.items():
            env = t.get("environment") or {}
            where = (f"{env.get('gpu_name')}, {env.get('sm_count_at_share')} SMs" if s["kind"] == "gpu"
                     else f"{len(env.get('cores_at_share') or [])} cores")
            if env.get("share_enforced") is False:
                where += " (UNENFORCED)"
            lines.append(f"| {label} | {t['target']} / {t['in_records']} | {t['tuning_wall_s']} s | "
                         f"{_ms(t['untuned_ms_at_share'])} -> {_ms(t['tuned_ms_at_share'])} | {where} |")
        lines.append("")
        matrix_path = os.path.join(args.results, s["model"], "matrix.json")
        if os.path.isfile(matrix_path):
            lines += ["Matrix (median ± std; files: "
                      f"[matrix.md]({s['model']}/matrix.md), [plot]({s['model']}/latency_vs_share.png), "
                      f"[report.html]({s['model']}/report.html)):", "",
                      matrix_markdown(_read_json(matrix_path)["results"]), ""]
        else:
            lines += ["Not evaluated yet (no matrix.json).", ""]
        if s.get("claims"):
            ref = s["reference"]
            lines += [f"| run at S | tuned at S | tuned at {ref} | {ref} / S | S faster by | claim (>= "
                      f"{CLAIM_FASTER:.0%}) | beyond spread |", "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
            for c in s["claims"]:
                lines.append(f"| {c['run_at']} | {_ms(c['tuned_at_share_ms'], c['tuned_at_share_std_ms'])} | "
                             f"{_ms(c['tuned_at_ref_ms'], c['tuned_at_ref_std_ms'])} | {c['ratio_ref_over_share']:.3f} | "
                             f"{c['faster_pct']:.1f}% | {'holds' if c['claim_holds'] else 'does NOT hold'} | "
                             f"{'yes' if c['difference_exceeds_spread'] else 'no'}"
                             + ("" if c["numerics_ok"] else " (numerics MISMATCH)") + " |")
            lines.append("")
        if s.get("heavy_tasks"):
            tuned = s["tuned"]
            lines += [f"Heaviest tasks (weight x untuned µs at {s['reference']}). Best µs is each share's best record, "
                      "measured at the share it was tuned at (so not a cross-share measurement); 'same' says whether "
                      f"the share picked the same schedule (trace and decisions) as {s['reference']}; config is read "
                      "from the best record's trace.", "",
                      "| task | weight | " + " | ".join(f"{t} untuned / best µs (trials)" for t in tuned)
                      + " | same schedule as " + s["reference"] + " | " + " | ".join(f"{t} config" for t in tuned) + " |",
                      "| --- | ---: |" + " ---: |" * len(tuned) + " --- |" + " --- |" * len(tuned)]
            for task in s["heavy_tasks"]:
                sh = task["shares"]
                ref_key = sh.get(s["reference"], {}).get("trace_key")
                same = ", ".join(f"{t}: " + ("–" if not (sh[t]["trace_key"] and ref_key)
                                             else "same" if sh[t]["trace_key"] == ref_key else "differs")
                                 for t in tuned if t != s["reference"]) or "–"
                applied = {t: sh[t].get("record_applied") for t in tuned}
                lines.append(f"| {task['task']} | {task['weight']} | "
                             + " | ".join(f"{_us(sh[t]['untuned_us'])} / {_us(sh[t]['best_us'])} ({sh[t]['trials']})"
                                          + (" not applied" if applied[t] is False else "") for t in tuned)
                             + f" | {same} | " + " | ".join(config_text(sh[t]["config"]) for t in tuned) + " |")
            lines.append("")
    return "\n".join(lines)


def write_summary(models: list[str], kind: str, args) -> None:
    """Every model with results in --results, not only this call's: split calls end in one summary."""
    names = sorted({*models, *(os.path.basename(os.path.dirname(p))
                               for p in glob.glob(os.path.join(args.results, "*", f"report-{kind}*.json")))})
    summaries = [model_summary(name, os.path.join(args.results, name), kind, args) for name in names]
    _write_json(os.path.join(args.results, "share_sensitivity.json"),
                {"trials_per_share": args.trials, "claim_faster": CLAIM_FASTER, "models": summaries})
    with open(os.path.join(args.results, "share_sensitivity.md"), "w") as fh:
        fh.write(render(summaries, args))


def _check_time_left(args, step: str) -> None:
    """Under --time-limit-s, a step that cannot get far is not started: a tune pays ~1-2 min of fixed
    cost (import, baselines, compiles) before its first trial, and would pay it again on resume."""
    if args.time_limit_s > 0 and args.time_limit_s - (time.time() - _STARTED) < args.min_step_s:
        log(f"not {step}: less than {args.min_step_s:.0f} s left of --time-limit-s {args.time_limit_s:.0f}")
        raise KeyboardInterrupt


def model_file(name: str, work: str) -> str:
    if os.path.isfile(name):
        return os.path.abspath(name)
    from tunekit.models.examples import save_example

    path = os.path.join(work, f"{name}.onnx")
    if not os.path.isfile(path):
        save_example(name, path)  # seeded: byte-identical every time, so --resume's model check passes
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append",
                        help="example name (tiny_cnn, resnet18, mobilenet, transformer) or ONNX path; repeatable "
                        "or comma-separated (default resnet18,transformer)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true", help="shares are %% of the GPU's SMs, under MPS (default)")
    where.add_argument("--cpu", action="store_true", help="shares are %% of the CPU cores (smoke test)")
    parser.add_argument("--tuned", default="20,40,100", help="shares to tune at (default 20,40,100)")
    parser.add_argument("--run", default="20,40,60,100", help="shares to run each tuned variant at (default 20,40,60,100)")
    parser.add_argument("--trials", type=int, default=160,
                        help="measured candidates per tuned share, over all tasks (default 160: ~3 min at ~1 s/trial)")
    parser.add_argument("--trials-per-iter", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=20, help="latency repeats per matrix cell")
    parser.add_argument("--top-tasks", type=int, default=6, help="heaviest tasks in the per-task table")
    parser.add_argument("--results", default=None,
                        help="results dir (default benchmarks/results/share-sensitivity-<gpu|cpu>)")
    parser.add_argument("--work", help="where the generated ONNX models go (default: a temp dir)")
    parser.add_argument("--no-eval", action="store_true", help="only tune (evaluate in a later call)")
    parser.add_argument("--re-eval", action="store_true", help="evaluate even when matrix.json is up to date")
    parser.add_argument("--time-limit-s", type=float, default=0,
                        help="stop politely after this many seconds (after the batch in flight), keeping every "
                        "measured trial; re-run to continue (e.g. 540 under a 600 s command limit)")
    parser.add_argument("--min-step-s", type=float, default=150,
                        help="with --time-limit-s: do not start a tune or an evaluation with less time left (default 150)")
    parser.add_argument("--allow-unenforced-share", action="store_true")
    args = parser.parse_args(argv)
    kind = "cpu" if args.cpu else "gpu"
    # as the `tunekit` command does: no per-iteration MetaSchedule / XGBoost tables on stderr

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tvm").setLevel(logging.ERROR)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    models = [m.strip() for spec in (args.model or ["resnet18,transformer"]) for m in spec.split(",") if m.strip()]
    tuned_pcts, run_pcts = _pcts(args.tuned), _pcts(args.run)
    if args.trials < 1 or args.trials_per_iter < 1:
        raise SystemExit("share_sensitivity: --trials and --trials-per-iter must be positive")
    args.results = os.path.abspath(args.results or os.path.join(HERE, "results", f"share-sensitivity-{kind}"))
    os.makedirs(args.results, exist_ok=True)

    from tunekit.interrupts import request_stop

    def on_signal(signum, frame):
        log(f"signal {signum}: stopping after the batch in flight; records so far are kept")
        request_stop()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
        signal.signal(sig, on_signal)
    if args.time_limit_s > 0:
        signal.setitimer(signal.ITIMER_REAL, args.time_limit_s)
    log(f"{kind}: models {models}, tuned at {tuned_pcts}, run at {run_pcts}, {args.trials} trials per tuned share, "
        f"results in {args.results}")
    work = args.work or tempfile.mkdtemp(prefix="share-sens-models-")
    status = 0
    try:
        for name in models:
            model_path = model_file(name, work)
            name = os.path.splitext(os.path.basename(name))[0]
            model_dir = os.path.join(args.results, name)
            os.makedirs(model_dir, exist_ok=True)
            for pct in tuned_pcts:
                label = f"{kind}{pct}"
                if os.path.isfile(os.path.join(model_dir, f"report-{label}.json")):
                    log(f"{name}: {label} already tuned (report-{label}.json): skipped")
                    continue
                _check_time_left(args, f"tuning {name} at {label}")
                tune_share(model_path, model_dir, kind, pct, args)
                write_summary(models, kind, args)  # partial results after every step
            if args.no_eval:
                continue
            _check_time_left(args, f"evaluating {name}")
            evaluate_model(model_path, model_dir, kind, run_pcts, args)
            write_summary(models, kind, args)
    except KeyboardInterrupt:
        log("stopped early: partial results written; re-run the same command to continue")
        status = EXIT_INCOMPLETE
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    write_summary(models, kind, args)
    log(f"summary: {os.path.join(args.results, 'share_sensitivity.md')}")
    if status == 0:
        print(open(os.path.join(args.results, "share_sensitivity.md")).read())
    return status


if __name__ == "__main__":
    sys.exit(main())
