"""frontend.fusion / frontend.norm_prologue: fewer kernels on GPUs, the same results."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.target import Target

from tunekit.frontend.fusion import fuse_kernels
from tunekit.frontend.norm_prologue import fold_norm_prologues
from tunekit.frontend.precision import prepare
from tunekit.run.session import load_model

H100 = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
        "thread_warp_size": 32}
LLVM = {"kind": "llvm", "num-cores": 1}


def _residual_layer_norm(*, residual_reused: bool):
    """Split-K partials summed, cast, bias and residual added, then LayerNorm: BERT's FFN output.
    With `residual_reused`, the pre-norm sum is also an output (a pre-LN residual stream)."""
    def tensor(shape, dtype):
        return relax.TensorType(shape, dtype)

    p, b, r = (relax.Var("p", tensor((2, 16, 64), "float32")), relax.Var("b", tensor((64,), "float16")),
               relax.Var("r", tensor((1, 16, 64), "float16")))
    g, beta = relax.Var("g", tensor((64,), "float32")), relax.Var("beta", tensor((64,), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [p, b, r, g, beta]):
        with builder.dataflow():
            halves = [builder.emit(relax.op.strided_slice(p, axes=[0], begin=[i], end=[i + 1])) for i in (0, 1)]
            h = builder.emit(relax.op.astype(relax.op.add(relax.op.add(
                relax.op.astype(relax.op.add(*halves), "float16"), b), r), "float32"))
            normed = builder.emit(relax.op.astype(relax.op.nn.layer_norm(h, g, beta, axes=[2], epsilon=1e-5),
                                                  "float16"))
            out = builder.emit_output(relax.Tuple([normed, h]) if residual_reused else normed)
        builder.emit_func_output(out)
    return builder.get()


def _fused(mod, *, gpu, target=LLVM):
    with Target(target):
        return fuse_kernels(relax.transform.DecomposeOpsForInference()(mod), gpu=gpu)


def _kernels(mod) -> list[str]:
    return [b.value.args[0].name_hint for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) == "relax.call_tir"]


def _run(mod, args):
    vm = relax.VirtualMachine(tvm.compile(mod, target=Target(LLVM)), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 16, 64)).astype("float32"), rng.standard_normal(64).astype("float16"),
            rng.standard_normal((1, 16, 64)).astype("float16"), rng.standard_normal(64).astype("float32"),
            rng.standard_normal(64).astype("float32")]


@pytest.mark.e2e
def test_the_sum_in_front_of_a_layer_norm_joins_it_and_computes_the_same():
    mod = _residual_layer_norm(residual_reused=False)
    plain, folded = _fused(mod, gpu=False), _fused(mod, gpu=True)
    assert len(_kernels(plain)) == 2 and len(_kernels(folded)) == 1, (_kernels(plain), _kernels(folded))
    (name,) = _kernels(folded)
    assert "strided_slice" in name and "layer_norm" in name
    args = _args()
    np.testing.assert_array_equal(_run(folded, args)[0], _run(plain, args)[0])


def _grouped(*, residual_reused: bool):
    """FuseOps' output, the input fold_norm_prologues runs on."""
    with Target(LLVM):
        mod = relax.transform.LegalizeOps()(_residual_layer_norm(residual_reused=residual_reused))
        return relax.transform.FuseOps()(relax.transform.FoldConstant()(relax.transform.AnnotateTIROpPattern()(mod)))


@pytest.mark.e2e
def test_a_producer_with_another_user_stays_its_own_kernel():
    """A pre-LN residual stream is read again after the norm: folding its sum into the norm would
    compute it twice."""
    mod, folded = fold_norm_prologues(_grouped(residual_reused=True))
    names = _kernels(relax.transform.FuseTIR()(mod))
    assert folded == 0 and len(names) == 2, names
    args = _args(seed=1)
    plain = _run(_fused(_residual_layer_norm(residual_reused=True), gpu=False), args)
    with Target(LLVM):
        got = _run(relax.transform.FuseTIR()(mod), args)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)


@pytest.mark.e2e
def test_gpu_transformer_embedding_lookup_and_its_layer_norm_are_one_kernel(tmp_path):
    """The example transformer's embedding: index wrap-around, gather, position add, cast and
    LayerNorm were four kernels under the zero pipeline (take is opaque to FuseOps)."""
    from tunekit.models.examples import save_example

    model = load_model(save_example("transformer", str(tmp_path / "transformer.onnx")))
    prepared, _ = prepare(model.mod, Target(H100), precision="fp16")
    names = _kernels(prepared)
    assert any("take" in n and "layer_norm" in n for n in names), names
    assert not [n for n in names if n.startswith("take")], names
    # the same model cut by the plain zero pipeline has more kernels
    from tunekit.frontend.precision import convert

    with Target(H100):
        converted = relax.transform.CanonicalizeBindings()(relax.transform.DecomposeOpsForInference()(
            convert(model.mod, "fp16")))
        plain = fuse_kernels(converted, gpu=False)
    assert len(names) <= len(_kernels(plain)) - 2, (names, _kernels(plain))


def test_gathers_fused_on_a_cpu_target_compute_what_onnxruntime_does(tmp_path):
    """fuse_kernels(gpu=True) compiled for the CPU: the transformer (fp32) against onnxruntime."""
    from tunekit.models.examples import save_example
    from tunekit.numerics import check, compare_outputs

    model = load_model(save_example("transformer", str(tmp_path / "transformer.onnx")))
    fused = _fused(relax.transform.CanonicalizeBindings()(model.mod), gpu=True)
    assert any("take" in n and "layer_norm" in n for n in _kernels(fused)), _kernels(fused)
    sample = model.inputs.random(seed=3)
    outputs = _run(fused, [sample[name] for name in model.inputs.shapes])
    check(compare_outputs(model.output_names, outputs, model.reference(sample)), precision="fp32")
