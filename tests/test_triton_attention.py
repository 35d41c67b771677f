"""The fused attention as a Triton flash kernel (kernels.triton_attention): its numerics in Triton's interpreter on
the CPU against numpy, its compile for Hopper without a GPU, the spec the frontend writes on the hand-written kernel,
and on a GPU a model whose attention runs as the Triton kernel against the hand-written one."""
import numpy as np
import pytest
import tvm
from tvm.target import Target

from test_attention import F16, _attention_onnx, _projection_case

H100 = "nvidia/nvidia-h100"


def _causal(seq, *, masked_row=None):
    mask = np.zeros((1, 1, seq, seq), F16)
    mask[0, 0] = np.where(np.tril(np.ones((seq, seq), bool)), 0, -np.inf).astype(F16)
    if masked_row is not None:
        mask[0, 0, masked_row, :] = -np.inf
    return mask


@pytest.mark.parametrize("seq,dim,causal,tile", [(70, 64, False, (32, 32, 4, 2)), (70, 32, True, (16, 64, 4, 2)),
                                                 (40, 80, False, (32, 16, 4, 2)), (130, 128, True, (64, 32, 4, 2))])
def test_the_triton_attention_computes_the_attention(tmp_path, seq, dim, causal, tile):
    """In Triton's interpreter against numpy in fp64: 70 rows leave a partial query tile and a partial key tile; a
    causal mask with a row masked everywhere (its output is zeros, as the graphs' where(isnan(softmax), 0, ...)
    gives); head dim 80 padded to 128 columns that are never written; head dim 128 over 130 causal rows."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from tunekit.kernels.triton_attention import AttentionConfig
    from tunekit.testing.triton_interpret import interpret_attention

    mask = _causal(seq, masked_row=3) if causal else np.zeros((1,), F16)
    spec, qkv, want = _projection_case(seq=seq, heads=2, dim=dim, mask=mask if causal else np.zeros((1, 1, 1, 1), F16))
    out = np.zeros((1, seq, 2, dim), F16)
    got = interpret_attention(spec, AttentionConfig(*tile), [qkv, qkv, qkv, mask, out], work=str(tmp_path))
    got = got.transpose(0, 2, 1, 3).astype(np.float64)  # [B, S, H, D] -> [B, H, S, D]
    if causal:
        assert np.abs(got[0, :, 3]).max() == 0
    assert np.abs(want).max() > 0.5
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-2)


def test_a_fused_attention_carries_its_spec_and_its_triton_kernels_compile_for_hopper_without_a_gpu():
    """The frontend's kernel says what it computes (SPEC_ATTR); every candidate of BERT's sequence-512 attention
    compiles for sm_90 with Triton's own ptxas, and its launching function keeps the kernel's parameters."""
    pytest.importorskip("triton")
    from tunekit.frontend.attention_kernel import attention_kernel
    from tunekit.kernels import candidates, triton_attention
    from tunekit.kernels.triton_compile import arch_of

    spec, _, _ = _projection_case(seq=512, heads=12, dim=64, mask=np.zeros((1, 1, 512, 512), F16))
    func = attention_kernel(spec, key_tiles=True)
    assert triton_attention.spec_of(func) == spec and candidates.needs_baseline(func)
    names = candidates.configs_of(func)
    assert len(names) >= 6 and all(n.startswith("attn_") for n in names)
    kernel = triton_attention.compile_attention(spec, triton_attention.AttentionConfig.from_name(names[0]),
                                                arch=arch_of(Target(H100)))
    assert kernel.cubin[:4] == b"\x7fELF" and kernel.pointers == 5 and kernel.grid == 12 * 512 // 64
    launching = triton_attention.launching_func(func, kernel)
    assert kernel.name in launching.script() and len(launching.params) == 5


@pytest.mark.gpu
def test_gpu_a_model_with_its_attention_as_a_triton_kernel_computes_the_same(tmp_path):
    """An attention at sequence 200 (the key-tiled body, a padding mask), its fused attention replaced by a Triton kernel
    (kernels.candidates.with_kernels), built for the GPU, against the hand-written kernels' build."""
    import os

    from tvm import relax

    from tunekit.clients.compiler import compile_and_export
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.kernels.candidates import configs_of, with_kernels
    from tunekit.kernels.in_module import task_key
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    model = load_model(_attention_onnx(str(tmp_path / "a.onnx"), seq=200, dim=64))
    target = target_for(Share("gpu", 100))
    prepared, _ = prepare(model.mod, target, precision="fp16")
    attention = [t.dispatched[0]["main"] for t in extract_tasks(prepared, target)
                 if configs_of(t.dispatched[0]["main"]) and configs_of(t.dispatched[0]["main"])[0].startswith("attn_")]
    assert attention
    choices = {task_key(f): configs_of(f)[0] for f in attention}
    replaced, keys = with_kernels(prepared, choices, target=target)
    assert keys == set(choices)
    sample = model.inputs.random(seed=1)
    outs = []
    for name, mod in (("hand", prepared), ("triton", replaced)):
        path = compile_and_export(prepared_mod=mod, target=target, database=None, path=str(tmp_path / f"{name}.so"))
        vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cuda(0))
        outs.append(vm["main"](*[tvm.runtime.tensor(sample[n], device=tvm.cuda(0)) for n in model.inputs.shapes])
                    .numpy().astype(np.float64))
    assert np.abs(outs[0]).max() > 0
    np.testing.assert_allclose(outs[1], outs[0], atol=2e-2, rtol=2e-2)


def test_a_fused_attention_is_tried_beside_its_handwritten_kernel_and_its_triton_kernel_chosen_only_when_faster(
        tmp_path):
    """kernel_trials: a transformer's fused attention (never searched) gets its hand-written kernel measured and one
    trial per Triton configuration, keyed as the compile matches its function in the prepared module; the compile
    (kernels_worth_applying) takes a Triton kernel only where its record beats the hand-written one's."""
    pytest.importorskip("triton")
    from tunekit.clients.compiler import fused_kernel_rows, kernels_worth_applying
    from tunekit.clients.kernel_trials import plan_trials, scheduled_tasks
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.kernels.candidates import HANDWRITTEN, configs_of
    from tunekit.kernels.in_module import task_key
    from tunekit.records import kernel_records
    from tunekit.records.kernel_records import KernelRecord
    from tunekit.run.session import load_model

    target = Target(H100)
    model = load_model(_attention_onnx(str(tmp_path / "a.onnx"), seq=200, dim=64))
    prepared, _ = prepare(model.mod, target, precision="fp16")
    fused = scheduled_tasks(extract_tasks(prepared, target), first_index=7)
    assert fused and [t.index for t in fused] == list(range(7, 7 + len(fused)))
    dirs = {"gpu40": str(tmp_path / "r")}
    trials = plan_trials(fused, target=target, records_dirs=dirs)
    func = fused[0].ctx.mod["main"]
    assert [t.config for t in trials if t.task is fused[0]] == [HANDWRITTEN, *configs_of(func)]
    key = trials[0].workload
    in_module = {task_key(f) for _, f in prepared.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert key in in_module  # the compile finds the function its record is for
    first, second = configs_of(func)[:2]
    for kind, config, secs in ((HANDWRITTEN, HANDWRITTEN, 20e-6), ("triton", first, 30e-6), ("triton", second, 9e-6)):
        kernel_records.append(dirs["gpu40"], KernelRecord(key, kind, config, (secs,), True))
    assert kernels_worth_applying(dirs["gpu40"], None)[key].config == second
    row, = fused_kernel_rows(dirs["gpu40"], kernels_worth_applying(dirs["gpu40"], None), set())
    assert row == {"workload_hash": key, "handwritten_us": 20.0, "kernel": "triton", "kernel_config": second,
                   "kernel_us": 9.0}  # the report's fused_kernels
    kernel_records.append(dirs["gpu40"], KernelRecord(key, HANDWRITTEN, HANDWRITTEN, (5e-6,), True))
    assert kernels_worth_applying(dirs["gpu40"], None)[key].kind == HANDWRITTEN  # the compile leaves it as it is
    assert {t.config for t in plan_trials(fused, target=target, records_dirs=dirs) if t.task is fused[0]} == \
        set(configs_of(func)[2:])  # what a share's records hold is not tried again


@pytest.mark.gpu
def test_gpu_tuning_measures_the_fused_attention_beside_its_triton_kernels_and_builds_in_the_faster(tmp_path):
    """An attention at sequence 300 tuned at 40%: the hand-written kernel and every Triton flash configuration are
    measured there (each Triton one checked against the hand-written kernel), the report's fused_kernels row names
    the kind the build took, and the artifact passes the numerics gate (and carries the Triton kernel if it won)."""
    import json
    import os

    from tunekit.records import kernel_records
    from tunekit.testing import run_cli

    path = _attention_onnx(str(tmp_path / "a.onnx"), seq=300, dim=64)
    tune = run_cli("tune", path, "--gpu-pct", "40", "--trials", "8", "--out", tmp_path / "t", "--json")
    assert tune.returncode == 0, tune.stderr[-3000:]
    report = json.loads(tune.stdout)["report"]
    records = kernel_records.read(os.path.join(tmp_path / "t", "records-gpu40"))
    assert {r.kind for r in records} == {"handwritten", "triton"}, records
    # A tile wrong at the share is refused, never timed; every other candidate is checked and timed (every tile here
    # was once refused, NaN on inputs TVM's fill left partly unfilled: servers.input_fill)
    assert all(r.checked and r.run_secs or "wrong output at the share" in r.error for r in records), records
    assert any(r.checked for r in records if r.kind == "triton"), records
    (row,) = report["fused_kernels"]
    assert row["handwritten_us"] > 0 and row["kernel"] in ("triton", "handwritten")
    assert min(o["cosine"] for o in report["numerics"]["tuned"]) > 0.999
    if row["kernel"] == "triton":  # `tunekit compile`'s build carries its cubin, and so does the tune's artifact
        assert row["kernel_us"] < row["handwritten_us"]  # unless the untuned build measured faster and was shipped
        compiled = tmp_path / "compiled.so"
        proc = run_cli("compile", path, "--records", tmp_path / "t", "--out", compiled)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for artifact in [compiled] + ([report["artifact"]] if report["artifact_choice"] == "tuned" else []):
            with open(artifact, "rb") as fh:
                assert b"tunekit_attention_" in fh.read(), \
                    (artifact, row, report["artifact_choice"], tune.stderr[-2000:])
