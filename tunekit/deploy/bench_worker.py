"""Time a compiled model inside a process pinned to a share (started by tunekit.deploy.bench).

Run: python -m tunekit.deploy.bench_worker REQUEST.json
REQUEST: {"artifact", "inputs" (.npz, keys = input names), "outputs" (.npz to write), "repeats", "warmup"}
Prints one JSON line: every timed call's latency in ms and what the process saw of the device
(cores it is pinned to; on CUDA the SM count the MPS share leaves it). Exit code 2 with
{"error": one line} for a problem with the artifact or the inputs.
"""
from __future__ import annotations

import json
import os
import sys

from ..errors import TunekitError
from .arrays import to_tvm
from .model import flatten_outputs, load
from .npzfiles import read_npz, write_npz


def device_seen(model) -> dict:
    dev = model.device.tvm_device()
    seen = {"device": str(model.device), "cores": len(os.sched_getaffinity(0)),
            "core_ids": sorted(os.sched_getaffinity(0)), "tvm_num_threads": os.environ.get("TVM_NUM_THREADS")}
    if model.device.kind == "cuda":
        seen.update({"sm_count": int(dev.multi_processor_count), "gpu_name": dev.device_name})
    return seen


def time_calls(model, tensors: list, *, repeats: int, warmup: int) -> list[float]:
    """Latency of `repeats` calls, each timed on its own (so percentiles mean something), after
    `warmup` calls that fill caches, load kernels and (CUDA graphs) capture."""
    dev = model.device.tvm_device()
    main = model.vm[model.entry]
    for _ in range(warmup):
        main(*tensors)
    dev.sync()
    # number=1: one call per sample; TVM times it in C++ and synchronises the device around it.
    timer = model.vm.time_evaluator(model.entry, dev, number=1, repeat=repeats, min_repeat_ms=0)
    return [float(s) * 1e3 for s in timer(*tensors).results]


def run(request: dict) -> dict:
    model = load(request["artifact"], variant=request.get("variant", "auto"))
    arrays = read_npz(request["inputs"])
    values = model.bind((), arrays)  # the same checks a caller gets, in main's order
    tensors = [to_tvm(value, device=model.device) for value in values]
    outputs = [tensor.numpy() for tensor in flatten_outputs(model.vm[model.entry](*tensors))]
    write_npz(request["outputs"], {spec.name: out for spec, out in zip(model.outputs, outputs)})
    latencies = time_calls(model, tensors, repeats=int(request["repeats"]), warmup=int(request["warmup"]))
    return {"latencies_ms": latencies, **device_seen(model), **model.choice.to_dict()}


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    with open(args[0]) as fh:
        request = json.load(fh)
    try:
        result = run(request)
    except TunekitError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
