"""tunekit registers the target's tensor intrinsics with a cheaper frame stack for TVMScript's parser
(metaschedule_env._lazy_frame_stacks). What it registers must be what TVM's own import registers. Each import
runs in a process of its own: an intrinsic is registered once per process."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # two fresh processes, each registering every CUDA tensor intrinsic

_DIGEST = """
import hashlib, sys
import tvm
from tvm.s_tir import TensorIntrin
if sys.argv[1] == "tunekit":
    from tunekit.metaschedule_env import import_for_target
    import_for_target("cuda")
else:
    import tvm.s_tir.tensor_intrin.cuda
cuda = sys.modules["tvm.s_tir.tensor_intrin.cuda"]
names = sorted(getattr(cuda, n) for n in dir(cuda) if n.endswith("_INTRIN") and isinstance(getattr(cuda, n), str))
digest, count = hashlib.sha1(), 0
for name in names:
    intrin = TensorIntrin.get(name, allow_missing=True)
    if intrin is not None:
        count += 1
        digest.update(name.encode())
        digest.update(tvm.ir.save_json(intrin.desc).encode())
        digest.update(tvm.ir.save_json(intrin.impl).encode())
from tvm.tirx.script.parser import entry
import inspect
print(count, digest.hexdigest(), entry.inspect is inspect)
"""


def _registered(*hows: str) -> list[list[str]]:
    """Each import's (count, digest, parser restored), the processes side by side (each keeps one core busy)."""
    procs = [subprocess.Popen([sys.executable, "-c", _DIGEST, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for how in hows]
    found = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        found.append(out.split())
    return found


def test_the_cuda_tensor_intrinsics_are_registered_as_tvms_own_import_registers_them():
    (count, digest, restored), tvms = _registered("tunekit", "tvm")
    assert int(count) > 50  # mma, ldmatrix and wmma of several dtypes and shapes
    assert restored == "True"  # the parser's `inspect` is the real one again after the import
    assert [count, digest] == tvms[:2]
