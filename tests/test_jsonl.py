"""The JSON-lines record format (records/jsonl.py) and the harness's readers built on it (tunekit.testing):
garbage and torn lines skipped, workload indices kept, every client's database found."""
import json

from tunekit.records import jsonl
from tunekit.testing import distinct, record_keys, record_lines, shard_dirs


def _record(name, secs):
    return [[[["Trace", [], [name], []]], []], [secs], {"kind": "llvm"}, []]


def _write_db(path, workloads, records):
    path.mkdir(parents=True, exist_ok=True)
    (path / jsonl.WORKLOADS).write_text("".join(line + "\n" for line in workloads))
    (path / jsonl.RECORDS).write_text("".join(line + "\n" for line in records))


def test_jsonl_readers_skip_garbage_and_a_torn_last_line(tmp_path):
    db = tmp_path / "db"
    good = [json.dumps([0, _record("x", 1e-5)]), json.dumps([1, _record("y", 2e-5)]),
            json.dumps([0, _record("z", 3e-5)])]
    _write_db(db, [json.dumps(["h0", "mod0"]), json.dumps(["h1", "mod1"])],
              [good[0], "this is not json", good[1], "", json.dumps([0, "not a record"]),
               json.dumps(["0", _record("q", 1.0)]), good[2]])
    with open(db / jsonl.RECORDS, "a") as fh:
        fh.write(good[2][:25])  # the last line, cut off by a crash
    skipped = []
    lines = list(jsonl.read_records(str(db), skipped=skipped))
    assert [line.text for line in lines] == good
    assert [line.workload for line in lines] == [0, 1, 0]
    assert lines[1].run_secs == [2e-5] and lines[1].trace == _record("y", 2e-5)[0]
    assert lines[0].trace_text() == json.dumps(_record("x", 1)[0], sort_keys=True)
    assert len(skipped) == 4 and skipped[0] == "this is not json" and skipped[-1] == good[2][:25]
    assert jsonl.count_records(str(db)) == 3
    keys = jsonl.record_keys(str(db))
    assert [w for w, _ in keys] == ["h0", "h1", "h0"] and len(set(keys)) == 3
    # tunekit.testing reads through the same module
    assert record_lines(db) == good and record_keys(db) == keys and distinct(keys + keys[:1]) == set(keys)


def test_jsonl_workload_lines_keep_their_index_when_one_is_torn(tmp_path):
    db = tmp_path / "db"
    _write_db(db, [json.dumps(["h0", "m"]), '["h1", "cut', json.dumps(["h2", "m"])],
              [json.dumps([2, _record("a", 1e-5)]), json.dumps([1, _record("b", 1e-5)]),
               json.dumps([7, _record("c", 1e-5)])])
    assert jsonl.read_workloads(str(db)) == [["h0", "m"], None, ["h2", "m"]]
    assert [w for w, _ in jsonl.record_keys(str(db))] == ["h2", None, None]  # torn workload, index out of range
    empty = tmp_path / "nothing"
    assert jsonl.read_workloads(str(empty)) == [] and list(jsonl.read_records(str(empty))) == []
    assert jsonl.count_records(str(empty)) == 0 and jsonl.record_keys(str(empty)) == []


def test_shard_dirs_finds_every_client_database(tmp_path):
    for client in ("client-0", "client-1"):
        _write_db(tmp_path / "work" / "shards" / "cpu50" / "run-1" / client, [], [])
    (tmp_path / "work" / "shards" / "cpu50" / "run-1" / "client-2").mkdir()  # never wrote a record
    _write_db(tmp_path / "work" / "shards" / "cpu100" / "run-1" / "client-0", [], [])
    found = shard_dirs(tmp_path, "cpu50")
    assert [p.split("/")[-1] for p in found] == ["client-0", "client-1"]
    assert shard_dirs(tmp_path, "gpu40") == []
