"""Writers for public ternary / 2-bit checkpoint conventions (see /work/shared/FORMATS.md).

Input: a ``Logical`` model -- per linear module an int8 ternary matrix ``T (N, K)`` and a float32
multiplier ``m`` (``(1, 1)`` per tensor, ``(N, 1)`` per channel, ``(N, K)`` expanded groups)
with ``W_eff = T * m`` -- plus the float tensors and config.json.  ``write(fmt, logical, out)``
stores it exactly as the named convention does and returns the ground truth *after* storage
rounding (fp16 / bf16 scales), so tests can demand a bit-exact ``T`` and ``W_eff`` within the
rounding of the stored scale.

Conventions (``FORMATS`` keys):
  hf-bitlinear        transformers pack_weights (axis 0, blocked, LSB, code w+1), weight_scale [1]
                      = 1/m, divided (linear_class bitlinear)
  hf-autobitlinear    same packing, weight_scale [1] = m, multiplied
  hf-dot-scale        hf-bitlinear with the scale under ``<module>.weight.scale`` (1/m, divided)
  hf-bare-scale       hf-autobitlinear with the scale under ``<module>.scale`` (m, multiplied)
  hf-scale-inv-divide / hf-scale-inv-multiply
                      hf-bitlinear packing and config, the scale under ``<module>.weight_scale_inv``:
                      1/m divided (what the config's bitlinear says of weight_scale), or m multiplied (the
                      FP8 / DeepSeek reading of an inverse scale, against the config's op)
  hf-bitlinear-head   hf-bitlinear with modules_to_not_convert [] (transformers then makes lm_head a BitLinear
                      too); write a ``Logical.with_ternary_head()`` so that lm_head is packed + weight_scale
  seed                uint8 [N, K/4] 4 consecutive inputs per byte LSB-first, 0->0 1->+1 2->-1,
                      per-channel fp16 scale [N], keys ``*.weight_ternary`` / ``*.scale``
  seed-msb            the seed layout with slot 0 in the high bits
  group               seed packing with per-group fp16 scales [N, K/64]
  compressed-tensors  pack-quantized num_bits=2: weight_packed int32 [N, ceil(K/16)] (consecutive
                      inputs, low bits first, code v+2), weight_shape, weight_scale [N, 1]
  gptq                AutoGPTQ v1 int2: qweight int32 [K/16, N], qzeros [G, N/16] holding z-1 = 1,
                      scales fp16 [G, N], g_idx [K]; W = s * (q - 2)
  gptq-actorder       gptq with desc_act true: g_idx int32 [K] a permutation of arange(K) // 64 (``actorder_g_idx``
                      of ``actorder_perms``), each group's scale that of its first input in activation order; write a
                      ``Logical.with_group_jitter(64, g_idx=...)`` of that index so the groups differ
  tq2_0               llama.cpp TQ2_0 as a safetensors tensor: uint8 [N, ceil(K/256) * 66], per 256 inputs
                      qs[64] (byte m of half h = elems 128h+m+32n at bits 2n, code w+1) + fp16 d
                      (multiply); GGUF tensor names, no separate scale tensor.  Writes per-256
                      group multipliers (``Logical.with_group_jitter(256)``); a partial last block
                      (K % 256, which llama.cpp itself never writes) is padded with code 1 (= 0)
  tq1_0               llama.cpp TQ1_0 as a safetensors tensor: uint8 [N, ceil(K/256) * 54], per 256 inputs
                      qs[48] (5 base-3 digits a byte: elements 32n + m of byte m < 32, 160 + 16n + m of byte
                      32 + m), qh[4] (4 digits: element 240 + 4n + j of byte j), trit w + 1, each byte
                      ceil(v * 256 / 243), then fp16 d (multiply); GGUF tensor names.  Per-256 group multipliers
                      as tq2_0
  hqq                 HQQ 2-bit (mobiusml/hqq, axis=1, group 64), ternary case: per module ``W_q`` uint8
                      [N*K/256, 64] = BitPack.pack_2bit_u8 of the group view W.reshape(-1, 64) (four
                      axis-0 chunks, chunk 0 in bits 7-6), ``scale`` / ``zero`` fp16 [N*K/64, 1];
                      q = w + z with an integer zero z in {1, 2} per group; W = (q - z) * scale.
                      Only W_q / scale / zero are written (no HQQ meta tensors)
  hqq-meta            hqq plus HQQ's meta tensors, as HQQLinear.state_dict (encoded_state_dict=True) writes
                      them (``hqq_meta``: nbits, group_size, shape, axis, packing, ... each through
                      hqq/core/utils.py encode_safetensor_type)
  hqq-axis0           HQQ axis=0 (group 64): the view is W.reshape(64, -1) (Quantizer.quantize), one group
                      per column; ``W_q`` uint8 [16, N*K/64] = pack_2bit_u8 of that view, ``scale`` /
                      ``zero`` fp16 [1, N*K/64]; element f of the flattened W takes scale / zero f mod (N*K/64).
                      Write a ``Logical.with_group_jitter(64, axis=0)`` to give each such group its own scale
  hqq-axis0-meta      hqq-axis0 plus the meta tensors
  i2s                 bitnet.cpp I2_S: uint8 [N, K/4], per 128-block byte j = elems j, 32+j, 64+j,
                      96+j at bits 7-6 .. 1-0, 0->-1 1->0 2->+1, one f32 scale; GGUF tensor names
  trilm               fp16 [N, K] with values {-s, 0, +s}, one s per model-parallel shard
  bitnet-gpu          Microsoft BitNet GPU style: fused wqkv / w13 int8 [N, K/4], code w+2,
                      4-byte bit-interleaved lanes, bf16 scale per sub-matrix; Meta-style names
  int8-ternary        unpacked: int8 [N, K] holding -1 / 0 / +1 directly, bf16 scale [N] multiplied
  uint8-ternary       unpacked: uint8 [N, K] holding codes w+1, weight_scale [1] = 1/m divided
  uint8-ternary-perm  unpacked: uint8 [N, K], codes 0->0 1->+1 2->-1, fp16 group scales [N, K/64]
  nibble-ternary      two 4-bit codes per uint8 [N, K/2], w+1, high nibble first, fp16 scale [N]
  gptq-int4-ternary   AutoGPTQ v1 int4 storing ternary (codes 7, 8, 9), qzeros z-1 = 7
  gptq-int3-ternary   AutoGPTQ v1 int3 storing ternary (codes 3, 4, 5), qzeros z-1 = 3: qweight int32 [K/32*3, N],
                      32 codes of 32 consecutive inputs as one bit stream in 3 words (codes straddle words), qzeros
                      [G, N/32*3] the same along N (QuantLinear.pack's bits == 3 branch; PackSpec codec 'bitstream')
  compressed-tensors-int4-ternary
                      pack-quantized num_bits=4: int32 [N, K/8], code v+8 (ternary uses 7, 8, 9),
                      group scales [N, K/64]
  base3               plain base-3 packing (PackSpec codec 'base3'): uint8 [N, ceil(K/5)], five consecutive inputs
                      per byte as the digits of sum t_i * 3^i (trit t = w + 1, digit i = input 5c + i: LSB-first),
                      the last byte of a row padded with trit 1 (w = 0); per-channel fp16 ``weight_scale`` [N]
                      multiplied (``w_base3``)
  base3-msb-pad0      the same, MSB-first (t_0 * 81 + t_1 * 27 + ...), padded with trit 0
  float-codes-bf16    unpacked codes stored as floats (PackSpec codec 'float_codes'): bf16 [N, K] holding t = w + 1
                      (0.0 / 1.0 / 2.0), per-channel fp16 ``weight_scale`` [N] multiplied (``w_float_codes``)
  sign-masks-bool     a +1 / -1 sign-bitmask pair per linear (PackSpec codec 'sign_masks', LinearEntry.neg_key):
                      ``<module>.weight_pos`` set where w = +1 and ``.weight_neg`` where w = -1, bool [N, K] (one
                      flag per weight), per-channel fp16 ``weight_scale`` [N] multiplied (``w_sign_masks``)
  sign-masks-u8       the same as uint8 0 / 1 [N, K]
  sign-masks-u8-packed
                      eight flags per byte, uint8 [N, ceil(K/8)], input 8c + i at bit 7 - i (``np.packbits``' default
                      bit order, msb first), the last byte padded with 0 flags
  sign-masks-u8-packed-lsb
                      the same with input 8c + i at bit i (``np.packbits(..., bitorder="little")``)
  compressed-tensors-mixed
                      mixed code widths in one model: pack-quantized ternary, int-4 (int32 [N, K/8], codes
                      7 / 8 / 9) for layer 0 and every down_proj, int-2 (int32 [N, K/16]) elsewhere;
                      per-channel fp16 scales [N, 1]; one config_group per width

HQQ's quantizer on a float model (``HQQ_FORMATS``, ``w_hqq_quant``: the logical weights plus noise, quantized as
mobiusml/hqq ``Quantizer.quantize`` does with optimize=False; asymmetric levels, not ternary; take any ``Logical``):
  hqq-2bit, hqq-2bit-nometa, hqq-2bit-axis0
                      2bit_u8, float zero points (round_zero False), groups of 64, with / without meta tensors
  hqq-3bit, hqq-3bit-axis0-nometa
                      3bit_32: int32 W_q, ten 3-bit fields per word (bits 30-31 unused), rows padded to 10
  hqq-4bit, hqq-4bit-nometa
                      4bit_u8 with HQQ's rounded (integer) zero points for nbits 4
  hqq-1bit, hqq-8bit  1bit_u8 (eight chunks per byte), 8bit_u8 (one code per byte)
  hqq-mixed           4-bit attention projections, 2-bit MLP
  hqq-2bit-float16-view, hqq-4bit-bfloat16-view, hqq-3bit-float16-view
                      view_as_float=True: W_q stored as W_q.view(compute_dtype) (uint8 [a, b] -> float16 [a, b/2],
                      int32 3bit_32 [a, b] -> float16 [a, 2b]), meta view_as_float True

AutoGPTQ ``sym=False`` on a float model (``GPTQ_ASYM_FORMATS``, ``w_gptq_asym``: round-to-nearest with
AutoGPTQ's find_params / quantize, per-group integer zero points; take any ``Logical``):
  gptq-asym-int4, gptq-asym-int2, gptq-asym-int8
                      qweight int32 [K*b/32, N] (q, no offset), scales fp16 [G, N], qzeros [G, N*b/32] holding z - 1
  gptq-asym-int4-v2   the same with qzeros holding z (checkpoint_format gptq_v2)
  gptq-asym-int4-actorder, gptq-asym-int8-actorder-v2
                      desc_act true: groups cut from the inputs in activation order (GPTQ.fasterquant), g_idx int32 [K]
                      the group of each input (a permutation of arange(K) // 64), W = s[g_idx] * (q - z[g_idx])
  gptq-asym-int4-actorder-static
                      desc_act and static_groups true: groups fixed before the permutation, g_idx arange(K) // 64
  gptq-asym-int4-actorder-row
                      desc_act true, group_size -1: one group per row, scales / qzeros [1, ...], g_idx all zeros
  gptq-asym-int3-g128, -g32, -row, gptq-asym-int3-v2 (groups of 64, gptq_v2)
                      3-bit: qweight int32 [K/32*3, N], qzeros [G, N/32*3] as bit streams (gptq-int3-ternary);
                      -row: group_size -1 (scales / qzeros [1, ...], g_idx all 0)

AutoAWQ on a float model (``AWQ_FORMATS``, ``w_awq``: ``AwqQuantizer.pseudo_quantize_tensor`` and
``WQLinear_GEMM.from_linear`` transcribed, 4-bit, zero_point true, version gemm; take any ``Logical``):
  awq-gemm-g128, awq-gemm-g64, awq-gemm-g32
                      qweight int32 [K, N/8] (q of eight consecutive outputs per word in AWQ_ORDER [0, 2, 4, 6, 1, 3,
                      5, 7], low bits first), qzeros int32 [K/G, N/8] (z, packed the same way), scales fp16 [K/G, N]
  awq-gemm-row        group_size -1 (one group per row: scales / qzeros [1, ...])
  awq-gemv-g128, awq-gemv-g64, awq-gemv-g32, awq-gemv-row
                      version gemv (``w_awq_gemv``, ``WQLinear_GEMV.from_linear``): qweight int32 [N, K/8] (q of eight
                      consecutive inputs per word, natural order, low bits first), qzeros int32 [N, W] (z, packed the
                      same way), scales fp16 [N, 8 W], W = calculate_zeros_width(K, G), padding columns zero

compressed-tensors ``symmetric: false`` on a float model (``CT_ASYM_FORMATS``, ``w_compressed_tensors_asym``:
llm-compressor's min-max weight observer, compressed-tensors 0.17's calculate_qparams / quantize and its compressors
transcribed; bf16 weights and scales; take any ``Logical``):
  compressed-tensors-asym-int4, -int2, -int8
                      pack-quantized, group 64: weight_packed int32 [N, K*b/32] (q + 2^(b-1)), weight_scale [N, K/64],
                      weight_zero_point int32 [ceil(N*b/32), K/64] (z + 2^(b-1) packed along N, >= 0.9.4)
  compressed-tensors-asym-int4-channel, -int8-channel
                      strategy channel: scale [N, 1], zero point int32 [ceil(N*b/32), 1]
  compressed-tensors-asym-int4-tensor
                      strategy tensor: scale [1], zero point int8 [1] (never packed)
  compressed-tensors-asym-int4-legacy, -int8-channel-legacy
                      compressed-tensors <= 0.9.3: zero point int8 [N, G] / [N, 1] unpacked (signed z, truncated)
  compressed-tensors-asym-mixed
                      int4 by default, int8 down_proj, int2 layer 0 (one config group per width)
  compressed-tensors-asym-naive-int8
                      naive-quantized: weight int8 [N, K] = q, zero point int8 [N, K/64]
  compressed-tensors-asym-int4-actorder, -naive-int8-actorder
                      actorder 'group': groups cut from the inputs in activation order, weight_g_idx int32 [K] (a
                      permutation of arange(K) // 64), W = (q - z[:, g_idx]) * s[:, g_idx]
  compressed-tensors-asym-int4-actorder-weight
                      actorder 'weight': consecutive groups, no weight_g_idx (the order only steers GPTQ)

Symmetric low-bit integers beyond ternary (``INT_FORMATS``; take a multi-level ``Logical``, e.g.
``Logical.requantized(bits)``):
  compressed-tensors-int2  num_bits=2, int32 [N, K/16], code v+2, all four levels {-2, -1, 0, 1}
  compressed-tensors-int4  num_bits=4, int32 [N, K/8], code v+8, 16 levels {-8 .. 7}
  gptq-int4                AutoGPTQ v1 int4: qweight int32 [K/8, N] (v+8), qzeros holding z-1 = 7
  compressed-tensors-int4-actorder
                           compressed-tensors-int4 with actorder 'group': weight_g_idx int32 [K], group scales per
                           group of the activation order
  gptq-int3                AutoGPTQ v1 int3: qweight int32 [K/32*3, N] bit stream (v+4), qzeros holding z-1 = 3
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .checkpoint import Checkpoint
from .config import ModelConfig
from .formats import (AWQ_GEMM, AWQ_GEMM_ZEROS, CT_PACK_ZP_STRATEGIES, HF_BITNET, SEED, TQ1_0, TQ2_0, PackSpec,
                      code_table, ct_pack_spec, ct_zero_pack_spec, offset_table, pack, pack_sign_masks, sign_mask_spec,
                      tq1_0_scale, tq2_0_scale, write_record_scales)
from .io import atomic_write_text
from .spec import decode_linear, spec_for

ROLES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass
class Logical:
    """Ground-truth model: config.json dict, ternary matrices, multipliers, float tensors (HF names)."""

    config: dict
    ternary: dict[str, torch.Tensor]  # module -> int8 (N, K)
    mult: dict[str, torch.Tensor]  # module -> float32 (1,1) | (N,1) | (N,K)
    floats: dict[str, torch.Tensor]  # HF param name -> tensor
    tokenizer_dir: Optional[Path] = None

    @classmethod
    def from_dir(cls, model_dir) -> "Logical":
        """Read any model the reference can load (e.g. models/tiny-trained)."""
        model_dir = Path(model_dir)
        cfg = ModelConfig.load(model_dir)
        spec = spec_for(model_dir, cfg)
        ck = Checkpoint(model_dir)
        tern, mult = {}, {}
        for mod, e in spec.linears.items():
            d = decode_linear(ck, e, mod)
            tern[mod], mult[mod] = d.values.to(torch.int8), d.mult.float()
        floats = {hf: ck.get(key) for hf, key in spec.tensors.items()}
        for mod, e in spec.linears.items():  # a ternary linear's bias is a float tensor of its module (HF name)
            if e.bias_key is not None:
                floats[f"{mod}.bias"] = ck.get(e.bias_key)
        tok = model_dir if (model_dir / "tokenizer.json").exists() else None
        return cls(json.loads((model_dir / "config.json").read_text()), tern, mult, floats, tok)

    def effective(self, mod: str) -> torch.Tensor:
        return self.ternary[mod].float() * self.mult[mod]

    def requantized(self, bits: int, seed: int = 0, noise: float = 1.0, rare: bool = False) -> "Logical":
        """A symmetric ``bits``-bit integer model close to this ternary one: values
        ``clip(T * L + round(noise * N(0, 1)), -2^(b-1), 2^(b-1) - 1)`` with ``L = 2^(b-1) - 3``
        (int4: 5; int2: 1; int3: L = 2 and half the noise, which at L = 1 would swamp the levels)
        and multiplier ``m / L``, so every level occurs and the effective weights stay near the
        original ones.  ``rare`` (int2): the -2 level only once in every 8th
        row (as symmetric int2 with scale absmax/1.5 produces: w/s = -1.5 at a row's absmax)."""
        g = torch.Generator().manual_seed(seed)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        lev = max(1, hi - 2) if bits != 3 else 2
        noise = noise / 2 if bits == 3 else noise
        tern, mult = {}, {}
        for mod, t in self.ternary.items():
            z = torch.round(torch.randn(t.shape, generator=g) * noise)
            if bits <= 2:  # four levels: move a fifth of the -1s to -2 (the asymmetric extra level)
                z = -((t == -1) & (torch.rand(t.shape, generator=g) < 0.2)).float()
                if rare:
                    first = (t == -1).float().argmax(dim=1)  # first -1 of each row
                    z = torch.zeros(t.shape)
                    rows = torch.arange(0, t.shape[0], 8)
                    z[rows, first[rows]] = -((t[rows, first[rows]] == -1).float())
            v = (t.float() * lev + z).clamp(lo, hi).to(torch.int8)
            tern[mod], mult[mod] = v, (self.mult[mod] / lev).float()
        return Logical(self.config, tern, mult, self.floats, self.tokenizer_dir)

    def with_channel_jitter(self, seed: int = 0, amount: float = 0.02) -> "Logical":
        """Per-channel multipliers m * (1 + amount * u), u in [-1, 1): realistic channel scales
        that leave the model's function almost unchanged."""
        g = torch.Generator().manual_seed(seed)
        mult = {}
        for mod, t in self.ternary.items():
            u = torch.rand(t.shape[0], 1, generator=g) * 2 - 1
            mult[mod] = (self.mult[mod].reshape(-1)[0] * (1 + amount * u)).float()
        return Logical(self.config, self.ternary, mult, self.floats, self.tokenizer_dir)

    def with_ternary_head(self, tie: Optional[bool] = None) -> "Logical":
        """lm_head as a ternary module too (``ternary['lm_head']``): the stored output embedding (or the input
        one, for a tied model) ternarized as transformers' BitLinear weight quantizer does, values
        round(W / mean|W|) clamped to [-1, 1] with multiplier mean|W|; writers then pack it like every other
        linear.  ``tie`` sets config.json's tie_word_embeddings (default: kept)."""
        w = self.floats.get("lm_head.weight", self.floats["model.embed_tokens.weight"]).float()
        m = w.abs().mean().clamp(min=1e-5)
        tern = dict(self.ternary, lm_head=(w / m).round().clamp(-1, 1).to(torch.int8))
        mult = dict(self.mult, lm_head=m.reshape(1, 1))
        floats = {k: v for k, v in self.floats.items() if k != "lm_head.weight"}
        cfg = dict(self.config)
        if tie is not None:
            cfg["tie_word_embeddings"] = tie
        return Logical(cfg, tern, mult, floats, self.tokenizer_dir)

    def with_group_jitter(self, group_size: int, seed: int = 0, amount: float = 0.02, axis: int = 1,
                          g_idx: Optional[dict] = None) -> "Logical":
        """Per-group multipliers m * (1 + amount * u) over groups of ``group_size`` consecutive
        inputs of each row, u in [-1, 1), expanded to (N, K): block scales that differ block to
        block (a misplaced block scale shows) while the model's function barely changes.
        ``axis=0``: HQQ's axis-0 groups instead (one per column j of W's row-major [group_size,
        N*K/group_size] view: the flattened elements j, j + N*K/group_size, ...).  ``g_idx``: {module:
        group of each input} (act-order groups, ``actorder_g_idx``): u per such group, over the module's
        multiplier (which must be per tensor or per channel)."""
        g = torch.Generator().manual_seed(seed)
        mult = {}
        for mod, t in self.ternary.items():
            n, k = t.shape
            if g_idx is not None:
                gi = g_idx[mod].long()
                u = torch.rand(n, int(gi.max()) + 1, generator=g) * 2 - 1
                base = self.mult[mod].expand(n, k)[:, :1]
                if not torch.equal(self.mult[mod].expand(n, k), base.expand(n, k)):
                    raise ValueError(f"{mod}: act-order group jitter needs per-tensor / per-channel multipliers")
                mult[mod] = (base * (1 + amount * u))[:, gi].float().contiguous()
                continue
            if axis == 0:
                cols = n * k // group_size
                u = torch.rand(cols, generator=g) * 2 - 1
                base = self.mult[mod].expand(n, k).reshape(group_size, cols)[0]
                mult[mod] = (base * (1 + amount * u)).reshape(1, cols).expand(group_size, cols).reshape(n, k) \
                    .float().contiguous()
                continue
            u = torch.rand(n, -(-k // group_size), generator=g) * 2 - 1
            base = self.mult[mod].expand(n, k)[:, ::group_size]
            mult[mod] = (base * (1 + amount * u)).repeat_interleave(group_size, dim=1)[:, :k].float().contiguous()
        return Logical(self.config, self.ternary, mult, self.floats, self.tokenizer_dir)


@dataclass
class Truth:
    """What a correct inspector must recover: T and the multiplier as stored (after rounding)."""

    ternary: dict[str, torch.Tensor]
    mult: dict[str, torch.Tensor]
    fmt: str = ""
    notes: dict = field(default_factory=dict)

    def effective(self, mod: str) -> torch.Tensor:
        return self.ternary[mod].float() * self.mult[mod]


# ---------------------------------------------------------------------------------------
# helpers


def _scalar(m: torch.Tensor) -> float:
    return float(m.reshape(-1)[0])


def _channel(m: torch.Tensor, n: int) -> torch.Tensor:
    return m.reshape(-1, 1).expand(n, 1).reshape(n) if m.numel() in (1, n) else m[:, :1].reshape(n)


def _group(m: torch.Tensor, n: int, k: int, gs: int) -> torch.Tensor:
    """(N, ceil(K/gs)) multipliers from any broadcastable multiplier (first column of each group)."""
    full = m.expand(n, k) if m.shape != (n, k) else m
    return full[:, ::gs].contiguous()


def _rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).to(torch.float32)


NAME_SCHEMES: dict[str, dict[str, str]] = {
    # HF param name template -> checkpoint key template ({L} = layer)
    "hf": {},
    "gguf": {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight",
             "model.layers.{L}.input_layernorm.weight": "blk.{L}.attn_norm.weight",
             "model.layers.{L}.post_attention_layernorm.weight": "blk.{L}.ffn_norm.weight",
             "model.layers.{L}.self_attn.attn_sub_norm.weight": "blk.{L}.attn_sub_norm.weight",
             "model.layers.{L}.mlp.ffn_sub_norm.weight": "blk.{L}.ffn_sub_norm.weight",
             "model.layers.{L}.self_attn.q_proj": "blk.{L}.attn_q", "model.layers.{L}.self_attn.k_proj": "blk.{L}.attn_k",
             "model.layers.{L}.self_attn.v_proj": "blk.{L}.attn_v",
             "model.layers.{L}.self_attn.o_proj": "blk.{L}.attn_output",
             "model.layers.{L}.mlp.gate_proj": "blk.{L}.ffn_gate", "model.layers.{L}.mlp.up_proj": "blk.{L}.ffn_up",
             "model.layers.{L}.mlp.down_proj": "blk.{L}.ffn_down"},
    "meta": {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "output.weight",
             "model.layers.{L}.input_layernorm.weight": "layers.{L}.attention_norm.weight",
             "model.layers.{L}.post_attention_layernorm.weight": "layers.{L}.ffn_norm.weight",
             "model.layers.{L}.self_attn.attn_sub_norm.weight": "layers.{L}.attention.attn_sub_norm.weight",
             "model.layers.{L}.mlp.ffn_sub_norm.weight": "layers.{L}.feed_forward.ffn_sub_norm.weight",
             "model.layers.{L}.self_attn.qkv": "layers.{L}.attention.wqkv",
             "model.layers.{L}.self_attn.o_proj": "layers.{L}.attention.wo",
             "model.layers.{L}.mlp.gate_up": "layers.{L}.feed_forward.w13",
             "model.layers.{L}.mlp.down_proj": "layers.{L}.feed_forward.w2"},
}


def rename(hf: str, scheme: str) -> str:
    """HF name (module or parameter) -> the checkpoint key of naming ``scheme``."""
    table = NAME_SCHEMES[scheme]
    m = re.match(r"model\.layers\.(\d+)\.(.*)$", hf)
    tmpl, layer = (f"model.layers.{{L}}.{m.group(2)}", m.group(1)) if m else (hf, "")
    for suffix in ("", ".weight", ".bias"):
        base = tmpl[: len(tmpl) - len(suffix)] if suffix else tmpl
        if (not suffix or tmpl.endswith(suffix)) and base in table:
            return table[base].replace("{L}", layer) + suffix
    return hf


def _floats(lg: Logical, scheme: str, dtype: Optional[torch.dtype] = None) -> dict[str, torch.Tensor]:
    return {rename(hf, scheme): (t.to(dtype) if dtype is not None else t).contiguous() for hf, t in lg.floats.items()}


# ---------------------------------------------------------------------------------------
# one writer per convention: (Logical) -> (state dict, quantization_config or None, Truth)


def _packed_convention(lg: Logical, spec: PackSpec, *, scale: str, op: str, scale_dtype: torch.dtype,
                       weight_suffix: str = "weight", scale_suffix: str = "weight_scale", scheme: str = "hf",
                       group_size: int = 64, fmt: str = ""):
    sd, tern, mult = _floats(lg, scheme), {}, {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        base = rename(mod, scheme)
        sd[f"{base}.{weight_suffix}"] = pack(t, spec)
        m = lg.mult[mod]
        if scale == "tensor":
            s = torch.tensor([_scalar(m)])
        elif scale == "channel":
            s = _channel(m, n)
        else:
            s = _group(m, n, k, group_size)
        stored = (1.0 / s if op == "divide" else s).to(scale_dtype)
        sd[f"{base}.{scale_suffix}"] = stored
        eff = 1.0 / stored.float() if op == "divide" else stored.float()
        if scale == "tensor":
            eff = eff.reshape(1, 1)
        elif scale == "channel":
            eff = eff.reshape(n, 1)
        else:
            eff = eff.repeat_interleave(group_size, dim=1)[:, :k]
        tern[mod], mult[mod] = t, eff
    return sd, Truth(tern, mult, fmt)


def w_hf(lg: Logical, linear_class: str = "bitlinear", bit_order: str = "lsb", scale_suffix: str = "weight_scale",
         op: Optional[str] = None, modules_to_not_convert: Optional[list] = None):
    """transformers' HF-BitNet; ``scale_suffix`` / ``op`` write the scale under another key (``weight.scale``,
    ``scale``, ``weight_scale_inv``) or with the other op than ``linear_class`` names (config.json unchanged).
    A ternary lm_head (``Logical.with_ternary_head``) is packed like the other linears; transformers quantizes
    it only when ``modules_to_not_convert`` is a list without it (null: its default skips keep it float)."""
    op = op or ("divide" if linear_class == "bitlinear" else "multiply")
    sd, truth = _packed_convention(lg, HF_BITNET.replace(bit_order=bit_order), scale="tensor", op=op,
                                   scale_dtype=torch.float32, scale_suffix=scale_suffix, fmt=f"hf-{linear_class}")
    q = {"quant_method": "bitnet", "linear_class": linear_class, "quantization_mode": "offline",
         "use_rms_norm": False, "modules_to_not_convert": modules_to_not_convert}
    return sd, q, truth


def w_seed(lg: Logical, bit_order: str = "lsb", scale: str = "channel", group_size: int = 64):
    sd, truth = _packed_convention(lg, SEED.replace(bit_order=bit_order), scale=scale, op="multiply",
                                   scale_dtype=torch.float16, weight_suffix="weight_ternary", scale_suffix="scale",
                                   group_size=group_size, fmt=f"seed-{bit_order}-{scale}")
    return sd, None, truth


CT_SPEC = PackSpec(bits=2, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb",
                   codes=(None, -1, 0, 1), pad_code=0)  # pack_to_int32 pads with 0 after the +2 offset


def w_compressed_tensors(lg: Logical, strategy: str = "channel", group_size: int = 64):
    sd, truth = _packed_convention(lg, CT_SPEC, scale="channel" if strategy == "channel" else "group",
                                   op="multiply", scale_dtype=torch.float16, weight_suffix="weight_packed",
                                   group_size=group_size, fmt=f"compressed-tensors-{strategy}")
    for mod, t in lg.ternary.items():
        sd[f"{mod}.weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        if strategy == "channel":
            sd[f"{mod}.weight_scale"] = sd[f"{mod}.weight_scale"].reshape(-1, 1)
    w = {"num_bits": 2, "type": "int", "symmetric": True, "strategy": strategy, "dynamic": False}
    if strategy == "group":
        w["group_size"] = group_size
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None}},
         "ignore": ["lm_head"]}
    return sd, q, truth


GPTQ_SPEC = PackSpec(bits=2, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb",
                     codes=(None, -1, 0, 1), transposed=True, pad_code=2)
GPTQ_ZERO_SPEC = PackSpec(bits=2, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb",
                          codes=(0, 1, 2, 3))


def _gptq_codec(bits: int) -> Optional[str]:
    """AutoGPTQ's ``QuantLinear.pack`` writes 3-bit codes as one bit stream along K (qweight) / N (qzeros): 32 codes
    in three int32, codes straddling words (``PackSpec`` codec 'bitstream'); 2 / 4 / 8 bits tile the int32."""
    return "bitstream" if 32 % bits else None


def _gptq_check_k(mod: str, k: int, bits: int) -> None:
    if bits == 3 and k % 32:  # AutoGPTQ's 3-bit pack walks K in whole periods of 32 inputs (3 int32 rows)
        raise ValueError(f"{mod}: K = {k} is not a multiple of 32: AutoGPTQ's 3-bit QuantLinear.pack needs it")


def _module_input(mod: str) -> str:
    """The input a module reads: q / k / v share the attention's, gate / up the MLP's (one Hessian, hence one
    activation order, for the modules AutoGPTQ / llm-compressor quantize from the same inputs)."""
    for part, shared in (("self_attn.k_proj", "self_attn.q_proj"), ("self_attn.v_proj", "self_attn.q_proj"),
                         ("mlp.up_proj", "mlp.gate_proj")):
        if mod.endswith(part):
            return mod[: -len(part)] + shared
    return mod


def actorder_perms(lg: Logical, seed: int = 0) -> dict[str, torch.Tensor]:
    """{module: perm}: the activation order GPTQ quantizes a module's inputs in, ``perm = argsort(diag(H),
    descending=True)`` (AutoGPTQ ``GPTQ.fasterquant`` with actorder, llm-compressor ``_apply_activation_ordering``),
    for a seeded stand-in of the Hessian's diagonal (the mean square of each input over the calibration data): one
    per module input (q / k / v and gate / up share theirs, as they share H), drawn in module order."""
    g = torch.Generator().manual_seed(seed)
    diag: dict[str, torch.Tensor] = {}
    out = {}
    for mod, t in lg.ternary.items():
        src = _module_input(mod)
        if src not in diag:
            diag[src] = torch.rand(t.shape[1], generator=g)
        out[mod] = torch.argsort(diag[src], descending=True)
    return out


def actorder_g_idx(perm: torch.Tensor, group_size: int, static_groups: bool = False) -> torch.Tensor:
    """int32 [K] group of each input after quantizing in the order ``perm``, AutoGPTQ's ``GPTQ.fasterquant`` (and
    GPTQModel's, llm-compressor's for actorder group) line for line: ``g_idx = [perm[i] // group_size ...]`` with
    static_groups else ``[i // group_size for i in range(columns)]``, then ``g_idx[invperm]`` (invperm =
    argsort(perm)).  Without static groups, group g holds the inputs perm[g*gs:(g+1)*gs]; with them, the index is
    arange(K) // group_size again (groups fixed before the permutation)."""
    k = perm.numel()
    g_idx = torch.tensor([int(perm[i]) // group_size if static_groups else i // group_size for i in range(k)],
                         dtype=torch.int32)
    return g_idx[torch.argsort(perm)]


def w_gptq(lg: Logical, group_size: int = 64, bits: int = 2, ternary: bool = True, act_order: bool = False,
           seed: int = 0):
    """AutoGPTQ v1 symmetric: qweight int32 [K*b/32, N] (q = w + 2^(b-1)), qzeros holding z - 1 = 2^(b-1) - 1, fp16
    scales [G, N] (each group's multiplier: that of the group's first input), g_idx int32 [K].  ``act_order``
    (desc_act true): the groups are those of ``actorder_g_idx`` for ``actorder_perms(lg, seed)``, each taking the
    multiplier of its first input in the permuted order (where fasterquant calls find_params); write a
    ``Logical.with_group_jitter(group_size, g_idx=...)`` of the same index so that they differ.  bits 2 / 3 / 4 / 8
    (3: the bit stream of ``_gptq_codec``)."""
    half = 1 << (bits - 1)
    spec, zspec = GPTQ_SPEC, GPTQ_ZERO_SPEC
    if bits != 2 or not ternary:
        codes = code_table(bits, {half - 1: -1, half: 0, half + 1: 1}) if ternary else offset_table(bits, half)
        spec = GPTQ_SPEC.replace(bits=bits, codes=codes, pad_code=half, codec=_gptq_codec(bits))
        zspec = GPTQ_ZERO_SPEC.replace(bits=bits, codes=tuple(range(1 << bits)), codec=_gptq_codec(bits))
    sd, tern, mult = _floats(lg, "hf"), {}, {}
    perms = actorder_perms(lg, seed) if act_order else {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        _gptq_check_k(mod, k, bits)
        g = -(-k // group_size)
        perm = perms.get(mod, torch.arange(k))
        gi = actorder_g_idx(perm, group_size)
        sd[f"{mod}.qweight"] = pack(t, spec)  # (K*bits/32, N): q = w + 2^(bits-1)
        s = lg.mult[mod].expand(n, k)[:, perm[::group_size]].to(torch.float16)  # (N, G): each group's first input
        sd[f"{mod}.scales"] = s.t().contiguous()  # (G, N)
        sd[f"{mod}.qzeros"] = pack(torch.full((g, n), half - 1, dtype=torch.int64), zspec)  # v1 stores z - 1
        sd[f"{mod}.g_idx"] = gi
        tern[mod], mult[mod] = t, s.float()[:, gi.long()]
    q = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": act_order, "sym": True,
         "checkpoint_format": "gptq", **({"static_groups": False} if act_order else {})}
    return sd, q, Truth(tern, mult, ("gptq" if bits == 2 else f"gptq-int{bits}") + ("-actorder" if act_order else ""))


def gptq_float_model(lg: Logical, noise: float = 0.3, seed: int = 0) -> dict[str, torch.Tensor]:
    """The float model ``w_gptq_asym`` quantizes: per module the logical effective weights plus ``noise`` * m *
    N(0, 1) in fp32 (one seeded generator, modules in order)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for mod in lg.ternary:
        n, k = lg.ternary[mod].shape
        out[mod] = lg.effective(mod) + noise * lg.mult[mod].expand(n, k) * torch.randn(n, k, generator=g)
    return out


def w_gptq_asym(lg: Logical, bits: int = 4, group_size: int = 64, noise: float = 0.3, seed: int = 0,
                v2: bool = False, act_order: bool = False, static_groups: bool = False):
    """AutoGPTQ with ``sym=False`` on a float model (the logical effective weights plus ``noise`` * m * N(0, 1)):
    per row and group of ``group_size`` inputs (-1: the whole row) AutoGPTQ's ``Quantizer.find_params`` (xmin =
    min(min, 0), xmax = max(max, 0), scale = (xmax - xmin) / maxq, zero = round(-xmin / scale)) and ``quantize``
    (q = clamp(round(w / scale) + zero, 0, maxq)), round-to-nearest without GPTQ's error feedback; stored as
    ``QuantLinear.pack`` does: qweight int32 [K*bits/32, N] (q, consecutive inputs, low bits first), scales fp16
    [G, N], qzeros int32 [G, N*bits/32] holding z - 1 (v1; ``v2``: z itself, checkpoint_format gptq_v2), g_idx.
    ``act_order`` (desc_act true): the inputs are quantized in the order ``actorder_perms(lg, seed)`` and the groups
    are cut from that order (``GPTQ.fasterquant``: find_params on W[:, perm] columns g*gs .. (g+1)*gs - 1), g_idx =
    ``actorder_g_idx``, Q unpermuted before packing (``Q[:, invperm]``); ``static_groups``: the groups are fixed on
    the unpermuted columns first (g_idx arange(K) // group_size).  W = scale[g_idx] * (q - z[g_idx]) (AutoGPTQ's
    dequantization): not ternary, every level used.  Truth: values q - z and the multiplier scale (fp16)."""
    maxq = (1 << bits) - 1
    spec = GPTQ_SPEC.replace(bits=bits, codes=tuple(range(1 << bits)), pad_code=0, codec=_gptq_codec(bits))
    zspec = GPTQ_ZERO_SPEC.replace(bits=bits, codes=tuple(range(1 << bits)), codec=_gptq_codec(bits))
    perms = actorder_perms(lg, seed) if act_order else {}
    sd, vals, mult = _floats(lg, "hf"), {}, {}
    for mod, W in gptq_float_model(lg, noise, seed).items():
        n, k = W.shape
        _gptq_check_k(mod, k, bits)
        gs = k if group_size == -1 else group_size
        if k % gs:
            raise ValueError(f"{mod}: K = {k} is not a multiple of group_size {gs}")
        G = k // gs
        gi = actorder_g_idx(perms.get(mod, torch.arange(k)), gs, static_groups).long()
        Wg = W[:, torch.argsort(gi, stable=True)].reshape(n, G, gs)  # the members of each group (any order)
        xmin = Wg.min(dim=2).values.clamp(max=0)
        xmax = Wg.max(dim=2).values.clamp(min=0)
        scale = ((xmax - xmin) / maxq).to(torch.float16)  # (N, G), stored fp16 and used as stored
        zero = torch.round(-xmin / scale.float()).clamp(0, maxq)
        q = (torch.round(W / scale.float()[:, gi]) + zero[:, gi]).clamp(0, maxq)  # each input with its group's
        sd[f"{mod}.qweight"] = pack(q.to(torch.int64), spec)
        sd[f"{mod}.scales"] = scale.t().contiguous()
        sd[f"{mod}.qzeros"] = pack((zero.t() - (0 if v2 else 1)).to(torch.int64) & maxq, zspec)
        sd[f"{mod}.g_idx"] = gi.to(torch.int32)
        zz = zero if v2 else ((zero - 1).to(torch.int64) & maxq) + 1  # what a v1 reader gets back (z = 0 -> 2^bits)
        vals[mod] = (q - zz.float()[:, gi]).to(torch.int16)
        mult[mod] = scale.float()[:, gi]
    q = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": act_order, "sym": False,
         "checkpoint_format": "gptq_v2" if v2 else "gptq", **({"static_groups": static_groups} if act_order else {})}
    tag = ("-actorder" + ("-static" if static_groups else "")) if act_order else ""
    return sd, q, Truth(vals, mult, f"gptq-asym-int{bits}{'-v2' if v2 else ''}{tag}")


def awq_pseudo_quantize(w: torch.Tensor, bits: int, group_size: int):
    """AutoAWQ's ``AwqQuantizer.pseudo_quantize_tensor`` (``awq/quantize/quantizer.py``, zero_point=True), line for
    line on the fp16 weight ``_apply_quant`` hands it (``linear_layer.half()``): per row and group of ``group_size``
    inputs (-1: the whole row) max / min, scales = (max - min).clamp(min=1e-5) / (2^b - 1), zeros = (-round(min /
    scales)).clamp(0, 2^b - 1), w = (clamp(round(w / scales) + zeros, 0, 2^b - 1) - zeros) * scales, every op in
    fp16 as there.  Returns (the fake-quantized w [N, K], scales [N, G], zeros [N, G]), all fp16."""
    org_w_shape = w.shape
    if group_size > 0:
        w = w.reshape(-1, group_size)
    max_val = w.amax(dim=1, keepdim=True)
    min_val = w.amin(dim=1, keepdim=True)
    max_int, min_int = 2 ** bits - 1, 0
    scales = (max_val - min_val).clamp(min=1e-5) / max_int
    zeros = (-torch.round(min_val / scales)).clamp_(min_int, max_int)
    w = (torch.clamp(torch.round(w / scales) + zeros, min_int, max_int) - zeros) * scales
    zeros = zeros.view(org_w_shape[0], -1)
    scales = scales.view(org_w_shape[0], -1)
    return w.reshape(org_w_shape), scales, zeros


def awq_gemm_intweight(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """The codes ``WQLinear_GEMM.from_linear`` (``awq/modules/linear/gemm.py``) packs: from the fake-quantized fp16
    weight w [N, K] and the transposed scales / zeros [G, N] (``_apply_quant``'s ``.t()``), per input column idx
    round((w[:, idx] + (zeros * scales)[idx // G]) / scales[idx // G]) in fp16, as int32 [K, N] (``intweight.t()``).
    Vectorised over idx: the same elementwise fp16 ops on the same operands."""
    scale_zeros = zeros * scales  # (G, N) fp16
    k = w.shape[1]
    grp = torch.arange(k) // group_size
    intweight = torch.round((w + scale_zeros[grp].t()) / scales[grp].t()).to(torch.int)  # (N, K)
    return intweight.t().contiguous().to(torch.int32)


def awq_float_model(lg: Logical, noise: float = 0.3, seed: int = 0) -> dict[str, torch.Tensor]:
    """The float model ``w_awq`` quantizes: per module the logical effective weights plus ``noise`` * m * N(0, 1)
    (one seeded generator, modules in order), in fp16 as AutoAWQ's ``_apply_quant`` casts the layer (``.half()``)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for mod in lg.ternary:
        n, k = lg.ternary[mod].shape
        out[mod] = (lg.effective(mod) + noise * lg.mult[mod].expand(n, k) * torch.randn(n, k, generator=g)).half()
    return out


def w_awq(lg: Logical, group_size: int = 128, noise: float = 0.3, seed: int = 0):
    """AutoAWQ ``version: "gemm"`` as it stores a float model (``awq_float_model``): ``awq_pseudo_quantize`` (round
    to nearest with a zero point; no activation-aware scale search, which only changes the float weights before this
    step), then
    ``WQLinear_GEMM.from_linear``: scales fp16 [G, N], qweight int32 [K, N/8] = ``awq_gemm_intweight`` packed along
    N eight per word in ``formats.AWQ_ORDER``, qzeros int32 [G, N/8] = the integer zeros packed the same way (z, not
    z - 1).  AutoAWQ packs 4-bit codes only (``w_bit not in [4]`` raises).  ``group_size`` -1 is one group per row
    (the writer's intent: ``WQLinear_GEMM.group_size`` = in_features; AutoAWQ 0.2.9's own from_linear indexes
    ``scale_zeros[idx // -1]`` and fails for K > 2, so no AutoAWQ checkpoint has it, but vLLM / transformers read it).
    Truth: values q - z and the multiplier scales, so ``effective`` = ``dequantize_gemm`` (``awq/utils/
    packing_utils.py``: (iweight - izeros) * scales) in exact arithmetic (fp32; AutoAWQ's fp16 result is its
    rounding)."""
    bits = 4
    sd, vals, mult = _floats(lg, "hf"), {}, {}
    for mod, W in awq_float_model(lg, noise, seed).items():
        n, k = W.shape
        gs = k if group_size == -1 else group_size
        if k % gs or n % 32:
            raise ValueError(f"{mod}: AutoAWQ needs K % group_size == 0 and N % 32 == 0 (WQLinear_GEMM asserts N % 8; "
                             f"from_linear sizes qweight N // 32 * 4 columns), got N = {n}, K = {k}, group_size {gs}")
        wq, scales, zeros = awq_pseudo_quantize(W, bits, group_size)
        scales, zeros = scales.t().contiguous(), zeros.t().contiguous()  # (G, N): _apply_quant, version gemm
        intweight = awq_gemm_intweight(wq, scales, zeros, gs)  # (K, N)
        if int(intweight.min()) < 0 or int(intweight.max()) > 15:  # from_linear would OR it into the next field
            raise ValueError(f"{mod}: a code {int(intweight.min())}..{int(intweight.max())} outside 0..15")
        q = intweight.t().to(torch.int64)  # (N, K)
        z = zeros.to(torch.int32).to(torch.int64)  # from_linear: zeros.to(dtype=torch.int32)
        sd[f"{mod}.qweight"] = pack(q, AWQ_GEMM)
        sd[f"{mod}.qzeros"] = pack(z, AWQ_GEMM_ZEROS)
        sd[f"{mod}.scales"] = scales.half()
        vals[mod] = (q - z.t().repeat_interleave(gs, dim=1)).to(torch.int8)
        mult[mod] = scales.t().float().repeat_interleave(gs, dim=1).contiguous()
    q = {"quant_method": "awq", "bits": bits, "group_size": group_size, "zero_point": True, "version": "gemm",
         "modules_to_not_convert": None}
    return sd, q, Truth(vals, mult, f"awq-gemm-g{group_size}")


def awq_gemv_from_linear(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int):
    """``WQLinear_GEMV.from_linear`` (``awq/modules/linear/gemv.py``, AutoAWQ 0.2.9) vectorised, on the
    fake-quantized fp16 weight w [N, K] and the quantizer's scales / zeros [N, groups] as ``_apply_quant`` hands
    them for version gemv (not transposed): ``qscales`` = fp16 zeros [N, calculate_zeros_width(K, G) * 8] with
    ``qscales[:, :groups] = scales``; ``intweight[:, idx] = round((w[:, idx] + (zeros * scales)[:, idx // G]) /
    qscales[:, idx // G])`` in fp16 (the same elementwise ops as its per-column loop); the codes of eight
    consecutive inputs per int32 in natural order (``order_map = [0, ..., 7]``: ``formats.AWQ_GEMV``) into
    ``qweight`` [N, K // 32 * 4]; ``zeros.to(int32)`` packed the same way along the groups into ``qzeros``
    [N, calculate_zeros_width(K, G)], columns past the groups left 0.  ``group_size``: the module's (K for -1,
    see ``w_awq_gemv``).  Returns (qweight, qzeros, qscales, the codes q [N, K] int64, the zeros z [N, groups])."""
    from .formats import AWQ_GEMV, AWQ_GEMV_ZEROS, awq_gemv_zeros_width  # (kept out of the shared import list)

    n, k = w.shape
    width = awq_gemv_zeros_width(k, group_size)
    if k // 32 * 4 != k // 8:  # from_linear sizes qweight k // 32 * 4 columns and packs k // 8 of them
        raise ValueError(f"AutoAWQ gemv's from_linear writes qweight [N, K // 32 * 4] and packs K // 8 words per "
                         f"row: K = {k} (K % 32 = {k % 32}) overruns it; expected K % 32 < 8")
    groups = scales.shape[1]
    scale_zeros = zeros * scales  # (N, groups) fp16
    qscales = torch.zeros(n, width * 8, dtype=torch.float16)
    qscales[:, :groups] = scales
    grp = torch.arange(k) // group_size
    intweight = torch.round((w + scale_zeros[:, grp]) / qscales[:, grp]).to(torch.int).to(torch.int32)
    if int(intweight.min()) < 0 or int(intweight.max()) > 15:  # from_linear would OR it into the next field
        raise ValueError(f"a code {int(intweight.min())}..{int(intweight.max())} outside 0..15")
    q = intweight.to(torch.int64)
    z = zeros.to(torch.int32).to(torch.int64)  # from_linear: zeros.to(dtype=torch.int32)
    zpad = torch.zeros(n, width * 8, dtype=torch.int64)
    zpad[:, :groups] = z
    return pack(q, AWQ_GEMV), pack(zpad, AWQ_GEMV_ZEROS), qscales, q, z


def w_awq_gemv(lg: Logical, group_size: int = 128, noise: float = 0.3, seed: int = 0):
    """AutoAWQ ``version: "gemv"`` as it stores a float model (``awq_float_model``, the same float weights as
    ``w_awq``): ``awq_pseudo_quantize`` then ``awq_gemv_from_linear`` (``WQLinear_GEMV.from_linear``): qweight int32
    [N, K/8] (eight consecutive inputs per word, natural order, low bits first: ``formats.AWQ_GEMV``), qzeros int32
    [N, W] and scales fp16 [N, 8 W], W = ``calculate_zeros_width(K, G)`` (``formats.awq_gemv_zeros_width``: the
    groups padded to a multiple of 8, 16 or 32 columns for G >= 128, 64, 32), zero padding.  AutoAWQ asserts
    K % G == 0 and N % 8 == 0 (so N = 8 * odd is fine, unlike gemm's N % 32) and takes G >= 128, 64 or 32.
    ``group_size`` -1: one group per row laid out as ``WQLinear_GEMV.__init__`` sizes the buffers it loads into
    (group_size = in_features: W = calculate_zeros_width(K, K)); AutoAWQ 0.2.9's from_linear itself calls
    calculate_zeros_width(K, -1), which raises, so no AutoAWQ run writes it.  Truth: values q - z and the
    multiplier scales: W = (q - z) * s exactly (the gemv kernel's fp16 arithmetic is its rounding)."""
    from .formats import FormatError

    bits = 4
    sd, vals, mult = _floats(lg, "hf"), {}, {}
    for mod, W in awq_float_model(lg, noise, seed).items():
        n, k = W.shape
        gs = k if group_size == -1 else group_size
        if k % gs or n % 8:
            raise ValueError(f"{mod}: AutoAWQ gemv needs K % group_size == 0 and N % 8 == 0 (WQLinear_GEMV asserts "
                             f"both), got N = {n}, K = {k}, group_size {gs}")
        wq, scales, zeros = awq_pseudo_quantize(W, bits, group_size)  # (N, groups): version gemv keeps them so
        try:
            qweight, qzeros, qscales, q, z = awq_gemv_from_linear(wq, scales, zeros, gs)
        except (ValueError, FormatError) as e:
            raise ValueError(f"{mod}: {e}") from None
        sd[f"{mod}.qweight"], sd[f"{mod}.qzeros"], sd[f"{mod}.scales"] = qweight, qzeros, qscales
        vals[mod] = (q - z.repeat_interleave(gs, dim=1)).to(torch.int8)
        mult[mod] = scales.float().repeat_interleave(gs, dim=1).contiguous()
    q = {"quant_method": "awq", "bits": bits, "group_size": group_size, "zero_point": True, "version": "gemv",
         "modules_to_not_convert": None}
    return sd, q, Truth(vals, mult, f"awq-gemv-g{group_size}")


# ---------------------------------------------------------------------------------------
# compressed-tensors asymmetric (symmetric: false) weights, transcribed from compressed-tensors 0.17.0
# (quantization/utils/helpers.py calculate_range / calculate_qparams, quantization/lifecycle/forward.py quantize ->
# forward_helpers.py _process_group / _quantize, compressors/pack_quantized/base.py PackedQuantizationCompressor
# .compress with helpers.py pack_to_int32, compressors/naive_quantized/base.py NaiveQuantizationCompressor.compress)
# and llm-compressor 0.14's weight observer (observers/helpers.py _flatten_weight + min_max.py _get_min_max, the
# memoryless_minmax observer compressed-tensors names for static weights); ``legacy``: compressed-tensors <= 0.9.3
# (quantization/utils/helpers.py calculate_qparams: scales clamped to fp32 eps, zero points cast to int8 without
# rounding; quantized_compressors/base.py keeps weight_zero_point as the int8 [N, G] parameter, unpacked)

CT_STRATEGIES = ("group", "channel", "tensor")


def ct_range(bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``calculate_range`` for type int: q_min = -2^b / 2, q_max = 2^b / 2 - 1 (fp32 0-d tensors)."""
    bit_range = 2.0 ** bits
    return torch.tensor(-bit_range / 2), torch.tensor(bit_range / 2 - 1)


def ct_observe(w: torch.Tensor, strategy: str, group_size: Optional[int] = None):
    """llm-compressor's weight observer: ``flatten_for_calibration`` (tensor: (1, 1, N*K); channel: (1, N, 1, K);
    group: (1, N, G, group_size)) then ``amin`` / ``amax`` over dims (0, -1): (1,) / (N, 1) / (N, G) in w's dtype."""
    if strategy == "tensor":
        obs = w.reshape((1, 1, -1))
    elif strategy == "channel":
        obs = w.unsqueeze(-2).unsqueeze(0)
    elif strategy == "group":
        obs = w.unflatten(-1, (-1, group_size)).unsqueeze(0)
    else:
        raise ValueError(f"strategy {strategy!r}: expected one of {CT_STRATEGIES}")
    return torch.amin(obs, dim=(0, -1)), torch.amax(obs, dim=(0, -1))


def ct_qparams(min_vals: torch.Tensor, max_vals: torch.Tensor, bits: int, legacy: bool = False):
    """``calculate_qparams`` for symmetric false, type int, no global scale / scale_dtype, zp_dtype int8: the range
    widened to include 0, scales = (max - min) / (2^b - 1), zero points = q_min - min / scales clamped to [q_min,
    q_max]; a zero scale becomes its dtype's eps; the zero points rounded and cast to int8 (``round_to_quantized_
    type_dtype``).  ``legacy`` (<= 0.9.3): scales clamped to at least fp32 eps before the zero points, which are
    cast to int8 unrounded (truncated).  Scales keep w's dtype (the weight_scale parameter's)."""
    min_vals = torch.min(min_vals, torch.zeros_like(min_vals))
    max_vals = torch.max(max_vals, torch.zeros_like(max_vals))
    bit_min, bit_max = ct_range(bits)
    bit_range = bit_max - bit_min
    scales = (max_vals - min_vals) / float(bit_range)
    if legacy:
        scales = torch.clamp(scales, min=torch.finfo(torch.float32).eps)
    zero_points = bit_min - (min_vals / scales)
    zero_points = torch.clamp(zero_points, bit_min, bit_max)
    if legacy:
        zero_points = zero_points.to(torch.int8)
    else:
        scales = torch.where(scales == 0, torch.tensor(torch.finfo(scales.dtype).eps, dtype=scales.dtype), scales)
        zero_points = torch.round(torch.clamp(zero_points, -128, 127)).to(torch.int8)
    if scales.ndim == 0:
        scales, zero_points = scales.reshape(1), zero_points.reshape(1)
    return scales, zero_points


def ct_quantize(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int, strategy: str,
                group_size: Optional[int] = None) -> torch.Tensor:
    """``quantize(..., dtype=torch.int8)``: per group (``_process_group``: the last dim unflattened into (G,
    group_size), scale / zero point unsqueezed) or broadcast (channel, tensor), ``_quantize``: x / scale + zero point
    (in w's dtype), clamped to [q_min, q_max], rounded, cast to int8.  Returns q, int8 [N, K] (signed)."""
    q_min, q_max = ct_range(bits)
    x, s, z = w, scale, zero_point
    if strategy == "group":
        x = w.unflatten(-1, (-(-w.shape[-1] // group_size), group_size))
        s, z = scale.unsqueeze(-1), zero_point.unsqueeze(-1)
    scaled = x / s
    scaled += z.to(x.dtype)
    q = torch.round(torch.clamp(scaled, q_min, q_max)).to(x.dtype).to(torch.int8)
    return q.flatten(start_dim=-2) if strategy == "group" else q


def ct_float_model(lg: Logical, dtype: torch.dtype = torch.bfloat16, noise: float = 0.3, seed: int = 0,
                   shift: float = 0.5) -> dict[str, torch.Tensor]:
    """The float model ``w_compressed_tensors_asym`` quantizes: per module the logical effective weights plus
    ``noise`` * m * N(0, 1) plus a per-row offset ``shift`` * m * U(0, 1) (one seeded generator, modules in order;
    the offset makes rows lopsided, so zero points differ from the symmetric q_min + 2^(b-1) - 1 / 2), in
    ``dtype`` (the model's weight dtype, which the scales keep)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for mod in lg.ternary:
        n, k = lg.ternary[mod].shape
        m = lg.mult[mod].expand(n, k)
        w = lg.effective(mod) + noise * m * torch.randn(n, k, generator=g) + shift * m * torch.rand(n, 1, generator=g)
        out[mod] = w.to(dtype)
    return out


def ct_asym_quantize(w: torch.Tensor, bits: int, strategy: str, group_size: Optional[int] = None,
                     legacy: bool = False):
    """One module through llm-compressor + compressed-tensors: observer min / max, ``ct_qparams``, ``ct_quantize``.
    Returns (q int8 [N, K], scale [N, G] | [N, 1] | [1] in w's dtype, zero point int8 of the scale's shape)."""
    scale, zp = ct_qparams(*ct_observe(w, strategy, group_size), bits, legacy=legacy)
    return ct_quantize(w, scale, zp, bits, strategy, group_size), scale, zp


def ct_weights_args(bits: int, strategy: str, group_size: Optional[int], actorder: Optional[str] = None) -> dict:
    """config_groups.*.weights as compressed-tensors 0.17's ``QuantizationArgs.model_dump()`` writes it for
    symmetric false (zp_dtype serialised as 'torch.int8')."""
    return {"num_bits": bits, "type": "int", "symmetric": False,
            "group_size": group_size if strategy == "group" else None, "strategy": strategy, "block_structure": None,
            "dynamic": False, "actorder": actorder, "scale_dtype": None, "zp_dtype": "torch.int8",
            "observer": "memoryless_minmax", "observer_kwargs": {}}


def w_compressed_tensors_asym(lg: Logical, bits: int = 4, strategy: str = "group", group_size: int = 64,
                              fmt: str = "pack-quantized", legacy: bool = False, dtype: torch.dtype = torch.bfloat16,
                              wide: Optional[dict] = None, actorder: Optional[str] = None, seed: int = 0):
    """compressed-tensors ``symmetric: false`` as llm-compressor saves a float model (``ct_float_model``) with
    ``ct_asym_quantize`` per module and the compressor of ``fmt``:

    * ``pack-quantized`` (``PackedQuantizationCompressor.compress``): weight_packed int32 [N, ceil(K*b/32)] =
      ``pack_to_int32(q, b)`` (``formats.ct_pack_spec``: q + 2^(b-1), consecutive inputs low bits first),
      weight_shape int64 [2] = [N, K], weight_scale (w's dtype) [N, G] / [N, 1] / [1], and weight_zero_point:
      group / channel strategies ``pack_to_int32(zp, b, packed_dim=0)`` int32 [ceil(N*b/32), G]
      (``formats.ct_zero_pack_spec``: z + 2^(b-1) along N), a tensor strategy the int8 [1] zero point as is;
      ``legacy`` (<= 0.9.3): every zero point the int8 [N, G] / [N, 1] parameter as is (signed z, unpacked);
    * ``naive-quantized`` / ``int-quantized`` (``NaiveQuantizationCompressor``): weight int8 [N, K] = q itself,
      weight_scale, weight_zero_point int8 as quantized (never packed).

    ``wide``: {module name substring: bits} for mixed widths (one config group per width, targets the module
    names).  ``actorder`` 'group' (group strategy): llm-compressor's ``quantize_weight`` with ActivationOrdering.GROUP
    (the inputs permuted by ``actorder_perms(lg, seed)`` first, the observer's groups cut from the permuted columns,
    g_idx = ``actorder_g_idx`` after ``g_idx[invperm]``), stored as ``weight_g_idx`` int32 [K], which the compressor
    (``_process_group``: inputs sorted by g_idx, cut into groups) quantizes with; 'weight': the permutation only
    changes GPTQ's calibration order, so without its error feedback the tensors are those of actorder null (no
    g_idx), the config says 'weight'.  Truth: values q - z (int16) and the multiplier scale (fp32), so ``effective`` =
    the decompressor's ``dequantize`` (x_q - zero_point) * scale in exact arithmetic (fp32; compressed-tensors' own
    result in the scale dtype is its rounding)."""
    if strategy not in CT_STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: expected one of {CT_STRATEGIES}")
    if actorder not in (None, "group", "weight") or (actorder == "group" and strategy != "group"):
        raise ValueError(f"actorder {actorder!r} with strategy {strategy!r}: expected null, 'weight', or 'group' with "
                         f"the group strategy (QuantizationArgs refuses group ordering otherwise)")
    perms = actorder_perms(lg, seed) if actorder == "group" else {}
    if fmt not in ("pack-quantized", "naive-quantized", "int-quantized"):
        raise ValueError(f"format {fmt!r}: expected pack-quantized, naive-quantized or int-quantized")
    sd, vals, mult = _floats(lg, "hf"), {}, {}
    targets: dict[int, list] = {}
    for mod, W in ct_float_model(lg, dtype).items():
        n, k = W.shape
        b = next((v for s, v in (wide or {}).items() if s in mod), bits)
        targets.setdefault(b, []).append(mod)
        if strategy == "group" and k % group_size:
            raise ValueError(f"{mod}: K = {k} is not a multiple of group_size {group_size} (compressed-tensors' "
                             f"_process_group refuses it)")
        gi = None
        if mod in perms:  # quantized in activation order: groups of the permuted columns, q back in input order
            perm = perms[mod]
            gi = actorder_g_idx(perm, group_size)
            q, scale, zp = ct_asym_quantize(W[:, perm], b, strategy, group_size, legacy=legacy)
            q = q[:, torch.argsort(perm)].contiguous()
            sd[f"{mod}.weight_g_idx"] = gi
        else:
            q, scale, zp = ct_asym_quantize(W, b, strategy, group_size, legacy=legacy)
        if fmt == "pack-quantized":
            sd[f"{mod}.weight_packed"] = pack(q, ct_pack_spec(b))
            sd[f"{mod}.weight_shape"] = torch.tensor([n, k])
            packed_zp = strategy in CT_PACK_ZP_STRATEGIES and not legacy
            sd[f"{mod}.weight_zero_point"] = pack(zp, ct_zero_pack_spec(b)).contiguous() if packed_zp else zp
        else:
            sd[f"{mod}.weight"] = q
            sd[f"{mod}.weight_zero_point"] = zp
        sd[f"{mod}.weight_scale"] = scale
        G = group_size if strategy == "group" else k
        expand = (lambda t: t.float().repeat_interleave(G, dim=1)) if strategy == "group" else \
            (lambda t: t.float().reshape(-1, 1))
        if gi is not None:
            expand = lambda t, gi=gi.long(): t.float()[:, gi]  # noqa: E731 - each input its group's column
        vals[mod] = (q.to(torch.int16) - expand(zp).to(torch.int16)).to(torch.int16)
        mult[mod] = expand(scale).contiguous()
    groups = {}
    for b in sorted(targets, key=lambda b: (b != bits, b)):
        groups[f"group_{len(groups)}"] = {
            "targets": ["Linear"] if b == bits else targets[b],
            "weights": ct_weights_args(b, strategy, group_size, actorder),
            "input_activations": None, "output_activations": None, "format": fmt}
    if wide:  # name targets first: vLLM / compressed-tensors match a layer's name before its class
        groups = dict(sorted(groups.items(), key=lambda kv: kv[1]["targets"] == ["Linear"]))
    qc = {"config_groups": groups, "quant_method": "compressed-tensors", "kv_cache_scheme": None, "format": fmt,
          "quantization_status": "compressed", "global_compression_ratio": None, "ignore": ["lm_head"]}
    name = f"ct-asym-{fmt.split('-')[0]}-int{bits}-{strategy}{'-legacy' if legacy else ''}" \
        + (f"-actorder-{actorder}" if actorder else "")
    return sd, qc, Truth(vals, mult, name)


I2S_SPEC = PackSpec(bits=2, container="uint8", pack_axis=1, lanes="block_interleaved", block=128,
                    bit_order="msb", codes=(-1, 0, 1, None), pad_code=1)


def w_i2s(lg: Logical):
    sd, truth = _packed_convention(lg, I2S_SPEC, scale="tensor", op="multiply", scale_dtype=torch.float32,
                                   scale_suffix="scale", scheme="gguf", fmt="i2s")
    return sd, None, truth


def _llamacpp_blocks(lg: Logical, spec: PackSpec, scale: Callable, fmt: str):
    """llama.cpp TQ2_0 / TQ1_0 blocks in a uint8 safetensors tensor per linear under its GGUF name, one fp16 d per
    256 inputs written into each block (``scale(key)``: the block's ScaleSpec); see the module docstring."""
    sd, tern, mult = _floats(lg, "gguf"), {}, {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        key = f"{rename(mod, 'gguf')}.weight"
        d = _group(lg.mult[mod], n, k, 256).to(torch.float16)  # (N, ceil(K/256)): one d per block
        sd[key] = write_record_scales(pack(t, spec), d, scale(key), (n, k))
        tern[mod], mult[mod] = t, d.float().repeat_interleave(256, dim=1)[:, :k]
    return sd, None, Truth(tern, mult, fmt)


def w_tq2_0(lg: Logical):
    return _llamacpp_blocks(lg, TQ2_0, tq2_0_scale, "tq2_0")


def w_tq1_0(lg: Logical):
    return _llamacpp_blocks(lg, TQ1_0, tq1_0_scale, "tq1_0")


HQQ_GROUP = 64
#: HQQ's packing as a PackSpec: axis=1 (the [N*K/G, G] group view) and axis=0 (the [G, N*K/G] one)
HQQ_SPEC = PackSpec(bits=2, container="uint8", pack_axis=0, lanes="blocked", bit_order="msb", codes=(0, 1, 2, 3),
                    group_view=HQQ_GROUP)
HQQ_AXIS0_SPEC = HQQ_SPEC.replace(group_axis=0)


def hqq_pack_2bit_u8(W_q: torch.Tensor) -> torch.Tensor:
    """mobiusml/hqq hqq/core/bitpack.py ``BitPack.pack_2bit_u8``, transcribed: the rows are cut into four
    chunks of len/4, chunk c shifted to bits 7-2c..6-2c (chunk 0 in the high bits).  Like HQQ, needs
    len % 4 == 0 (else HQQ's own broadcast fails)."""
    W_q = W_q.to(torch.uint8)
    if len(W_q) % 4:
        raise ValueError(f"BitPack.pack_2bit_u8 needs a multiple of 4 rows, got {len(W_q)}")
    _step = int(len(W_q) / 4)
    return (W_q[:_step] << 6 | W_q[_step:2 * _step] << 4 | W_q[2 * _step:3 * _step] << 2 | W_q[3 * _step:])


def _hqq_str(v: str) -> torch.Tensor:
    """hqq/core/utils.py encode_safetensor_type of a str (and of a torch.dtype, via str(dtype))."""
    return torch.tensor([ord(c) for c in v], dtype=torch.uint8)


def hqq_meta(shape: tuple, axis: int, group_size: int, nbits=2, compute_dtype: str = "torch.float16",
             packing: str = "2bit_u8", round_zero: Optional[bool] = None, view_as_float: bool = False) -> dict:
    """The non-tensor entries HQQLinear.state_dict (hqq/core/quantize.py, ``encoded_state_dict=True``, as
    ``save_to_safetensors`` / transformers' ``save_pretrained`` store it) writes next to W_q / scale / zero of a
    2-bit layer quantized with ``hqq_base_quant_config(nbits=2, group_size, axis)``: the meta dict of
    ``Quantizer.quantize`` (+ quant_scale / quant_zero, compute_dtype set by ``cuda``), offload_meta,
    encoded_state_dict, stores_quant_config and the weight_quant_params (nbits, channel_wise, group_size, optimize,
    round_zero = nbits == 4, axis, view_as_float), each through ``encode_safetensor_type``: bool -> uint8 0-d,
    int -> int32 0-d, float -> float32 0-d, str / torch.dtype -> uint8 character codes, torch.Size -> int64."""
    def enc(v):
        if isinstance(v, bool):
            return torch.tensor(int(v), dtype=torch.uint8)
        if isinstance(v, int):
            return torch.tensor(v, dtype=torch.int32)
        if isinstance(v, float):
            return torch.tensor(v, dtype=torch.float32)
        return _hqq_str(v)

    meta = {"nbits": enc(nbits), "group_size": enc(group_size), "shape": torch.tensor(torch.Size(shape)),
            "axis": enc(axis), "packing": enc(packing),
            "unpack_view_dtype": enc("torch.int32" if packing == "3bit_32" else "torch.uint8"),
            "view_as_float": enc(view_as_float), "quant_scale": enc(False), "quant_zero": enc(False),
            "compute_dtype": enc(compute_dtype), "offload_meta": enc(False), "encoded_state_dict": enc(True),
            "stores_quant_config": enc(True), "channel_wise": enc(True), "optimize": enc(True),
            "round_zero": enc(nbits == 4 if round_zero is None else round_zero)}
    return meta


def w_hqq(lg: Logical, seed: int = 0, axis: int = 1, group_size: int = HQQ_GROUP, meta: bool = False):
    """HQQ 2-bit with integer per-group zero points (see module docstring): groups of ``group_size`` along
    ``axis`` (1: rows of W.reshape(-1, G); 0: columns of W.reshape(G, -1)), W_q = HQQ's pack_2bit_u8 of
    that view; ``meta``: HQQ's meta tensors next to them (``hqq_meta``)."""
    g = torch.Generator().manual_seed(seed)
    G = group_size
    sd, tern, mult = _floats(lg, "hf"), {}, {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        groups = n * k // G
        if axis == 1 and k % G or axis == 0 and (n * k) % G:
            # HQQ's quantizer takes any N*K divisible by G; the reader (and this writer) not groups straddling
            # rows (README: "Not yet")
            raise ValueError(f"{mod}: {n}x{k} in HQQ groups of {G} along axis {axis}: "
                             + (f"K = {k} is not a multiple of {G} (groups would straddle rows; not written)"
                                if axis == 1 else f"N*K = {n * k} is not a multiple of {G}"))
        if axis == 1:
            z = torch.randint(1, 3, (n, k // G), generator=g)  # zero 1 (codes 0..2) or 2 (codes 1..3)
            q = t.to(torch.int64) + z.repeat_interleave(G, dim=1)
            sd[f"{mod}.W_q"] = hqq_pack_2bit_u8(q.reshape(-1, G))  # W.reshape([-1, group_size])
            s = _group(lg.mult[mod], n, k, G).to(torch.float16)  # (N, K/G)
            sd[f"{mod}.scale"] = s.reshape(groups, 1).contiguous()
            sd[f"{mod}.zero"] = z.to(torch.float16).reshape(groups, 1).contiguous()
            tern[mod], mult[mod] = t, s.float().repeat_interleave(G, dim=1)
        else:
            z = torch.randint(1, 3, (1, groups), generator=g)  # one zero per column of the [G, N*K/G] view
            q = t.to(torch.int64).reshape(G, groups) + z  # W.reshape([group_size, -1])
            sd[f"{mod}.W_q"] = hqq_pack_2bit_u8(q)
            s = lg.mult[mod].expand(n, k).reshape(G, groups)[:1].to(torch.float16)  # (1, N*K/G): first of each group
            sd[f"{mod}.scale"] = s.contiguous()
            sd[f"{mod}.zero"] = z.to(torch.float16).contiguous()
            tern[mod], mult[mod] = t, s.float().expand(G, groups).reshape(n, k).contiguous()
        if meta:
            sd.update({f"{mod}.{key}": v for key, v in hqq_meta((n, k), axis, G).items()})
    return sd, None, Truth(tern, mult, f"hqq{'-axis0' if axis == 0 else ''}{'-meta' if meta else ''}")


#: hqq/core/bitpack.py: packing -> (code bits, codes per container); Quantizer.bit_to_packing: nbits -> packing
HQQ_BITPACK = {"8bit_u8": (8, 1), "4bit_u8": (4, 2), "3bit_32": (3, 10), "2bit_u8": (2, 4), "1bit_u8": (1, 8)}
HQQ_PACKING = {8: "8bit_u8", 4: "4bit_u8", 3: "3bit_32", 2: "2bit_u8", 1: "1bit_u8"}


def hqq_bitpack(W_q: torch.Tensor, packing: str) -> torch.Tensor:
    """mobiusml/hqq hqq/core/bitpack.py ``BitPack.pack_<packing>``, transcribed: the rows are cut into f chunks
    (f codes per container), chunk c shifted to the c-th highest field (chunk 0 in the high bits); '3bit_32' first
    pads the rows with zeros to a multiple of 10 (int32, bits 30-31 unused); the u8 packings need len % f == 0
    (else HQQ's own broadcast fails)."""
    bits, f = HQQ_BITPACK[packing]
    if packing == "3bit_32":
        q = torch.zeros(-(-len(W_q) // 10) * 10, W_q.shape[1], dtype=torch.int32)
        q[:len(W_q)] = W_q.to(torch.int32)
    else:
        q = W_q.to(torch.uint8)
        if len(q) % f:
            raise ValueError(f"BitPack.pack_{packing} needs a multiple of {f} rows, got {len(q)}")
    step = len(q) // f
    out = torch.zeros_like(q[:step])
    for c in range(f):
        out |= q[c * step:(c + 1) * step] << (bits * (f - 1 - c))
    return out


def w_hqq_quant(lg: Logical, nbits: int = 2, axis: int = 1, group_size: int = HQQ_GROUP, meta: bool = True,
                round_zero: Optional[bool] = None, noise: float = 0.3, seed: int = 0,
                compute_dtype: torch.dtype = torch.float16, view_as_float: bool = False):
    """HQQ as its quantizer writes a float model (mobiusml/hqq ``Quantizer.quantize`` with optimize=False,
    transcribed): W = the logical effective weights plus ``noise`` * m * N(0, 1) (a float model, not ternary),
    viewed as W.reshape(-1, G) (axis=1) or W.reshape(G, -1) (axis=0); min / max along ``axis``;
    scale = (2^nbits - 1) / (max - min) clamped to 2e4, zero = -min * scale (rounded when ``round_zero``, HQQ's
    default for nbits 4 only), W_q = round(W * scale + zero) clamped to [0, 2^nbits - 1] and packed
    (``hqq_bitpack``); stored meta scale = 1 / scale and zero in ``compute_dtype`` (``Quantizer.cuda`` casts
    them), plus the meta tensors when ``meta``.  ``view_as_float``: W_q stored as ``W_q.view(compute_dtype)``, its
    packed bytes as a float tensor (``Quantizer.quantize`` with view_as_float=True; meta view_as_float True).  Truth: values q - zero (float32; integers where the zeros are)
    and the multiplier scale, so ``effective`` = Quantizer.dequantize in float32."""
    if round_zero is None:
        round_zero = nbits == 4  # hqq_base_quant_config: "round_zero": True if nbits == 4 else False
    packing = HQQ_PACKING[nbits]
    g = torch.Generator().manual_seed(seed)
    G = group_size
    sd, vals, mult = _floats(lg, "hf"), {}, {}
    max_v = 2 ** nbits - 1
    for mod in lg.ternary:
        n, k = lg.ternary[mod].shape
        W = lg.effective(mod) + noise * lg.mult[mod].expand(n, k) * torch.randn(n, k, generator=g)
        Wv = W.reshape(-1, G) if axis == 1 else W.reshape(G, -1)
        _min = Wv.min(dim=axis, keepdim=True)[0]
        _max = Wv.max(dim=axis, keepdim=True)[0]
        scale = (max_v / (_max - _min)).clamp(max=2e4)
        zero = -_min * scale
        if round_zero:
            zero = torch.round(zero)
        q = torch.round(Wv * scale + zero).clamp(0, max_v)
        s_st, z_st = (1.0 / scale).to(compute_dtype), zero.to(compute_dtype)
        sd[f"{mod}.W_q"] = hqq_bitpack(q, packing)
        if view_as_float:  # Quantizer.quantize: W_q = W_q.view(compute_dtype) after packing
            sd[f"{mod}.W_q"] = sd[f"{mod}.W_q"].view(compute_dtype)
        sd[f"{mod}.scale"], sd[f"{mod}.zero"] = s_st.contiguous(), z_st.contiguous()
        vals[mod] = (q - z_st.float()).reshape(n, k)
        mult[mod] = s_st.float().expand_as(q).reshape(n, k).contiguous()
        if meta:
            sd.update({f"{mod}.{key}": v for key, v in hqq_meta((n, k), axis, G, nbits=nbits, packing=packing,
                                                                 round_zero=round_zero, view_as_float=view_as_float,
                                                                 compute_dtype=str(compute_dtype)).items()})
    fmt = f"hqq-{nbits}bit{'-axis0' if axis == 0 else ''}{'' if meta else '-nometa'}" \
        + (f"-{str(compute_dtype).removeprefix('torch.')}-view" if view_as_float else "")
    return sd, None, Truth(vals, mult, fmt)


def w_hqq_mixed(lg: Logical, attn_bits: int = 4, mlp_bits: int = 2):
    """HQQ's quantizer with one width for the attention projections and another for the MLP (a common HQQ
    recipe: more bits where the layer is small), meta tensors included; see ``w_hqq_quant``."""
    a, m = w_hqq_quant(lg, attn_bits), w_hqq_quant(lg, mlp_bits)
    sd = {k: (a[0][k] if ".self_attn." in k else v) for k, v in m[0].items()}
    pick = lambda mod: a[2] if ".self_attn." in mod else m[2]  # noqa: E731
    return sd, None, Truth({mod: pick(mod).ternary[mod] for mod in lg.ternary},
                           {mod: pick(mod).mult[mod] for mod in lg.ternary}, f"hqq-mixed-{attn_bits}-{mlp_bits}")


def w_trilm(lg: Logical, shards: int = 2, per_row: bool = False):
    """fp16 [N, K] = T * s_shard; column-parallel modules (q,k,v,gate,up) shard rows, row-parallel
    ones (o, down) shard columns (Megatron), each shard with its own absmean-style s."""
    sd, tern, mult = _floats(lg, "hf"), {}, {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        base = _scalar(lg.mult[mod])
        if per_row:
            m = (base * (1 + 0.02 * torch.linspace(-1, 1, n))).reshape(n, 1)
            m = m.expand(n, k)
        elif mod.endswith(("o_proj", "down_proj")):
            idx = torch.arange(k) * shards // k  # (K,) shard of each column
            m = (base * (1 + 0.03 * (idx.float() - (shards - 1) / 2))).reshape(1, k).expand(n, k)
        else:
            idx = torch.arange(n) * shards // n
            m = (base * (1 + 0.03 * (idx.float() - (shards - 1) / 2))).reshape(n, 1).expand(n, k)
        w = (t.float() * m).to(torch.float16)
        sd[f"{mod}.weight"] = w
        tern[mod] = t
        mult[mod] = _rounded(m.contiguous(), torch.float16)
    return sd, None, Truth(tern, mult, "trilm")


BITNET_GPU_SPEC = PackSpec(bits=2, container="int8", pack_axis=1, lanes="block_interleaved", block=16,
                           bit_order="lsb", codes=(None, -1, 0, 1), pad_code=2)


def rope_interleave_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """transformers' q / k rows -> interleaved-RoPE order, as Microsoft BitNet's GPU converter writes them
    (gpu/convert_safetensors.py invert_convert_q / _k: rearrange '(h l d) i -> (h d l) i', l = 2; Meta's
    consolidated checkpoints are in this order too): within each head, transformers' row l * D / 2 + i becomes
    row 2 i + l."""
    n = w.shape[0]
    return w.reshape(n // head_dim, 2, head_dim // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def w_bitnet_gpu(lg: Logical):
    """Microsoft BitNet's GPU layout (gpu/convert_safetensors.py + convert_checkpoint.py, as safetensors): Meta names,
    q|k|v fused as wqkv with q / k rows in interleaved-RoPE order, gate|up as w13, int8 16x32-tile codes w + 2, one
    bf16 scale per sub-matrix.  Truth is in transformers' order."""
    sd, tern, mult = _floats(lg, "meta"), {}, {}
    cfg = ModelConfig.from_dict(lg.config)
    for L in range(cfg.num_layers):
        p = f"model.layers.{L}"
        for fused, parts in (("self_attn.qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                             ("mlp.gate_up", ("mlp.gate_proj", "mlp.up_proj")),
                             ("self_attn.o_proj", ("self_attn.o_proj",)), ("mlp.down_proj", ("mlp.down_proj",))):
            ts = [rope_interleave_rows(lg.ternary[f"{p}.{m}"], cfg.head_dim) if m in ("self_attn.q_proj",
                                                                                    "self_attn.k_proj")
                  else lg.ternary[f"{p}.{m}"] for m in parts]
            base = rename(f"{p}.{fused}", "meta")
            sd[f"{base}.weight"] = pack(torch.cat(ts, 0), BITNET_GPU_SPEC)
            s = torch.tensor([_scalar(lg.mult[f"{p}.{m}"]) for m in parts]).to(torch.bfloat16)
            sd[f"{base}.weight_scale"] = s
            for i, m in enumerate(parts):
                tern[f"{p}.{m}"] = lg.ternary[f"{p}.{m}"]
                mult[f"{p}.{m}"] = s[i].float().reshape(1, 1)
    return sd, None, Truth(tern, mult, "bitnet-gpu")


def w_hf_fused_per_part(lg: Logical, swapped: bool = False):
    """Fused qkv_proj / gate_up_proj whose parts were each packed with transformers' pack_weights (axis 0,
    blocked) and then concatenated: not the fused matrix packed at once (lanes restart in every part).
    ``swapped``: the parts in the other order a writer could pick, [up; gate] and [q; v; k] (no public writer is known
    to; the inspector settles the order by loss)."""
    sd = _floats(lg, "hf")
    tern, mult = {}, {}
    cfg = ModelConfig.from_dict(lg.config)
    fused = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
             "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
             "self_attn.o_proj": ("self_attn.o_proj",), "mlp.down_proj": ("mlp.down_proj",)}
    if swapped:
        fused["self_attn.qkv_proj"] = ("self_attn.q_proj", "self_attn.v_proj", "self_attn.k_proj")
        fused["mlp.gate_up_proj"] = ("mlp.up_proj", "mlp.gate_proj")
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}"
        for f, parts in fused.items():
            sd[f"{p}.{f}.weight"] = torch.cat([pack(lg.ternary[f"{p}.{m}"], HF_BITNET) for m in parts], 0)
            s = torch.tensor([float(lg.mult[f"{p}.{m}"].reshape(-1)[0]) for m in parts])
            sd[f"{p}.{f}.weight_scale"] = 1.0 / s  # BitLinear: stored 1/m, divided
            for i, m in enumerate(parts):
                tern[f"{p}.{m}"], mult[f"{p}.{m}"] = lg.ternary[f"{p}.{m}"], (1.0 / (1.0 / s[i])).reshape(1, 1)
    return sd, None, Truth(tern, mult, "hf-fused-per-part-swapped" if swapped else "hf-fused-per-part")


def w_custom(lg: Logical, pack_spec: PackSpec, *, scale: str = "channel", op: str = "multiply",
             group_size: int = 64, scale_dtype: torch.dtype = torch.float16, scheme: str = "hf"):
    """Any point of the PackSpec space (for generality tests: conventions nobody has named yet)."""
    sd, truth = _packed_convention(lg, pack_spec, scale=scale, op=op, scale_dtype=scale_dtype, scheme=scheme,
                                   group_size=group_size, fmt="custom")
    return sd, None, truth


def w_unpacked_int(lg: Logical, codes: tuple, container: str = "int8", scale: str = "channel",
                   op: str = "multiply", scale_dtype: torch.dtype = torch.float16, group_size: int = 64,
                   fmt: str = "unpacked-int"):
    """One integer per weight (no packing): ``container`` [N, K] holding ``codes`` of the values."""
    spec = PackSpec(bits=8, container=container, pack_axis=1, codes=codes, pad_code=codes.index(0))
    sd, truth = _packed_convention(lg, spec, scale=scale, op=op, scale_dtype=scale_dtype, group_size=group_size,
                                   fmt=fmt)
    return sd, None, truth


INT8_TERNARY = code_table(8, {255: -1, 0: 0, 1: 1})  # int8 holding -1 / 0 / +1 (-1 = 0xFF)
UINT8_W1 = code_table(8, {0: -1, 1: 0, 2: 1})  # codes w + 1
UINT8_PERM = code_table(8, {0: 0, 1: 1, 2: -1})  # the seed's code order, one per byte


def base3_spec(bit_order: str = "lsb", pad_code: int = 1, pack_axis: int = 1, transposed: bool = False) -> PackSpec:
    """Plain base-3 packing (``PackSpec`` codec 'base3'): five trits t = w + 1 per uint8 along ``pack_axis``,
    ``bit_order`` the digit order (lsb: byte = sum t_i * 3^i), the last byte padded with trit ``pad_code``."""
    return PackSpec(bits=2, container="uint8", pack_axis=pack_axis, lanes="interleaved", bit_order=bit_order,
                    codes=(-1, 0, 1, None), transposed=transposed, pad_code=pad_code, codec="base3")


def w_base3(lg: Logical, bit_order: str = "lsb", pad_code: int = 1, pack_axis: int = 1, transposed: bool = False):
    """Plain base-3 packing (``base3_spec``) with a per-channel fp16 ``weight_scale`` [N], multiplied: the scale the
    seed writes, so a model written both ways decodes to the same effective weights bit for bit."""
    sd, truth = _packed_convention(lg, base3_spec(bit_order, pad_code, pack_axis, transposed), scale="channel",
                                   op="multiply", scale_dtype=torch.float16, fmt="base3")
    return sd, None, truth


#: one code per element stored as a float value: trits t = w + 1 as 0.0 / 1.0 / 2.0 (``PackSpec`` codec 'float_codes')
FLOAT_CODES = PackSpec(bits=8, container="uint8", codes=code_table(8, {0: -1, 1: 0, 2: 1}), pad_code=1,
                       codec="float_codes")


def w_float_codes(lg: Logical, dtype: torch.dtype = torch.bfloat16):
    """Ternary codes t = w + 1 stored as a float tensor (``dtype`` [N, K] of 0.0 / 1.0 / 2.0), per-channel fp16
    ``weight_scale`` [N] multiplied: values 0 / 1 / 2 that are codes, not weights."""
    sd, truth = _packed_convention(lg, FLOAT_CODES, scale="channel", op="multiply", scale_dtype=torch.float16,
                                   fmt="float-codes")
    for mod in lg.ternary:  # pack gives the codes as float32 values: stored in ``dtype`` (exact)
        sd[f"{mod}.weight"] = sd[f"{mod}.weight"].to(dtype)
    return sd, None, truth


def w_sign_masks(lg: Logical, packed: bool, bit_order: str = "msb", transposed: bool = False, pack_axis: int = 1,
                 dtype: torch.dtype = torch.uint8, names: tuple = ("weight_pos", "weight_neg"),
                 neg_first: bool = False, scale: str = "channel", group_size: int = 64):
    """A +1 / -1 sign-bitmask pair per linear (``formats.pack_sign_masks``, PackSpec codec 'sign_masks'):
    ``<module>.<names[0]>`` flags w = +1, ``<module>.<names[1]>`` w = -1, W = pos - neg.  One flag per element
    (``packed`` False: ``dtype`` bool / uint8 / int8 [N, K]) or eight per byte (uint8 / int8 [N, ceil(K/8)] along
    ``pack_axis``, ``bit_order`` msb = ``np.packbits``' default, the last byte padded with 0 flags); ``transposed``:
    each mask stored as its transpose.  An fp16 ``weight_scale``, multiplied, per channel [N] (``scale`` 'group':
    [N, ceil(K / group_size)]): the scale of synth's int8 twin ``w_unpacked_int(lg, INT8_TERNARY, scale=scale,
    scale_dtype=torch.float16)``, so the two decode to the same effective weights bit for bit.  ``neg_first``: each
    -1 mask written before its +1 mask (a loader must pair them in either order)."""
    spec = sign_mask_spec(packed, bit_order, pack_axis, transposed, "int8" if dtype == torch.int8 else "uint8")
    sd, truth = _packed_convention(lg, PackSpec(bits=8, container="int8", codes=INT8_TERNARY), scale=scale,
                                   op="multiply", scale_dtype=torch.float16, group_size=group_size, fmt="sign-masks")
    for mod, t in lg.ternary.items():
        del sd[f"{mod}.weight"]  # (the int8 weight _packed_convention wrote beside the scale)
        masks = [m.bool() if dtype == torch.bool else m for m in pack_sign_masks(t, spec)]
        for i in ((1, 0) if neg_first else (0, 1)):
            sd[f"{mod}.{names[i]}"] = masks[i]
    return sd, None, truth


NIBBLE_SPEC = PackSpec(bits=4, container="uint8", pack_axis=1, lanes="interleaved", bit_order="msb",
                       codes=code_table(4, {0: -1, 1: 0, 2: 1}), pad_code=1)


def w_nibble(lg: Logical):
    sd, truth = _packed_convention(lg, NIBBLE_SPEC, scale="channel", op="multiply", scale_dtype=torch.float16,
                                   fmt="nibble-ternary")
    return sd, None, truth


def ct_spec(bits: int, ternary: bool = False) -> PackSpec:
    """compressed-tensors pack-quantized int-b: int32, consecutive inputs low bits first, code v + 2^(b-1)
    (pack_to_int32 pads with code 0)."""
    half = 1 << (bits - 1)
    codes = code_table(bits, {half - 1: -1, half: 0, half + 1: 1}) if ternary else offset_table(bits, half)
    return PackSpec(bits=bits, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb", codes=codes,
                    pad_code=0 if codes[0] is not None else half)


def w_compressed_tensors_int(lg: Logical, bits: int, ternary: bool = False, group_size: int = 64,
                             actorder: Optional[str] = None, seed: int = 0):
    """compressed-tensors pack-quantized, symmetric int-``bits``, group strategy.  ``actorder`` 'group': the groups
    of ``actorder_g_idx`` for ``actorder_perms(lg, seed)`` (llm-compressor's ActivationOrdering.GROUP), each with the
    fp16 multiplier of its first input in the permuted order, and ``weight_g_idx`` int32 [K]; write a
    ``Logical.with_group_jitter(group_size, g_idx=...)`` of the same index so that the groups differ."""
    sd, truth = _packed_convention(lg, ct_spec(bits, ternary), scale="group", op="multiply",
                                   scale_dtype=torch.float16, weight_suffix="weight_packed", group_size=group_size,
                                   fmt=f"compressed-tensors-int{bits}")
    perms = actorder_perms(lg, seed) if actorder == "group" else {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        sd[f"{mod}.weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        if mod in perms:
            gi = actorder_g_idx(perms[mod], group_size)
            s = lg.mult[mod].expand(n, k)[:, perms[mod][::group_size]].to(torch.float16)  # (N, G)
            sd[f"{mod}.weight_scale"], sd[f"{mod}.weight_g_idx"] = s, gi
            truth.mult[mod] = s.float()[:, gi.long()]
    w = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size,
         "dynamic": False, **({"actorder": actorder} if actorder else {})}
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None}},
         "ignore": ["lm_head"]}
    return sd, q, truth


#: modules the mixed-width writer keeps at 4 bits by default: the first decoder layer and every down_proj
MIXED_WIDE = ("model.layers.0.", ".mlp.down_proj")


def w_compressed_tensors_mixed(lg: Logical, wide=MIXED_WIDE, unpacked=()):
    """compressed-tensors pack-quantized ternary with mixed code widths in one model: modules whose
    name contains one of ``wide`` are int-4 (int32 [N, K/8], codes 7 / 8 / 9), those matching
    ``unpacked`` int8 [N, K] holding -1 / 0 / +1 (one value per element), the rest int-2 (int32
    [N, K/16], codes 1 / 2 / 3); per-channel fp16 scales [N, 1]; one config_group per width."""
    sd, tern, mult = _floats(lg, "hf"), {}, {}
    targets = {2: [], 4: [], 8: []}
    int8 = PackSpec(bits=8, container="int8", pack_axis=1, codes=INT8_TERNARY, pad_code=0)
    for mod, t in lg.ternary.items():
        n, _ = t.shape
        bits = 8 if any(w in mod for w in unpacked) else (4 if any(w in mod for w in wide) else 2)
        targets[bits].append(mod)
        sd[f"{mod}.weight_packed"] = pack(t, int8 if bits == 8 else ct_spec(bits, ternary=True))
        s = _channel(lg.mult[mod], n).to(torch.float16)
        sd[f"{mod}.weight_scale"] = s.reshape(-1, 1)
        sd[f"{mod}.weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        tern[mod], mult[mod] = t, s.float().reshape(n, 1)
    groups = {}
    for bits in (2, 4, 8):
        if targets[bits]:
            w = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
            groups[f"group_{len(groups)}"] = {"targets": targets[bits] if bits != 2 else ["Linear"], "weights": w,
                                              "input_activations": None}
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": groups,
         "ignore": ["lm_head"]}
    return sd, q, Truth(tern, mult, "compressed-tensors-mixed")


FORMATS: dict[str, Callable] = {
    "hf-bitlinear": lambda lg: w_hf(lg, "bitlinear"),
    "hf-autobitlinear": lambda lg: w_hf(lg, "autobitlinear"),
    "hf-msb": lambda lg: w_hf(lg, "bitlinear", bit_order="msb"),
    "hf-dot-scale": lambda lg: w_hf(lg, "bitlinear", scale_suffix="weight.scale"),
    "hf-bare-scale": lambda lg: w_hf(lg, "autobitlinear", scale_suffix="scale"),
    "hf-scale-inv-divide": lambda lg: w_hf(lg, "bitlinear", scale_suffix="weight_scale_inv", op="divide"),
    "hf-scale-inv-multiply": lambda lg: w_hf(lg, "bitlinear", scale_suffix="weight_scale_inv", op="multiply"),
    "hf-bitlinear-head": lambda lg: w_hf(lg, "bitlinear", modules_to_not_convert=[]),
    "seed": lambda lg: w_seed(lg),
    "seed-msb": lambda lg: w_seed(lg, bit_order="msb"),
    "group": lambda lg: w_seed(lg, scale="group", group_size=64),
    "compressed-tensors": lambda lg: w_compressed_tensors(lg, "channel"),
    "compressed-tensors-group": lambda lg: w_compressed_tensors(lg, "group", 64),
    "gptq": lambda lg: w_gptq(lg, 64),
    "gptq-actorder": lambda lg: w_gptq(lg, 64, act_order=True),
    "i2s": w_i2s,
    "tq2_0": w_tq2_0,
    "tq1_0": w_tq1_0,
    "hqq": w_hqq,
    "hqq-meta": lambda lg: w_hqq(lg, meta=True),
    "hqq-axis0": lambda lg: w_hqq(lg, axis=0),
    "hqq-axis0-meta": lambda lg: w_hqq(lg, axis=0, meta=True),
    "trilm": lambda lg: w_trilm(lg, shards=2),
    "trilm-row": lambda lg: w_trilm(lg, per_row=True),
    "bitnet-gpu": w_bitnet_gpu,
    "hf-fused-per-part": w_hf_fused_per_part,
    "hf-fused-per-part-swapped": lambda lg: w_hf_fused_per_part(lg, swapped=True),
    "int8-ternary": lambda lg: w_unpacked_int(lg, INT8_TERNARY, "int8", scale="channel", scale_dtype=torch.bfloat16,
                                              fmt="int8-ternary"),
    "uint8-ternary": lambda lg: w_unpacked_int(lg, UINT8_W1, "uint8", scale="tensor", op="divide",
                                               scale_dtype=torch.float32, fmt="uint8-ternary"),
    "uint8-ternary-perm": lambda lg: w_unpacked_int(lg, UINT8_PERM, "uint8", scale="group", fmt="uint8-ternary-perm"),
    "nibble-ternary": w_nibble,
    "compressed-tensors-int4-ternary": lambda lg: w_compressed_tensors_int(lg, 4, ternary=True),
    "gptq-int4-ternary": lambda lg: w_gptq(lg, 64, bits=4),
    "gptq-int3-ternary": lambda lg: w_gptq(lg, 64, bits=3),
    "compressed-tensors-mixed": w_compressed_tensors_mixed,
    "base3": w_base3,
    "base3-msb-pad0": lambda lg: w_base3(lg, bit_order="msb", pad_code=0),
    "float-codes-bf16": w_float_codes,
    "sign-masks-bool": lambda lg: w_sign_masks(lg, False, dtype=torch.bool),
    "sign-masks-u8": lambda lg: w_sign_masks(lg, False),
    "sign-masks-u8-packed": lambda lg: w_sign_masks(lg, True),
    "sign-masks-u8-packed-lsb": lambda lg: w_sign_masks(lg, True, bit_order="lsb"),
}

#: HQQ's quantizer on a float model (``w_hqq_quant``: asymmetric levels, not ternary; any ``Logical``)
HQQ_FORMATS: dict[str, Callable] = {
    "hqq-2bit": lambda lg: w_hqq_quant(lg, 2),
    "hqq-2bit-nometa": lambda lg: w_hqq_quant(lg, 2, meta=False),
    "hqq-2bit-axis0": lambda lg: w_hqq_quant(lg, 2, axis=0),
    "hqq-4bit": lambda lg: w_hqq_quant(lg, 4),
    "hqq-4bit-nometa": lambda lg: w_hqq_quant(lg, 4, meta=False),
    "hqq-3bit": lambda lg: w_hqq_quant(lg, 3),
    "hqq-3bit-axis0-nometa": lambda lg: w_hqq_quant(lg, 3, axis=0, meta=False),
    "hqq-1bit": lambda lg: w_hqq_quant(lg, 1),
    "hqq-8bit": lambda lg: w_hqq_quant(lg, 8),
    "hqq-mixed": w_hqq_mixed,
    # view_as_float=True: W_q stored as W_q.view(compute_dtype), the packed bytes as a float tensor
    "hqq-2bit-float16-view": lambda lg: w_hqq_quant(lg, 2, view_as_float=True),
    "hqq-4bit-bfloat16-view": lambda lg: w_hqq_quant(lg, 4, compute_dtype=torch.bfloat16, view_as_float=True),
    "hqq-3bit-float16-view": lambda lg: w_hqq_quant(lg, 3, view_as_float=True),
}

#: AutoGPTQ sym=False on a float model (``w_gptq_asym``: per-group integer zero points; any ``Logical``)
GPTQ_ASYM_FORMATS: dict[str, Callable] = {
    "gptq-asym-int4": lambda lg: w_gptq_asym(lg, 4),
    "gptq-asym-int2": lambda lg: w_gptq_asym(lg, 2),
    "gptq-asym-int4-v2": lambda lg: w_gptq_asym(lg, 4, v2=True),
    "gptq-asym-int8": lambda lg: w_gptq_asym(lg, 8),
    "gptq-asym-int4-actorder": lambda lg: w_gptq_asym(lg, 4, act_order=True),
    "gptq-asym-int8-actorder-v2": lambda lg: w_gptq_asym(lg, 8, v2=True, act_order=True),
    "gptq-asym-int4-actorder-static": lambda lg: w_gptq_asym(lg, 4, act_order=True, static_groups=True),
    "gptq-asym-int4-actorder-row": lambda lg: w_gptq_asym(lg, 4, group_size=-1, act_order=True),
    "gptq-asym-int3-g128": lambda lg: w_gptq_asym(lg, 3, group_size=128),
    "gptq-asym-int3-v2": lambda lg: w_gptq_asym(lg, 3, v2=True),
    "gptq-asym-int3-g32": lambda lg: w_gptq_asym(lg, 3, group_size=32),
    "gptq-asym-int3-row": lambda lg: w_gptq_asym(lg, 3, group_size=-1),
}

#: AutoAWQ (version gemm / gemv, 4-bit, zero_point true) on a float model (``w_awq`` / ``w_awq_gemv``: per-group
#: integer zero points; any ``Logical`` whose K is a multiple of the group size and N of 32 (gemm) / 8 (gemv))
AWQ_FORMATS: dict[str, Callable] = {
    "awq-gemm-g128": lambda lg: w_awq(lg, 128),
    "awq-gemm-g64": lambda lg: w_awq(lg, 64),
    "awq-gemm-g32": lambda lg: w_awq(lg, 32),
    "awq-gemm-row": lambda lg: w_awq(lg, -1),
    "awq-gemv-g128": lambda lg: w_awq_gemv(lg, 128),
    "awq-gemv-g64": lambda lg: w_awq_gemv(lg, 64),
    "awq-gemv-g32": lambda lg: w_awq_gemv(lg, 32),
    "awq-gemv-row": lambda lg: w_awq_gemv(lg, -1),
}

#: compressed-tensors ``symmetric: false`` on a float model (``w_compressed_tensors_asym``: llm-compressor's min-max
#: observer + compressed-tensors 0.17's calculate_qparams / quantize / compressors; any ``Logical`` whose K is a
#: multiple of 64)
CT_ASYM_FORMATS: dict[str, Callable] = {
    "compressed-tensors-asym-int4": lambda lg: w_compressed_tensors_asym(lg, 4, "group", 64),
    "compressed-tensors-asym-int2": lambda lg: w_compressed_tensors_asym(lg, 2, "group", 64),
    "compressed-tensors-asym-int8": lambda lg: w_compressed_tensors_asym(lg, 8, "group", 64),
    "compressed-tensors-asym-int4-channel": lambda lg: w_compressed_tensors_asym(lg, 4, "channel"),
    "compressed-tensors-asym-int8-channel": lambda lg: w_compressed_tensors_asym(lg, 8, "channel"),
    "compressed-tensors-asym-int4-tensor": lambda lg: w_compressed_tensors_asym(lg, 4, "tensor"),
    "compressed-tensors-asym-int4-legacy": lambda lg: w_compressed_tensors_asym(lg, 4, "group", 64, legacy=True),
    "compressed-tensors-asym-int8-channel-legacy": lambda lg: w_compressed_tensors_asym(lg, 8, "channel",
                                                                                         legacy=True),
    "compressed-tensors-asym-mixed": lambda lg: w_compressed_tensors_asym(lg, 4, "group", 64,
                                                                          wide={"down_proj": 8, "layers.0.": 2}),
    "compressed-tensors-asym-naive-int8": lambda lg: w_compressed_tensors_asym(lg, 8, "group", 64,
                                                                               fmt="naive-quantized"),
    "compressed-tensors-asym-int4-actorder": lambda lg: w_compressed_tensors_asym(lg, 4, "group", 64,
                                                                                  actorder="group"),
    "compressed-tensors-asym-naive-int8-actorder": lambda lg: w_compressed_tensors_asym(
        lg, 8, "group", 64, fmt="naive-quantized", actorder="group"),
    "compressed-tensors-asym-int4-actorder-weight": lambda lg: w_compressed_tensors_asym(lg, 4, "group", 64,
                                                                                         actorder="weight"),
}

#: symmetric low-bit integer conventions beyond ternary (write a ``Logical.requantized(bits)`` model)
INT_FORMATS: dict[str, Callable] = {
    "compressed-tensors-int2": lambda lg: w_compressed_tensors_int(lg, 2),
    "compressed-tensors-int4": lambda lg: w_compressed_tensors_int(lg, 4),
    "gptq-int4": lambda lg: w_gptq(lg, 64, bits=4, ternary=False),
    "compressed-tensors-int4-actorder": lambda lg: w_compressed_tensors_int(lg, 4, actorder="group"),
    "gptq-int3": lambda lg: w_gptq(lg, 64, bits=3, ternary=False),
}


_WRITERS = (FORMATS, INT_FORMATS, HQQ_FORMATS, GPTQ_ASYM_FORMATS, AWQ_FORMATS, CT_ASYM_FORMATS)


def save_checkpoint(sd: dict[str, torch.Tensor], out: Path, shards: int = 1) -> None:
    """model.safetensors, or ``shards`` files + model.safetensors.index.json (keys in order)."""
    from safetensors.torch import save_file

    keys = list(sd)
    if shards <= 1:
        save_file({k: sd[k].contiguous() for k in keys}, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    wm = {}
    per = -(-len(keys) // shards)
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i * per:(i + 1) * per]
        save_file({k: sd[k].contiguous() for k in part}, str(out / fname), metadata={"format": "pt"})
        wm.update({k: fname for k in part})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    atomic_write_text(out / "model.safetensors.index.json",
                      json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=1))


def write(fmt, lg: Logical, out, *, shards: int = 1, keep_quant_config: bool = True) -> Truth:
    """Write ``lg`` in convention ``fmt`` (a ``FORMATS`` key, or a writer ``lg -> (sd, qcfg, truth)``)
    to directory ``out`` (replaced); return the ground truth."""
    if callable(fmt):
        writer, fmt = fmt, getattr(fmt, "__name__", "custom")
    elif any(fmt in d for d in _WRITERS):
        writer = next(d[fmt] for d in _WRITERS if fmt in d)
    else:
        raise KeyError(f"unknown convention {fmt!r}; known: {sorted(f for d in _WRITERS for f in d)}")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    sd, qcfg, truth = writer(lg)
    cfg = {k: v for k, v in lg.config.items() if k != "quantization_config"}
    if qcfg is not None and keep_quant_config:
        cfg["quantization_config"] = qcfg
    atomic_write_text(out / "config.json", json.dumps(cfg, indent=1))
    save_checkpoint(sd, out, shards)
    if lg.tokenizer_dir is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if (Path(lg.tokenizer_dir) / f).exists():
                shutil.copy(Path(lg.tokenizer_dir) / f, out / f)
    truth.fmt = fmt
    return truth
