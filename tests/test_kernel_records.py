"""Kernels of another kind kept in a share's records (records.kernel_records) and chosen at compile time only where
they beat both MetaSchedule's best record and the untuned kernel, with their output right at the share
(clients.compiler.kernels_worth_applying; issue 53). Real records of the example model's conv task."""
import os

import _conv_records

from tunekit.clients.compiler import kernels_worth_applying
from tunekit.records import kernel_records
from tunekit.records.baselines import write_baselines
from tunekit.records.kernel_records import KernelRecord


def _kernel(key: str, us: float, *, checked: bool = True, config: str = "m64n64k32w4s3g8") -> KernelRecord:
    return KernelRecord(workload=key, kind="triton", config=config, run_secs=(us * 1e-6, us * 1e-6), checked=checked)


def test_kernel_records_are_kept_by_kind_and_a_cut_line_is_skipped(tmp_path):
    db = str(tmp_path)
    kernel_records.append(db, _kernel("a" * 16, 12.0))
    kernel_records.append(db, _kernel("a" * 16, 9.0, config="m32n64k32w4s3g8"))
    kernel_records.append(db, _kernel("a" * 16, 5.0, checked=False))  # wrong output at the share: never best
    with open(os.path.join(db, kernel_records.KERNEL_RECORDS), "a") as fh:
        fh.write('{"workload": "b", "kind": "tri')  # a crash while writing
    assert len(kernel_records.read(db)) == 3
    best = kernel_records.best_checked(db)
    assert list(best) == ["a" * 16] and best["a" * 16].config == "m32n64k32w4s3g8" and best["a" * 16].kind == "triton"
    assert abs(best["a" * 16].mean_us - 9.0) < 1e-9


def test_a_kernel_is_chosen_only_where_it_beats_the_best_record_and_the_untuned_kernel(example_model, tmp_path):
    database, key = _conv_records.conv_records(example_model)
    records = database(100e-6, 40e-6)  # MetaSchedule's best of the task: 40 us
    db = str(tmp_path)
    assert kernels_worth_applying(db, records) == {}  # nothing of another kind measured
    kernel_records.append(db, _kernel(key, 50.0))
    assert kernels_worth_applying(db, records) == {}  # slower than the best record
    kernel_records.append(db, _kernel(key, 30.0, config="m32n32k32w4s3g8"))
    assert kernels_worth_applying(db, records)[key].config == "m32n32k32w4s3g8"
    write_baselines(db, {key: 25.0})  # the untuned kernel is faster still
    assert kernels_worth_applying(db, records) == {}
    write_baselines(db, {key: 80.0})
    kernel_records.append(db, _kernel(key, 10.0, checked=False))  # fastest, but wrong at the share
    assert kernels_worth_applying(db, records)[key].config == "m32n32k32w4s3g8"
    assert kernels_worth_applying(db, None)[key].config == "m32n32k32w4s3g8"  # no records at all: against the untuned kernel


def test_kernels_measured_best_are_left_out_with_a_warning_where_tvm_has_no_cuda_runtime(example_model, caplog):
    """A CPU machine's TVM cannot make the CUDA module a Triton kernel lives in: the model keeps MetaSchedule's kernels
    for those tasks and the log says so (on a GPU machine test_triton_gemm's GPU test builds them in)."""
    import pytest
    import tvm_ffi
    from tvm.target import Target

    from tunekit.clients.compiler import with_kernels
    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.kernels.in_module import task_key
    from tunekit.run.session import load_model

    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is not None:
        pytest.skip("this machine's TVM has the CUDA runtime")
    target = Target("nvidia/nvidia-h100")
    prepared = prepare_for_tuning(load_model(example_model).mod, target)
    key = task_key(extract_tasks(prepared, target)[0].dispatched[0]["main"])
    with caplog.at_level("WARNING", logger="tunekit"):
        assert with_kernels(prepared, {key: _kernel(key, 1.0)}, target=target).same_as(prepared)
    assert "no CUDA runtime" in caplog.text
    assert with_kernels(prepared, {}, target=target).same_as(prepared)


def test_a_fleets_kernel_records_go_to_each_model_with_its_own_workloads(tmp_path):
    """records.subset.write_subset: a model tuned in a fleet gets the kernels of its workloads, so its build uses them."""
    from tunekit.records.subset import write_subset

    fleet, model = str(tmp_path / "fleet"), str(tmp_path / "model")
    for key in ("a" * 16, "b" * 16):
        kernel_records.append(fleet, _kernel(key, 9.0))
    write_subset(fleet, model, {"a" * 16})
    assert [r.workload for r in kernel_records.read(model)] == ["a" * 16]
    write_subset(fleet, model, {"a" * 16})  # again (a resumed fleet): nothing twice
    assert len(kernel_records.read(model)) == 1
