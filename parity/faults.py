"""Planted faults: deliberate, localised bugs for testing the harness itself.

Each returns a ``reference.model.Overrides`` for ``parity.targets.reference.FaultyTarget``;
the harness must name exactly the planted layer and operator first, with the right hint.
Module names are HF names (``model.layers.3.self_attn.v_proj``).
"""
from __future__ import annotations

import dataclasses

import torch

from reference.model import Overrides


def _only(module: str, fn):
    """A hook that changes one module only; its ``modules`` names it, so the model refuses a name it does not have
    (a misspelt module would otherwise plant nothing, and the run would pass)."""
    def hook(name, obj):
        return fn(obj) if name == module else obj
    hook.modules = (module,)
    return hook


def code_table_swapped(module: str) -> Overrides:
    """+1 and -1 codes exchanged when decoding one module."""
    def swap(entry):
        codes = tuple(-v if v in (1, -1) else v for v in entry.pack.codes)
        return dataclasses.replace(entry, pack=entry.pack.replace(codes=codes))
    return Overrides(spec_hook=_only(module, swap))


def bit_order_reversed(module: str) -> Overrides:
    """2-bit fields read MSB-first instead of LSB-first in one module."""
    def flip(entry):
        return dataclasses.replace(entry, pack=entry.pack.replace(
            bit_order="msb" if entry.pack.bit_order == "lsb" else "lsb"))
    return Overrides(spec_hook=_only(module, flip))


def scale_dropped(module: str) -> Overrides:
    """The weight scale of one module is never applied."""
    def drop(d):
        return dataclasses.replace(d, mult=torch.ones(1, 1), div=None)
    return Overrides(linear_hook=_only(module, drop))


def norm_eps(norms: list[str], eps: float) -> Overrides:
    """RMSNorm epsilon changed for the given canonical norm names."""
    return Overrides(norm_eps={n: eps for n in norms})


def wrong_qkv_split(layer: int) -> Overrides:
    """v_proj given k_proj's rows (v := k), as a loader that splits a fused qkv at the wrong offset would; the
    harness names layer<L>.attn.v_proj."""
    state = {}

    def hook(name, d):
        p = f"model.layers.{layer}.self_attn."
        if name == p + "k_proj":
            state["k"] = d
        if name == p + "v_proj":
            k = state["k"]
            state["swap"] = (d, k)
            return k
        return d
    hook.modules = (f"model.layers.{layer}.self_attn.k_proj", f"model.layers.{layer}.self_attn.v_proj")
    return Overrides(linear_hook=hook)


def residual_dropped(layer: int, branch: str) -> Overrides:
    """The residual add of one layer's attention or MLP branch dropped: the stream becomes the branch alone."""
    if branch not in ("attn", "mlp"):
        raise ValueError(f"branch must be 'attn' or 'mlp', got {branch!r}")
    return Overrides(drop_residual={(layer, branch)})
