"""A fleet's models prepared in processes of their own (run.prepare_apart): the module that comes back is the one
prepared here, its log lines are said here, and a process that dies fails its model in one line."""
import logging
import multiprocessing
import os
import signal

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
    children = multiprocessing.active_children()
    assert children
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(RunFailed, match="the process that prepared doomed died") as raised:
        apart.take("doomed", target, "fp16")
    assert "\n" not in str(raised.value)
    apart.close()
    assert os.listdir(tmp_path / "work") == []
