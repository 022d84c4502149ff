"""Canonical names of captured tensors, in execution order, and their comparison tiers.

    embed
    layer{L}.input_norm
    layer{L}.attn.q_proj | k_proj | v_proj      projection outputs, before RoPE   (B, T, H*D)
    layer{L}.attn.attn_out                      softmax(QK^T)V, heads merged, before sub-norm / o_proj
    layer{L}.attn.sub_norm                      BitNet only
    layer{L}.attn.o_proj
    layer{L}.post_attn_norm
    layer{L}.mlp.gate_proj | up_proj
    layer{L}.mlp.act                            act(gate) * up  (silu or relu^2)
    layer{L}.mlp.sub_norm                       BitNet only
    layer{L}.mlp.down_proj
    layer{L}.output                             decoder-layer output (residual stream)
    final_norm
    logits
Every tensor is float32 (B, T, features), B prompts x T positions.
"""
from __future__ import annotations

import re

LAYER_OPS = [
    ("input_norm", "block"),
    ("attn.q_proj", "operator"),
    ("attn.k_proj", "operator"),
    ("attn.v_proj", "operator"),
    ("attn.attn_out", "attention"),
    ("attn.sub_norm", "block"),
    ("attn.o_proj", "operator"),
    ("post_attn_norm", "block"),
    ("mlp.gate_proj", "operator"),
    ("mlp.up_proj", "operator"),
    ("mlp.act", "operator"),
    ("mlp.sub_norm", "block"),
    ("mlp.down_proj", "operator"),
    ("output", "block"),
]
BITNET_ONLY = {"attn.sub_norm", "mlp.sub_norm"}

#: the linear module (HF name suffix) behind each linear output, and the captured tensor that is its input
LINEAR_OPS = {
    "attn.q_proj": ("self_attn.q_proj", "input_norm"),
    "attn.k_proj": ("self_attn.k_proj", "input_norm"),
    "attn.v_proj": ("self_attn.v_proj", "input_norm"),
    "attn.o_proj": ("self_attn.o_proj", "attn.sub_norm|attn.attn_out"),
    "mlp.gate_proj": ("mlp.gate_proj", "post_attn_norm"),
    "mlp.up_proj": ("mlp.up_proj", "post_attn_norm"),
    "mlp.down_proj": ("mlp.down_proj", "mlp.sub_norm|mlp.act"),
}

_LAYER_RE = re.compile(r"^layer(\d+)\.(.+)$")


def canonical_names(num_layers: int, arch: str) -> list[str]:
    """All canonical names of a model, in execution order."""
    names = ["embed"]
    for L in range(num_layers):
        for op, _ in LAYER_OPS:
            if op in BITNET_ONLY and arch != "bitnet":
                continue
            names.append(f"layer{L}.{op}")
    return names + ["final_norm", "logits"]


def split(name: str) -> tuple[int | None, str]:
    """'layer3.attn.v_proj' -> (3, 'attn.v_proj'); 'logits' -> (None, 'logits')."""
    m = _LAYER_RE.match(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


def tier(name: str) -> str:
    """operator | attention | block | model."""
    layer, op = split(name)
    if layer is None:
        return "block" if name == "embed" else "model"
    return dict(LAYER_OPS)[op]


def hf_module(name: str) -> str | None:
    """'layer3.attn.v_proj' -> 'model.layers.3.self_attn.v_proj' (linear outputs only)."""
    layer, op = split(name)
    if layer is None or op not in LINEAR_OPS:
        return None
    return f"model.layers.{layer}.{LINEAR_OPS[op][0]}"


def linear_input(name: str, available) -> str | None:
    """Canonical name of the captured tensor that feeds linear output ``name``."""
    layer, op = split(name)
    if layer is None or op not in LINEAR_OPS:
        return None
    for cand in LINEAR_OPS[op][1].split("|"):
        if f"layer{layer}.{cand}" in available:
            return f"layer{layer}.{cand}"
    return None
