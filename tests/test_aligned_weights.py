"""frontend.aligned_weights: a constant matmul weight whose rows do not start on 16 bytes is stored transposed, and the
module computes what it did (TVM's LLVM build of both, on the CPU)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tunekit.frontend.aligned_weights import transpose_unaligned_weights


def _legalized(n: int, dtype: str):
    """x [1, 16, 64] @ w [64, n] accumulated in fp32, cast back to `dtype`; legalized and constants folded."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 16, 64), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((64, n)).astype(dtype)), out_dtype="float32"))
            out = bb.emit_output(bb.emit(relax.op.astype(y, dtype)))
        bb.emit_func_output(out)
    with tvm.target.Target("llvm"):
        mod = relax.transform.LegalizeOps()(bb.get())
        mod = relax.transform.AnnotateTIROpPattern()(mod)
        return relax.transform.FoldConstant()(mod)


def _run(mod, x):
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(mod))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()


@pytest.mark.parametrize("n,dtype", [(37, "float32"), (37, "float16"), (50, "float16")])
def test_an_unaligned_weight_is_transposed_and_the_module_computes_the_same(n, dtype):
    mod = _legalized(n, dtype)
    rewritten, changed = transpose_unaligned_weights(mod)
    assert changed == 1
    kernels = [f for gv, f in rewritten.functions.items() if gv.name_hint.endswith("_nt")]
    assert len(kernels) == 1 and [int(d) for d in kernels[0].params[1].shape] == [n, 64]
    x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(dtype)
    np.testing.assert_allclose(_run(rewritten, x), _run(mod, x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("n,dtype", [(40, "float32"), (48, "float16")])
def test_a_weight_whose_rows_start_on_16_bytes_stays(n, dtype):
    mod = _legalized(n, dtype)
    assert transpose_unaligned_weights(mod) == (mod, 0)
