"""A fleet's models prepared in processes of their own (run.prepare_apart): the module that comes back is the one
prepared here, its log lines are said here, and a process that dies fails its model in one line."""
import logging
import os
import signal
import time

import pytest


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    from tunekit.models.examples import save_example

    return save_example("transformer", str(tmp_path_factory.mktemp("apart") / "transformer.onnx"))


def _target():
    from tvm.target import Target

    from tunekit.readiness import gpu_arch_target

    target = gpu_arch_target("sm_90")
    return target if isinstance(target, Target) else Target(target)


def test_a_model_prepared_in_a_process_of_its_own_is_the_module_prepared_here(transformer, tmp_path, caplog):
    import tvm_ffi

    from tunekit.frontend.precision import fp32_kept, prepare, skipped_steps
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.records.baselines import workload_key
    from tunekit.run.prepare_apart import PreparedApart
    from tunekit.run.session import load_model

    target = _target()
    apart = PreparedApart(str(tmp_path / "work"))
    apart.start(name="t", model=transformer, input_shapes={}, target=target, precision="fp16")
    here, precision = prepare(load_model(transformer).mod, target, precision="fp16")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tunekit"):
        there, precision_there = apart.taker("t")(target, "fp16")
    assert precision_there == precision == "fp16"
    assert tvm_ffi.structural_hash(there) == tvm_ffi.structural_hash(here)
    assert (fp32_kept(there), skipped_steps(there)) == (fp32_kept(here), skipped_steps(here))
    keys = [sorted(workload_key(t.dispatched[0]) for t in extract_tasks(m, target)) for m in (there, here)]
    assert keys[0] == keys[1] and keys[0]
    assert any("attentions fused into one kernel" in r.getMessage() for r in caplog.records)  # said again here
    assert apart.take("t", target, "fp16") is None  # taken once; a preparation never started is made in-process
    assert os.listdir(tmp_path / "work") == []  # its module's file is gone


def test_a_preparation_whose_process_dies_fails_its_model_in_one_line(transformer, tmp_path):
    from tunekit.errors import RunFailed
    from tunekit.run.prepare_apart import PreparedApart

    target = _target()
    apart = PreparedApart(str(tmp_path / "work"))
    apart.start(name="doomed", model=transformer, input_shapes={}, target=target, precision="fp16")
    children, deadline = _children_preparing(), time.monotonic() + 30
    while not children and time.monotonic() < deadline:  # a busy machine: /proc may not show the exec'd command yet
        time.sleep(0.05)
        children = _children_preparing()
    assert children
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(RunFailed, match="the process that prepared doomed died") as raised:
        apart.take("doomed", target, "fp16")
    assert "\n" not in str(raised.value)
    apart.close()
    assert os.listdir(tmp_path / "work") == []


def test_a_model_that_cannot_be_prepared_fails_with_the_line_a_preparation_here_gives(tmp_path):
    from tunekit.errors import TunekitError
    from tunekit.run.prepare_apart import PreparedApart

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    apart = PreparedApart(str(tmp_path / "work"))
    apart.start(name="broken", model=str(broken), input_shapes={}, target=_target(), precision="fp16")
    with pytest.raises(TunekitError) as raised:
        apart.take("broken", _target(), "fp16")
    assert "broken.onnx" in str(raised.value) and "\n" not in str(raised.value)
    assert os.listdir(tmp_path / "work") == []


def test_a_script_that_tunes_a_fleet_at_its_top_level_is_not_run_again_by_the_preparations(tmp_path):
    """No `if __name__ == "__main__"` in a CI script: the processes that prepare its models must not import it."""
    import subprocess
    import sys

    from tunekit.models.examples import save_example

    a = save_example("tiny_cnn", str(tmp_path / "a.onnx"))
    b = save_example("tiny_cnn", str(tmp_path / "b.onnx"), seed=1, classes=20)
    script = tmp_path / "ci.py"
    script.write_text("import tunekit\nprint('RAN', flush=True)\n"
                      f"r = tunekit.tune_fleet([{a!r}, {b!r}], cpu_pct=50, trials=4, out={str(tmp_path / 'out')!r})\n"
                      "print('FAILED', r.failed)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("RAN") == 1 and "FAILED {}" in proc.stdout, proc.stdout


def _children_preparing() -> list[int]:
    """This process's children running tunekit.run.prepare_apart."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"tunekit.run.prepare_apart" in command:
            found.append(int(pid))
    return found
