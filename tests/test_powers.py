"""x ** 2 and x ** 3 in a CUDA model are products (frontend.powers): under NVRTC's --use_fast_math powf is
exp2(y * log2(x)), NaN for x < 0, which made GPT-2's GELU NaN on the GPU in fp32 and in fp16."""
import numpy as np
import pytest

from tunekit.frontend.precision import prepare
from tunekit.readiness import gpu_arch_target
from tunekit.run.session import load_model


def pow_onnx(path: str) -> str:
    """y = x ** 3 + x ** 2, the exponents a scalar and a [1] constant (both forms occur in exports)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "three"], ["cube"]), helper.make_node("Pow", ["x", "two"], ["square"]),
         helper.make_node("Add", ["cube", "square"], ["y"])], "powers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.array(3.0, np.float32), "three"),
         numpy_helper.from_array(np.array([2.0], np.float32), "two")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_cuda_model_has_no_pow_left_in_either_precision(precision, tmp_path):
    loaded = load_model(pow_onnx(str(tmp_path / "powers.onnx")))
    prepared, resolved = prepare(loaded.mod, gpu_arch_target("sm_90"), precision=precision)
    assert resolved == precision
    assert "T.pow(" not in prepared.script()


def test_products_compute_what_pow_computes_on_negative_inputs(tmp_path):
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from tunekit.frontend.powers import powers_as_products

    path = pow_onnx(str(tmp_path / "powers.onnx"))
    loaded = load_model(path)
    mod, rewritten = powers_as_products(loaded.mod)
    assert rewritten == 2 and loaded.mod.script().count("R.power(") == 2  # the caller's module is left as it was
    x = -np.abs(np.random.default_rng(0).standard_normal((4, 8)).astype("float32")) - 0.5
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.gpu
def test_gpu_powers_of_negative_inputs_are_not_nan(tmp_path):
    pytest.importorskip("torch")
    import onnxruntime as ort

    from tunekit.clients.compiler import compile_and_export
    from tunekit.deploy import load, metadata_for, write_metadata
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    path = pow_onnx(str(tmp_path / "powers.onnx"))
    loaded, target = load_model(path), target_for(Share("gpu", 40))
    prepared, _ = prepare(loaded.mod, target, precision="fp32")
    artifact = str(tmp_path / "powers-gpu40.so")
    compile_and_export(prepared_mod=prepared, target=target, database=None, path=artifact)
    write_metadata(artifact, metadata_for(loaded=loaded, target=target, share_label="gpu40", precision="fp32",
                                          tuned_trials=0, db_dir=None, prepared_mod=prepared))
    x = -np.abs(np.random.default_rng(0).standard_normal((4, 8)).astype("float32")) - 0.5
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(load(artifact)(x), expected, rtol=1e-4)
