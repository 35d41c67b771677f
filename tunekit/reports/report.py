"""report.json: written atomically so an interrupted run never leaves half a report."""
from __future__ import annotations

import os

from ..atomic import write_json_atomic


def write_report(report: dict, out_dir: str) -> str:
    return write_json_atomic(os.path.join(out_dir, "report.json"), report)
