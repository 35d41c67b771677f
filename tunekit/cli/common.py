"""What every command shares: exit codes, the --json result stream, and the share arguments."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import TunekitError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SLO_NOT_MET, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = {EXIT_OK: "ok", EXIT_ERROR: "runtime failure (the run could not finish; records so far are kept)",
              EXIT_USAGE: "usage or bad input", EXIT_SLO_NOT_MET: "tune --slo-ms: no candidate share met the SLO",
              EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)"}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        raise TunekitError(message)


_result_stream = sys.stdout


def reserve_stdout_for_result() -> None:
    # TVM's C++ and MetaSchedule loggers write to fd 1; with --json stdout must hold only the JSON,
    # so everything else written to fd 1 is sent to stderr and the result gets a private copy of stdout.
    global _result_stream
    sys.stdout.flush()
    _result_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def emit(args, payload: dict, human: str) -> None:
    text = json.dumps(payload, indent=2, default=str) if args.json else human
    print(text, file=_result_stream, flush=True)


def show_progress(args) -> bool:
    return not args.json and sys.stderr.isatty()


def add_common(p) -> None:
    p.add_argument("--json", action="store_true", help="write machine-readable output to stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks and TVM's logs")


def add_share(p, *, many: bool, auto: bool = False, cpu_default: str = "50") -> None:
    help_suffix = " (comma-separated list allowed)" if many else ""
    if auto:
        help_suffix += "; 'auto': profile the untuned model and tune at the knee"
    p.add_argument("--gpu-pct", help="share of the GPU's SMs, 1..100, enforced with CUDA MPS" + help_suffix)
    p.add_argument("--cpu-pct", help=f"share of the CPU cores, 1..100 (default {cpu_default} when no --gpu-pct)"
                   + help_suffix)
    p.add_argument("--input-shape", action="append", metavar="NAME:1x3x224x224", help="fix a dynamic input's shape")
    p.add_argument("--allow-unenforced-share", action="store_true",
                   help="GPU without MPS: measure on the whole GPU, labelled UNENFORCED in the report")


def input_shapes(args) -> dict:
    from ..frontend.onnx_loader import parse_input_shapes

    return parse_input_shapes(getattr(args, "input_shape", None))
