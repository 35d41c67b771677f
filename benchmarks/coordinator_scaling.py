"""Tuning clients and runner servers: the same model, trial budget and seed with 1, 2, 4 clients and
1..N servers, in one run. Prints wall time, trials/s and final latency per setup, with ratios to
the first setup (1 client, 1 server), and writes the table with the machine and command.

Every setup is its own `tunekit tune` process through the Ray coordinator (so each pays Ray's and
its clients' start-up), plus, for reference, the single-process engine without Ray.

  python benchmarks/coordinator_scaling.py --model tiny_cnn --cpu-pct 50 --trials 32
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --trials 48 --setups 1x1,1x2,2x2
  # each GPU with its own 16 cores, as if every GPU came with a machine of its own (1 GPU: cores 0-15, 2: 0-31):
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --setups 1x2x1,2x2x2 --cores-per-gpu 16
  # the same, but while the 1-GPU setup runs, GPU 1 runs its own copy of it on cores 16-31 (the machine as loaded
  # as with both GPUs busy: a VM's CPUs may be hardware threads, and then an idle half lends the other its cores):
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --setups 2x2x1+busy --cores-per-gpu 16
  # a setup named twice runs twice: in the order 1, 2, 2, 1 a drift of the machine's speed over the run falls on
  # both alike, and the table pools each setup's runs (its trials over its tuning walls):
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --setups 2x2x1,4x2x2,4x2x2,2x2x1 \
      --cores-per-gpu 16 --no-single-process
  # clients on CPU nodes of a cluster, fleets on its GPU node (docs/running.md: the Ray coordinator):
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --setups 4x2x1,8x2x2 --no-single-process \
      --ray-address HEAD:6379 --client-nodes tunekit_client --rpc-secret-file ~/.tunekit-secret
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tuning_time import machine, model_path  # noqa: E402


def setup_cores(gpus: int, cores_per_gpu: int | None) -> list[int] | None:
    """The cores a setup's run may use: the first gpus x cores_per_gpu of this process's (None: all of them)."""
    if not cores_per_gpu:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    want = max(1, gpus) * cores_per_gpu
    if want > len(allowed):
        raise SystemExit(f"--cores-per-gpu {cores_per_gpu}: {max(1, gpus)} GPU(s) need {want} cores, "
                         f"this machine lets the run use {len(allowed)}")
    return allowed[:want]


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat (0, 0 where there is none)."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _spin(seconds: float, barrier, results, cpu=None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    barrier.wait()
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10_000):
            count += 1
    results.put(count / seconds)


def cpu_rate(processes: int, seconds: float, cpus: list[int] | None = None) -> float:
    """Mean loops per second of one of `processes` processes spinning at once (pinned to `cpus`, one each)."""
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


def cpu_speed(seconds: float = 1.0) -> float:
    """Loops per second of one process of a pure-Python loop while every CPU this benchmark may use runs one:
    the same probe before and after every setup, whatever cores the setup gets, so the rows compare."""
    cpus = sorted(os.sched_getaffinity(0))
    return round(cpu_rate(len(cpus), seconds, cpus))


def busy_pct(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """How busy the machine's CPUs were between two cpu_jiffies() readings, in % of all of them."""
    total = after[1] - before[1]
    return round(100.0 * (after[0] - before[0]) / total, 1) if total > 0 else None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds a process and its living descendants have used (Ray's workers, build workers, servers)."""
    import psutil

    used = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                used += times.user + times.system + times.children_user + times.children_system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return used


def start_neighbours(label: str, clients: int, servers: int, gpus: int, model: str, share_flag: list[str], args,
                     workdir: str) -> list[subprocess.Popen]:
    """`+busy`: every GPU the setup leaves free runs a copy of the setup's per-GPU part (its clients over its
    GPUs, the same servers) on that GPU only and its own --cores-per-gpu cores, with more trials than the
    setup, so it is still tuning when the setup ends. Stopped (killed) when the setup is done."""
    from tunekit.coordinator.fleet_actor import visible_gpus

    if not args.cores_per_gpu:
        raise SystemExit("+busy needs --cores-per-gpu (the cores each GPU's copy runs on)")
    allowed = sorted(os.sched_getaffinity(0))
    procs = []
    for gpu in visible_gpus()[gpus:]:
        lane = visible_gpus().index(gpu)
        cores = allowed[lane * args.cores_per_gpu:(lane + 1) * args.cores_per_gpu]
        if len(cores) < args.cores_per_gpu:
            raise SystemExit(f"+busy: GPU {gpu} would get {len(cores)} cores, not {args.cores_per_gpu}")
        out = os.path.join(workdir, f"{label}-neighbour-gpu{gpu}")
        cmd = [sys.executable, "-m", "tunekit.cli", "tune", model, *share_flag, "--trials", str(args.trials * 4),
               "--trials-per-iter", str(args.trials_per_iter), "--seed", str(args.seed + 1 + gpu),
               "--servers", str(servers), "--clients", str(max(1, clients // max(1, gpus))), "--gpus", str(gpu),
               "--out", out, *(["--config", args.config] if args.config else [])]
        log = open(os.path.join(args.keep_reports, os.path.basename(out) + ".log") if args.keep_reports
                   else out + ".log", "w")
        print(f"[{label}] neighbour on GPU {gpu}, cores {cores[0]}-{cores[-1]}: {' '.join(cmd[3:])}", file=sys.stderr,
              flush=True)
        # its own session: killing it takes its Ray, build workers and servers along (and tunekit's reaper the rest)
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)},
                                      preexec_fn=lambda c=cores: os.sched_setaffinity(0, c)))
    return procs


def stop_neighbours(procs: list[subprocess.Popen]) -> list[str]:
    """Each neighbour's state when the setup ended ("tuning, N CPU-s", or how it had ended: a copy that failed
    early left its GPU's cores idle, and then the setup did not run on a busy machine)."""
    states = []
    for proc in procs:
        states.append(f"tuning, {tree_cpu_s(proc.pid):.0f} CPU-s" if proc.poll() is None
                      else f"exited early (rc {proc.returncode})")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return states


def run_setup(label: str, clients: int | None, servers: int, model: str, share_flag: list[str], args,
              workdir: str, gpus: int = 0, busy: bool = False) -> dict:
    out = os.path.join(workdir, label)
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", model, *share_flag, "--trials", str(args.trials),
           "--trials-per-iter", str(args.trials_per_iter), "--seed", str(args.seed), "--servers", str(servers),
           "--out", out, "--json"]
    if clients is not None:
        cmd += ["--clients", str(clients)]
    if gpus:
        cmd += ["--gpus", ",".join(str(g) for g in range(gpus))]
    cmd += ["--config", args.config] if args.config else []
    if clients is not None:
        for flag in ("ray_address", "client_nodes", "rpc_secret_file"):
            if getattr(args, flag):
                cmd += ["--" + flag.replace("_", "-"), getattr(args, flag)]
    print(f"[{label}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    cores = setup_cores(gpus, args.cores_per_gpu)
    # How fast the machine's CPUs run just before and after the setup: a VM's CPUs drift by a third within a minute
    # (benchmarks/RESULTS.md, the 2-GPU coordinator entries), and tuning here is CPU-bound.
    speed_before = cpu_speed()
    neighbours = start_neighbours(label, clients or 1, servers, max(1, gpus), model, share_flag, args, workdir) \
        if busy else []
    started, jiffies = time.time(), cpu_jiffies()
    try:
        # Ray, its workers and the build pools inherit the affinity: Ray counts these cores as the node's CPUs
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
        machine_busy = busy_pct(jiffies, cpu_jiffies())
    finally:
        neighbour_states = stop_neighbours(neighbours)
    speed_after = cpu_speed()
    if neighbour_states:
        print(f"[{label}] neighbours when it ended: {', '.join(neighbour_states)}", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        return {"label": label, "error": proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else "failed"}
    report = json.loads(proc.stdout)["report"]
    if args.keep_reports:  # the whole report (fleet placement, per-client phases) beside the table
        os.makedirs(args.keep_reports, exist_ok=True)
        name = label.replace("(s)", "").replace(" (run ", "-run").replace(")", "").replace(" ", "")
        with open(os.path.join(args.keep_reports, name + ".json"), "w") as fh:
            json.dump(report, fh, indent=1)
    return {"label": label, "clients": clients or 1, "servers": servers, "gpus": gpus or 1, "ray": clients is not None,
            "cores": len(cores) if cores else len(os.sched_getaffinity(0)),
            "neighbours": neighbour_states,
            # loops/s of one of the benchmark's CPUs, all of them busy, just before and just after the setup
            "cpu_speed": [speed_before, speed_after],
            # how busy all of the machine's CPUs were meanwhile (the setup's cores and any others)
            "machine_busy_pct": machine_busy,
            "tuning_wall_s": report["tuning_wall_s"], "process_wall_s": round(time.time() - started, 1),
            "trials": report["trials"]["measured"], "failed": report["trials"]["failed"],
            "trials_per_s": round(report["trials"]["measured"] / report["tuning_wall_s"], 3),
            "untuned_ms": report["latency_ms"]["untuned"]["median_ms"],
            "tuned_ms": report["latency_ms"]["tuned"]["median_ms"],
            "tuned_std_ms": report["latency_ms"]["tuned"].get("std_ms"),
            "server_restarts": report.get("server_restarts", 0),
            # when each client was done, in seconds from the start: how balanced its shards were
            "shards_done_s": [s.get("done_s") for s in report["coordinator"]["shards"]] if clients is not None else [],
            # and when each drew from the pool for the last time: a client that drew long before it was done held
            # trials the pool could no longer give to a client with nothing left (lease 17)
            "shards_last_draw_s": [s.get("last_draw_s") for s in report["coordinator"]["shards"]]
            if clients is not None else [],
            # draws the pool deferred in its last trials: a client with more ahead than its part measured first
            "pool_deferred": report["coordinator"]["pool"].get("deferred") if clients is not None else None,
            # and when each client's search began: what starting the clients cost
            "shards_start_s": [s["search_started_s"] for s in report["coordinator"]["shards"]
                               if s.get("search_started_s") is not None] if clients is not None else [],
            "client_nodes": sorted({f"{p['ip']} ({p['cores']} cores, {p['build_workers']} build workers)"
                                    for s in report["coordinator"]["shards"] for p in s.get("ran_on", [])
                                    if "build_workers" in p}) if clients is not None else [],
            # per trial, summed over the clients: what a client's loop waits on (its searches, a batch's builds on
            # its stage thread), and how long it waited for its batches
            "search_s_per_trial": (report.get("phases") or {}).get("per_trial_s", {}).get("search_s"),
            "build_s_per_trial": (report.get("phases") or {}).get("per_trial_s", {}).get("build_s"),
            "wait_s_per_trial": (report.get("phases") or {}).get("per_trial_s", {}).get("wait_s"),
            # the searches behind the search seconds (one search serves several batches): their count and their
            # seconds each, which the per-trial figure mixes up
            "searches": sum(t.get("searches", 0) for t in report.get("tasks", [])),
            "search_s": (report.get("phases") or {}).get("total_s", {}).get("search_s"),
            # how full each client kept its pipeline (mean batches in flight; the depth is the most it may hold)
            "shards_in_flight": [(s.get("pipeline") or {}).get("mean_in_flight") for s in report["coordinator"]["shards"]]
            if clients is not None else [],
            # and how many of its batches went out while another batch of the same task was in flight
            "shards_sent_ahead": [(s.get("pipeline") or {}).get("sent_ahead") for s in report["coordinator"]["shards"]]
            if clients is not None else [],
            # and a candidate's build inside a worker, over every client's candidates: the builds' own cost, apart
            # from a batch's wait for its slowest
            "worker_s_per_candidate": worker_s_per_candidate(
                [s.get("build_profile") for s in report["coordinator"]["shards"]]) if clients is not None else None}


def worker_s_per_candidate(profiles: list[dict | None]) -> float | None:
    """Seconds per candidate inside the build workers, over all the clients' candidates (each client's
    clients.build_profile summary weighted by its candidates); None when no client reported one."""
    profiles = [p for p in profiles if p and p.get("candidates")]
    if not profiles:
        return None
    return round(sum(p["total_per_candidate_s"] * p["candidates"] for p in profiles)
                 / sum(p["candidates"] for p in profiles), 4)


def _phases(row: dict) -> str:
    if row.get("search_s_per_trial") is None:
        return ""
    worker, wait = row.get("worker_s_per_candidate"), row.get("wait_s_per_trial")
    searches, search_s = row.get("searches"), row.get("search_s")
    each = f" ({searches} searches, {search_s / searches:.1f} s each)" if searches and search_s is not None else ""
    return f"{row['search_s_per_trial']:.3f}{each}, {row['build_s_per_trial']:.3f}" + \
        ("" if wait is None else f", {wait:.3f}") + \
        ("" if worker is None else f"; {worker:.3f}")


def _done(row: dict) -> str:
    """When each client was done, and in brackets when it last drew from the pool (reports that say)."""
    draws = row.get("shards_last_draw_s") or []
    return ", ".join(f"{d:.0f}" + (f" ({draws[i]:.0f})" if i < len(draws) and draws[i] is not None else "")
                     for i, d in enumerate(row.get("shards_done_s") or []) if d is not None)


def _in_flight(row: dict) -> str:
    """Each client's mean batches in flight, with the batches it sent ahead of their task's results."""
    ahead = row.get("shards_sent_ahead") or []

    def sent(i: int) -> str:
        return f" ({ahead[i]} ahead)" if i < len(ahead) and ahead[i] else ""

    return ", ".join(f"{n:.1f}{sent(i)}" for i, n in enumerate(row.get("shards_in_flight") or []) if n is not None)


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if "error" not in r and r.get("ray")), None)
    lines = ["| setup | clients | servers | cores | tuning wall (s) | whole command (s) | trials | trials/s | "
             "trials/s vs first | tuned latency (ms) | latency vs first | clients done (last draw) (s) | clients started (s) | "
             "machine CPUs busy | CPU speed before, after | search, build, wait s/trial; worker s/candidate | "
             "batches in flight (mean; sent ahead) | neighbours |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | --- "
             "| --- | --- |"]
    speed_base = next((r["cpu_speed"][0] for r in rows if r.get("cpu_speed")), None)
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | | | | failed: {r['error']} | | | | | | | | | | | | | |")
            continue
        if any(not state.startswith("tuning") for state in r.get("neighbours") or []):  # its machine was not busy after all
            r = {**r, "label": f"{r['label']} (a neighbour {', '.join(r['neighbours'])})"}
        speed = f"{r['trials_per_s'] / base['trials_per_s']:.2f}x" if base else ""
        lat = f"{r['tuned_ms'] / base['tuned_ms']:.3f}" if base else ""
        lines.append(f"| {r['label']} | {r['clients']} | {r['servers']} | {r.get('cores', '')} | {r['tuning_wall_s']:.1f} | "
                     f"{r['process_wall_s']:.1f} | {r['trials']} | {r['trials_per_s']:.3f} | {speed} | "
                     f"{r['tuned_ms']:.4f} ± {r['tuned_std_ms'] or 0:.4f} | {lat} | "
                     f"{_done(r)}"
                     f"{f' (pool deferred {d})' if (d := r.get('pool_deferred')) else ''} | "
                     f"{', '.join(f'{d:.0f}' for d in r.get('shards_start_s') or [])} | "
                     f"{'' if r.get('machine_busy_pct') is None else str(r['machine_busy_pct']) + '%'} | "
                     f"{_speeds(r, speed_base)} | {_phases(r)} | "
                     f"{_in_flight(r)} | "
                     f"{'; '.join(r.get('neighbours') or [])} |")
    return "\n".join(lines) + pooled_table(rows)


def _speeds(row: dict, base: float | None) -> str:
    if not row.get("cpu_speed") or not base:
        return ""
    return ", ".join(f"{speed / base:.2f}" for speed in row["cpu_speed"])


def setup_name(label: str) -> str:
    """A setup's label without its repeat's " (run N)"."""
    return label.split(" (run ")[0]


def pooled(rows: list[dict]) -> list[dict]:
    """Each setup named more than once in --setups, its runs pooled: all their trials over all their tuning
    walls, in the order of first appearance (the first is the reference)."""
    by_setup: dict[str, list[dict]] = {}
    for row in rows:
        if "error" not in row and row.get("ray"):
            by_setup.setdefault(setup_name(row["label"]), []).append(row)
    return [{"setup": name, "runs": len(runs), "trials": sum(r["trials"] for r in runs),
             "tuning_wall_s": round(sum(r["tuning_wall_s"] for r in runs), 1),
             "trials_per_s": round(sum(r["trials"] for r in runs) / sum(r["tuning_wall_s"] for r in runs), 3),
             "each_trials_per_s": [r["trials_per_s"] for r in runs]} for name, runs in by_setup.items()]


def pooled_table(rows: list[dict]) -> str:
    setups = pooled(rows)
    if not any(s["runs"] > 1 for s in setups):
        return ""
    lines = ["", "", "Setups run more than once, pooled (all their trials over all their tuning walls):", "",
             "| setup | runs | trials | tuning wall (s) | trials/s | each run's trials/s | trials/s vs first |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for s in setups:
        lines.append(f"| {s['setup']} | {s['runs']} | {s['trials']} | {s['tuning_wall_s']:.1f} | {s['trials_per_s']:.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in s['each_trials_per_s'])} | "
                     f"{s['trials_per_s'] / setups[0]['trials_per_s']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_cnn")
    parser.add_argument("--cpu-pct", type=int)
    parser.add_argument("--gpu-pct", type=int)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--trials-per-iter", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setups", default="1x1,2x1,4x1,2x2",
                        help="CLIENTSxSERVERS[xGPUS][+busy] list through Ray (the first is the reference); "
                             "servers are per GPU, GPUS uses devices 0..GPUS-1; +busy: each other GPU runs a copy "
                             "of the setup's per-GPU part meanwhile (needs --cores-per-gpu)")
    parser.add_argument("--keep-reports", help="copy each setup's report.json into this folder")
    parser.add_argument("--cores-per-gpu", type=int,
                        help="run a setup of G GPUs on the first G x N cores only (each GPU brings its own cores)")
    parser.add_argument("--ray-address", help="Ray setups join this cluster (default: each starts Ray here)")
    parser.add_argument("--client-nodes", help="Ray setups: where the tuning clients go (any, cpu-only, a resource)")
    parser.add_argument("--rpc-secret-file", help="Ray setups: the secret fleets demand on a cluster of machines")
    parser.add_argument("--no-single-process", action="store_true", help="skip the no-Ray reference run")
    parser.add_argument("--config", help="a tunekit --config file for every setup")
    parser.add_argument("--results", help="write the table here (Markdown; a .json beside it)")
    args = parser.parse_args()
    share_flag = ["--gpu-pct", str(args.gpu_pct)] if args.gpu_pct else ["--cpu-pct", str(args.cpu_pct or 50)]
    # Resumable: setups already in --results' JSON (a call cut off by a time limit, or an earlier
    # call on the same machine) are kept and not run again.
    rows = _load(args)
    done = {r["label"] for r in rows if "error" not in r}
    rows = [r for r in rows if "error" not in r]
    seen: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="tunekit-scaling-") as workdir:
        model = model_path(args.model, workdir)
        for setup in args.setups.split(","):
            shape, *mods = setup.split("+")
            if any(m != "busy" for m in mods):
                raise SystemExit(f"--setups {setup}: after + only 'busy' (the other GPUs run copies of it)")
            clients, servers, gpus, *_ = [int(x) for x in shape.split("x")] + [0]
            label = f"{clients} client(s) x {servers} server(s)" + (f" x {gpus} GPU(s)" if gpus else "") \
                + (", other GPUs busy" if "busy" in mods else "")
            seen[label] = seen.get(label, 0) + 1
            label += f" (run {seen[label]})" if seen[label] > 1 else ""
            if label in done:
                print(f"[{label}] kept from {args.results}", file=sys.stderr)
                continue
            rows.append(run_setup(label, clients, servers, model, share_flag, args, workdir, gpus,
                                  busy="busy" in mods))
            _save(args, rows)
        if not args.no_single_process and "1 process, no Ray" not in done:
            rows.append(run_setup("1 process, no Ray", None, 1, model, share_flag, args, workdir))
            _save(args, rows)
    text = (f"# Coordinator scaling: {args.model} at {share_flag[0][2:]} {share_flag[1]}%, {args.trials} trials, "
            f"seed {args.seed}\n\nMachine: {machine()}\n\nCommand: `python benchmarks/coordinator_scaling.py "
            f"{' '.join(sys.argv[1:])}`\n\n{table(rows)}\n")
    print(text)
    if args.results:
        with open(args.results, "w") as fh:
            fh.write(text)


def _load(args) -> list[dict]:
    path = os.path.splitext(args.results)[0] + ".json" if args.results else None
    if path and os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    return []


def _save(args, rows) -> None:
    if args.results:  # after every setup: a run cut off by a time limit keeps what it measured
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
