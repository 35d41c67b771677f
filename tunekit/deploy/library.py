"""Load a compiled artifact (`.so`) into this process as the file is now.

dlopen matches a library it has already loaded by its path name: loading a path again returns the
library loaded the first time, even after the file was replaced. One process loads several
artifacts at one path in two places: the latency worker that times every artifact of a share for a
whole run (servers.latency), where `--precision auto` builds the untuned model again in fp32 at the
path of the refused fp16 build, and a user's session that loads a model, tunes it again, and loads
it again. Without a fresh load the fp32 fallback would be timed and checked as the fp16 build it
replaced. So every load opens a private copy under a name of its own.
"""
from __future__ import annotations

import os
import shutil
import tempfile


def load_library(path: str):
    """`tvm.runtime.load_module(path)` of the file as it is now, never a library loaded earlier."""
    import tvm

    with tempfile.TemporaryDirectory(prefix="tunekit-load-") as tmp:
        private = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, private)
        # the copy can go once loaded: dlopen has mapped it, and TVM has read the device code out of it
        return tvm.runtime.load_module(private)
