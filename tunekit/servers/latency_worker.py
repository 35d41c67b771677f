"""Time a compiled model inside a process pinned to a share (started by servers.latency).

Two ways to run it:
- once: python -m tunekit.servers.latency_worker ARTIFACT INPUTS.npz DEVICE REPEATS OUTPUTS.npz [MAX_TIMING_S]
  prints one JSON line: median/mean/std latency in ms, the repeats timed and, on CUDA, the SM count
  this process sees;
- serving: python -m tunekit.servers.latency_worker --serve DEVICE
  imports TVM (and opens the device) at once, then answers one request per stdin line, a JSON
  object {artifact, inputs, repeats, outputs, max_timing_s}, with one stdout line REPLY + JSON
  ({"ok": true, "info": ...} or {"ok": false, "error": ...}). A tuning run keeps one such process
  per share from the session's start (servers.latency.LatencyProcess): the untuned and the tuned
  model, the build without CUDA graphs and the robust step's artifacts are all timed by it, and its
  start (TVM import, a CUDA context under MPS) overlaps the untuned model's compile.

With MAX_TIMING_S, a slow model gets fewer repeats (never under MIN_REPEATS), so that timing takes
about that long: ResNet-18 on one CPU core runs 1.4 s, and 20 repeats of it, for the untuned and
again the tuned build, were 57 s of a 93 s `tunekit tune` of 25 s of tuning.
"""
import json
import os
import sys

import numpy as np

MIN_REPEATS = 5
READY = "TUNEKIT-LATENCY-READY"
REPLY = "TUNEKIT-LATENCY-REPLY "


def time_artifact(artifact: str, inputs_path: str, device: str, repeats: int, outputs_path: str,
                  max_timing_s: float | None) -> dict:
    """Load `artifact`, write its outputs on the inputs to `outputs_path`, time it: the JSON info."""
    import tvm
    from tvm import relax

    from tunekit.deploy.library import load_library

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(load_library(artifact), dev)
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
    return info


def serve(device: str) -> None:
    """Answer timing requests from stdin until it closes; one model loaded at a time (a served
    process holds no model between requests: its GPU memory goes back after each)."""
    import tvm

    if device == "cuda":
        tvm.cuda(0).exist  # noqa: B018 - opens the CUDA context (under MPS: at the share) before any request
    print(READY, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            info = time_artifact(request["artifact"], request["inputs"], device, request["repeats"],
                                 request["outputs"], request.get("max_timing_s"))
            reply = {"ok": True, "info": info}
        except Exception as exc:  # the artifact's error, for the caller's one-line message
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
        print(REPLY + json.dumps(reply), flush=True)


def main(argv=None):
    args_in = (argv or sys.argv[1:])
    if args_in and args_in[0] == "--serve":
        serve(args_in[1])
        return
    artifact, inputs_path, device, repeats, outputs_path = args_in[:5]
    max_timing_s = float(args_in[5]) if len(args_in) > 5 else None
    print(json.dumps(time_artifact(artifact, inputs_path, device, int(repeats), outputs_path, max_timing_s)))


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
