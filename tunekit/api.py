"""Python API: tune(), tune_shares(), tune_for_slo(), compile_model(), evaluate(), profile().
Keyword-only arguments after the model; every function returns a dataclass (tunekit.results).

Each tuning call picks an executor (one process, or Ray when a coordinator is given) and hands
it to the one pipeline (run.pipeline); nothing here tunes or measures by itself.
"""
from __future__ import annotations

import logging
import os

from .config import CoordinatorConfig, TuneConfig
from .errors import TunekitError
from .config import FleetModel
from .results import EvalResult, FleetResult, ProfileResult, SharesResult, SloResult, TuneResult
from .shares.share import Share, parse_pct_list, share_kind

log = logging.getLogger("tunekit")

__all__ = ["tune", "tune_shares", "tune_fleet", "tune_for_slo", "compile_model", "evaluate", "profile"]


def _executor(config: TuneConfig, coordinator: CoordinatorConfig | None):
    """One process, or the Ray coordinator; the secret is checked before either starts anything."""
    from .servers.fleet import listen_secret

    # Before any work: a network-reachable listen host without a secret is refused (docs/running.md, "Security").
    secret = listen_secret(listen_host=config.listen_host, secret_file=config.rpc_secret_file,
                           server_mode=config.server_mode, engine=config.engine)
    if coordinator is None:
        from .run.local import LocalExecutor

        return LocalExecutor(config, rpc_secret=secret)
    from .coordinator.executor import RayExecutor

    return RayExecutor(config, coordinator, rpc_secret=secret)


def _resolve_auto(model: str, gpu_pct, cpu_pct, config: TuneConfig) -> tuple:
    """'auto' for a pct: profile the untuned model over the default shares and tune at the knee.
    Returns (gpu_pct, cpu_pct, share_choice) with the auto one replaced by the knee's pct."""
    kind = share_kind(gpu_pct, cpu_pct)
    if (gpu_pct if kind == "gpu" else cpu_pct) != "auto":
        return gpu_pct, cpu_pct, None
    from .profiling import DEFAULT_PCTS

    prof = profile(model, **{f"{kind}_pct": DEFAULT_PCTS[kind]}, repeats=config.measure_repeats,
                   input_shapes=config.input_shapes, allow_unenforced_share=config.allow_unenforced_share,
                   precision=config.precision)
    log.info("auto: tuning at %s (knee of the profile, tolerance %.0f%%)", prof.knee, prof.tolerance * 100)
    choice = {"mode": "auto", "profile": prof.to_dict(), "chosen": prof.knee}
    knee_pct = prof.row(prof.knee)["pct"]
    return (knee_pct, None, choice) if kind == "gpu" else (None, knee_pct, choice)


def _one_model(config: TuneConfig) -> TuneConfig:
    if config.fleet_objective == "geomean":
        raise TunekitError("fleet_objective weighs a fleet's models: tune several at once (tunekit tune a.onnx "
                           "b.onnx, or a fleet file)")
    return config


def _default_out(model, labels: list[str]) -> str:
    from .frontend.torch_loader import is_torch_module

    name = type(model).__name__.lower() if is_torch_module(model) else os.path.splitext(os.path.basename(model))[0]
    return os.path.join("tunekit-out", f"{name}-{'-'.join(labels)}")


def tune(model, *, example_inputs: tuple | None = None, gpu_pct: int | str | None = None,
         cpu_pct: int | str | None = None, trials: int | None = None, out: str | None = None,
         config: TuneConfig | None = None, coordinator: CoordinatorConfig | None = None,
         show_progress: bool = False) -> TuneResult:
    """Tune `model` for one share; write records, the compiled model and report.json.
    `model`: an ONNX path, or a torch.nn.Module with `example_inputs` (a tuple of tensors, one per
    forward argument; imported through torch.export; needs `tunekit[torch]`).
    A pct of "auto" profiles the untuned model first and tunes at the knee (see tunekit.profiling;
    ONNX only). With `coordinator` the tasks are sharded over Ray tuning clients; without it the
    run is one process (no Ray start-up)."""
    from .run.pipeline import Pipeline
    from .run.session import resolve_share

    config = _one_model((config or TuneConfig()).with_trials(trials))
    executor = _executor(config, coordinator)
    gpu_pct, cpu_pct, share_choice = _resolve_auto(model, gpu_pct, cpu_pct, config)
    share = resolve_share(gpu_pct, cpu_pct)
    pipeline = Pipeline(model=model, shares=[share], out=out or _default_out(model, [share.label]), config=config,
                        executor=executor, show_progress=show_progress, share_choice=share_choice,
                        example_inputs=example_inputs)
    return pipeline.run()[0]


def tune_fleet(models: list, *, gpu_pct: int | None = None, cpu_pct: int | None = None, trials: int | None = None,
               out: str | None = None, config: TuneConfig | None = None, coordinator: CoordinatorConfig | None = None,
               show_progress: bool = False) -> FleetResult:
    """Tune several models as one fleet: one search, one trial budget (config.trials, config.time_budget_s)
    spent where it lowers the weighted sum of their latencies most, a workload they share searched once.
    `models`: ONNX paths or config.FleetModel (its own share and weight); `gpu_pct` / `cpu_pct`: the share of
    those that name none. Each model gets its own out dir `<out>/<name>` as a single run writes it; a model
    that fails never stops the others (FleetResult.failed says why). With `coordinator`, each share's tasks are
    sharded over Ray tuning clients (the shares that fit on a device together tuned at once)."""
    from .run.fleet import tune_fleet as run_fleet
    from .run.fleet import with_objective
    from .run.session import resolve_share

    entries = [m if isinstance(m, FleetModel) else FleetModel(model=str(m)) for m in models]
    if not entries:
        raise TunekitError("a fleet needs at least one model")
    for pct in (gpu_pct, cpu_pct):
        if pct is not None and not isinstance(pct, int):
            raise TunekitError(f"a fleet's share is one integer percentage, got {pct!r}")
    shares = [resolve_share(e.gpu_pct if e.gpu_pct is not None or e.cpu_pct is not None else gpu_pct,
                            e.cpu_pct if e.gpu_pct is not None or e.cpu_pct is not None else cpu_pct)
              for e in entries]
    config = with_objective((config or TuneConfig()).with_trials(trials), one_process=coordinator is None)
    out = out or os.path.join("tunekit-out", "fleet-" + "-".join(sorted({s.label for s in shares})))
    return run_fleet(entries, shares, out=out, config=config, executor=_executor(config, coordinator),
                     show_progress=show_progress)


def tune_shares(model: str, *, gpu_pct: str | list | None = None, cpu_pct: str | list | None = None,
                trials: int | None = None, out: str | None = None, config: TuneConfig | None = None,
                coordinator: CoordinatorConfig | None = None, show_progress: bool = False) -> SharesResult:
    """Tune `model` for several shares (e.g. gpu_pct="20,40,100"), each into its own records-<share>
    database; report.json compares them.

    In one process (no `coordinator`) one search serves every share: each candidate is built once
    and measured at every share; config.robust also writes `<model>-robust.so`, the share-robust artifact, with its regret per
    share in report.json. With `coordinator`, Ray clients search each share, shares that fit on
    the device together at the same time."""
    from .reports.shares import compare_shares
    from .run.pipeline import Pipeline
    from .run.report import write_report
    from .shares.mps import require_gpu

    kind = share_kind(gpu_pct, cpu_pct)
    text = (gpu_pct if kind == "gpu" else cpu_pct) or "50"
    if isinstance(text, (list, tuple)):
        text = ",".join(map(str, text))
    if "auto" in str(text):
        raise TunekitError(f"--{kind}-pct auto picks one share: it cannot be part of a list")
    shares = parse_pct_list(text, kind=kind)
    if kind == "gpu":
        require_gpu()
    config = _one_model((config or TuneConfig()).with_trials(trials))
    out = out or _default_out(model, [s.label for s in shares])
    pipeline = Pipeline(model=model, shares=shares, out=out, config=config, executor=_executor(config, coordinator),
                        show_progress=show_progress)
    results = pipeline.run()
    report = compare_shares(results)
    # What the executor did, read from its outcome (the shares' searches proposed in turns), not re-derived here.
    together = any("proposed_by" in r.report.get("phases", {}) for r in results)
    report["search"] = "one search, every candidate measured at every share" if together else "one search per share"
    if pipeline.robust is not None:
        report["robust"] = pipeline.robust
    return SharesResult(out_dir=out, report_path=write_report(report, out), results=results, report=report)


def tune_for_slo(model: str, *, slo_ms: float, gpu_pct: int | str | list | None = None,
                 cpu_pct: int | str | list | None = None, trials: int | None = None, out: str | None = None,
                 config: TuneConfig | None = None, max_speedup: float | None = None,
                 show_progress: bool = False) -> SloResult:
    """Latency SLO mode: tune at the smallest candidate share (e.g. gpu_pct="20,40,60,100") whose tuned
    latency is <= slo_ms; `trials` per tuned share (see tunekit/slo.py)."""
    from .slo import tune_for_slo as walk

    return walk(model, slo_ms=slo_ms, gpu_pct=gpu_pct, cpu_pct=cpu_pct, trials=trials, out=out, config=config,
                max_speedup=max_speedup, show_progress=show_progress, tune=tune, profile=profile)


def compile_model(model: str, *, records: str, share: str | None = None, out: str,
                  input_shapes: dict | None = None) -> str:
    """Compile `model` with the records of one share (a records-<share> dir or a tune out dir)."""
    from .clients.compiler import compile_and_export, kernels_worth_applying
    from .frontend.precision import prepare
    from .records.baselines import read_baselines
    from .deploy.metadata import metadata_for, write_metadata
    from .records.database import count_trials, find_share_databases, open_best_records
    from .records.identity import read_identity
    from .run.session import load_model
    from .targets import target_for

    databases = find_share_databases(records)
    if share is None:
        if len(databases) != 1:
            raise TunekitError(f"{records} holds records for {sorted(databases)}: pick one with --share")
        share = next(iter(databases))
    if share not in databases:
        raise TunekitError(f"no records for share {share!r} in {records} (found {sorted(databases)})")
    share_obj = Share.from_label(share)
    loaded = load_model(model, input_shapes)
    target = target_for(share_obj)
    # The records are for the workloads of the precision they were tuned in (fp32 before it was recorded).
    precision = read_identity(databases[share]).get("precision", "fp32")
    prepared, _ = prepare(loaded.mod, target, precision=precision)
    database = open_best_records(databases[share], create=False)
    compile_and_export(prepared_mod=prepared, target=target, database=database, path=out,
                       baselines=read_baselines(databases[share]),
                       kernels=kernels_worth_applying(databases[share], database))  # the tune's Triton kernels too
    write_metadata(out, metadata_for(loaded=loaded, target=target, share_label=share, precision=precision,
                                     tuned_trials=count_trials(databases[share]), db_dir=databases[share],
                                     prepared_mod=prepared))
    return out


def compile_variants(model: str, *, records: str, shares: list[str] | None = None, default: str | None = None,
                     out: str, input_shapes: dict | None = None) -> str:
    """One artifact with a variant per share (`main__<share>`, compiled with that share's records; `main`
    the `default` share's, else the first's), which tunekit.load times where it runs and runs the fastest
    of: the share-robust artifact of `tune --robust`, from records already measured (a tune out dir
    with several shares' databases). `shares`: which of them (default: all)."""
    from .clients.compiler import compile_variants_and_export, kernels_worth_applying, records_worth_applying
    from .deploy.metadata import metadata_for, write_metadata
    from .deploy.variants import entry_name
    from .frontend.precision import prepare
    from .records.database import find_share_databases
    from .records.identity import read_identity
    from .run.session import load_model
    from .targets import target_for

    databases = find_share_databases(records)
    shares = shares or sorted(databases, key=lambda label: Share.from_label(label).pct)
    missing = [s for s in shares if s not in databases]
    if missing:
        raise TunekitError(f"no records for share(s) {', '.join(missing)} in {records} (found {sorted(databases)})")
    if len(shares) < 2:
        raise TunekitError(f"variants need the records of at least two shares; {records} has {sorted(databases)}")
    kinds = {Share.from_label(s).kind for s in shares}
    if len(kinds) > 1:
        raise TunekitError(f"variants are for one device: {', '.join(shares)} mixes CPU and GPU shares")
    default = default or shares[0]
    if default not in shares:
        raise TunekitError(f"--default {default} is not one of the variants ({', '.join(shares)})")
    loaded = load_model(model, input_shapes)
    sources, prepared_of = {}, {}
    for share in shares:
        target = target_for(Share.from_label(share))
        # the records are for the workloads of the precision they were tuned in
        precision = read_identity(databases[share]).get("precision", "fp32")
        prepared, _ = prepare(loaded.mod, target, precision=precision)
        prepared_of[share] = (prepared, precision, target)
        sources[share] = (prepared, records_worth_applying(databases[share], create=False)[0])
    prepared, precision, target = prepared_of[default]
    kernels = {share: kernels_worth_applying(databases[share], sources[share][1]) for share in shares}
    compile_variants_and_export(variants=sources, default=default, target=target, path=out, kernels=kernels)
    meta = metadata_for(loaded=loaded, target=target, share_label=None, precision=precision, tuned_trials=0,
                        db_dir=None, prepared_mod=prepared)
    meta.extra.update({"variants": {share: entry_name(share) for share in shares}, "default_variant": default})
    write_metadata(out, meta)
    return out


def evaluate(model: str, *, records: str, gpu_pct: str | None = None, cpu_pct: str | None = None,
             input_shapes: dict | None = None, repeats: int = 20, allow_unenforced_share: bool = False,
             work_dir: str | None = None) -> EvalResult:
    """Latency of the model compiled with each share's records, run at each requested share,
    with numerics checked against onnxruntime on CPU."""
    from .evaluation import evaluate_matrix

    return evaluate_matrix(model, records=records, gpu_pct=gpu_pct, cpu_pct=cpu_pct, input_shapes=input_shapes,
                           repeats=repeats, allow_unenforced_share=allow_unenforced_share, work_dir=work_dir,
                           compile_model=compile_model)


def profile(model: str, *, gpu_pct: str | None = None, cpu_pct: str | None = None, tolerance: float = 0.1,
            repeats: int = 20, input_shapes: dict | None = None, allow_unenforced_share: bool = False,
            work_dir: str | None = None, precision: str = "auto") -> ProfileResult:
    """The untuned model's latency at each share (compiled once, in `precision`) and the knee of that curve."""
    from .profiling import profile as profile_shares

    return profile_shares(model, gpu_pct=gpu_pct, cpu_pct=cpu_pct, tolerance=tolerance, repeats=repeats,
                          input_shapes=input_shapes, allow_unenforced_share=allow_unenforced_share,
                          work_dir=work_dir, precision=precision)
