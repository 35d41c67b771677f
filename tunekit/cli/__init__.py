"""The `tunekit` command. Logs go to stderr; --json writes machine-readable output to stdout.

One function per command, listed in `_COMMANDS` (name -> help, how to add its arguments, what it
runs), as Optuna's CLI does. Every command returns its exit code (cli.common.EXIT_CODES): a
TunekitError is bad usage or input (2), a RunFailed a run that could not finish (1).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from ..errors import RunFailed, TunekitError, one_line
from . import check, commands, deploy, native_log, tune
from .common import (EXIT_CODES, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, Parser, add_common,
                     reserve_stdout_for_result)

_COMMANDS = {
    "tune": ("tune an ONNX model at a share; write records, compiled model, report", tune.add_arguments, tune.run),
    "compile": ("compile an ONNX model with a share's records", commands.add_compile, commands.compile_command),
    "evaluate": ("latency of the tuned model at each share, numerics vs onnxruntime", commands.add_evaluate,
                 commands.evaluate_command),
    "profile": ("untuned latency at each share and the knee (smallest share near the max)", commands.add_profile,
                commands.profile_command),
    "records": ("summarize tuning records", commands.add_records, commands.records_command),
    "example": ("write an example ONNX model (generated, seeded weights)", commands.add_example,
                commands.example_command),
    "run": ("run a compiled model once (inputs from .npy files or random) and save its outputs", deploy.add_run,
            deploy.run_command),
    "bench": ("latency of a compiled model at a share: p50/p90/p99, throughput, numerics vs onnxruntime",
              deploy.add_bench, deploy.bench_command),
    "check": check.COMMAND,
}


class _Version(argparse.Action):
    """`tunekit --version`: tunekit and the packages a bug report needs (TVM and its FFI, whose versions
    must match the pins; Ray), read from the installed metadata without importing them (TVM is slow)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata

        def installed(name: str) -> str:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                return "not installed"

        stack = ", ".join(f"{name} {installed(name)}" for name in ("apache-tvm", "apache-tvm-ffi", "ray"))
        print(f"tunekit {installed('tunekit')} ({stack}; python {sys.version.split()[0]})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    epilog = "exit codes:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())
    parser = Parser(prog="tunekit", description="Tune a DNN for the GPU/CPU share it will run on.", epilog=epilog,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print tunekit's version and the stack's, then exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (help_text, add_arguments, _) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(p)
        add_common(p)
    return parser


# ---------------------------------------------------------------- process
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
    from ..interrupts import request_stop

    global _INTERRUPTED
    _INTERRUPTED = True
    request_stop()  # inside the tuning loop: a polite stop after the batch in flight; else raises


def _quiet_logs(debug: bool) -> None:
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        # TVM's MetaSchedule logs a table per iteration; keep stderr readable unless debugging.
        logging.getLogger("tvm").setLevel(logging.ERROR)
        # MetaSchedule gives its console handler the level its logger has when the first TuneContext
        # is made (DEBUG if unset): per-iteration tables and XGBoost rounds. Its log files keep them.
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        # TVM's C++ LOG(...) has no level switch (TVM 0.27 reads only TVM_LOG_DEBUG): cli.native_log.


def _run(argv, debug: bool, last_words: list[str]) -> int:
    """Run the command; its one-line error goes into `last_words`, printed after everything else (so it is
    stderr's last line, after the native log's notice)."""
    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command][2](args)
    except TunekitError as exc:
        if debug:
            raise
        last_words.append(f"tunekit: error: {one_line(str(exc))}")
        return EXIT_ERROR if isinstance(exc, RunFailed) else EXIT_USAGE
    except KeyboardInterrupt:
        last_words.append("tunekit: interrupted; servers stopped, records written so far are kept")
        return EXIT_INTERRUPTED
    except Exception as exc:  # an unexpected failure: still one line unless --debug
        if _INTERRUPTED:
            last_words.append("tunekit: interrupted; servers stopped, records written so far are kept")
            return EXIT_INTERRUPTED
        if debug:
            raise
        text = str(exc).strip()
        last_words.append(f"tunekit: internal error: {type(exc).__name__}: "
                          f"{text.splitlines()[-1][:300] if text else ''} (re-run with --debug for the traceback)")
        return EXIT_ERROR


def main(argv=None) -> int:
    import signal

    argv_list = list(argv if argv is not None else sys.argv[1:])
    debug = "--debug" in argv_list
    real_command = argv is None  # not an in-process call from a test or a script
    if real_command and not debug:
        native_log.install()  # TVM's C++ log lines to a file, before anything can write them
    if "--json" in argv_list:
        reserve_stdout_for_result()
    _quiet_logs(debug)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    last_words: list[str] = []
    try:
        return _run(argv, debug, last_words)
    finally:
        if real_command:
            _stop_leftover_children()
            native_log.finish()
        for line in last_words:
            print(line, file=sys.stderr)
