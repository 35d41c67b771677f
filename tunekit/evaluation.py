"""`evaluate`: the tuned-at x run-at latency matrix, with numerics checked against onnxruntime."""
from __future__ import annotations

import os
import tempfile

from .errors import TunekitError
from .results import EvalResult
from .run.session import ShareSession, load_model
from .shares.share import parse_pct_list, share_kind


def _numerics_row(loaded, outputs, reference, db_dir: str) -> dict:
    """The artifact's outputs against onnxruntime, judged by the bound its records were tuned under:
    their precision's, with that run's config overrides (the bound its gate applied)."""
    from .numerics import bound_for, compare_outputs, within
    from .records.identity import read_bound_overrides, read_identity

    rows = compare_outputs(loaded.output_names, outputs, reference)
    precision = read_identity(db_dir).get("precision", "fp32")
    bound = bound_for(precision, **read_bound_overrides(db_dir))
    return {"max_abs_err_vs_onnxruntime": max(r["max_abs_err"] for r in rows), "numerics": rows,
            "precision": precision, "numerics_bound": bound.to_dict(), "numerics_ok": within(rows, bound)}


def evaluate_matrix(model: str, *, records: str, gpu_pct=None, cpu_pct=None, input_shapes: dict | None = None,
                    repeats: int = 20, allow_unenforced_share: bool = False, work_dir: str | None = None,
                    compile_model) -> EvalResult:
    """Compile the model once per tuned share found in `records` (with `compile_model`, the API's),
    and measure every such artifact at every requested share."""
    from .records.database import find_share_databases
    from .shares.mps import require_gpu

    kind = share_kind(gpu_pct, cpu_pct)
    run_shares = parse_pct_list(gpu_pct if kind == "gpu" else (cpu_pct or "50"), kind=kind)
    if kind == "gpu":
        require_gpu()
    databases = find_share_databases(records)
    tuned_labels = [label for label in databases if label.startswith(kind)]
    if not tuned_labels:
        raise TunekitError(f"no {kind} records in {records}")
    loaded = load_model(model, input_shapes)
    sample = loaded.inputs.random(seed=0)
    reference = loaded.reference(sample)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunekit-eval-", dir=work_dir) as tmp:
        artifacts = {label: compile_model(model, records=records, share=label, out=os.path.join(tmp, f"{label}.so"),
                                          input_shapes=input_shapes) for label in tuned_labels}
        for run_share in run_shares:
            with ShareSession(run_share, allow_unenforced=allow_unenforced_share) as share_session:
                for label, artifact in artifacts.items():
                    info, outputs = share_session.measure_latency(artifact=artifact, inputs=sample, repeats=repeats)
                    rows.append({"tuned_at": label, "run_at": run_share.label, **info,
                                 **_numerics_row(loaded, outputs, reference, databases[label])})
    return EvalResult(model=os.path.abspath(model), records=os.path.abspath(records), results=rows)
