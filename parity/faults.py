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


class FaultNotApplicable(ValueError):
    """A fault aimed at a module whose stored form it cannot change: planted, it would plant nothing (the run would
    pass and the harness would look blind), so it is refused by name, as a module the model lacks is."""


def _packed(fault: str, module: str, entry):
    if entry.pack is None:
        raise FaultNotApplicable(f"fault {fault!r} cannot be planted in {module}: it is stored as float values "
                                 f"({entry.weight_key}), with no codes or bit fields to misread; aim it at a packed "
                                 f"ternary linear")
    return entry.pack


def code_table_swapped(module: str) -> Overrides:
    """+1 and -1 codes exchanged when decoding one module (a sign-mask pair: its +1 and -1 masks exchanged)."""
    def swap(entry):
        pack = _packed("code_table_swapped", module, entry)
        if pack.codec == "sign_masks":  # the flag tables are 0 / 1: the sign lives in which mask is which
            return dataclasses.replace(entry, weight_key=entry.neg_key, neg_key=entry.weight_key)
        codes = tuple(-v if v in (1, -1) else v for v in pack.codes)
        return dataclasses.replace(entry, pack=pack.replace(codes=codes))
    return Overrides(spec_hook=_only(module, swap))


def bit_order_reversed(module: str) -> Overrides:
    """2-bit fields read MSB-first instead of LSB-first in one module."""
    def flip(entry):
        pack = _packed("bit_order_reversed", module, entry)
        if pack.values_per_container == 1 or pack.codec == "tq1_0":
            why = (f"one code per {pack.container} element" if pack.values_per_container == 1 else
                   "llama.cpp TQ1_0 records fix their digit order whatever bit_order says")
            raise FaultNotApplicable(f"fault 'bit_order_reversed' cannot be planted in {module}: {why}, so reading "
                                     f"the bits the other way round decodes the same weights; aim it at a module "
                                     f"that packs several codes per container")
        return dataclasses.replace(entry, pack=pack.replace(bit_order="msb" if pack.bit_order == "lsb" else "lsb"))
    return Overrides(spec_hook=_only(module, flip))


def scale_dropped(module: str) -> Overrides:
    """The weight scale of one module is never applied."""
    def drop(d):
        if d.div is None and bool((d.mult == 1).all()):
            raise FaultNotApplicable(f"fault 'scale_dropped' cannot be planted in {module}: its decode applies no "
                                     f"scale (multiplier 1: no scale tensor, or the magnitudes stored in the weights "
                                     f"themselves), so dropping it changes nothing")
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
