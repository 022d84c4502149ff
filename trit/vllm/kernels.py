"""The kernel contract the vLLM plugin codes against, and a pure-torch stand-in with the same
signatures (used until / unless ``trit.ops`` provides the real ops).

Contract (owned by ``trit/ops.py``; the plugin only calls these):

    repack(w: int8 (N, K), values in {-1, 0, +1}) -> packed          # offline, once per layer
    ternary_linear(x: bf16|fp16|fp32 (M, K), packed, scale: fp32 (N,), N, K, bias=None)
        -> (M, N) in x.dtype;   y[m, n] = scale[n] * sum_k x[m, k] * W[n, k]  (+ bias[n])
    torch.ops.trit.ternary_mm_a8(x (M, K), packed, scale (N,), N, K, bias)
        -> (M, N) in x.dtype;   BitNet W1.58A8, exactly transformers' BitLinear /
           reference.model.act_quant_int8:  xs = 127 / max(|x[m, :]|, 1e-5),
           xq = clamp(round(x * xs), -128, 127),  y = (sum_k xq W) / xs * scale[n]  (+ bias[n])

``packed`` is opaque here: whatever ``repack`` returns is only ever handed back to the same
backend's linear ops, so the plugin never depends on the kernel's layout.  A ``Backend`` is
picked once per layer at load time and stored on the layer (no global switch at run time).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Backend:
    name: str
    repack: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[..., torch.Tensor]  # (x2d, packed, scale, N, K, bias=None)
    linear_a8: Callable[..., torch.Tensor]  # (x2d, packed, scale, N, K, bias=None)
    # linear_a8 with the activation quantizer as torch ops in front (fusable into the norm before
    # the layer under torch.compile); None where the backend has no such op (TRIT_A8_PREQUANT)
    linear_a8_pre: Optional[Callable[..., torch.Tensor]] = None


# ---------------------------------------------------------------------------------------
# pure-torch stand-in: packed = the int8 matrix itself (N, K)


def repack_ref(w: torch.Tensor) -> torch.Tensor:
    """int8 (N, K) in {-1, 0, 1} -> the stand-in's 'packed' form: int8 (N, K), contiguous."""
    if w.dim() != 2:
        raise ValueError(f"repack expects a 2-D (N, K) int8 matrix, got shape {tuple(w.shape)}")
    return w.to(torch.int8).contiguous()


def ternary_linear_ref(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, N: int, K: int,
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(M, K) -> (M, N): scale[n] * (x @ W^T)[m, n] (+ bias).  The matmul runs in x.dtype, as the
    reference does; the scale is applied in fp32 after it."""
    y = F.linear(x, packed.to(x.dtype)).float() * scale.float()  # (M, N)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def ternary_mm_a8_ref(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, N: int, K: int,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """BitNet W1.58A8 (see module docstring); accumulation in fp32 (exact for int8 x ternary
    as long as K * 128 < 2**24)."""
    xf = x.float()
    xs = 127.0 / xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)  # (M, 1)
    xq = (xf * xs).round().clamp(-128, 127)
    y = F.linear(xq, packed.float()) / xs * scale.float()  # (M, N)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


TORCH_REF = Backend("torch-ref", repack_ref, ternary_linear_ref, ternary_mm_a8_ref)


# ---------------------------------------------------------------------------------------
# the real ops


def _trit_backend() -> Optional[Backend]:
    try:
        import trit.ops as ops  # noqa: F401  (teammate's module; registers torch.ops.trit.*)
    except ImportError:
        return None
    repack = getattr(ops, "repack", None)
    linear = getattr(ops, "ternary_linear", None)
    if repack is None or linear is None:
        return None
    # ternary_linear_a8 = the any-rank wrapper of torch.ops.trit.ternary_mm_a8 (same signature)
    a8 = getattr(ops, "ternary_linear_a8", None)
    if a8 is None and hasattr(torch.ops, "trit") and hasattr(torch.ops.trit, "ternary_mm_a8"):
        a8 = torch.ops.trit.ternary_mm_a8
    if a8 is None:
        # No fused A8 kernel yet: quantise the activations in torch, run the plain kernel on the
        # integer-valued activations (exact in bf16/fp16: |xq| <= 128), divide by xs after.
        def a8(x, packed, scale, N, K, bias=None):
            xf = x.float()
            xs = 127.0 / xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
            xq = (xf * xs).round().clamp(-128, 127).to(x.dtype)
            y = linear(xq, packed, scale, N, K).float() / xs
            if bias is not None:
                y = y + bias.float()
            return y.to(x.dtype)
    return Backend("trit.ops", repack, linear, a8, getattr(ops, "ternary_linear_a8_pre", None))


def get_backend(name: str = "auto") -> Backend:
    """'auto' = trit.ops when it is importable and complete, else the torch stand-in;
    'trit' = trit.ops or an error; 'torch' = the stand-in."""
    if name == "torch":
        return TORCH_REF
    b = _trit_backend()
    if b is not None:
        return b
    if name == "trit":
        raise ImportError("trit.ops (repack, ternary_linear) is not importable; build csrc or use backend='torch'")
    if name != "auto":
        raise ValueError(f"unknown kernel backend {name!r}; use 'auto', 'trit' or 'torch'")
    return TORCH_REF
