"""tunekit.counts: summing count dicts."""
from tunekit.counts import sum_counts


def test_sum_counts():
    total = sum_counts([{"a": 1}, {"a": 2, "b": 1}, {}, {"c": 0, "b": 4}])
    assert total == {"a": 3, "b": 5, "c": 0} and list(total) == ["a", "b", "c"]
    assert sum_counts([]) == {}
    assert sum_counts(iter([{"x": 2}])) == {"x": 2}  # any iterable, read once
