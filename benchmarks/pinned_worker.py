"""A benchmark's worker run once per MPS share, in a process pinned to the share (tunekit's share session: its own MPS
daemon), its JSON lines gathered (attention_kernel.py, gemm_kernels.py)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys


def share_parser(doc: str, *, number: int) -> argparse.ArgumentParser:
    """The options every such benchmark has: the shares, timing (`number` calls a repeat), --json, the worker flag."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-pct", default="40,100")
    parser.add_argument("--number", type=int, default=number)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def rows_at_shares(script: str, pcts: str, options: dict, *, timeout_s: int) -> list[dict]:
    """`python script --worker --k=v ...` at each share of `pcts` ("40,100"): its JSON lines, each with its share.
    A worker that fails ends the benchmark with its error."""
    from tunekit.run.session import ShareSession
    from tunekit.shares.share import Share

    rows = []
    for pct in (int(p) for p in pcts.split(",")):
        with ShareSession(Share("gpu", pct), allow_unenforced=False) as session:
            cmd = [sys.executable, script, "--worker", *[f"--{k}={v}" for k, v in options.items()]]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  **session.pinned.popen_kwargs())
            if proc.returncode != 0:
                sys.exit(f"gpu{pct}: {proc.stderr[-2000:]}")
            for line in proc.stdout.strip().splitlines():
                if line.startswith("{"):
                    rows.append({"share": f"gpu{pct}", **json.loads(line)})
                    print(json.dumps(rows[-1]), flush=True)
    return rows
