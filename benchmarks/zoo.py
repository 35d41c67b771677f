"""The model zoo (issue 55): 31 models a user brings, from torchvision, timm and transformers, with random
weights (seed 0; BatchNorm statistics calibrated on random inputs, benchmarks/torch_models.py), batch 1,
exported by this script, then checked, tuned and timed against PyTorch. One command, with steps:

  export    each model to <work>/models/<name>.onnx (torch.onnx.export dynamo=False, opset 17; where the
            legacy exporter cannot trace a model, dynamo=True, opset 18, and the row says so); --dynamo-vit
            also exports vit_b_16 with dynamo=True as vit_b_16_dynamo. --compact also writes
            <work>/compact/<name>.onnx.xz: the same graph with each weight filled with one constant
            (write_compact), xz-compressed, so that a few MB carry the zoo's structure to a CPU machine
            for `tunekit check`. A compact model's NUMERICS ARE MEANINGLESS (its outputs, its numerics
            gate): it is for the structure (import, precision, tasks, design spaces, builds) only.
  check     `tunekit check MODEL --gpu-arch sm_90 --json` per model (exit, JSON kept whole, seconds)
  cpu-tune  `tunekit tune MODEL --cpu-pct 100 --trials 8 --json` on the small models
  gpu       `tunekit tune MODEL --gpu-pct 40 --time-budget 120 --resume`, `tunekit bench` of the artifact
            (--compare-onnx) at the same share, and PyTorch's variants (torch_models.py time: eager, CUDA
            graphs, torch.compile max-autotune; fp32 (TF32) and fp16; channels_last + cudnn.benchmark for
            CNNs) at 40% and 100%, each with its error against the model in fp32 on the CPU
  table     one Markdown table of everything recorded

Every step appends one row per model to <work>/zoo.jsonl and skips a model whose row for that step is
there (--redo runs it again; the newest row wins). One model failing never stops the sweep: its row
holds the error line. The gpu step's parts (gpu-tune, gpu-bench, torch-gpu40, torch-gpu100) are rows
of their own, so a device call of <= 10 minutes (--call-s) goes on where the last one stopped.

Device time: a model's tune is --time-budget plus 1-3 min (untuned build, final build, numerics), its bench
under a minute, PyTorch's eager and graphs variants a minute; torch.compile(mode="max-autotune") autotunes
for ~3 min per model and dtype (ResNet-18, H200), so the default six variants at two shares cost ~10 more
minutes a model (--compile-pcts 40 or --torch-variants cut that). The export of all 31 took 4.5 min (4 in
parallel, --models subsets in separate --work dirs; `cat */zoo.jsonl` merges them).

On the device (torch, torchvision, timm, transformers, onnxruntime; tunekit installed):
  python3 benchmarks/zoo.py export --work /tmp/zoo --compact --dynamo-vit
  tar -cf $OUT/zoo-compact.tar -C /tmp/zoo compact zoo.jsonl     # the compact zoo, a few MB
  python3 benchmarks/zoo.py gpu --work /tmp/zoo --gpu-pct 40 --time-budget 120 --call-s 540  # again until done
  (on a machine of several GPUs, --gpus 0,1 runs one sweep per GPU side by side, each with its own MPS daemon)
  python3 benchmarks/zoo.py table --work /tmp/zoo --out $OUT/zoo.md

On a CPU machine (no torch), with the compact zoo:
  mkdir -p /tmp/zoo && tar -xf zoo-compact.tar -C /tmp/zoo
  .venv/bin/python benchmarks/zoo.py check --work /tmp/zoo --compact --gpu-arch sm_90
  .venv/bin/python benchmarks/zoo.py cpu-tune --work /tmp/zoo --compact
  .venv/bin/python benchmarks/zoo.py table --work /tmp/zoo --out /tmp/zoo/zoo.md [--rows other/zoo.jsonl]
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import lzma
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

FAMILIES = ("vision CNN", "efficient CNN", "vision transformer", "hybrid", "encoder text", "decoder text",
            "speech encoder")
SEQ = 128  # text models' sequence length


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple
    fill: str = "randn"   # randn (float32), ids (int64 in [0, high)), ones (int64)
    high: int = 0


@dataclass(frozen=True)
class Model:
    """One zoo model: how torch_models.py builds it (source, arch, options) and what it takes and returns."""
    name: str
    source: str                # torchvision, timm, transformers
    family: str
    arch: str                  # torchvision/timm constructor, or the transformers model class
    inputs: tuple
    outputs: tuple = ("logits",)
    small: bool = False        # tunable on 2 CPU cores with 8 trials in a couple of minutes
    options: dict = field(default_factory=dict)  # constructor kwargs; transformers: config, config_kwargs, submodule
    base: str | None = None    # built as this model (an export variant of it)
    dynamo: bool = False       # exported with torch.onnx.export(dynamo=True)


def _image(size: int = 224) -> tuple:
    return (Input("x", (1, 3, size, size)),)


def _text(vocab: int, seq: int = SEQ) -> tuple:
    return Input("input_ids", (1, seq), "ids", vocab), Input("attention_mask", (1, seq), "ones")


def _tv(name, family, *, small=False, size=224, **options) -> Model:
    return Model(name, "torchvision", family, name, _image(size), small=small, options=options)


def _timm(name, family, *, small=False, size=224) -> Model:
    return Model(name, "timm", family, name, _image(size), small=small)


def _hf(name, family, arch, config, inputs, outputs=("last_hidden_state",), *, small=False, **options) -> Model:
    return Model(name, "transformers", family, arch, inputs, outputs, small=small,
                 options={"config": config, **options})


CNN, EFFICIENT, VIT, HYBRID = FAMILIES[:4]
ZOO = (
    _tv("resnet18", CNN, small=True), _tv("resnet50", CNN), _tv("densenet121", CNN), _tv("convnext_tiny", CNN),
    _tv("inception_v3", CNN, size=299, init_weights=True), _tv("googlenet", CNN, small=True, init_weights=True),
    _tv("squeezenet1_1", CNN, small=True),
    _tv("mobilenet_v2", EFFICIENT, small=True), _tv("mobilenet_v3_small", EFFICIENT, small=True),
    _tv("mobilenet_v3_large", EFFICIENT, small=True), _tv("efficientnet_b0", EFFICIENT, small=True),
    _tv("efficientnet_v2_s", EFFICIENT), _tv("regnet_y_800mf", EFFICIENT, small=True),
    _tv("shufflenet_v2_x1_0", EFFICIENT, small=True), _tv("mnasnet1_0", EFFICIENT, small=True),
    _tv("vit_b_16", VIT), Model("vit_b_16_dynamo", "torchvision", VIT, "vit_b_16", _image(), base="vit_b_16",
                                dynamo=True),
    _tv("swin_t", VIT), _tv("maxvit_t", HYBRID),
    _timm("deit_small_patch16_224", VIT, small=True), _timm("mobilevit_s", HYBRID, small=True, size=256),
    _timm("efficientformer_l1", HYBRID, small=True), _timm("levit_128s", HYBRID, small=True),
    _timm("convnext_atto", CNN, small=True), _timm("ghostnet_100", EFFICIENT, small=True),
    _hf("bert_base", "encoder text", "BertModel", "BertConfig", _text(30000),
        ("last_hidden_state", "pooler_output"), add_pooling_layer=True),
    _hf("distilbert", "encoder text", "DistilBertModel", "DistilBertConfig", _text(30522)),
    _hf("roberta_base", "encoder text", "RobertaModel", "RobertaConfig", _text(50265), add_pooling_layer=False,
        config_kwargs={"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1,
                       "layer_norm_eps": 1e-5}),
    # with an attention mask (all ones; causal still): without one, transformers 5 looks for packed sequences
    # with aten::diff, which the legacy exporter lacks
    _hf("gpt2", "decoder text", "GPT2LMHeadModel", "GPT2Config", _text(50257), ("logits",),
        config_kwargs={"use_cache": False}),
    # issue 53's long sequences: the same models at 512 tokens (attention's key-tile loop past one block)
    _hf("bert_base_512", "encoder text", "BertModel", "BertConfig", _text(30000, 512),
        ("last_hidden_state", "pooler_output"), add_pooling_layer=True),
    _hf("gpt2_512", "decoder text", "GPT2LMHeadModel", "GPT2Config", _text(50257, 512), ("logits",),
        config_kwargs={"use_cache": False}),
    _hf("wav2vec2_base", "speech encoder", "Wav2Vec2Model", "Wav2Vec2Config", (Input("input_values", (1, 16000)),)),
    _hf("whisper_tiny_encoder", "speech encoder", "WhisperModel", "WhisperConfig",
        (Input("input_features", (1, 80, 3000)),), small=True, submodule="encoder"),
)
BY_NAME = {m.name: m for m in ZOO}
CONV_FAMILIES = (CNN, EFFICIENT, HYBRID)  # PyTorch runs these in channels_last with cudnn.benchmark
COMPILED = ("compile-", "maxautotune-")  # torch.compile variants: max-autotune spends ~3 min a model and dtype
TORCH_VARIANTS = ("eager-fp32", "graphs-fp32", "maxautotune-fp32", "eager-fp16", "graphs-fp16", "maxautotune-fp16")


def selected(models: str | None, *, small_only: bool = False, dynamo_vit: bool = True) -> list[Model]:
    """The zoo in its order, or the --models named (an unknown name is an error); vit_b_16_dynamo only with
    dynamo_vit or by name."""
    if models:
        names = [n for n in models.split(",") if n]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise SystemExit(f"unknown model(s) {', '.join(unknown)}; the zoo: {', '.join(BY_NAME)}")
        chosen = [BY_NAME[n] for n in names]
    else:
        chosen = [m for m in ZOO if dynamo_vit or not m.dynamo]
    return [m for m in chosen if m.small or not small_only]


# ---------------------------------------------------------------- the journal (resume)
class Journal:
    """<work>/zoo.jsonl: one JSON row per model and step, appended; the newest row of a (step, model) wins."""

    def __init__(self, path: str, *, redo: bool = False, retry_failed: bool = False, more: list[str] = ()):
        self.path, self.redo, self.retry_failed = path, redo, retry_failed
        self.rows: dict[tuple[str, str], dict] = {}
        for source in [*more, path]:
            for row in _read_jsonl(source):
                self.rows[(row.get("step"), row.get("model"))] = row

    def get(self, step: str, model: str) -> dict | None:
        return self.rows.get((step, model))

    def todo(self, step: str, model: str) -> bool:
        """Whether the step is still to run for the model: not recorded yet, or --redo, or --retry-failed and
        its row holds an error."""
        row = self.rows.get((step, model))
        return self.redo or row is None or bool(self.retry_failed and row.get("error"))

    def add(self, row: dict) -> dict:
        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **row}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        self.rows[(row["step"], row["model"])] = row
        return row


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            try:
                rows.append(json.loads(line)) if line else None
            except ValueError:  # a line cut off by a killed run: the step runs again
                continue
    return rows


def first_line(text: str | None, *, limit: int = 300) -> str:
    """The first non-empty line of a message (an exception's, a task's reason)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return (lines[0] if lines else "")[:limit]


def last_line(text: str | None, *, limit: int = 300) -> str:
    """The last non-empty line of a process's stderr: where tunekit writes its one-line error."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:limit]


def progress(step: str, name: str, seconds: float, what: str) -> None:
    print(f"[{step}] {name}: {what} ({seconds:.1f} s)", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes
@dataclass
class Ran:
    rc: int | None          # None: timed out
    stdout: str
    stderr: str
    wall_s: float


def run_process(cmd: list[str], *, timeout: float, env: dict | None = None) -> Ran:
    """Run `cmd` in its own process group from the repo root (so `-m tunekit.cli` is this checkout's
    tunekit, as benchmarks/tuning_time.py runs it); on timeout the whole group is ended."""
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Ran(proc.returncode, out, err, time.time() - started)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Ran(None, out or "", err or "", time.time() - started)


def tunekit_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tunekit.cli", *args]


def json_out(text: str) -> dict | None:
    """A command's --json payload (stdout), or None when it printed none."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        start = text.find("{")
        try:
            return json.loads(text[start:]) if start >= 0 else None
        except ValueError:
            return None


def error_of(ran: Ran, *, timeout: float) -> str | None:
    if ran.rc is None:
        return f"timed out after {timeout:.0f} s"
    if ran.rc != 0:
        return last_line(ran.stderr) or f"exit {ran.rc}"
    return None


# ---------------------------------------------------------------- paths and the machine
def onnx_path(work: str, name: str) -> str:
    return os.path.join(work, "models", f"{name}.onnx")


def compact_path(work: str, name: str) -> str:
    return os.path.join(work, "compact", f"{name}.onnx.xz")


@contextlib.contextmanager
def model_file(work: str, name: str, *, compact: bool):
    """The model's ONNX file: the exported one, or its compact copy decompressed into a temporary folder
    (removed afterwards). Yields None when there is none."""
    if not compact:
        path = onnx_path(work, name)
        yield path if os.path.isfile(path) else None
        return
    src = compact_path(work, name)
    if not os.path.isfile(src):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        with lzma.open(src, "rb") as fin, open(path, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 22)
        yield path


def git_commit() -> str:
    """HEAD, or ZOO_COMMIT where the tree is a copy without .git (a device run's tree)."""
    if os.environ.get("ZOO_COMMIT"):
        return os.environ["ZOO_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=30)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "no GPU"
    names = sorted({line.strip() for line in out.splitlines() if line.strip()})
    return ", ".join(names) or "no GPU"


def machine() -> str:
    return f"{platform.platform()}; {os.cpu_count()} CPUs; GPU: {gpu_name()}; Python {platform.python_version()}"


# ---------------------------------------------------------------- compact copies
FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}  # onnx.TensorProto data types
SHAPE_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}  # float inputs that decide an output's shape: kept


def write_compact(src: str, dst: str) -> dict:
    """Write `src`'s graph to `dst` (xz) with every float initializer (and float Constant node) of more than
    one element filled with one constant: 1.0 in a 1-d tensor (biases, norms' scales, shifts, means and
    variances: a BatchNorm becomes the identity) and 1 / fan-in in a weight (its size over its first
    dimension), so that activations stay near 1 layer after layer instead of growing to 1e18 (or vanishing)
    as a single constant makes them. Integer tensors (shapes, indices), single-element floats (scales,
    epsilons, exponents, mask values) and Resize/Upsample scales are kept: they are the graph's structure.
    The copy's outputs mean nothing; what it keeps is what `tunekit check` looks at."""
    import onnx

    model = onnx.load(src, load_external_data=True)
    keep = _shape_tensor_names(model.graph)
    counts = {"filled": 0, "kept": 0}
    for name, tensor in _graph_tensors(model.graph):
        if tensor.data_type in FLOAT_TYPES and _elements(tensor) > 1 and name not in keep:
            _fill(tensor, fill_value(list(tensor.dims)))
            counts["filled"] += 1
        else:
            counts["kept"] += 1
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with lzma.open(dst, "wb", preset=1) as fh:  # a constant compresses as well at preset 1, 3x faster than 6
        fh.write(model.SerializeToString())
    return counts


def fill_value(dims: list[int]) -> float:
    """A compact copy's value for a float tensor of these dims: 1.0 (1-d), else 1 / (size / first dim)."""
    if len(dims) <= 1:
        return 1.0
    fan_in = 1
    for dim in dims[1:]:
        fan_in *= dim
    return 1.0 / max(1, fan_in)


def _graph_tensors(graph):
    """(name, tensor) of the graph's initializers and of its Constant nodes' `value` tensors."""
    for tensor in graph.initializer:
        yield tensor.name, tensor
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    yield node.output[0], attr.t


def _shape_tensor_names(graph) -> set[str]:
    names = set()
    for node in graph.node:
        for index in SHAPE_INPUTS.get(node.op_type, ()):
            if index < len(node.input):
                names.add(node.input[index])
    return names


def _elements(tensor) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _fill(tensor, value: float) -> None:
    import numpy as np

    dtype = FLOAT_TYPES[tensor.data_type]
    if dtype == "bfloat16":  # bfloat16: the upper half of the float32's bits
        raw = (np.full(_elements(tensor), value, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    else:
        raw = np.full(_elements(tensor), value, dtype).tobytes()
    for name in ("float_data", "double_data", "int32_data", "external_data"):
        tensor.ClearField(name)
    tensor.data_location = 0  # DEFAULT: the data is in the file
    tensor.raw_data = raw


def onnx_opset(path: str) -> int | None:
    import onnx

    model = onnx.load(path, load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


# ---------------------------------------------------------------- the steps
class Context:
    """What every step needs: the arguments, the journal, the clock of --call-s and the MPS daemon."""

    def __init__(self, args):
        self.args = args
        main = os.path.join(args.work, "zoo.jsonl")
        stream = getattr(args, "journal", None)  # one GPU's sweep of --gpus: its own file, zoo.jsonl read too
        self.journal = Journal(stream or main, redo=getattr(args, "redo", False),
                               retry_failed=getattr(args, "retry_failed", False),
                               more=[*(getattr(args, "rows", None) or []), *([main] if stream else [])])
        self.started = time.time()
        self.mps = None

    def time_left(self) -> float:
        call_s = getattr(self.args, "call_s", 0) or 0
        return call_s - (time.time() - self.started) if call_s else float("inf")

    def timeout(self, own: float) -> tuple[float, bool]:
        """(timeout, cut): the step's own timeout, or less when --call-s ends first (cut: a later call redoes it)."""
        left = self.time_left()
        return (own, False) if left >= own else (max(1.0, left), True)

    def enough(self, step: str, name: str, needs: float) -> bool:
        if self.time_left() >= needs:
            return True
        print(f"[{step}] {name}: skipped, {self.time_left():.0f} s left of --call-s and it needs {needs:.0f}; "
              "run the command again to go on", file=sys.stderr, flush=True)
        return False

    def gpu_env(self, pct: int) -> dict:
        """The environment of a process at `pct`% of the GPU under this sweep's MPS daemon (tunekit commands
        started from here reuse the daemon, as in benchmarks/vs_pytorch.py)."""
        from tunekit.shares.mps import MPSDaemon
        from tunekit.shares.pinning import pinned_env
        from tunekit.shares.share import Share

        if self.mps is None:
            self.mps = MPSDaemon().start()
            os.environ.update(self.mps.env())
        return {**os.environ, **pinned_env(Share("gpu", pct), mps_env=self.mps.env()).env}

    def close(self) -> None:
        if self.mps is not None:
            self.mps.stop()


def step_export(ctx: Context) -> None:
    args = ctx.args
    for model in selected(args.models, dynamo_vit=args.dynamo_vit):
        if ctx.journal.todo("export", model.name) and guarded(ctx, "export", model, export_one) == "stop":
            return
        if (args.compact and ctx.journal.todo("compact", model.name)
                and os.path.isfile(onnx_path(args.work, model.name))):
            row = ctx.journal.add(compact_row(model, work=args.work))
            progress("compact", model.name, row["wall_s"], row.get("error") or f"{row['size_mb']} MB")


def export_one(ctx: Context, step: str, model: Model) -> str | None:
    if not ctx.enough(step, model.name, 60):
        return "stop"
    row = ctx.journal.add(export_row(model, work=ctx.args.work, timeout=ctx.args.timeout))
    progress(step, model.name, row["wall_s"], row.get("error") or f"{row['size_mb']} MB, "
             f"opset {row['opset']}, {row['exporter']}")
    return None


def export_row(model: Model, *, work: str, timeout: float) -> dict:
    """Export one model in a process of its own (torch_models.py export): a crash or a hang loses one row."""
    out = onnx_path(work, model.name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(out)  # --redo: no stale file may pass for this export
    ran = run_process([sys.executable, os.path.join(HERE, "torch_models.py"), "export", "--model", model.name,
                       "--out", out], timeout=timeout)
    row = {"step": "export", "model": model.name, "rc": ran.rc, "wall_s": round(ran.wall_s, 1)}
    error = error_of(ran, timeout=timeout) or (None if os.path.isfile(out) else "no ONNX file written")
    if error:
        return {**row, "error": error}
    info = json_out(ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else "") or {}
    return {**row, "size_mb": round(os.path.getsize(out) / 2**20, 1), "opset": onnx_opset(out),
            "exporter": info.get("exporter", "?"), "exporter_note": info.get("note")}


def compact_row(model: Model, *, work: str) -> dict:
    started = time.time()
    row = {"step": "compact", "model": model.name}
    try:
        counts = write_compact(onnx_path(work, model.name), compact_path(work, model.name))
    except Exception as exc:  # one model's failure is its row
        return {**row, "wall_s": round(time.time() - started, 1),
                "error": f"{type(exc).__name__}: {first_line(str(exc))}"}
    return {**row, **counts, "wall_s": round(time.time() - started, 1),
            "size_mb": round(os.path.getsize(compact_path(work, model.name)) / 2**20, 3)}


def step_check(ctx: Context) -> None:
    step = "check-compact" if ctx.args.compact else "check"
    for model in selected(ctx.args.models):
        if ctx.journal.todo(step, model.name) and guarded(ctx, step, model, check_one) == "stop":
            return


def check_one(ctx: Context, step: str, model: Model) -> str | None:
    args = ctx.args
    if not ctx.enough(step, model.name, 30):
        return "stop"
    with model_file(args.work, model.name, compact=args.compact) as path:
        if path is None:
            progress(step, model.name, 0, "skipped: not exported")
            return None
        cmd = tunekit_cmd("check", path, "--gpu-arch", args.gpu_arch, "--json",
                          *(["--precision", args.precision] if args.precision else []))
        timeout, cut = ctx.timeout(args.timeout)
        ran = run_process(cmd, timeout=timeout)
    if ran.rc is None and cut:
        progress(step, model.name, ran.wall_s, "cut off by --call-s: run again")
        return "stop"
    row = ctx.journal.add(check_row(step, model.name, ran, timeout=timeout))
    summary = check_summary(row.get("json"))
    progress(step, model.name, ran.wall_s, row.get("error") or
             f"exit {ran.rc}, {summary['precision']}, {summary['tasks']} tasks, {len(summary['fallen'])} fall back")
    return None


def guarded(ctx: Context, step: str, model: Model, part) -> str | None:
    """part(ctx, step, model); an exception of this script's own (a file it cannot read, a payload it did not
    expect) becomes the model's row for the step, and the sweep goes on."""
    try:
        return part(ctx, step, model)
    except Exception as exc:
        row = ctx.journal.add({"step": step, "model": model.name,
                               "error": f"zoo.py: {type(exc).__name__}: {first_line(str(exc))}"})
        progress(step, model.name, 0, row["error"])
        return None


def check_row(step: str, name: str, ran: Ran, *, timeout: float) -> dict:
    payload = json_out(ran.stdout)
    row = {"step": step, "model": name, "rc": ran.rc, "wall_s": round(ran.wall_s, 1), "json": payload}
    if ran.rc not in (0, 1) or payload is None:  # 1 is an answer ("problems"), described by the JSON
        row["error"] = error_of(ran, timeout=timeout) or last_line(ran.stderr) or "no JSON on stdout"
        if payload is None and ran.stdout.strip():
            row["stdout_tail"] = ran.stdout.strip()[-2000:]
    return row


def step_cpu_tune(ctx: Context) -> None:
    step = "cpu-tune-compact" if ctx.args.compact else "cpu-tune"
    for model in selected(ctx.args.models, small_only=not ctx.args.all):
        if ctx.journal.todo(step, model.name) and guarded(ctx, step, model, cpu_tune_one) == "stop":
            return


def cpu_tune_one(ctx: Context, step: str, model: Model) -> str | None:
    args = ctx.args
    if not ctx.enough(step, model.name, 120):
        return "stop"
    out = os.path.join(args.work, "cpu-runs", model.name)
    shutil.rmtree(out, ignore_errors=True)  # 8 trials from scratch each time
    with model_file(args.work, model.name, compact=args.compact) as path:
        if path is None:
            progress(step, model.name, 0, "skipped: not exported")
            return None
        timeout, cut = ctx.timeout(args.timeout)
        ran = run_process(tunekit_cmd("tune", path, "--cpu-pct", str(args.cpu_pct), "--trials", str(args.trials),
                                      "--json", "--out", out), timeout=timeout)
    if ran.rc is None and cut:
        progress(step, model.name, ran.wall_s, "cut off by --call-s: run again")
        return "stop"
    row = ctx.journal.add(tune_row(step, model.name, ran, timeout=timeout))
    progress(step, model.name, ran.wall_s, row.get("error") or
             f"{_ms(row['untuned_ms'])} -> {_ms(row['tuned_ms'])} ms")
    return None


def tune_row(step: str, name: str, ran: Ran, *, timeout: float) -> dict:
    """A `tunekit tune --json` run: its times, precision, the tasks that fell back and its artifact."""
    row = {"step": step, "model": name, "rc": ran.rc, "wall_s": round(ran.wall_s, 1)}
    payload = json_out(ran.stdout) if ran.rc == 0 else None
    if payload is None:
        return {**row, "error": error_of(ran, timeout=timeout) or "no JSON on stdout"}
    report = payload.get("report") or {}
    return {**row, "untuned_ms": payload.get("untuned_ms"), "tuned_ms": payload.get("tuned_ms"),
            "trials": payload.get("trials"), "artifact": payload.get("artifact"),
            "precision": report.get("precision"), "precision_fallback": report.get("precision_fallback"),
            "tasks": len(report.get("tasks") or []),
            "fallbacks": tune_fallbacks(report), "numerics": report.get("numerics"),
            "untuned_errors": untuned_errors(report), "session_failures": report.get("session_failures"),
            "roofline": report.get("roofline"), "slowest_tasks": slowest_tasks(report)}


def slowest_tasks(report: dict, *, count: int = 5) -> list[dict]:
    """The tasks where the tuned model spends the most (weight x the µs of the kernel that runs), each with its
    efficiency against the share's roofline where the report has it (run.efficiency: H100/H200 shares)."""
    rows = []
    for t in report.get("tasks") or []:
        if not isinstance(t, dict):
            continue
        used = t.get("tuned_us") if t.get("tuned_us") and t.get("record_applied", True) else t.get("untuned_us")
        if used:
            efficiency = t.get("efficiency") or {}
            rows.append({"name": t.get("name"), "us": used, "weight": t.get("weight", 1),
                         "roofline_fraction": efficiency.get("roofline_fraction"), "bound": efficiency.get("bound"),
                         "kernel": efficiency.get("kernel")})
    return sorted(rows, key=lambda r: -r["us"] * max(1, r["weight"] or 1))[:count]


def untuned_errors(report: dict) -> dict[str, int]:
    """{first line of the error: tasks} of the tasks whose untuned kernel failed (report tasks[].untuned_error)."""
    lines = [first_line(str(t["untuned_error"])) for t in report.get("tasks") or []
             if isinstance(t, dict) and t.get("untuned_error")]
    return {line: lines.count(line) for line in dict.fromkeys(lines)}


def tune_fallbacks(report: dict) -> list[list[str]]:
    """[task, why] of each task that kept its untuned kernel (report tasks[].fallback)."""
    return [[t.get("name", "?"), first_line(str(t["fallback"]))] for t in report.get("tasks") or []
            if isinstance(t, dict) and t.get("fallback")]


def step_gpu(ctx: Context) -> None:
    """Per model: tune at the share, bench the artifact there, then PyTorch's variants at the share and at
    100%. Each part is a row of its own; a model is done when all four are there."""
    args = ctx.args
    if len(args.gpus) > 1:
        return gpu_streams(ctx)
    for model in selected(args.models, dynamo_vit=True):
        if not os.path.isfile(onnx_path(args.work, model.name)):
            progress("gpu", model.name, 0, "skipped: not exported")
            continue
        for step, part in (("gpu-tune", gpu_tune), ("gpu-bench", gpu_bench), ("torch", torch_times)):
            if guarded(ctx, step, model, part) == "stop":
                return


def gpu_streams(ctx: Context) -> None:
    """--gpus 0,1: one sweep per GPU side by side, the models dealt out in zoo order. Each is this command for its
    models, with CUDA_VISIBLE_DEVICES set to its GPU (so its own MPS daemon serves that GPU alone) and its own
    journal, <work>/zoo-gpu<N>.jsonl, merged into zoo.jsonl when the sweeps end (or by the next command)."""
    args = ctx.args
    names = [m.name for m in selected(args.models, dynamo_vit=True) if os.path.isfile(onnx_path(args.work, m.name))]
    base = _without_options(args.argv, ("--gpus", "--models"))
    streams = []
    for i, gpu in enumerate(args.gpus):
        if names[i::len(args.gpus)]:
            cmd = [sys.executable, os.path.abspath(__file__), *base, "--models", ",".join(names[i::len(args.gpus)]),
                   "--gpus", gpu, "--journal", os.path.join(args.work, f"zoo-gpu{gpu}.jsonl")]
            streams.append(subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}))
    for stream in streams:
        stream.wait()
    merge_streams(args.work)


def _without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """`argv` without the options `names` and their values (as `--name value` or `--name=value`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif not arg.startswith(tuple(f"{name}=" for name in names)):
            out.append(arg)
    return out


def merge_streams(work: str) -> None:
    """The rows of every GPU sweep's journal (gpu_streams) appended to zoo.jsonl, and those journals removed."""

    for path in sorted(glob.glob(os.path.join(work, "zoo-gpu*.jsonl"))):
        rows = _read_jsonl(path)
        with open(os.path.join(work, "zoo.jsonl"), "a") as fh:
            fh.writelines(json.dumps(row, default=str) + "\n" for row in rows)
        os.remove(path)


def gpu_tune(ctx: Context, step: str, model: Model) -> str | None:
    args = ctx.args
    if not ctx.journal.todo(step, model.name):
        return None
    if not ctx.enough(step, model.name, args.time_budget + args.startup_s):
        return "stop"
    out = os.path.join(args.work, "runs", model.name)
    cmd = tunekit_cmd("tune", onnx_path(args.work, model.name), "--gpu-pct", str(args.gpu_pct), "--time-budget",
                      f"{args.time_budget:g}", "--trials", "1000000", "--resume", "--json", "--out", out)
    timeout, cut = ctx.timeout(args.time_budget + args.timeout)
    ran = run_process(cmd, timeout=timeout, env=ctx.gpu_env(args.gpu_pct))
    if ran.rc is None and cut:  # no row: the next call resumes the records
        progress(step, model.name, ran.wall_s, "cut off by --call-s: run again (--resume)")
        return "stop"
    row = ctx.journal.add({**tune_row(step, model.name, ran, timeout=timeout), "share": f"gpu{args.gpu_pct}",
                           "time_budget_s": args.time_budget, "machine": gpu_name(), "commit": git_commit()})
    progress(step, model.name, ran.wall_s, row.get("error") or
             f"{row['precision']}: {_ms(row['untuned_ms'])} -> {_ms(row['tuned_ms'])} ms, "
             f"{len(row['fallbacks'])} task(s) fell back")
    return None


def gpu_bench(ctx: Context, step: str, model: Model) -> str | None:
    args = ctx.args
    tuned = ctx.journal.get("gpu-tune", model.name)
    stale = _older(ctx.journal.get(step, model.name), than=tuned)  # the tune was redone since
    if not tuned or not (ctx.journal.todo(step, model.name) or stale):
        return None
    if not tuned.get("artifact"):
        ctx.journal.add({"step": step, "model": model.name, "error": "no artifact (the tune failed)"})
        return None
    if not ctx.enough(step, model.name, 90):
        return "stop"
    cmd = tunekit_cmd("bench", tuned["artifact"], "--gpu-pct", str(args.gpu_pct), "--repeats", str(args.repeats),
                      "--compare-onnx", onnx_path(args.work, model.name), "--json")
    timeout, cut = ctx.timeout(600)
    ran = run_process(cmd, timeout=timeout, env=ctx.gpu_env(args.gpu_pct))
    if ran.rc is None and cut:
        progress(step, model.name, ran.wall_s, "cut off by --call-s: run again")
        return "stop"
    payload = json_out(ran.stdout) if ran.rc == 0 else None
    row = {"step": step, "model": model.name, "rc": ran.rc, "wall_s": round(ran.wall_s, 1),
           "share": f"gpu{args.gpu_pct}", "precision": tuned.get("precision"), "machine": gpu_name()}
    if payload is None:
        row["error"] = error_of(ran, timeout=timeout) or "no JSON on stdout"
    else:
        row.update({k: payload.get(k) for k in ("p50_ms", "p90_ms", "sm_count", "gpu_name", "share_enforced")})
        row["numerics"] = (payload.get("numerics") or {}).get("outputs")
    ctx.journal.add(row)
    progress(step, model.name, ran.wall_s, row.get("error") or f"p50 {_ms(row['p50_ms'])} ms")
    return None


def _older(row: dict | None, *, than: dict | None) -> bool:
    return bool(row and than) and str(row.get("time", "")) < str(than.get("time", ""))


def torch_times(ctx: Context, _step: str, model: Model) -> str | None:
    """PyTorch's variants at the share and at 100% (torch_models.py time, a process pinned to the share). A
    vit_b_16_dynamo-like export variant has its base model's PyTorch rows."""
    if model.base:
        return None
    for pct in sorted({ctx.args.gpu_pct, 100}):
        step = f"torch-gpu{pct}"
        before = ctx.journal.get(step, model.name)
        have = {} if ctx.journal.redo else {v: r for v, r in ((before or {}).get("variants") or {}).items()
                                            if not (ctx.journal.retry_failed and r.get("error"))}
        wanted = [v for v in ctx.args.torch_variants if (pct in ctx.args.compile_pcts or not v.startswith(COMPILED))
                  and (pct == ctx.args.gpu_pct or v.endswith("fp16"))]  # the table reads fp16 alone at 100%
        while [v for v in wanted if v not in have]:
            if not ctx.enough(step, model.name, 120):
                return "stop"
            todo = [v for v in wanted if v not in have]
            got, cut = torch_run(ctx, model, todo, pct=pct)
            have.update(got)
            ctx.journal.add({"step": step, "model": model.name, "variants": dict(have), "machine": gpu_name(),
                             "channels_last": channels_last(model)})
            if cut:
                return "stop"
    return None


def torch_run(ctx: Context, model: Model, todo: list[str], *, pct: int) -> tuple[dict, bool]:
    """({variant: row}, cut) of one torch_models.py time process. A variant that ran past --torch-timeout
    is recorded as timed out (the rest run in the next process); a crash records its line for every
    variant it left; a process cut off by --call-s leaves them to a later call (cut)."""
    cmd = [sys.executable, os.path.join(HERE, "torch_models.py"), "time", "--model", model.name, "--variants",
           ",".join(todo), "--repeats", str(ctx.args.repeats), *(["--channels-last"] if channels_last(model) else [])]
    timeout, cut = ctx.timeout(ctx.args.torch_timeout)
    ran = run_process(cmd, timeout=timeout, env=ctx.gpu_env(pct))
    got = variant_rows(ran.stdout)
    left = [v for v in todo if v not in got]
    if ran.rc is None and left and not cut:
        got[left[0]] = {"variant": left[0], "error": f"timed out after {timeout:.0f} s"}
    elif ran.rc is not None and left:
        why = (last_line(ran.stderr) or f"exit {ran.rc}") if ran.rc else "no result printed"
        got.update({v: {"variant": v, "error": why} for v in left})
    progress(f"torch-gpu{pct}", model.name, ran.wall_s,
             ", ".join(f"{v} {_ms(r.get('median_ms'))}" for v, r in got.items()) or "cut off by --call-s")
    return got, bool(ran.rc is None and cut)


def channels_last(model: Model) -> bool:
    return model.family in CONV_FAMILIES and len(model.inputs[0].shape) == 4


def variant_rows(stdout: str) -> dict:
    rows = {}
    for line in (stdout or "").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict) and row.get("variant"):
                    rows[row["variant"]] = row
    return rows


def _ms(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


# ---------------------------------------------------------------- reading the rows
def check_summary(payload) -> dict:
    """precision, tasks, tensorized and the tasks that would fall back ([task, why]) of `tunekit check --json`,
    read defensively: the schema is young, so several spellings are tried, at the top and under "summary"."""
    payload = payload if isinstance(payload, dict) else {}
    places = [payload, *(payload[k] for k in ("summary", "result") if isinstance(payload.get(k), dict))]
    task_rows = next((p["tasks"] for p in places if isinstance(p.get("tasks"), list)), [])
    return {"precision": _precision(_first(places, "precision", "effective_precision", "chosen_precision")),
            "tasks": _count(_first(places, "tasks", "task_count", "n_tasks")),
            "tensorized": _tensorized(places, task_rows),
            "fallen": _fallen(places, task_rows)}


def _first(places: list[dict], *keys):
    for place in places:
        for key in keys:
            if place.get(key) is not None:
                return place[key]
    return None


def _precision(value) -> str | None:
    if isinstance(value, dict):
        value = _first([value], "effective", "chosen", "result", "actual", "precision", "requested")
    return value if isinstance(value, str) else None


def _count(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return len(value) if isinstance(value, (list, dict)) else None


def _tensorized(places: list[dict], task_rows: list) -> int | None:
    found = _count(_first(places, "tensorized", "tensorized_tasks", "tensor_core_tasks"))
    if found is not None:
        return found
    flags = [t.get("tensorized") for t in task_rows if isinstance(t, dict) and "tensorized" in t]
    return sum(bool(f) for f in flags) if flags else None


FALLBACK_KEYS = ("fallback", "falls_back", "would_fall_back", "fallen_back", "fall_back")


def _fallen(places: list[dict], task_rows: list) -> list[list[str]]:
    """[task, why] per task that would keep its untuned kernel."""
    fallen = []
    for task in task_rows:
        flag = _first([task], *FALLBACK_KEYS) if isinstance(task, dict) else None
        if flag:
            why = flag if isinstance(flag, str) else _first([task], "reason", "error", "why") or "fallback"
            fallen.append([str(task.get("name") or task.get("task") or "?"), first_line(str(why))])
    if fallen:
        return fallen
    listed = _first(places, *FALLBACK_KEYS, "fallbacks")
    for item in listed if isinstance(listed, list) else []:
        if isinstance(item, dict):
            fallen.append([str(item.get("name") or item.get("task") or "?"),
                           first_line(str(_first([item], "reason", "error", "why") or "fallback"))])
        else:
            fallen.append([str(item), "fallback"])
    return fallen


def variant_correct(row: dict) -> bool | None:
    """Whether a PyTorch variant's outputs are within tunekit's fp16 numerics bound against the model in fp32
    on the CPU (tunekit.numerics.BOUNDS["fp16"], for TF32 too, which has fp16's mantissa); None: no errors
    measured, and such a variant never counts as correct either."""
    from tunekit.numerics import BOUNDS, within

    errors = row.get("errors")
    if not errors:
        return None
    return within(errors, BOUNDS["fp16"])


def best_variant(torch_row: dict | None, *, fp16_only: bool = False) -> tuple[float | None, str | None]:
    """(ms, variant) of the fastest correct variant."""
    timed = [(r["median_ms"], v) for v, r in ((torch_row or {}).get("variants") or {}).items()
             if isinstance(r.get("median_ms"), (int, float)) and variant_correct(r)
             and (not fp16_only or v.endswith("fp16"))]
    return min(timed) if timed else (None, None)


def wrong_variants(torch_row: dict | None) -> list[str]:
    return [v for v, r in ((torch_row or {}).get("variants") or {}).items() if variant_correct(r) is False]


def tuned_within(bench: dict | None) -> bool | None:
    """Whether `tunekit bench --compare-onnx` found the artifact within its precision's bound."""
    from tunekit.numerics import BOUNDS, within

    if not bench or not bench.get("numerics"):
        return None
    return within(bench["numerics"], BOUNDS.get(bench.get("precision") or "fp16", BOUNDS["fp16"]))


# ---------------------------------------------------------------- the table
def columns(gpu_pct: int) -> list[str]:
    return ["model", "family", "GPU", "precision", "tasks fallen back (count: first)", "check exit", "untuned ms",
            f"tuned ms at {gpu_pct}%", f"PyTorch best correct at {gpu_pct}% (variant)", "PyTorch fp16 at 100%",
            f"tuned / best correct {gpu_pct}%", "tuned / fp16 at 100%", "notes"]


def table(journal: Journal, *, gpu_pct: int = 40, header: list[str] = ()) -> str:
    models = [m for m in ZOO if any(key[1] == m.name for key in journal.rows)]
    rows = [model_row(m, journal, gpu_pct=gpu_pct) for m in models]
    beat_best = [r for r in rows if r["vs_best"] is not None]
    beat_fp16 = [r for r in rows if r["vs_fp16"] is not None]
    lines = [*header, "", f"| {' | '.join(columns(gpu_pct))} |", "|" + " --- |" * 6 + " ---: |" * 6 + " --- |"]
    lines += ["| " + " | ".join(r["cells"]) + " |" for r in rows]
    lines += ["", f"Tuned at {gpu_pct}% beats PyTorch's best correct variant at {gpu_pct}% on "
              f"**{sum(r['vs_best'] < 1 for r in beat_best)} of {len(beat_best)}** models, and PyTorch fp16 at "
              f"100% on **{sum(r['vs_fp16'] < 1 for r in beat_fp16)} of {len(beat_fp16)}** (models with both times).",
              "", f"PyTorch variants timed: {', '.join(timed_variants(journal)) or 'none'} (of eager, CUDA graphs "
              "and torch.compile(mode=\"max-autotune\"), each in fp32 with TF32 and in fp16), "
              "channels_last + cudnn.benchmark for CNNs; a variant whose outputs fail tunekit's fp16 bound "
              "(tunekit.numerics) against the model in fp32 on the CPU is wrong and never the best. † after a "
              "tuned time: its artifact failed its own bound in `tunekit bench --compare-onnx`."]
    return "\n".join(lines + cpu_table(journal)) + "\n"


def timed_variants(journal: Journal) -> list[str]:
    """The PyTorch variants some model has a time of, in TORCH_VARIANTS order."""
    seen = {v for (step, _), row in journal.rows.items() if step.startswith("torch-gpu")
            for v, r in (row.get("variants") or {}).items() if r.get("median_ms") is not None}
    return [v for v in TORCH_VARIANTS if v in seen]


def model_row(model: Model, journal: Journal, *, gpu_pct: int) -> dict:
    get = journal.get
    check = get("check", model.name) or get("check-compact", model.name)
    tune, bench = get("gpu-tune", model.name), get("gpu-bench", model.name)
    torch40, torch100 = (get(f"torch-gpu{p}", model.base or model.name) for p in (gpu_pct, 100))
    summary = check_summary((check or {}).get("json"))
    ok_tune = tune if tune and not tune.get("error") else None
    precision = (ok_tune or {}).get("precision") or (summary["precision"] and f"{summary['precision']} (check)")
    fallen = ok_tune["fallbacks"] if ok_tune else summary["fallen"]
    tuned = (bench or {}).get("p50_ms") or (ok_tune or {}).get("tuned_ms")
    best, best_v = best_variant(torch40)
    fp16, fp16_v = best_variant(torch100, fp16_only=True)
    vs_best = tuned / best if tuned and best else None
    vs_fp16 = tuned / fp16 if tuned and fp16 else None
    cells = [model.name, model.family, _gpu_cell(tune or torch40), precision or "–",
             _fallen_cell(fallen, known=bool(ok_tune or check)), _check_cell(check), _ms((ok_tune or {}).get("untuned_ms")),
             _ms(tuned) + ("†" if tuned_within(bench) is False else ""),
             f"{_ms(best)} ({best_v})" if best else _none_correct(torch40),
             f"{_ms(fp16)} ({fp16_v})" if fp16 else _none_correct(torch100),
             f"{vs_best:.2f}" if vs_best else "–", f"{vs_fp16:.2f}" if vs_fp16 else "–",
             _notes(model, journal, torch40, torch100, gpu_pct=gpu_pct)]
    return {"cells": [c.replace("|", "/") for c in cells], "vs_best": vs_best, "vs_fp16": vs_fp16}


def _gpu_cell(row: dict | None) -> str:
    """The GPU a model's rows were measured on, short ("NVIDIA H100 80GB HBM3" -> "H100")."""
    name = (row or {}).get("machine") or ""
    return next((w for w in name.split() if w[:1] in "HABL" and w[1:].isdigit()), name or "–")


def _fallen_cell(fallen: list, *, known: bool) -> str:
    if not known:
        return "–"
    return f"{len(fallen)}: {fallen[0][0]}: {fallen[0][1][:80]}" if fallen else "0"


def _check_cell(check: dict | None) -> str:
    if not check:
        return "–"
    code = "timeout" if check.get("rc") is None else str(check["rc"])
    return code + (" (compact)" if check["step"] == "check-compact" else "")


def _none_correct(torch_row: dict | None) -> str:
    if not torch_row:
        return "–"
    return "none correct" if wrong_variants(torch_row) else "none timed"


def _notes(model: Model, journal: Journal, torch40, torch100, *, gpu_pct: int) -> str:
    """The first error of the model's steps, and PyTorch's wrong variants."""
    notes = []
    for step in ("export", "compact", "check", "check-compact", "gpu-tune", "gpu-bench", "torch"):
        row = journal.get(step, model.name)
        problems = (row or {}).get("json", {}).get("problems") if isinstance((row or {}).get("json"), dict) else None
        if row and (row.get("error") or problems):
            why = row.get("error") or f"{len(problems)} problem(s), first: {first_line(str(problems[0]))}"
            notes.append(f"{step}: {why[:160]}")
            break
    fell_back = (journal.get("gpu-tune", model.name) or {}).get("precision_fallback")
    if fell_back:  # why `--precision auto` tuned this model in fp32
        notes.append(f"fp32 because: {first_line(str(fell_back))[:160]}")
    for label, row in ((f"{gpu_pct}%", torch40), ("100%", torch100)):
        if wrong_variants(row):
            notes.append(f"PyTorch wrong at {label}: {', '.join(wrong_variants(row))}")
    if model.base:
        notes.append(f"PyTorch: {model.base}'s")
    return "; ".join(notes)


def cpu_table(journal: Journal) -> list[str]:
    rows = []
    for model in ZOO:
        for step in ("cpu-tune", "cpu-tune-compact"):
            row = journal.get(step, model.name)
            if row:
                rows.append(f"| {model.name} | {'compact' if 'compact' in step else 'exported'} | "
                            f"{_check_cell({'rc': row.get('rc'), 'step': ''})} | {_ms(row.get('untuned_ms'))} | "
                            f"{_ms(row.get('tuned_ms'))} | {row.get('wall_s', '–')} | "
                            f"{(row.get('error') or '').replace('|', '/')[:160]} |")
    if not rows:
        return []
    return ["", "CPU, `tunekit tune --cpu-pct 100 --trials 8` (compact models: constant weights, times only):", "",
            "| model | ONNX | exit | untuned ms | tuned ms | wall s | error |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |",
            *rows]


def header_lines(journal: Journal, *, argv: list[str]) -> list[str]:
    measured = sorted({r.get("machine") for r in journal.rows.values() if r.get("machine")})
    commits = sorted({r.get("commit") for r in journal.rows.values() if r.get("commit")})
    return ["# The model zoo (benchmarks/zoo.py)", "",
            f"Table: `python benchmarks/zoo.py {' '.join(argv)}` at commit `{git_commit()}` on {machine()}.",
            f"GPU rows measured on: {', '.join(measured) or '–'}; tuned at commit(s): "
            f"{', '.join(f'`{c[:12]}`' for c in commits) or '–'}."]


def step_table(ctx: Context) -> None:
    args = ctx.args
    text = table(ctx.journal, gpu_pct=args.gpu_pct, header=header_lines(ctx.journal, argv=args.argv))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write(text)
    print(text)


# ---------------------------------------------------------------- the command line
STEPS = {"export": step_export, "check": step_check, "cpu-tune": step_cpu_tune, "gpu": step_gpu, "table": step_table}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="step", required=True)
    for name in STEPS:
        p = sub.add_parser(name)
        p.add_argument("--work", required=True, help="the sweep's folder: models/, compact/, runs/, zoo.jsonl")
        if name != "table":
            p.add_argument("--models", help="comma-separated zoo names (default: the whole zoo)")
            p.add_argument("--redo", action="store_true", help="run steps already recorded again")
            p.add_argument("--retry-failed", action="store_true", help="run steps recorded with an error again")
            p.add_argument("--call-s", type=float, default=0,
                           help="start no work after this many seconds (a device call's limit; 0: none)")
    sub.choices["export"].add_argument("--compact", action="store_true", help="also write compact/<name>.onnx.xz")
    sub.choices["export"].add_argument("--dynamo-vit", action="store_true", help="also vit_b_16 with dynamo=True")
    sub.choices["export"].add_argument("--timeout", type=float, default=900)
    for name in ("check", "cpu-tune"):
        sub.choices[name].add_argument("--compact", action="store_true", help="on the compact copies")
        sub.choices[name].add_argument("--timeout", type=float, default=900)
    sub.choices["check"].add_argument("--gpu-arch", default="sm_90")
    sub.choices["check"].add_argument("--precision", choices=["auto", "fp16", "fp32"])
    sub.choices["cpu-tune"].add_argument("--cpu-pct", type=int, default=100)
    sub.choices["cpu-tune"].add_argument("--trials", type=int, default=8)
    sub.choices["cpu-tune"].add_argument("--all", action="store_true", help="every model, not only the small ones")
    gpu = sub.choices["gpu"]
    gpu.add_argument("--gpu-pct", type=int, default=40)
    gpu.add_argument("--time-budget", type=float, default=120, help="tunekit tune --time-budget, seconds")
    gpu.add_argument("--startup-s", type=float, default=240, help="a tune's time outside its budget (for --call-s)")
    gpu.add_argument("--timeout", type=float, default=900, help="a tune's limit beyond its --time-budget")
    gpu.add_argument("--torch-variants", default=",".join(TORCH_VARIANTS))
    gpu.add_argument("--compile-pcts", default="40,100", help="the shares at which torch.compile variants are "
                     "timed (max-autotune's autotuning took 3 min per model and dtype for ResNet-18 on an H200)")
    gpu.add_argument("--torch-timeout", type=float, default=900, help="limit of one model's PyTorch variants")
    gpu.add_argument("--repeats", type=int, default=200)
    gpu.add_argument("--gpus", default="0", help="comma-separated GPU indices: one sweep per GPU side by side, "
                     "each with its own MPS daemon (gpu_streams)")
    gpu.add_argument("--journal", help=argparse.SUPPRESS)  # one GPU's sweep writes its own (gpu_streams)
    sub.choices["table"].add_argument("--out", required=True)
    sub.choices["table"].add_argument("--gpu-pct", type=int, default=40)
    sub.choices["table"].add_argument("--rows", action="append", help="another zoo.jsonl to merge in (repeatable; "
                                      "--work's rows win)")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    if getattr(args, "torch_variants", None):
        args.torch_variants = [v for v in args.torch_variants.split(",") if v]
        args.compile_pcts = [int(p) for p in args.compile_pcts.split(",") if p]
    if getattr(args, "gpus", None):
        args.gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    sys.path.insert(0, REPO)  # tunekit from this checkout (numerics, shares), as the subprocesses get it
    if args.step == "gpu" and not args.journal:  # what GPU sweeps cut off left (never while a sibling writes)
        merge_streams(args.work)
    ctx = Context(args)
    try:
        STEPS[args.step](ctx)
    finally:
        ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
