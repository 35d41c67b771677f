"""The database a tuning run appends to (records.tuning_database): it opens without parsing every record,
and gives the search what TVM's whole JSONDatabase would: the same trace keys and the same best records."""
import os

import pytest
import tvm_ffi

import _conv_records
from tunekit.records import trace_keys
from tunekit.records.database import open_database
from tunekit.records.jsonl import RECORDS, WORKLOADS, read_records
from tunekit.records.tuning_database import SCRATCH, commit_durably, known_traces, open_for_tuning, read_known
from tunekit.testing import record_lines, run_cli


def _by_hash(known: dict) -> dict:
    """known_traces() with each workload module replaced by its structural hash (comparable across opens)."""
    return {tvm_ffi.structural_hash(mod): found for mod, found in known.items()}


@pytest.fixture(scope="module")
def run_records(example_model, tmp_path_factory):
    """Records of two conv tasks of the example model committed as a tuning run commits them (open_for_tuning,
    then commit_durably per measured candidate), with hand-written run times, a failed trial among them."""
    path = tmp_path_factory.mktemp("run") / "records-cpu100"
    database = open_for_tuning(str(path), seeds=1)
    for index in (0, 1):
        write, _ = _conv_records.conv_records(example_model, index)
        write(30e-6, 1e10, 20e-6, [25e-6, 26e-6], into=database, commit=commit_durably)
    return path


@pytest.fixture(scope="module")
def tuned_dir(example_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned")
    proc = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "12", "--trials-per-iter", "4",
                   "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "records-cpu100"


def _has_every_key_beside_its_record(db_dir, count: int) -> None:
    lines = list(read_records(str(db_dir)))
    keys = trace_keys.read_keys(str(db_dir))
    assert len(lines) == count and {trace_keys.line_id(line.text) for line in lines} <= set(keys)
    # the keys written are the keys of the records as TVM parses them
    assert _by_hash(read_known(str(db_dir))) == _by_hash(known_traces(open_database(str(db_dir))))


def test_every_committed_record_has_its_trace_key_beside_it(run_records):
    _has_every_key_beside_its_record(run_records, len(record_lines(run_records)))
    assert len(_by_hash(read_known(str(run_records)))) == 2  # two workloads


@pytest.mark.e2e
def test_a_tuning_run_writes_every_records_trace_key_beside_it(tuned_dir):
    """What the test above checks of commit_durably, of a real run's records (12 trials)."""
    _has_every_key_beside_its_record(tuned_dir, 12)


def test_a_database_without_keys_is_keyed_once_and_seeds_its_search_with_its_best(run_records, tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    for name in (WORKLOADS, RECORDS):
        (db / name).write_bytes((run_records / name).read_bytes())  # an older tunekit's records: no keys
    whole = open_database(str(db))
    lean = open_for_tuning(str(db), seeds=1)
    assert _by_hash(known_traces(lean)) == _by_hash(known_traces(whole))
    assert len(trace_keys.read_keys(str(db))) == len(record_lines(db))  # keyed at this open, read at the next
    # the search's seeds: each workload's best record, as the whole database ranks it
    workloads = {tvm_ffi.structural_hash(r.workload.mod): r.workload for r in whole.get_all_tuning_records()}
    scratch_lines = (db / SCRATCH).read_text().splitlines()
    assert len(workloads) == 2 and len(scratch_lines) == len(workloads)  # each workload's best, once
    for workload in workloads.values():
        best_whole = whole.get_top_k(workload, 1)
        best_lean = lean.get_top_k(lean.commit_workload(workload.mod), 1)
        assert [trace_keys.trace_key(r.trace) for r in best_lean] == [trace_keys.trace_key(r.trace)
                                                                       for r in best_whole]


def test_what_a_database_knows_includes_what_was_committed_since_it_opened(example_model, tmp_path):
    """A client searches its shard a second time (the pool's leftover trials): the second search must see the
    first one's records, or it measures them again (the two-share coordinator test met 11 distinct of 12)."""
    database = open_for_tuning(str(tmp_path / "db"), seeds=1)
    write, _ = _conv_records.conv_records(example_model, 0)
    write(30e-6, 1e10, 20e-6, into=database, commit=commit_durably)
    known = _by_hash(known_traces(database))
    assert known == _by_hash(read_known(str(tmp_path / "db")))
    assert [len(found) for found in known.values()] == [3]


def test_a_commit_lands_in_the_shares_records_with_its_key(run_records, tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    for name in (WORKLOADS, RECORDS, trace_keys.KEYS):
        (db / name).write_bytes((run_records / name).read_bytes())
    before = len(record_lines(db))
    source = open_database(str(run_records))
    record = source.get_all_tuning_records()[0]
    lean = open_for_tuning(str(db), seeds=2)
    seeded = os.path.getsize(db / SCRATCH)
    from tvm.s_tir import meta_schedule as ms

    workload = lean.commit_workload(record.workload.mod)
    commit_durably(lean, ms.database.TuningRecord(record.trace, workload, [1e-3], record.target, record.args_info))
    lines = record_lines(db)
    assert len(lines) == before + 1  # the share's file, not only the scratch TVM wrote to
    keys = trace_keys.read_keys(str(db))
    last = list(read_records(str(db)))[-1]
    assert keys[trace_keys.line_id(last.text)] == trace_keys.key_and_mark(record.trace)
    assert len(open_database(str(db)).get_all_tuning_records()) == before + 1  # TVM reads what was appended
    assert os.path.getsize(db / SCRATCH) == seeded  # the commit moved out of the scratch file, not copied
    assert len(lean.get_top_k(workload, 20)) > 0  # TVM still holds what it committed


def test_keys_appended_after_a_line_cut_off_by_a_crash_are_kept(tmp_path):
    trace_keys.append_keys(str(tmp_path), [("line-a", "key-a", True)])
    with open(tmp_path / trace_keys.KEYS, "a") as fh:
        fh.write('["line-b", "ke')  # the process died mid-append
    trace_keys.append_keys(str(tmp_path), [("line-c", "key-c", False), ("line-d", "key-d", True)])
    assert trace_keys.read_keys(str(tmp_path)) == {"line-a": ("key-a", True), "line-c": ("key-c", False),
                                                  "line-d": ("key-d", True)}
