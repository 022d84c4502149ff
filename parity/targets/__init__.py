"""Pluggable parity targets.  Add one by writing a ``Target`` subclass and registering its
import path here (lazy, so optional dependencies such as vLLM load only when asked for)."""
from __future__ import annotations

import importlib

from .base import Target

REGISTRY: dict[str, str] = {
    "reference": "parity.targets.reference:ReferenceTarget",  # fp32 reference (self-check)
    "bf16": "parity.targets.reference:Bf16Target",  # same architecture, bf16, independent decode
    "transformers": "parity.targets.hf:TransformersTarget",  # transformers' own BitLinear
    "kernel": "parity.targets.kernel:KernelTarget",  # reference architecture + trit.ops kernels
    "vllm": "parity.targets.vllm:VllmTarget",  # vLLM + the trit plugin
}


def get_target(name: str, **options) -> Target:
    if name not in REGISTRY:
        raise KeyError(f"unknown target {name!r}; known: {sorted(REGISTRY)}")
    mod, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(mod), cls)(**options)
