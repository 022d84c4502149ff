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


def parse_options(items) -> dict:
    """['dtype=bfloat16', 'enforce_eager=false', 'tp=2'] -> {'dtype': 'bfloat16', 'enforce_eager': False, 'tp': 2}."""
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep:
            raise ValueError(f"target option {it!r} must look like KEY=VALUE")
        low = v.lower()
        if low in ("true", "false"):
            out[k] = low == "true"
        else:
            try:
                out[k] = int(v)
            except ValueError:
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
    return out


def get_target(name: str, **options) -> Target:
    if name not in REGISTRY:
        raise KeyError(f"unknown target {name!r}; known: {sorted(REGISTRY)}")
    mod, cls = REGISTRY[name].split(":")
    klass = getattr(importlib.import_module(mod), cls)
    try:
        return klass(**options)
    except (TypeError, AttributeError) as e:  # an unknown option, or a value of the wrong kind
        import inspect
        raise ValueError(f"target {name!r} does not take options {options} ({type(e).__name__}: {e}); its "
                         f"constructor is {cls}{inspect.signature(klass)}") from None
