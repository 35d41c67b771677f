"""Files written whole or not at all: a crash mid-write never leaves half a report or record file."""
from __future__ import annotations

import json
import os


def write_json_atomic(path: str, data, *, indent: int = 2) -> str:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=indent, sort_keys=False, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
