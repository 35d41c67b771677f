"""The fused attention (frontend.attention_kernel) as a Triton kernel: flash attention, a tile of query rows per
program, the keys a tile at a time with an online softmax, Q, K, V and the mask read where they are by their strides
(the spec the frontend wrote on the kernel, SPEC_ATTR), the context written in [B, S, H, D] as the hand-written kernel
writes it. Each tile configuration is a candidate measured and checked at the share like a GEMM's
(clients.kernel_trials).

The hand-written key-tiled body passes 16 query rows at a time through mma.sync with no pipelining: 55.8 µs for
BERT-base's attention at sequence 512 at 40% (benchmarks/RESULTS.md, "A fleet of four models on one H200").
Triton pipelines the key tiles and emits wgmma on Hopper.

A row masked everywhere gives zeros (its running max stays -inf), as the graphs the fused kernel replaces do
(where(isnan(softmax), 0, ...)) and as the hand-written kernel does.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from .triton_compile import CompiledKernel, ceil_pow2, compile_source, config_from_name, launching_call
from .triton_compile import jit_function as jit_function_of

KIND = "triton"
SPEC_ATTR = "tunekit.attention"  # the Attention spec (JSON) on the fused kernel's PrimFunc
_POINTER = {"float16": "*fp16", "float32": "*fp32"}


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """One candidate: query rows and keys per tile, warps, software-pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int

    @property
    def name(self) -> str:
        return f"attn_m{self.block_m}n{self.block_n}w{self.warps}s{self.stages}"

    @classmethod
    def from_name(cls, name: str) -> AttentionConfig:
        return config_from_name(cls, r"attn_m(\d+)n(\d+)w(\d+)s(\d+)", name, "attention configuration")


# Triton's fused-attention tutorial's tiles, and smaller ones for batch-1 sequences of a few hundred rows; the best at
# 40% of an H200 first (sequence 128, 197, 512: benchmarks/results/h200-transformers-*), as kernel trials take them
_CONFIGS = [AttentionConfig(64, 64, 4, 3), AttentionConfig(16, 64, 4, 2), AttentionConfig(64, 128, 4, 2),
            AttentionConfig(128, 64, 8, 3), AttentionConfig(32, 64, 4, 2), AttentionConfig(64, 32, 4, 3),
            AttentionConfig(128, 32, 4, 2), AttentionConfig(128, 128, 8, 2)]


def spec_json(spec) -> str:
    """The spec as JSON: dtypes as their names, shapes, offsets and strides as ints (Relax gives TVM objects)."""
    def plain(op) -> dict:
        return {"shape": [int(x) for x in op.shape], "dtype": str(op.dtype), "offset": int(op.offset),
                "strides": [int(x) for x in op.strides]}

    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return json.dumps({**{k: int(v) for k, v in fields.items() if k not in ("q", "k", "v", "mask", "scale")},
                       "scale": float(spec.scale), **{k: plain(fields[k]) for k in ("q", "k", "v", "mask")}},
                      sort_keys=True)


def spec_of(func):
    """The Attention spec a fused attention kernel carries, or None for any other PrimFunc."""
    text = func.attrs.get(SPEC_ATTR) if func.attrs else None
    return None if text is None else spec_from_json(str(text))


def spec_from_json(text: str):
    from ..frontend.attention_spec import Attention, Operand

    raw = json.loads(text)
    operands = {name: Operand(tuple(raw[name]["shape"]), raw[name]["dtype"], raw[name]["offset"],
                              tuple(raw[name]["strides"])) for name in ("q", "k", "v", "mask")}
    return Attention(**{**raw, **operands})


def supports(spec) -> bool:
    return spec is not None and all(op.dtype == "float16" for op in (spec.q, spec.k, spec.v)) and \
        spec.mask.dtype in _POINTER and spec.head_dim % 16 == 0


def configs(spec) -> list[AttentionConfig]:
    """The candidates worth measuring: no query tile past the rows, no key tile past the keys (16 and up)."""
    rows, keys = max(16, ceil_pow2(spec.seq)), max(16, ceil_pow2(spec.keys))
    return [c for c in _CONFIGS if c.block_m <= rows and c.block_n <= keys]


def kernel_name(spec, config: AttentionConfig) -> str:
    return "tunekit_attention_" + hashlib.sha1(repr((spec, config)).encode()).hexdigest()[:10]


def grid(spec, config: AttentionConfig) -> int:
    return spec.batch * spec.heads * -(-spec.seq // config.block_m)


def _at(op, b: str, h: str, rows: str, cols: str) -> str:
    """The flat index expression of operand `op`'s elements (b, h, rows, cols) as Triton index tensors."""
    sb, sh, ss, sd = op.strides
    return f"{op.offset} + {b} * {sb} + {h} * {sh} + {rows} * {ss} + {cols} * {sd}"


def kernel_source(spec, config: AttentionConfig, name: str) -> str:
    """Python source of the @triton.jit kernel (q, k, v, mask, out): every shape, stride and tile a literal."""
    s, sk, d, heads = spec.seq, spec.keys, spec.head_dim, spec.heads
    bm, bn, bd = config.block_m, config.block_n, max(16, ceil_pow2(d))
    tiles = -(-s // bm)
    d_mask = "" if bd == d else f" & (rd[None, :] < {d})"
    d_mask_t = "" if bd == d else f" & (rd[:, None] < {d})"
    mb, mh, mi, mj = spec.mask.strides
    lines = [
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def {name}(q, k, v, mask, out):",
        "    pid = tl.program_id(0)",
        f"    b = pid // {heads * tiles}",
        f"    h = pid // {tiles} % {heads}",
        f"    rm = pid % {tiles} * {bm} + tl.arange(0, {bm})",
        f"    rd = tl.arange(0, {bd})",
        f"    row_ok = rm < {s}",
        f"    qt = tl.load(q + {_at(spec.q, 'b', 'h', 'rm[:, None]', 'rd[None, :]')}, "
        f"mask=row_ok[:, None]{d_mask}, other=0.0)",
        f"    m_i = tl.full([{bm}], float('-inf'), tl.float32)",
        f"    l_i = tl.zeros([{bm}], tl.float32)",
        f"    acc = tl.zeros([{bm}, {bd}], tl.float32)",
        f"    for n0 in range(0, {sk}, {bn}):",
        f"        rn = n0 + tl.arange(0, {bn})",
        f"        key_ok = rn < {sk}",
        f"        kt = tl.load(k + {_at(spec.k, 'b', 'h', 'rn[None, :]', 'rd[:, None]')}, "
        f"mask=key_ok[None, :]{d_mask_t}, other=0.0)",
        f"        scores = tl.dot(qt, kt) * {float(spec.scale)!r}",
        f"        scores += tl.load(mask + b * {mb} + h * {mh} + rm[:, None] * {mi} + rn[None, :] * {mj}, "
        "mask=row_ok[:, None] & key_ok[None, :], other=0.0).to(tl.float32)",
        "        scores = tl.where(key_ok[None, :], scores, float('-inf'))",
        "        m_new = tl.maximum(m_i, tl.max(scores, 1))",
        "        m_base = tl.where(m_new == float('-inf'), 0.0, m_new)  # a row masked so far: exps of -inf, zeros",
        "        p = tl.exp(scores - m_base[:, None])",
        "        alpha = tl.exp(m_i - m_base)",
        "        l_i = l_i * alpha + tl.sum(p, 1)",
        f"        vt = tl.load(v + {_at(spec.v, 'b', 'h', 'rn[:, None]', 'rd[None, :]')}, "
        f"mask=key_ok[:, None]{d_mask}, other=0.0)",
        "        acc = tl.dot(p.to(tl.float16), vt, acc * alpha[:, None])",
        "        m_i = m_new",
        "    context = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]",
        f"    tl.store(out + b * {s * heads * d} + rm[:, None] * {heads * d} + h * {d} + rd[None, :], "
        f"context.to(tl.float16), mask=row_ok[:, None]{d_mask})",
    ]
    return "\n".join(lines) + "\n"


def jit_function(spec, config: AttentionConfig):
    """The kernel as a @triton.jit function (what Triton's interpreter runs on a CPU)."""
    name = kernel_name(spec, config)
    return jit_function_of(name, kernel_source(spec, config, name))


def compile_attention(spec, config: AttentionConfig, *, arch: int) -> CompiledKernel:
    """The kernel compiled for sm_<arch>: Triton's own ptxas, no GPU needed."""
    name = kernel_name(spec, config)
    dtypes = ["float16", "float16", "float16", spec.mask.dtype, "float16"]
    return compile_source(name, kernel_source(spec, config, name), [_POINTER[t] for t in dtypes],
                          warps=config.warps, stages=config.stages, arch=arch, grid=grid(spec, config))


def launching_func(func, kernel: CompiledKernel):
    """`func` (the fused attention's PrimFunc: q, k, v, mask, out) with a body that launches `kernel`."""
    return launching_call(func, [p.data for p in func.params], kernel, kind=KIND)
