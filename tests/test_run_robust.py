"""The share-robust records (run/robust.py) read from every share's record lines, on real TVM records of a conv
task. The choice itself, on synthetic matrices, is in test_robust.py."""
import pytest
from tvm.s_tir import meta_schedule as ms

import _conv_records
from tunekit.run.robust import robust_records


@pytest.fixture(scope="module")
def conv_records(example_model):
    return _conv_records.conv_records(example_model)


def test_robust_records_pick_the_candidate_with_the_smallest_worst_regret_from_the_record_lines(conv_records,
                                                                                               tmp_path):
    """run.robust reads every share's record lines (not their JSONDatabases): a candidate is the same trace in
    each share's file. Of two candidates, the one whose worst regret over both shares is smaller is chosen,
    though it is only one share's best, and its record parses into the chosen database."""
    database, key = conv_records
    dirs = {}
    for share, secs in (("gpu20", (20e-6, 25e-6)), ("gpu100", (90e-6, 60e-6))):
        (tmp_path / share).mkdir()
        database(*secs, into=ms.database.JSONDatabase(work_dir=str(tmp_path / share)))
        dirs[share] = str(tmp_path / share)
    chosen, rows, estimate = robust_records(dirs, {}, {key: 1})
    # the first candidate: regret 1.0 at 20%, 1.5 at 100%; the second: 1.25 and 1.0
    (row,) = rows
    assert row["workload_hash"] == key and row["chosen"] == "record" and row["candidates"] == 2
    assert row["us"] == {"gpu20": 25.0, "gpu100": 60.0} and row["worst_regret"] == 1.25
    (record,) = chosen.get_all_tuning_records()
    assert [float(s) for s in record.run_secs] == [25e-6]  # read from the first share's file
    second = ms.database.MemoryDatabase()
    database(1e10, 25e-6, into=second)  # the second candidate's trace, as the first share recorded it
    assert str(record.trace) == str(second.get_all_tuning_records()[1].trace)
    assert estimate["worst_regret"] == 1.25
