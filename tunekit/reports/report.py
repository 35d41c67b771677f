"""report.json: written atomically so an interrupted run never leaves half a report."""
from __future__ import annotations

import json
import os


def write_report(report: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, "report.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
