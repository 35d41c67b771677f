"""Where a tunekit command's wall goes, step by step: its main thread's stack sampled every few seconds.

  python benchmarks/stack_samples.py --every 4 --out stacks.txt -- tune fleet.yaml --time-budget 45
  python benchmarks/stack_samples.py --timeline stacks.txt          # one line per sample: seconds, innermost frames

The command runs in this process (as `tunekit ...`) with faulthandler dumping every thread's stack to --out every
--every seconds; --timeline reads such a file back. benchmarks/results/h200x2-fleet-start was made with it.
"""
from __future__ import annotations

import argparse
import re
import sys

_DUMP = re.compile(r"Timeout \((\d+):(\d\d):(\d\d(?:\.\d+)?)\)!\n")  # the interval, not the time so far
_FRAME = re.compile(r'File "(?:[^"]*/site-packages/|[^"]*?/(?=tunekit/|tvm/|tvm_ffi/))?([^"]+)", line (\d+) in (\S+)')


def timeline(text: str, *, frames: int = 4) -> list[str]:
    """One line per dump: its seconds, then the main thread's innermost tunekit/TVM frames."""
    parts = _DUMP.split(text)
    lines, seconds = [], 0.0
    for i in range(1, len(parts) - 3, 4):
        seconds += int(parts[i]) * 3600 + int(parts[i + 1]) * 60 + float(parts[i + 2])
        threads = re.split(r"\n(?=Thread 0x|Current thread 0x)", parts[i + 3].strip())
        main = [t for t in threads if "stack_samples.py" in t] or threads[-1:]
        found = [f"{path}:{line} {name}" for path, line, name in _FRAME.findall(main[0] if main else "")
                 if path.startswith(("tunekit/", "tvm/"))]
        lines.append(f"{seconds:7.1f}  " + " | ".join(found[:frames]))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=4.0, help="seconds between samples")
    parser.add_argument("--out", default="stacks.txt", help="where the samples go")
    parser.add_argument("--timeline", metavar="FILE", help="print the timeline of a samples file and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- and the tunekit command's arguments")
    args = parser.parse_args()
    if args.timeline:
        with open(args.timeline) as fh:
            print("\n".join(timeline(fh.read())))
        return 0
    import faulthandler

    from tunekit.cli import main as tunekit

    sink = open(args.out, "w")  # kept open: faulthandler writes to its descriptor
    faulthandler.dump_traceback_later(args.every, repeat=True, file=sink)
    sys.argv = ["tunekit", *[a for a in args.command if a != "--"]]
    try:
        return tunekit()
    finally:
        faulthandler.cancel_dump_traceback_later()
        sink.close()


if __name__ == "__main__":
    sys.exit(main())
