"""A candidate's output compared with its reference's on the runner server, where both tensors are.

The reference check (clients.session_runner) used to copy both over the RPC link to the client for every candidate:
for GPT-2's LM head at sequence 512, 2 x 103 MB of fp32 logits per Triton tile. The warm server registers COMPARE at
start-up; a client calls it on the two tensors and gets numerics.compare's row back, a few numbers.
"""
from __future__ import annotations

import json

COMPARE = "tunekit.compare_outputs"


def register() -> None:
    """In the server's process: COMPARE(mine, theirs) -> numerics.compare's row as JSON."""
    import tvm_ffi

    from ..numerics import compare

    def compare_here(mine, theirs) -> str:
        return json.dumps(compare(mine.numpy(), theirs.numpy()))

    tvm_ffi.register_global_func(COMPARE, compare_here, override=True)


def remote_compare(session):
    """The session's server's COMPARE as a function of two of its tensors returning the row, or None where the server
    has none (a stock TVM RPC server)."""
    try:
        function = session.get_function(COMPARE)
    except Exception:  # TVM's "function not found" is a plain error
        return None
    return lambda mine, theirs: json.loads(function(mine, theirs))
