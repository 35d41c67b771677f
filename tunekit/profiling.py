"""Profile an untuned model across shares and find the knee: the smallest share that is (almost)
as fast as the largest one. Past the knee, more of the device buys little; tuning there is cheapest."""
from __future__ import annotations

import logging
import os

from .errors import TunekitError
from .results import ProfileResult
from .run.session import ShareSession, load_model
from .shares.share import Share, parse_pct_list, share_kind

log = logging.getLogger("tunekit")

DEFAULT_PCTS = {"cpu": "25,50,75,100", "gpu": "10,20,30,40,50,60,80,100"}


def profile_shares(*, gpu_pct: str | None, cpu_pct: str | None) -> list[Share]:
    """The shares to profile, smallest first (the knee search walks upwards)."""
    if share_kind(gpu_pct, cpu_pct) == "gpu":
        from .shares.mps import require_gpu

        require_gpu()
        shares = parse_pct_list(gpu_pct, kind="gpu")
    else:
        shares = parse_pct_list(cpu_pct if cpu_pct is not None else DEFAULT_PCTS["cpu"], kind="cpu")
    return sorted(set(shares), key=lambda s: s.pct)


def find_knee(rows: list[dict], *, tolerance: float) -> str:
    """Label of the smallest share whose median is within `tolerance` of the largest share's median.
    `rows` are sorted by pct; the largest share always qualifies, so there is always a knee."""
    reference = rows[-1]["median_ms"]
    for row in rows:
        if row["median_ms"] <= (1 + tolerance) * reference:
            return row["share"]
    return rows[-1]["share"]  # unreachable: kept so a NaN reference still gives an answer


def profile(model: str, *, gpu_pct: str | None = None, cpu_pct: str | None = None, tolerance: float = 0.1,
            repeats: int = 20, input_shapes: dict | None = None, allow_unenforced_share: bool = False,
            work_dir: str | None = None, precision: str = "auto") -> ProfileResult:
    """Latency of the untuned model at each share (compiled once, in `precision`) and the knee of that curve."""
    import tempfile

    from .clients.compiler import compile_and_export
    from .frontend.precision import prepare
    from .servers.latency import measure_latency
    from .targets import target_for

    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < 10):
        raise TunekitError(f"--tolerance must be a fraction such as 0.1 (10%), got {tolerance!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise TunekitError(f"--repeats must be a positive integer, got {repeats!r}")
    shares = profile_shares(gpu_pct=gpu_pct, cpu_pct=cpu_pct)
    kind = shares[0].kind
    loaded = load_model(model, input_shapes)
    sample = loaded.inputs.random(seed=0)
    # One untuned build serves every share: the target depends on the device, not on the share size
    # (CPU: the largest share's target; its thread count comes from the pinned env at run time).
    target = target_for(shares[-1])
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunekit-profile-", dir=work_dir) as tmp:
        prepared, _ = prepare(loaded.mod, target, precision=precision)
        artifact = compile_and_export(prepared_mod=prepared, target=target, database=None,
                                      path=os.path.join(tmp, "untuned.so"))
        for share in shares:
            with ShareSession(share, allow_unenforced=allow_unenforced_share) as session:
                info, _ = measure_latency(artifact=artifact, inputs=sample, pinned=session.pinned, repeats=repeats)
                row = {"share": share.label, "pct": share.pct, "median_ms": info["median_ms"],
                       "std_ms": info["std_ms"], "enforced": session.enforced}
                if kind == "cpu":
                    row["cores"] = len(session.pinned.cores)
                else:
                    row["sm_count"] = session.sm_count
                rows.append(row)
                log.info("profile %s: %.4f ms", share.label, info["median_ms"])
    return ProfileResult(model=os.path.abspath(model), kind=kind, tolerance=tolerance, repeats=repeats,
                         shares=rows, knee=find_knee(rows, tolerance=tolerance))
