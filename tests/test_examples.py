"""Example models: small sizes go ONNX -> Relax -> tasks -> untuned compile and match onnxruntime;
full-size defaults are only built and checked (no TVM), so the file runs in well under a minute."""
import numpy as np
import onnx
import pytest

from tunekit.testing import run_cli
from tunekit.errors import TunekitError
from tunekit.frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
from tunekit.models.examples import EXAMPLES, save_example
from tunekit.shares.share import Share
from tunekit.targets import target_for

SMALL = {
    "tiny_cnn": {},
    "resnet18": {"width": 8, "image": 32},
    "mobilenet": {"image": 32, "width_mult": 0.5},
    "transformer": {"seq": 8, "hidden": 32, "heads": 4, "layers": 1},
}


@pytest.fixture(scope="module")
def target():
    return target_for(Share("cpu", 100))


@pytest.fixture(scope="module")
def small(tmp_path_factory, target):
    """name -> everything built from its small model, each built once and shared by the tests below."""
    import onnxruntime as ort

    cache = {}

    def build(name):
        if name not in cache:
            path = save_example(name, str(tmp_path_factory.mktemp("small") / f"{name}.onnx"), seed=3, **SMALL[name])
            model = load_onnx(path)
            inputs = model_inputs(model, {})
            feed = inputs.random(seed=0)
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            expected = session.run(None, feed)[0]
            prepared = prepare_for_tuning(import_to_relax(model, inputs), target)
            cache[name] = dict(inputs=inputs, feed=feed, expected=expected, prepared=prepared,
                               tasks=extract_tasks(prepared, target))
        return cache[name]

    return build


def test_every_example_is_registered():
    assert set(SMALL) == set(EXAMPLES)


@pytest.mark.parametrize("name", [name if name == "tiny_cnn" else pytest.param(name, marks=pytest.mark.e2e)
                                  for name in sorted(SMALL)])  # the bigger models' builds: 5-25 s each on 2 cores
def test_untuned_build_matches_onnxruntime(small, target, name):
    import tvm
    from tvm import relax

    built = small(name)
    vm = relax.VirtualMachine(tvm.compile(built["prepared"], target=target), tvm.cpu())
    args = [tvm.runtime.tensor(built["feed"][n], tvm.cpu()) for n in built["inputs"].shapes]
    out = vm["main"](*args)
    out = (out if hasattr(out, "numpy") else out[0]).numpy()
    expected = built["expected"]
    assert out.shape == expected.shape
    assert np.isfinite(expected).all() and np.abs(expected).max() > 1e-3  # not a dead (all-zero) network
    # random He-scaled weights make deep CNN outputs O(10): tolerance relative to the output's scale
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(expected).max()))


def test_resnet18_tasks(small):
    names = [t.task_name for t in small("resnet18")["tasks"]]
    conv = [n for n in names if "conv2d" in n]
    # stem + 8 blocks x 2 convs + 3 projections = 20 convs; identical shapes share a task
    assert len(conv) >= 12, names
    assert any("add" in n and "relu" in n and n.count("add") >= 2 for n in conv), names  # residual add fused in
    assert "max_pool2d" in names and any("matmul" in n for n in names), names


def _depthwise_weights(task):
    """Weight buffers [C, 1, k, k] of a task whose TIR computes a grouped conv."""
    func = task.dispatched[0]["main"]
    if "group_conv2d_nchw" not in func.script():
        return []
    shapes = [[int(d) for d in param.shape] for param in func.params]  # TVM 0.27 PrimFunc params are buffers
    return [s for s in shapes if len(s) == 4 and s[1] == 1 and s[2] == s[3] == 3]


@pytest.mark.e2e
def test_mobilenet_has_depthwise_conv_tasks(small):
    tasks = small("mobilenet")["tasks"]
    # TVM names depthwise tasks plain fused_conv2dN_...; only the TIR (group_conv2d_nchw, [C,1,3,3] weight) tells
    depthwise = [t.task_name for t in tasks if _depthwise_weights(t)]
    assert all(n.startswith("fused_conv2d") for n in depthwise), depthwise
    assert len(depthwise) >= 5, [t.task_name for t in tasks]
    assert any("maximum" in t.task_name and "minimum" in t.task_name for t in tasks)  # relu6 (Clip) fused in


def test_transformer_inputs_and_tasks(small):
    built = small("transformer")
    assert built["inputs"].shapes == {"input_ids": [1, 8], "attention_mask": [1, 8]}
    assert built["inputs"].dtypes == {"input_ids": "int64", "attention_mask": "int64"}
    names = [t.task_name for t in built["tasks"]]
    for op in ("matmul", "softmax", "layer_norm", "erf", "take"):
        assert any(op in n for n in names), (op, names)


@pytest.mark.parametrize("name, shapes", [
    ("resnet18", {"x": [1, 3, 224, 224]}),
    ("mobilenet", {"x": [1, 3, 224, 224]}),
    ("transformer", {"input_ids": [1, 32], "attention_mask": [1, 32]}),
])
def test_full_size_defaults_are_valid(tmp_path, name, shapes):
    model = load_onnx(save_example(name, str(tmp_path / f"{name}.onnx")))  # load_onnx runs onnx.checker
    assert model.ir_version == 8 and [o.version for o in model.opset_import] == [17]
    assert model_inputs(model, {}).shapes == shapes  # fixed dims: no --input-shape needed
    ops = {n.op_type for n in model.graph.node}
    params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    if name == "resnet18":
        assert sum(n.op_type == "Conv" for n in model.graph.node) == 20 and 11e6 < params < 12.5e6
    elif name == "mobilenet":
        assert any(n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
                   for n in model.graph.node)
        assert 3e6 < params < 4e6
    else:
        assert {"Gather", "LayerNormalization", "Softmax", "Erf", "MatMul"} <= ops
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == \
        ([1, 32, 64] if name == "transformer" else [1, 1000])


def test_seed_decides_the_weights(tmp_path):
    def weights(seed, tag):
        path = save_example("transformer", str(tmp_path / f"{tag}.onnx"), seed=seed, **SMALL["transformer"])
        return [onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer]

    same_a, same_b, other = weights(5, "a"), weights(5, "b"), weights(6, "c")
    assert all(np.array_equal(x, y) for x, y in zip(same_a, same_b))
    assert not all(np.array_equal(x, y) for x, y in zip(same_a, other))


def test_unknown_example_or_option_raises(tmp_path):
    with pytest.raises(TunekitError, match="unknown example 'vgg16'"):
        save_example("vgg16", str(tmp_path / "x.onnx"))
    with pytest.raises(TunekitError, match="no option"):
        save_example("resnet18", str(tmp_path / "x.onnx"), depth=50)
    with pytest.raises(TunekitError, match="divisible"):
        save_example("transformer", str(tmp_path / "x.onnx"), hidden=30, heads=4)
    assert not (tmp_path / "x.onnx").exists()


def test_cli_writes_a_named_example(tmp_path):
    out = tmp_path / "m.onnx"
    proc = run_cli("example", "--name", "transformer", "--out", out, "--seed", "1", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert model_inputs(load_onnx(str(out)), {}).dtypes == {"input_ids": "int64", "attention_mask": "int64"}
