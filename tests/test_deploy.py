"""tunekit.deploy: the artifact metadata, load + call, run_once and bench, on real TVM builds.

One untuned tiny_cnn artifact is compiled per module (about 2 s on 2 cores); every test uses it.
The GPU tests (CUDA, torch, MPS) run only on a machine with an NVIDIA GPU and torch.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import has_gpu

from tunekit.errors import TunekitError
from tunekit.testing import run_cli


def build_artifact(onnx_path: str, artifact: str, *, target, share_label=None):
    """What the pipeline does after tuning, without records: compile, export, write the metadata."""
    from tunekit.clients.compiler import compile_and_export
    from tunekit.deploy import metadata_for, write_metadata
    from tunekit.frontend.tasks import prepare_for_tuning
    from tunekit.run.session import load_model

    loaded = load_model(onnx_path)
    prepared = prepare_for_tuning(loaded.mod, target)
    compile_and_export(prepared_mod=prepared, target=target, database=None, path=artifact)
    write_metadata(artifact, metadata_for(loaded=loaded, target=target, share_label=share_label, precision="fp32",
                                          tuned_trials=0, db_dir=None, prepared_mod=prepared))
    return artifact


def identity_onnx(path: str) -> str:
    """y = x: the compiled main returns its argument, so a zero-copy output IS the input's memory."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def scale_onnx(path: str, factor: float) -> str:
    """y = factor * x, x of shape [4, 8]: models that differ only in a constant."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    constant = numpy_helper.from_array(np.full((4, 8), factor, "float32"), "k")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [constant])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def doubled_and_tripled(tmp_path_factory):
    """Two artifacts with the same inputs and outputs: y = 2x and y = 3x, for CPU."""
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    root, target = tmp_path_factory.mktemp("scales"), target_for(Share("cpu", 50))
    return [build_artifact(scale_onnx(str(root / f"x{k}.onnx"), k), str(root / f"x{k}.so"), target=target)
            for k in (2, 3)]


def replace_artifact(source: str, dest: str) -> None:
    """As a build writes an artifact: a new file renamed over the old one, metadata beside it."""
    from tunekit.deploy import metadata_path

    for src, dst in ((source, dest), (metadata_path(source), metadata_path(dest))):
        shutil.copy(src, dst + ".tmp")
        os.replace(dst + ".tmp", dst)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, example_model):
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    root = tmp_path_factory.mktemp("deploy")  # example_model: conftest's tiny_cnn (save_example)
    artifact = build_artifact(example_model, str(root / "tiny_cnn-cpu50.so"), target=target_for(Share("cpu", 50)))
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype("float32")
    return SimpleNamespace(onnx=example_model, artifact=artifact, root=root, x=x)


@pytest.fixture(scope="module")
def model(tiny):
    from tunekit.deploy import load

    return load(tiny.artifact)


def onnxruntime_y(onnx_path: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def one_line_error(excinfo, *fragments: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def copy_artifact(tiny, dest_dir, *, with_metadata: bool = True) -> str:
    from tunekit.deploy import metadata_path

    dest = str(dest_dir / os.path.basename(tiny.artifact))
    shutil.copy(tiny.artifact, dest)
    if with_metadata:
        shutil.copy(metadata_path(tiny.artifact), metadata_path(dest))
    return dest


# ---- metadata ----------------------------------------------------------------------------------

def test_metadata_describes_the_artifact(tiny):
    import tvm

    from tunekit.deploy import TensorSpec, metadata_path, read_metadata
    from tunekit.records.identity import model_digest

    assert metadata_path(tiny.artifact).endswith("tiny_cnn-cpu50.json")
    meta = read_metadata(tiny.artifact)
    assert meta.inputs == [TensorSpec("x", [1, 3, 64, 64], "float32")]
    assert meta.outputs == [TensorSpec("y", [1, 10], "float32")]  # the ONNX graph's output name
    assert (meta.format, meta.share, meta.precision, meta.device_kind, meta.arch) == (1, None, "fp32", "cpu", None)
    assert meta.target["kind"] == "llvm" and meta.target["num-cores"] >= 1
    assert meta.tvm_version == tvm.__version__ and meta.tuned_trials == 0 and meta.records_digest is None
    assert meta.model_sha256 == model_digest(tiny.onnx)
    with open(metadata_path(tiny.artifact)) as fh:
        on_disk = json.load(fh)
    assert on_disk["inputs"] == [{"name": "x", "shape": [1, 3, 64, 64], "dtype": "float32"}]
    assert tvm.target.Target(on_disk["target"]).kind.name == "llvm"  # the exported target rebuilds


def test_records_digest_follows_the_database_files(tmp_path):
    from tunekit.deploy.metadata import records_digest

    assert records_digest(None) is None and records_digest(str(tmp_path)) is None
    (tmp_path / "database_workload.json").write_text('["w0"]\n')
    (tmp_path / "database_tuning_record.json").write_text('[0, ["trace", [1e-3]]]\n')
    first = records_digest(str(tmp_path))
    assert first and len(first) == 64 and records_digest(str(tmp_path)) == first
    with open(tmp_path / "database_tuning_record.json", "a") as fh:
        fh.write('[0, ["trace2", [9e-4]]]\n')
    assert records_digest(str(tmp_path)) != first


# ---- load + call --------------------------------------------------------------------------------

def test_call_with_numpy_matches_onnxruntime(tiny, model):
    y = model(tiny.x)
    assert isinstance(y, np.ndarray) and y.shape == (1, 10) and y.dtype == np.float32
    np.testing.assert_allclose(y, onnxruntime_y(tiny.onnx, tiny.x), rtol=1e-4, atol=1e-5)
    assert [s.name for s in model.inputs] == ["x"] and [s.name for s in model.outputs] == ["y"]
    assert (model.share, model.precision, model.target["kind"]) == (None, "fp32", "llvm")


def test_call_by_keyword(tiny, model):
    np.testing.assert_array_equal(model(x=tiny.x), model(tiny.x))


@pytest.mark.parametrize("case, expected", [
    ("wrong shape", ["input 'x'", "expected shape [1, 3, 64, 64] float32", "got shape [1, 3, 32, 32] float32"]),
    ("wrong dtype", ["input 'x'", "expected shape [1, 3, 64, 64] float32", "got shape [1, 3, 64, 64] float64"]),
    ("unknown name", ["no input 'z'", "its inputs are: x"]),
    ("too many inputs", ["takes 1 input(s) (x)", "got 2 positional"]),
    ("missing input", ["missing input 'x'", "shape [1, 3, 64, 64] float32"]),
    ("not an array", ["input 'x'", "expected a numpy array or torch tensor, got list"]),
])
def test_a_wrong_call_is_one_clear_error(tiny, model, case, expected):
    x = tiny.x
    calls = {"wrong shape": lambda: model(x[:, :, :32, :32]), "wrong dtype": lambda: model(x.astype("float64")),
             "unknown name": lambda: model(x, z=x), "too many inputs": lambda: model(x, x),
             "missing input": lambda: model(), "not an array": lambda: model(x.tolist())}
    with pytest.raises(TunekitError) as excinfo:
        calls[case]()
    one_line_error(excinfo, *expected)


def test_missing_or_unreadable_metadata_is_refused(tiny, tmp_path):
    from tunekit.deploy import load, metadata_path

    artifact = copy_artifact(tiny, tmp_path, with_metadata=False)
    with pytest.raises(TunekitError) as excinfo:
        load(artifact)
    one_line_error(excinfo, f"no metadata for {artifact}", metadata_path(artifact))
    with open(metadata_path(artifact), "w") as fh:
        fh.write("{not json")
    with pytest.raises(TunekitError) as excinfo:
        load(artifact)
    one_line_error(excinfo, "cannot read metadata", metadata_path(artifact))


def test_another_tvm_version_is_refused(tiny, tmp_path):
    import tvm

    from tunekit.deploy import load, metadata_path

    artifact = copy_artifact(tiny, tmp_path)
    with open(metadata_path(artifact)) as fh:
        data = json.load(fh)
    data["tvm_version"] = "0.26.0"
    with open(metadata_path(artifact), "w") as fh:
        json.dump(data, fh)
    with pytest.raises(TunekitError) as excinfo:
        load(artifact)
    one_line_error(excinfo, "tiny_cnn-cpu50.so", "TVM 0.26.0", f"TVM {tvm.__version__}")


def test_cpu_artifact_is_refused_on_cuda(tiny):
    from tunekit.deploy import load

    with pytest.raises(TunekitError) as excinfo:
        load(tiny.artifact, device="cuda:0")
    one_line_error(excinfo, "compiled for cpu", "cuda:0")


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU refusal")
def test_cuda_artifact_is_refused_without_a_gpu(tmp_path):
    from tunekit.deploy import bench, load
    from tunekit.targets import GpuInfo, cuda_target

    # The identity model has no kernels: it compiles for an H100 without NVRTC or a GPU.
    h100 = cuda_target(GpuInfo("NVIDIA H100 80GB HBM3", (9, 0)))
    artifact = build_artifact(identity_onnx(str(tmp_path / "identity.onnx")), str(tmp_path / "identity-gpu40.so"),
                              target=h100, share_label="gpu40")
    with pytest.raises(TunekitError) as excinfo:
        load(artifact)
    one_line_error(excinfo, "identity-gpu40.so", "needs an NVIDIA GPU", "none was found")
    with pytest.raises(TunekitError) as excinfo:
        bench(artifact)  # its own share, gpu40: refused before any MPS daemon is started
    one_line_error(excinfo, "identity-gpu40.so", "needs an NVIDIA GPU", "none was found")


@pytest.mark.parametrize("arch, device, runs", [
    ("sm_90a", "9.0", True), ("sm_90a", "10.0", False), ("sm_90", "9.0", True),
    ("sm_80", "8.6", True), ("sm_86", "8.0", False), ("sm_80", "9.0", False), ("sm_100a", "10.0", True),
    ("sm_100a", "10.3", False), ("sm_100", "10.3", True),
])
def test_cuda_architecture_rule(arch, device, runs):
    from tunekit.deploy.compat import arch_runs_on

    assert arch_runs_on(arch, device) is runs


def test_numpy_only_use_needs_neither_torch_nor_tvm_at_import(tiny):
    # torch is blocked (import torch raises), as on a machine without it; TVM's own optional
    # torch support must step aside too.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import tunekit.deploy as deploy\n"
            "assert 'tvm' not in sys.modules, 'importing tunekit.deploy imported TVM'\n"
            "import numpy as np\n"
            f"y = deploy.load({tiny.artifact!r})(np.zeros((1, 3, 64, 64), 'float32'))\n"
            "print(y.shape)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("(1, 10)")


def test_torch_cpu_tensors_in_torch_out_without_copy(tiny, model):
    torch = pytest.importorskip("torch")
    from tunekit.deploy.arrays import to_tvm

    x = torch.from_numpy(tiny.x).clone()  # torch's allocator: 64-byte aligned, as TVM requires
    assert to_tvm(x, device=model.device).data_ptr() == x.data_ptr()  # TVM sees the torch memory
    y = model(x=x)
    assert isinstance(y, torch.Tensor) and y.device == x.device
    np.testing.assert_allclose(y.numpy(), model(tiny.x), rtol=1e-6, atol=1e-7)
    # A view 4 bytes into its storage cannot be handed over as is: it is copied, and still right.
    shifted = torch.cat([torch.zeros(1), x.flatten()])[1:].view(1, 3, 64, 64)
    assert shifted.data_ptr() % 64 and to_tvm(shifted, device=model.device).data_ptr() != shifted.data_ptr()
    np.testing.assert_allclose(model(shifted).numpy(), y.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(TunekitError) as excinfo:
        model(x.double())
    one_line_error(excinfo, "input 'x'", "got shape [1, 3, 64, 64] float64")


# ---- a tune out dir in place of the artifact ----------------------------------------------------

def out_dir_like_tune(tiny, root, *names) -> str:
    """What `tunekit tune` leaves: the tuned model(s) and the untuned baselines, each with its .json."""
    from tunekit.deploy import metadata_path

    root.mkdir()
    for name in names:
        shutil.copy(tiny.artifact, root / name)
        shutil.copy(metadata_path(tiny.artifact), metadata_path(str(root / name)))
    return str(root)


def test_a_tune_out_dir_names_its_one_tuned_model(tiny, model, tmp_path):
    from tunekit.deploy import load, run_once

    out = out_dir_like_tune(tiny, tmp_path / "one", "tiny_cnn-cpu50.so", "untuned.so", "untuned-cpu100.so")
    loaded = load(out)
    assert loaded.artifact == os.path.join(out, "tiny_cnn-cpu50.so")
    np.testing.assert_array_equal(loaded(tiny.x), model(tiny.x))
    assert run_once(out, inputs={}, output=None)["artifact"] == os.path.join(out, "tiny_cnn-cpu50.so")

    several = out_dir_like_tune(tiny, tmp_path / "two", "tiny_cnn-cpu50.so", "tiny_cnn-cpu100.so", "untuned-cpu50.so")
    with pytest.raises(TunekitError) as excinfo:
        load(several)
    one_line_error(excinfo, "holds 2 compiled models", "tiny_cnn-cpu100.so, tiny_cnn-cpu50.so", "name one")
    with pytest.raises(TunekitError) as excinfo:
        load(out_dir_like_tune(tiny, tmp_path / "none", "untuned.so"))
    one_line_error(excinfo, "no compiled model in", "<model>-<share>.so")


@pytest.mark.e2e
def test_bench_takes_a_loaded_model_or_a_tune_out_dir(tiny, model, tmp_path):
    from tunekit.deploy import bench

    assert bench(model, cpu_pct=50, repeats=3, warmup=1).artifact == tiny.artifact
    out = out_dir_like_tune(tiny, tmp_path / "out", "tiny_cnn-cpu50.so", "untuned.so")
    ran = run_cli("bench", out, "--cpu-pct", "50", "--repeats", "3", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["artifact"] == os.path.join(out, "tiny_cnn-cpu50.so")


# ---- run_once -----------------------------------------------------------------------------------

def test_run_once_writes_the_outputs_by_name(tiny, model, tmp_path):
    from tunekit.deploy import run_once

    np.save(tmp_path / "x.npy", tiny.x)
    out = str(tmp_path / "out" / "y.npz")
    info = run_once(tiny.artifact, inputs={"x": str(tmp_path / "x.npy")}, output=out)
    assert info["outputs"] == [{"name": "y", "shape": [1, 10], "dtype": "float32"}] and info["wall_ms"] > 0
    with np.load(out) as saved:
        assert saved.files == ["y"]
        np.testing.assert_array_equal(saved["y"], model(tiny.x))
    random_run = run_once(tiny.artifact, inputs={}, output=None)  # no inputs given: random ones
    assert random_run["inputs"] == {"x": "random"} and random_run["outputs"][0]["shape"] == [1, 10]


def test_run_once_refuses_bad_input_files(tiny, tmp_path):
    from tunekit.deploy import run_once

    with pytest.raises(TunekitError) as excinfo:
        run_once(tiny.artifact, inputs={"x": str(tmp_path / "nope.npy")}, output=None)
    one_line_error(excinfo, "input 'x'", "not found", "nope.npy")
    np.save(tmp_path / "small.npy", tiny.x[:, :, :8])
    with pytest.raises(TunekitError) as excinfo:
        run_once(tiny.artifact, inputs={"x": str(tmp_path / "small.npy")}, output=None)
    one_line_error(excinfo, "input 'x'", "small.npy", "expected shape [1, 3, 64, 64] float32",
                   "got shape [1, 3, 8, 64] float32")
    with pytest.raises(TunekitError) as excinfo:
        run_once(tiny.artifact, inputs={"image": str(tmp_path / "small.npy")}, output=None)
    one_line_error(excinfo, "no input 'image'")


# ---- bench --------------------------------------------------------------------------------------

@pytest.mark.e2e
def test_bench_at_a_cpu_share(tiny):
    from tunekit.deploy import bench
    from tunekit.shares.share import Share

    result = bench(tiny.artifact, cpu_pct=50, repeats=30, warmup=3)
    assert result.share == "cpu50" and result.device == "cpu:0" and result.share_enforced
    assert 0 < result.min_ms <= result.p50_ms <= result.p90_ms <= result.p99_ms
    assert result.throughput_per_s == pytest.approx(1e3 / result.mean_ms) and result.throughput_per_s > 0
    assert result.cores == len(Share("cpu", 50).cpu_cores())  # the worker ran pinned to the share
    assert result.sm_count is None and result.numerics is None
    assert json.loads(json.dumps(result.to_dict()))["p50_ms"] == result.p50_ms


@pytest.mark.e2e
def test_bench_compares_numerics_with_onnxruntime(tiny):
    from tunekit.deploy import bench

    result = bench(tiny.artifact, cpu_pct=100, repeats=5, warmup=1, compare_onnx=tiny.onnx)
    assert result.cores == len(os.sched_getaffinity(0))
    numerics = result.numerics
    assert numerics["same_model"] is True
    (row,) = numerics["outputs"]
    assert row["name"] == "y" and row["cosine"] > 0.999
    assert row["max_abs_err"] < 1e-4 and row["max_rel_err"] < 1e-3
    assert "pytorch" not in result.to_dict()  # no stub field: PyTorch is timed by benchmarks/vs_pytorch.py


def test_bench_refuses_a_share_of_the_wrong_kind(tiny):
    from tunekit.deploy import bench

    with pytest.raises(TunekitError) as excinfo:
        bench(tiny.artifact, gpu_pct=40)  # refused before any GPU or MPS is looked for
    one_line_error(excinfo, "compiled for cpu", "--cpu-pct", "not gpu40")
    with pytest.raises(TunekitError) as excinfo:
        bench(tiny.artifact, cpu_pct=50, gpu_pct=40)
    one_line_error(excinfo, "not both")


# ---- GPU (skipped without an NVIDIA GPU; need torch there) --------------------------------------

@pytest.fixture(scope="module")
def cuda_tiny(tiny):
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")  # NVRTC needs the CUDA headers
    artifact = build_artifact(tiny.onnx, str(tiny.root / "tiny_cnn-gpu40.so"), target=target_for(Share("gpu", 40)),
                              share_label="gpu40")
    return SimpleNamespace(onnx=tiny.onnx, artifact=artifact, x=tiny.x)


@pytest.mark.gpu
def test_gpu_torch_cuda_tensor_crosses_without_copy(tmp_path):
    torch = pytest.importorskip("torch")
    from tunekit.deploy import load
    from tunekit.deploy.arrays import to_tvm
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    artifact = build_artifact(identity_onnx(str(tmp_path / "identity.onnx")), str(tmp_path / "identity-gpu40.so"),
                              target=target_for(Share("gpu", 40)), share_label="gpu40")
    model = load(artifact)
    assert str(model.device) == "cuda:0"
    x = torch.randn(4, 8, device="cuda")
    assert to_tvm(x, device=model.device).data_ptr() == x.data_ptr()  # the pointer TVM sees
    y = model(x)
    assert isinstance(y, torch.Tensor) and y.device == x.device
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x)  # passed through both ways, no copy
    with pytest.raises(TunekitError) as excinfo:
        model(x.cpu())
    one_line_error(excinfo, "input 'x'", "expected a tensor on cuda:0, got one on cpu:0")


@pytest.mark.gpu
def test_gpu_tiny_cnn_on_cuda_matches_onnxruntime(cuda_tiny):
    torch = pytest.importorskip("torch")
    from tunekit.deploy import load

    model = load(cuda_tiny.artifact)
    # Two different inputs in two different buffers: the second call must not replay a CUDA graph
    # that still reads the first call's input memory.
    for x in (cuda_tiny.x, np.random.default_rng(2).standard_normal(cuda_tiny.x.shape).astype("float32")):
        expected = onnxruntime_y(cuda_tiny.onnx, x)
        y = model(torch.from_numpy(x).cuda())
        assert y.is_cuda
        np.testing.assert_allclose(y.cpu().numpy(), expected, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(model(x), expected, rtol=1e-3, atol=1e-4)  # numpy in -> numpy out


@pytest.mark.gpu
def test_gpu_bench_at_40_sees_fewer_sms(cuda_tiny):
    pytest.importorskip("torch")
    import tvm

    from tunekit.deploy import bench

    result = bench(cuda_tiny.artifact, gpu_pct=40, repeats=50, warmup=5, compare_onnx=cuda_tiny.onnx)
    assert result.share == "gpu40" and result.share_enforced and result.device == "cuda:0"
    assert result.p50_ms <= result.p90_ms <= result.p99_ms and result.throughput_per_s > 0
    assert result.sm_count < tvm.cuda(0).multi_processor_count
    assert result.numerics["outputs"][0]["cosine"] > 0.999


@pytest.mark.e2e
def test_latency_worker_times_a_slow_model_fewer_times(tiny, tmp_path):
    """servers.latency_worker: up to REPEATS timed runs, but no more than fit in MAX_TIMING_S, and never
    fewer than MIN_REPEATS. (A cap below one run's time stands in for a slow model.)"""
    from tunekit.servers.latency_worker import MIN_REPEATS

    inputs = tmp_path / "in.npz"
    np.savez(inputs, tiny.x)

    def repeats(*cap):
        proc = subprocess.run([sys.executable, "-m", "tunekit.servers.latency_worker", tiny.artifact, str(inputs),
                               "cpu", "20", str(tmp_path / "out.npz"), *cap], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])["repeats"]

    assert repeats() == 20
    assert repeats("60") == 20
    assert repeats("1e-9") == MIN_REPEATS


@pytest.mark.e2e
def test_latency_process_times_every_artifact_at_a_share_in_one_process(tiny, tmp_path):
    """servers.latency.LatencyProcess (a tuning run keeps one per share): several timings, one worker;
    an artifact that fails to load is a one-line error from the same worker; a worker that died or
    hung is replaced at the next timing."""
    import signal

    from tunekit.errors import TunekitError
    from tunekit.servers.latency import LatencyProcess
    from tunekit.shares.pinning import pinned_env
    from tunekit.shares.share import Share

    broken = tmp_path / "broken.so"
    broken.write_bytes(b"not a shared library")
    expected = onnxruntime_y(tiny.onnx, tiny.x)
    with LatencyProcess(pinned_env(Share("cpu", 50))) as worker:
        first = worker.pid
        for _ in range(2):
            info, outputs = worker.measure(artifact=tiny.artifact, inputs={"x": tiny.x}, repeats=3)
            assert info["repeats"] == 3 and info["median_ms"] > 0
            np.testing.assert_allclose(outputs[0], expected, rtol=1e-4, atol=1e-4)
        with pytest.raises(TunekitError, match=r"^latency measurement at cpu50 failed: .*broken\.so") as caught:
            worker.measure(artifact=str(broken), inputs={"x": tiny.x}, repeats=3)
        assert "\n" not in str(caught.value)
        assert (worker.pid, worker.started) == (first, 1)  # the load error came back; the worker lives on
        os.kill(first, signal.SIGKILL)  # as the OOM killer would, between two timings
        _wait_until_dead(first)
        info, _ = worker.measure(artifact=tiny.artifact, inputs={"x": tiny.x}, repeats=3)
        assert worker.started == 2 and worker.pid != first and info["median_ms"] > 0
        with pytest.raises(TunekitError, match="timed out"):
            worker.measure(artifact=tiny.artifact, inputs={"x": tiny.x}, repeats=3, timeout_s=0.0)
        assert worker.pid is None  # killed, not left running
        worker.measure(artifact=tiny.artifact, inputs={"x": tiny.x}, repeats=3)
        assert worker.started == 3


def _wait_until_dead(pid: int, timeout_s: float = 30) -> None:
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still running")


@pytest.mark.e2e
def test_latency_process_times_an_artifact_rebuilt_at_the_same_path(doubled_and_tripled, tmp_path):
    """--precision auto builds the untuned model again in fp32 at the refused fp16 build's path, and one
    worker times both: the second timing must run the new file (dlopen would hand back the first)."""
    from tunekit.servers.latency import LatencyProcess
    from tunekit.shares.pinning import pinned_env
    from tunekit.shares.share import Share

    doubled, tripled = doubled_and_tripled
    path, x = str(tmp_path / "untuned.so"), np.ones((4, 8), "float32")
    with LatencyProcess(pinned_env(Share("cpu", 50))) as worker:
        replace_artifact(doubled, path)
        assert worker.measure(artifact=path, inputs={"x": x}, repeats=3)[1][0][0, 0] == 2.0
        replace_artifact(tripled, path)
        assert worker.measure(artifact=path, inputs={"x": x}, repeats=3)[1][0][0, 0] == 3.0
        assert worker.started == 1


def test_load_after_the_artifact_was_rebuilt_runs_the_new_build(doubled_and_tripled, tmp_path):
    """A session that loads a model, tunes it again and loads it again gets the new model."""
    from tunekit.deploy import load

    doubled, tripled = doubled_and_tripled
    path, x = str(tmp_path / "model.so"), np.ones((4, 8), "float32")
    replace_artifact(doubled, path)
    first = load(path)
    replace_artifact(tripled, path)
    np.testing.assert_array_equal(load(path)(x), 3 * x)
    np.testing.assert_array_equal(first(x), 2 * x)  # the first load still runs its own build
