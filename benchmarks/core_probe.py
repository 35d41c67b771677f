"""Are this machine's CPUs whole cores? The same CPU-bound loop in 1, N/2 and N processes at once.

A virtual machine's CPUs may be the two hardware threads of fewer physical cores. Then N busy processes each run
about half as fast as N/2 do, and "CPU seconds" on a loaded machine cost twice those on an idle one: a search
that takes 64 CPU-s on one thread takes ~125 on 16 threads of a 16-CPU machine for that reason alone
(benchmarks/results/h100-search-cpu).

  python benchmarks/core_probe.py [--seconds 2] [--pairs] [--halves] [--timeline SECONDS]
Prints, per process count, the loops per second of each process relative to one process alone.
--pairs: two processes pinned to CPU 0 and CPU j, for every j. A j where each runs at about half its speed
  alone is CPU 0's other hardware thread on the host, which the guest's topology may not show.
--halves: N/2 processes pinned to CPUs 0..N/2-1 (what --cores-per-gpu gives the 1-GPU setup), to the
  even CPUs, and to N/4 CPUs of each half. If the CPUs are host hyperthreads pinned in a fixed order, one
  of these halves runs at about twice the speed of another; if they float on the host, all run alike.
--timeline S: for S seconds, over and over: one process alone, N/2 processes on CPUs 0..N/2-1, N processes,
  each timed back to back. How the CPUs' speed drifts over minutes (a benchmark's setups run minutes apart),
  and, within each round, what N busy CPUs do against N/2 while the drift hardly moves.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time


def _spin(seconds: float, barrier, results, cpu=None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    barrier.wait()
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10_000):
            count += 1
    results.put(count / seconds)


def rate(processes: int, seconds: float, cpus: list[int] | None = None) -> float:
    """Mean loops per second of one of `processes` processes spinning at once (pinned to `cpus`, if given,
    one each)."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(seconds, barrier, results, cpus[i] if cpus else None))
             for i in range(processes)]
    for proc in procs:
        proc.start()
    rates = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return sum(rates) / len(rates)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--pairs", action="store_true", help="CPU 0 beside each other CPU")
    parser.add_argument("--halves", action="store_true", help="half the CPUs busy, chosen three ways")
    parser.add_argument("--timeline", type=float, default=0.0, help="seconds of rounds: 1, N/2 and N busy")
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    alone = rate(1, args.seconds)
    print(f"{cpus} CPUs\n\n| processes at once | each, vs one alone | machine, in processes alone |\n| ---: | ---: | ---: |")
    for n in sorted({1, max(1, cpus // 4), max(1, cpus // 2), cpus}):
        each = rate(n, args.seconds) / alone
        print(f"| {n} | {each:.2f} | {each * n:.1f} |", flush=True)
    online = sorted(os.sched_getaffinity(0))
    if args.pairs and len(online) > 1:
        print("\n| CPU 0 beside CPU | each, vs one alone |\n| ---: | ---: |")
        for other in online[1:]:
            print(f"| {other} | {rate(2, args.seconds, [online[0], other]) / alone:.2f} |", flush=True)
    if args.halves and len(online) >= 4:
        half, quarter = len(online) // 2, len(online) // 4
        ways = {"first half (0..N/2-1)": online[:half], "even CPUs": online[::2][:half],
                "a quarter of each half": online[:quarter] + online[half:half + quarter]}
        print("\n| N/2 processes pinned to | each, vs one alone |\n| --- | ---: |")
        for name, cpus in ways.items():
            print(f"| {name} | {rate(len(cpus), args.seconds, cpus) / alone:.2f} |", flush=True)
    if args.timeline > 0:
        timeline(online, args.seconds, args.timeline)
    return 0


def timeline(online: list[int], seconds: float, total: float) -> None:
    half = online[:max(1, len(online) // 2)]
    print(f"\n| s | one alone (M loops/s) | {len(half)} busy, each | {len(online)} busy, each | "
          f"machine: {len(online)} busy / {len(half)} busy |\n| ---: | ---: | ---: | ---: | ---: |")
    start, ratios, alones = time.perf_counter(), [], []
    while time.perf_counter() - start < total:
        at = time.perf_counter() - start
        one, some, every = rate(1, seconds), rate(len(half), seconds, half), rate(len(online), seconds, online)
        ratios.append(every * len(online) / (some * len(half)))
        alones.append(one)
        print(f"| {at:.0f} | {one / 1e6:.2f} | {some / 1e6:.2f} | {every / 1e6:.2f} | {ratios[-1]:.2f} |", flush=True)
    ratios.sort()
    print(f"\n{len(ratios)} rounds: the machine with {len(online)} CPUs busy did {ratios[len(ratios) // 2]:.2f}x the work "
          f"of {len(half)} busy (median; {ratios[0]:.2f}-{ratios[-1]:.2f}); one process alone ran at "
          f"{min(alones) / 1e6:.2f}-{max(alones) / 1e6:.2f} M loops/s")


if __name__ == "__main__":
    sys.exit(main())
