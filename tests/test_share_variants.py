"""The share-robust artifact's variants (issue 15): one module with a variant per share, compiled once,
loaded by tunekit.load, which runs the variant that is fastest where it is loaded."""
import json

import numpy as np
import pytest

import tunekit
from tunekit.errors import TunekitError
from tunekit.testing import run_cli

B = "robust-per-task"


@pytest.fixture(scope="module")
def two_variants(example_model, tmp_path_factory):
    """tiny_cnn for the CPU as two variants that differ in one kernel's schedule (its conv loop split
    and parallel in `b`), merged, compiled and exported with metadata listing both. `b` is labelled
    as the static per-task choice is, with hyphens, which no symbol may have."""
    import tvm
    from tvm import relax, s_tir

    from tunekit.clients.share_variants import merge_variants
    from tunekit.deploy.metadata import metadata_for, write_metadata
    from tunekit.frontend.precision import prepare
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    loaded = load_model(example_model)
    target = target_for(Share.from_label("cpu50"))
    prepared, _ = prepare(loaded.mod, target, precision="fp32")
    sch = s_tir.Schedule(prepared)
    sch.work_on("fused_conv2d_add_relu")
    block = sch.get_sblock("conv2d_nchw")
    outer, _ = sch.split(sch.get_loops(block)[1], factors=[None, 4])
    sch.parallel(outer)
    rescheduled = sch.mod
    merged = merge_variants({"a": prepared, B: rescheduled}, default=B)
    path = str(tmp_path_factory.mktemp("variants") / "tiny-robust.so")
    with target:
        tvm.compile(merged, target=target).export_library(path)
    meta = metadata_for(loaded=loaded, target=target, share_label=None, precision="fp32", tuned_trials=0,
                        db_dir=None, prepared_mod=prepared)
    meta.extra.update({"variants": {"a": "main__a", B: "main__robust_per_task"}, "default_variant": B})
    write_metadata(path, meta)
    return {"merged": merged, "path": path, "loaded": loaded, "relax": relax}


def test_merged_module_has_an_entry_per_variant_and_each_kernel_once(two_variants):
    names = {gv.name_hint for gv, _ in two_variants["merged"].functions_items()}
    assert {"main", "main__a", "main__robust_per_task"} <= names
    # the rescheduled conv exists in both versions; a kernel the variants share is kept once
    assert {"fused_conv2d_add_relu__a", "fused_conv2d_add_relu__robust_per_task"} <= names
    assert "reshape2__a" in names and "reshape2__robust_per_task" not in names
    main_b = two_variants["merged"]["main__robust_per_task"].script()
    assert "fused_conv2d_add_relu__robust_per_task" in main_b and "fused_conv2d_add_relu__a" not in main_b
    assert two_variants["merged"]["main"].attrs["global_symbol"] == "main"


def test_every_variant_computes_the_model(two_variants):
    loaded = two_variants["loaded"]
    sample = loaded.inputs.random(seed=3)
    (expected,) = loaded.reference(sample)
    for variant in ("a", B, None, "auto"):
        model = tunekit.load(two_variants["path"], variant=variant)
        (out,) = [model(*sample.values())]
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_load_times_the_variants_and_runs_the_fastest_unless_told(two_variants):
    model = tunekit.load(two_variants["path"])
    timed = model.choice.median_ms
    assert set(timed) == {"a", B} and all(ms > 0 for ms in timed.values())
    assert model.choice.how == "auto" and model.variant == min(timed, key=timed.get)
    assert model.entry == {"a": "main__a", B: "main__robust_per_task"}[model.variant]
    asked = tunekit.load(two_variants["path"], variant="a")
    assert (asked.variant, asked.entry, asked.choice.how) == ("a", "main__a", "asked")
    static = tunekit.load(two_variants["path"], variant=None)
    assert (static.variant, static.entry) == (None, "main")
    with pytest.raises(TunekitError, match=r"no variant 'gpu40'.*a, robust-per-task"):
        tunekit.load(two_variants["path"], variant="gpu40")


@pytest.mark.e2e
def test_bench_reports_the_variant_it_ran_and_runs_the_one_asked(two_variants):
    result = tunekit.bench(two_variants["path"], cpu_pct=50, repeats=3, warmup=1)
    assert result.variant in {"a", B} and set(result.variant_median_ms) == {"a", B}
    assert result.variant == min(result.variant_median_ms, key=result.variant_median_ms.get)
    asked = run_cli("bench", two_variants["path"], "--cpu-pct", "50", "--repeats", "3", "--variant", B, "--json")
    assert asked.returncode == 0, asked.stderr[-2000:]
    assert json.loads(asked.stdout)["variant"] == B
    wrong = run_cli("bench", two_variants["path"], "--cpu-pct", "50", "--variant", "gpu40")
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert "no variant 'gpu40'" in wrong.stderr.strip().splitlines()[-1]


def test_gpu_variants_compile_into_one_artifact_with_a_cuda_graph_each(tmp_path):
    """The transformer example in fp16 for the H100 (compiled on this CPU machine), two variants: one
    artifact with both entries, each replayed from its own CUDA graph. Each variant's `main` gets
    fresh variables: shared ones broke FuseOps ("input_ids appears at multiple definition sites")."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tunekit.clients.compiler import compile_variants_and_export
    from tunekit.frontend.precision import prepare
    from tunekit.models.examples import save_example
    from tunekit.run.session import load_model

    target = Target("nvidia/nvidia-h100")
    model = save_example("transformer", str(tmp_path / "transformer.onnx"))
    prepared, precision = prepare(load_model(model).mod, target, precision="auto")
    assert precision == "fp16"
    empty = ms.database.MemoryDatabase()  # no records: each variant keeps the default schedules
    path = compile_variants_and_export(variants={"gpu20": (prepared, empty), "gpu100": (prepared, empty)},
                                       default="gpu100", target=target, path=str(tmp_path / "t-robust.so"))
    binary = open(path, "rb").read()
    assert b"main__gpu20" in binary and b"main__gpu100" in binary
    assert b"_cuda_graph_capture" in binary


def test_merged_module_links_every_variants_kernels_of_another_kind(example_model):
    """Each share's variant may run Triton kernels of its own (clients.compiler.with_kernels): the merged module
    carries every variant's device modules, not only the first's (CPU modules stand in for the CUDA ones)."""
    import tvm

    from tunekit.clients.share_variants import merge_variants
    from tunekit.frontend.precision import prepare
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for
    from tunekit.testing import add_one_module

    prepared, _ = prepare(load_model(example_model).mod, target_for(Share.from_label("cpu50")), precision="fp32")
    device = [tvm.compile(add_one_module(n), target="llvm").mod for n in (8, 16)]
    merged = merge_variants({"a": prepared.with_attr("external_mods", [device[0]]),
                             "b": prepared.with_attr("external_mods", [device[1]])}, default="a")
    assert [m.same_as(d) for m, d in zip(merged.attrs["external_mods"], device)] == [True, True]
    assert "external_mods" not in (merge_variants({"a": prepared, "b": prepared}, default="a").attrs or {})
