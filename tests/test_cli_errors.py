"""Bad input: one-line error, exit code 2 (usage / bad input), no traceback, nothing on disk lost."""
import os

import pytest

from conftest import has_gpu
from tunekit.testing import run_cli


def assert_clean_error(proc, fragment):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("tunekit: error:")]
    assert len(error_lines) == 1, proc.stderr
    assert fragment.lower() in error_lines[0].lower(), error_lines[0]


def test_missing_model(tmp_path):
    assert_clean_error(run_cli("tune", tmp_path / "nope.onnx", "--out", tmp_path / "o"), "not found")


def test_corrupt_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    assert_clean_error(run_cli("tune", bad, "--out", tmp_path / "o"), "not a valid ONNX model")


@pytest.mark.parametrize("pct", ["0", "101", "-5"])
def test_pct_out_of_range(example_model, tmp_path, pct):
    assert_clean_error(run_cli("tune", example_model, f"--cpu-pct={pct}", "--out", tmp_path / "o"), "1..100")


def test_pct_not_a_number(example_model, tmp_path):
    assert_clean_error(run_cli("tune", example_model, "--cpu-pct", "half", "--out", tmp_path / "o"), "integer")


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU message")
def test_gpu_pct_without_gpu(example_model, tmp_path):
    assert_clean_error(run_cli("tune", example_model, "--gpu-pct", "40", "--out", tmp_path / "o"), "needs an NVIDIA GPU")


def test_unwritable_out_dir(example_model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    assert_clean_error(run_cli("tune", example_model, "--out", blocker / "sub"), "cannot write")
    assert blocker.read_text() == "keep me"


def test_yaml_unknown_key(example_model, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trials: 8\ntrails_per_iter: 4\n")
    assert_clean_error(run_cli("tune", example_model, "--config", cfg, "--out", tmp_path / "o"), "unknown key")


def test_bad_input_shape(example_model, tmp_path):
    assert_clean_error(run_cli("tune", example_model, "--input-shape", "x:1xAx3", "--out", tmp_path / "o"), "--input-shape")
    assert_clean_error(run_cli("tune", example_model, "--input-shape", "nosuch:1x3x8x8", "--out", tmp_path / "o"),
                       "unknown input")


def test_unsupported_operator_is_named(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("MyCustomOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    proc = run_cli("tune", path, "--out", tmp_path / "o")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert "MyCustomOp" in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "o" / "report.json")


def test_stock_engine_cannot_be_sharded_over_clients(example_model, tmp_path):
    """--engine stock runs in one process: with --clients it is refused in one line before any work."""
    out = tmp_path / "o"
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "2", "--engine", "stock", "--out", out)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # exactly one line, nothing else
    assert proc.stderr.startswith("tunekit: error:") and "--engine stock" in proc.stderr, proc.stderr
    assert not (out / "records-cpu50").exists() and not (out / "report.json").exists()
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # refused before the out dir was made


def test_help_lists_the_exit_codes():
    proc = run_cli("--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "exit codes:" in lines, proc.stdout
    listed = {}
    for line in lines[lines.index("exit codes:") + 1:]:
        if not line.strip():
            break
        code, meaning = line.split(None, 1)
        listed[int(code)] = meaning
    assert sorted(listed) == [0, 1, 2, 3, 130], proc.stdout
    assert "usage" in listed[2] and "runtime" in listed[1] and "interrupted" in listed[130], listed
