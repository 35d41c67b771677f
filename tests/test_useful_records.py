"""Which records are worth applying (clients/compiler.py's useful_records), on real TVM records of a conv task
in a MemoryDatabase."""
import pytest

import _conv_records
from tunekit.clients.compiler import useful_records
from tunekit.records.database import mean_run_us


@pytest.fixture(scope="module")
def conv_records(example_model):
    return _conv_records.conv_records(example_model)


def test_useful_records_keeps_a_record_faster_than_the_untuned_kernel(conv_records):
    database, key = conv_records
    kept, applied = useful_records(database(20e-6, 50e-6), {key: 30.0})
    assert applied == {key: True}
    (record,) = kept.get_all_tuning_records()  # only the best one, of the workload
    assert [float(s) for s in record.run_secs] == [20e-6]


def test_useful_records_drops_a_record_no_faster_than_the_untuned_kernel(conv_records):
    database, key = conv_records
    kept, applied = useful_records(database(20e-6, 50e-6), {key: 15.0})
    assert applied == {key: False} and len(kept.get_all_tuning_records()) == 0
    kept, applied = useful_records(database(20e-6), {key: mean_run_us([20e-6])})  # a tie is not faster
    assert applied == {key: False} and len(kept.get_all_tuning_records()) == 0
    kept, applied = useful_records(database(1e10), {key: 1e9})  # only failed trials: nothing to apply
    assert not applied.get(key) and len(kept.get_all_tuning_records()) == 0


def test_useful_records_keeps_the_best_when_there_is_no_baseline(conv_records):
    database, key = conv_records
    kept, applied = useful_records(database(50e-6, 20e-6), {"0" * 16: 1.0})  # baselines of other workloads only
    assert applied == {key: True}
    assert [float(s) for s in kept.get_all_tuning_records()[0].run_secs] == [20e-6]
    original = database(50e-6)
    same, applied = useful_records(original, None)  # no baselines at all: the database as it is
    assert same is original and applied == {}
    assert useful_records(original, {})[0] is original
