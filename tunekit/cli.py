"""The `tunekit` command. Logs go to stderr; --json writes machine-readable output to stdout."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from .errors import TunekitError

EXIT_USAGE, EXIT_ERROR, EXIT_INTERRUPTED = 2, 1, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        raise TunekitError(message)


def _add_common(p):
    p.add_argument("--json", action="store_true", help="write machine-readable output to stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks and TVM's logs")


def _add_share(p, *, many: bool, auto: bool = False, cpu_default: str = "50"):
    help_suffix = " (comma-separated list allowed)" if many else ""
    if auto:
        help_suffix += "; 'auto': profile the untuned model and tune at the knee"
    p.add_argument("--gpu-pct", help="share of the GPU's SMs, 1..100, enforced with CUDA MPS" + help_suffix)
    p.add_argument("--cpu-pct", help=f"share of the CPU cores, 1..100 (default {cpu_default} when no --gpu-pct)"
                   + help_suffix)
    p.add_argument("--input-shape", action="append", metavar="NAME:1x3x224x224", help="fix a dynamic input's shape")
    p.add_argument("--allow-unenforced-share", action="store_true",
                   help="GPU without MPS: measure on the whole GPU, labelled UNENFORCED in the report")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tunekit", description="Tune a DNN for the GPU/CPU share it will run on.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("tune", help="tune an ONNX model at a share; write records, compiled model, report")
    p.add_argument("model")
    _add_share(p, many=True, auto=True)
    p.add_argument("--trials", type=int, help="total measured candidates, per share (default 64)")
    p.add_argument("--trials-per-iter", type=int)
    p.add_argument("--servers", type=int, help="runner servers at the share, per GPU (or per node for a CPU share); "
                   "up to 100/pct fit on one device without overlapping (default 1)")
    p.add_argument("--clients", type=int, help="tuning clients (Ray actors) per share, each tuning a shard of the "
                   "tasks; with it (or several shares, --gpus, --ray-address or RAY_ADDRESS) the run goes "
                   "through the Ray coordinator, started here unless a cluster is given (default: 1 process, no Ray)")
    p.add_argument("--gpus", help="GPU indices to put runner servers on, e.g. 0,1 (default: every visible GPU)")
    p.add_argument("--ray-address", help="join this Ray cluster (default: $RAY_ADDRESS, else start Ray here)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow the shares tuned at the same time on one device to sum past 100%%")
    p.add_argument("--server-mode", choices=["warm", "stock"])
    p.add_argument("--engine", choices=["tunekit", "stock"],
                   help="tunekit's fast tuning loop (default) or stock MetaSchedule, for comparison")
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", action="store_true",
                   help="continue the records in --out (never re-measures a candidate already there)")
    p.add_argument("--config", help="YAML file with TuneConfig keys; flags override it")
    p.add_argument("--listen-host", metavar="HOST",
                   help="address the RPC tracker and runner servers listen on (default 127.0.0.1); any other "
                   "needs --rpc-secret-file or TUNEKIT_RPC_SECRET (README: Security)")
    p.add_argument("--rpc-secret-file", metavar="PATH",
                   help="shared secret (first line, chmod 600) that runner servers demand before loading code")
    p.add_argument("--servers-gone-timeout", dest="servers_gone_timeout_s", type=float, metavar="S",
                   help="stop the run when no runner server of the share can be reached for S seconds (default 120)")
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
    _add_common(p)

    p = sub.add_parser("compile", help="compile an ONNX model with a share's records")
    p.add_argument("model")
    p.add_argument("--records", required=True, help="a tune out dir or a records-<share> dir")
    p.add_argument("--share", help="which share's records, e.g. cpu50 or gpu40")
    p.add_argument("--input-shape", action="append", metavar="NAME:1x3x224x224")
    p.add_argument("--out", required=True, help="path of the compiled library (.so)")
    _add_common(p)

    p = sub.add_parser("evaluate", help="latency of the tuned model at each share, numerics vs onnxruntime")
    p.add_argument("model")
    p.add_argument("--records", required=True)
    _add_share(p, many=True)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", help="write matrix.json, matrix.md, latency_vs_share.png and report.html here")
    _add_common(p)

    p = sub.add_parser("profile", help="untuned latency at each share and the knee (smallest share near the max)")
    p.add_argument("model")
    _add_share(p, many=True, cpu_default="25,50,75,100")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="knee: smallest share within this fraction of the largest share's latency (default 0.1)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", help="write profile.json and profile.png here")
    _add_common(p)

    p = sub.add_parser("records", help="summarize tuning records")
    p.add_argument("dir")
    _add_common(p)

    p = sub.add_parser("example", help="write an example ONNX model (generated, seeded weights)")
    p.add_argument("--name", default="tiny_cnn")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    _add_common(p)
    return parser


def _tune_config(args):
    from .config import TuneConfig, load_yaml_config
    from .frontend.onnx_loader import parse_input_shapes

    values = load_yaml_config(args.config) if args.config else {}
    for key in ("gpu_pct", "cpu_pct", "out"):
        if getattr(args, key) is None and key in values:
            setattr(args, key, values[key])
        values.pop(key, None)
    for flag in ("trials", "trials_per_iter", "servers", "server_mode", "engine", "seed"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    for flag in ("listen_host", "rpc_secret_file", "servers_gone_timeout_s"):  # faults and security
        if getattr(args, flag, None) is not None:
            values[flag] = getattr(args, flag)
    shapes = values.get("input_shapes") or {}
    shapes.update(parse_input_shapes(args.input_shape))
    values["input_shapes"] = shapes
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


_RESULT_STREAM = sys.stdout


def _reserve_stdout_for_result() -> None:
    # TVM's C++ and MetaSchedule loggers write to fd 1; with --json stdout must hold only the JSON,
    # so everything else written to fd 1 is sent to stderr and the result gets a private copy of stdout.
    global _RESULT_STREAM
    sys.stdout.flush()
    _RESULT_STREAM = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def _emit(args, payload: dict, human: str) -> None:
    text = json.dumps(payload, indent=2, default=str) if args.json else human
    print(text, file=_RESULT_STREAM, flush=True)


def _tune_slo(args) -> int:
    """`tune --slo-ms`: tunekit.slo.tune_for_slo over the candidate shares; EXIT_SLO_NOT_MET if none meets it."""
    from . import api
    from .slo import EXIT_SLO_NOT_MET, check_slo_ms, describe

    if args.slo_ms is None:
        raise TunekitError("--slo-max-speedup needs --slo-ms")
    slo_ms = check_slo_ms(args.slo_ms)  # before the model is loaded: a typo fails at once
    ray_flags = [flag for flag, attr in (("--clients", "clients"), ("--gpus", "gpus"), ("--ray-address", "ray_address"),
                                         ("--oversubscribe", "oversubscribe")) if getattr(args, attr, None)]
    if ray_flags:  # the SLO walk tunes one share at a time, in this process: refuse rather than ignore them
        raise TunekitError(f"--slo-ms does not go through the Ray coordinator: drop {', '.join(ray_flags)}")
    config = _tune_config(args)
    result = api.tune_for_slo(args.model, slo_ms=slo_ms, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, out=args.out,
                              config=config, max_speedup=args.slo_max_speedup,
                              show_progress=not args.json and sys.stderr.isatty())
    _emit(args, dataclasses.asdict(result), describe(result))
    return 0 if result.met else EXIT_SLO_NOT_MET


def _coordinator_config(args):
    """A CoordinatorConfig when the run should go through Ray, else None (one process)."""
    several = any("," in str(v) for v in (args.gpu_pct, args.cpu_pct) if v is not None)
    wanted = (args.clients is not None or args.gpus is not None or args.ray_address or os.environ.get("RAY_ADDRESS")
              or several or args.oversubscribe)
    if not wanted:
        return None
    from .coordinator.coordinator import CoordinatorConfig

    gpus = None
    if args.gpus is not None:
        try:
            gpus = [int(g) for g in str(args.gpus).split(",") if g.strip()]
        except ValueError:
            raise TunekitError(f"--gpus must be a list of GPU indices such as 0,1, got {args.gpus!r}") from None
        if not gpus or min(gpus) < 0:
            raise TunekitError(f"--gpus must be a list of GPU indices such as 0,1, got {args.gpus!r}")
    return CoordinatorConfig(clients=args.clients if args.clients is not None else 2, gpus=gpus,
                             ray_address=args.ray_address, oversubscribe=args.oversubscribe)


def _tune_shares(args, config, coordinator) -> None:
    from . import api

    result = api.tune_shares(args.model, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, out=args.out, config=config,
                             coordinator=coordinator, show_progress=not args.json and sys.stderr.isatty())
    payload = {"out_dir": result.out_dir, "report_path": result.report_path, "report": result.report}
    _emit(args, payload, result.report["table_md"] + f"\n\n{result.report['tasks_whose_best_differs']} task(s) "
          f"have a different best record per share\nreport: {result.report_path}")


def run(args) -> int | None:
    from . import api

    if args.command == "tune" and (args.slo_ms is not None or args.slo_max_speedup is not None):
        return _tune_slo(args)
    if args.command == "tune":
        config = _tune_config(args)
        coordinator = _coordinator_config(args)
        if any("," in str(v) for v in (args.gpu_pct, args.cpu_pct) if v is not None):
            return _tune_shares(args, config, coordinator)
        result = api.tune(args.model, gpu_pct=_pct(args.gpu_pct, "--gpu-pct"), cpu_pct=_pct(args.cpu_pct, "--cpu-pct"),
                          out=args.out, config=config, coordinator=coordinator,
                          show_progress=not args.json and sys.stderr.isatty())
        payload = {k: v for k, v in dataclasses.asdict(result).items() if k != "report"}
        payload["report"] = result.report
        choice = result.report.get("share_choice", {})
        auto_line = ""
        if choice.get("mode") == "auto":
            auto_line = (f"auto: tuning at {choice['chosen']} (knee of the profile, "
                         f"tolerance {choice['profile']['tolerance']:.0%})\n")
        _emit(args, payload,
              auto_line + f"tuned {result.share}: {result.untuned_ms:.3f} ms -> {result.tuned_ms:.3f} ms "
              f"({result.speedup:.2f}x) in {result.wall_s:.0f} s, {result.trials} trials\n"
              f"records: {result.records_dir}\nmodel:   {result.artifact}\nreport:  {result.report_path}")
    elif args.command == "compile":
        from .frontend.onnx_loader import parse_input_shapes

        path = api.compile_model(args.model, records=args.records, share=args.share, out=args.out,
                                 input_shapes=parse_input_shapes(args.input_shape))
        _emit(args, {"artifact": path}, f"compiled: {path}")
    elif args.command == "evaluate":
        from .frontend.onnx_loader import parse_input_shapes

        if args.out:
            api._check_out_dir(args.out)  # fail before minutes of measuring, not after
        result = api.evaluate(args.model, records=args.records, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct,
                              input_shapes=parse_input_shapes(args.input_shape), repeats=args.repeats,
                              allow_unenforced_share=args.allow_unenforced_share)
        lines = ["tuned_at  run_at   median_ms  std_ms   numerics"]
        lines += [f"{r['tuned_at']:<9} {r['run_at']:<8} {r['median_ms']:<10.4f} {r['std_ms']:<8.4f} "
                  f"{'ok' if r['numerics_ok'] else 'MISMATCH'} (max err {r['max_abs_err_vs_onnxruntime']:.2e})"
                  for r in result["results"]]
        if args.out:
            from .reports.matrix import write_matrix

            files = write_matrix(result, args.out)
            lines.append(f"wrote {files['md']}, {files['png']}, {files['html']}")
        _emit(args, result, "\n".join(lines))
    elif args.command == "profile":
        from .frontend.onnx_loader import parse_input_shapes
        from .profiling import profile

        if args.out:
            api._check_out_dir(args.out)
        result = profile(args.model, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, tolerance=args.tolerance,
                         repeats=args.repeats, input_shapes=parse_input_shapes(args.input_shape),
                         allow_unenforced_share=args.allow_unenforced_share)
        lines = ["share    cores/SMs  median_ms  std_ms"]
        lines += [f"{r['share']:<8} {str(r.get('cores', r.get('sm_count'))):<10} {r['median_ms']:<10.4f} "
                  f"{r['std_ms']:.4f}" for r in result["shares"]]
        lines.append(f"knee: {result['knee']} (smallest share within {result['tolerance']:.0%} "
                     f"of {result['shares'][-1]['share']})")
        if args.out:
            from .reports.matrix import write_profile

            files = write_profile(result, args.out)
            lines.append(f"wrote {files['json']}, {files['png']}")
        _emit(args, result, "\n".join(lines))
    elif args.command == "records":
        from .records.database import find_share_databases, summarize

        summaries = {label: summarize(path) for label, path in find_share_databases(args.dir).items()}
        lines = [f"{label}: {s['workloads']} workloads, {s['trials']} trials ({s['failed_trials']} failed)"
                 for label, s in summaries.items()]
        _emit(args, summaries, "\n".join(lines))
    elif args.command == "example":
        from .models.examples import save_example

        path = save_example(args.name, args.out, seed=args.seed)
        _emit(args, {"model": path}, f"wrote {path}")


_INTERRUPTED = False


def _stop_leftover_children() -> None:
    """Last line of defence on exit: every process tunekit started (tracker, servers, build and
    latency workers) goes with it, even one that a thread created while the run was unwinding."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass


def _on_signal(signum, frame):
    # Ctrl-C / SIGTERM: unwind through every `with` so servers, tracker, MPS daemon and build workers
    # stop. Inside TVM's C++ the interrupt can surface as a RuntimeError: the flag says what it was.
    from .interrupts import request_stop

    global _INTERRUPTED
    _INTERRUPTED = True
    request_stop()  # inside the tuning loop: a polite stop after the batch in flight; else raises


def main(argv=None) -> int:
    argv_list = list(argv if argv is not None else sys.argv[1:])
    debug = "--debug" in argv_list
    if "--json" in argv_list:
        _reserve_stdout_for_result()
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        # TVM's MetaSchedule logs a table per iteration; keep stderr readable unless debugging.
        logging.getLogger("tvm").setLevel(logging.ERROR)
        # MetaSchedule gives its console handler the level its logger has when the first TuneContext
        # is made (DEBUG if unset): per-iteration tables and XGBoost rounds. Its log files keep them.
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        os.environ.setdefault("TVM_LOG_LEVEL", "WARNING")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import signal

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        try:
            args = build_parser().parse_args(argv)
            return run(args) or 0  # run() returns a non-zero code only for an unmet SLO (EXIT_SLO_NOT_MET)
        except TunekitError as exc:
            if debug:
                raise
            print(f"tunekit: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print("tunekit: interrupted; servers stopped, records written so far are kept", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as exc:  # an unexpected failure: still one line unless --debug
            if _INTERRUPTED:
                print("tunekit: interrupted; servers stopped, records written so far are kept", file=sys.stderr)
                return EXIT_INTERRUPTED
            if debug:
                raise
            print(f"tunekit: internal error: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''} "
                  "(re-run with --debug for the traceback)", file=sys.stderr)
            return EXIT_ERROR
    finally:
        if argv is None:  # the real command (not an in-process call from a test or a script)
            _stop_leftover_children()


if __name__ == "__main__":
    sys.exit(main())
