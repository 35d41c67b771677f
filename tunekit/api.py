"""Python API: tune(), compile_model(), evaluate(). Keyword-only, returns dataclasses."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from .config import TuneConfig
from .errors import TunekitError
from .shares.share import Share

log = logging.getLogger("tunekit")


@dataclass
class TuneResult:
    share: str
    out_dir: str
    records_dir: str
    artifact: str
    report_path: str
    untuned_ms: float
    tuned_ms: float
    trials: int
    wall_s: float
    report: dict = field(repr=False, default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.untuned_ms / self.tuned_ms if self.tuned_ms else float("nan")


def _resolve_share(gpu_pct, cpu_pct) -> Share:
    from .shares.mps import gpu_present

    if gpu_pct is not None and cpu_pct is not None:
        raise TunekitError("give either --gpu-pct or --cpu-pct, not both")
    if gpu_pct is not None:
        if not gpu_present():
            raise TunekitError("--gpu-pct needs an NVIDIA GPU, and none was found (use --cpu-pct)")
        return Share("gpu", int(gpu_pct))
    if cpu_pct is not None:
        return Share("cpu", int(cpu_pct))
    # The embedded default: the GPU is not guaranteed (laptops, CI), a CPU share always is.
    return Share("cpu", 50)


def _check_out_dir(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".tunekit-write-test")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise TunekitError(f"cannot write to out dir {out}: {exc.strerror or exc}") from None


class _ShareSession:
    """Everything that exists while we work at one share: the MPS daemon (GPU), the pinned env."""

    def __init__(self, share: Share, *, allow_unenforced: bool):
        self.share = share
        self.allow_unenforced = allow_unenforced
        self.mps = None
        self.sm_count = None
        self.enforced = True

    def __enter__(self):
        from .shares.pinning import pinned_env

        if self.share.kind == "cpu":
            self.pinned = pinned_env(self.share)
            return self
        from .shares.mps import MPSDaemon, sm_count_at_share

        try:
            self.mps = MPSDaemon().start()
            self.pinned = pinned_env(self.share, mps_env=self.mps.env())
            self.sm_count = sm_count_at_share(self.share, self.pinned.env)
        except TunekitError:
            if not self.allow_unenforced:
                raise
            log.warning("UNENFORCED SHARE: MPS is not usable; measuring on the whole GPU")
            self.enforced = False
            self.pinned = pinned_env(self.share, enforced=False)
        return self

    def __exit__(self, *exc):
        if self.mps is not None:
            self.mps.stop()


def _cpu_model() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _load_model(model_path: str, input_shapes: dict):
    from .frontend.onnx_loader import import_to_relax, load_onnx, model_inputs

    model = load_onnx(model_path)
    inputs = model_inputs(model, input_shapes)
    return model, inputs, import_to_relax(model, inputs)


def _environment(share_session: _ShareSession) -> dict:
    import platform

    import tvm

    from .shares.mps import gpu_name

    env = {"tvm_version": tvm.__version__, "python": platform.python_version(), "host": platform.node(),
           "cpu_count": os.cpu_count(), "share": share_session.share.label,
           "share_enforced": share_session.enforced}
    if share_session.share.kind == "gpu":
        env.update({"gpu_name": gpu_name(), "sm_count_at_share": share_session.sm_count,
                    "mps_pipe_dir_private": bool(share_session.mps and share_session.mps.started_by_us)})
    else:
        env["cores_at_share"] = share_session.pinned.cores
    return env


def _resolve_auto(model: str, gpu_pct, cpu_pct, config: TuneConfig) -> tuple:
    """'auto' for a pct: profile the untuned model over the default shares and tune at the knee.
    Returns (gpu_pct, cpu_pct, share_choice) with the auto one replaced by the knee's pct."""
    auto_kind = "gpu" if gpu_pct == "auto" else "cpu" if cpu_pct == "auto" else None
    if auto_kind is None:
        return gpu_pct, cpu_pct, None
    if gpu_pct is not None and cpu_pct is not None:
        raise TunekitError("give either --gpu-pct or --cpu-pct, not both")
    from .profiling import DEFAULT_PCTS, profile

    prof = profile(model, **{f"{auto_kind}_pct": DEFAULT_PCTS[auto_kind]}, repeats=config.measure_repeats,
                   input_shapes=config.input_shapes, allow_unenforced_share=config.allow_unenforced_share)
    knee_pct = next(r["pct"] for r in prof["shares"] if r["share"] == prof["knee"])
    log.info("auto: tuning at %s (knee of the profile, tolerance %.0f%%)", prof["knee"], prof["tolerance"] * 100)
    choice = {"mode": "auto", "profile": prof, "chosen": prof["knee"]}
    return (knee_pct, None, choice) if auto_kind == "gpu" else (None, knee_pct, choice)


def tune(model: str, *, gpu_pct: int | str | None = None, cpu_pct: int | str | None = None,
         trials: int | None = None, out: str | None = None, config: TuneConfig | None = None,
         coordinator=None, show_progress: bool = False) -> TuneResult:
    """Tune `model` (an ONNX path) for one share; write records, the compiled model and report.json.
    A pct of "auto" profiles the untuned model first and tunes at the knee (see tunekit.profiling).
    With `coordinator` (a tunekit.coordinator.CoordinatorConfig) the tasks are sharded over Ray
    tuning clients; without it the run is one process (no Ray start-up)."""
    from .clients.compiler import compile_and_export, useful_records
    from .clients.tuner import Measurement, tune_tasks
    from .records.baselines import read_baselines, write_baselines
    from .frontend.tasks import extract_tasks, prepare_for_tuning
    from .records.database import count_trials, database_dir, open_database, repaired_bytes
    from .records.identity import check_or_write, out_dir_lock, run_identity
    from .reports.report import write_report
    from .servers.fleet import FleetConfig, RunnerFleet, listen_secret
    from .servers.latency import measure_latency
    from .shares.mps import gpu_name
    from .targets import target_for

    config = config or TuneConfig()
    if trials is not None:
        config = dataclasses.replace(config, trials=trials)
    # Before any work: a network-reachable listen host without a secret is refused (README "Security").
    rpc_secret = listen_secret(listen_host=config.listen_host, secret_file=config.rpc_secret_file,
                               server_mode=config.server_mode, engine=config.engine)
    gpu_pct, cpu_pct, share_choice = _resolve_auto(model, gpu_pct, cpu_pct, config)
    share = _resolve_share(gpu_pct, cpu_pct)
    share_choice = share_choice or {"mode": "fixed", "chosen": share.label}
    model_name = os.path.splitext(os.path.basename(model))[0]
    out = out or os.path.join("tunekit-out", f"{model_name}-{share.label}")
    if coordinator is not None:
        from .coordinator.coordinator import tune_shares as _coordinated

        result = _coordinated(model, shares=[share], out=out, config=config, coordinator=coordinator,
                              show_progress=show_progress)[0]
        result.report["share_choice"] = share_choice
        from .reports.report import write_report

        write_report(result.report, out)
        return result
    started = time.time()
    _, inputs, mod = _load_model(model, config.input_shapes)
    _check_out_dir(out)
    target = target_for(share, gpu_name=gpu_name() if share.kind == "gpu" else None)
    prepared = prepare_for_tuning(mod, target)
    tasks = extract_tasks(prepared, target)
    log.info("%s: %d tuning tasks, %d trials at %s", model_name, len(tasks), config.trials, share.label)
    sample = inputs.random(seed=config.seed)
    # Checked before any work: a finished run's records are never appended to by accident.
    db_dir = database_dir(out, share.label)
    identity = run_identity(model_path=model, share_label=share.label, target=target,
                            device=gpu_name() if share.kind == "gpu" else _cpu_model(), input_shapes=inputs.shapes)

    with out_dir_lock(out), _ShareSession(share, allow_unenforced=config.allow_unenforced_share) as session:
        check_or_write(db_dir, identity, resume=config.resume, existing_trials=count_trials(db_dir))
        untuned_path = compile_and_export(prepared_mod=prepared, target=target, database=None,
                                          path=os.path.join(out, "untuned.so"))
        untuned, _ = measure_latency(artifact=untuned_path, inputs=sample, pinned=session.pinned,
                                     repeats=config.measure_repeats)
        database = open_database(db_dir)
        fleet_config = FleetConfig(servers=config.servers, server_mode=config.server_mode,
                                   host=config.listen_host, secret=rpc_secret)
        with RunnerFleet(key=f"tunekit-{share.label}", pinned=session.pinned, config=fleet_config) as fleet:
            measurement = Measurement(tracker_port=fleet.tracker_port, key=fleet.key, servers=config.servers,
                                      device_kind=share.kind, share_cores=session.pinned.cores,
                                      share_env=session.pinned.env, on_hang=fleet.stop_server_on_port,
                                      host=fleet_config.connect_host, secret=rpc_secret)
            outcome = tune_tasks(extracted_tasks=tasks, target=target, database=database,
                                 work_dir=os.path.join(out, "work"), measurement=measurement, config=config,
                                 show_progress=show_progress)
            server_restarts = fleet.restarts
            faults = {**fleet.fault_counts(), **outcome.faults, "records_repaired_bytes": repaired_bytes(db_dir)}
        write_baselines(db_dir, {t["workload_hash"]: t.get("untuned_us") for t in outcome.tasks
                                 if t.get("workload_hash")})
        baselines = read_baselines(db_dir)
        records_to_apply, applied = useful_records(database, baselines)
        for row in outcome.tasks:
            if row.get("workload_hash") in applied:
                row["record_applied"] = applied[row["workload_hash"]]
        artifact = compile_and_export(prepared_mod=prepared, target=target, database=records_to_apply,
                                      path=os.path.join(out, f"{model_name}-{share.label}.so"))
        tuned, _ = measure_latency(artifact=artifact, inputs=sample, pinned=session.pinned,
                                   repeats=config.measure_repeats)
        environment = _environment(session)

    report = {
        "model": os.path.abspath(model), "share": share.label, "share_choice": share_choice, "target": str(target.export()),
        "trials": {"requested": config.trials, "measured": outcome.trials_done, "failed": outcome.trials_failed,
                   "cached": outcome.trials_cached},
        "engine": outcome.engine, "phases": outcome.phases, "session_failures": outcome.session_failures,
        "latency_ms": {"untuned": untuned, "tuned": tuned,
                       "speedup": round(untuned["median_ms"] / tuned["median_ms"], 3)},
        "tasks": outcome.tasks, "tuning_wall_s": round(outcome.wall_s, 2),
        "wall_s": round(time.time() - started, 2), "server_restarts": server_restarts, "faults": faults,
        "records_dir": db_dir, "artifact": artifact, "environment": environment,
        "config": dataclasses.asdict(config),
    }
    report_path = write_report(report, out)
    return TuneResult(share=share.label, out_dir=out, records_dir=db_dir, artifact=artifact,
                      report_path=report_path, untuned_ms=untuned["median_ms"], tuned_ms=tuned["median_ms"],
                      trials=outcome.trials_done, wall_s=report["wall_s"], report=report)


@dataclass
class SharesResult:
    """Several shares tuned in one run: one TuneResult (and one database) per share."""

    out_dir: str
    report_path: str
    results: list[TuneResult]
    report: dict = field(repr=False, default_factory=dict)


def tune_shares(model: str, *, gpu_pct: str | list | None = None, cpu_pct: str | list | None = None,
                trials: int | None = None, out: str | None = None, config: TuneConfig | None = None,
                coordinator=None, show_progress: bool = False) -> SharesResult:
    """Tune `model` for several shares (e.g. gpu_pct="25,50,100") in one run on Ray: shares that fit on
    the device together are tuned at the same time, each into its own records-<share> database;
    report.json compares them."""
    from .coordinator.coordinator import CoordinatorConfig, tune_shares as _coordinated
    from .reports.report import write_report
    from .shares.share import parse_pct_list

    if gpu_pct is not None and cpu_pct is not None:
        raise TunekitError("give either --gpu-pct or --cpu-pct, not both")
    text = gpu_pct if gpu_pct is not None else cpu_pct if cpu_pct is not None else "50"
    kind = "gpu" if gpu_pct is not None else "cpu"
    if isinstance(text, (list, tuple)):
        text = ",".join(map(str, text))
    if "auto" in str(text):
        raise TunekitError(f"--{kind}-pct auto picks one share: it cannot be part of a list")
    shares = parse_pct_list(text, kind=kind)
    if kind == "gpu":
        _resolve_share(shares[0].pct, None)  # a clear error when there is no GPU
    config = config or TuneConfig()
    if trials is not None:
        config = dataclasses.replace(config, trials=trials)
    model_name = os.path.splitext(os.path.basename(model))[0]
    out = out or os.path.join("tunekit-out", f"{model_name}-{'-'.join(s.label for s in shares)}")
    results = _coordinated(model, shares=shares, out=out, config=config,
                           coordinator=coordinator or CoordinatorConfig(), show_progress=show_progress)
    from .reports.shares import compare_shares

    report = compare_shares(results)
    path = write_report(report, out)
    return SharesResult(out_dir=out, report_path=path, results=results, report=report)


def tune_for_slo(model: str, *, slo_ms: float, gpu_pct: int | str | list | None = None,
                 cpu_pct: int | str | list | None = None, trials: int | None = None, out: str | None = None,
                 config: TuneConfig | None = None, max_speedup: float | None = None,
                 show_progress: bool = False):
    """Latency SLO mode: tune at the smallest candidate share (e.g. gpu_pct="20,40,60,100") whose tuned
    latency is <= slo_ms; `trials` per tuned share. Returns tunekit.slo.SloResult (see tunekit/slo.py)."""
    from .slo import tune_for_slo as _tune_for_slo

    return _tune_for_slo(model, slo_ms=slo_ms, gpu_pct=gpu_pct, cpu_pct=cpu_pct, trials=trials, out=out,
                         config=config, max_speedup=max_speedup, show_progress=show_progress)


def compile_model(model: str, *, records: str, share: str | None = None, out: str,
                  input_shapes: dict | None = None) -> str:
    """Compile `model` with the records of one share (a records-<share> dir or a tune out dir)."""
    from .clients.compiler import compile_and_export
    from .frontend.tasks import prepare_for_tuning
    from .records.database import find_share_databases, open_database
    from .shares.mps import gpu_name
    from .targets import target_for

    databases = find_share_databases(records)
    if share is None:
        if len(databases) != 1:
            raise TunekitError(f"{records} holds records for {sorted(databases)}: pick one with --share")
        share = next(iter(databases))
    if share not in databases:
        raise TunekitError(f"no records for share {share!r} in {records} (found {sorted(databases)})")
    share_obj = Share(share[:3], int(share[3:]))
    _, _, mod = _load_model(model, input_shapes or {})
    target = target_for(share_obj, gpu_name=gpu_name() if share_obj.kind == "gpu" else None)
    prepared = prepare_for_tuning(mod, target)
    from .records.baselines import read_baselines

    return compile_and_export(prepared_mod=prepared, target=target,
                              database=open_database(databases[share], create=False), path=out,
                              baselines=read_baselines(databases[share]))


def evaluate(model: str, *, records: str, gpu_pct: str | None = None, cpu_pct: str | None = None,
             input_shapes: dict | None = None, repeats: int = 20, allow_unenforced_share: bool = False,
             work_dir: str | None = None) -> dict:
    """Latency of the model compiled with each share's records, run at each requested share,
    with numerics checked against onnxruntime on CPU."""
    import tempfile

    import onnxruntime as ort

    from .records.database import find_share_databases
    from .servers.latency import measure_latency
    from .shares.share import parse_pct_list

    if gpu_pct is not None and cpu_pct is not None:
        raise TunekitError("give either --gpu-pct or --cpu-pct, not both")
    run_shares = parse_pct_list(gpu_pct, kind="gpu") if gpu_pct is not None else parse_pct_list(cpu_pct or "50", kind="cpu")
    kind = run_shares[0].kind
    if kind == "gpu":
        from .shares.mps import gpu_present

        if not gpu_present():
            raise TunekitError("--gpu-pct needs an NVIDIA GPU, and none was found (use --cpu-pct)")
    tuned_labels = [label for label in find_share_databases(records) if label.startswith(kind)]
    if not tuned_labels:
        raise TunekitError(f"no {kind} records in {records}")
    onnx_model, inputs, _ = _load_model(model, input_shapes or {})
    sample = inputs.random(seed=0)
    reference = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, sample)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunekit-eval-", dir=work_dir) as tmp:
        artifacts = {label: compile_model(model, records=records, share=label, out=os.path.join(tmp, f"{label}.so"),
                                          input_shapes=input_shapes) for label in tuned_labels}
        for run_share in run_shares:
            with _ShareSession(run_share, allow_unenforced=allow_unenforced_share) as session:
                for label, artifact in artifacts.items():
                    info, outputs = measure_latency(artifact=artifact, inputs=sample, pinned=session.pinned,
                                                    repeats=repeats)
                    max_err = max(float(np.max(np.abs(o.astype(np.float64) - r.astype(np.float64))))
                                  for o, r in zip(outputs, reference))
                    rows.append({"tuned_at": label, "run_at": run_share.label, **info,
                                 "max_abs_err_vs_onnxruntime": max_err,
                                 "numerics_ok": bool(all(np.allclose(o, r, rtol=1e-3, atol=1e-3)
                                                         for o, r in zip(outputs, reference)))})
    return {"model": os.path.abspath(model), "records": os.path.abspath(records), "results": rows}
