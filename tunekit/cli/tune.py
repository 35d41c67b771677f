"""`tunekit tune`: one share, several shares (one search measured at every share, or Ray), or the smallest
share that meets a latency SLO."""
from __future__ import annotations

import os
import sys

from ..errors import TunekitError
from . import native_log
from .common import EXIT_ERROR, EXIT_OK, EXIT_SLO_NOT_MET, add_share, emit, input_shapes, show_progress


def add_arguments(p) -> None:
    p.add_argument("model", nargs="+", help="an ONNX model; several, or a fleet YAML file, tune a fleet: one search "
                   "and one budget for all of them, each into <out>/<name> (docs/usage.md: Fleets)")
    add_share(p, many=True, auto=True)
    p.add_argument("--trials", type=int, help="total measured candidates, per share (default 64; with "
                   "--time-budget: as many as the budget allows)")
    p.add_argument("--trials-per-iter", type=int)
    p.add_argument("--time-budget", dest="time_budget_s", type=float, metavar="S",
                   help="stop tuning after S seconds (batches in flight still finish); with --resume the next run "
                   "continues. --trials, when given, still caps the run")
    p.add_argument("--warm-start", action="append", metavar="DIR",
                   help="start from the records of another run (a tune out dir or a records dir; repeatable): the "
                   "best of them per task are measured again at this share, then the search goes on from them")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16"],
                   help="auto (default): fp16 with fp32 accumulation and NHWC convs on a GPU with tensor cores, "
                   "fp32 on CPU")
    p.add_argument("--servers", type=int, help="runner servers at the share, per GPU (or per node for a CPU share); "
                   "up to 100/pct fit on one device without overlapping (default 1)")
    p.add_argument("--clients", type=int, help="tuning clients (Ray actors) per share, each tuning a shard of the "
                   "tasks; with it (or --gpus, --client-nodes, --ray-address or RAY_ADDRESS) the run "
                   "goes through the Ray coordinator, started here unless a cluster is given (default: 1 process, no Ray)")
    p.add_argument("--gpus", help="GPU indices to put runner servers on, e.g. 0,1 (default: every visible GPU)")
    p.add_argument("--ray-address", help="join this Ray cluster (default: $RAY_ADDRESS, else start Ray here)")
    p.add_argument("--client-nodes", metavar="WHERE",
                   help="Ray nodes for the tuning clients: any (default, spread), cpu-only (nodes without GPUs) or "
                   "a custom resource that client nodes advertise, e.g. tunekit_client (ray start --resources "
                   "'{\"tunekit_client\": 1}'); for a CPU share those nodes host no runner servers")
    p.add_argument("--oversubscribe", action="store_true", default=None,
                   help="allow the shares on one device to sum past 100%%: this run's shares tuned at the same "
                   "time, and other tunekit jobs on this machine (the ledger refuses a job that would pass 100%%)")
    p.add_argument("--wait-for-share", dest="share_wait_s", type=float, metavar="S",
                   help="when other tunekit jobs hold too much of the device, wait up to S seconds for them to "
                   "leave instead of being refused (default 0)")
    p.add_argument("--robust", action="store_true", default=None,
                   help="with several shares: also write <model>-robust.so, one artifact whose schedules minimize the "
                   "model's worst regret (latency / best latency) over the listed shares; report.json gives "
                   "its regret at each share next to every share's own artifact")
    p.add_argument("--engine", choices=["tunekit", "stock"],
                   help="tunekit's fast tuning loop (default) or stock MetaSchedule, for comparison (one process only)")
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", action="store_true",
                   help="continue the records in --out (never re-measures a candidate already there)")
    p.add_argument("--config", help="YAML file with TuneConfig keys; flags override it")
    p.add_argument("--listen-host", metavar="HOST",
                   help="address the RPC tracker and runner servers listen on (default 127.0.0.1); any other "
                   "needs --rpc-secret-file or TUNEKIT_RPC_SECRET (docs/running.md: Security)")
    p.add_argument("--rpc-secret-file", metavar="PATH",
                   help="shared secret (first line, chmod 600) that runner servers demand before loading code")
    p.add_argument("--out", help="output dir (default ./tunekit-out/<model>-<share>)")
    p.add_argument("--slo-ms", metavar="MS",
                   help="latency SLO mode: tune at the smallest share whose tuned latency is <= MS milliseconds. "
                   "--gpu-pct/--cpu-pct then take a list of candidate shares (default gpu 20,40,60,100, "
                   "cpu 25,50,75,100; not 'auto'); each is tuned with --trials, smallest first, into "
                   "<out>/<share>/, stopping at the first that meets the SLO; <out>/slo.json holds the result "
                   "(default out ./tunekit-out/<model>-slo-<gpu|cpu>). Exit code 0 when the SLO is met, "
                   "3 when no candidate share meets it (then every candidate was tuned and the best is named)")
    p.add_argument("--slo-max-speedup", type=float, metavar="X",
                   help="with --slo-ms: skip a share whose untuned latency is more than X times the SLO "
                   "(default: skip none; tuning can give several x)")


_CONFIG_FLAGS = ("trials", "trials_per_iter", "servers", "engine", "seed", "listen_host", "rpc_secret_file",
                 "time_budget_s", "precision", "oversubscribe", "share_wait_s", "robust")


def tune_config(args, *, values: dict | None = None):
    """flag > YAML (--config, or a fleet file's `values`) > default. The YAML may also hold gpu_pct, cpu_pct
    and out."""
    from ..config import TuneConfig, load_yaml_config

    values = dict(values) if values is not None else load_yaml_config(args.config) if args.config else {}
    for key in ("gpu_pct", "cpu_pct", "out"):
        if getattr(args, key) is None and key in values:
            setattr(args, key, values[key])
        values.pop(key, None)
    values.update({flag: getattr(args, flag) for flag in _CONFIG_FLAGS if getattr(args, flag, None) is not None})
    if args.warm_start:
        values["warm_start"] = [*values.get("warm_start", []), *args.warm_start]
    values["input_shapes"] = {**(values.get("input_shapes") or {}), **input_shapes(args)}
    if args.resume:
        values["resume"] = True
    if args.allow_unenforced_share:
        values["allow_unenforced_share"] = True
    return TuneConfig(**values)


def _pct(text, flag):
    if text is None:
        return None
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return int(str(text))
    except ValueError:
        raise TunekitError(f"{flag} must be an integer percentage 1..100 or auto, got {text!r}") from None


def _several(args) -> bool:
    return any("," in str(v) for v in (args.gpu_pct, args.cpu_pct) if v is not None)


def coordinator_config(args, *, oversubscribe: bool = False):
    """A CoordinatorConfig when the run should go through Ray, else None (one process).
    `oversubscribe`: the run's TuneConfig.oversubscribe (--oversubscribe or the YAML's)."""
    from ..config import CoordinatorConfig

    wanted = (args.clients is not None or args.gpus is not None or args.ray_address or os.environ.get("RAY_ADDRESS")
              or args.client_nodes is not None)
    if not wanted:
        return None
    gpus = None
    if args.gpus is not None:
        try:
            gpus = [int(g) for g in str(args.gpus).split(",") if g.strip()]
        except ValueError:
            gpus = []
        if not gpus or min(gpus) < 0:
            raise TunekitError(f"--gpus must be a list of GPU indices such as 0,1, got {args.gpus!r}")
    return CoordinatorConfig(clients=args.clients if args.clients is not None else 2, gpus=gpus,
                             ray_address=args.ray_address, oversubscribe=bool(args.oversubscribe or oversubscribe),
                             client_nodes=args.client_nodes or "any")


def _tune_slo(args) -> int:
    """`tune --slo-ms`: the SLO walk over the candidate shares; EXIT_SLO_NOT_MET if none meets it."""
    from .. import api
    from ..slo import check_slo_ms, describe

    if args.slo_ms is None:
        raise TunekitError("--slo-max-speedup needs --slo-ms")
    slo_ms = check_slo_ms(args.slo_ms)  # before the model is loaded: a typo fails at once
    ray_flags = [flag for flag, attr in (("--clients", "clients"), ("--gpus", "gpus"), ("--ray-address", "ray_address"),
                                         ("--client-nodes", "client_nodes"))
                 if getattr(args, attr, None)]
    if ray_flags:  # the SLO walk tunes one share at a time, in this process: refuse rather than ignore them
        raise TunekitError(f"--slo-ms does not go through the Ray coordinator: drop {', '.join(ray_flags)}")
    result = api.tune_for_slo(args.model, slo_ms=slo_ms, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, out=args.out,
                              config=tune_config(args), max_speedup=args.slo_max_speedup,
                              show_progress=show_progress(args))
    emit(args, result.to_dict(), describe(result))
    return EXIT_OK if result.met else EXIT_SLO_NOT_MET


def _tune_shares(args, config, coordinator) -> int:
    from .. import api

    result = api.tune_shares(args.model, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, out=args.out, config=config,
                             coordinator=coordinator, show_progress=show_progress(args))
    native_log.write_to(result.out_dir)  # the default out dir
    payload = {"out_dir": result.out_dir, "report_path": result.report_path, "report": result.report}
    emit(args, payload, result.report["table_md"] + f"\n\n{result.report['search']}; "
         f"{result.report['tasks_whose_best_differs']} task(s) have a different best record per share"
         + _robust_lines(result.report.get("robust")) + f"\nreport: {result.report_path}")
    for report in result.report.get("per_share", {}).values():
        warn_fallbacks(report)
    return EXIT_OK


def kernels_line(report: dict) -> str:
    """Which tasks run kernels of another kind than their own, in a line of the summary ("" where none do)."""
    from ..kernels.candidates import other_kind

    tasks = [t for t in report.get("tasks", []) if other_kind(t.get("kernel"))]
    fused = [r for r in report.get("fused_kernels", []) if other_kind(r.get("kernel"))]
    if not tasks and not fused:
        return ""
    if report.get("artifact_choice") == "untuned":  # the shipped build has none of the tuned kernels
        return (f"\nkernels: none shipped; the tuned build (with {len(tasks) + len(fused)} kernel(s) of another kind) "
                "measured slower than the untuned one (report artifact_choice)")
    kinds = "/".join(sorted({row["kernel"] for row in tasks + fused}))
    return (f"\nkernels: {kinds} for {len(tasks)} task(s) and {len(fused)} fused attention(s) "
            "(report tasks[].kernel, fused_kernels)")


def warn_fallbacks(report: dict) -> None:
    """One line on stderr when tasks kept their untuned kernel because they kept failing (tasks[].fallback)."""
    fell = [t for t in report.get("tasks", []) if t.get("fallback")]
    if fell:
        first = fell[0]
        print(f"tunekit: warning: {len(fell)} task(s) at {report.get('share')} kept their untuned kernel "
              f"(report tasks[].fallback), e.g. {first['name']}: {first['fallback']}", file=sys.stderr, flush=True)


def _robust_lines(robust: dict | None) -> str:
    """The regret matrix: each artifact's latency / the best artifact's, at every share."""
    if not robust:
        return ""
    shares = robust["shares"]
    lines = ["", "", "regret (latency / the best artifact at that share), per share:",
             "| artifact | " + " | ".join(shares) + " | worst |", "| --- |" + " ---: |" * (len(shares) + 1)]
    for name, row in robust["matrix"].items():
        cells = [f"{row['regret'].get(s, float('nan')):.3f}" for s in shares]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['worst_regret']:.3f} |")
    estimate = robust.get("kernel_sum_estimate")
    if estimate:  # what the per-task choice expected from its kernels, and what no choice could beat
        lines.append(f"per-task choice, from its kernels' times: worst regret {estimate['worst_regret']:.3f} "
                     f"(no choice from these candidates below {estimate['lower_bound']:.3f})")
    where = ", ".join(f"{variant} at {share}" for share, variant in (robust.get("variant_at") or {}).items())
    if where:  # a variant per share, the one fastest where it runs (deploy.variants)
        lines.append(f"robust model: a variant per share, timed at load; here it ran {where} "
                     f"(static choice, its `main`: {robust.get('static_choice')})")
    return "\n".join(lines) + f"\nrobust model: {robust['artifact']}"


def _is_fleet(args) -> bool:
    return len(args.model) > 1 or args.model[0].endswith((".yaml", ".yml"))


def _tune_fleet(args) -> int:
    """Several models (or a fleet file) tuned as one fleet; exit 1 when any of them failed (the rest are written)."""
    from .. import api
    from ..config import FleetModel, load_fleet_file

    if args.slo_ms is not None or args.slo_max_speedup is not None:
        raise TunekitError("--slo-ms tunes one model, not a fleet")
    if _several(args):
        raise TunekitError("a fleet gives one share per model: put each model's own in a fleet file")
    files = [m for m in args.model if m.endswith((".yaml", ".yml"))]
    if files and len(args.model) > 1:
        raise TunekitError("give one fleet file, or several ONNX models, not both")
    if files and args.config:
        raise TunekitError("a fleet file holds its own settings: drop --config")
    models, values = load_fleet_file(files[0]) if files else ([FleetModel(model=m) for m in args.model], None)
    config = tune_config(args, values=values)
    result = api.tune_fleet(models, gpu_pct=_pct(args.gpu_pct, "--gpu-pct"), cpu_pct=_pct(args.cpu_pct, "--cpu-pct"),
                            out=args.out, config=config,
                            coordinator=coordinator_config(args, oversubscribe=config.oversubscribe),
                            show_progress=show_progress(args))
    native_log.write_to(result.out_dir)
    emit(args, {"out_dir": result.out_dir, "report_path": result.report_path, "failed": result.failed,
                "report": result.report}, _fleet_table(result.report) + f"\nreport: {result.report_path}")
    for tuned in result.results.values():
        warn_fallbacks(tuned.report)
    if result.failed:
        print(f"tunekit: error: {len(result.failed)} of {result.report['models']} fleet models failed (the others "
              f"are written): " + "; ".join(f"{name}: {why}" for name, why in result.failed.items()),
              file=sys.stderr, flush=True)
        return EXIT_ERROR
    return EXIT_OK


def _fleet_table(report: dict) -> str:
    lines = ["| model | share | weight | untuned ms | tuned ms | speedup | tasks (shared) | trials |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in report["fleet"]:
        if "tuned_ms" in row:
            lines.append(f"| {row['name']} | {row['share']} | {row['weight']:g} | {row['untuned_ms']:.3f} | "
                         f"{row['tuned_ms']:.3f} | {row['speedup']:.2f}x | {row['tasks']} ({row['tasks_shared']}) | "
                         f"{row['trials']} |")
        else:
            lines.append(f"| {row['name']} | {row['share']} | {row['weight']:g} | failed: {row['error']} | | | | |")
    weighted, geomean, tasks = report["weighted_latency_ms"], report["weighted_geomean_ms"], report["tasks"]
    return "\n".join(lines) + (f"\nweighted sum of latencies: {weighted['untuned']:.3f} -> {weighted['tuned']:.3f} ms, "
                               f"geometric mean {geomean['untuned']:.3f} -> {geomean['tuned']:.3f} ms "
                               f"(tuned for the {'sum' if report['objective'] == 'sum' else 'geometric mean'}); "
                               f"{tasks['searched']} tasks searched for the {tasks['in_models']} in the models "
                               f"({tasks['shared']} shared); trials "
                               + ", ".join(f"{n} at {label}" for label, n in report['trials']['measured'].items()))


def run(args) -> int:
    from .. import api

    if _is_fleet(args):
        if args.out:
            native_log.write_to(args.out)
        return _tune_fleet(args)
    args.model = args.model[0]
    if args.out:
        native_log.write_to(args.out)  # TVM's C++ log lines beside the run's records
    if args.slo_ms is not None or args.slo_max_speedup is not None:
        return _tune_slo(args)
    config = tune_config(args)
    coordinator = coordinator_config(args, oversubscribe=config.oversubscribe)
    if _several(args):
        return _tune_shares(args, config, coordinator)
    result = api.tune(args.model, gpu_pct=_pct(args.gpu_pct, "--gpu-pct"), cpu_pct=_pct(args.cpu_pct, "--cpu-pct"),
                      out=args.out, config=config, coordinator=coordinator, show_progress=show_progress(args))
    native_log.write_to(os.path.dirname(os.path.abspath(result.report_path)))  # the default out dir
    choice = result.report.get("share_choice", {})
    auto_line = ""
    if choice.get("mode") == "auto":
        auto_line = (f"auto: tuning at {choice['chosen']} (knee of the profile, "
                     f"tolerance {choice['profile']['tolerance']:.0%})\n")
    emit(args, result.to_dict(),
         auto_line + f"tuned {result.share}: {result.untuned_ms:.3f} ms -> {result.tuned_ms:.3f} ms "
         f"({result.speedup:.2f}x) in {result.wall_s:.0f} s, {result.trials} trials{kernels_line(result.report)}\n"
         f"records: {result.records_dir}\nmodel:   {result.artifact}\nreport:  {result.report_path}")
    warn_fallbacks(result.report)
    return EXIT_OK
