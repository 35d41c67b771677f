"""Adding up count dicts (fault counts of several fleets, runners or clients): one helper for all."""
from __future__ import annotations

from typing import Iterable


def sum_counts(dicts: Iterable[dict]) -> dict:
    """{"a": 1} + {"a": 2, "b": 1} -> {"a": 3, "b": 1}; keys in first-seen order."""
    totals: dict = {}
    for counts in dicts:
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
    return totals
