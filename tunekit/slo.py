"""Latency SLO mode: the smallest share whose *tuned* latency meets a latency target.

    tunekit tune model.onnx --slo-ms 5 --gpu-pct 20,40,60,100

1. The untuned model is profiled at every candidate share (tunekit.profiling.profile: one build,
   one latency measurement per share). This is cheap and tells the user where the curve lies.
2. Shares are tuned from the smallest upward, each into its own out subdir (`<out>/<share>/`,
   with its own `records-<share>` database: TVM's lookups ignore the target, so shares never
   share a database). The walk stops at the first share whose tuned median latency is <= the SLO:
   latency falls as the share grows, so that is the smallest share that meets it.
3. No share is skipped by default. Tuning can buy several x (4.9x for tiny_cnn at cpu50 with 32
   trials, more with naive CPU loops), so an untuned latency above the SLO says little. With
   `max_speedup=X` a share is skipped when its untuned latency is more than X times the SLO, i.e.
   when meeting the SLO there would take more than an X-fold speedup from tuning.
4. `<out>/slo.json` holds the whole result (rewritten after every share, so a run cut off still
   leaves what it found) and every tuned share's report.json gets the same `share_choice`
   ({"mode": "slo", "slo_ms", "met", "chosen", "tried", ...}).

When no share meets the SLO, every candidate was tuned and the result names the best one
(lowest tuned latency); the CLI then exits with code 3 (cli.common.EXIT_SLO_NOT_MET).
"""
from __future__ import annotations

import json
import logging
import math
import os
from typing import Callable

from .errors import TunekitError
from .results import SloResult
from .run.session import check_out_dir
from .shares.share import Share, parse_pct_list, share_kind

log = logging.getLogger("tunekit")

DEFAULT_SLO_PCTS = {"cpu": "25,50,75,100", "gpu": "20,40,60,100"}
SLO_FILE = "slo.json"


def check_slo_ms(value) -> float:
    """A positive, finite number of milliseconds; anything else is a one-line error."""
    if isinstance(value, bool):
        raise TunekitError(f"--slo-ms must be a positive number of milliseconds, got {value!r}")
    try:
        slo = float(value)
    except (TypeError, ValueError):
        raise TunekitError(f"--slo-ms must be a positive number of milliseconds, got {value!r}") from None
    if not math.isfinite(slo) or slo <= 0:
        raise TunekitError(f"--slo-ms must be a positive number of milliseconds, got {value!r}")
    return slo


def candidate_shares(*, gpu_pct, cpu_pct) -> list[Share]:
    """The candidate shares, smallest first; the default list when no pct is given."""
    kind = share_kind(gpu_pct, cpu_pct)
    text = gpu_pct if kind == "gpu" else cpu_pct
    if isinstance(text, (list, tuple)):
        text = ",".join(str(p) for p in text)
    if text is not None and any(p.strip().lower() == "auto" for p in str(text).split(",")):
        raise TunekitError(f"--slo-ms picks the share itself: give --{kind}-pct a list of candidate "
                           f"shares such as {DEFAULT_SLO_PCTS[kind]}, not 'auto'")
    if text is None:
        text = DEFAULT_SLO_PCTS[kind]
    shares = parse_pct_list(text, kind=kind)
    if kind == "gpu":
        from .shares.mps import require_gpu

        require_gpu()
    return sorted(set(shares), key=lambda s: s.pct)


def _write_summary(result: SloResult) -> None:
    from .atomic import write_json_atomic

    # The CLI's --json output, plus the share_choice that every tuned share's report.json carries.
    write_json_atomic(result.summary_path, {**result.to_dict(), "share_choice": result.share_choice()})


def _stamp_reports(result: SloResult) -> None:
    """Every tuned share's report.json records how its share was chosen (the whole walk)."""
    from .atomic import write_json_atomic

    for row in result.tried:
        path = row.get("report_path")
        if not path or not os.path.isfile(path):
            continue
        with open(path) as fh:
            report = json.load(fh)
        report["share_choice"] = result.share_choice()
        write_json_atomic(path, report)


def _pct_kwargs(share: Share) -> dict:
    return {"gpu_pct": share.pct} if share.kind == "gpu" else {"cpu_pct": share.pct}


def tune_for_slo(model: str, *, slo_ms: float, gpu_pct=None, cpu_pct=None, trials: int | None = None,
                 out: str | None = None, config=None, max_speedup: float | None = None,
                 show_progress: bool = False, tune: Callable, profile: Callable) -> SloResult:
    """Tune `model` at the smallest candidate share whose tuned latency meets `slo_ms`.

    gpu_pct / cpu_pct: candidate shares ("20,40,100", a list, or one int); default
    DEFAULT_SLO_PCTS. `trials` (or config.trials) is the budget of *each* tuned share.
    Each share is tuned into `<out>/<share>/`; `<out>/slo.json` holds the result.
    `tune` and `profile` are the API's (tunekit.tune / tunekit.profile), passed in as Optuna's
    `optimize` takes its objective: the walk itself only decides which share to tune next."""
    from .config import TuneConfig

    slo = check_slo_ms(slo_ms)
    if max_speedup is not None:
        if isinstance(max_speedup, bool) or not isinstance(max_speedup, (int, float)) or \
                not math.isfinite(max_speedup) or max_speedup < 1:
            raise TunekitError(f"max_speedup must be a number >= 1 (or None: skip no share), got {max_speedup!r}")
        max_speedup = float(max_speedup)
    shares = candidate_shares(gpu_pct=gpu_pct, cpu_pct=cpu_pct)
    kind = shares[0].kind
    config = (config or TuneConfig()).with_trials(trials)
    model_name = os.path.splitext(os.path.basename(model))[0]
    out = out or os.path.join("tunekit-out", f"{model_name}-slo-{kind}")
    check_out_dir(out)

    pct_list = ",".join(str(s.pct) for s in shares)
    prof = profile(model, **{f"{kind}_pct": pct_list}, repeats=config.measure_repeats,
                   input_shapes=config.input_shapes, allow_unenforced_share=config.allow_unenforced_share,
                   precision=config.precision)
    untuned = {row["share"]: row["median_ms"] for row in prof.shares}
    candidates = [{"share": s.label, "pct": s.pct, "untuned_ms": untuned[s.label], "status": "pending"}
                  for s in shares]
    result = SloResult(slo_ms=slo, kind=kind, met=False, chosen=None, tuned_ms=None, best_share=None, best_ms=None,
                       out_dir=out, summary_path=os.path.join(out, SLO_FILE), candidates=candidates, tried=[],
                       profile=prof.to_dict(), max_speedup=max_speedup)
    log.info("slo %.4g ms: candidates %s (untuned %s)", slo, [s.label for s in shares],
             ", ".join(f"{k} {v:.4g} ms" for k, v in untuned.items()))
    _write_summary(result)

    for share, cand in zip(shares, candidates):
        if result.met:
            cand["status"] = "not_needed"  # a smaller share already met the SLO
            continue
        if max_speedup is not None and cand["untuned_ms"] > max_speedup * slo:
            cand["status"] = "skipped"
            cand["reason"] = (f"untuned {cand['untuned_ms']:.4g} ms would need more than "
                              f"{max_speedup:g}x from tuning to meet {slo:g} ms")
            log.info("slo: skipping %s: %s", share.label, cand["reason"])
            _write_summary(result)
            continue
        share_out = os.path.join(out, share.label)
        log.info("slo: tuning at %s (%d trials) into %s", share.label, config.trials, share_out)
        tuned = tune(model, **_pct_kwargs(share), out=share_out, config=config, show_progress=show_progress)
        met = tuned.tuned_ms <= slo
        row = {"share": share.label, "pct": share.pct, "untuned_ms": tuned.untuned_ms, "tuned_ms": tuned.tuned_ms,
               "profile_untuned_ms": cand["untuned_ms"], "met": met, "trials": tuned.trials,
               "wall_s": tuned.wall_s, "out_dir": share_out, "records_dir": tuned.records_dir,
               "artifact": tuned.artifact, "report_path": tuned.report_path}
        result.tried.append(row)
        cand["status"] = "met" if met else "not_met"
        cand["tuned_ms"] = tuned.tuned_ms
        if result.best_ms is None or tuned.tuned_ms < result.best_ms:
            result.best_share, result.best_ms = share.label, tuned.tuned_ms
        if met:
            result.met, result.chosen, result.tuned_ms = True, share.label, tuned.tuned_ms
        log.info("slo: %s tuned %.4g ms: %s", share.label, tuned.tuned_ms, "met" if met else "not met")
        _write_summary(result)
    if result.met:
        result.best_share, result.best_ms = result.chosen, result.tuned_ms
    _write_summary(result)
    _stamp_reports(result)
    return result


def describe(result: SloResult) -> str:
    """The human summary the CLI prints."""
    lines = []
    for cand in result.candidates:
        text = f"  {cand['share']:<7} untuned {cand['untuned_ms']:.4f} ms"
        if "tuned_ms" in cand:
            text += f", tuned {cand['tuned_ms']:.4f} ms"
        text += f"  [{cand['status'].replace('_', ' ')}]"
        if cand.get("reason"):
            text += f" ({cand['reason']})"
        lines.append(text)
    if result.met:
        head = f"SLO met: {result.chosen}, tuned {result.tuned_ms:.4f} ms <= SLO {result.slo_ms:g} ms"
    elif result.best_share is not None:
        head = (f"SLO NOT met (best: {result.best_ms:.4f} ms at {result.best_share}); SLO {result.slo_ms:g} ms")
    else:
        head = f"SLO NOT met (no share tuned: every candidate was skipped); SLO {result.slo_ms:g} ms"
    return "\n".join([head, *lines, f"slo.json: {result.summary_path}"])
