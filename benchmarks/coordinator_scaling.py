"""Tuning clients and runner servers: the same model, trial budget and seed with 1, 2, 4 clients and
1..N servers, in one run. Prints wall time, trials/s and final latency per setup, with ratios to
the first setup (1 client, 1 server), and writes the table with the machine and command.

Every setup is its own `tunekit tune` process through the Ray coordinator (so each pays Ray's and
its clients' start-up), plus, for reference, the single-process engine without Ray.

  python benchmarks/coordinator_scaling.py --model tiny_cnn --cpu-pct 50 --trials 32
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --trials 48 --setups 1x1,1x2,2x2
  # each GPU with its own 16 cores, as if every GPU came with a machine of its own (1 GPU: cores 0-15, 2: 0-31):
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --setups 1x2x1,2x2x2 --cores-per-gpu 16
  # clients on CPU nodes of a cluster, fleets on its GPU node (README: Clients where the CPUs are):
  python benchmarks/coordinator_scaling.py --model resnet18 --gpu-pct 40 --setups 4x2x1,8x2x2 --no-single-process \
      --ray-address HEAD:6379 --client-nodes tunekit_client --rpc-secret-file ~/.tunekit-secret
"""
from __future__ import annotations

import argparse
import json
import os
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


def run_setup(label: str, clients: int | None, servers: int, model: str, share_flag: list[str], args,
              workdir: str, gpus: int = 0) -> dict:
    out = os.path.join(workdir, label)
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", model, *share_flag, "--trials", str(args.trials),
           "--trials-per-iter", str(args.trials_per_iter), "--seed", str(args.seed), "--servers", str(servers),
           "--out", out, "--json"]
    if clients is not None:
        cmd += ["--clients", str(clients)]
    if gpus:
        cmd += ["--gpus", ",".join(str(g) for g in range(gpus))]
    if clients is not None:
        for flag in ("ray_address", "client_nodes", "rpc_secret_file"):
            if getattr(args, flag):
                cmd += ["--" + flag.replace("_", "-"), getattr(args, flag)]
    print(f"[{label}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    cores = setup_cores(gpus, args.cores_per_gpu)
    started = time.time()
    # Ray, its workers and the build pools inherit the affinity: Ray counts these cores as the node's CPUs
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    if proc.returncode != 0:
        return {"label": label, "error": proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else "failed"}
    report = json.loads(proc.stdout)["report"]
    if args.keep_reports:  # the whole report (fleet placement, per-client phases) beside the table
        os.makedirs(args.keep_reports, exist_ok=True)
        with open(os.path.join(args.keep_reports, label.replace(" ", "").replace("(s)", "") + ".json"), "w") as fh:
            json.dump(report, fh, indent=1)
    return {"label": label, "clients": clients or 1, "servers": servers, "gpus": gpus or 1, "ray": clients is not None,
            "cores": len(cores) if cores else len(os.sched_getaffinity(0)),
            "tuning_wall_s": report["tuning_wall_s"], "process_wall_s": round(time.time() - started, 1),
            "trials": report["trials"]["measured"], "failed": report["trials"]["failed"],
            "trials_per_s": round(report["trials"]["measured"] / report["tuning_wall_s"], 3),
            "untuned_ms": report["latency_ms"]["untuned"]["median_ms"],
            "tuned_ms": report["latency_ms"]["tuned"]["median_ms"],
            "tuned_std_ms": report["latency_ms"]["tuned"].get("std_ms"),
            "server_restarts": report.get("server_restarts", 0),
            # when each client was done, in seconds from the start: how balanced its shards were
            "shards_done_s": [s.get("done_s") for s in report["coordinator"]["shards"]] if clients is not None else [],
            # and when each client's search began: what starting the clients cost
            "shards_start_s": [s["search_started_s"] for s in report["coordinator"]["shards"]
                               if s.get("search_started_s") is not None] if clients is not None else [],
            "client_nodes": sorted({f"{p['ip']} ({p['cores']} cores, {p['build_workers']} build workers)"
                                    for s in report["coordinator"]["shards"] for p in s.get("ran_on", [])
                                    if "build_workers" in p}) if clients is not None else []}


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if "error" not in r and r.get("ray")), None)
    lines = ["| setup | clients | servers | cores | tuning wall (s) | whole command (s) | trials | trials/s | "
             "trials/s vs first | tuned latency (ms) | latency vs first | clients done (s) | clients started (s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | | | | failed: {r['error']} | | | | | | | | |")
            continue
        speed = f"{r['trials_per_s'] / base['trials_per_s']:.2f}x" if base else ""
        lat = f"{r['tuned_ms'] / base['tuned_ms']:.3f}" if base else ""
        lines.append(f"| {r['label']} | {r['clients']} | {r['servers']} | {r.get('cores', '')} | {r['tuning_wall_s']:.1f} | "
                     f"{r['process_wall_s']:.1f} | {r['trials']} | {r['trials_per_s']:.3f} | {speed} | "
                     f"{r['tuned_ms']:.4f} ± {r['tuned_std_ms'] or 0:.4f} | {lat} | "
                     f"{', '.join(f'{d:.0f}' for d in r.get('shards_done_s') or [] if d is not None)} | "
                     f"{', '.join(f'{d:.0f}' for d in r.get('shards_start_s') or [])} |")
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
                        help="CLIENTSxSERVERS[xGPUS] list through Ray (the first is the reference); "
                             "servers are per GPU, GPUS uses devices 0..GPUS-1")
    parser.add_argument("--keep-reports", help="copy each setup's report.json into this folder")
    parser.add_argument("--cores-per-gpu", type=int,
                        help="run a setup of G GPUs on the first G x N cores only (each GPU brings its own cores)")
    parser.add_argument("--ray-address", help="Ray setups join this cluster (default: each starts Ray here)")
    parser.add_argument("--client-nodes", help="Ray setups: where the tuning clients go (any, cpu-only, a resource)")
    parser.add_argument("--rpc-secret-file", help="Ray setups: the secret fleets demand on a cluster of machines")
    parser.add_argument("--no-single-process", action="store_true", help="skip the no-Ray reference run")
    parser.add_argument("--results", help="write the table here (Markdown; a .json beside it)")
    args = parser.parse_args()
    share_flag = ["--gpu-pct", str(args.gpu_pct)] if args.gpu_pct else ["--cpu-pct", str(args.cpu_pct or 50)]
    # Resumable: setups already in --results' JSON (a call cut off by a time limit, or an earlier
    # call on the same machine) are kept and not run again.
    rows = _load(args)
    done = {r["label"] for r in rows if "error" not in r}
    rows = [r for r in rows if "error" not in r]
    with tempfile.TemporaryDirectory(prefix="tunekit-scaling-") as workdir:
        model = model_path(args.model, workdir)
        setups = [[int(x) for x in s.split("x")] + [0] for s in args.setups.split(",")]
        for clients, servers, gpus, *_ in setups:
            label = f"{clients} client(s) x {servers} server(s)" + (f" x {gpus} GPU(s)" if gpus else "")
            if label in done:
                print(f"[{label}] kept from {args.results}", file=sys.stderr)
                continue
            rows.append(run_setup(label, clients, servers, model, share_flag, args, workdir, gpus))
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
