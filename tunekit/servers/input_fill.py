"""A candidate's random inputs, every element of them filled on the runner server.

TVM's random_fill_for_measure splits a tensor into `size // threads` elements a thread and leaves the last
`size % threads` as they were: uninitialised host memory, at times NaN. A Triton attention reading a partly filled
300-element mask propagated that NaN to its whole output, its hand-written reference dropped it, and every Triton
tile was refused as wrong at the share in some runs (benchmarks/results/h200-input-fill-nan).
"""
from __future__ import annotations

FILL = "tunekit.fill_input"
STOCK_FILL = "tvm.contrib.random.random_fill_for_measure"
_NUMPY_DTYPES = ("float16", "float32", "float64")
_CACHE_BYTES = 1 << 29  # a server's (a share runs several): the largest task's inputs, GPT-2 512's LM head, ~180 MB


def register() -> None:
    """In the server's process: FILL(tensor) fills it with values in [1, 10), as TVM's fill does, every element."""
    import numpy as np
    import tvm
    import tvm_ffi

    stock = tvm.get_global_func(STOCK_FILL)
    rng = np.random.default_rng()
    cache: dict = {}  # (shape, dtype) -> host array: generated once, copied for every candidate with that input

    def fill_here(tensor) -> None:
        dtype = str(tensor.dtype)
        if dtype not in _NUMPY_DTYPES:  # bfloat16 and the like: numpy has no such type
            stock(tensor)
            return
        key = (tuple(int(x) for x in tensor.shape), dtype)
        host = cache.get(key)
        if host is None:
            if sum(a.nbytes for a in cache.values()) > _CACHE_BYTES:
                cache.clear()
            host = cache[key] = rng.uniform(1.0, 10.0, size=key[0]).astype(dtype)
        tensor.copyfrom(host)

    tvm_ffi.register_global_func(FILL, fill_here, override=True)


def remote_fill(session):
    """The session's server's FILL, or TVM's own fill where the server has none (a stock TVM RPC server)."""
    try:
        return session.get_function(FILL)
    except Exception:  # TVM's "function not found" is a plain error
        return session.get_function(STOCK_FILL)
