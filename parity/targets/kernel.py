"""The ``kernel`` target: the reference architecture with every ternary linear computed by
our torch.library ops (``trit.ops``): the CUDA kernels on a GPU (bf16 activations, bf16
tiers), their CPU implementation elsewhere (fp32).  This isolates the kernels from vLLM:
a red test here is the kernel's fault, not the serving stack's.

Weights go through the ops' own offline ``repack`` from the decoded integer matrix, so a
repack bug shows as well.  Group scales (not expressible as the ops' per-channel scale) are
refused with a clear error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from reference.model import Overrides, ReferenceModel
from reference.spec import DecodedLinear

from .base import Target, as_dtype
from .reference import _capture


class KernelLinear:
    def __init__(self, d: DecodedLinear, act_quant: bool, dtype: torch.dtype, name: str, device):
        from trit import ops

        if d.mult.shape[-1] != 1:
            raise NotImplementedError(f"{name}: group-wise scales cannot be expressed as the kernel's per-channel "
                                      f"scale; dequantize or extend trit.ops")
        vals = d.values
        whole = bool((vals == vals.round()).all())
        if not whole or int(vals.abs().max()) > 1:
            # the kernels hold {-1, 0, +1} only: int4 / int8 levels were refused by repack without the module's
            # name, and non-integer values (q - z with float zero points, per-channel scale) were cut to int8
            # (1.4 -> 1) without a word - a kernel "divergence" the kernel never made
            raise NotImplementedError(f"{name}: values {float(vals.min()):g}..{float(vals.max()):g}"
                                      f"{'' if whole else ', not all integers'}: the trit kernels hold ternary weights "
                                      f"{{-1, 0, +1}} only; use the reference, bf16 or vllm target (vLLM's plugin runs "
                                      f"other levels densely)")
        n, k = vals.shape
        self.N, self.K = n, k
        self.ops = ops
        self.act_quant = act_quant
        self.dtype = dtype
        self.packed = ops.repack(d.values.to(torch.int8)).to(device)
        self.scale = d.mult.reshape(-1).float().expand(n).contiguous().to(device)  # (N,) multiplier
        self.bias = None if d.bias is None else d.bias.to(device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        f = self.ops.ternary_linear_a8 if self.act_quant else self.ops.ternary_linear
        return f(x.to(self.dtype).contiguous(), self.packed, self.scale, self.N, self.K, self.bias)


class KernelTarget(Target):
    name = "kernel"

    def __init__(self, device: Optional[str] = None, dtype: Optional[torch.dtype] = None):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # --target-opt dtype=bfloat16 arrives as a string
        self.dtype = as_dtype(dtype, "kernel target") if dtype is not None else \
            (torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        self.compute_dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]

    def model(self, model_dir: Path, spec_path=None) -> ReferenceModel:
        ov = Overrides(linear_factory=lambda d, aq, dt, name: KernelLinear(d, aq, dt, name, self.device))
        return ReferenceModel.from_dir(model_dir, spec_path=spec_path, dtype=self.dtype, overrides=ov,
                                       device=self.device)

    def capture(self, model_dir, input_ids, *, spec_path=None):
        return _capture(self.model(Path(model_dir), spec_path), input_ids)

    def generate(self, model_dir, input_ids, max_new_tokens, *, spec_path=None):
        return self.model(Path(model_dir), spec_path).generate(input_ids, max_new_tokens)

    def describe(self) -> str:
        return f"kernel ({self.device}, {self.compute_dtype})"
