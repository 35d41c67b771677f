"""Opening a record database (records/database.py): the best records without parsing every trace, on real TVM
records of a conv task."""
import pytest
from tvm.s_tir import meta_schedule as ms

import _conv_records
from tunekit.records.database import open_best_records, open_database
from tunekit.records.jsonl import RECORDS


@pytest.fixture(scope="module")
def conv_records(example_model):
    return _conv_records.conv_records(example_model)


def test_best_records_are_what_the_json_database_ranks_first_without_parsing_every_trace(conv_records, tmp_path):
    """open_best_records reads the lines and parses one trace per workload: the record JSONDatabase's
    get_top_k(workload, 1) gives (lowest mean run time; failed trials never; on a tie the first in the
    file), with a torn last line skipped."""
    database, _ = conv_records

    def json_database(name):
        (tmp_path / name).mkdir()
        return tmp_path / name, ms.database.JSONDatabase(work_dir=str(tmp_path / name))

    def best_of(db_dir):
        full, best = open_database(db_dir), open_best_records(db_dir)
        (workload,) = {r.workload.mod for r in full.get_all_tuning_records()}
        expected, got = full.get_top_k(full.commit_workload(workload), 1), best.get_top_k(best.commit_workload(workload), 1)
        assert [str(r.trace) for r in got] == [str(r.trace) for r in expected]
        assert [[float(s) for s in r.run_secs] for r in got] == [[float(s) for s in r.run_secs] for r in expected]
        return got

    ranked, db = json_database("ranked")  # failed first, then a mean of 20 us over two runs, then 30 us
    database(1e10, [10e-6, 30e-6], 30e-6, into=db)
    (best,) = best_of(ranked)
    assert [float(s) for s in best.run_secs] == [10e-6, 30e-6]
    tie, db = json_database("tie")  # two candidates, equal means: the first one committed
    database(20e-6, 20e-6, into=db)
    with open(tie / RECORDS, "a") as fh:
        fh.write('[0, [["cut off')  # a crash mid-line
    best_of(tie)
    failed, db = json_database("failed")  # only failed trials: nothing to apply
    database(1e10, 1e10, into=db)
    assert best_of(failed) == [] and open_best_records(failed).get_all_tuning_records() == []
