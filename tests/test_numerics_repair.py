"""run.numerics_repair: which applied records break a tuned build (group testing over builds)."""
from tunekit.run.numerics_repair import broken_workloads


def _builds(bad: set, *, together: set = frozenset()):
    """passes(keys) as a build would answer, counting the builds."""
    calls = []

    def passes(keys):
        calls.append(list(keys))
        return not (bad & set(keys)) and not (together and together <= set(keys))

    return passes, calls


def test_two_broken_records_among_sixteen_are_found_in_few_builds():
    keys = [f"w{i}" for i in range(16)]
    passes, calls = _builds({"w3", "w12"})
    assert sorted(broken_workloads(keys, passes)) == ["w12", "w3"]
    assert len(calls) <= 2 * 2 * 4  # about 2 c log2(n)


def test_records_that_break_the_model_only_together_are_all_left_out():
    passes, _ = _builds(set(), together={"a", "b"})
    assert sorted(broken_workloads(["a", "b", "c", "d"], passes)) == ["a", "b"]  # neither fails alone


def test_one_record_is_its_own_answer():
    passes, calls = _builds({"x"})
    assert broken_workloads(["x"], passes) == ["x"] and calls == []


def test_past_its_time_the_sets_not_yet_searched_are_left_out_whole():
    keys = [f"w{i}" for i in range(16)]
    passes, calls = _builds({"w3"})
    clock = iter(range(100, -100, -1))  # seconds left, one fewer at each look

    def time_left():
        return next(clock) if len(calls) < 3 else 0  # three builds, then the time is up

    broken = broken_workloads(keys, passes, time_left=time_left)
    assert len(calls) == 3 and "w3" in broken and sorted(set(keys) - set(broken)) == ["w0", "w1"]  # found good


def test_both_halves_are_built_before_the_first_is_checked_and_the_answer_is_the_same():
    keys = [f"w{i}" for i in range(16)]
    passes, calls = _builds({"w3", "w12"})
    events = []

    def prebuild(parts):
        events.append(("built", [list(p) for p in parts]))

    def checked(part):
        events.append(("checked", list(part)))
        return passes(part)

    assert sorted(broken_workloads(keys, checked, prebuild=prebuild)) == ["w12", "w3"]
    assert events[0] == ("built", [keys[:8], keys[8:]]) and events[1] == ("checked", keys[:8])
    built = [part for kind, parts in events if kind == "built" for part in parts]
    assert all(part in built for kind, part in events if kind == "checked")  # nothing checked unbuilt


def test_probe_builds_run_two_at_once_give_their_errors_and_leave_no_file(tmp_path):
    import threading
    import time

    from tunekit.run.numerics_repair import ProbeBuilds

    running, most = set(), []

    def build(keys, path):
        running.add(tuple(keys))
        most.append(len(running))
        time.sleep(0.2)
        running.discard(tuple(keys))
        if keys == ["bad"]:
            raise RuntimeError("does not build")
        with open(path, "w") as fh:
            fh.write(threading.current_thread().name)

    probes = ProbeBuilds(build, work_dir=str(tmp_path))
    probes.prebuild([["a"], ["b"]])
    probes.prebuild([["bad"], ["left"]])
    assert open(probes.take(["a"])).read().startswith("tunekit-probe") and max(most) == 2
    probes.discard(["a"])
    try:
        probes.take(["bad"])
        raise AssertionError("the build's error was not raised")
    except RuntimeError as exc:
        assert "does not build" in str(exc)
    assert open(probes.take(["new"])).read() == threading.current_thread().name  # not prebuilt: built now
    probes.close()  # waits for "b" and "left", and removes them (never taken)
    probes.discard(["new"])
    assert list(tmp_path.iterdir()) == []
