"""The held-out models of the GPU benchmarks, built from torchvision / transformers with random
weights (seed 0; torchvision's BatchNorm statistics calibrated on random inputs), and their export
to ONNX. Runs where torch is installed (the device machine).

  python benchmarks/torch_models.py export --model resnet18 --out /tmp/vs/resnet18.onnx
  python benchmarks/torch_models.py time --model resnet18 --variants eager-fp32,graphs-fp16 --repeats 200

`time` prints one JSON line per variant: {"variant", "median_ms", "p90_ms", "sm_count", "errors"}. Run it in
a process pinned to the share (benchmarks/vs_pytorch.py sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).
`errors` is the variant's own numerical error, per output, against the same model in fp32 on the CPU,
measured the way tunekit's numerics gate measures its artifacts (tunekit.numerics.compare: max abs
error, max rel error over the reference's largest magnitude, cosine). It says what bound PyTorch's fp16
itself would pass on these random-weight models.
fp32 variants run with TF32 tensor cores allowed for matmuls and convs (PyTorch's cuDNN default;
set for matmuls too), which is what a PyTorch user gets.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "bert")
VARIANTS = ("eager-fp32", "graphs-fp32", "compile-fp32", "eager-fp16", "graphs-fp16", "compile-fp16")
BERT_SEQ = 128


def build(name: str):
    """(module in eval mode, example inputs tuple, input names)."""
    import torch

    torch.manual_seed(0)
    if name == "bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(), add_pooling_layer=True).eval()
        ids = torch.randint(0, 30000, (1, BERT_SEQ), dtype=torch.int64)
        mask = torch.ones(1, BERT_SEQ, dtype=torch.int64)
        return model, (ids, mask), ["input_ids", "attention_mask"]
    import torchvision

    model = getattr(torchvision.models, name)(weights=None)
    _calibrate_batch_norm(model)
    return model.eval(), (torch.randn(1, 3, 224, 224),), ["x"]


def _calibrate_batch_norm(model, *, batches: int = 4) -> None:
    """Give BatchNorm the running statistics of the random network's own activations, as training
    would. With torchvision's fresh statistics (mean 0, variance 1) MobileNetV2's activations shrink
    layer by layer to logits of ~1e-9, below fp16's range, so its fp16 build fails any numerics
    check (cosine 0). The weights stay random (seed 0); only the BN statistics change."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, 3, 224, 224))


def export(name: str, out: str) -> None:
    import torch

    model, inputs, names = build(name)
    if name == "bert":
        class Wrapped(torch.nn.Module):  # plain tensors out: (last_hidden_state, pooler_output)
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask):
                result = self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
                return result[0], result[1]

        model = Wrapped(model).eval()
        outputs = ["last_hidden_state", "pooler_output"]
    else:
        outputs = ["logits"]
    with torch.no_grad():
        try:
            torch.onnx.export(model, inputs, out, input_names=names, output_names=outputs, opset_version=17,
                              dynamo=False)
        except Exception as exc:  # transformers 5 may not trace with the legacy exporter: the dynamo one
            print(f"legacy export failed ({type(exc).__name__}: {str(exc)[:200]}); using dynamo=True",
                  file=sys.stderr)
            torch.onnx.export(model, inputs, out, input_names=names, output_names=outputs, opset_version=18,
                              dynamo=True, external_data=False)
    print(json.dumps({"model": name, "onnx": out}))


def _timed(fn, repeats: int) -> list[float]:
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)


def _callable(variant: str, model, inputs):
    """(run, outputs): `run()` runs the variant once; `outputs()` is what its last run returned."""
    import torch

    mode, dtype = variant.split("-")
    if dtype == "fp16":
        model = model.half()
        inputs = tuple(x.half() if x.is_floating_point() else x for x in inputs)
    last = {}
    if mode == "compile":
        compiled = torch.compile(model)
        return (lambda: last.__setitem__("out", compiled(*inputs))), lambda: last["out"]
    if mode == "graphs":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(*inputs)  # a replay rewrites these tensors in place
        return graph.replay, lambda: static_out
    return (lambda: last.__setitem__("out", model(*inputs))), lambda: last["out"]


def _flat(out) -> list:
    """A model's outputs as a list of numpy float64 arrays (BERT returns an object with two tensors)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out.detach().float().cpu().double().numpy()]
    if isinstance(out, dict) or hasattr(out, "values"):
        out = list(out.values())
    return [t.detach().float().cpu().double().numpy() for t in out if isinstance(t, torch.Tensor)]


def _errors(outputs: list, reference: list) -> list[dict]:
    from tunekit.numerics import compare

    return [{k: float(f"{v:.6g}") for k, v in compare(a, b).items() if k != "error"}
            for a, b in zip(outputs, reference)]


def _cpu_reference(name: str) -> list:
    """The model's outputs in fp32 on the CPU (no TF32), the reference for every variant's error."""
    import torch

    model, inputs, _ = build(name)
    with torch.inference_mode():
        return _flat(model(*inputs))


def time_variants(name: str, variants: list[str], repeats: int) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        reference = _cpu_reference(name)
    except Exception as exc:  # the timings still count without it
        print(f"no CPU reference for {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        reference = None
    for variant in variants:
        model, inputs, _ = build(name)
        model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
        try:
            with torch.inference_mode():
                run, outputs = _callable(variant, model, inputs)
                times = _timed(run, repeats)
                errors = _errors(_flat(outputs()), reference) if reference else None
            row = {"variant": variant, "median_ms": times[len(times) // 2], "p90_ms": times[int(len(times) * 0.9)],
                   "sm_count": sm, "errors": errors}
        except Exception as exc:  # one variant failing (e.g. compile) must not lose the others
            row = {"variant": variant, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["export", "time"])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--out")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    if args.action == "export":
        export(args.model, args.out)
    else:
        time_variants(args.model, [v for v in args.variants.split(",") if v], args.repeats)


if __name__ == "__main__":
    sys.exit(main())
