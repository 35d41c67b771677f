"""The models of the GPU benchmarks, built from torchvision / timm / transformers with random weights
(seed 0; BatchNorm statistics calibrated on random inputs of the model's own shapes), their export to
ONNX and PyTorch's timings of them. Any model of the zoo (benchmarks/zoo.py: ZOO says how each is built,
what it takes and what it returns; `bert` is the zoo's bert_base). The one place that builds them. Runs
where torch is installed (the device machine).

  python benchmarks/torch_models.py export --model resnet18 --out /tmp/vs/resnet18.onnx
  python benchmarks/torch_models.py time --model resnet18 --variants eager-fp32,graphs-fp16 --repeats 200
  python benchmarks/torch_models.py time --model efficientnet_b0 --variants graphs-fp16,maxautotune-fp16 --channels-last

Variants are MODE-fp32 or MODE-fp16, MODE one of eager, graphs (CUDA graphs), compile (torch.compile) and
maxautotune (torch.compile(mode="max-autotune"), CUDA graphs included).

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
import contextlib
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("resnet18", "resnet50", "mobilenet_v2", "bert")  # vs_pytorch's models; any zoo model builds too
ALIASES = {"bert": "bert_base"}  # the earlier name of the zoo's BERT-base
VARIANTS = ("eager-fp32", "graphs-fp32", "compile-fp32", "eager-fp16", "graphs-fp16", "compile-fp16")
MODES = ("eager", "graphs", "compile", "maxautotune")  # maxautotune: torch.compile(mode="max-autotune")


def _zoo() -> dict:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from zoo import BY_NAME

    return BY_NAME


def entry(name: str):
    """The zoo's entry (benchmarks/zoo.py: source, arch, inputs, outputs, exporter) of a model name or alias."""
    name = ALIASES.get(name, name)
    if name not in _zoo():
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(model_names())}")
    return _zoo()[name]


def spec(name: str):
    """What builds the model: its entry, or for an export variant (vit_b_16_dynamo) its base model's."""
    found = entry(name)
    return _zoo()[found.base] if found.base else found


def model_names() -> list[str]:
    return [*ALIASES, *_zoo()]


def build(name: str):
    """(module in eval mode, example inputs tuple, input names) of a zoo model: random weights (seed 0),
    BatchNorm statistics calibrated on random inputs of the model's own shapes (batch 8). Transformers
    models are wrapped to take their inputs by position and return plain tensors (the zoo's outputs)."""
    import torch

    model_spec = spec(name)
    torch.manual_seed(0)
    model = BUILDERS[model_spec.source](model_spec)
    _no_zero_layers(model)
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        _calibrate_batch_norm(model, batch=lambda: make_inputs(model_spec.inputs, batch=8))
    inputs = make_inputs(model_spec.inputs)
    return model.eval(), inputs, [i.name for i in model_spec.inputs]


def make_inputs(specs, *, batch: int | None = None) -> tuple:
    """Random inputs (torch's global RNG, in order): randn floats, int64 ids in [0, high), int64 ones."""
    import torch

    tensors = []
    for spec_ in specs:
        shape = (batch, *spec_.shape[1:]) if batch else tuple(spec_.shape)
        if spec_.fill == "ids":
            tensors.append(torch.randint(0, spec_.high, shape, dtype=torch.int64))
        elif spec_.fill == "ones":
            tensors.append(torch.ones(shape, dtype=torch.int64))
        else:
            tensors.append(torch.randn(shape))
    return tuple(tensors)


def _torchvision(model_spec):
    import torchvision

    return getattr(torchvision.models, model_spec.arch)(weights=None, **model_spec.options)


def _timm(model_spec):
    import timm

    return timm.create_model(model_spec.arch, pretrained=False, **model_spec.options)


def _transformers(model_spec):
    """Built from its Config class (the library's defaults are the base models' sizes): no download."""
    import transformers

    options = dict(model_spec.options)
    config = getattr(transformers, options.pop("config"))(**options.pop("config_kwargs", {}))
    submodule = options.pop("submodule", None)
    model = getattr(transformers, model_spec.arch)(config, **options)
    if submodule:
        model = getattr(model, submodule)
    return _positional(model, [i.name for i in model_spec.inputs], list(model_spec.outputs))


def _positional(inner, input_names: list[str], output_names: list[str]):
    import torch

    class Positional(torch.nn.Module):
        """A transformers model taking its inputs by position and returning its named outputs as tensors."""

        def __init__(self, inner, input_names, output_names):
            super().__init__()
            self.inner, self.input_names, self.output_names = inner, input_names, output_names

        def forward(self, *args):
            out = self.inner(**dict(zip(self.input_names, args)))
            tensors = tuple(out[n] for n in self.output_names)
            return tensors[0] if len(tensors) == 1 else tensors

    return Positional(inner, input_names, output_names)


BUILDERS = {"torchvision": _torchvision, "timm": _timm, "transformers": _transformers}


def _no_zero_layers(model) -> None:
    """Weights a library initializes to zero get random values (std 0.02), and zero normalization scales ones.
    torchvision's ViT starts with a zero head, so its logits were all zero: every build and every PyTorch variant
    then matched the reference exactly, and no numerics check could fail. timm's zero_init_last does the same to
    a residual branch's last BatchNorm."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.nn.Parameter) or weight.numel() == 0 or weight.any():
                continue
            if isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)):
                weight.normal_(0.0, 0.02)
            elif isinstance(module, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)):
                weight.fill_(1.0)


def _calibrate_batch_norm(model, *, batch, batches: int = 4) -> None:
    """Give BatchNorm the running statistics of the random network's own activations, as training
    would. With torchvision's fresh statistics (mean 0, variance 1) MobileNetV2's activations shrink
    layer by layer to logits of ~1e-9, below fp16's range, so its fp16 build fails any numerics
    check (cosine 0). The weights stay random (seed 0); only the BN statistics change. `batch()`: one
    batch of random inputs (batch 8 of the model's input shapes)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(*batch())


def export(name: str, out: str) -> dict:
    """torch.onnx.export(dynamo=False, opset 17), or dynamo=True (opset 18) for a zoo entry that asks for it
    (vit_b_16_dynamo). Where the legacy exporter cannot trace a model (transformers 5 may not), the dynamo
    one, and the line says so (`note`)."""
    import torch

    model, inputs, names = build(name)
    outputs, note = list(spec(name).outputs), None
    with torch.no_grad():
        if not entry(name).dynamo:
            try:
                with _no_mha_fastpath():  # nn.MultiheadAttention's fused path has no legacy ONNX export
                    torch.onnx.export(model, inputs, out, input_names=names, output_names=outputs,
                                      opset_version=17, dynamo=False)
                return _exported(name, out, "legacy (dynamo=False)")
            except Exception as exc:
                note = f"legacy export failed ({type(exc).__name__}: {str(exc).strip()[:200]}); used dynamo=True"
                print(note, file=sys.stderr)
        torch.onnx.export(model, inputs, out, input_names=names, output_names=outputs, opset_version=18,
                          dynamo=True, external_data=False)
    return _exported(name, out, "dynamo", note)


@contextlib.contextmanager
def _no_mha_fastpath():
    """torchvision's ViT (nn.MultiheadAttention) in eval under no_grad takes aten::_native_multi_head_attention,
    which the legacy exporter refuses; without the fast path it traces as matmuls and softmax."""
    import torch

    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def _exported(name: str, out: str, exporter: str, note: str | None = None) -> dict:
    row = {"model": name, "onnx": out, "exporter": exporter, "note": note}
    print(json.dumps(row), flush=True)
    return row


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
    if mode in ("compile", "maxautotune"):
        compiled = torch.compile(model, mode="max-autotune" if mode == "maxautotune" else None)
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


def _cpu_reference(model, inputs) -> list:
    """The model's outputs in fp32 on the CPU (no TF32), the reference for every variant's error."""
    import torch

    with torch.inference_mode():
        return _flat(model(*inputs))


def time_variants(name: str, variants: list[str], repeats: int, *, channels_last: bool = False) -> None:
    """One JSON line per variant. channels_last: the model and its 4-d inputs in channels_last, with
    cudnn.benchmark on (what a PyTorch user does for a CNN)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = channels_last
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    built, built_inputs, _ = build(name)  # once: each variant gets a copy (BatchNorm calibration is CPU work)
    try:
        reference = _cpu_reference(copy.deepcopy(built), built_inputs)
    except Exception as exc:  # the timings still count without it
        print(f"no CPU reference for {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        reference = None
    for variant in variants:
        model, inputs = _on_gpu(copy.deepcopy(built), tuple(x.clone() for x in built_inputs),
                                channels_last=channels_last)
        try:
            with torch.inference_mode():
                run, outputs = _callable(variant, model, inputs)
                times = _timed(run, repeats)
                errors = _errors(_flat(outputs()), reference) if reference else None
            row = {"variant": variant, "median_ms": times[len(times) // 2], "p90_ms": times[int(len(times) * 0.9)],
                   "sm_count": sm, "errors": errors, "channels_last": channels_last}
        except Exception as exc:  # one variant failing (e.g. compile) must not lose the others
            first = (str(exc).strip().splitlines() or [""])[0]
            row = {"variant": variant, "error": f"{type(exc).__name__}: {first[:200]}"}
        print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()


def _on_gpu(model, inputs, *, channels_last: bool):
    import torch

    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)
    return model, inputs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["export", "time"])
    parser.add_argument("--model", choices=model_names(), required=True, metavar="MODEL",
                        help="a zoo model (benchmarks/zoo.py), or bert (the zoo's bert_base)")
    parser.add_argument("--out")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"MODE-fp32|fp16, MODE one of {', '.join(MODES)}")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--channels-last", action="store_true",
                        help="time: model and 4-d inputs in channels_last, cudnn.benchmark on")
    args = parser.parse_args(argv)
    if args.action == "export":
        export(args.model, args.out)
    else:
        time_variants(args.model, [v for v in args.variants.split(",") if v], args.repeats,
                      channels_last=args.channels_last)


if __name__ == "__main__":
    sys.exit(main())
