"""Bad input, fuzzed: every case gets one clear error line and exit code 2 (bad input), never a traceback or a
hang, and nothing already on disk is damaged. Seeded, bounded, real CLI subprocesses."""
import random

import onnx
import pytest
from onnx import TensorProto, helper

from tunekit.testing import run_cli

SEED = 1234


def _assert_refused(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])  # bad input: usage error
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tunekit:")]
    assert len(lines) == 1, proc.stderr[-2000:]


def _onnx_byte_cases(example_model):
    good = open(example_model, "rb").read()
    rng = random.Random(SEED)
    cases = {"empty": b"", "one-byte": b"\x08"}
    for i in range(4):  # cut at random points
        cases[f"truncated-{i}"] = good[: rng.randrange(1, len(good) - 1)]
    for i in range(3):  # random bytes
        cases[f"random-{i}"] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
    flipped = bytearray(good)
    for _ in range(64):
        flipped[rng.randrange(len(flipped))] ^= 0xFF
    cases["bit-flips"] = bytes(flipped)
    return cases


def test_fuzzed_onnx_files_are_refused_cleanly(example_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    cases = _onnx_byte_cases(example_model)
    assert len(cases) == 10
    outcomes = {}
    for name, data in cases.items():
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(data)
        # a flip that still makes a valid model may tune: in a dir of its own, so that the checks
        # below (nothing written, nothing lost) stay about the refused cases
        case_out = tmp_path / "out-flipped" if name == "bit-flips" else out
        proc = run_cli("tune", path, "--cpu-pct", "50", "--trials", "8", "--out", case_out, timeout=300)
        outcomes[name] = proc.returncode
        if name == "bit-flips" and proc.returncode == 0:
            continue
        _assert_refused(proc)
    # empty, one byte, truncated or random bytes can never be a valid model: every one is refused
    assert all(code != 0 for name, code in outcomes.items() if name != "bit-flips"), outcomes
    assert (out / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing written by a refused run


def _model(path, *, opset=17, shape=(1, 4), op="Relu", domain=""):
    node = helper.make_node(op, ["x"], ["y"], domain=domain)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=imports, ir_version=8), path)


@pytest.mark.parametrize("case", ["opset-99", "absurd-shape", "zero-dim", "custom-op"])
def test_odd_models_are_refused_cleanly(case, tmp_path):
    path = str(tmp_path / f"{case}.onnx")
    kwargs = {"opset-99": {"opset": 99}, "absurd-shape": {"shape": (1, 10**12)},
              "zero-dim": {"shape": (1, 0)}, "custom-op": {"op": "NoSuchOp", "domain": "com.fuzz"}}[case]
    _model(path, **kwargs)
    proc = run_cli("tune", path, "--cpu-pct", "50", "--trials", "8", "--out", tmp_path / "o", timeout=300)
    _assert_refused(proc)


@pytest.mark.parametrize("flags", [
    ["--cpu-pct", "-1"], ["--cpu-pct", "1000"], ["--cpu-pct", "NaN"], ["--cpu-pct", "50.5"], ["--cpu-pct", ""],
    ["--gpu-pct", "0x40"], ["--trials", "many"], ["--trials", "0"], ["--trials", "-5"], ["--seed", "x"],
    ["--trials-per-iter", "1e3"], ["--servers", "0"], ["--input-shape", "x:1x3x-1x8"], ["--input-shape", "::"],
    ["--engine", "turbo"], ["--cpu-pct", "50", "--gpu-pct", "50"], ["--nonsense-flag"],
])
def test_fuzzed_flags_are_refused_cleanly(example_model, tmp_path, flags):
    proc = run_cli("tune", example_model, *flags, "--out", tmp_path / "o", timeout=300)
    _assert_refused(proc)
    assert not (tmp_path / "o" / "report.json").exists()


@pytest.mark.parametrize("text", [
    "trials: many\n", "trials: -3\n", "not_a_key: 1\n", "- a\n- list\n", "trials: [1, 2\n", "{{{{\n",
    "engine: 7\n", "overlap: sometimes\n", "\x00\x01\x02", "search: {population: 0}\n",
    "search: {batches: 0}\n", "search: 3\n", "search: {nope: 1}\n", "search_batches: 3\n", "reserve_ahead: true\n",
])
def test_fuzzed_yaml_configs_are_refused_cleanly(example_model, tmp_path, text):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(text.encode("utf-8", "surrogateescape"))
    proc = run_cli("tune", example_model, "--config", cfg, "--out", tmp_path / "o", timeout=300)
    _assert_refused(proc)
    assert cfg.read_bytes() == text.encode("utf-8", "surrogateescape")  # the user's file is untouched
