"""Are this machine's CPUs whole cores? The same CPU-bound loop in 1, N/2 and N processes at once.

A virtual machine's CPUs may be the two hardware threads of fewer physical cores. Then N busy processes each run
about half as fast as N/2 do, and "CPU seconds" on a loaded machine cost twice those on an idle one: a search
that takes 64 CPU-s on one thread takes ~125 on 16 threads of a 16-CPU machine for that reason alone
(benchmarks/results/h100-search-cpu).

  python benchmarks/core_probe.py [--seconds 2]
Prints, per process count, the loops per second of each process relative to one process alone.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time


def _spin(seconds: float, barrier, results) -> None:
    barrier.wait()
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10_000):
            count += 1
    results.put(count / seconds)


def rate(processes: int, seconds: float) -> float:
    """Mean loops per second of one of `processes` processes spinning at once."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(seconds, barrier, results)) for _ in range(processes)]
    for proc in procs:
        proc.start()
    rates = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return sum(rates) / len(rates)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    alone = rate(1, args.seconds)
    print(f"{cpus} CPUs\n\n| processes at once | each, vs one alone | machine, in processes alone |\n| ---: | ---: | ---: |")
    for n in sorted({1, max(1, cpus // 4), max(1, cpus // 2), cpus}):
        each = rate(n, args.seconds) / alone
        print(f"| {n} | {each:.2f} | {each * n:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
