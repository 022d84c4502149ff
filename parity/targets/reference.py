"""Targets built on the reference architecture.

* ``reference`` — the fp32 reference itself (the goldens must reproduce bit-for-bit; a
  self-check that catches a changed reference or stale goldens).
* ``bf16`` — the same architecture computed in bf16 from the packed weights, decoded by an
  *independent* path (a 256-entry byte lookup table and reshapes, not the index arithmetic
  of ``reference.formats``), so the tolerance tiers are exercised by real rounding error and
  a decode bug in either path shows.
* ``FaultyTarget`` — the reference with deliberate, localised faults (tests of the harness).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from reference.checkpoint import Checkpoint
from reference.config import ModelConfig
from reference.formats import PackSpec, _narrow
from reference.model import Linear, Overrides, ReferenceModel, _to
from reference.spec import DecodedLinear, LinearEntry, decode_linear, finish_linear, spec_for

from .base import Target, as_dtype


def _capture(model: ReferenceModel, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}

    def tap(name, t):
        out[name] = t.detach().float().cpu().clone()

    model.forward(input_ids, tap)
    return out


class ReferenceTarget(Target):
    name = "reference"
    compute_dtype = "fp32"
    bit_faithful = True

    def __init__(self, overrides: Optional[Overrides] = None, dtype: torch.dtype = torch.float32,
                 device: str = "cpu", act_quant: str = "multiply"):
        if overrides is not None and not isinstance(overrides, Overrides):
            raise ValueError(f"overrides must be a parity.targets.reference.Overrides (a Python API option, not a "
                             f"command-line value), got {overrides!r}")
        dtype = as_dtype(dtype, "reference target")  # --target-opt dtype=bfloat16
        if dtype != torch.float32 and type(self) is ReferenceTarget:
            # the reference computed in a narrower dtype is no longer the golden's arithmetic: its dtype's tiers
            self.compute_dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
            self.bit_faithful = False
        if act_quant not in ("multiply", "divide"):
            raise ValueError(f"reference target: act_quant={act_quant!r}, expected 'multiply' (the golden's arithmetic) "
                             f"or 'divide'")
        self.act_quant = act_quant
        if act_quant == "divide" and type(self) is not ReferenceTarget:
            raise ValueError(f"{type(self).__name__}: act_quant=divide is an option of the plain reference target")
        if act_quant == "divide":
            # --target-opt act_quant=divide: the int8 activation quantiser as x / (absmax / 127) and the product
            # rescaled by absmax / 127 - the same math with other roundings, so some x * 127 / absmax cross a .5
            # boundary: an independent fp32 implementation of a W1.58A8 model built from the reference's own code
            # (no trit op in it), the floor `parity.noise` needs for the fp32-a8 column (the kernel and vLLM targets
            # share the trit ops, so neither can measure the other's)
            if overrides is not None:
                raise ValueError("reference target: act_quant=divide and overrides together are not supported")
            self.bit_faithful = False
            self.name = "reference-divide"  # its own name in noise files: never excluded as the plain reference's floor
            overrides = Overrides(linear_factory=lambda d, aq, dt, name: _DivideQuantLinear(_to(d, torch.device(device)), aq, dt))
        self.overrides = overrides
        self.dtype = dtype
        self.device = device

    def model(self, model_dir: Path, spec_path=None) -> ReferenceModel:
        return ReferenceModel.from_dir(model_dir, spec_path=spec_path, dtype=self.dtype, overrides=self.overrides,
                                       device=self.device)

    def capture(self, model_dir, input_ids, *, spec_path=None):
        return _capture(self.model(Path(model_dir), spec_path), input_ids)

    def generate(self, model_dir, input_ids, max_new_tokens, *, spec_path=None):
        return self.model(Path(model_dir), spec_path).generate(input_ids, max_new_tokens)


class _DivideQuantLinear(Linear):
    """reference.model.Linear with the activation quantiser's other rounding order (ReferenceTarget act_quant=divide)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.act_quant:
            return super().__call__(x)
        x = x.float()
        step = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5) / 127.0  # absmax / 127, divided by, not 127 / absmax
        xq = (x / step).round().clamp(-128, 127)
        return self.finish(F.linear((xq * step).to(self.dtype), self.w).float())


class FaultyTarget(ReferenceTarget):
    """The fp32 reference with planted faults (see ``parity.faults``)."""

    name = "faulty-reference"


# ---------------------------------------------------------------------------------------
# independent byte-LUT decoder (uint8 containers, every lane layout and bit order)


def _byte_lut(pack: PackSpec) -> torch.Tensor:
    """lut[byte, slot] = value of slot ``slot`` (slot order, not bit order) in that byte."""
    v = pack.values_per_container
    table = torch.zeros(256, v, dtype=torch.int16)
    for byte in range(256):
        for slot in range(v):
            shift = slot * pack.bits if pack.bit_order == "lsb" else (v - 1 - slot) * pack.bits
            code = (byte >> shift) & ((1 << pack.bits) - 1)
            val = pack.codes[code]
            table[byte, slot] = 0 if val is None else int(val)
    return table


def lut_decode(packed: torch.Tensor, pack: PackSpec, shape: tuple[int, int]) -> torch.Tensor:
    """Decode a uint8-packed matrix with a byte table: (N, K) int16."""
    if pack.container != "uint8":
        raise NotImplementedError(f"the bf16 target's independent decoder reads uint8 containers, not {pack.container}")
    if pack.stored_as is not None:  # HQQ view_as_float: the float tensor's bytes are the uint8 containers
        if packed.dtype != getattr(torch, pack.stored_as):
            raise ValueError(f"packed tensor is {packed.dtype}, the spec says uint8 stored as {pack.stored_as}")
        return lut_decode(packed.contiguous().view(torch.uint8), pack.replace(stored_as=None), shape)
    if pack.segments is not None:  # fused parts packed one by one: decode each packed segment on its own
        from reference.formats import _by_segment

        return _by_segment(packed, pack, shape, lut_decode)
    if pack.group_view is not None:  # HQQ: the packed matrix is W's [N*K/G, G] (axis=1) or [G, N*K/G] (axis=0) view
        return lut_decode(packed, pack.ungrouped(), pack.view_shape(shape)).reshape(shape)
    p = packed.t() if pack.transposed else packed
    if pack.pack_axis == 0:
        p = p.t()  # now (rows, packed_len) with packing along dim 1
    if pack.record is not None:  # record-packed (llama.cpp TQ2_0): each record's code bytes, side bytes dropped
        elems, nbytes = pack.record
        p = p.reshape(p.shape[0], -1, nbytes)[:, :, :elems // pack.values_per_container].reshape(p.shape[0], -1)
    rows, plen = p.shape
    v = pack.values_per_container
    vals = _byte_lut(pack)[p.long()]  # (rows, plen, V): value of each slot
    length = (shape[0], shape[1])[pack.pack_axis]
    if pack.lanes == "interleaved":
        full = vals.reshape(rows, plen * v)  # container-major, slot-minor = consecutive
    else:
        blk = plen * v if pack.lanes == "blocked" else pack.block
        per = blk // v  # containers per block
        nblk = plen // per
        # (rows, nblk, per, V) -> slot-major inside a block
        full = vals.reshape(rows, nblk, per, v).permute(0, 1, 3, 2).reshape(rows, nblk * blk)
    full = full[:, :length]
    return (full.t() if pack.pack_axis == 0 else full).contiguous()


def lut_decoder(ckpt: Checkpoint, entry: LinearEntry, name: str) -> DecodedLinear:
    if entry.pack is None or entry.pack.container != "uint8" or entry.pack.codec is not None \
            or entry.pack.order is not None:
        # unpacked, wide containers, base-3 (TQ1_0) or a slot order (AutoAWQ): the shared path
        return decode_linear(ckpt, entry, name)
    vals = _narrow(lut_decode(ckpt.get(entry.weight_key), entry.pack, entry.shape))  # int8 unless a code > 127
    return finish_linear(ckpt, entry, vals, name)


class Bf16Target(ReferenceTarget):
    name = "bf16"
    compute_dtype = "bf16"
    bit_faithful = False

    def __init__(self, overrides: Optional[Overrides] = None, device: str = "cpu"):
        ov = overrides or Overrides()
        if ov.decoder is None:
            ov.decoder = lut_decoder
        super().__init__(overrides=ov, dtype=torch.bfloat16, device=device)
