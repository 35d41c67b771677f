"""Compare compiled artifacts: do the tuned records reach the device code?

  python benchmarks/artifact_probe.py A.so B.so ...
Prints, per artifact, the device modules it imports, the number of kernels and a digest of their source.
"""
import hashlib
import re
import sys

import tvm


def describe(path):
    mod = tvm.runtime.load_module(path)
    stack, rows = [mod], []
    while stack:
        m = stack.pop()
        stack.extend(m.imports if hasattr(m, "imports") else m.imported_modules)
        try:
            src = m.inspect_source() if hasattr(m, "inspect_source") else m.get_source()
        except Exception:
            src = ""
        kind = getattr(m, "kind", None) or getattr(m, "type_key", "?")
        kernels = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)', src)
        rows.append((str(kind), len(src), len(kernels), hashlib.sha1(src.encode()).hexdigest()[:10], kernels[:40]))
    return rows


for path in sys.argv[1:]:
    print(path)
    for kind, size, n, digest, kernels in describe(path):
        print(f"  {kind}: {size} chars, {n} kernels, sha1 {digest}")
        if kernels:
            print("   ", " ".join(kernels))
