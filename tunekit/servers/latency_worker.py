"""Time a compiled model inside a process pinned to a share (started by servers.latency).

Run: python -m tunekit.servers.latency_worker ARTIFACT INPUTS.npz DEVICE REPEATS OUTPUTS.npz
Prints one JSON line: median/mean/std latency in ms and, on CUDA, the SM count this process sees.
"""
import json
import sys

import numpy as np


def main(argv=None):
    artifact, inputs_path, device, repeats, outputs_path = (argv or sys.argv[1:])[:5]
    import tvm
    from tvm import relax

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(artifact), dev)
    with np.load(inputs_path) as data:
        args = [tvm.runtime.tensor(data[name], dev) for name in data.files]
    result = vm["main"](*args)
    outs = result if isinstance(result, (list, tuple)) or type(result).__name__ == "Array" else [result]
    np.savez(outputs_path, *[o.numpy() for o in outs])
    timer = vm.time_evaluator("main", dev, number=1, repeat=int(repeats), min_repeat_ms=0)
    costs = np.array(timer(*args).results) * 1e3
    info = {"median_ms": float(np.median(costs)), "mean_ms": float(costs.mean()), "std_ms": float(costs.std()),
            "repeats": int(repeats)}
    if device == "cuda":
        info["sm_count"] = int(dev.multi_processor_count)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
