"""The commands other than `tune`: compile, evaluate, profile, records, example."""
from __future__ import annotations

from .common import EXIT_OK, add_share, emit, input_shapes


def add_compile(p) -> None:
    p.add_argument("model")
    p.add_argument("--records", required=True, help="a tune out dir or a records-<share> dir")
    p.add_argument("--share", help="which share's records, e.g. cpu50 or gpu40 (with --variants: a list, "
                                   "e.g. gpu20,gpu100; default all)")
    p.add_argument("--variants", action="store_true",
                   help="one artifact with a variant per share, the fastest run where it is loaded "
                        "(what tune --robust writes); its `main` is the first share's")
    p.add_argument("--input-shape", action="append", metavar="NAME:1x3x224x224")
    p.add_argument("--out", required=True, help="path of the compiled library (.so)")


def compile_command(args) -> int:
    from .. import api

    if args.variants:
        shares = [s.strip() for s in args.share.split(",")] if args.share else None
        path = api.compile_variants(args.model, records=args.records, shares=shares, out=args.out,
                                    input_shapes=input_shapes(args))
        emit(args, {"artifact": path}, f"compiled: {path} (a variant per share)")
        return EXIT_OK
    path = api.compile_model(args.model, records=args.records, share=args.share, out=args.out,
                             input_shapes=input_shapes(args))
    emit(args, {"artifact": path}, f"compiled: {path}")
    return EXIT_OK


def add_evaluate(p) -> None:
    p.add_argument("model")
    p.add_argument("--records", required=True)
    add_share(p, many=True)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", help="write matrix.json, matrix.md, latency_vs_share.png and report.html here")


def evaluate_command(args) -> int:
    from .. import api
    from ..run.session import check_out_dir

    if args.out:
        check_out_dir(args.out)  # fail before minutes of measuring, not after
    result = api.evaluate(args.model, records=args.records, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct,
                          input_shapes=input_shapes(args), repeats=args.repeats,
                          allow_unenforced_share=args.allow_unenforced_share)
    lines = ["tuned_at  run_at   median_ms  std_ms   numerics"]
    lines += [f"{r['tuned_at']:<9} {r['run_at']:<8} {r['median_ms']:<10.4f} {r['std_ms']:<8.4f} "
              f"{'ok' if r['numerics_ok'] else 'MISMATCH'} (max err {r['max_abs_err_vs_onnxruntime']:.2e})"
              for r in result.results]
    if args.out:
        from ..reports.matrix import write_matrix

        files = write_matrix(result.to_dict(), args.out)
        lines.append(f"wrote {files['md']}, {files['png']}, {files['html']}")
    emit(args, result.to_dict(), "\n".join(lines))
    return EXIT_OK


def add_profile(p) -> None:
    p.add_argument("model")
    add_share(p, many=True, cpu_default="25,50,75,100")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="knee: smallest share within this fraction of the largest share's latency (default 0.1)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", help="write profile.json and profile.png here")


def profile_command(args) -> int:
    from .. import api
    from ..run.session import check_out_dir

    if args.out:
        check_out_dir(args.out)
    result = api.profile(args.model, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, tolerance=args.tolerance,
                         repeats=args.repeats, input_shapes=input_shapes(args),
                         allow_unenforced_share=args.allow_unenforced_share)
    lines = ["share    cores/SMs  median_ms  std_ms"]
    lines += [f"{r['share']:<8} {str(r.get('cores', r.get('sm_count'))):<10} {r['median_ms']:<10.4f} "
              f"{r['std_ms']:.4f}" for r in result.shares]
    lines.append(f"knee: {result.knee} (smallest share within {result.tolerance:.0%} of {result.shares[-1]['share']})")
    if args.out:
        from ..reports.matrix import write_profile

        files = write_profile(result.to_dict(), args.out)
        lines.append(f"wrote {files['json']}, {files['png']}")
    emit(args, result.to_dict(), "\n".join(lines))
    return EXIT_OK


def add_records(p) -> None:
    p.add_argument("dir")


def _artifacts(directory: str, databases: dict) -> dict:
    """The compiled models in `directory` with their metadata, and whether the records they were
    built from are still those in the directory (the records' digest)."""
    import glob
    import os

    from ..deploy.metadata import metadata_path, read_metadata, records_digest

    found = {}
    for artifact in sorted(glob.glob(os.path.join(directory, "*.so"))):
        if not os.path.isfile(metadata_path(artifact)):
            continue
        meta = read_metadata(artifact)
        db = databases.get(meta.share) if meta.share else None
        found[os.path.basename(artifact)] = {
            "share": meta.share, "precision": meta.precision, "tuned_trials": meta.tuned_trials,
            "tvm_version": meta.tvm_version, "inputs": [spec.to_dict() for spec in meta.inputs],
            "records_current": None if db is None else records_digest(db) == meta.records_digest}
    return found


def records_command(args) -> int:
    from ..records.database import find_share_databases, summarize

    databases = find_share_databases(args.dir)
    summaries = {label: summarize(path) for label, path in databases.items()}
    lines = [f"{label}: {s['workloads']} workloads, {s['trials']} trials ({s['failed_trials']} failed)"
             for label, s in summaries.items()]
    artifacts = _artifacts(args.dir, databases)
    for name, info in artifacts.items():
        state = {True: "built from these records", False: "records changed since it was built", None: "untuned"}
        lines.append(f"{name}: {info['share'] or 'untuned'}, {info['precision']}, {info['tuned_trials']} trials, "
                     f"{state[info['records_current']]}")
    emit(args, {**summaries, "artifacts": artifacts} if artifacts else summaries, "\n".join(lines))
    return EXIT_OK


def add_example(p) -> None:
    from ..models.examples import EXAMPLES

    p.add_argument("--name", default="tiny_cnn", choices=EXAMPLES, help="which model (default tiny_cnn)")
    p.add_argument("--out", required=True, metavar="FILE.onnx", help="where to write it")
    p.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")


def example_command(args) -> int:
    from ..models.examples import save_example

    path = save_example(args.name, args.out, seed=args.seed)
    emit(args, {"model": path}, f"wrote {path}")
    return EXIT_OK
