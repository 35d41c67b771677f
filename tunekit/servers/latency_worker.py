"""Time a compiled model inside a process pinned to a share (started by servers.latency).

Run: python -m tunekit.servers.latency_worker ARTIFACT INPUTS.npz DEVICE REPEATS OUTPUTS.npz [MAX_TIMING_S]
Prints one JSON line: median/mean/std latency in ms, the repeats timed and, on CUDA, the SM count
this process sees. With MAX_TIMING_S, a slow model gets fewer repeats (never under MIN_REPEATS), so
that timing takes about that long: ResNet-18 on one CPU core runs 1.4 s, and 20 repeats of it, for
the untuned and again the tuned build, were 57 s of a 93 s `tunekit tune` of 25 s of tuning.
"""
import json
import os
import sys

import numpy as np

MIN_REPEATS = 5


def main(argv=None):
    args_in = (argv or sys.argv[1:])
    artifact, inputs_path, device, repeats, outputs_path = args_in[:5]
    max_timing_s = float(args_in[5]) if len(args_in) > 5 else None
    import tvm
    from tvm import relax

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(artifact), dev)
    with np.load(inputs_path) as data:
        args = [tvm.runtime.tensor(data[name], dev) for name in data.files]
    choice = _variant(vm, dev, args, artifact)
    entry = choice.entry
    result = vm[entry](*args)
    outs = result if isinstance(result, (list, tuple)) or type(result).__name__ == "Array" else [result]
    np.savez(outputs_path, *[o.numpy() for o in outs])
    repeats = int(repeats)
    costs = []
    if max_timing_s is not None and repeats > MIN_REPEATS:
        costs = list(vm.time_evaluator(entry, dev, number=1, repeat=1, min_repeat_ms=0)(*args).results)
        repeats = max(MIN_REPEATS, min(repeats, int(max_timing_s / max(costs[0], 1e-9))))
    timer = vm.time_evaluator(entry, dev, number=1, repeat=repeats - len(costs), min_repeat_ms=0)
    costs = np.array(costs + list(timer(*args).results)) * 1e3
    info = {"median_ms": float(np.median(costs)), "mean_ms": float(costs.mean()), "std_ms": float(costs.std()),
            "repeats": len(costs)}
    if choice.label:
        info.update(choice.to_dict())
    if device == "cuda":
        info["sm_count"] = int(dev.multi_processor_count)
    print(json.dumps(info))


def _variant(vm, dev, args, artifact: str):
    """A share-robust artifact (its metadata lists variants) runs the variant fastest here, chosen as
    tunekit.load chooses it; any other artifact runs `main`."""
    from tunekit.deploy.variants import choose_variant, variants_of

    variants = {}
    meta_path = os.path.splitext(artifact)[0] + ".json"
    if os.path.isfile(meta_path):
        with open(meta_path) as fh:
            variants = variants_of(json.load(fh))
    return choose_variant(vm, dev, args, variants)


if __name__ == "__main__":
    main()
