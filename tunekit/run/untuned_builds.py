"""The untuned model's builds in one run, so that shares which prepare the same module for the same
target (the shares of one GPU) compile it once and copy it after that."""
from __future__ import annotations

import os
import shutil
from typing import Callable, Hashable


class UntunedBuilds:
    def __init__(self):
        self._paths: dict[Hashable, str] = {}  # key -> the file its build was written to

    def build(self, path: str, write: Callable[[], None], *, key: Hashable | None) -> None:
        """Put a build at `path`. `key` None: a build to make every time (one with records); else the
        untuned build of that key, copied from its first build when there is one. `write()` writes
        `path`. A file that is written over stops standing for the build it held: the fp32 fallback
        was compiled to the path where the fp16 build was kept, and the next share then timed and
        checked the fp32 build as its fp16 model."""
        if key is not None and key in self._paths:
            if self._paths[key] != path:  # the same path: it holds that build already (built ahead)
                shutil.copyfile(self._paths[key], path + ".tmp")
                os.replace(path + ".tmp", path)
            return
        self._paths = {k: p for k, p in self._paths.items() if p != path}
        write()
        if key is not None:
            self._paths[key] = path
