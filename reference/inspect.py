"""Infer the packed format of an unknown ternary / low-bit checkpoint and write its spec.

    python -m reference.inspect DIR [--out SPEC] [--report MD] [--text FILE] [--no-loss]

Pipeline (each step records its evidence and a confidence for the report):
  1. scan      every tensor once (``reference.scan``): dtype, shape, code histograms, magnitudes
  2. map keys  checkpoint names -> HF modules by a declarative alias table (q_proj / wq / attn_q
               ...); fused qkv / gate_up split by config.json sizes; missing or extra keys fail
  3. structure code width (2-bit, 4-bit nibbles or one value per 8-bit element, from the ratio of
               stored to config.json shapes; per module when no one width fits every packed tensor,
               with zero points and code tables then inferred per width group; where every tensor fits both an
               unpadded packing and one at half the width with rows padded to one block, and config.json names
               no width, the checkpoint is decoded both ways and the reading that decodes better kept),
               container, values per container, pack axis, transposed
               storage and logical shape (square matrices follow the non-square ones); uint8 weights that fit only
               five trits a byte ([N, ceil(K/5)]) are plain base-3 packing (``_detect_base3``, PackSpec codec
               'base3': digit order and trit table searched like bit order and code table), and float linears whose
               values are exactly {0, 1, 2} hold codes t = w + 1 (``_float_codes``, codec 'float_codes'), a linear
               stored as a +1 / -1 sign-bitmask pair (two masks, W = pos - neg) is codec 'sign_masks' with the -1
               mask as the spec's neg_key (``detect_sign_masks``: one flag per element or eight per byte from the
               shapes, the bit order by padding / loss like any layout's), scale
               granularity / group size, zero-point and g_idx sanity, code table: three used codes
               = ternary (unused codes; the +-1 pair = the two used codes with the closest counts;
               the third is 0), more = symmetric integer levels (int2 {-2..1}, int4 {-8..7}: offset
               binary or two's complement).  AutoAWQ gemm / gemv checkpoints are recognised first, from
               config.json (quant_method awq) or their qweight / qzeros / scales shapes (``detect_awq``:
               AWQ_ORDER, per-group zero points, nothing to search), then compressed-tensors ``symmetric:
               false`` (``detect_ct_asym``: config_groups or weight_packed / weight_zero_point shapes, zero
               points packed along N or int8 unpacked, nothing to search).  Two conventions are recognised by their
               block structure next: llama.cpp TQ2_0 (uint8 [N, ceil(K/256)*66], fp16 scale inside each 66-byte
               block) and HQQ (W_q + per-group scale and zero points, axis=1 or axis=0 groups, every
               HQQ packing, ternary or HQQ's asymmetric levels, with or without HQQ's meta tensors;
               see "HQQ" below)
  4. search    what statistics cannot tell (+-1 swap, bit order, lane layout and block,
               multiply/divide when config and magnitudes are silent) is scored by the reference
               model's loss on a text sample; identical decodes are merged; the margin to the
               best alternative is the confidence
  5. output    ``reference.spec.CheckpointSpec`` JSON (DIR/ternary_spec.json) + Markdown report

HQQ (mobiusml/hqq, read from its source, not guessed):
  * ``hqq/core/quantize.py`` ``Quantizer.quantize``: W [N, K] (row-major) is viewed as
    ``W.reshape([-1, group_size])`` for ``axis=1`` (one row per group of G consecutive inputs) or
    ``W.reshape([group_size, -1])`` for ``axis=0`` (one group per *column* of the [G, N*K/G] view:
    flat elements j, j + N*K/G, ...); min / max, hence ``scale`` and ``zero``, are taken along
    ``axis`` with keepdim, so both are [N*K/G, 1] (axis=1) or [1, N*K/G] (axis=0); ``dequantize``
    is ``((W_q_unpacked - zero) * scale).reshape(shape)``.  G must divide N*K (HQQ asserts it);
    here axis=1 also needs G | K (groups within a row) and axis=0 needs f | G for the uint8 packings.
    ``scale = (2^nbits - 1) / (max - min)``, ``zero = -min * scale`` (rounded only with round_zero, HQQ's
    default for nbits 4), stored as 1 / scale and zero: the zero points are floats, so q - zero is
    HQQ's asymmetric levels, ternary only where every zero is an integer and every q - zero in
    {-1, 0, +1} (the spec's ``levels: "ternary"``; a checkpoint with a stray non-integer zero, or
    fewer than 1% of values outside {-1, 0, +1}, is a ternary one with a corrupt tensor: an error).
  * ``hqq/core/bitpack.py`` ``BitPack.pack_<packing>``: the view is cut along its axis 0 into f chunks
    of len/f rows, chunk c in the c-th highest field (chunk 0 in the high bits): f = 8 / 4 / 2 / 1 for
    '1bit_u8' / '2bit_u8' / '4bit_u8' / '8bit_u8' (uint8 [ceil(N*K/G / f), G] for axis=1, [G/f, N*K/G]
    for axis=0) and f = 10 for '3bit_32' (int32, rows zero-padded to a multiple of 10, bits 30-31
    unused: ``PackSpec.fields`` 10) = ``PackSpec(pack_axis=0, lanes='blocked', bit_order='msb',
    group_view=G, group_axis=axis)``.  nbits 2 and 1.58 both pack as '2bit_u8', 5 / 6 / 8 as '8bit_u8'
    (``Quantizer.bit_to_packing``).  Without meta the packing is read from W_q's dtype and rows
    against the number of scales.
  * ``HQQLinear.state_dict`` (``encoded_state_dict=True``, what ``save_to_safetensors`` and
    transformers' ``save_pretrained`` store under ``<module>.<key>``): ``W_q``, the meta dict
    (``nbits group_size shape scale zero axis packing unpack_view_dtype view_as_float quant_scale
    quant_zero compute_dtype``), ``bias`` if any, ``offload_meta``, ``encoded_state_dict``,
    ``stores_quant_config`` and the weight_quant_params (``nbits channel_wise group_size optimize
    round_zero axis view_as_float``) = ``HQQLinear.state_dict_keys()``; every non-tensor value
    through ``hqq/core/utils.py`` ``encode_safetensor_type``: bool -> uint8 0-d (0 / 1), int ->
    int32 0-d, float (nbits 1.58) -> float32 0-d, str and torch.dtype (as ``str(dtype)``, e.g.
    'torch.float16') -> uint8 1-d of the characters' ``ord``, torch.Size -> ``torch.tensor(size)``
    (int64 [2] = [out_features, in_features]).  The inspector reads these meta tensors next to a
    ``W_q`` (``HQQ_META``), uses axis / group_size as evidence, and refuses, naming the file, the
    tensor and the expected value, any that contradicts the stored tensors or config.json (an nbits
    HQQ does not have, a packing that is not nbits' own, an unpack_view_dtype not the packing's,
    quant_scale / quant_zero / offload_meta set, channel_wise unset, shape not config.json's
    [N, K], an axis or group_size that does not give the stored W_q / scale / zero shapes); the
    spec lists them under ``ignored``.
  * ``view_as_float`` True (``Quantizer.quantize``: ``W_q = W_q.view(compute_dtype)`` after packing;
    ``dequantize`` views it back as ``unpack_view_dtype``): W_q is a float16 / bfloat16 / float32
    tensor whose bytes are the packed integer tensor (uint8 [a, b] as float16 [a, b/2], int32 [a, b]
    as float16 [a, 2b]).  The inspector reads its integer view (``unpack_view_dtype``, else the
    packing's), bit for bit, in place of the stored tensor (``_hqq_float_views``), and the spec says
    so with ``pack.stored_as``.  view_as_float True next to an integer W_q, a float W_q without it,
    a float dtype other than compute_dtype or a byte count that is no integer view is an error
    naming the file, the tensor and what was expected.  Without meta, the axis is read from the shapes: scale /
    zero [1, N*K/G] with W_q [G/4, N*K/G] is axis=0, else axis=1 as before.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .checkpoint import Checkpoint, CheckpointError
from .config import ModelConfig
from .formats import (AWQ_GEMM, AWQ_GEMM_ZEROS, AWQ_ORDER, CT_PACK_ZP_STRATEGIES, SIGN_FLAGS_BIT, SIGN_FLAGS_BYTE,
                      FormatError, PackSpec, ScaleSpec, ct_zero_pack_spec, group_index, offset_table,
                      twos_complement_table, unpack_codes)
from .scan import CONTAINER_OF, INT_DTYPES, TensorStats, scan
from .inspect_search import (BLOCKS, NAMED_MARGIN, TQ2_0_RECORD, UNDECODABLE, UNTRAINED_BAND, Candidate,
                             axis_margins, build_spec, codes_str, confidence, declared_activation_quant, lane_options,
                             per_part_options, plain_float_linear, search)
from .spec import (INVERSE_SCALE_SUFFIXES, SPEC_FILENAME, UNTIED_HEAD_HINT, CheckpointSpec, bitnet_linear_class,
                   check_layer_count, decode_linear, derived_buffer, spec_home)


class InspectError(CheckpointError):
    """The checkpoint cannot be described by a spec; the message names file, tensor, expectation."""


class AmbiguousWidth(InspectError):
    """choose_bits, not told which reading to take: every packed tensor's shape fits ``wide``-bit codes unpadded and
    ``half``-bit codes with its rows padded to one block (twice their length), and config.json names no width.
    ``inspect_dir`` catches it and decodes the checkpoint both ways (``_width_by_decode``)."""

    def __init__(self, shapes: str, wide: int, half: int):
        super().__init__(f"{shapes}; config.json names no width: expected quantization_config bits {wide} or {half} "
                         f"(inspect_dir decodes both readings)")
        self.shapes, self.wide, self.half = shapes, wide, half


# ---------------------------------------------------------------------------------------
# key mapping: checkpoint names -> HF roles

LAYER_TOKENS = {"layers", "layer", "h", "blk", "blocks", "block", "decoder_layers"}
ALIASES: dict[str, set[str]] = {
    "q": {"q_proj", "wq", "query", "attn_q", "q"},
    "k": {"k_proj", "wk", "key", "attn_k", "k"},
    "v": {"v_proj", "wv", "value", "attn_v", "v"},
    "o": {"o_proj", "wo", "out_proj", "attn_output", "attn_out", "dense", "o"},
    "qkv": {"qkv_proj", "wqkv", "query_key_value", "attn_qkv", "qkv", "c_attn"},
    "gate": {"gate_proj", "w1", "ffn_gate", "gate"},
    "up": {"up_proj", "w3", "ffn_up", "up"},
    "down": {"down_proj", "w2", "ffn_down", "down"},
    "gate_up": {"gate_up_proj", "w13", "ffn_gate_up", "gate_up"},
    "lm_head": {"lm_head", "output"},
    "embed": {"embed_tokens", "tok_embeddings", "token_embd", "wte", "word_embeddings", "embed"},
    "final_norm": {"norm", "output_norm", "ln_f", "final_layernorm", "final_norm"},
    "input_norm": {"input_layernorm", "attention_norm", "attn_norm", "ln_1"},
    "post_norm": {"post_attention_layernorm", "ffn_norm", "ln_2"},
    "attn_sub_norm": {"attn_sub_norm", "inner_attn_ln", "sub_norm_attn"},
    "ffn_sub_norm": {"ffn_sub_norm", "ffn_layernorm", "sub_norm_ffn"},
}
LINEAR_PARTS = {"q": ("self_attn.q_proj",), "k": ("self_attn.k_proj",), "v": ("self_attn.v_proj",),
                "o": ("self_attn.o_proj",), "gate": ("mlp.gate_proj",), "up": ("mlp.up_proj",),
                "down": ("mlp.down_proj",), "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "lm_head": ("lm_head",)}
FLOAT_HF = {"input_norm": "input_layernorm.weight", "post_norm": "post_attention_layernorm.weight",
            "attn_sub_norm": "self_attn.attn_sub_norm.weight", "ffn_sub_norm": "mlp.ffn_sub_norm.weight"}


def parse_key(name: str) -> tuple[Optional[int], Optional[str], str]:
    """name -> (layer, role, prefix).  Role from the last module token that is a known alias."""
    parts = name.split(".")
    layer, body = None, parts
    for i in range(len(parts) - 1):
        if parts[i].lower() in LAYER_TOKENS and parts[i + 1].isdigit():
            layer, body = int(parts[i + 1]), parts[i + 2:]
            break
    prefix = ".".join(parts[:-1])
    if len(body) >= 3 and body[-2] == "weight" and body[-1] != "weight":
        prefix = ".".join(parts[:-2])  # '<module>.weight.scale': a companion of '<module>.weight'
    for tok in reversed(body[:-1]):
        t = tok.lower()
        for role, names in ALIASES.items():
            if t in names and not (role == "final_norm" and layer is not None) \
                    and not (role in FLOAT_HF and layer is None):
                return layer, role, prefix
    return layer, None, prefix


@dataclass
class Module:
    """One stored linear tensor (maybe fused) and its companions."""

    prefix: str
    layer: Optional[int]
    role: str
    weight: TensorStats
    scale: Optional[TensorStats] = None
    zeros: Optional[TensorStats] = None
    g_idx: Optional[TensorStats] = None
    shape_t: Optional[TensorStats] = None
    bias: Optional[TensorStats] = None
    # a fused-on-disk tensor whose modules keep their own biases (``<layer>.self_attn.k_proj.bias`` beside a
    # ``qkv_proj.weight``): hf module -> its bias (``bias``: one bias for the fused rows)
    part_bias: dict = field(default_factory=dict)
    parts: list = field(default_factory=list)  # [(hf module, (row0, row1))]
    logical: tuple = (0, 0)  # (N, K) of the stored (fused) matrix
    transposed: bool = False
    pack_axis: int = 1
    scale_kw: list = field(default_factory=list)  # per part: ScaleSpec kwargs (no key / op)
    bits: int = 2  # code width of a packed weight (2, 4, or 8 = one value per byte)
    record: Optional[tuple] = None  # (values, bytes) per record: llama.cpp TQ2_0 blocks (256, 66), TQ1_0 (256, 54)
    # PackSpec.codec: "tq1_0" (base-3 digits in llama.cpp TQ1_0 blocks), "bitstream" (AutoGPTQ 3-bit), "base3" (five
    # trits per byte, _detect_base3), "float_codes" (codes stored as float values, _float_codes)
    codec: Optional[str] = None
    group_view: Optional[int] = None  # G: codes packed as a group view (HQQ; see PackSpec.group_view)
    group_axis: int = 1  # 1: the [N*K/G, G] view (HQQ axis=1); 0: the [G, N*K/G] view (HQQ axis=0)
    zero_kw: Optional[dict] = None  # ScaleSpec kwargs of per-group zero points (HQQ, GPTQ sym=False)
    zero_pack: Optional[PackSpec] = None  # LinearEntry.zero_pack: the zero tensor's own packing (GPTQ qzeros)
    levels: Optional[str] = None  # LinearEntry.levels: "ternary" where the zero points were found to give ternary
    fields: Optional[int] = None  # PackSpec.fields: codes per container that do not tile it (HQQ 3bit_32)
    gguf_i2s: bool = False  # the weight is a GGUF I2_S tensor (its type names bitnet.cpp's layouts)
    # rows may be padded to exactly twice their length by one block (choose_bits); the padding must hold one code
    # (DecodeCache.pad_code)
    one_block: bool = False
    stored_as: Optional[str] = None  # PackSpec.stored_as: weight is the integer view of a float tensor (HQQ view_as_float)
    stored: Optional[TensorStats] = None  # the stored float tensor's stats where stored_as is set (weight: its view)
    hqq_meta: dict = field(default_factory=dict)  # HQQ meta key (HQQ_META) -> its TensorStats, next to a W_q
    hqq_values: dict = field(default_factory=dict)  # HQQ meta key -> decoded value (detect_hqq)
    order: Optional[tuple] = None  # PackSpec.order: the slot order inside each container (AutoAWQ's AWQ_ORDER)
    codes: Optional[tuple] = None  # this module's code table, fixed by its format (compressed-tensors asymmetric)
    pad_code: Optional[int] = None  # PackSpec.pad_code where the format fixes it (compressed-tensors pads with 0)
    act_order: bool = False  # g_idx is a non-trivial act-order group index (LinearEntry.g_idx); trivial: ignored
    in_norm: Optional[TensorStats] = None  # ``<module>.rms_norm.weight``: an input RMSNorm inside the linear
    rope: bool = False  # q / k rows stored in interleaved-RoPE order (LinearEntry.rope_interleave; Meta-style names)
    group_sizes: tuple = ()  # the sizes a group scale's shape leaves open, prior first (_group_size_options): by loss
    # the -1 mask of a sign-bitmask pair (``weight``: the +1 mask; LinearEntry.neg_key, codec 'sign_masks')
    neg: Optional[TensorStats] = None

    @property
    def packed(self) -> bool:
        return self.weight.kind == "packed"

    def leaf(self, t: TensorStats) -> str:
        """t's name below this module's prefix (``weight_scale`` of ``<prefix>.weight_scale``), else its whole name."""
        return t.name[len(self.prefix) + 1:] if t.name.startswith(self.prefix + ".") else t.name

    def where(self) -> str:
        return f"{self.weight.file}: tensor {self.weight.name!r}"


@dataclass
class Finding:
    what: str
    decision: str
    evidence: str
    confidence: str  # "high" | "medium" | "low" | "n/a"


IN_NORM_SUFFIX = ".rms_norm.weight"  # transformers' BitLinear(use_rms_norm): the input RMSNorm inside a linear


def map_keys(stats: dict[str, TensorStats], cfg: ModelConfig) -> tuple[list[Module], dict[str, str]]:
    groups: dict[str, list[TensorStats]] = {}
    roles: dict[str, tuple] = {}
    unknown = []
    in_norms: dict[str, TensorStats] = {}  # linear prefix -> its input RMSNorm weight
    for name, st in stats.items():
        if derived_buffer(name):  # RoPE inv_freq: computed from config.json, skipped like transformers
            continue
        if name.endswith(IN_NORM_SUFFIX):
            layer, role, prefix = parse_key(name[: -len(IN_NORM_SUFFIX)] + ".weight")
            if role in LINEAR_PARTS:
                in_norms[prefix] = st
                continue
        layer, role, prefix = parse_key(name)
        if role is None:
            unknown.append(name)
            continue
        if layer is not None and layer >= cfg.num_layers:
            raise InspectError(f"{st.file}: tensor {name!r} belongs to layer {layer}, but config.json has "
                               f"num_hidden_layers={cfg.num_layers}")
        groups.setdefault(prefix, []).append(st)
        roles[prefix] = (layer, role)
    if unknown:
        raise InspectError(f"{len(unknown)} checkpoint tensors match no known module name: {unknown[:6]}"
                           f"{' ...' if len(unknown) > 6 else ''} (extra keys; known module names: "
                           f"{sorted(set().union(*ALIASES.values()))})")
    shapes = cfg.linear_shapes()
    modules, floats = [], {}
    part_biases = _part_biases(groups, roles)
    for prefix, members in groups.items():
        layer, role = roles[prefix]
        if role in LINEAR_PARTS:
            modules.append(_linear_module(prefix, layer, role, members, cfg, shapes))
            continue
        if len(members) != 1:
            raise InspectError(f"{members[0].file}: {prefix!r} ({role}) has {len(members)} tensors "
                               f"{[m.name for m in members]}, expected one")
        st = members[0]
        if st.dtype in INT_DTYPES:
            raise InspectError(f"{st.file}: tensor {st.name!r} ({role}) is {st.dtype}, expected a float tensor")
        hf = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight"}.get(role) \
            or f"model.layers.{layer}.{FLOAT_HF[role]}"
        if hf in floats:
            raise InspectError(f"{st.file}: tensors {floats[hf]!r} and {st.name!r} both map to {hf}")
        floats[hf] = st.name
    for m in modules:
        for hf, b in part_biases.pop((m.layer, m.role), {}).items():
            if m.bias is not None:
                raise InspectError(f"{b.file}: module {m.prefix!r} ({m.role}) has a bias for its fused rows, "
                                   f"{m.bias.name!r}, and {b.name!r} for {hf}'s; expected one of the two (extra key)")
            m.part_bias[hf] = b
    for m in modules:
        m.in_norm = in_norms.pop(m.prefix, None)
        if m.in_norm is not None and (m.in_norm.dtype in INT_DTYPES or tuple(m.in_norm.shape) != (m.logical[1],)):
            raise InspectError(f"{m.in_norm.file}: tensor {m.in_norm.name!r} (the input RMSNorm of {m.prefix}) is "
                               f"{m.in_norm.dtype} {list(m.in_norm.shape)}, expected a float [{m.logical[1]}] "
                               f"(in_features)")
    for prefix, st in in_norms.items():
        raise InspectError(f"{st.file}: tensor {st.name!r} is an input RMSNorm weight (use_rms_norm) of {prefix!r}, "
                           f"which has no linear weight in the checkpoint (extra key)")
    # lm_head: a float one is a plain parameter
    for m in [m for m in modules if m.role == "lm_head"]:
        if m.weight.kind in ("float", "ternary_float") and m.scale is None:
            if m.in_norm is not None:
                raise InspectError(f"{m.in_norm.file}: tensor {m.in_norm.name!r} is an input RMSNorm of the float "
                                   f"lm_head {m.weight.name!r}; transformers normalizes the inputs of converted "
                                   f"(BitLinear) layers only (extra key)")
            floats["lm_head.weight"] = m.weight.name
            modules.remove(m)
    _check_complete(modules, floats, cfg)
    return modules, floats


#: companions of a linear weight that scale activations or a cache, not the weights (FP8 / compressed-tensors static
#: activation quantization, vLLM's kv-cache scales): refused by name, never read as the weights' scale
ACT_SCALE_LEAVES = frozenset({"input_scale", "output_scale", "input_scale_inv", "act_scale", "activation_scale",
                              "k_scale", "v_scale", "q_scale", "kv_scale", "input_global_scale"})
_SLOT_SAYS = {"scale": "scale", "zeros": "zero point", "g_idx": "g_idx", "shape_t": "weight_shape", "bias": "bias"}


#: leaf-name tokens of a sign-bitmask pair's two tensors (``<module>.weight_pos`` / ``.weight_neg``, ``.pos_mask`` /
#: ``.neg_mask``, ``.plus`` / ``.minus``)
SIGN_MASK_TOKENS = ({"pos", "positive", "plus"}, {"neg", "negative", "minus"})
#: dtypes a bitmask is stored in: one flag per element (bool / uint8 / int8) or eight per byte (uint8 / int8)
SIGN_MASK_DTYPES = ("BOOL", "U8", "I8")


def _sign_mask_pair(prefix, layer, role, mains: list, shapes) -> Optional[tuple[TensorStats, TensorStats]]:
    """(pos, neg) where a linear's two 2-D tensors are named as a +1 / -1 pair (``weight_pos`` / ``weight_neg``,
    ``pos_mask`` / ``neg_mask``, ``plus`` / ``minus``): a ternary weight stored as two sign bitmasks, W = pos - neg,
    one flag per element or bit-packed eight per byte (read as PackSpec codec 'sign_masks', the spec entry's
    ``neg_key`` naming the -1 mask; ``detect_sign_masks`` finds the layout).  None where the names are no such pair.
    A pair the spec cannot read - the two of different dtypes or shapes, or a dtype no mask is stored in - is an
    InspectError naming both tensors, what they look like and what is expected (rather than the generic 'candidate
    weight tensors' error, which does not say what the checkpoint is)."""
    import re

    def sign(t) -> Optional[int]:
        toks = set(re.split(r"[._\-]", t.name[len(prefix) + 1:].lower())) if t.name.startswith(prefix + ".") else set()
        hits = [i for i, names in enumerate(SIGN_MASK_TOKENS) if toks & names]
        return hits[0] if len(hits) == 1 else None

    a, b = mains
    if {sign(a), sign(b)} != {0, 1}:
        return None
    pos, neg = (a, b) if sign(a) == 0 else (b, a)
    if pos.dtype == neg.dtype and pos.dtype in SIGN_MASK_DTYPES and tuple(pos.shape) == tuple(neg.shape):
        return pos, neg
    sizes = [shapes[p if role == "lm_head" else f"model.layers.{layer}.{p}"] for p in LINEAR_PARTS[role]]
    n, k = sum(s[0] for s in sizes), sizes[0][1]
    raise InspectError(
        f"{pos.file}: module {prefix!r} ({role}) stores its weight as a sign-bitmask pair: {pos.name!r} (set where "
        f"w = +1) and {neg.name!r} (set where w = -1), {pos.dtype} {list(pos.shape)} and {neg.dtype} "
        f"{list(neg.shape)}, W = pos - neg; expected both masks of one dtype (bool / uint8 / int8) and one shape: "
        f"[{n}, {k}] one flag per weight, or [{n}, {-(-k // 8)}] / [{-(-n // 8)}, {k}] eight flags per byte (uint8 / "
        f"int8), or transposed, with no element set in both masks")


def _part_biases(groups: dict, roles: dict) -> dict:
    """{(layer, fused role): {hf module: its bias}}: the biases a writer kept per module beside a weight it fused on
    disk (``k_proj.bias`` next to ``qkv_proj.weight``), taken out of ``groups``.  Before, such a bias, alone under its
    module's name, was refused as a module with 'no 2-D weight tensor', though the spec (each fused part its own
    bias_key) and vLLM's loaders read it."""
    fused = {(roles[p][0], r) for p in groups for r in ("qkv", "gate_up") if roles[p][1] == r}
    out: dict = {}
    for prefix in list(groups):
        layer, role = roles[prefix]
        members = groups[prefix]
        if role in LINEAR_PARTS and len(LINEAR_PARTS[role]) == 1 and all(m.leaf == "bias" for m in members):
            owner = next((r for r in ("qkv", "gate_up") if (layer, r) in fused and
                          LINEAR_PARTS[role][0] in LINEAR_PARTS[r]), None)
            if owner is not None and len(members) == 1:
                out.setdefault((layer, owner), {})[f"model.layers.{layer}.{LINEAR_PARTS[role][0]}"] = members[0]
                del groups[prefix]
    return out


def _linear_module(prefix, layer, role, members, cfg: ModelConfig, shapes) -> Module:
    mains = [m for m in members if m.kind in ("packed", "ternary_float", "float") and len(m.shape) == 2]
    if not mains:
        stacked = [m for m in members if len(m.shape) == 3 and m.shape[0] == 2]
        if stacked:  # e.g. a +1 / -1 sign-mask pair stacked into one tensor: say what was seen, not just what is missing
            t = stacked[0]
            raise InspectError(f"{t.file}: module {prefix!r} ({role}): tensor {t.name!r} is {t.dtype} "
                               f"{list(t.shape)}, two matrices stacked in one tensor (a +1 / -1 sign-mask pair?), "
                               f"which is not read: expected one 2-D weight {prefix}.weight, or the two masks as 2-D "
                               f"tensors {prefix}.weight_pos / {prefix}.weight_neg (W = pos - neg)")
        raise InspectError(f"{members[0].file}: missing key: module {prefix!r} ({role}) has "
                           f"{[m.name for m in members]} but no 2-D weight tensor")
    pair = _sign_mask_pair(prefix, layer, role, mains, shapes) if len(mains) == 2 else None
    if len(mains) != 1 and pair is None:
        raise InspectError(f"{members[0].file}: module {prefix!r} ({role}) has {len(mains)} candidate weight "
                           f"tensors {[m.name for m in mains]}, expected exactly one 2-D weight")
    mod = Module(prefix, layer, role, mains[0]) if pair is None else Module(prefix, layer, role, pair[0], neg=pair[1])
    for m in members:
        if m is mod.weight or m is mod.neg:
            continue
        leaf = m.name.rsplit(".", 1)[-1]
        if mod.weight.name.endswith(".W_q") and leaf in HQQ_META and m.name == f"{prefix}.{leaf}":
            mod.hqq_meta[leaf] = m  # read and checked by detect_hqq; an error if the module is not HQQ-packed
            continue
        if leaf in ACT_SCALE_LEAVES:  # before the name test below: 'input_scale' is not the weights' scale
            raise InspectError(f"{m.file}: tensor {m.name!r} next to weight {mod.weight.name!r} is a static "
                               f"activation / cache scale ({leaf!r}: FP8 or compressed-tensors static activation "
                               f"quantization), not the weights' scale; static activation scales are not supported "
                               f"(the spec's activation quantization is none or BitNet's per-token int8, computed "
                               f"at run time)")
        slot = {"scale": "scale", "zero_point": "zeros", "index": "g_idx", "shape": "shape_t"}.get(m.kind)
        if slot is None and m.leaf == "bias":
            slot = "bias"
        if slot is None and m.dtype not in INT_DTYPES and m.numel <= mod.weight.numel // 8:
            slot = "scale"  # a small float companion of a packed weight is its scale
        if slot is not None and getattr(mod, slot) is not None:
            had = getattr(mod, slot)
            raise InspectError(f"{m.file}: module {prefix!r} has two tensors read as its {_SLOT_SAYS[slot]}: "
                               f"{had.name!r} ({had.dtype} {list(had.shape)}) and {m.name!r} ({m.dtype} "
                               f"{list(m.shape)}); expected one (one of them is an extra key)")
        if slot is None:
            raise InspectError(f"{m.file}: tensor {m.name!r} next to weight {mod.weight.name!r} is not a "
                               f"scale / zero point / g_idx / weight_shape / bias (extra key)")
        setattr(mod, slot, m)
    sizes = [shapes[p if role == "lm_head" else f"model.layers.{layer}.{p}"] for p in LINEAR_PARTS[role]]
    n0, mod.parts = 0, []
    for p, (n, k) in zip(LINEAR_PARTS[role], sizes):
        hf = p if role == "lm_head" else f"model.layers.{layer}.{p}"
        mod.parts.append((hf, (n0, n0 + n)))
        n0 += n
    mod.logical = (n0, sizes[0][1])
    return mod


def _check_complete(modules: list[Module], floats: dict, cfg: ModelConfig) -> None:
    have = {hf for m in modules for hf, _ in m.parts}
    need = [m for m in cfg.linear_shapes() if m != "lm_head"]
    if not cfg.tie_word_embeddings and "lm_head.weight" not in floats:
        need.append("lm_head")
    for hf in need:
        if hf == "lm_head" and hf not in have:
            raise InspectError(f"missing key: no checkpoint tensor for the lm_head (looked for names like "
                               f"{sorted(ALIASES['lm_head'])}): {UNTIED_HEAD_HINT}")
        if hf not in have:
            role = hf.rsplit(".", 1)[-1].replace("_proj", "")
            raise InspectError(f"missing key: no checkpoint tensor for module {hf!r} (config.json has "
                               f"{cfg.num_layers} layers; looked for names like {sorted(ALIASES.get(role, {role}))})")
    for hf in cfg.float_params():
        if hf not in floats:
            raise InspectError(f"missing key: no checkpoint tensor for parameter {hf!r}")


# ---------------------------------------------------------------------------------------
# structure: pack axis, transposition, logical shape, scale layout


def _bits(cfg: ModelConfig) -> int:
    return _config_bits(cfg) or 2


def _declared_bits(cfg: ModelConfig) -> set:
    """Every code width config.json's quantization block names (top-level bits / num_bits / nbits and
    each compressed-tensors config group's weights.num_bits); empty when it names none."""
    q = cfg.quantization or {}
    out = {int(b) for b in (q.get("bits"), q.get("num_bits"), q.get("nbits")) if b}
    for g in (q.get("config_groups") or {}).values():
        b = (g.get("weights") or {}).get("num_bits")
        if b:
            out.add(int(b))
    return out


def _config_bits(cfg: ModelConfig) -> Optional[int]:
    q = cfg.quantization or {}
    b = q.get("bits") or q.get("num_bits") or q.get("nbits")
    for g in (q.get("config_groups") or {}).values():
        b = b or (g.get("weights") or {}).get("num_bits")
    return int(b) if b else None


#: code widths tried for a packed integer weight: 2-bit (4 per byte), 4-bit nibbles (2 per byte),
#: and 8 = one value per 8-bit element (unpacked integer ternary / int8 weights)
BITS_TRIED = (2, 4, 8)


def bits_options(cbits: int) -> list[int]:
    return [b for b in BITS_TRIED if cbits % b == 0 and (b < 8 or cbits == 8)]


def choose_bits(modules: list[Module], cfg: ModelConfig, findings: list[Finding], one_block: Optional[bool] = None
                ) -> int:
    """Code width(s) from the ratio of stored to config.json shapes; sets every module's ``bits``
    and returns the model's main width.  One width when it can hold every packed tensor's logical
    matrix (the config's bits break ties); otherwise, when each packed tensor fits some width
    (mixed precision: e.g. 2-bit layers next to 4-bit or one-value-per-byte ones), each module gets
    its own: the only width that fits it, or among several the one that fits the most modules --
    unless config.json names exactly one width, which then holds for every tensor (one that does
    not fit it is named as a shape error rather than read at another width).
    Where the shapes cannot tell an unpadded packing from one at half the width whose rows are padded
    to one block (``_padded_width``: a model whose rows are all half a block long), config.json's bits
    decide, else ``one_block`` (True: the padded reading); None raises AmbiguousWidth, for inspect_dir to
    decode both."""
    packed = [m for m in modules if m.packed and m.weight.dtype in CONTAINER_OF]
    hint = _config_bits(cfg)
    if not packed:
        return _set_bits(modules, hint or 2)
    fits: dict[int, int] = {}
    unique: dict[int, int] = {}
    ok_of: dict[str, list[int]] = {}
    for m in packed:
        cbits = INT_DTYPES[m.weight.dtype]
        ok = [b for b in bits_options(cbits) + _stream_bits(m, cbits) + _byte_codes_in_words(cbits)
              if layout_options(tuple(m.weight.shape), m.logical, cbits, b, _part_rows(m))]
        ok_of[m.prefix] = ok
        for b in ok:
            fits[b] = fits.get(b, 0) + 1
            if len(ok) == 1:
                unique[b] = unique.get(b, 0) + 1
    if not fits:
        return _set_bits(modules, hint or 2)
    both = _padded_width(packed, fits)
    declared = _declared_bits(cfg)
    if both is not None and not declared and one_block is None:
        wide, half = both
        m = packed[0]
        n, k = m.logical
        raise AmbiguousWidth(
            f"{m.where()}: shape {list(m.weight.shape)} {m.weight.dtype} holds the logical {n}x{k} matrix as "
            f"{wide}-bit codes unpadded and as {half}-bit codes with each row padded to one block (twice its "
            f"length), and so do all {len(packed)} packed tensors", wide, half)
    if both is not None and (declared == {both[1]} if declared else one_block):
        wide, half = both
        return _take_padded(modules, packed, half, findings, bool(declared),
                            f"all {len(packed)} packed tensors fit {half}-bit codes with each row padded to exactly "
                            f"twice its length (one block: rows shorter than the packing block) and {wide}-bit codes "
                            f"unpadded; read at {half} bits")
    one = _one_block_width(packed, fits, cfg)
    if one is not None:
        n_strict = fits.get(one, 0)
        return _take_padded(modules, packed, one, findings, bool(hint),
                            f"no width fits all {len(packed)} packed tensors as stored "
                            f"({ {f'{b}-bit': n for b, n in fits.items()} }); {one}-bit codes fit {n_strict} and the "
                            f"other {len(packed) - n_strict} with each row padded to exactly twice its length (one "
                            f"block: rows shorter than the packing block) - also the size of an unpadded {2 * one}-bit "
                            f"packing of them, which would leave the rest without a width")
    if GPTQ_STREAM_BITS in fits and not _declared_bits(cfg):
        _refuse_ambiguous_stream(packed, ok_of)

    def rank(b):
        return (fits[b], unique.get(b, 0), b == hint, b == 2, -b)

    best = max(fits, key=rank)
    others = {b: n for b, n in fits.items() if b != best}
    fitting = sum(bool(ok) for ok in ok_of.values())
    declared = _declared_bits(cfg)
    if fits[best] < fitting and len(declared) == 1:
        # config.json names one width: a tensor that fits only another is a damaged tensor, not a
        # mixed-precision module; the declared width's shape error names it (_infer_plain)
        return _set_bits(modules, declared.pop())
    if fits[best] < fitting:  # no one width for the tensors that fit some (one that fits none is named later)
        return _mixed_bits(modules, packed, ok_of, fits, rank, hint, findings)
    findings.append(Finding(
        "code width", f"{best}-bit codes",
        f"stored/logical shape ratios fit {fits[best]} of {len(packed)} packed tensors at {best} bits"
        + (f" (other widths: { {f'{b}-bit': n for b, n in others.items()} })" if others else "")
        + (f"; config.json says {hint} bits" if hint else ""),
        "high" if fits[best] == len(packed) and not any(n == fits[best] for n in others.values()) else "medium"))
    return _set_bits(modules, best)


def _take_padded(modules: list[Module], packed: list[Module], bits: int, findings: list[Finding], config_says: bool,
                 why: str) -> int:
    """choose_bits' padded reading: every packed module at ``bits`` with rows padded to one block, and its finding
    (``why``; high confidence where config.json's bits say the same)."""
    findings.append(Finding("code width", f"{bits}-bit codes, rows padded to one block",
                            why + (f"; config.json says {bits} bits" if config_says else ""),
                            "high (config)" if config_says else "medium"))
    for m in packed:
        m.one_block = True
    return _set_bits(modules, bits)


def _one_block_width(packed: list[Module], fits: dict, cfg: ModelConfig) -> Optional[int]:
    """The one width that fits every packed byte tensor once rows shorter than a block may be padded to one block
    (layout_options one_block), where no width fits them all as stored and config.json names none or that one;
    else None.  A model of short rows (hidden 64) in a 128-input-block layout stores those rows as an unpadded
    packing at twice the width would, while its longer rows fit only the real width: a vote without the padded
    reading splits the model across two widths, and the decode fails or reads codes at the wrong width (with
    config.json's bits 2, the short rows were refused as not holding 2-bit codes)."""
    if any(n == len(packed) for n in fits.values()):
        return None
    if any(INT_DTYPES[m.weight.dtype] != 8 for m in packed):
        return None
    full = [b for b in bits_options(8) if all(
        layout_options(tuple(m.weight.shape), m.logical, 8, b, _part_rows(m), one_block=True) for m in packed)]
    declared = _declared_bits(cfg)
    return full[0] if len(full) == 1 and declared <= set(full) else None


def _padded_width(packed: list[Module], fits: dict) -> Optional[tuple[int, int]]:
    """(wide, half) where one packed width fits every packed byte tensor as stored and half of it fits every one
    only with rows padded to one block (layout_options one_block); else None.  A model whose every row is half a
    block long (hidden and intermediate 64 in bitnet.cpp I2_S's 128-input blocks, 128 in 256-input ones) stores
    each row of 2-bit codes in exactly the bytes an unpadded 4-bit packing of it takes: the shapes cannot tell the
    two apart (config.json's bits can), and the vote alone read such an I2_S model as 4-bit codes."""
    if any(INT_DTYPES[m.weight.dtype] != 8 for m in packed):
        return None
    for wide in (b for b, n in fits.items() if n == len(packed) and b < 8):
        half = wide // 2
        if half in bits_options(8) and fits.get(half, 0) < len(packed) and all(
                layout_options(tuple(m.weight.shape), m.logical, 8, half, _part_rows(m), one_block=True)
                for m in packed):
            return wide, half
    return None


#: AutoGPTQ's bit-stream width (``QuantLinear.pack``'s bits == 3 branch: 32 codes in three int32, codes straddling
#: words; ``PackSpec`` codec 'bitstream'), tried for int32 ``qweight`` tensors (the name AutoGPTQ / GPTQModel write)
GPTQ_STREAM_BITS = 3


def _byte_codes_in_words(cbits: int) -> list[int]:
    """[8] for a container wider than a byte: 8-bit codes tiled in it (GPTQ int8: four per int32 qweight word,
    K/4 rows - a row count no 2- or 4-bit layout of the same matrix has), tried after the narrower widths."""
    return [8] if cbits > 8 else []


def _stream_bits(m: Module, cbits: int) -> list[int]:
    """[3] for an int32 GPTQ ``qweight`` (whose 3-bit codes are a bit stream), else []."""
    return [GPTQ_STREAM_BITS] if cbits == 32 and m.weight.name.endswith(".qweight") else []


def _refuse_ambiguous_stream(packed: list[Module], ok_of: dict) -> None:
    """Without a width in config.json, a qweight whose rows fit both AutoGPTQ's 3-bit stream (ceil(K/32)*3 rows) and
    another width (K/8 4-bit rows coincide for small K not a multiple of 32, e.g. K = 48: 6 rows either way) has no
    width the shapes can tell: the config's ``bits`` must say it."""
    for m in packed:
        ok = ok_of[m.prefix]
        if GPTQ_STREAM_BITS in ok and len(ok) > 1:
            n, k = m.logical
            raise InspectError(
                f"{m.where()}: shape {list(m.weight.shape)} {m.weight.dtype} holds the logical {n}x{k} matrix at "
                f"{' and at '.join(f'{b}-bit' for b in ok)} codes (AutoGPTQ 3-bit: int32 [ceil(K/32)*3, N] = "
                f"[{-(-k // 32) * 3}, {n}]; 4-bit [K/8, N] = [{-(-k // 8)}, {n}]), and config.json names no width: "
                f"add the quantization_config AutoGPTQ / GPTQModel wrote (quant_method 'gptq' with bits "
                f"{' or '.join(str(b) for b in ok)})")


def _check_stream_k(modules: list[Module], findings: list[Finding]) -> None:
    """3-bit GPTQ modules (codec 'bitstream'): K a multiple of 32, as AutoGPTQ's ``QuantLinear.pack`` requires
    (it walks K in periods of 32 inputs = 3 int32 rows and writes no padding)."""
    mods = [m for m in modules if m.packed and m.codec == "bitstream"]
    for m in mods:
        n, k = m.logical
        if k % 32:
            raise InspectError(f"{m.where()}: K = {k} inputs (config.json, {[p for p, _ in m.parts]}) is not a "
                               f"multiple of 32, but a 3-bit GPTQ qweight is AutoGPTQ's bit stream of whole 32-input "
                               f"periods (QuantLinear.pack: K / 32 * 3 int32 rows): expected K % 32 == 0")
    if mods:
        findings.append(Finding("GPTQ 3-bit layout", "bit stream along K (PackSpec codec 'bitstream')",
                                f"{len(mods)} int32 qweights hold 32 codes of 32 consecutive inputs in 3 words, codes "
                                f"straddling words (AutoGPTQ QuantLinear.pack, bits 3): K / 32 * 3 rows; qzeros the "
                                f"same along N", "high (structure)"))


#: codec 'base3' (reference.formats): five trits per uint8 byte, the digits of sum t_i * 3^i (3^5 = 243 <= 256)
BASE3_V = 5
BASE3_BYTES = 243  # the bytes that hold five trits: 0 .. 242


def base3_layouts(stored: tuple, logical: tuple, parts: tuple = ()) -> list[tuple[bool, int]]:
    """(transposed, pack_axis) pairs under which a uint8 ``stored`` holds ``logical`` as five trits per byte
    (interleaved: ceil(L / 5) bytes along the pack axis of length L; ``parts``: the row counts of a fused tensor whose
    parts may each have been packed on their own along axis 0)."""
    out = []
    for transposed, axis, length, packed in _orientations(stored, logical):
        lens = {-(-length // BASE3_V)}
        if axis == 0 and len(parts) > 1:
            lens.add(sum(-(-n // BASE3_V) for n in parts))
        if packed in lens:
            out.append((transposed, axis))
    return out


def _detect_base3(modules: list[Module], ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """Plain base-3 packing (``PackSpec`` codec 'base3'): uint8 weights [N, ceil(K/5)] (or [ceil(N/5), K], or either
    transposed) that no 2-, 4- or 8-bit layout of the logical matrix fits.  The model is read as base-3 where most
    packed weights fit only five trits a byte; then every packed weight must be uint8 of a base-3 shape and every
    byte < 243 (a byte >= 243 holds no five trits), else an InspectError names the file, the tensor and, for a bad
    byte, its position and value.  Sets ``bits`` 2 and ``codec`` 'base3' on the packed modules (their pack axis /
    transposition: ``_infer_plain``); the digit order (``bit_order`` lsb / msb), the trit -> value table and the
    scale op are then searched like any layout's (code counts, padding, loss)."""
    packed = [m for m in modules if m.packed]
    fit = {m.prefix: base3_layouts(tuple(m.weight.shape), m.logical, _part_rows(m)) for m in packed
           if m.weight.dtype == "U8" and len(m.weight.shape) == 2}
    only = [m for m in packed if fit.get(m.prefix) and not any(
        layout_options(tuple(m.weight.shape), m.logical, 8, b, _part_rows(m)) for b in bits_options(8))]
    if not packed or len(only) <= len(packed) / 2:
        return False
    for m in packed:
        n, k = m.logical
        if not fit.get(m.prefix):
            raise InspectError(f"{m.where()}: shape {list(m.weight.shape)} {m.weight.dtype}; {len(only)} other packed "
                               f"weights of this model hold five trits per byte (base-3), which would store the "
                               f"logical {n}x{k} matrix of {[p for p, _ in m.parts]} as uint8 [{n}, "
                               f"{-(-k // BASE3_V)}] (or [{-(-n // BASE3_V)}, {k}], or transposed)")
        if m.weight.absmax < BASE3_BYTES:  # the scan's largest byte: no byte without five digits, nothing to read
            continue
        raw = ckpt.get(m.weight.name)  # (a corrupt one: read to name the first such byte's position)
        bad = raw >= BASE3_BYTES
        if bool(bad.any()):
            r, c = (int(i) for i in bad.nonzero()[0])
            raise InspectError(f"{m.where()}: byte {int(raw[r, c])} at [{r}, {c}] ({int(bad.sum())} of {raw.numel()} "
                               f"bytes >= 243), but the model's packed weights hold five base-3 digits per byte "
                               f"(sum t_i * 3^i <= 242, {len(only)} of {len(packed)} tensors fit no 2 / 4 / 8-bit "
                               f"layout): expected every byte < 243 (corrupt weights)")
    for m in packed:
        m.bits, m.codec = 2, "base3"
    findings.append(Finding(
        "code width", "base-3: five trits per uint8 byte (PackSpec codec 'base3')",
        f"{len(only)} of {len(packed)} packed uint8 weights fit [N, ceil(K/5)] (or the N-axis / transposed variants) "
        f"and no 2 / 4 / 8-bit layout; every byte < 243 (3^5: five base-3 digits)", "high (structure)"))
    return True


def _base3_hist(m: Module, ckpt: Checkpoint) -> None:
    """Trit counts of a base-3 weight (``code_hist``, code 3 never): its bytes that hold five logical elements, i.e.
    all but the last partial byte of each line along the pack axis - which digits of that byte are padding depends
    on the digit order, which is not known yet; the counts of a whole byte's digits do not."""
    n, k = m.logical
    raw = ckpt.get(m.weight.name).to(torch.int64)
    p = raw.t() if m.transposed else raw
    if m.pack_axis == 0:
        p = p.t()
    length = (n, k)[m.pack_axis]
    if length % BASE3_V:
        p = p[:, :-1]
    digits = torch.stack([(p // 3 ** i) % 3 for i in range(BASE3_V)]).reshape(-1)
    m.weight.slot_hist = [torch.bincount(digits, minlength=4).tolist()]
    m.weight.field_hist[2] = list(m.weight.slot_hist[0])


def sign_mask_layouts(stored: tuple, logical: tuple, dtype: str, parts: tuple = ()) -> list[tuple[int, bool, int]]:
    """(bits, transposed, pack_axis) under which one mask of a sign-bitmask pair (safetensors ``dtype``) holds the
    ``logical`` matrix: bits 8, one flag per element ([N, K] or [K, N]), else bits 1, eight consecutive flags per
    byte along the pack axis (uint8 / int8 only: ceil(L / 8) bytes for an axis of L; ``parts``: the row counts of a
    fused tensor whose parts may each have been packed on their own along axis 0)."""
    out = []
    for transposed, axis, length, packed in _orientations(stored, logical):
        if packed == length and (8, transposed, 1) not in out:
            out.append((8, transposed, 1))
        lens = {-(-length // 8)} | ({sum(-(-n // 8) for n in parts)} if axis == 0 and len(parts) > 1 else set())
        if dtype != "BOOL" and packed in lens and packed != length:
            out.append((1, transposed, axis))
    return out


def _sign_mask_bytes(modules: list[Module]) -> None:
    """A sign-bitmask pair stored as bool: both masks read as their uint8 bytes (flags 0 / 1, the same bits) from here
    on, a packed weight of one flag per byte (``stored`` keeps the bool tensor's stats for the findings). The byte
    statistics come from the scan's (``bool_as_u8_stats``): the masks are not read again."""
    from .scan import bool_as_u8_stats

    for m in modules:
        if m.neg is not None and m.weight.dtype == "BOOL":
            m.stored = m.weight
            m.weight, m.neg = (bool_as_u8_stats(st) for st in (m.weight, m.neg))


def _mask_byte_range(m: Module, r: int, c: int) -> str:
    """The logical elements byte [r, c] of a bit-packed mask of ``m`` holds (its eight flags along the pack axis)."""
    a, b = (c, r) if m.transposed else (r, c)
    n, k = m.logical
    if m.pack_axis == 1:
        return f"row {a}, columns {8 * b}..{min(8 * b + 7, k - 1)}"
    return f"rows {8 * a}..{min(8 * a + 7, n - 1)}, column {b}"


def _check_sign_mask_values(m: Module, ckpt: Checkpoint) -> None:
    """A pair's stored flags, before any decode (its errors name the file, both tensors and the position; a decode
    that failed in the search would be one truncated note among the candidates'): a one-flag-per-element mask holds
    only 0 / 1 (read only where the scan's largest magnitude, ``TensorStats.absmax``, or its values show another:
    an int8 -1), and no weight is flagged in both masks - a byte-wise AND of the two, which needs no bit order."""
    for st in (m.weight, m.neg):
        if m.bits == 8 and (st.absmax > 1 or any(v not in (0, 1) for v in st.unique)):
            raw = ckpt.get(st.name)
            bad = (raw != 0) & (raw != 1)
            r, c = (int(i) for i in bad.nonzero()[0])
            raise InspectError(f"{st.file}: tensor {st.name!r}: value {int(raw[r, c])} at [{r}, {c}] "
                               f"({int(bad.sum())} such values), but it is one mask of a sign-bitmask pair with "
                               f"one flag per weight (W = pos - neg, {m.weight.name!r} / {m.neg.name!r}): expected "
                               f"every value 0 or 1")
    pos, neg = (ckpt.get(st.name).view(torch.uint8) for st in (m.weight, m.neg))  # (bool, int8: the same bytes)
    both = pos & neg
    hit = both != 0
    if not bool(hit.any()):
        return
    r, c = (int(i) for i in hit.nonzero()[0])
    if m.bits == 8:
        lr, lc = (c, r) if m.transposed else (r, c)
        at = f"element [{r}, {c}] (logical row {lr}, column {lc}) is set in both masks ({int(hit.sum())} such elements)"
    else:
        at = (f"byte [{r}, {c}] holds flags (bits 0b{int(both[r, c]):08b}) set in both masks, for weights of "
              f"{_mask_byte_range(m, r, c)} ({int(hit.sum())} such bytes)")
    raise InspectError(f"{m.weight.file}: sign-bitmask pair {m.weight.name!r} (+1) / {m.neg.name!r} (-1) of "
                       f"module {m.prefix!r}: {at}; a pair holds at most one sign per weight (W = pos - neg): "
                       f"expected no element set in both masks (corrupt, or not a +1 / -1 pair)")


def detect_sign_masks(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """Sign-bitmask pairs (``_sign_mask_pair``: two masks per linear, W = pos - neg; PackSpec codec 'sign_masks').
    The layout comes from the stored shape against config.json's logical [N, K] (``sign_mask_layouts``: one flag per
    element, or eight per byte along N or K, transposed or not; square matrices follow the others' vote); the bit
    order of bit-packed masks is what the search decides, from the padding of an axis that is no multiple of 8 (only
    the right order leaves zero flags there: ``DecodeCache.fingerprint``), the loss on text, else the prior
    (``np.packbits``' msb first).  The code table is fixed (flags), the scales are read like any packed weight's.
    A model of pairs holds no other packed weight (named, with what is expected), and a pair whose shape fits no
    layout, a flag other than 0 / 1 or a weight flagged in both masks is an InspectError naming file and tensors."""
    pairs = [m for m in modules if m.neg is not None]
    if not pairs:
        return False
    for m in modules:
        if m.packed and m.neg is None:
            n, k = m.logical
            raise InspectError(f"{m.where()}: {m.weight.dtype} {list(m.weight.shape)}, one packed weight, but "
                               f"{len(pairs)} other linears of this model store theirs as sign-bitmask pairs (e.g. "
                               f"{pairs[0].weight.name!r} / {pairs[0].neg.name!r}): expected a +1 / -1 pair "
                               f"{m.prefix}.weight_pos / .weight_neg of the logical {n}x{k} matrix here too")
    votes: dict[tuple, int] = {}
    opts_of = {}
    for m in pairs:
        dt, (n, k) = (m.stored or m.weight).dtype, m.logical
        opts = sign_mask_layouts(tuple(m.weight.shape), m.logical, dt, _part_rows(m))
        if not opts:
            raise InspectError(
                f"{m.where()}: sign-bitmask pair {m.weight.name!r} / {m.neg.name!r}, {dt} {list(m.weight.shape)} "
                f"each, fits no layout of the logical {n}x{k} matrix that config.json implies for "
                f"{[p for p, _ in m.parts]}: expected [{n}, {k}] (one flag per weight; bool / uint8 / int8), "
                f"[{n}, {-(-k // 8)}] or [{-(-n // 8)}, {k}] (eight flags per byte; uint8 / int8), or transposed")
        opts = [o for o in opts if o[0] == 8] or opts  # (a one-element axis fits both: one flag per element)
        opts_of[m.prefix] = opts
        if len(opts) == 1:
            votes[opts[0]] = votes.get(opts[0], 0) + 1
    for m in pairs:
        m.bits, m.transposed, m.pack_axis = max(opts_of[m.prefix], key=lambda o: (votes.get(o, 0), o[1:] == (False, 1)))
        m.codec, m.pad_code = "sign_masks", 0
        m.codes = SIGN_FLAGS_BYTE if m.bits == 8 else SIGN_FLAGS_BIT
        _check_sign_mask_values(m, ckpt)
    hint = _config_group_size(cfg)
    for m in pairs:
        _scale_layout(m, ckpt, hint)
    if hint is None:
        _group_size_consensus(modules, findings)
    how = {8: "one flag per weight", 1: "eight flags per byte"}
    ex = pairs[0]
    findings.append(Finding(
        "code width", "sign-bitmask pairs: a +1 and a -1 mask per linear, W = pos - neg (PackSpec codec "
        f"'sign_masks', {' and '.join(how[b] for b in sorted({m.bits for m in pairs}, reverse=True))})",
        f"{len(pairs)} linears store two tensors named as a +1 / -1 pair, "
        f"{sorted({(m.stored or m.weight).dtype for m in pairs})} (e.g. {ex.weight.name!r} / {ex.neg.name!r}, "
        f"{list(ex.weight.shape)} each for the logical {ex.logical[0]}x{ex.logical[1]} matrix: {how[ex.bits]}"
        + (f" along axis {ex.pack_axis}" if ex.bits == 1 else "") + (", stored transposed" if ex.transposed else "")
        + f"); {sum(m.bits == 1 for m in pairs)} bit-packed (bit order: the padding, the loss, else np.packbits' "
        f"msb first); no weight is flagged in both masks", "high (structure)"))
    return True


def _set_bits(modules: list[Module], bits: int) -> int:
    for m in modules:
        m.bits = bits
    return bits


def _mixed_bits(modules, packed, ok_of, fits, rank, hint, findings) -> int:
    """Mixed code widths: each packed module its own width (see ``choose_bits``); one finding for
    the decision and one per width listing its modules with their stored / logical shapes."""
    bad = [m for m in packed if not ok_of[m.prefix]]  # fit no width: named by _infer_plain's shape error
    packed = [m for m in packed if ok_of[m.prefix]]
    for m in packed:
        m.bits = max(ok_of[m.prefix], key=rank)
    count: dict[int, int] = {}
    for m in packed:
        count[m.bits] = count.get(m.bits, 0) + 1
    main = max(count, key=lambda b: (count[b], b == hint, -b))
    chosen = {id(m) for m in packed}
    for m in modules:
        if id(m) not in chosen:
            m.bits = main
    if bad:
        return main
    amb = [m for m in packed if len(ok_of[m.prefix]) > 1]
    findings.append(Finding(
        "code width", "mixed: " + ", ".join(f"{b}-bit for {count[b]} modules" for b in sorted(count)),
        f"no single width fits every packed tensor (of {len(packed)}: "
        + ", ".join(f"{b}-bit fits {fits[b]}" for b in sorted(fits))
        + "); each module takes the width its stored/logical shape ratio allows"
        + (f"; {len(amb)} fit several widths and take the most common one" if amb else "")
        + (f"; config.json says {hint} bits" if hint else ""),
        "high" if not amb else "medium"))
    for b in sorted(count):
        group = [m for m in packed if m.bits == b]
        shown = [f"{m.prefix} {m.weight.dtype} {list(m.weight.shape)} = {m.logical[0]}x{m.logical[1]}"
                 + ("" if len(ok_of[m.prefix]) == 1 else f" (also fits {[o for o in ok_of[m.prefix] if o != b]})")
                 for m in group]
        findings.append(Finding(
            f"code width: {b}-bit modules", f"{len(group)} modules",
            "; ".join(shown[:16]) + (f"; ... {len(shown) - 16} more" if len(shown) > 16 else ""),
            "high" if all(len(ok_of[m.prefix]) == 1 for m in group) else "medium"))
    return main


def layout_options(stored: tuple, logical: tuple, cbits: int, bits: int, parts: tuple = (), one_block: bool = False
                   ) -> list[tuple[bool, int]]:
    """(transposed, pack_axis) pairs under which ``stored`` can hold ``logical``.  ``parts``: the row
    counts of a fused tensor, whose parts may each have been packed (and padded) on their own along
    axis 0 (PackSpec.segments).  ``one_block``: also an axis padded to exactly twice its length by one
    block (a 64-input row in one 128-input block: bitnet.cpp I2_S of a hidden-64 model) - the size of an
    unpadded packing at twice the width, so choose_bits asks for it only where the shapes leave the width
    open (``_one_block_width``, ``_padded_width``)."""
    v = cbits // bits
    out = []
    for transposed, axis, length, packed in _orientations(stored, logical):
        if cbits % bits:  # a bit stream (AutoGPTQ 3-bit): whole periods of lcm(bits, cbits) bits, nothing else
            per, conts = math.lcm(bits, cbits) // bits, math.lcm(bits, cbits) // cbits
            if packed == -(-length // per) * conts:
                out.append((transposed, axis))
            continue
        lens = {-(-length // v)} | {-(-length // blk) * (blk // v) for blk in BLOCKS if blk % v == 0 and blk > v}
        if axis == 0 and len(parts) > 1:
            lens.add(sum(-(-n // v) for n in parts))
        # a layout that pads the axis to twice its length or more is not one (a block longer than
        # the axis would let 2-bit codes "fit" an unpacked int8 matrix) - but for one_block's exactly 2x
        if packed in lens and (packed * v < 2 * length or packed == -(-length // v)
                               or (one_block and packed * v == 2 * length)):
            out.append((transposed, axis))
    return out


def _orientations(stored: tuple, logical: tuple):
    """(transposed, pack_axis, logical length of that axis, stored length of it) for each way a 2-D ``stored``
    shape can carry ``logical`` with the other axis unchanged (layout_options, base3_layouts)."""
    for transposed in (False, True):
        a, b = (stored[1], stored[0]) if transposed else stored
        for axis in (0, 1):
            if (a, b)[1 - axis] == logical[1 - axis]:
                yield transposed, axis, logical[axis], (a, b)[axis]


def _part_rows(m: Module) -> tuple:
    return tuple(r1 - r0 for _, (r0, r1) in m.parts)


TQ2_RECORD = TQ2_0_RECORD  # llama.cpp block_tq2_0: QK_K = 256 values in qs[64] + fp16 d
TQ2_SCALE_OFFSET = 64
TQ2_SCALE_KW = dict(granularity="block", group_size=256, record_bytes=66, byte_offset=TQ2_SCALE_OFFSET,
                    dtype="float16")


def _tq2_width(k: int) -> int:
    return -(-k // TQ2_RECORD[0]) * TQ2_RECORD[1]


def _tq2_evidence(m: Module, ckpt: Checkpoint) -> dict:
    """In-block fp16 d of every 66-byte block and the 2-bit code histogram of the 64 code bytes."""
    n, k = m.logical
    rec = ckpt.get(m.weight.name).reshape(n, -1, TQ2_RECORD[1])
    d = rec[:, :, TQ2_SCALE_OFFSET:TQ2_SCALE_OFFSET + 2].clone(memory_format=torch.contiguous_format)
    d = d.view(torch.float16).reshape(n, -1).float()
    finite = torch.isfinite(d)
    codes = rec[:, :, :TQ2_SCALE_OFFSET].to(torch.int64)
    slot = [torch.bincount(((codes >> (2 * s)) & 3).reshape(-1), minlength=4).tolist() for s in range(4)]
    ok = d[finite].abs()
    return dict(d=d, nonfinite=int((~finite).sum()), positive=float((d > 0).float().mean()) if d.numel() else 0.0,
                median=float(ok.median()) if ok.numel() else float("nan"), slot_hist=slot)


def _tq2_plausible(ev: dict) -> bool:
    """fp16 block scales of a trained ternary linear: all finite, mostly positive, not absurd."""
    return ev["nonfinite"] == 0 and ev["positive"] >= 0.5 and 1e-8 < ev["median"] < 1e4


def detect_tq2_0(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """llama.cpp TQ2_0 stored in safetensors: uint8 [N, ceil(K/256) * 66] weights with no scale
    tensor, whose last 2 bytes per 66-byte block decode as plausible fp16 scales.  On a match every
    packed module gets the TQ2_0 record structure (2-bit codes, axis 1, in-block scale) and its
    code histogram is recomputed over the 64 code bytes of each block only; lanes, bit order and
    code table are then searched like any other layout.  A model that is TQ2_0 but has a tensor of
    the wrong width or with NaN/Inf block scales fails here, naming the tensor."""
    packed = [m for m in modules if m.packed]
    fit = [m for m in packed if m.weight.dtype == "U8" and m.scale is None and m.zeros is None
           and len(m.weight.shape) == 2 and m.weight.shape[0] == m.logical[0]
           and m.weight.shape[1] == _tq2_width(m.logical[1])]
    if not fit:
        return False
    ev = {m.prefix: _tq2_evidence(m, ckpt) for m in fit}
    like = [m for m in fit if _tq2_plausible(ev[m.prefix])]
    plain = [m for m in fit if any(layout_options(tuple(m.weight.shape), m.logical, 8, b) for b in bits_options(8))]
    if len(like) < len(packed) / 2 and (plain or len(fit) < len(packed) / 2):
        return False  # a plain packing that happens to have this width, or too few TQ2_0-shaped tensors
    for m in packed:  # this is a TQ2_0 model: every packed weight must be one
        n, k = m.logical
        w = _tq2_width(k)
        if m not in fit:
            width = m.weight.shape[-1] if m.weight.shape else None
            why = (f"width {width} is not a multiple of the 66-byte block" if width is not None and width % 66
                   else f"shape {list(m.weight.shape)} {m.weight.dtype}")
            raise InspectError(
                f"{m.where()}: {why}; llama.cpp TQ2_0 (like {len(like)} other weights of this model) stores the "
                f"logical {n}x{k} matrix of {[p for p, _ in m.parts]} as uint8 [{n}, {w}] (ceil({k}/256) blocks "
                f"of 66 bytes, no separate scale tensor)")
        e = ev[m.prefix]
        if e["nonfinite"]:
            row, blk = (int(i) for i in (~torch.isfinite(e["d"])).nonzero()[0])
            raise InspectError(
                f"{m.where()}: in-block fp16 scale d (bytes 64..65 of each 66-byte TQ2_0 block) is "
                f"{float(e['d'][row, blk])} in {e['nonfinite']} of {e['d'].numel()} blocks, first at row {row} "
                f"block {blk}; expected finite block scales")
        if not _tq2_plausible(e):
            raise InspectError(
                f"{m.where()}: in-block fp16 scales are implausible for TQ2_0 (median |d| {e['median']:.3g}, "
                f"{e['positive']:.0%} positive); expected finite, mostly positive scales of a trained linear")
    c3 = sum(e["slot_hist"][s][3] for e in ev.values() for s in range(4))
    fields = sum(sum(e["slot_hist"][s]) for e in ev.values() for s in range(4))
    for m in modules:
        m.bits = 2
        if not m.packed:
            continue
        m.record, m.pack_axis, m.transposed = TQ2_RECORD, 1, False
        m.weight.slot_hist = ev[m.prefix]["slot_hist"]  # code bytes only: the fp16 d bytes are not codes
        m.weight.field_hist = {2: [sum(h[c] for h in m.weight.slot_hist) for c in range(4)]}
        m.scale_kw = [dict(TQ2_SCALE_KW)] * len(m.parts)
    meds = sorted(e["median"] for e in ev.values())
    findings.append(Finding(
        "block structure", "llama.cpp TQ2_0: 66-byte blocks of 256 inputs (qs[64] + in-block fp16 d, multiply)",
        f"all {len(packed)} packed weights are uint8 [N, ceil(K/256)*66] with no scale tensor; bytes 64-65 of every "
        f"block decode as finite fp16 scales (median |d| {meds[0]:.3g}..{meds[-1]:.3g} per tensor, "
        f"at least {min(e['positive'] for e in ev.values()):.0%} positive per tensor); code 3 in {c3 / max(1, fields):.2%} of the "
        f"code fields", "high"))
    return True


#: llama.cpp TQ1_0 (reference.formats.TQ1_0): 54-byte blocks, the fp16 d at bytes 52-53
TQ1_SCALE_KW = dict(granularity="block", group_size=256, record_bytes=54, byte_offset=52, dtype="float16")
#: the bytes quantize_row_tq1_0_ref can write: ceil(v * 256 / 243) for the 243 values v of five base-3 digits
TQ1_0_BYTES = frozenset((v * 256 + 242) // 243 for v in range(243))


def detect_tq1_0(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """llama.cpp TQ1_0 stored in safetensors: uint8 [N, ceil(K/256) * 54] weights with no scale tensor, whose
    bytes 52-53 of every 54-byte block decode as plausible fp16 scales and whose 52 code bytes are all bytes
    TQ1_0's quantizer writes (243 of the 256).  The layout is the format's own (base-3 digits, reference.formats
    TQ1_0: nothing to search); the code table is trit - 1.  A model that is TQ1_0 but has a tensor of the wrong
    width, a byte TQ1_0 never writes or NaN/Inf block scales fails here, naming the tensor."""
    from .formats import TQ1_0, record_scales

    packed = [m for m in modules if m.packed]
    width = lambda k: -(-k // 256) * 54  # noqa: E731
    fit = [m for m in packed if m.weight.dtype == "U8" and m.scale is None and m.zeros is None
           and len(m.weight.shape) == 2 and m.weight.shape[0] == m.logical[0] and m.weight.shape[1] == width(m.logical[1])]
    if not fit or len(fit) < len(packed) / 2:
        return False
    valid = torch.zeros(256, dtype=torch.bool)
    valid[list(TQ1_0_BYTES)] = True
    ev = {}
    for m in fit:
        n, k = m.logical
        raw = ckpt.get(m.weight.name)
        codes = raw.reshape(n, -1, 54)[:, :, :52].reshape(-1).to(torch.int64)
        bad = int((~valid[codes]).sum())
        d = raw.reshape(n, -1, 54)[:, :, 52:54].clone(memory_format=torch.contiguous_format).view(torch.float16).float()
        ev[m.prefix] = (bad, codes[~valid[codes]][:1].tolist(), d)
    like = [m for m in fit if ev[m.prefix][0] == 0]
    plain = [m for m in fit if any(layout_options(tuple(m.weight.shape), m.logical, 8, b) for b in bits_options(8))]
    if len(like) < len(packed) / 2 and (plain or len(fit) < len(packed)):
        return False  # another packing that happens to have this width (else: TQ1_0 with corrupt bytes, said below)
    for m in packed:  # this is a TQ1_0 model: every packed weight must be one
        n, k = m.logical
        if m not in fit:
            raise InspectError(f"{m.where()}: shape {list(m.weight.shape)} {m.weight.dtype}; llama.cpp TQ1_0 (like "
                               f"{len(like)} other weights of this model) stores the logical {n}x{k} matrix of "
                               f"{[p for p, _ in m.parts]} as uint8 [{n}, {width(k)}] (ceil({k}/256) blocks of 54 bytes, "
                               f"no separate scale tensor)")
        bad, first, d = ev[m.prefix]
        if bad:
            raise InspectError(f"{m.where()}: {bad} code bytes (e.g. {first[0]}) that llama.cpp TQ1_0 never writes "
                               f"(its bytes are ceil(v * 256 / 243) of five base-3 digits): corrupt, or not TQ1_0")
        try:
            record_scales(ckpt.get(m.weight.name), ScaleSpec(key=m.weight.name, **TQ1_SCALE_KW), m.logical,
                          name=m.where())
        except FormatError as e:
            raise InspectError(str(e)) from None
    for m in modules:
        m.bits = 2
        if not m.packed:
            continue
        m.record, m.codec, m.pack_axis, m.transposed = TQ1_0.record, TQ1_0.codec, 1, False
        m.scale_kw = [dict(TQ1_SCALE_KW)] * len(m.parts)
    ds = torch.cat([ev[m.prefix][2].reshape(-1) for m in fit])
    findings.append(Finding(
        "block structure", "llama.cpp TQ1_0: 54-byte blocks of 256 inputs (qs[48] 5 trits / byte + qh[4] 4 trits / "
        "byte, base 3, + in-block fp16 d, multiply)",
        f"all {len(packed)} packed weights are uint8 [N, ceil(K/256)*54] with no scale tensor; every code byte is one "
        f"TQ1_0's quantizer writes (243 of 256 values); bytes 52-53 of every block decode as finite fp16 scales "
        f"(median |d| {float(ds.abs().median()):.3g}, {float((ds > 0).float().mean()):.0%} positive)", "high"))
    return True


#: HQQ meta keys: ``HQQLinear.state_dict_keys()`` (mobiusml/hqq hqq/core/quantize.py) less W_q / scale /
#: zero / bias, each with its ``_META_TYPE`` (how ``encode_safetensor_type`` stored it; see module docstring)
HQQ_META: dict[str, str] = {
    "nbits": "nbits", "group_size": "int", "shape": "size", "axis": "int", "packing": "str",
    "unpack_view_dtype": "dtype", "view_as_float": "bool", "quant_scale": "bool", "quant_zero": "bool",
    "compute_dtype": "dtype", "offload_meta": "bool", "encoded_state_dict": "bool", "stores_quant_config": "bool",
    "channel_wise": "bool", "optimize": "bool", "round_zero": "bool"}
#: HQQ's packings (Quantizer.bit_to_packing) -> Quantizer.unpack_view_dtype
HQQ_PACKINGS = {"8bit_u8": "torch.uint8", "4bit_u8": "torch.uint8", "3bit_32": "torch.int32",
                "2bit_u8": "torch.uint8", "1bit_u8": "torch.uint8"}
#: packing -> (code bits, safetensors dtype of W_q, codes per container: hqq/core/bitpack.py, each packing cuts
#: the group view along its axis 0 into that many chunks, chunk 0 in the highest field; 3bit_32 pads the rows to
#: a multiple of 10 and leaves bits 30-31 unused)
HQQ_BITPACK = {"8bit_u8": (8, "U8", 1), "4bit_u8": (4, "U8", 2), "3bit_32": (3, "I32", 10), "2bit_u8": (2, "U8", 4),
               "1bit_u8": (1, "U8", 8)}
#: Quantizer.bit_to_packing: nbits -> packing
HQQ_NBITS = {8: "8bit_u8", 6: "8bit_u8", 5: "8bit_u8", 4: "4bit_u8", 3: "3bit_32", 2: "2bit_u8", 1.58: "2bit_u8",
             1: "1bit_u8"}
#: meta values that must hold for the layouts this inspector reads (others are informational)
HQQ_REQUIRED = {"quant_scale": False, "quant_zero": False, "offload_meta": False,
                "channel_wise": True}
HQQ_WHY = {"quant_scale": "quantized scales are not serialised by HQQLinear.state_dict",
           "quant_zero": "quantized zero points are not serialised by HQQLinear.state_dict",
           "offload_meta": "offloaded meta (zero_scale) replaces scale / zero",
           "channel_wise": "channel_wise=False quantizes the whole tensor with one scale, not per group"}
HQQ_TORCH_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32", "torch.float64")
#: safetensors dtype of a view_as_float W_q (W_q.view(compute_dtype)) -> PackSpec.stored_as
HQQ_FLOAT_VIEWS = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


def _hqq_meta_values(m: Module, ckpt: Checkpoint) -> dict:
    """Decode the HQQ meta tensors of ``m`` as ``decode_safetensor_type`` does, and check each against HQQ's
    2-bit convention; an error names the file, the tensor and the expected value."""
    out = {}
    first = ("nbits", "packing", "unpack_view_dtype", "view_as_float", "channel_wise", "quant_scale", "quant_zero",
             "offload_meta", "shape", "axis", "group_size")  # what W_q is, then how it is laid out
    for leaf in sorted(m.hqq_meta, key=lambda x: (first.index(x) if x in first else len(first), x)):
        st = m.hqq_meta[leaf]
        kind = HQQ_META[leaf]
        t = ckpt.get(st.name)
        where = f"{st.file}: tensor {st.name!r} (HQQ meta '{leaf}' of {m.weight.name!r})"
        if kind in ("int", "bool", "nbits"):
            if t.numel() != 1:
                raise InspectError(f"{where}: shape {list(t.shape)}, expected one value (encode_safetensor_type stores "
                                   f"{'an int32' if kind != 'bool' else 'a uint8'} 0-d tensor)")
            if t.is_floating_point() and kind != "nbits":
                raise InspectError(f"{where}: dtype {st.dtype}, expected an integer tensor ("
                                   f"{'int32' if kind == 'int' else 'uint8 0 / 1'}, as encode_safetensor_type writes)")
            v = t.reshape(-1)[0].item()
            if kind == "bool":
                if v not in (0, 1):
                    raise InspectError(f"{where}: value {v}, expected 0 or 1 (a bool stored as uint8)")
                v = bool(v)
            elif kind == "int" or float(v).is_integer():
                v = int(v)
            elif abs(v - 1.58) < 1e-4:
                v = 1.58  # float32(1.58), HQQ's ternary nbits
        elif kind in ("str", "dtype"):
            if st.dtype != "U8" or t.dim() != 1:
                raise InspectError(f"{where}: {st.dtype} {list(t.shape)}, expected a uint8 1-d tensor of character "
                                   f"codes (encode_safetensor_type of a {'str' if kind == 'str' else 'torch.dtype'})")
            v = "".join(chr(int(c)) for c in t.tolist())
            if kind == "dtype" and leaf == "compute_dtype" and v not in HQQ_TORCH_DTYPES:
                raise InspectError(f"{where}: {v!r}, expected a float torch dtype: one of {list(HQQ_TORCH_DTYPES)}")
        else:  # torch.Size
            if st.dtype not in INT_DTYPES or t.dim() != 1:
                raise InspectError(f"{where}: {st.dtype} {list(t.shape)}, expected an integer 1-d tensor "
                                   f"(torch.tensor(torch.Size([out_features, in_features])), int64 [2])")
            v = [int(x) for x in t.tolist()]
        out[leaf] = v
        if leaf == "nbits" and v not in HQQ_NBITS:
            raise InspectError(f"{where}: nbits {v}, expected one of HQQ's {sorted(HQQ_NBITS)} "
                               f"(Quantizer.SUPPORTED_BITS)")
        if leaf == "packing" and v not in HQQ_PACKINGS:
            raise InspectError(f"{where}: unknown packing {v!r}; HQQ's packings are {sorted(HQQ_PACKINGS)} "
                               f"(Quantizer.bit_to_packing)")
        if leaf == "packing" and "nbits" in out and HQQ_NBITS[out["nbits"]] != v:
            raise InspectError(f"{where}: packing {v!r}, but tensor {m.hqq_meta['nbits'].name!r} says nbits "
                               f"{out['nbits']}, which packs as {HQQ_NBITS[out['nbits']]!r} (Quantizer.bit_to_packing); "
                               f"expected the two to agree")
        if leaf == "unpack_view_dtype" and "packing" in out and v != HQQ_PACKINGS[out["packing"]]:
            raise InspectError(f"{where}: {v!r}, expected {HQQ_PACKINGS[out['packing']]!r} (HQQ's "
                               f"{out['packing']!r} packing unpacks that dtype, Quantizer.unpack_view_dtype)")
        if leaf in HQQ_REQUIRED and v != HQQ_REQUIRED[leaf]:
            raise InspectError(f"{where}: {v!r}, expected {HQQ_REQUIRED[leaf]!r} ({HQQ_WHY[leaf]})")
        if leaf == "shape" and v != list(m.logical):
            raise InspectError(f"{where}: shape {v}, config.json implies {list(m.logical)} ([out_features, "
                               f"in_features]) for {[p for p, _ in m.parts]}; expected {list(m.logical)}")
        if leaf == "axis" and v not in (0, 1):
            raise InspectError(f"{where}: axis {v}, expected 0 or 1 (Quantizer.quantize asserts it)")
        if leaf == "group_size" and (v < 1 or (m.logical[0] * m.logical[1]) % v):
            n, k = m.logical
            raise InspectError(f"{where}: group_size {v} does not divide N*K = {n}*{k} = {n * k} (Quantizer.quantize "
                               f"asserts it); expected a divisor of {n * k}")
    return out


def _hqq_problems(m: Module, axis: int, g: int, packing: str = "2bit_u8") -> list[str]:
    """Why ``m``'s W_q / scale / zero are not HQQ's ``packing`` layout for ``axis`` and groups of ``g`` (empty:
    they are).  Each reason names the tensor and its expected shape."""
    n, k = m.logical
    if g < 1 or (n * k) % g:
        return [f"group_size {g} does not divide N*K = {n * k}"]
    bits, dt, f = HQQ_BITPACK[packing]
    cols = n * k // g
    out = []
    if axis == 1:
        if k % g:
            return [f"group_size {g} does not divide K = {k} (axis=1 groups that straddle rows are not supported); "
                    f"expected a divisor of {k}"]
        want_w = (-(-cols // f), g)
        ok_s = {(cols, 1), (cols,), (n, k // g)}
        s_txt = f"[{cols}, 1] (one value per row of the [{cols}, {g}] group view)"
    else:
        if dt == "U8" and g % f:
            return [f"group_size {g} is not a multiple of {f} (BitPack.pack_{packing} cuts the [{g}, {cols}] view "
                    f"into {f} chunks of rows)"]
        want_w = (-(-g // f), cols)
        ok_s = {(1, cols), (cols,)}
        s_txt = f"[1, {cols}] (one value per column of the [{g}, {cols}] group view)"
    if m.weight.dtype != dt or tuple(m.weight.shape) != want_w:
        out.append(f"{m.weight.name!r} is {m.weight.dtype} {list(m.weight.shape)}, expected "
                   f"{CONTAINER_OF[dt]} {list(want_w)} ({packing})" + _hqq_view_note(m, dt, want_w))
    for t, what in ((m.scale, "scale"), (m.zeros, "zero")):
        if t is None:
            out.append(f"no {what} tensor {m.prefix + '.' + what!r}")
        elif t.dtype in INT_DTYPES or tuple(t.shape) not in ok_s:
            out.append(f"{what} {t.name!r} is {t.dtype} {list(t.shape)}, expected a float {s_txt}")
    return out


def _hqq_view_note(m: Module, dt: str, want: tuple) -> str:
    """For a view_as_float W_q (``m.stored_as``): the stored float tensor and the float shape ``want`` needs."""
    if m.stored_as is None:
        return ""
    cb, fb = INT_DTYPES[dt] // 8, m.stored.nbytes // max(1, m.stored.numel)
    exp = (f"expected {m.stored_as} {[want[0], want[1] * cb // fb]}" if (want[1] * cb) % fb == 0 else
           f"no {m.stored_as} tensor holds it ({want[1]} * {cb} bytes per row)")
    return (f" (read as the {CONTAINER_OF[m.weight.dtype]} view of the stored {m.stored_as} {list(m.stored.shape)}, "
            f"view_as_float; {exp})")


def _hqq_float_views(modules: list[Module], ckpt: Checkpoint) -> None:
    """HQQ ``view_as_float`` (see module docstring): where a W_q's meta tensors say view_as_float True and W_q is a
    float tensor of compute_dtype, the module's weight becomes the statistics of its integer view
    (``unpack_view_dtype``, else the packing's; ``scan.tensor_stats``), ``stored_as`` the float dtype and ``stored``
    the stored tensor's own stats, so HQQ detection reads the packed integers bit for bit.  view_as_float True
    next to an integer W_q, a float W_q without it (meta present), a float dtype that is not compute_dtype, or a
    row whose bytes are no whole number of integers is an InspectError naming the file, the tensor and the
    expected dtype / shape.  Modules without HQQ meta are left alone."""
    from .scan import tensor_stats

    for m in modules:
        st = m.weight
        if not (st.name.endswith(".W_q") and m.hqq_meta) or m.stored_as is not None:
            continue
        vst = m.hqq_meta.get("view_as_float")
        vaf = False
        if vst is not None:
            t = ckpt.get(vst.name)
            if t.numel() != 1 or t.is_floating_point() or t.reshape(-1)[0].item() not in (0, 1):
                continue  # malformed: _hqq_meta_values names it
            vaf = bool(t.reshape(-1)[0].item())
        is_float = st.dtype not in INT_DTYPES
        if not vaf and (not is_float or m.scale is None or m.zeros is None):
            continue  # an integer W_q, or a float weight with no scale / zero next to it (not HQQ-packed: said later)
        meta = _hqq_meta_values(m, ckpt)
        packing = meta.get("packing") or (HQQ_NBITS[meta["nbits"]] if "nbits" in meta else None)
        cont = meta.get("unpack_view_dtype") or (HQQ_PACKINGS[packing] if packing else None)
        cname = cont.removeprefix("torch.") if cont else "uint8 / int32"
        where = f"{st.file}: tensor {st.name!r} (HQQ W_q)"
        said = (f"HQQ meta tensor {vst.name!r} says view_as_float {vaf}" if vst is not None else
                "no HQQ meta 'view_as_float' next to it (HQQ's default: False)")
        comp = meta.get("compute_dtype")
        want_f = comp.removeprefix("torch.") if comp else None
        if not vaf:
            raise InspectError(f"{where} is {st.dtype} {list(st.shape)}, but {said}: without view_as_float HQQ "
                               f"stores W_q as its packing's integers; expected {cname} (unpack_view_dtype), or "
                               f"view_as_float True for a float view of them")
        if not is_float:
            raise InspectError(f"{where} is {st.dtype} {list(st.shape)}, but {said}: Quantizer.quantize then stores "
                               f"W_q.view(compute_dtype); expected a {want_f or 'float16 / bfloat16 / float32'} "
                               f"tensor holding the packed {cname} bytes (or view_as_float False)")
        if cont not in ("torch.uint8", "torch.int32"):
            raise InspectError(f"{where}: {said}, but no HQQ meta 'packing', 'nbits' or 'unpack_view_dtype' says "
                               f"which integer dtype its bytes hold; expected one of them (e.g. unpack_view_dtype "
                               f"'torch.uint8')")
        if st.dtype not in HQQ_FLOAT_VIEWS or (want_f is not None and HQQ_FLOAT_VIEWS[st.dtype] != want_f):
            raise InspectError(f"{where} is {st.dtype} {list(st.shape)}; {said} and Quantizer.quantize stores "
                               f"W_q.view(compute_dtype): expected "
                               + (f"{want_f} (HQQ meta {m.hqq_meta['compute_dtype'].name!r} = {comp!r})" if want_f
                                  else f"one of {sorted(HQQ_FLOAT_VIEWS.values())}"))
        t = ckpt.get(st.name)
        dt, cb = ("U8", 1) if cont == "torch.uint8" else ("I32", 4)
        fb = t.element_size()
        if t.dim() != 2 or (t.shape[-1] * fb) % cb:
            raise InspectError(f"{where} is {st.dtype} {list(st.shape)} (view_as_float): expected a 2-D tensor whose "
                               f"rows are whole {cname} values, but a row of {t.shape[-1] if t.dim() else 0} * {fb} "
                               f"bytes is not a multiple of {cb} (W_q.view({cont}) fails)")
        iv = t.contiguous().view(torch.uint8 if dt == "U8" else torch.int32)
        m.stored, m.stored_as = st, HQQ_FLOAT_VIEWS[st.dtype]
        m.weight = tensor_stats(iv, st.name, st.file, dt, st.nbytes)


def _hqq_groups(m: Module, axis: int, packing: str) -> int:
    """The group size HQQ's ``axis`` view implies for ``m``'s stored shapes: axis=1 -> W_q's width; axis=0 ->
    N*K over the number of scales (W_q's rows for one-value-per-byte packings)."""
    a, b = m.weight.shape
    if axis == 1:
        return b
    n, k = m.logical
    cols = m.scale.numel if m.scale is not None else b
    return n * k // cols if cols and (n * k) % cols == 0 else HQQ_BITPACK[packing][2] * a


def _hqq_layout(m: Module, ckpt: Checkpoint) -> Optional[tuple[int, int, str]]:
    """(axis, group_size, packing) of an HQQ module, or None when its tensors are not HQQ's.  Without meta the
    packing and axis are read from the shapes (W_q's dtype and rows against the number of groups; scale / zero
    [1, N*K/G]: axis=0, else axis=1, as HQQ defaults); with meta tensors they are decoded and checked, and a
    disagreement is an error."""
    if len(m.weight.shape) != 2:
        return None
    packings = [p for p, (_, dt, _) in HQQ_BITPACK.items() if dt == m.weight.dtype]
    packings.sort(key=lambda p: p != "2bit_u8")  # the ternary packing first, then HQQ's order
    if not m.hqq_meta:
        for packing in packings:
            for axis in (1, 0):
                g = _hqq_groups(m, axis, packing)
                if not _hqq_problems(m, axis, g, packing):
                    return axis, g, packing
        return None
    meta = m.hqq_values = _hqq_meta_values(m, ckpt)
    if "packing" in meta or "nbits" in meta:
        packings = [meta.get("packing") or HQQ_NBITS[meta["nbits"]]]
    axes = [meta["axis"]] if "axis" in meta else [1, 0]
    tried = []
    for packing in packings or ["2bit_u8"]:
        for axis in axes:
            g = meta.get("group_size", _hqq_groups(m, axis, packing))
            probs = _hqq_problems(m, axis, g, packing)
            if not probs:
                return axis, g, packing
            tried.append((axis, g, packing, probs))
    said = [m.hqq_meta[k] for k in ("packing", "nbits", "axis", "group_size") if k in meta] \
        or list(m.hqq_meta.values())[:1]
    axis, g, packing, probs = tried[0]
    raise InspectError(
        f"{said[0].file}: HQQ meta " + " and ".join(f"tensor {st.name!r} = {meta.get(st.name.rsplit('.', 1)[-1])!r}"
                                                     for st in said)
        + f" next to {m.weight.name!r} contradict the stored tensors: for axis={axis}, group_size={g} ({packing}, "
        f"logical {m.logical[0]}x{m.logical[1]}) "
        + "; ".join(probs) + (f" (axis={tried[1][0]} fits neither: " + "; ".join(tried[1][3]) + ")"
                              if len(tried) > 1 else ""))


#: below this share of non-integer zero points an HQQ checkpoint is a ternary one with corrupt zero points
#: (an error naming the first); at or above it, HQQ's asymmetric quantization (round_zero=False: float zeros)
HQQ_FLOAT_ZERO_SHARE = 0.5
#: with integer zero points: below this share of groups holding a value q - z outside {-1, 0, +1} the checkpoint is a
#: ternary one with a corrupt code or zero point (an error); at or above it, HQQ's 2-bit levels (round_zero=True)
HQQ_STRAY_LEVELS = 0.01


def _hqq_ternary(fit: list[Module], layout: dict, ckpt: Checkpoint) -> tuple[bool, str]:
    """Whether the HQQ modules ``fit`` hold ternary values (all of them 2-bit, every zero point an integer, every
    q - z in {-1, 0, +1} under HQQ's own packing) and the evidence.  A 2-bit checkpoint that is ternary but for
    a stray non-integer zero point (fewer than half of them), or whose values leave {-1, 0, +1} in fewer than 1% of
    its groups, is an InspectError naming the first (a corrupt tensor: HQQ's asymmetric levels are so throughout)."""
    from .inspect_search import hqq_pack_spec
    from .spec import subtract_zero

    zs = {m.prefix: ckpt.get(m.zeros.name).float().reshape(-1) for m in fit}
    for m in fit:
        z = zs[m.prefix]
        if not bool(torch.isfinite(z).all()):
            i = int((~torch.isfinite(z)).nonzero()[0])
            raise InspectError(f"{m.zeros.file}: zero point tensor {m.zeros.name!r} holds {float(z[i])} at group {i} "
                               f"next to HQQ weight {m.weight.name!r}: expected finite zero points")
    total = sum(z.numel() for z in zs.values())
    frac = sum(int((z != z.round()).sum()) for z in zs.values())
    if any(layout[m.prefix][2] != "2bit_u8" for m in fit):  # 1 / 3 / 4 / 8-bit codes: never HQQ's ternary case
        widths = sorted({layout[m.prefix][2] for m in fit})
        return False, (f"packings {widths}: not all 2-bit, so not ternary; "
                       + (f"{frac} of {total} zero points are non-integer" if frac else
                          "integer zero points (HQQ rounds them for nbits 4)"))
    if 0 < frac / max(1, total) < HQQ_FLOAT_ZERO_SHARE:
        m = next(m for m in fit if bool((zs[m.prefix] != zs[m.prefix].round()).any()))
        z = zs[m.prefix]
        i = int((z != z.round()).nonzero()[0])
        raise InspectError(f"{m.zeros.file}: zero point tensor {m.zeros.name!r} holds non-integer values (e.g. "
                           f"{float(z[i])} at group {i}) next to HQQ weight {m.weight.name!r}, where {total - frac} of "
                           f"{total} zero points in the model are integers: (q - z) is not ternary; expected integer "
                           f"zero points (1 or 2 for 2-bit codes), or non-integer ones throughout (HQQ's asymmetric "
                           f"quantization)")
    if frac:
        return False, (f"{frac} of {total} zero points are non-integer (HQQ's asymmetric quantization, "
                       f"round_zero=False): W = (q - zero) * scale is not ternary")
    zvals = sorted({int(v) for z in zs.values() for v in torch.unique(z).tolist()})
    outside, groups_out, first = 0, 0, None
    for m in fit:
        codes = unpack_codes(ckpt.get(m.weight.name), hqq_pack_spec(*layout[m.prefix], stored_as=m.stored_as),
                             m.logical)
        axis, g, _ = layout[m.prefix]
        zspec = ScaleSpec(key=m.zeros.name, granularity="group", group_size=g, **({"group_axis": 0} if axis == 0 else {}))
        vals = subtract_zero(codes, ckpt.get(m.zeros.name), zspec, m.logical, m.where())
        bad = vals.abs() > 1
        if bool(bad.any()):
            outside += int(bad.sum())
            # groups holding a value outside {-1, 0, +1}: rows of the [N*K/G, G] view (axis 1), columns of [G, N*K/G]
            groups_out += int(bad.reshape(-1, g).any(1).sum() if axis == 1 else bad.reshape(g, -1).any(0).sum())
            if first is None:
                idx = tuple(int(i) for i in bad.nonzero()[0])
                first = (m, idx, int(vals[idx]))
    if first is not None and groups_out / max(1, total) < HQQ_STRAY_LEVELS:
        m, idx, v = first
        raise InspectError(f"{m.where()}: q - zero = {v} at logical index {idx} (zero points {m.zeros.name!r}), but "
                           f"only {groups_out} of {total} groups in the model hold a value outside {{-1, 0, +1}} "
                           f"({outside} values): a ternary checkpoint with corrupt codes or zero points; expected every "
                           f"(q - z) in {{-1, 0, +1}}, or HQQ's 2-bit levels throughout")
    if first is not None:
        return False, (f"integer zero points {zvals[:8]}, but {outside} values q - zero in {groups_out} of {total} "
                       f"groups leave {{-1, 0, +1}} under HQQ's own packing (e.g. {first[2]} in "
                       f"{first[0].weight.name!r}): HQQ's 2-bit levels (round_zero), not ternary")
    return True, f"the zero points are integers {zvals}, so q - zero is ternary"


def detect_hqq(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """HQQ (mobiusml/hqq; the rule is in the module docstring): a packed ``W_q`` (uint8, or int32 for 3-bit) next
    to float ``scale`` and ``zero`` with one value per group, groups of G along axis=1 (W_q [ceil(N*K/G / f), G],
    scale / zero [N*K/G, 1], K % G == 0) or axis=0 (W_q [ceil(G/f), N*K/G], scale / zero [1, N*K/G]), f codes
    per container, and maybe HQQ's meta tensors (checked by ``_hqq_meta_values``).  Ternary when every zero point
    is an integer and q - z is ternary (the spec then checks it: ``levels`` 'ternary'), else HQQ's asymmetric
    levels ((q - z) * scale with float zero points, or 3- / 4- / 8-bit codes).  On a match: the codes of the
    group view packed along its axis 0, identity code table, group scales and zero points; lanes and bit order
    are searched (HQQ's own first).  A model with meta tensors is HQQ: every packed weight must then be an HQQ
    one (else an error naming it)."""
    packed = [m for m in modules if m.packed]
    layout = {m.prefix: _hqq_layout(m, ckpt) for m in packed}
    fit = [m for m in packed if layout[m.prefix]]
    named = [m for m in packed if m.hqq_meta]
    # HQQ by its key names: every packed weight a W_q next to a zero tensor (HQQLinear.state_dict's names); then a
    # module that does not fit is a broken HQQ module, said with HQQ's reasons (not the generic path's)
    by_name = bool(packed) and all(m.weight.name.endswith(".W_q") and m.zeros is not None for m in packed)
    if named or (by_name and len(fit) < len(packed)):
        for m in packed:
            if layout[m.prefix] is None:
                a, b = m.weight.shape if len(m.weight.shape) == 2 else (0, 0)
                pk = "3bit_32" if m.weight.dtype == "I32" else "2bit_u8"
                probs = _hqq_problems(m, 1, b, pk) if b else [f"{m.weight.name!r} is not 2-D"]
                why = (f"although {named[0].weight.name!r} carries HQQ meta tensors (e.g. "
                       f"{next(iter(named[0].hqq_meta.values())).name!r})" if named else
                       f"although every packed weight is an HQQ W_q with a zero tensor ({len(fit)} of {len(packed)} "
                       f"fit HQQ's layouts)")
                raise InspectError(
                    f"{m.where()}: not an HQQ layout, {why}: as {pk} axis=1: " + "; ".join(probs)
                    + (f"; as axis=0: " + "; ".join(_hqq_problems(m, 0, _hqq_groups(m, 0, pk), pk)) if a else ""))
    if not fit or len(fit) < len(packed):
        return False
    ternary, why = _hqq_ternary(fit, layout, ckpt)
    for m in modules:
        m.bits = 2
        if not m.packed:
            continue
        axis, g, packing = layout[m.prefix]
        m.bits = HQQ_BITPACK[packing][0]
        m.group_view, m.group_axis, m.pack_axis, m.transposed = g, axis, 0, False
        m.fields = HQQ_BITPACK[packing][2] if packing == "3bit_32" else None
        kw = dict(granularity="group", group_size=g, **({"group_axis": 0} if axis == 0 else {}))
        m.scale_kw = [dict(kw)] * len(m.parts)
        m.zero_kw = dict(kw)
        m.levels = "ternary" if ternary else None
    groups: dict = {}  # (packing, axis) -> group sizes
    for m in fit:
        axis, g, packing = layout[m.prefix]
        groups.setdefault((packing, axis), set()).add(g)
    desc = "; ".join(f"{p} axis={ax} groups of {sorted(gs)}" for (p, ax), gs in sorted(groups.items()))
    findings.append(Finding(
        "block structure", f"HQQ {'ternary' if ternary else 'asymmetric low-bit'}, {desc}: W = (q - zero) * scale",
        f"all {len(packed)} packed weights are {sorted({CONTAINER_OF[m.weight.dtype] for m in fit})} W_q of the "
        f"group view with float scale and zero per group ([N*K/G, 1] axis=1, [1, N*K/G] axis=0); {why}"
        + (f"; W_q of {sum(m.stored_as is not None for m in fit)} modules stored as a float view of those bytes "
           f"(view_as_float: {sorted({m.stored_as for m in fit if m.stored_as})}), read as their integer view"
           if any(m.stored_as for m in fit) else "")
        + (f"; packing, axis{' and group_size' if any('group_size' in m.hqq_values for m in named) else ''} from "
           f"HQQ's meta tensors for {len(named)} modules" if named else
           "; packing and axis from the shapes (no HQQ meta tensors)"),
        "high"))
    if named:
        keys = sorted({k for m in named for k in m.hqq_meta})
        vals = {k: sorted({repr(m.hqq_values[k]) for m in named if k in m.hqq_values})
                for k in ("nbits", "packing", "axis", "group_size")}
        findings.append(Finding(
            "HQQ meta tensors", f"read and checked for {len(named)} of {len(packed)} modules",
            f"keys {keys}; " + ", ".join(f"{k} {'/'.join(v)}" for k, v in vals.items() if v)
            + "; shape = config.json's [out, in] where stored; they agree with the stored W_q / scale / zero "
              "(listed under the spec's 'ignored')", "high"))
    return True


#: quantization_config keys of AutoAWQ (``awq/models/_config.py`` ``AwqConfig.to_transformers_dict``: quant_method,
#: zero_point, group_size, bits, version, modules_to_not_convert) and their AutoAWQ-internal spellings, which vLLM's
#: ``AutoAWQConfig.from_config`` also reads (w_bit, q_group_size); transformers' ``AwqConfig`` calls version ``format``
AWQ_KEYS = {"bits": ("bits", "w_bit"), "group_size": ("group_size", "q_group_size"), "version": ("version", "format")}
AWQ_DEFAULTS = {"bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}  # AwqConfig's defaults


def _awq_config(cfg: ModelConfig) -> dict:
    """quantization_config of an AWQ checkpoint: bits, group_size, version, zero_point (AwqConfig's defaults
    where absent); an InspectError naming the key for anything AutoAWQ's gemm layout does not write."""
    q = cfg.quantization or {}
    where = "config.json: quantization_config"
    out, key = {}, {}
    for k, names in AWQ_KEYS.items():
        key[k] = next((n for n in names if q.get(n) is not None), names[0])  # the spelling config.json uses
        out[k] = q.get(key[k], AWQ_DEFAULTS[k])
    out["zero_point"] = True if q.get("zero_point") is None else q["zero_point"]
    if out["bits"] != 4:
        raise InspectError(f"{where}.{key['bits']} is {out['bits']!r}: AutoAWQ packs 4-bit codes only "
                           f"(awq/modules/linear/gemm.py WQLinear_GEMM: 'Only 4-bit are supported for now'; its "
                           f"AWQ_ORDER interleaves 8 codes per int32); expected 4")
    v = str(out["version"]).lower()
    if v not in AWQ_VERSIONS:
        raise InspectError(f"{where}.{key['version']} is {out['version']!r}: {_awq_version_refusal(v)}; AutoAWQ's "
                           f"'gemm' (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N]) and "
                           f"'gemv' (qweight int32 [N, K/8], qzeros int32 [N, W], scales fp16 [N, 8 W], W = "
                           f"calculate_zeros_width(K, G)) layouts are supported")
    out["version"] = v
    if out["zero_point"] is not True:
        raise InspectError(f"{where}.zero_point is {out['zero_point']!r}: AutoAWQ writes {v} checkpoints with zero "
                           f"points only (WQLinear_{v.upper()}.from_linear asserts zeros is not None; vLLM's AWQ loads "
                           f"qzeros either way), so a checkpoint without them has no layout to follow; expected true")
    gs = out["group_size"]
    if isinstance(gs, bool) or not isinstance(gs, int) or (gs < 1 and gs != -1):
        raise InspectError(f"{where}.{key['group_size']} is {gs!r}: expected a positive integer (AutoAWQ: 128, 64, "
                           f"32) or -1 (one group per row)")
    if v == "gemv" and gs != -1 and gs < 128 and gs not in (32, 64):
        raise InspectError(f"{where}.{key['group_size']} is {gs!r}: AutoAWQ gemv takes group_size >= 128, 64 or 32 "
                           f"(awq/modules/linear/gemv.py calculate_zeros_width raises NotImplementedError otherwise); "
                           f"expected one of those or -1")
    return out


#: AutoAWQ quantization_config versions whose layout is read (``detect_awq``: gemm, ``_detect_awq_gemv``: gemv)
AWQ_VERSIONS = ("gemm", "gemv")


def _awq_version_refusal(v: str) -> str:
    """Why an AutoAWQ version other than gemm / gemv is not read (named, with what its layout is)."""
    if v == "gemv_fast":
        return ("AutoAWQ's gemv_fast layout (awq/modules/linear/gemv_fast.py WQLinear_GEMVFast) is not read: qweight "
                "int16 [N/4, K] (pack_intweight: codes permuted within 32-input chunks, [0, 2, 4, 6, 1, 3, 5, 7] per "
                "8, four output rows interleaved per 64-input stride, four codes per int16), scales fp16 [8 W, N] and "
                "qzeros fp16 [8 W, N] holding -(scale * z) rounded to fp16, not the integer z")
    if v == "marlin":
        return ("AutoAWQ's marlin layout (awq/modules/linear/marlin.py WQLinear_Marlin: Marlin's tiled, permuted "
                "qweight and permuted scales, no qzeros) is not read")
    if v in ("exllama", "exllamav2", "ipex"):
        return f"AutoAWQ's {v} is a kernel choice at load time, not a checkpoint layout AutoAWQ writes"
    return "a layout this inspector has not read"


def _check_scale_values(m: Module, s: torch.Tensor, axes: tuple[str, str], who: str, zero_why: str) -> None:
    """A 2-D scale tensor of a zero-point format (AutoAWQ, compressed-tensors): an InspectError naming the tensor,
    the count and the first NaN / Inf (at its ``axes`` indices), or the count of zeros and ``zero_why``."""
    bad = ~torch.isfinite(s)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise InspectError(f"{m.scale.file}: scales {m.scale.name!r} have {int(bad.sum())} NaN/Inf values (first "
                           f"{float(s[i, j])} at {axes[0]} {i}, {axes[1]} {j}); expected finite {who} scales for "
                           f"{m.weight.name!r}")
    if bool((s == 0).any()):
        raise InspectError(f"{m.scale.file}: scales {m.scale.name!r} have {int((s == 0).sum())} zero values; "
                           f"{zero_why} (a zero erases the group of {m.weight.name!r})")


def _awq_shaped(m: Module) -> bool:
    """A module stored as AutoAWQ gemm stores one: qweight int32 [K, N/8] next to int32 qzeros [G, N/8] and
    scales [G, N] (the inspector's evidence where config.json has no quantization_config)."""
    n, k = m.logical
    return (m.weight.name.endswith(".qweight") and m.weight.dtype == "I32" and n % 8 == 0
            and tuple(m.weight.shape) == (k, n // 8) and m.zeros is not None and m.zeros.dtype == "I32"
            and len(m.zeros.shape) == 2 and m.zeros.shape[1] == n // 8 and m.scale is not None
            and tuple(m.scale.shape) == (m.zeros.shape[0], n) and m.zeros.shape[0] > 0 and k % m.zeros.shape[0] == 0)


def _awq_shape_basics(m: Module, G: int, version: str, n_why: str, cls: str) -> None:
    """What every AutoAWQ version asks of a module: no tensor beside qweight / qzeros / scales / bias, N % 8 == 0
    (``n_why``), K a multiple of the group size ``G`` (``cls`` asserts it); InspectErrors naming the tensor."""
    n, k = m.logical
    parts = [p for p, _ in m.parts]
    for t in (m.g_idx, m.shape_t, *m.hqq_meta.values()):
        if t is not None:
            raise InspectError(f"{t.file}: tensor {t.name!r} next to weight {m.weight.name!r} is not part of AutoAWQ's "
                               f"{version}layout (qweight, qzeros, scales, bias; extra key)")
    if n % 8:
        raise InspectError(f"{m.where()}: {n} outputs for {parts}, but {n_why}")
    if k % G:
        raise InspectError(f"{m.where()}: K = {k} inputs for {parts} is not a multiple of quantization_config."
                           f"group_size {G} ({cls} asserts in_features % group_size == 0)")


def _awq_check(m: Module, gs: int, ckpt: Checkpoint) -> int:
    """The tensors of one AutoAWQ gemm module against the layout (WQLinear_GEMM's buffers): an InspectError naming
    the tensor and the shape it must have.  Returns the module's group size."""
    n, k = m.logical
    G = k if gs == -1 else gs
    parts = [p for p, _ in m.parts]
    lay = f"AutoAWQ gemm (group_size {gs}) stores the logical {n}x{k} matrix of {parts} as"
    if m.g_idx is not None and tuple(m.weight.shape) == (k // 8, n) and tuple(m.weight.shape) != (k, n // 8):
        # AutoGPTQ writes g_idx with every module: a GPTQ checkpoint under an awq config shows here first
        raise InspectError(f"{m.where()}: {m.weight.dtype} {list(m.weight.shape)} next to g_idx {m.g_idx.name!r}: "
                           f"that is AutoGPTQ's layout (qweight [K/8, N] + g_idx), but config.json says quant_method "
                           f"'awq', whose {lay} qweight int32 [K, N/8] = [{k}, {n // 8}] without g_idx (a GPTQ "
                           f"checkpoint needs quant_method 'gptq')")
    _awq_shape_basics(m, G, "", "AutoAWQ packs 8 outputs per int32 (WQLinear_GEMM asserts out_features % 8 == 0)",
                      "WQLinear_GEMM")
    g = k // G
    if m.weight.dtype != "I32" or tuple(m.weight.shape) != (k, n // 8):
        hint = " (that is GPTQ's [K/8, N] qweight, not AWQ's)" if tuple(m.weight.shape) == (k // 8, n) else \
            " (that is AutoAWQ gemv's [N, K/8] qweight; config.json says version gemm)" \
            if tuple(m.weight.shape) == (n, k // 8) else ""
        raise InspectError(f"{m.where()}: {m.weight.dtype} {list(m.weight.shape)}, but {lay} qweight int32 "
                           f"[K, N/8] = [{k}, {n // 8}]{hint}")
    if m.zeros is None:
        raise InspectError(f"{m.where()}: qzeros missing: no zero point tensor next to it, but {lay} qweight with "
                           f"qzeros int32 [K/G, N/8] = [{g}, {n // 8}] ({m.prefix + '.qzeros'!r}; W = (q - z) * s "
                           f"needs z)")
    if m.zeros.dtype != "I32" or tuple(m.zeros.shape) != (g, n // 8):
        raise InspectError(f"{m.zeros.file}: tensor {m.zeros.name!r} is {m.zeros.dtype} {list(m.zeros.shape)}, "
                           f"but {lay} qzeros int32 [K/G, N/8] = [{g}, {n // 8}]")
    if m.scale is None:
        raise InspectError(f"{m.where()}: no scales tensor next to it, but {lay} scales fp16 [K/G, N] = [{g}, {n}] "
                           f"({m.prefix + '.scales'!r})")
    if m.scale.dtype in INT_DTYPES or tuple(m.scale.shape) != (g, n):
        raise InspectError(f"{m.scale.file}: tensor {m.scale.name!r} is {m.scale.dtype} {list(m.scale.shape)}, "
                           f"but {lay} scales fp16 [K/G, N] = [{g}, {n}]")
    s = ckpt.get(m.scale.name).to(torch.float32)
    _check_scale_values(m, s, ("group", "output"), "AutoAWQ", "AutoAWQ's are (max - min).clamp(min=1e-5) / 15 > 0")
    return G


def detect_awq(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """AutoAWQ ``version: "gemm"`` (read from AutoAWQ 0.2.9, not guessed): ``awq/modules/linear/gemm.py``
    ``WQLinear_GEMM.from_linear`` stores per module qweight int32 [K, N/8] (the codes q of eight consecutive outputs
    per word, slot i holding output ``col * 8 + AWQ_ORDER[i]`` at bits 4i: ``formats.AWQ_GEMM``), qzeros int32
    [K/G, N/8] (the integer zero points z packed the same way: ``formats.AWQ_GEMM_ZEROS``) and scales fp16 [K/G, N];
    ``awq/utils/packing_utils.py`` ``dequantize_gemm`` reads W^T = (q - z) * s with ``AWQ_REVERSE_ORDER``.  Taken
    when config.json says quant_method 'awq' (``_awq_config`` refuses what that layout does not cover: bits other
    than 4, versions other than gemm / gemv - gemv goes to ``_detect_awq_gemv`` - zero_point false), or, without a
    quantization_config, when every packed
    weight is a ``qweight`` of exactly that shape with its qzeros and scales.  Every packed module is then checked
    against the layout (``_awq_check``: an error names the tensor and the shape it must have, a missing qzeros, NaN
    scales); identity codes, values q - z, per-group zero points (``Module.zero_pack``), op multiply."""
    q = cfg.quantization or {}
    method = str(q.get("quant_method") or "").lower()
    packed = [m for m in modules if m.packed]
    if packed and method == "awq" and _awq_config(cfg)["version"] == "gemv":
        return _detect_awq_gemv(packed, cfg, ckpt, findings, _awq_config(cfg)["group_size"])
    if packed and not q and all(_awq_gemv_shaped(m) for m in packed) \
            and not all(_awq_shaped(m) for m in packed):
        return _detect_awq_gemv(packed, cfg, ckpt, findings, None)
    if not packed or (method != "awq" and (q or not all(_awq_shaped(m) for m in packed))):
        return False
    if method == "awq":
        ac = _awq_config(cfg)
        gs, why = ac["group_size"], "config.json quantization_config (quant_method awq, version gemm, bits 4)"
    else:
        gs = None  # each module's from its qzeros' rows
        why = (f"no quantization_config: every packed weight is a qweight int32 [K, N/8] with qzeros [K/G, N/8] and "
               f"scales [K/G, N] (AutoAWQ gemm's shapes; GPTQ stores [K/8, N])")
    sizes = set()
    for m in packed:
        G = _awq_check(m, gs if gs is not None else m.logical[1] // m.zeros.shape[0], ckpt)
        sizes.add(G)
        kw = dict(granularity="group", group_size=G, transposed=True)
        m.bits, m.pack_axis, m.transposed, m.order = 4, 0, True, AWQ_ORDER
        m.scale_kw = [dict(kw)] * len(m.parts)
        m.zero_kw = dict(kw)
        m.zero_pack = AWQ_GEMM_ZEROS
    findings.append(Finding(
        "block structure", f"AutoAWQ gemm, 4-bit, groups of {sorted(sizes)} inputs: W = (q - z) * s",
        f"{why}; all {len(packed)} packed weights are qweight int32 [K, N/8] (eight outputs per word in AWQ_ORDER "
        f"{list(AWQ_ORDER)}, awq/modules/linear/gemm.py WQLinear_GEMM.from_linear) with qzeros int32 [K/G, N/8] and "
        f"scales [K/G, N]", "high (config)" if method == "awq" else "medium (names and shapes)"))
    findings.append(Finding("zero point", "per-group zero points (AutoAWQ zero_point true): W = scale * (q - z)",
                            "qzeros store z itself, packed along N as qweight is (AWQ_GEMM_ZEROS)", "high (structure)"))
    return True


# ---------------------------------------------------------------------------------------
# AutoAWQ version "gemv" (read from AutoAWQ 0.2.9 awq/modules/linear/gemv.py, not guessed)

from .formats import AWQ_GEMV_ZEROS, awq_gemv_zeros_width, unpack  # noqa: E402  (this section's own)


def _awq_gemv_shaped(m: Module) -> bool:
    """A module stored as AutoAWQ gemv stores one: qweight int32 [N, K/8] next to int32 qzeros [N, W] and float
    scales [N, 8 W] (W >= 1; the inspector's evidence where config.json has no quantization_config).  Against
    gemm's [K, N/8] / [K/G, N/8] / [K/G, N] the three tensors' shared first axis N tells them apart: both read
    alike only for G = 1 with N = K, which gemv cannot write (calculate_zeros_width takes G >= 32)."""
    n, k = m.logical
    return (m.weight.name.endswith(".qweight") and m.weight.dtype == "I32" and n % 8 == 0 and k % 8 == 0
            and tuple(m.weight.shape) == (n, k // 8) and m.zeros is not None and m.zeros.dtype == "I32"
            and len(m.zeros.shape) == 2 and m.zeros.shape[0] == n and m.zeros.shape[1] >= 1
            and m.scale is not None and m.scale.dtype not in INT_DTYPES
            and tuple(m.scale.shape) == (n, 8 * m.zeros.shape[1]))


def _awq_gemv_group_candidates(k: int, width: int) -> set:
    """The group sizes (-1 for one group per row) AutoAWQ gemv could have written a K-input module's qzeros of
    ``width`` columns with: calculate_zeros_width(K, G) == width, K % G == 0, G in 32, 64 or >= 128."""
    out = set()
    for g in [32, 64, *range(128, k + 1)]:
        if g <= k and k % g == 0 and awq_gemv_zeros_width(k, g) == width:
            out.add(g)
    if (k >= 128 or k in (32, 64)) and awq_gemv_zeros_width(k, k) == width:
        out.add(-1)
    return out


def _awq_gemv_check(m: Module, gs: int, ckpt: Checkpoint) -> tuple[int, int]:
    """The tensors of one AutoAWQ gemv module against ``WQLinear_GEMV``'s buffers (``__init__`` / ``from_linear``):
    an InspectError naming the file, the tensor and the shape or value it must have.  Returns (the module's group
    size G, the qzeros width W = calculate_zeros_width(K, G))."""
    n, k = m.logical
    G = k if gs == -1 else gs
    parts = [p for p, _ in m.parts]
    lay = f"AutoAWQ gemv (group_size {gs}) stores the logical {n}x{k} matrix of {parts} as"
    _awq_shape_basics(m, G, "gemv ", "AutoAWQ gemv needs N % 8 == 0 (WQLinear_GEMV asserts out_features % "
                      "(32 // w_bit) == 0)", "WQLinear_GEMV")
    if k % 8:
        raise InspectError(f"{m.where()}: K = {k} inputs for {parts} is not a multiple of 8: WQLinear_GEMV's qweight "
                           f"[N, K // 8] = [{n}, {k // 8}] cannot hold the last {k % 8} inputs")
    try:
        W = awq_gemv_zeros_width(k, G)
    except FormatError as e:
        raise InspectError(f"{m.where()}: {e} (module {parts}, K = {k})") from None
    g = k // G
    if m.weight.dtype != "I32" or tuple(m.weight.shape) != (n, k // 8):
        hint = (" (that is AutoAWQ gemm's [K, N/8] qweight; config.json says version gemv)"
                if tuple(m.weight.shape) == (k, n // 8) else "")
        raise InspectError(f"{m.where()}: {m.weight.dtype} {list(m.weight.shape)}, but {lay} qweight int32 "
                           f"[N, K/8] = [{n}, {k // 8}]{hint}")
    if m.zeros is None:
        raise InspectError(f"{m.where()}: qzeros missing: no zero point tensor next to it, but {lay} qweight with "
                           f"qzeros int32 [N, W] = [{n}, {W}] ({m.prefix + '.qzeros'!r}; W = (q - z) * s needs z)")
    if m.zeros.dtype != "I32" or tuple(m.zeros.shape) != (n, W):
        hint = (" (that is AutoAWQ gemm's [K/G, N/8] qzeros)" if tuple(m.zeros.shape) == (g, n // 8) else "")
        raise InspectError(f"{m.zeros.file}: tensor {m.zeros.name!r} is {m.zeros.dtype} {list(m.zeros.shape)}, "
                           f"but {lay} qzeros int32 [N, W] = [{n}, {W}] (W = calculate_zeros_width({k}, {G}): {g} "
                           f"groups padded){hint}")
    if m.scale is None:
        raise InspectError(f"{m.where()}: no scales tensor next to it, but {lay} scales fp16 [N, 8 W] = [{n}, {8 * W}] "
                           f"({m.prefix + '.scales'!r})")
    if m.scale.dtype in INT_DTYPES or tuple(m.scale.shape) != (n, 8 * W):
        raise InspectError(f"{m.scale.file}: tensor {m.scale.name!r} is {m.scale.dtype} {list(m.scale.shape)}, "
                           f"but {lay} scales fp16 [N, 8 W] = [{n}, {8 * W}] ({g} groups, zero-padded to {8 * W} "
                           f"columns)")
    s = ckpt.get(m.scale.name).to(torch.float32)
    _check_scale_values(m, s[:, :g], ("output", "group"), "AutoAWQ",
                        "AutoAWQ's are (max - min).clamp(min=1e-5) / 15 > 0")
    for what, t, mat in (("scales", m.scale, s),
                         ("qzeros", m.zeros, unpack(ckpt.get(m.zeros.name), AWQ_GEMV_ZEROS, (n, 8 * W)))):
        pad = mat[:, g:]
        if pad.numel() and bool((pad != 0).any()):
            i, j = (int(x) for x in (pad != 0).nonzero()[0])
            raise InspectError(f"{t.file}: {what} {t.name!r} hold {float(pad[i, j]):g} at output {i}, padding "
                               f"column {g + j} ({int((pad != 0).sum())} nonzero padding values): {lay} {g} groups "
                               f"padded to {8 * W} columns, the padding 0 (WQLinear_GEMV.from_linear zero-fills it); "
                               f"expected 0")
    return G, W


def _detect_awq_gemv(packed: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding],
                     gs: Optional[int]) -> bool:
    """AutoAWQ ``version: "gemv"`` (read from AutoAWQ 0.2.9, not guessed): ``awq/modules/linear/gemv.py``
    ``WQLinear_GEMV.from_linear`` stores per module qweight int32 [N, K/8] (the codes q of eight consecutive inputs
    per word in natural order, ``order_map = [0, ..., 7]``, input ``col * 8 + i`` at bits 4i: ``formats.AWQ_GEMV``),
    qzeros int32 [N, W] (the integer zero points z of the [N, groups] matrix packed the same way along the groups,
    the words past the groups 0) and scales fp16 [N, 8 W] (the group scales, zero-padded), W =
    ``calculate_zeros_width(K, G)`` (``formats.awq_gemv_zeros_width``); its gemv kernels read W = (q - z) * s.
    ``gs``: config.json's group size (``_awq_config``), or None without a quantization_config, where it comes from
    the qzeros widths: the one group size (or -1) every module's width admits; where several do, the shapes do not
    say which, and config.json's quantization_config must (an InspectError listing them).  Every module is checked
    against the layout (``_awq_gemv_check``); the spec reads the scales and the zeros through
    ``ScaleSpec.padded_groups`` = 8 W (padding checked zero at decode too)."""
    if gs is None:
        common = None
        for m in packed:
            c = _awq_gemv_group_candidates(m.logical[1], m.zeros.shape[1])
            common = c if common is None else common & c
        # -1 (G = K) and a fixed G that equals every module's K give the same layout
        resolved = {tuple(m.logical[1] if c == -1 else c for m in packed) for c in (common or ())}
        if len(resolved) != 1:
            shapes = sorted({(m.logical[1], m.zeros.shape[1]) for m in packed})
            raise InspectError(
                f"{packed[0].where()}: the tensors are AutoAWQ gemv's (qweight int32 [N, K/8], qzeros [N, W], scales "
                f"[N, 8 W]), but without a quantization_config the group size is "
                + (f"ambiguous: (K, W) = {shapes} fit group sizes {sorted(common)}" if common else
                   f"unknown: no one group size gives every module's (K, W) = {shapes} (calculate_zeros_width)")
                + "; add config.json quantization_config {\"quant_method\": \"awq\", \"version\": \"gemv\", "
                  "\"bits\": 4, \"zero_point\": true, \"group_size\": G}")
        gs = sorted(common)[-1] if -1 not in common else -1
        why = (f"no quantization_config: every packed weight is a qweight int32 [N, K/8] with qzeros [N, W] and "
               f"scales [N, 8 W] (AutoAWQ gemv's shapes; gemm stores [K, N/8]); group size from the qzeros widths")
    else:
        why = "config.json quantization_config (quant_method awq, version gemv, bits 4)"
    sizes, widths = set(), set()
    for m in packed:
        G, W = _awq_gemv_check(m, gs, ckpt)
        sizes.add(G)
        widths.add((m.logical[1], W))
        kw = dict(granularity="group", group_size=G, padded_groups=8 * W)
        m.bits, m.pack_axis, m.transposed, m.order = 4, 1, False, None
        m.scale_kw = [dict(kw)] * len(m.parts)
        m.zero_kw = dict(kw)
        m.zero_pack = AWQ_GEMV_ZEROS
    findings.append(Finding(
        "block structure", f"AutoAWQ gemv, 4-bit, groups of {sorted(sizes)} inputs: W = (q - z) * s",
        f"{why}; all {len(packed)} packed weights are qweight int32 [N, K/8] (eight inputs per word in natural "
        f"order, awq/modules/linear/gemv.py WQLinear_GEMV.from_linear) with qzeros int32 [N, W] and scales [N, 8 W], "
        f"(K, W) in {sorted(widths)} (calculate_zeros_width: the groups padded with zeros, checked)",
        "high (config)" if (cfg.quantization or {}) else "medium (names and shapes)"))
    findings.append(Finding("zero point", "per-group zero points (AutoAWQ zero_point true): W = scale * (q - z)",
                            "qzeros store z itself, packed along the groups as qweight is along K (AWQ_GEMV_ZEROS), "
                            "padding columns zero", "high (structure)"))
    return True


#: compressed-tensors formats whose asymmetric integer weights are read (``config/base.py`` CompressionFormat):
#: pack-quantized (``PackedQuantizationCompressor``) and naive- / int-quantized (``NaiveQuantizationCompressor``)
CT_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized")
CT_WHERE = "config.json: quantization_config"
#: weight strategies read (compressed-tensors QuantizationStrategy values)
CT_STRATEGIES_READ = ("group", "channel", "tensor")


@dataclass(frozen=True)
class CtArgs:
    """One compressed-tensors weight scheme: its config group (or how it was inferred), format and weights args."""
    group: str
    fmt: str
    bits: int
    symmetric: bool
    strategy: str
    group_size: Optional[int]
    actorder: Optional[str] = None  # ct_actorder: 'group' (weight_g_idx stored), 'weight' or None

    def label(self) -> str:
        gs = f" {self.group_size}" if self.strategy == "group" else ""
        ao = f" actorder {self.actorder}" if self.actorder else ""
        return (f"{self.fmt} int{self.bits} {'symmetric' if self.symmetric else 'asymmetric'} "
                f"{self.strategy}{gs}{ao}")


def ct_actorder(value, where: str) -> Optional[str]:
    """A weights.actorder value as compressed-tensors 0.17's QuantizationArgs reads it (``validate_actorder`` and
    ``ActivationOrdering``'s aliases): true / 'group' / 'dynamic' -> 'group' (the inputs quantized in activation
    order, the groups cut from that order, ``weight_g_idx`` stored), 'weight' / 'static' -> 'weight' (the order
    only steers GPTQ; consecutive groups, no g_idx), false / null -> None; anything else an InspectError naming it."""
    if value is None or value is False:
        return None
    if value is True:
        return "group"
    v = value.lower() if isinstance(value, str) else value
    if v in ("group", "dynamic"):
        return "group"
    if v in ("weight", "static"):
        return "weight"
    raise InspectError(f"{where}.weights.actorder is {value!r}: expected 'group' / 'dynamic', 'weight' / 'static', "
                       f"true, false or null (compressed-tensors' ActivationOrdering)")


def _ct_args(name: str, g, top_fmt) -> Optional[tuple[list, CtArgs]]:
    """(targets, CtArgs) of one config group, QuantizationArgs' defaults where keys are absent (num_bits 8, type
    int, symmetric true; strategy from group_size: none -> tensor, > 0 -> group, -1 -> channel); None for a group
    without weights.  An InspectError naming the key for what the readers here do not cover."""
    where = f"{CT_WHERE}.config_groups.{name}"
    if not isinstance(g, dict):
        raise InspectError(f"{where} is {g!r}, expected a mapping (targets, weights, input_activations, ...)")
    w = g.get("weights")
    if w is None:
        return None
    if not isinstance(w, dict):
        raise InspectError(f"{where}.weights is {w!r}, expected a mapping (num_bits, type, symmetric, strategy, ...)")
    targets = g.get("targets") or []
    if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
        raise InspectError(f"{where}.targets is {targets!r}, expected a list of layer names, 're:' patterns or class "
                           f"names")
    fmt = g.get("format") or top_fmt
    if fmt not in CT_FORMATS:
        raise InspectError(f"{where}: format {fmt!r} (the group's 'format', else quantization_config.format): integer "
                           f"weights are read from {list(CT_FORMATS)} only")
    bits, typ, sym = w.get("num_bits", 8), w.get("type", "int"), w.get("symmetric", True)
    gs, strategy = w.get("group_size"), w.get("strategy")
    if strategy is None and (gs is None or isinstance(gs, int)):
        strategy = "tensor" if gs is None else "group" if gs > 0 else "channel" if gs == -1 else None
    if typ != "int":
        raise InspectError(f"{where}.weights.type is {typ!r}: only integer weights (type 'int') are read here "
                           f"(compressed-tensors' asymmetric zero points are int8 offsets of integer codes)")
    if not isinstance(sym, bool):
        raise InspectError(f"{where}.weights.symmetric is {sym!r}, expected true or false")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise InspectError(f"{where}.weights.num_bits is {bits!r}: expected 2..8 (pack_to_int32 packs 1-8 bits; vLLM's "
                           f"CompressedTensorsWNA16 takes 2-8)")
    if strategy not in CT_STRATEGIES_READ:
        raise InspectError(f"{where}.weights.strategy is {strategy!r} (group_size {gs!r}): only "
                           f"{list(CT_STRATEGIES_READ)} are read")
    if strategy == "group" and (isinstance(gs, bool) or not isinstance(gs, int) or gs < 1):
        raise InspectError(f"{where}.weights.group_size is {gs!r}: strategy 'group' needs a positive group_size")
    actorder = ct_actorder(w.get("actorder"), where)
    if actorder == "group" and strategy != "group":
        raise InspectError(f"{where}.weights.actorder is {w.get('actorder')!r} with strategy {strategy!r}: group "
                           f"activation ordering needs the group strategy (compressed-tensors' QuantizationArgs "
                           f"refuses it otherwise; no weight_g_idx to follow)")
    if w.get("dynamic") not in (None, False):
        raise InspectError(f"{where}.weights.dynamic is {w.get('dynamic')!r}: stored weights need static scales "
                           f"(dynamic false)")
    return list(targets), CtArgs(name, fmt, bits, sym, strategy, gs if strategy == "group" else None, actorder)


def _ct_target_match(name: str, target: str, cls: bool = False) -> bool:
    """vLLM's ``is_equal_or_regex_match`` (quantization/utils/config_utils.py): 're:' patterns with re.match, else
    equality with the layer name, or (``cls``, the class-name pass) containment in the class name 'Linear'."""
    import re

    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target.lower() in name.lower() if cls else target == name


def _ct_scheme_of(name: str, groups: list) -> Optional[CtArgs]:
    """The config group of layer ``name`` as vLLM's ``find_matched_target`` picks it: the first target (groups in
    order) equal to / matching the layer name, else the first matching its class name ('Linear')."""
    for pass_cls, value in ((False, name), (True, "Linear")):
        for targets, args in groups:
            if any(_ct_target_match(value, t, pass_cls) for t in targets):
                return args
    return None


def _ct_config_schemes(modules: list[Module], cfg: ModelConfig) -> Optional[dict]:
    """{module prefix: CtArgs} from a compressed-tensors quantization_config with at least one asymmetric weight
    group, or zero point tensors next to packed weights (else None: symmetric checkpoints keep the general search);
    an InspectError for a packed module that no group covers, one listed in ``ignore``, or fused parts under
    different schemes."""
    q = cfg.quantization or {}
    if str(q.get("quant_method") or "").lower() != "compressed-tensors":
        return None
    groups_cfg = q.get("config_groups") or {}
    if not isinstance(groups_cfg, dict):
        raise InspectError(f"{CT_WHERE}.config_groups is {type(groups_cfg).__name__}, expected a mapping")
    raw = {n: g for n, g in groups_cfg.items()}
    if not any(isinstance(g, dict) and isinstance(g.get("weights"), dict) and g["weights"].get("symmetric") is False
               for g in raw.values()) and not any(m.packed and m.zeros is not None for m in modules):
        return None  # symmetric without zero point tensors: the general search, as before
    top = q.get("format")
    groups = [a for a in (_ct_args(n, g, top if top != "mixed-precision" else None) for n, g in raw.items()) if a]
    ignore = q.get("ignore") or []
    out = {}
    for m in modules:
        if not m.packed:
            continue
        found = {}
        for hf, _ in m.parts:
            if any(_ct_target_match(hf, t) for t in ignore):
                raise InspectError(f"{m.where()}: {hf} is listed in quantization_config.ignore {ignore!r} (kept in "
                                   f"float), but its weight is stored as integers {m.weight.dtype} "
                                   f"{list(m.weight.shape)}")
            a = _ct_scheme_of(hf, groups)
            if a is None:
                raise InspectError(f"{m.where()}: no quantization_config.config_groups target matches {hf} "
                                   f"(targets {[t for ts, _ in groups for t in ts]}), but its weight is stored as "
                                   f"integers")
            found[hf] = a
        if len(set(found.values())) > 1:
            raise InspectError(f"{m.where()}: the fused parts {sorted(found)} fall under different config groups "
                               f"{sorted({a.group for a in found.values()})}: one stored tensor has one scheme")
        out[m.prefix] = next(iter(found.values()))
    return out


def _ct_shaped_args(m: Module, ckpt: Checkpoint) -> Optional[CtArgs]:
    """Without a quantization_config: compressed-tensors' pack-quantized names and shapes (``weight_packed`` int32
    [N, ceil(K*b/32)] at exactly one of b = 2 / 4 / 8, ``weight_shape``, ``weight_scale`` [N, G] / [N, 1] / [1] and
    a ``weight_zero_point``: int32 [ceil(N*b/32), G] packed, or int8 [N, G] / [1]; a ``weight_g_idx`` next to group
    scales: actorder 'group') give the scheme; None otherwise."""
    n, k = m.logical
    if not (m.weight.name.endswith(".weight_packed") and m.weight.dtype == "I32" and m.shape_t is not None
            and m.zeros is not None and m.scale is not None and len(m.weight.shape) == 2):
        return None
    fits = [b for b in (2, 4, 8) if tuple(m.weight.shape) == (n, -(-k // (32 // b)))]
    if len(fits) != 1:
        return None
    b = fits[0]
    s = tuple(m.scale.shape)
    if s in ((1,), (1, 1)) and m.scale.numel == 1:
        return CtArgs("(names and shapes)", "pack-quantized", b, False, "tensor", None)
    if len(s) != 2 or s[0] != n or k % s[1]:
        return None
    return (CtArgs("(names and shapes)", "pack-quantized", b, False, "channel", None) if s[1] == 1 else
            CtArgs("(names and shapes)", "pack-quantized", b, False, "group", k // s[1],
                   "group" if m.g_idx is not None else None))  # weight_g_idx: stored with actorder 'group' only


def _ct_check(m: Module, a: CtArgs, ckpt: Checkpoint) -> dict:
    """One module against compressed-tensors' layout for scheme ``a``: an InspectError naming the tensor and the
    shape it must have (weight, weight_shape, weight_scale, weight_zero_point), a missing zero point, NaN / Inf /
    zero scales, zero points outside the signed range.  Returns the module's settings (see detect_ct_asym)."""
    n, k = m.logical
    b, pf = a.bits, 32 // a.bits
    lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
    parts = [p for p, _ in m.parts]
    lay = f"compressed-tensors {a.label()} (config group {a.group}) stores the logical {n}x{k} matrix of {parts} as"
    for t in m.hqq_meta.values():
        raise InspectError(f"{t.file}: tensor {t.name!r} next to weight {m.weight.name!r} is not part of "
                           f"compressed-tensors' layout for {a.label()} (extra key)")
    if m.g_idx is not None and a.actorder != "group":
        raise InspectError(f"{m.g_idx.file}: tensor {m.g_idx.name!r} next to weight {m.weight.name!r} is not part of "
                           f"compressed-tensors' layout for {a.label()} (config group {a.group}): its compressors "
                           f"store weight_g_idx only with weights.actorder 'group' (extra key, or actorder should be "
                           f"'group')")
    if a.actorder == "group" and m.g_idx is None:
        raise InspectError(f"{m.where()}: weight_g_idx missing: config group {a.group} says weights.actorder 'group', "
                           f"so compressed-tensors stores {m.prefix + '.weight_g_idx'!r} int32 [K] = [{k}] (the group "
                           f"of each input) next to it; without it the groups of the stored scales are unknown")
    if a.strategy == "group" and k % a.group_size:
        raise InspectError(f"{m.where()}: K = {k} inputs for {parts} is not a multiple of group_size {a.group_size} "
                           f"(config group {a.group}; compressed-tensors' _process_group refuses such a weight)")
    g = k // a.group_size if a.strategy == "group" else 1
    packed = a.fmt == "pack-quantized"
    if packed:
        want = (n, -(-k // pf))
        if m.weight.dtype != "I32" or tuple(m.weight.shape) != want:
            raise InspectError(f"{m.where()}: {m.weight.dtype} {list(m.weight.shape)}, but {lay} weight_packed int32 "
                               f"[N, ceil(K/{pf})] = [{want[0]}, {want[1]}] (pack_to_int32: {pf} codes per int32)")
    elif m.weight.dtype != "I8" or tuple(m.weight.shape) != (n, k):
        raise InspectError(f"{m.where()}: {m.weight.dtype} {list(m.weight.shape)}, but {lay} weight int8 [N, K] = "
                           f"[{n}, {k}] (the codes q themselves)")
    if m.shape_t is not None:
        ws = ckpt.get(m.shape_t.name).tolist()
        if tuple(ws) != (n, k):
            raise InspectError(f"{m.shape_t.file}: tensor {m.shape_t.name!r} says logical shape {ws}, config.json "
                               f"implies {[n, k]} for {parts} (compressed-tensors' weight_shape: the unpacked [N, K])")
    if not packed:
        q = ckpt.get(m.weight.name)
        if q.numel() and (int(q.min()) < lo or int(q.max()) > hi):
            raise InspectError(f"{m.where()}: codes {int(q.min())}..{int(q.max())} outside the signed int{b} range "
                               f"[{lo}, {hi}] that compressed-tensors' quantize clamps to (num_bits {b})")
    want_s = {"group": (n, g), "channel": (n, 1), "tensor": (1,)}[a.strategy]
    if m.scale is None:
        raise InspectError(f"{m.where()}: weight_scale missing: no scale tensor next to it, but {lay} weight_scale "
                           f"{list(want_s)} ({m.prefix + '.weight_scale'!r})")
    if m.scale.dtype in INT_DTYPES or tuple(m.scale.shape) != want_s:
        raise InspectError(f"{m.scale.file}: tensor {m.scale.name!r} is {m.scale.dtype} {list(m.scale.shape)}, but "
                           f"{lay} weight_scale (float) {list(want_s)}")
    s = ckpt.get(m.scale.name).to(torch.float32).reshape(want_s[0], -1)
    _check_scale_values(m, s, ("output", "group"), "compressed-tensors",
                        "compressed-tensors' calculate_qparams replaces a zero scale by its dtype's eps")
    kw = {"group": dict(granularity="group", group_size=a.group_size), "channel": dict(granularity="channel"),
          "tensor": dict(granularity="tensor")}[a.strategy]
    act_order = False
    if a.actorder == "group":  # weight_g_idx: compressed-tensors' _process_group sorts the inputs by it
        try:
            gi = group_index(ckpt.get(m.g_idx.name), k, a.group_size, key=m.g_idx.name, name=str(m.g_idx.file))
        except FormatError as e:
            raise InspectError(f"{e} (config group {a.group}: {a.label()})") from None
        act_order = not torch.equal(gi, torch.arange(k) // a.group_size)
    out = dict(bits=b if packed else 8, codes=offset_table(b, 1 << (b - 1)) if packed else twos_complement_table(8),
               pad_code=0 if packed else None, fields=(pf if 32 % b else None) if packed else None, scale_kw=kw,
               zero_kw=None, zero_pack=None, generation=None, act_order=act_order)
    z = m.zeros
    if a.symmetric:
        if z is not None:
            raise InspectError(f"{z.file}: tensor {z.name!r} next to weight {m.weight.name!r}, but config group "
                               f"{a.group} is symmetric: compressed-tensors drops symmetric zero points "
                               f"(BaseCompressor._remove_symmetric_zp) (extra key, or symmetric should be false)")
        return out
    zpk = packed and a.strategy in CT_PACK_ZP_STRATEGIES
    want_p, want_u = (-(-n // pf), g), ((1,) if a.strategy == "tensor" else (n, g))
    expect = (f"weight_zero_point int32 [ceil(N/{pf}), G] = {list(want_p)} (compressed-tensors >= 0.9.4: z + "
              f"2^(b-1) packed along N) or int8 {list(want_u)} (<= 0.9.3: z unpacked)" if zpk else
              f"weight_zero_point int8 {list(want_u)} (z itself, never packed "
              + ("for strategy tensor)" if packed else f"by {a.fmt})"))
    if z is None:
        raise InspectError(f"{m.where()}: weight_zero_point missing: no zero point tensor next to it, but "
                           f"compressed-tensors {a.label()} (config group {a.group}: symmetric false) stores the "
                           f"logical {n}x{k} matrix of {parts} with {expect} ({m.prefix + '.weight_zero_point'!r}; "
                           f"W = (q - z) * s needs z)")
    if zpk and z.dtype == "I32" and tuple(z.shape) == want_p:
        out.update(zero_kw=kw, zero_pack=ct_zero_pack_spec(b), generation="packed")
        return out
    if z.dtype != "I8" or tuple(z.shape) != want_u:
        raise InspectError(f"{z.file}: tensor {z.name!r} is {z.dtype} {list(z.shape)}, but {lay} {expect}")
    zv = ckpt.get(z.name)
    if zv.numel() and (int(zv.min()) < lo or int(zv.max()) > hi):
        raise InspectError(f"{z.file}: zero points {z.name!r} hold {int(zv.min())}..{int(zv.max())}, outside the "
                           f"signed int{b} range [{lo}, {hi}] compressed-tensors' calculate_qparams clamps them to "
                           f"(unsigned z + {1 << (b - 1)} stored unpacked?)")
    out.update(zero_kw=kw, generation="legacy" if zpk else "unpacked")
    return out


def detect_ct_asym(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding]) -> bool:
    """compressed-tensors ``symmetric: false`` (read from compressed-tensors 0.17.0, and 0.9.3 / 0.9.4 for the zero
    point's two generations, not guessed).  ``PackedQuantizationCompressor.compress`` (``compressors/pack_quantized/
    base.py``) stores per module weight_packed int32 [N, ceil(K / (32/b))] (``pack_to_int32``: q + 2^(b-1), consecutive
    inputs low bits first: ``formats.ct_pack_spec``), weight_shape [N, K], weight_scale [N, K/G] / [N, 1] / [1] and,
    for group / channel strategies, weight_zero_point = ``pack_to_int32(z, b, packed_dim=0)``: int32 [ceil(N /
    (32/b)), G], z + 2^(b-1) packed along N (``formats.ct_zero_pack_spec``; since 0.9.4); compressed-tensors <= 0.9.3,
    a tensor strategy and naive- / int-quantized (weight int8 [N, K] = q) keep the int8 zero points z unpacked.
    The decompressor (``unpack_from_int32`` both, then ``dequantize``) reads W = (q - z) * s.  Taken when config.json
    names quant_method compressed-tensors with at least one ``symmetric: false`` weight group (each module's group
    as vLLM's find_matched_target picks it; symmetric groups of the same model are read alongside, without zero
    points), or, without a quantization_config, when every packed weight is a ``weight_packed`` with compressed-
    tensors' shapes and a zero point.  Each module is checked (``_ct_check``); values q - z, op multiply."""
    schemes = _ct_config_schemes(modules, cfg)
    packed = [m for m in modules if m.packed]
    if schemes is None:
        if cfg.quantization or not packed:
            return False
        inferred = {m.prefix: _ct_shaped_args(m, ckpt) for m in packed}
        if not all(inferred.values()):
            return False
        schemes, why, conf = inferred, ("no quantization_config: every packed weight is a weight_packed int32 [N, "
                                        "ceil(K*b/32)] with weight_shape, weight_scale and weight_zero_point "
                                        "(compressed-tensors' names and shapes)"), "medium (names and shapes)"
    else:
        why, conf = "config.json quantization_config (quant_method compressed-tensors, symmetric false)", "high (config)"
    gens: dict[str, int] = {}
    for m in packed:
        a = schemes[m.prefix]
        got = _ct_check(m, a, ckpt)
        m.bits, m.pack_axis, m.transposed = got["bits"], 1, False
        m.codes, m.pad_code, m.fields = got["codes"], got["pad_code"], got["fields"]
        m.scale_kw = [dict(got["scale_kw"])] * len(m.parts)
        m.zero_kw, m.zero_pack = got["zero_kw"], got["zero_pack"]
        m.act_order = got["act_order"]
        gens[got["generation"] or "none"] = gens.get(got["generation"] or "none", 0) + 1
    labels = sorted({schemes[m.prefix].label() for m in packed})
    findings.append(Finding(
        "block structure", f"compressed-tensors {'; '.join(labels)}: W = (q - z) * s",
        f"{why}; {len(packed)} packed weights checked against compressed-tensors' layout (pack_to_int32 codes q + "
        f"2^(b-1), consecutive inputs low bits first)", conf))
    say = {"packed": "int32, z + 2^(b-1) packed along N (compressed-tensors >= 0.9.4, pack_to_int32 packed_dim=0)",
           "legacy": "int8 z unpacked (compressed-tensors <= 0.9.3)",
           "unpacked": "int8 z unpacked (strategy tensor / naive-quantized: never packed)",
           "none": "none (symmetric groups)"}
    findings.append(Finding("zero point", "per-group / per-channel zero points (symmetric false): W = scale * (q - z)",
                            "; ".join(f"{n} modules: {say[g]}" for g, n in sorted(gens.items())), "high (structure)"))
    _act_order_finding(packed, findings, "config.json weights.actorder 'group': weight_g_idx int32 [K] next to each "
                                         "weight")
    return True


def _act_order_finding(modules: list[Module], findings: list[Finding], why: str) -> None:
    """The report's line for act-order group indices (Module.act_order), if any module has one."""
    perm = [m for m in modules if m.act_order]
    if not perm:
        return
    findings.append(Finding(
        "act-order", f"act-order g_idx, groups permuted ({len(perm)} modules): input k takes the scale / zero point "
        f"of group g_idx[k]", f"{why}; each a permutation of arange(K) // group_size (e.g. {perm[0].g_idx.name!r}); "
        f"{sum(1 for m in modules if m.g_idx is not None and not m.act_order)} trivial ones dropped",
        "high (structure)"))


def _refuse_stray_hqq_meta(modules: list[Module]) -> None:
    """HQQ meta tensors belong to an HQQ-packed W_q: next to any other weight they are extra keys."""
    for m in modules:
        if m.hqq_meta and m.group_view is None:
            st = next(iter(m.hqq_meta.values()))
            raise InspectError(f"{st.file}: tensor {st.name!r} next to weight {m.weight.name!r} is not a scale / zero "
                               f"point / g_idx / weight_shape / bias (extra key): an HQQ meta tensor, but "
                               f"{m.weight.name!r} ({m.weight.dtype} {list(m.weight.shape)}) is not HQQ-packed "
                               f"(expected a uint8 W_q with float scale and zero per group, HQQ 2-bit)")


#: quantization_config lists of modules a quantizer leaves in float, and how each loader matches a module name:
#: transformers' should_convert_module (re.match from the start or a suffix; AutoAWQ / vLLM's is_layer_skipped_awq:
#: a substring), compressed-tensors / vLLM's is_equal_or_regex_match (equality or 're:'), HQQ's skip_modules (a
#: substring, hqq's patch_linearlayers)
EXCLUSION_KEYS = ("modules_to_not_convert", "ignore", "skip_modules")


def _excluded_by(name: str, q: dict) -> Optional[tuple[str, str]]:
    """(config key, entry) of the first quantization_config exclusion entry that names module ``name``, else None."""
    import re

    for key in EXCLUSION_KEYS:
        pats = q.get(key)
        if not isinstance(pats, list):
            continue
        for p in pats:
            if not isinstance(p, str):
                continue
            if key == "ignore":
                hit = _ct_target_match(name, p)
            elif key == "skip_modules" or q.get("quant_method") == "awq":
                hit = p in name
            else:
                try:
                    hit = re.match(p, name) is not None or name.endswith(p)
                except re.error:
                    hit = name.endswith(p)
            if hit:
                return key, p
    return None


def _ct_targeted(name: str, q: dict) -> bool:
    """Whether a compressed-tensors config group with weights targets layer ``name`` (by name / 're:', or the class
    'Linear'), as vLLM's find_matched_target would."""
    groups = q.get("config_groups")
    for g in (groups.values() if isinstance(groups, dict) else ()):
        targets = g.get("targets") if isinstance(g, dict) and g.get("weights") else None
        if isinstance(targets, list) and any(isinstance(t, str) and (_ct_target_match(name, t)
                                                                     or _ct_target_match("Linear", t, True))
                                             for t in targets):
            return True
    return False


def _config_exclusion_finding(modules: list[Module], kept: list[Module], cfg: ModelConfig,
                              findings: list[Finding]) -> None:
    """Where quantization_config's exclusion list (``EXCLUSION_KEYS``) and the tensors disagree - a module the list
    keeps in float stored quantized, or a float module that a list exists for but does not name - the inspector
    follows the tensors (they are what decodes); the disagreement is a finding, as the quantizer's own loader (and
    vLLM's) would build the other layer and fail or misread it."""
    q = cfg.quantization or {}
    if not any(isinstance(q.get(k), list) for k in EXCLUSION_KEYS):
        return
    quantized, floated = [], []
    for m in modules:
        if m.role == "lm_head":  # the head has its own rules (transformers' default skips; a finding of its own)
            continue
        for hf, _ in m.parts:
            hit = _excluded_by(hf, q)
            if m in kept and hit is None:
                if q.get("quant_method") == "compressed-tensors" and not _ct_targeted(hf, q):
                    continue  # only what a config group with weights targets is quantized
                floated.append(f"{hf} ({m.weight.name!r} {m.weight.dtype})")
            elif m not in kept and hit is not None:
                quantized.append(f"{hf} ({m.weight.name!r} {m.weight.dtype} {list(m.weight.shape)}; "
                                 f"{hit[0]} entry {hit[1]!r})")
    if not (quantized or floated):
        return
    lists = "; ".join(f"{k} {q[k]!r}" for k in EXCLUSION_KEYS if isinstance(q.get(k), list))
    parts = []
    if quantized:
        parts.append(f"listed as kept in float but stored quantized (decoded as stored): "
                     + ", ".join(quantized[:4]) + (f" and {len(quantized) - 4} more" if len(quantized) > 4 else ""))
    if floated:
        parts.append(f"stored as plain float, which the list would quantize (kept in float): "
                     + ", ".join(floated[:4]) + (f" and {len(floated) - 4} more" if len(floated) > 4 else ""))
    findings.append(Finding(
        "config vs tensors", "the tensors followed, not quantization_config's exclusion list",
        f"config.json quantization_config {lists}; " + "; ".join(parts) + ". The quantizer's own loader (and vLLM's "
        f"method for it) builds layers from the list and would fail on or misread these tensors; the spec written "
        f"here reads them as stored", "medium (config contradicted)"))


def infer_structure(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding],
                    one_block: Optional[bool] = None) -> Optional[str]:
    """Per-module structure; returns the named convention found by its block structure
    ('awq', 'ct_asym', 'tq2_0', 'tq1_0', 'hqq') or None.  ``one_block``: choose_bits' reading of a width the
    shapes leave open."""
    _hqq_float_views(modules, ckpt)  # an HQQ view_as_float W_q: its integer view from here on
    for name, detect in (("sign_masks", detect_sign_masks), ("awq", detect_awq), ("ct_asym", detect_ct_asym),
                         ("tq2_0", detect_tq2_0), ("tq1_0", detect_tq1_0), ("hqq", detect_hqq)):
        if not detect(modules, cfg, ckpt, findings):
            continue
        _refuse_stray_hqq_meta(modules)
        for m in modules:
            if not m.packed and tuple(m.weight.shape) != tuple(m.logical):
                raise InspectError(f"{m.where()}: shape {list(m.weight.shape)}, config.json implies "
                                   f"{list(m.logical)} for {[p for p, _ in m.parts]} (unpacked float weight)")
            if not m.packed:
                _scale_layout(m, ckpt)
        return name
    _refuse_stray_hqq_meta(modules)
    return _infer_plain(modules, cfg, ckpt, findings, one_block)


def _infer_plain(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding],
                 one_block: Optional[bool] = None) -> None:
    if not _detect_base3(modules, ckpt, findings):  # five trits per byte: bits 2 and codec 'base3'
        choose_bits(modules, cfg, findings, one_block)  # sets m.bits (one width, or one per module when mixed)
    votes: dict[tuple, int] = {}
    opts_of = {}
    for m in modules:
        st = m.weight
        if not m.packed:
            if tuple(st.shape) != tuple(m.logical):
                raise InspectError(f"{m.where()}: shape {list(st.shape)}, config.json implies "
                                   f"{list(m.logical)} for {[p for p, _ in m.parts]} (unpacked float weight)")
            continue
        if st.dtype not in CONTAINER_OF:
            raise InspectError(f"{m.where()}: container dtype {st.dtype} is not supported "
                               f"(supported: {sorted(CONTAINER_OF)})")
        cbits = INT_DTYPES[st.dtype]
        if m.shape_t is not None:
            ws = ckpt.get(m.shape_t.name).tolist()
            if tuple(ws) != tuple(m.logical):
                raise InspectError(f"{m.shape_t.file}: tensor {m.shape_t.name!r} says logical shape {ws}, "
                                   f"config.json implies {list(m.logical)}")
        bits = m.bits
        if m.codec == "base3":
            opts_of[m.prefix] = opts = base3_layouts(tuple(st.shape), m.logical, _part_rows(m))
            if len(opts) == 1:
                votes[opts[0]] = votes.get(opts[0], 0) + 1
            continue
        if cbits % bits:  # no whole number of codes per container: AutoGPTQ's 3-bit bit stream
            if cbits != 32:
                raise InspectError(f"{m.where()}: {bits}-bit codes in {st.dtype}: {bits}-bit weights are read as "
                                   f"AutoGPTQ's bit stream in int32 qweights only (expected dtype I32)")
            m.codec = "bitstream"
        opts = layout_options(tuple(st.shape), m.logical, cbits, bits, _part_rows(m), one_block=m.one_block)
        if cbits == bits:  # one value per element: no pack axis, only (maybe) transposed storage
            opts = sorted({(t, 1) for t, _ in opts})
        if not opts and m.codec == "bitstream":
            n, k = m.logical
            raise InspectError(
                f"{m.where()}: shape {list(st.shape)} {st.dtype} cannot hold the logical {n}x{k} matrix that "
                f"config.json implies for {[p for p, _ in m.parts]} as AutoGPTQ's {bits}-bit qweight: expected "
                f"[K/32*{bits}, N] = [{-(-k // 32) * bits}, {n}] (32 inputs per {bits} int32 rows)")
        if not opts:
            n, k = m.logical
            v = cbits // bits
            div = "" if n % v == 0 and k % v == 0 else (f" (note: {'K' if k % v else 'N'}="
                                                         f"{k if k % v else n} is not divisible by {v})")
            if st.name.endswith(".weight_packed") and not (cfg.quantization or {}).get("config_groups"):
                # compressed-tensors' name, but no config_groups to give num_bits: the width above was a guess
                div += (f"; {st.name.rsplit('.', 1)[-1]} is compressed-tensors' packed weight, and without a "
                        f"quantization_config (config_groups ... weights.num_bits) its width is guessed from the "
                        f"codes and shapes, which covers 2 / 4 / 8-bit only: add the quantization_config that "
                        f"compressed-tensors wrote (e.g. num_bits 3 / 5 / 6 / 7)")
            shp = tuple(st.shape)
            if shp in ((n, k), (k, n)):
                div += (f"; the shape is the logical matrix itself: one value per {CONTAINER_OF[st.dtype]} "
                        f"(unpacked integer weights are read from int8 / uint8 containers only: store them as int8)")
            elif cbits == 8 and shp in ((n, -(-k // 5)), (-(-n // 5), k), (-(-k // 5), n), (k, -(-n // 5))):
                div += ("; 5 values per byte fits base-3 packing (3^5 = 243 <= 256, trits as digits of a byte), "
                        "read as such (PackSpec codec 'base3') where most packed weights of the model fit only it, "
                        "which is not the case here")
            raise InspectError(
                f"{m.where()}: shape {list(st.shape)} {st.dtype} cannot hold the logical {n}x{k} matrix that "
                f"config.json implies for {[p for p, _ in m.parts]} at {v} {bits}-bit values per "
                f"{CONTAINER_OF[st.dtype]}: expected [{n}, {-(-k // v)}] or [{-(-n // v)}, {k}] (or transposed)"
                f"{div}")
        opts_of[m.prefix] = opts
        if len(opts) == 1:
            votes[opts[0]] = votes.get(opts[0], 0) + 1
    for m in modules:
        if not m.packed:
            continue
        opts = opts_of[m.prefix]
        best = max(opts, key=lambda o: (votes.get(o, 0), o == (False, 1)))
        m.transposed, m.pack_axis = best
        if m.codec == "bitstream":  # scan's field histograms cover whole-container fields only: count the stream
            _stream_hist(m, ckpt)
        if m.codec == "base3":  # scan counted 2-bit fields: count the trits
            _base3_hist(m, ckpt)
    _check_stream_k(modules, findings)
    if opts_of:
        amb = sum(len(o) > 1 for o in opts_of.values())
        chosen = {(m.transposed, m.pack_axis) for m in modules if m.packed}
        conf = "high" if votes and len(chosen) == 1 else ("low" if not votes else "medium")
        findings.append(Finding(
            "pack axis / transposed storage",
            ", ".join(f"pack_axis={a}{' transposed' if t else ''}" for t, a in sorted(chosen)),
            f"{len(opts_of) - amb} modules fit a single layout "
            f"{ {('axis%d' % a) + ('T' if t else ''): n for (t, a), n in votes.items()} }; "
            f"{amb} shape-ambiguous (square) modules follow them", conf))
    hint = _config_group_size(cfg)
    for m in modules:
        _scale_layout(m, ckpt, hint)
    if hint is None:
        _group_size_consensus(modules, findings)


def _group_fits(k: int, g: int) -> list[int]:
    """Every group size that cuts K inputs into g groups (the last one shorter where it does not divide K)."""
    return [gs for gs in range(1, k + 1) if -(-k // gs) == g]


def _group_size_options(shapes) -> list[int]:
    """The group sizes worth scoring for grouped scales of ``shapes`` [(K, G)], the prior first: of the sizes that cut
    every K into its G groups (``_group_fits``), the exact divisor (K / G for every K), then the power of two (its
    last group shorter); neither: the smallest size that fits.  [] where no size fits every (K, G).
    The exact divisor comes first because that is what writers store: AutoAWQ and compressed-tensors assert
    K % group_size == 0, HQQ's axis=1 view needs it, and the usual sizes (32 / 64 / 128) divide real Ks, where the
    divisor *is* the power of two; only AutoGPTQ / GPTQModel write a shorter last group (ceil(K / group_size)
    groups), and they write config.json's group_size too, which ``_scale_layout`` takes before any prior.  The two
    disagree only for a size that is no power of two (K = 384 in 2 groups of 192, read as 256 before) or a padded
    one without its config; the loss decides between them where it can (``_group_size_search``)."""
    fits = None
    for k, g in shapes:
        f = set(_group_fits(k, g))
        fits = f if fits is None else fits & f
    order = sorted(fits or ())
    div = [gs for gs in order if all(k % gs == 0 for k, _ in shapes)]
    pow2 = [gs for gs in order if gs & (gs - 1) == 0]
    return list(dict.fromkeys(div + pow2)) or order[:1]


def _group_size_consensus(modules: list, findings: list) -> None:
    """One group size for the whole model: each module's [N, G] scale fits a range of sizes (G = ceil(K / size)), and a
    module with a short K fits more of them (K = 128 in 2 groups: 64 ... 127), so its own first pick may differ from
    what the others allow (a true size 96 read as 64 there, its effective weights off by ~30% on inputs 64 - 95).
    The sizes every grouped module allows are intersected; ``_group_size_options`` picks among them (an exact divisor
    of every K, then a power of two) and leaves the others it names (``Module.group_sizes``) to the loss."""
    grouped = [m for m in modules if m.scale_kw and m.scale_kw[0] and m.scale_kw[0].get("granularity") == "group"]
    if len(grouped) < 2:
        return
    shapes = [(m.logical[1], -(-m.logical[1] // m.scale_kw[0]["group_size"])) for m in grouped]
    fits = set.intersection(*(set(_group_fits(k, g)) for k, g in shapes))
    picks = {m.scale_kw[0]["group_size"] for m in grouped}
    if not fits:
        for m in grouped:
            m.group_sizes = ()
        findings.append(Finding("scale group size", ", ".join(map(str, sorted(picks))),
                                "no single group size fits every module's scale shape: each module keeps its own",
                                "low"))
        return
    order = sorted(fits)
    opts = _group_size_options(shapes)
    gs = opts[0]
    for m in grouped:
        m.scale_kw = [dict(kw, group_size=gs) for kw in m.scale_kw]
        m.group_sizes = tuple(opts)
    span = f"{order[0]}" if len(order) == 1 else f"{order[0]}..{order[-1]} ({len(order)} sizes)"
    findings.append(Finding("scale group size", str(gs),
                            f"the sizes every one of {len(grouped)} grouped scales allows (G = ceil(K / size)): {span}"
                            + ("" if len(order) == 1 else "; an exact divisor of every K, then a power of two, "
                               "preferred" + (f" ({' / '.join(map(str, opts))} to score by loss)" if len(opts) > 1
                                              else ""))
                            + (f"; modules alone would have picked {sorted(picks)}" if picks != {gs} else ""),
                            "high" if len(order) == 1 else "low (prior)"))


def _config_group_size(cfg: ModelConfig) -> Optional[int]:
    """quantization_config.group_size of a GPTQ config (AutoGPTQ / GPTQModel: G = ceil(K / group_size) groups, the
    last one shorter where group_size does not divide K), a positive integer, else None."""
    q = cfg.quantization or {}
    if str(q.get("quant_method") or "").lower() != "gptq":
        return None
    try:
        gs = int(q.get("group_size"))
    except (TypeError, ValueError):
        return None
    return gs if gs > 0 else None


def _stream_hist(m: Module, ckpt: Checkpoint) -> None:
    """``field_hist[bits]`` of a bit-stream weight: the counts of its logical codes (no padding counted)."""
    spec = PackSpec(bits=m.bits, container=CONTAINER_OF[m.weight.dtype], pack_axis=m.pack_axis,
                    codes=tuple(range(1 << m.bits)), transposed=m.transposed, codec="bitstream")
    codes = unpack_codes(ckpt.get(m.weight.name), spec, m.logical)
    m.weight.field_hist[m.bits] = torch.bincount(codes.reshape(-1), minlength=1 << m.bits).tolist()


def _scale_layout(m: Module, ckpt: Checkpoint, hint: Optional[int] = None) -> None:
    """The granularity of ``m``'s scale from its shape; ``hint``: config.json's group size, taken where it gives the
    stored number of groups (G groups of K fit a range of sizes when the last group is shorter)."""
    n, k = m.logical
    m.scale_kw = [None] * len(m.parts)
    if m.scale is None:
        return
    s = ckpt.get(m.scale.name).to(torch.float32)
    where = f"{m.scale.file}: scale tensor {m.scale.name!r}"
    bad = (~torch.isfinite(s)).sum()
    if bad:
        raise InspectError(f"{where} has {int(bad)} NaN/Inf values (expected finite scales for {m.weight.name!r})")
    zeros = int((s == 0).sum())
    if zeros:
        raise InspectError(f"{where} has {zeros} zero values: a zero scale erases the output (multiply) or "
                           f"divides by zero (divide); expected non-zero scales for {m.weight.name!r}")
    shape = tuple(m.scale.shape)
    numel = m.scale.numel
    kw: list
    if numel == 1:
        kw = [dict(granularity="tensor")] * len(m.parts)
    elif len(m.parts) > 1 and numel == len(m.parts):
        kw = [dict(granularity="tensor", index=i) for i in range(len(m.parts))]
    elif numel == n and (len(shape) == 1 or shape[-1] == 1 or shape[0] == 1):
        kw = [dict(granularity="channel")] * len(m.parts)
    elif len(shape) == 2 and (shape[0] == n or shape[1] == n):
        tr = shape[0] != n
        g = shape[0] if tr else shape[1]
        opts = [hint] if hint and -(-k // hint) == g else _group_size_options([(k, g)])
        if not opts:
            raise InspectError(f"{where}: shape {list(shape)} gives {g} groups, no group size splits K={k} into {g}")
        m.group_sizes = tuple(opts)
        kw = [dict(granularity="group", group_size=opts[0], transposed=tr)] * len(m.parts)
    else:
        raise InspectError(f"{where}: shape {list(shape)} fits none of per-tensor [1], per-sub-matrix "
                           f"[{len(m.parts)}], per-channel [{n}] or per-group [{n}, G] / [G, {n}] for the "
                           f"logical {n}x{k} weight {m.weight.name!r}")
    m.scale_kw = kw


#: ``check_zero_points``' answer for per-group (asymmetric) zero points: values = q - z, identity code table
ASYMMETRIC = "asymmetric"


def _ct_actorders(q: dict) -> list:
    """[(targets, ('actorder', value))] of a compressed-tensors quantization_config's groups with weights, for
    ``_ct_scheme_of`` (the value ``ct_actorder`` normalises: 'group', 'weight' or None)."""
    groups = q.get("config_groups") or {}
    out = []
    for name, g in (groups.items() if isinstance(groups, dict) else ()):
        w = g.get("weights") if isinstance(g, dict) else None
        if isinstance(w, dict):
            where = f"{CT_WHERE}.config_groups.{name}"
            out.append((list(g.get("targets") or []), ("actorder", ct_actorder(w.get("actorder"), where))))
    return out


def _act_order_why(q: dict, method: str) -> str:
    """The evidence line of the act-order finding for a config (check_zero_points)."""
    if method == "gptq":
        return (f"config.json desc_act {q.get('desc_act')!r}, static_groups {q.get('static_groups', False)!r} "
                f"(AutoGPTQ / GPTQModel: groups cut from the inputs in activation order)")
    if method == "compressed-tensors":
        return "config.json weights.actorder 'group': weight_g_idx int32 [K] next to each weight"
    return "no quantization_config: read from the g_idx tensors alone"


def _declared_act_order(m: Module, q: dict, method: str, ct_orders: list) -> tuple[bool, str]:
    """(whether config.json declares act-order groups for module ``m``, the config key that says so): GPTQ
    quantization_config.desc_act (AutoGPTQ / GPTQModel), or the weights.actorder of the compressed-tensors config
    group that matches each of its parts (as vLLM's find_matched_target picks it)."""
    if method == "gptq":
        return bool(q.get("desc_act")), f"quantization_config.desc_act {q.get('desc_act')!r}"
    if method == "compressed-tensors":
        found = {_ct_scheme_of(hf, ct_orders) for hf, _ in m.parts}
        vals = {f[1] if f else None for f in found}
        val = next(iter(vals)) if len(vals) == 1 else None
        return val == "group", (f"weights.actorder {val!r} in the config group of {m.parts[0][0]}" if len(vals) == 1
                                else f"different weights.actorder for the fused parts {[p for p, _ in m.parts]}")
    return False, f"quantization_config.quant_method {method!r}, which writes no act-order index"


def _index_group_size(g_idx: torch.Tensor, k: int, gs: Optional[int]) -> Optional[int]:
    """The group size a group index's own counts give (its largest group) where it differs from ``gs`` (inferred
    from the scales' G groups) yet yields the same G and a valid index (``formats.group_index``), else None."""
    if gs is None or g_idx.dtype.is_floating_point or g_idx.dtype == torch.bool or tuple(g_idx.shape) != (k,):
        return None
    gi = g_idx.detach().to(torch.int64).cpu()
    if bool((gi < 0).any()):
        return None
    alt = int(torch.bincount(gi).max())
    if alt == gs or -(-k // alt) != -(-k // gs):
        return None
    try:
        group_index(gi, k, alt)
    except FormatError:
        return None
    return alt


def check_zero_points(modules: list[Module], ckpt: Checkpoint, findings: list[Finding],
                      cfg: Optional[ModelConfig] = None):
    """GPTQ-style qzeros / g_idx.  One constant zero point (symmetric, ``sym=True``): folded into the code
    table; returns the zero *code* implied (v1 stores z - 1) or None without zero points.  Zero points that
    differ between groups (``sym=False``): every module's become per-group zero points (``Module.zero_kw``,
    packed qzeros unpacked through ``Module.zero_pack``, whose code table adds v1's 1 back) and the answer is
    ``ASYMMETRIC`` (the weight codes then decode to q itself).  A g_idx (GPTQ, or compressed-tensors'
    weight_g_idx of a symmetric group) is checked (``formats.group_index``: int [K], values in [0, G), a
    permutation of arange(K) // group_size): the trivial one is dropped, another is an act-order group index
    (``Module.act_order``) where the config says so (GPTQ desc_act true, compressed-tensors actorder 'group', or no
    quantization_config), an InspectError naming the key otherwise; a module without g_idx where the config says
    act-order is an error too."""
    q = (cfg.quantization or {}) if cfg is not None else {}
    v2 = str(q.get("checkpoint_format", "")).lower() == "gptq_v2"
    method = str(q.get("quant_method") or "").lower()
    ct_orders = _ct_actorders(q) if method == "compressed-tensors" else []
    zs, per = set(), {}
    for m in modules:
        gs = next((kw["group_size"] for kw in m.scale_kw if kw and kw.get("granularity") == "group"), None)
        k = m.logical[1]
        order, order_key = _declared_act_order(m, q, method, ct_orders)
        if m.g_idx is not None:
            # no group scales (per-channel / per-tensor, e.g. GPTQ group_size -1, or one group as wide as K):
            # the whole row is group 0, and the trivial g_idx is all zeros
            if m.g_idx.numel != k:
                raise InspectError(f"{m.g_idx.file}: tensor {m.g_idx.name!r} has {m.g_idx.numel} elements, expected "
                                   f"one per input: K = {k}")
            raw_gi = ckpt.get(m.g_idx.name)
            try:
                gi = group_index(raw_gi, k, gs or k, key=m.g_idx.name, name=str(m.g_idx.file))
            except FormatError as e:
                alt = _index_group_size(raw_gi, k, gs)
                if alt is None:
                    raise InspectError(f"{e} (the group index of {m.weight.name!r}, group_size {gs or k} from its "
                                       f"scales)") from None
                # G groups of K fit several sizes when the last group is shorter (K = 128, group_size 96: 2 groups,
                # as 64 gives): the index's own group sizes tell which
                gi = group_index(raw_gi, k, alt, key=m.g_idx.name, name=str(m.g_idx.file))
                gs = alt
                m.scale_kw = [dict(kw, group_size=alt) if kw and kw.get("granularity") == "group" else kw
                              for kw in m.scale_kw]
            m.act_order = not torch.equal(gi, torch.arange(k) // (gs or k))
            if m.act_order and method and not order:
                fix = "desc_act: true" if method == "gptq" else "weights.actorder: 'group'"
                raise InspectError(f"{m.g_idx.file}: tensor {m.g_idx.name!r} permutes the inputs into groups (an "
                                   f"act-order group index, not arange(K) // {gs}), but config.json says "
                                   f"{order_key}: readers that follow the config take consecutive groups; fix the "
                                   f"config ({fix}) or the tensor")
        elif m.packed and order and gs is not None:
            raise InspectError(f"{m.where()}: no g_idx next to it, but config.json says {order_key}: the stored "
                               f"scales are those of act-order groups, and without {m.prefix}.g_idx (the group of "
                               f"each input; compressed-tensors: weight_g_idx) they cannot be placed")
        if m.zeros is not None:
            raw = ckpt.get(m.zeros.name)
            n, k = m.logical
            g = -(-k // (gs or k))
            if raw.dtype.is_floating_point:
                vals = set(torch.unique(raw.float()).tolist())
                if tuple(raw.shape) not in ((g, n), (n, g)):
                    raise InspectError(f"{m.zeros.file}: zero points {m.zeros.name!r} have shape {list(raw.shape)}, "
                                       f"expected [{g}, {n}] (groups x outputs) or [{n}, {g}]")
                per[m.prefix] = (None, tuple(raw.shape) == (g, n) and (g, n) != (n, g), gs or k)
            else:  # packed like GPTQ: b-bit fields along N, low bits first -> logical (G, N)
                zb = int(q.get("bits") or 0) if q.get("quant_method") == "gptq" else 0
                zb = zb if zb in (2, 3, 4, 8) else (m.bits if m.bits < 8 or INT_DTYPES[m.weight.dtype] > 8 else 2)
                zc = CONTAINER_OF.get(m.zeros.dtype, "int32")  # 3-bit: AutoGPTQ's bit stream along N, as qweight's
                zspec = PackSpec(bits=zb, container=zc, pack_axis=1, codes=tuple(range(1 << zb)),
                                 codec="bitstream" if INT_DTYPES[m.zeros.dtype] % zb else None)
                try:
                    vals = set(torch.unique(unpack_codes(raw, zspec, (raw.shape[0], n))).tolist())
                except FormatError as e:
                    why = (f"; quantization_config.bits says {zb}, but the weight {m.weight.name!r} reads as "
                           f"{m.bits}-bit codes: is config.json's bits right?" if zb != m.bits else "")
                    raise InspectError(f"{m.zeros.file}: zero points {m.zeros.name!r}: {e} (expected {zb}-bit fields "
                                       f"packed along the {n} output channels{why})") from None
                if raw.shape[0] != g:
                    raise InspectError(f"{m.zeros.file}: zero points {m.zeros.name!r} have {raw.shape[0]} rows, "
                                       f"expected one per group: {g} (K={k}, group_size={gs or k})")
                per[m.prefix] = (zspec if v2 else zspec.replace(codes=tuple(range(1, (1 << zb) + 1))), True, gs or k)
            zs |= {(v, len(vals) > 1) for v in vals}
    if not zs:
        _act_order_finding(modules, findings, _act_order_why(q, method))
        return None
    values = {v for v, _ in zs}
    floating = any(zpk is None for zpk, _, _ in per.values())
    zb = next((zpk.bits for zpk, _, _ in per.values() if zpk is not None), 0)
    const = int(next(iter(values))) + (0 if floating or v2 else 1) if len(values) == 1 else None
    # sym=False: zero points that differ between groups or between modules, or one constant that is no code (v1's
    # stored 2^b - 1 for z = 0 reads back as z = 2^b): per-group zero points, values q - z exactly as stored
    if any(many for _, many in zs) or len(values) > 1 or (zb and not 0 <= const < (1 << zb)):
        missing = [m for m in modules if m.packed and m.prefix not in per]
        if missing:
            m = missing[0]
            raise InspectError(f"{m.where()}: no zero point tensor next to it, but {len(per)} other modules carry "
                               f"per-group zero points (e.g. {next(iter(per))}): expected "
                               f"{m.prefix + '.qzeros'!r} (W = scale * (q - z) needs z for every module)")
        for m in modules:
            if m.prefix in per:
                zpk, transposed, gs = per[m.prefix]
                m.zero_kw = dict(granularity="group", group_size=gs, **({"transposed": True} if transposed else {}))
                m.zero_pack = zpk
        _act_order_finding(modules, findings, _act_order_why(q, method))
        findings.append(Finding(
            "zero point", "per-group zero points (asymmetric, GPTQ sym=False): W = scale * (q - z)",
            f"{len(per)} zero point tensors take {len(values)} distinct stored values ({sorted(values)[:6]}"
            f"{' ...' if len(values) > 6 else ''}); "
            + ("float zero points store z" if floating else "checkpoint_format gptq_v2: qzeros store z" if v2
               else "GPTQ v1 qzeros store z - 1"), "high"))
        return ASYMMETRIC
    _act_order_finding(modules, findings, _act_order_why(q, method))
    z = int(next(iter(values)))
    if floating or v2:  # the zero point itself
        why = "float zero points" if floating else "config checkpoint_format gptq_v2"
        findings.append(Finding("zero point", f"constant stored zero {z} -> zero code {z} ({why} store z)",
                                "every zero point holds the same value", "high"))
        return z
    findings.append(Finding("zero point", f"constant stored zero {z} -> zero code {z + 1} (GPTQ v1 stores z-1)",
                            "every qzeros field holds the same value", "high"))
    return z + 1


# ---------------------------------------------------------------------------------------
# code table


def _signed(code: int, bits: int) -> int:
    return code - (1 << bits) if code >= 1 << (bits - 1) else code


def _sign_magnitude(code: int, bits: int, sign_high: bool = True) -> int:
    """Value of a ``bits``-bit sign-magnitude code: the sign in the top (``sign_high``) or the
    lowest bit, the magnitude in the others (so the two zeros, +0 and -0, both decode to 0)."""
    if sign_high:
        neg, mag = code >> (bits - 1), code & ((1 << (bits - 1)) - 1)
    else:
        neg, mag = code & 1, code >> 1
    return -mag if neg else mag


def code_candidates(modules: list[Module], zero_hint: Optional[int], findings: list[Finding],
                    cfg: Optional[ModelConfig] = None, widen: bool = False) -> list[tuple]:
    """Code tables to score.  Three used codes: ternary (the +-1 pair = the two codes with the
    closest counts, the third is 0; every other code unused).  More: symmetric low-bit integers
    (int2 {-2..1}, int4 {-8..7}, ...) as offset binary (v + 2^(b-1), the zero point's or the most
    frequent code as zero) or two's complement; every code decodes."""
    packed = [m for m in modules if m.packed]
    if not packed:
        return []
    bits = packed[0].bits
    ncodes = 1 << bits
    hist = [0] * ncodes
    for m in packed:
        for c, n in enumerate(m.weight.hist(bits)):
            hist[c] += n
    total = sum(hist)
    shares = ", ".join(f"code {c}: {hist[c] / total:.1%}" for c in range(ncodes) if hist[c])
    # padding slots (fused to whole containers) may hold any code: a code is significant beyond them
    total_pads = sum(_pads(m) for m in packed)
    significant = [c for c in range(ncodes) if hist[c] > 0.002 * total + total_pads]
    if len(significant) > 3:
        return _integer_tables(hist, bits, significant, zero_hint, findings, shares)
    def split(counts):
        used = sorted(sorted(range(ncodes), key=lambda c: -counts[c])[:3])
        unused = [c for c in range(ncodes) if c not in used]
        # modules where an "unused" code occurs beyond their padding slots
        return used, unused, [m for m in packed if sum(m.weight.hist(bits)[c] for c in unused) > _pads(m)]

    used, unused, stray = split(hist)
    if stray and total_pads:
        # heavy padding (a small K padded to whole containers: hidden 20 in 32 slots) can make the pad code
        # (0 where containers are zero-filled) outnumber a real one; a pad code whose count the padding
        # slots explain is taken out before ranking, where that leaves no stray code in any module
        for p in sorted(range(ncodes), key=lambda c: abs(hist[c] - total_pads)):
            if hist[p] < total_pads // 2:
                break
            adj = [max(0, n - total_pads) if c == p else n for c, n in enumerate(hist)]
            u2, un2, st2 = split(adj)
            if not st2:
                used, unused, stray = u2, un2, st2
                findings.append(Finding("code table: padding", f"code {p} fills the padding slots",
                                        f"{hist[p]} fields hold code {p}, {total_pads} are padding slots "
                                        f"(containers filled past K); ranked without them", "high"))
                break
    qm = ((cfg.quantization or {}) if cfg is not None else {}).get("quant_method")
    if stray and qm != "bitnet" and len(stray) >= max(2, len(packed) / 2):
        # a rare extreme level in most tensors (symmetric int2 puts -2 only where w/s rounds to -1.5):
        # integer levels, not corruption (one corrupted tensor is an error below)
        return _integer_tables(hist, bits, [c for c in range(ncodes) if hist[c]], zero_hint, findings, shares)
    for m in stray[:1]:
        mh = m.weight.hist(bits)
        worst = max(unused, key=lambda c: mh[c])
        pads = _pads(m)
        raise InspectError(f"{m.where()}: code {worst} occurs {mh[worst]} times, but it is unused in the model "
                           f"(global counts {_short_hist(hist)}) and this tensor has only {pads} padding slots: "
                           f"expected 0 occurrences (corrupted weights or not ternary)")

    def asym(z):
        a, b = [c for c in used if c != z]
        return abs(hist[a] - hist[b]) / max(1, hist[a] + hist[b])

    ranked = sorted(used, key=asym)
    if zero_hint is not None and zero_hint in used:
        zeros, why, conf = [zero_hint], f"zero point says code {zero_hint}; count asymmetry ranks {ranked}", "high"
    else:
        # sampling noise of an asymmetry over n fields is ~1/sqrt(n): a small (or untrained, evenly
        # split) model can rank a wrong zero first by chance, so every zero code within 4 sigma of the
        # best stays a candidate (scored by loss; without loss the prior decides and says so)
        def noise(z):
            a, b = [c for c in used if c != z]
            return 4.0 / math.sqrt(max(1, hist[a] + hist[b]))

        clear = asym(ranked[1]) > 3 * asym(ranked[0]) + 0.01 and \
            asym(ranked[1]) - asym(ranked[0]) > noise(ranked[0]) + noise(ranked[1])
        zeros = ranked[:1] if clear else [z for z in ranked if z in ranked[:2] or
                                          asym(z) - asym(ranked[0]) <= noise(ranked[0]) + noise(z)]
        if widen:  # the counts' choice gave no working model (inspect's retry): every used code as the zero
            zeros = ranked
        why = (f"the other two codes have the closest counts (asymmetry {asym(ranked[0]):.3f} vs next "
               f"{asym(ranked[1]):.3f}" + ("" if clear else f", within sampling noise: zero codes {zeros} all "
                                            f"scored") + ")")
        conf = "high" if clear else "low (scored by loss)"
    unused_str = f"code {unused[0]}" if len(unused) == 1 else f"{len(unused)} codes (all but {used})"
    findings.append(Finding("code table: unused code", unused_str,
                            f"{sum(hist[c] for c in unused)} of {total} fields ({shares})", "high"))
    findings.append(Finding("code table: zero code", f"code {zeros[0]}", why, conf))
    tables = []
    for z in zeros:
        a, b = [c for c in used if c != z]
        for neg, pos in ((a, b), (b, a)):
            t = [None] * ncodes
            t[z], t[neg], t[pos] = 0, -1, 1
            tables.append(tuple(t))
    return tables


class MixedTables(tuple):
    """(main width's code table, tuple of the other widths' tables): one code-table choice of a
    mixed-width model (``Candidate.codes`` / ``Candidate.extra``)."""


def mixed_code_candidates(modules: list[Module], ckpt: Checkpoint, findings: list[Finding],
                          cfg: Optional[ModelConfig] = None) -> list[MixedTables]:
    """Code tables of a mixed-width model: zero points and code tables inferred per width group
    (each group's findings name its width); the candidates are every combination of the groups'
    tables, the main (most common) width's table first."""
    packed = [m for m in modules if m.packed]
    count: dict[int, int] = {}
    for m in packed:
        count[m.bits] = count.get(m.bits, 0) + 1
    widths = sorted(count, key=lambda b: (-count[b], b))  # main width first
    per = []
    for i, b in enumerate(widths):
        group = [m for m in packed if m.bits == b] + ([m for m in modules if not m.packed] if i == 0 else [])
        n0 = len(findings)
        zero_code = check_zero_points(group, ckpt, findings, cfg)
        per.append([tuple(range(1 << b))] if zero_code == ASYMMETRIC else code_candidates(group, zero_code, findings, cfg))
        for f in findings[n0:]:
            f.what = f"{f.what} [{b}-bit modules]"
    return [MixedTables((combo[0], tuple(combo[1:]))) for combo in itertools.product(*per)]


def _pads(m: Module) -> int:
    """Code fields of a packed weight that hold no logical element (the padding)."""
    n, k = m.logical
    if m.record is not None:  # the records' code bytes only (their scale bytes are no fields)
        return n * (-(-k // m.record[0]) * m.record[0] - k)
    if m.codec in ("bitstream", "base3"):  # _stream_hist counts the logical codes only, _base3_hist whole bytes
        return 0
    return m.weight.numel * (INT_DTYPES[m.weight.dtype] // m.bits) - n * k


def _short_hist(hist: list) -> str:
    return str(hist) if len(hist) <= 16 else str({c: n for c, n in enumerate(hist) if n})


def _integer_tables(hist, bits, significant, zero_hint, findings, shares) -> list[tuple]:
    ncodes, half = 1 << bits, 1 << (bits - 1)
    mode = max(range(ncodes), key=lambda c: hist[c])
    tables, labels = [], []

    def add(t, label):
        vals = [t[c] for c in significant]
        # a symmetric integer range around 0: every used value within [-2^(b-1), 2^(b-1)]
        if all(-half <= v <= half for v in vals) and 0 in t and t not in tables:
            tables.append(t)
            labels.append(label)

    for z, why in ((zero_hint, "zero point"), (half, f"offset binary v+{half}"), (mode, "most frequent code")):
        if z is not None and 0 <= z < ncodes:
            add(tuple(c - z for c in range(ncodes)), f"code - {z} ({why})")
    add(tuple(_signed(c, bits) for c in range(ncodes)), "two's complement")
    # sign-magnitude (sign bit high, or low): both "zeros" decode to 0 -- a packer that takes the sign
    # from the float weight writes -0 wherever a small negative weight rounds to 0, so a ternary
    # checkpoint then uses all four 2-bit codes without being int2
    add(tuple(_sign_magnitude(c, bits, sign_high=True) for c in range(ncodes)), "sign-magnitude, sign bit high")
    add(tuple(_sign_magnitude(c, bits, sign_high=False) for c in range(ncodes)), "sign-magnitude, sign bit low")
    if not tables:
        raise InspectError(f"{len(significant)} of {ncodes} {bits}-bit codes occur in the packed weights "
                           f"(counts {_short_hist(hist)}) and no zero code maps them to a symmetric integer range: "
                           f"asymmetric quantisation is not supported")
    findings.append(Finding("code table: integer levels",
                            f"{len(significant)} of {ncodes} codes used -> symmetric {bits}-bit integers",
                            f"{shares}; candidates: {'; '.join(labels)}",
                            "high" if len(tables) == 1 else "medium (scored by loss)"))
    return tables


# ---------------------------------------------------------------------------------------
# scale op


#: the weight leaf (``<module>.<leaf>``) each quant_method's loader reads: transformers' BitLinear ``weight``, AutoGPTQ /
#: AutoAWQ ``qweight``, compressed-tensors ``weight_packed`` (pack-quantized) or ``weight`` (naive / int-quantized:
#: one integer per element, the logical shape)
METHOD_WEIGHT_LEAF = {"bitnet": ("weight",), "gptq": ("qweight",), "awq": ("qweight",),
                      "compressed-tensors": ("weight_packed", "weight")}


def _outside_method_layout(scaled: list[Module], qm: Optional[str]) -> Optional[str]:
    """Why the scaled modules are not stored as quant_method ``qm``'s loader reads them (the first module whose weight
    key is not that method's, or a compressed-tensors ``weight`` that is packed), else None."""
    leaves = METHOD_WEIGHT_LEAF.get(qm)
    if leaves is None:
        return None
    for m in scaled:
        leaf = m.leaf(m.weight)
        packed_weight = (qm == "compressed-tensors" and leaf == "weight"
                         and tuple(m.weight.shape) != tuple(m.logical))
        if leaf not in leaves or packed_weight:
            want = " or ".join(f"'<module>.{x}'" for x in leaves)
            got = f"{m.weight.name!r} ({m.weight.dtype} {list(m.weight.shape)}, logical {list(m.logical)})"
            return (f"config.json's quant_method {qm!r} stores {want}"
                    + (" unpacked (the logical shape)" if qm == "compressed-tensors" else "")
                    + f", but its loader could not read {got} in {m.weight.file}: the config describes other tensors "
                    f"than these, so its op (W = s * q or q / s) is no evidence here; check config.json")
    return None


def op_candidates(modules: list[Module], cfg: ModelConfig, ckpt: Checkpoint, findings: list[Finding],
                  widen: bool = False) -> list[str]:
    scaled = [m for m in modules if m.scale is not None]
    if not scaled:
        return ["multiply"]
    q = cfg.quantization or {}
    qm = q.get("quant_method")
    inv = [m.scale.name for m in scaled if m.scale.name.endswith(tuple("." + s for s in INVERSE_SCALE_SUFFIXES))]
    if inv and qm:
        # the config names the op of its own scale tensor; an *_inv tensor is its reciprocal to some writers and
        # the dequantisation multiplier to others (FP8): decided below as for a checkpoint without a config
        findings.append(Finding("scale op", "not taken from config.json",
                                f"{len(inv)} scales stored as '*.weight_scale_inv' (e.g. {inv[0]!r}): quant_method "
                                f"{qm!r} defines the op of weight_scale, and an inverse scale may be its reciprocal or "
                                f"the multiplier itself; magnitudes, then the loss decide", "n/a"))
        qm = None
    foreign = _outside_method_layout(scaled, qm)
    if foreign is not None:
        # the config names the op of its own method's tensors; these are another writer's (a stale or copied
        # quantization_config): its op is no evidence, so magnitudes, then the loss decide, as without a config
        findings.append(Finding("config vs tensors", "scale op not taken from quantization_config", foreign, "n/a"))
        qm = None

    def magnitudes():
        # effective weights of a linear with fan-in K have RMS ~ 1/sqrt(K) (within ~10x)
        score = {"multiply": 0.0, "divide": 0.0}
        for m in scaled:
            s = ckpt.get(m.scale.name).float().abs()
            typ = float(s.log().mean().exp())
            k = m.logical[1]
            for op, eff in (("multiply", typ), ("divide", 1.0 / typ)):
                score[op] += _fan_in_log_error(eff, k)
        for op in score:
            score[op] /= len(scaled)
        best = min(score, key=score.get)
        ev = (f"|ln(RMS(W_eff) * sqrt(K))| averaged over {len(scaled)} scales: multiply {score['multiply']:.2f}, "
              f"divide {score['divide']:.2f} (0 = the 1/sqrt(fan-in) a trained linear has)")
        return best, abs(score["multiply"] - score["divide"]), ev

    if qm == "bitnet":
        lc = bitnet_linear_class(q)
        op = "divide" if lc == "bitlinear" else "multiply"
        findings.append(Finding("scale op", op, f"config.json quantization_config.linear_class={lc!r}", "high (config)"))
        best, gap, ev = magnitudes()
        if best != op and gap > 3.0:
            # the config decides (transformers and vLLM read it and would compute the same), but the tensors look
            # like the other op's: a converter that wrote multipliers under a divide config, or the reverse
            findings.append(Finding("scale op vs config", f"the scale tensors look like {best!r} scales",
                                    f"{ev}; config.json says {op!r}, which the spec follows as transformers and vLLM "
                                    f"do - if this checkpoint's converter stored the other kind, every effective "
                                    f"weight is off by s^2 (check the report's decode quality)", "low (magnitudes)"))
        return [op]
    if qm in ("gptq", "compressed-tensors", "awq"):
        findings.append(Finding("scale op", "multiply", f"config.json quant_method={qm!r} defines W = s * (q - z)",
                                "high (config)"))
        return ["multiply"]
    best, gap, ev = magnitudes()
    if gap > 3.0 and not inv and not widen:  # (widen: the magnitudes' choice gave no working model: both scored)
        findings.append(Finding("scale op", best, ev + "; no config hint", "high (magnitudes)"))
        return [best]
    if inv:
        findings.append(Finding("scale op", best, ev + "; inverse scales (*_inv): both scored by loss, the magnitudes' "
                                "choice first", "high (magnitudes)" if gap > 3.0 else "low (magnitudes)"))
        return [best, "divide" if best == "multiply" else "multiply"]
    findings.append(Finding("scale op", best, ev + "; too close, both scored by loss", "low (magnitudes)"))
    return [best, "divide" if best == "multiply" else "multiply"]


# ---------------------------------------------------------------------------------------
# the whole pipeline


@dataclass
class Inspection:
    dir: Path
    cfg: ModelConfig
    spec: CheckpointSpec
    stats: dict
    modules: list
    floats: dict
    findings: list
    scored: list
    loss: Optional[float]
    zero_ratio: dict  # HF module -> zero ratio of the decoded values


#: RMS of a ternary linear's codes: ~69% of them are +-1 under absmean ternarisation of Gaussian weights (sqrt(0.69))
TERNARY_CODE_RMS = 0.8


def _fan_in_log_error(multiplier: float, k: int) -> float:
    """|ln(RMS(W_eff) * sqrt(K))| of a ternary linear of fan-in ``k`` whose codes are scaled by ``multiplier``: 0 where
    its effective weights have the 1/sqrt(fan-in) RMS a trained linear has (within ~10x: |ln| < 2.3)."""
    return abs(math.log(multiplier * TERNARY_CODE_RMS * math.sqrt(k)))


def _unit_multiplier_finding(modules: list[Module], findings: list[Finding]) -> None:
    """No scale anywhere: integer codes (or floats of magnitude exactly 1) with no scale tensor beside any linear and
    none inside the weight (llama.cpp records, HQQ's meta) decode to multiplier 1.  That may be the model, or its
    scales were lost (another file, a key not read as a scale): nothing in the checkpoint says which, so the report
    says so, with the magnitude a trained linear has (RMS(W_eff) ~ 1/sqrt(K), the scale-op rule's yardstick)."""
    if any(m.scale is not None or m.record is not None or m.group_view or m.hqq_meta for m in modules):
        return
    unit = [m for m in modules if m.packed or (m.weight.kind == "ternary_float" and m.weight.magnitudes == [1.0])]
    if not unit:
        return
    off = sum(_fan_in_log_error(1.0, m.logical[1]) for m in unit) / len(unit)
    findings.append(Finding(
        "scale", "none: multiplier 1",
        f"no scale tensor beside any of {len(unit)} ternary linears (e.g. {unit[0].weight.name!r}, "
        f"{unit[0].weight.dtype} {list(unit[0].weight.shape)}) and none inside the weights: every effective weight is "
        f"its code; |ln(RMS(W_eff) * sqrt(K))| averages {off:.2f} (0 = the 1/sqrt(fan-in) a trained linear has) - if "
        f"this checkpoint's scales are stored elsewhere (another file, a key not read as a scale), every weight is off "
        f"by them", "low (nothing stored)"))


def _prior_key(c: Candidate, modules: list, cfg: ModelConfig) -> tuple:
    """``prior_rank`` of a candidate for this model's structure (records, HQQ, majority pack axis)."""
    from .inspect_search import prior_rank

    packed = [m for m in modules if m.packed]
    record = next((m.record for m in packed), None)
    hqq = any(m.group_view for m in modules)
    axis0 = sum(m.pack_axis == 0 for m in packed) > len(packed) / 2
    i2s = bool(packed) and all(m.gguf_i2s for m in packed)
    # one value per element of a signed dtype (int8 holding -1 / 0 / +1): two's complement before offset binary
    signed = bool(packed) and all(m.weight.dtype.startswith("I") and INT_DTYPES[m.weight.dtype] == m.bits
                                  for m in packed)
    masks = bool(packed) and all(m.codec == "sign_masks" for m in packed)
    return prior_rank(c, cfg, record, hqq, axis0, i2s, signed, masks)


def _prior_tie_break(scored, modules, floats, cfg, ckpt, ids, findings) -> Candidate:
    """When the loss cannot separate the best candidate from the a-priori most plausible one
    (within PRIOR_MARGIN nats: an untrained or tiny model), keep the plausible one and say so."""
    from .decode import model_loss
    from .inspect_search import NAMED_MARGIN, PRIOR_MARGIN, UNTRAINED_BAND

    valid = [s for s in scored if math.isfinite(s.loss)]
    prior = min(valid, key=lambda s: _prior_key(s.cand, modules, cfg))
    best = scored[0]
    if prior.fp == best.fp:
        return best.cand
    if prior.stage != "full":
        prior.loss = model_loss(cfg, build_spec(modules, floats, prior.cand, cfg, "prior"), ckpt, ids)
        prior.stage = "full"
    gap = prior.loss - best.loss
    named = _prior_key(prior.cand, modules, cfg)[0] < 0  # the checkpoint names this layout itself
    # an untrained model (its best decode scores within UNTRAINED_BAND of ln V, the loss of a uniform guess): the
    # decodes differ by noise of ~0.1 nats, more than PRIOR_MARGIN, so the loss may not pick against the prior
    untrained = best.loss > math.log(cfg.vocab_size) - UNTRAINED_BAND
    margin = NAMED_MARGIN if named or untrained else PRIOR_MARGIN
    if gap < margin:
        # every distinct decode the loss cannot separate from the best one is a live alternative: name them
        tied, seen = [], {prior.fp}
        for s in valid:
            if s.fp not in seen and s.loss - best.loss < margin:
                seen.add(s.fp)
                tied.append(s.cand.label())
        findings.append(Finding("ambiguous decode", f"{len(tied) + 1} distinct decodes within {margin} nats",
                                f"kept {prior.cand.label()}; alternatives the loss cannot rule out: "
                                + "; ".join(tied[:8]) + (f"; ... {len(tied) - 8} more" if len(tied) > 8 else ""),
                                "low (prior)"))
        why = (f"; the best decode's loss {best.loss:.3f} is within {UNTRAINED_BAND} of ln(vocab_size) = "
               f"{math.log(cfg.vocab_size):.3f} (an untrained model: its decodes differ by noise)" if untrained else "")
        findings.append(Finding("layout (prior tie-break)", prior.cand.label(),
                                f"the text sample cannot tell: {best.cand.label()} scores only {gap:+.4f} nats "
                                f"better (< {margin}){why}; kept the public convention that the config and "
                                f"../shared/FORMATS.md make most likely", "low (prior)"))
        return prior.cand
    return best.cand


#: AutoGPTQ / GPTQModel write their quantization config to this file too (AutoGPTQ before 0.7 only there)
QUANTIZE_CONFIG = "quantize_config.json"


def _with_quantize_config(cfg: ModelConfig, model_dir: Path, findings: list[Finding]) -> ModelConfig:
    """``cfg`` with the quantization block of ``quantize_config.json`` where config.json has no quantization_config
    (as AutoGPTQ's from_quantized and vLLM's GPTQ config read it): its bits, group_size, desc_act, sym and
    checkpoint_format (gptq_v2 qzeros store z, not z - 1) decide as config.json's would; a file without quant_method
    but with bits is AutoGPTQ's (quant_method 'gptq')."""
    path = model_dir / QUANTIZE_CONFIG
    if cfg.quantization is not None or not path.is_file():
        return cfg
    try:
        q = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InspectError(f"{path}: not readable as JSON ({e}); config.json has no quantization_config, so this "
                           f"file would give the quantization settings (bits, group_size, desc_act, sym, "
                           f"checkpoint_format)") from None
    if not isinstance(q, dict):
        raise InspectError(f"{path}: expected a JSON object of quantization settings, got a {type(q).__name__}")
    if "quant_method" not in q and "bits" in q:
        q = dict(q, quant_method="gptq")
    findings.append(Finding("quantization config", f"{QUANTIZE_CONFIG} (config.json has no quantization_config)",
                            f"quant_method {q.get('quant_method')!r}, bits {q.get('bits')!r}, group_size "
                            f"{q.get('group_size')!r}, desc_act {q.get('desc_act')!r}, checkpoint_format "
                            f"{q.get('checkpoint_format', 'gptq')!r}", "high (config)"))
    return dataclasses.replace(cfg, quantization=q)


def _gguf_tokenizer_problem(model_dir: Path) -> Optional[str]:
    """Why a GGUF model directory has no text tokenizer (no tokenizer.json / tokenizer.model / tokenizer_config.json
    beside it, and none built from its metadata), else None (also for a safetensors directory)."""
    from .checkpoint import gguf_model, gguf_source

    d = model_dir if model_dir.is_dir() else model_dir.parent
    src = gguf_source(model_dir)
    if src is None or any((d / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return None
    try:
        gguf_model(src).tokenizer()
    except CheckpointError as e:
        return str(e)
    return None


def in_norm_eps(cfg: ModelConfig) -> float:
    """eps of the input RMSNorms inside the linears: quantization_config.rms_norm_eps (transformers'
    BitNetQuantConfig), else its default 1e-6."""
    from .spec import bitnet_use_rms_norm

    q = cfg.quantization or {}
    if q.get("quant_method") == "bitnet" and bitnet_use_rms_norm(q):  # checks rms_norm_eps
        return float(q.get("rms_norm_eps", 1e-6))
    eps = q.get("rms_norm_eps", 1e-6)
    return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0 else 1e-6


def _in_norm_finding(modules: list[Module], cfg: ModelConfig, findings: list) -> None:
    normed = [m for m in modules if m.in_norm is not None]
    if not normed:
        q = cfg.quantization or {}
        if q.get("quant_method") == "bitnet" and q.get("use_rms_norm"):
            raise InspectError(f"config.json: quantization_config.use_rms_norm is true, so every BitLinear normalizes "
                               f"its input with its own RMSNorm (<module>{IN_NORM_SUFFIX}); the checkpoint stores none")
        return
    bare = [m.prefix for m in modules if m.in_norm is None]
    if bare:
        raise InspectError(f"{normed[0].in_norm.file}: {len(normed)} linears have an input RMSNorm "
                           f"(<module>{IN_NORM_SUFFIX}, e.g. {normed[0].in_norm.name!r}) and {len(bare)} do not "
                           f"({bare[:4]}); use_rms_norm gives every converted linear one")
    q = cfg.quantization or {}
    said = q.get("use_rms_norm") if q.get("quant_method") == "bitnet" else None
    findings.append(Finding(
        "input norms", f"an RMSNorm of the input inside every linear (eps {in_norm_eps(cfg)}), before its "
        f"activation quantization", f"{len(normed)} tensors <module>{IN_NORM_SUFFIX}, e.g. {normed[0].in_norm.name!r}"
        + ("; config.json quantization_config.use_rms_norm = true (transformers' BitLinear / AutoBitLinear)" if said
           else "; note: config.json does not set quantization_config.use_rms_norm, so transformers would ignore "
           "these tensors (the spec written here applies them)"), "high" if said else "medium"))


def _check_norm_weights(stats: dict, ckpt: Checkpoint) -> None:
    """Every 1-D RMSNorm weight (``*norm.weight``: the layers', the sub-norms, the final norm, use_rms_norm's) finite,
    as the scales are checked: a spec for a checkpoint that cannot run is not written (an InspectError names the
    file, the tensor, the count and the first bad value). The scan counted the non-finite values already; the
    tensor is read again only to name the first one."""
    for name, st in stats.items():
        if not name.endswith("norm.weight") or len(st.shape) != 1 or not st.n_nonfinite:
            continue
        w = ckpt.get(name)
        i = int((~torch.isfinite(w)).nonzero()[0])
        raise InspectError(f"{st.file}: norm weight {name!r} has {st.n_nonfinite} NaN/Inf values (first "
                           f"{float(w[i])} at index {i}); expected finite values")


def _check_float_codes(modules: list[Module], ckpt: Checkpoint) -> None:
    """Ternary codes stored as floats (-1 / 0 / +1 in bf16 / fp16 / fp32, the scale in a tensor beside them): where
    most such linears hold nothing else, one that holds other values is a corrupt tensor, as a stray code in one int8
    tensor is (``code_candidates``) - not weights to run as stored.  A value beyond -1 / 0 / +1 in most of them is
    levels of their own (a symmetric integer grid stored as floats): read as stored."""
    coded = [m for m in modules if m.scale is not None and m.weight.kind == "ternary_float"]
    clean = [m for m in coded if m.weight.magnitudes == [1.0]]
    stray = [m for m in coded if m not in clean and 1.0 in (m.weight.magnitudes or ())]
    if not clean or not stray or len(stray) >= max(2, len(coded) / 2):
        return
    m = stray[0]
    w = ckpt.get(m.weight.name).float()
    bad = (w != 0) & (w.abs() != 1)
    r, c = (int(i) for i in bad.nonzero()[0])
    raise InspectError(f"{m.where()}: {int(bad.sum())} values outside -1 / 0 / +1 (first {float(w[r, c])} at "
                       f"[{r}, {c}]) beside the scale {m.scale.name!r}, where {len(clean)} other linears stored as "
                       f"floats hold only -1 / 0 / +1 beside theirs: expected ternary codes (corrupted weights)")


#: the value set of ternary codes t = w + 1 stored as floats (``PackSpec`` codec 'float_codes')
FLOAT_TRITS = (0.0, 1.0, 2.0)


def _float_codes(modules: list[Module], ckpt: Checkpoint, findings: list[Finding]) -> None:
    """Ternary codes t = w + 1 stored as float values (bf16 / fp16 / fp32 0.0 / 1.0 / 2.0, a scale beside them or
    not): read as codes (``PackSpec`` codec 'float_codes': the tensor's uint8 cast, one code per element; the trit ->
    value table then comes from the code counts and the loss like any one-code-per-byte table's), not as weights
    {0, 1, 2}.  The evidence is the value set: exactly {0, 1, 2} and nothing negative is a code set - a trained
    linear's weights are centred on zero, and ternary values stored as floats are {-1, 0, +1} (read as stored), as an
    int8 tensor of 0 / 1 / 2 holds codes.  Where the model also holds linears of signed ternary floats, or linears whose
    values are only part of {0, 1, 2} (a level that never occurs), the evidence is mixed: those with the full set are
    still read as codes (and the partial ones with them), under a low-confidence finding that names both kinds."""
    from .scan import tensor_stats

    stored = [m for m in modules if m.weight.kind in ("ternary_float", "float") and len(m.weight.shape) == 2]
    small = [m for m in stored if 0 < m.weight.n_unique <= 3]
    coded = [m for m in small if tuple(m.weight.unique) == FLOAT_TRITS]
    if not coded:
        return
    partial = [m for m in small if m not in coded and set(m.weight.unique) <= set(FLOAT_TRITS)
               and 2.0 in m.weight.unique]
    signed = [m for m in stored if m.weight.kind == "ternary_float" and m not in coded + partial
              and m.weight.unique and min(m.weight.unique) < 0]  # ternary values as floats: -1 / 0 / +1, -s / 0 / +s
    for m in coded + partial:
        st = m.weight
        m.stored = st
        m.weight = tensor_stats(ckpt.get(st.name).to(torch.uint8), st.name, st.file, "U8", st.numel)
        m.codec = "float_codes"
    mixed = bool(partial or signed)
    ev = (f"{len(coded)} linears stored as {sorted({m.stored.dtype for m in coded})} hold exactly the values "
          f"{{0, 1, 2}} (e.g. {coded[0].stored.name!r}), none negative: ternary codes t = w + 1 (a trained linear's "
          f"weights are centred on zero; ternary values stored as floats are -1 / 0 / +1), read as one code per "
          f"element (PackSpec codec 'float_codes'), the trit -> value table from the code counts")
    if partial:
        ev += (f"; {len(partial)} hold only {sorted({v for m in partial for v in m.stored.unique})} (a level never "
               f"occurs, e.g. {partial[0].stored.name!r}): read as codes with them")
    if signed:
        ev += (f"; but {len(signed)} other linears hold signed ternary floats (-1 / 0 / +1 or -s / 0 / +s, e.g. "
               f"{signed[0].weight.name!r}), read as values: one model storing both is unusual - check the decode "
               f"quality")
    findings.append(Finding("float-stored codes", f"{len(coded) + len(partial)} linears' float values read as codes "
                            f"0 / 1 / 2", ev, "low (mixed value sets)" if mixed else "high (value set)"))


def _mark_gguf_i2s(model_dir: Path, modules: list) -> None:
    """Module.gguf_i2s for the weights a GGUF model stores as I2_S (type 36): the type names bitnet.cpp's
    layouts, which prior_rank then puts first (without text to score on they are the decode kept)."""
    from .checkpoint import gguf_model, gguf_source

    src = gguf_source(model_dir)
    if src is None:
        return
    g = gguf_model(src)
    for m in modules:
        m.gguf_i2s = m.weight.name in g.infos and g.kind(m.weight.name) == "i2s"


def inspect_dir(model_dir, *, text: Optional[str] = None, use_loss: bool = True, n_seq: int = 2,
                seq_len: int = 64) -> Inspection:
    """Inspect the checkpoint in ``model_dir`` (see the module docstring).  A code width its shapes leave open
    (AmbiguousWidth: an unpadded packing, or one at half the width with rows padded to one block) is decided by
    decoding the checkpoint both ways (``_width_by_decode``)."""
    kw = dict(text=text, use_loss=use_loss, n_seq=n_seq, seq_len=seq_len)
    try:
        return _inspect_dir(model_dir, **kw)
    except AmbiguousWidth as amb:
        runs: dict = {}
        for padded in (False, True):
            try:
                runs[padded] = _inspect_dir(model_dir, one_block=padded, **kw)
            except (CheckpointError, FormatError) as e:
                runs[padded] = e
        return _width_by_decode(amb, runs)


def _width_by_decode(amb: AmbiguousWidth, runs: dict) -> Inspection:
    """The reading of an ambiguous code width (``runs``: one_block False / True -> its Inspection, or the error it
    raised) that decodes better.  A reading that fails loses: the padded one fails where some tensor's padding holds
    more than one code (``DecodeCache.pad_code``: a writer fills it with one, while the codes an unpadded packing
    keeps there are half its weights).  Where both decode, the lower loss on text wins by PRIOR_MARGIN (NAMED_MARGIN
    for an untrained model, whose decodes differ by noise); within it, or without text, the padded reading, whose
    padding held one code in every tensor: an unpadded packing shows that only where half its weights are one value.
    Its "code width" finding says the width was ambiguous, both readings' outcomes and what decided.  Before, the
    vote read a bitnet.cpp I2_S model of 64-input rows as 4-bit codes (a working but wrong decode, +1 nat)."""
    from .inspect_search import PRIOR_MARGIN

    name = {False: f"{amb.wide}-bit unpadded", True: f"{amb.half}-bit padded to one block"}
    ok = {r: x for r, x in runs.items() if isinstance(x, Inspection)}
    if not ok and str(runs[False]) == str(runs[True]):
        raise runs[True]  # the same failure either way (e.g. a tokenizer of another model): not a width question
    if not ok:
        raise InspectError(f"{amb.shapes}; config.json names no width, and neither reading decodes - "
                           f"{name[False]}: {runs[False]}; {name[True]}: {runs[True]}")

    def outcome(r: bool) -> str:
        if r not in ok:
            return f"{name[r]}: fails ({runs[r]})"
        return f"{name[r]}: " + (f"loss {ok[r].loss:.4f} nats" if ok[r].loss is not None else "decodes")

    losses = {r: x.loss for r, x in ok.items()}
    prior = "the padding, one code in every tensor, decides"
    if len(ok) == 1:
        pick = next(iter(ok))
        why, conf = f"the {name[not pick]} reading fails", "high"
    elif None in losses.values():
        pick, why, conf = True, f"no text to score on: {prior}", "medium (prior)"
    else:
        gap = losses[False] - losses[True]
        untrained = min(losses.values()) > math.log(ok[True].cfg.vocab_size) - UNTRAINED_BAND
        margin = NAMED_MARGIN if untrained else PRIOR_MARGIN
        if abs(gap) >= margin:
            pick, why, conf = gap > 0, f"the loss decides ({abs(gap):.4f} nats)", confidence(abs(gap))
        else:
            pick, why, conf = True, f"within {margin} nats: {prior}", "low (prior)"
    res = ok[pick]
    i = next(i for i, f in enumerate(res.findings) if f.what == "code width")
    res.findings[i] = Finding(
        "code width", f"{res.findings[i].decision} (ambiguous width, decided by decode)",
        f"{amb.shapes}; config.json names no width: decoded both ways - {outcome(True)}; {outcome(False)}: {why}",
        conf)
    return res


def _inspect_dir(model_dir, *, text: Optional[str], use_loss: bool, n_seq: int, seq_len: int,
                 one_block: Optional[bool] = None) -> Inspection:
    """inspect_dir, with ``one_block`` the reading of a code width the shapes leave open (choose_bits)."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.load(model_dir)
    ckpt = Checkpoint(model_dir)
    check_layer_count(cfg, ckpt, model_dir)
    stats = scan(ckpt)
    findings: list[Finding] = []
    cfg = _with_quantize_config(cfg, model_dir, findings)
    modules, floats = map_keys(stats, cfg)
    _sign_mask_bytes(modules)  # bool sign masks: their bytes, flags 0 / 1
    _mark_gguf_i2s(model_dir, modules)
    _check_norm_weights(stats, ckpt)
    _float_codes(modules, ckpt, findings)  # bf16 0 / 1 / 2: codes t = w + 1, read as such
    _check_float_codes(modules, ckpt)
    fused = [m for m in modules if len(m.parts) > 1]
    findings.append(Finding("key mapping", f"{len(modules)} linear tensors, {len(floats)} float tensors",
                            f"{len(fused)} fused ({sorted({m.role for m in fused})}) split by config.json sizes"
                            if fused else "no fused tensors", "high"))
    _in_norm_finding(modules, cfg, findings)
    # (GGUF models are named attn_q / attn_k: the GGUF reader undoes llama.cpp's own permutation itself)
    meta_named = [m for m in modules if m.role in ("q", "k", "qkv") and m.weight.name.rsplit(".", 2)[-2] in META_QK]
    meta = sorted({m.weight.name.rsplit(".", 2)[-2] for m in meta_named})
    for m in meta_named:  # Meta-style q / k: their rows in interleaved-RoPE order, until the loss says otherwise
        m.rope = _rope_expressible(m)
    # raises on an activation scheme the spec cannot run, before any search
    act = declared_activation_quant(cfg, f"{model_dir / 'config.json'}")
    if act is not None:
        findings.append(Finding("activation quantisation", act, "config.json: compressed-tensors config_groups declare "
                                "input_activations (dynamic symmetric per-token int8)", "high (config)"))
    scaled = [m for m in modules if m.scale is not None]
    if scaled:
        suffixes: dict[str, int] = {}
        for m in scaled:
            suf = m.leaf(m.scale)
            suffixes[suf] = suffixes.get(suf, 0) + 1
        # a packed linear with no scale where the others have one: its multiplier would silently be 1 (a missing
        # tensor, e.g. a conversion that skipped a module). Formats whose scales live inside the weight (llama.cpp
        # records) have none beside any weight, so they never mix; HQQ keeps its scale among a W_q's meta tensors
        unscaled = [m for m in modules if m.packed and m.scale is None and not m.hqq_meta]
        if unscaled:
            suf = max(sorted(suffixes), key=lambda k: suffixes[k])
            miss = ", ".join(f"{m.prefix}.{suf!s}" for m in unscaled[:4]) + (
                f" (+{len(unscaled) - 4} more)" if len(unscaled) > 4 else "")
            raise InspectError(f"{unscaled[0].where()}: no scale tensor next to it, but {len(scaled)} other packed "
                               f"linear(s) have one (<module>.{suf}, e.g. {scaled[0].scale.name!r}); expected {miss} "
                               f"- decoded without one, its weights would be off by the missing multiplier")
        findings.append(Finding("scale keys", ", ".join(f"<module>.{s}" for s in sorted(suffixes)),
                                f"{len(scaled)} scale tensors ({', '.join(f'{s}: {n}' for s, n in sorted(suffixes.items()))})"
                                f", e.g. {scaled[0].scale.name!r} for {scaled[0].weight.name!r}", "high"))
    head = next((m for m in modules if m.role == "lm_head"), None)
    if head is not None:  # a float lm_head is a plain tensor (map_keys); this one is packed or has a scale
        q = cfg.quantization or {}
        note = ""
        if q.get("quant_method") == "bitnet" and q.get("modules_to_not_convert") is None:
            note = ("; note: quantization_config.modules_to_not_convert is null, so transformers would build a float "
                    "lm_head and fail to load this tensor (the spec written here reads it as ternary)")
        findings.append(Finding(
            "lm_head", "ternary linear" + (", untied" if cfg.tie_word_embeddings else ""),
            f"{head.weight.name!r} {head.weight.dtype} {list(head.weight.shape)}"
            + (f" with scale {head.scale.name!r}" if head.scale is not None else "")
            + ("; config.json ties the embeddings, but a stored head that differs from the input embedding is used "
               "untied (transformers' tie_weights, vLLM's maybe_untie_word_embeddings)" if cfg.tie_word_embeddings
               else "") + note, "high"))
    convention = infer_structure(modules, cfg, ckpt, findings, one_block)
    _unit_multiplier_finding(modules, findings)
    widen_codes = widen_ops = False  # statistics-made choices a failed search may revisit
    zero_code = None
    if convention == "hqq":  # codes decode to q, values = q - zero (detect_hqq decided whether they are ternary)
        widths = sorted({m.bits for m in modules if m.packed}, key=lambda b: (-sum(m.bits == b for m in modules), b))
        ident = [tuple(range(1 << b)) for b in widths]
        tables = [ident[0] if len(ident) == 1 else MixedTables((ident[0], tuple(ident[1:])))]
        findings.append(Finding("code table", "identity (q), values q - zero", "HQQ: W = (q - zero) * scale",
                                "high (structure)"))
    elif convention == "awq":  # codes decode to q, values = q - z (detect_awq)
        tables = [tuple(range(16))]
        findings.append(Finding("code table", "identity (q), values q - zero",
                                "AutoAWQ: W = (q - z) * s (awq/utils/packing_utils.py dequantize_gemm)",
                                "high (structure)"))
    elif convention == "ct_asym":  # each module's table fixed by its format (detect_ct_asym: Module.codes)
        tables = [next(m.codes for m in modules if m.packed)]
        findings.append(Finding("code table", "offset binary (stored c -> q = c - 2^(b-1)), values q - zero",
                                "compressed-tensors: unpack_from_int32 subtracts 2^(b-1), dequantize (q - z) * s "
                                "(naive-quantized: the int8 q itself)", "high (structure)"))
    elif convention == "sign_masks":  # flags, W = pos - neg: no code table to infer (Module.codes fixes each)
        tables = [SIGN_FLAGS_BIT]
        findings.append(Finding("code table", "flags 0 / 1 in each mask, W = pos - neg",
                                "a sign-bitmask pair holds no codes: a set flag in the +1 mask is w = +1, in the -1 "
                                "mask w = -1, in neither w = 0", "high (structure)"))
    elif convention == "tq1_0":  # trit - 1 by the format's definition (dequantize_row_tq1_0: xi - 1)
        tables = [(-1, 0, 1, None)]
        findings.append(Finding("code table", "trit t -> t - 1", "llama.cpp TQ1_0: W = (t - 1) * d",
                                "high (structure)"))
    elif len({m.bits for m in modules if m.packed}) <= 1:
        zero_code = check_zero_points(modules, ckpt, findings, cfg)
        if zero_code == ASYMMETRIC:  # values = q - z: the codes are q
            bits = next((m.bits for m in modules if m.packed), 2)
            tables = [tuple(range(1 << bits))]
            findings.append(Finding("code table", "identity (q), values q - zero", "per-group zero points",
                                    "high (structure)"))
        else:
            tables = code_candidates(modules, zero_code, findings, cfg)
            widen_codes = zero_code is None  # the zero code came from the code counts
    else:
        tables = mixed_code_candidates(modules, ckpt, findings, cfg)
    if convention == "hqq":  # W = (q - zero) * scale by definition
        ops = ["multiply"]
        findings.append(Finding("scale op", "multiply", "HQQ dequantises (W_q - zero) * scale", "high (structure)"))
    elif convention == "awq":
        ops = ["multiply"]
        findings.append(Finding("scale op", "multiply", "AutoAWQ dequantises (q - z) * scales", "high (structure)"))
    elif convention == "ct_asym":
        ops = ["multiply"]
        findings.append(Finding("scale op", "multiply", "compressed-tensors dequantises (q - z) * scale",
                                "high (structure)"))
    elif convention == "tq1_0":
        ops = ["multiply"]
        findings.append(Finding("scale op", "multiply", "llama.cpp TQ1_0 dequantises (t - 1) * d", "high (structure)"))
    else:
        ops = op_candidates(modules, cfg, ckpt, findings)
        widen_ops = True  # (the config's op stays: op_candidates returns it whatever widen says)
    unpacked = [m for m in modules if m.weight.kind in ("ternary_float", "float")]
    q = cfg.quantization or {}
    if (q.get("quant_method") == "bitnet" and q.get("quantization_mode") == "online" and modules
            and all(m.weight.kind == "float" for m in modules)):
        return _online_inspection(model_dir, cfg, ckpt, stats, modules, floats, findings)
    ternary = any(m.packed or m.weight.kind != "float" for m in modules)
    kept = [m for m in unpacked if plain_float_linear(m)] if ternary else []  # build_spec keeps these in float
    unpacked = [m for m in unpacked if m not in kept]
    if kept:
        findings.append(Finding("float linears", f"{len(kept)} modules kept in float (plain linears, no activation "
                                f"quantisation)", "unconstrained float weights without a scale in a ternary "
                                f"checkpoint (modules_to_not_convert / an ignore list): "
                                + ", ".join(m.parts[0][0] for m in kept[:6]) + (" ..." if len(kept) > 6 else ""),
                                "high"))
    _config_exclusion_finding(modules, kept, cfg, findings)
    if unpacked:
        findings.append(Finding("unpacked weights", f"{len(unpacked)} modules stored as float",
                                f"kinds {sorted({m.weight.kind for m in unpacked})}; decoded as is", "high"))
    def candidates(tables, ops):
        if convention in ("tq1_0", "awq", "ct_asym"):  # the codec / the format's own layout fixes it: one candidate
            return [Candidate(tables[0], "lsb", "interleaved", None, "multiply")]
        if tables and any(m.codec == "bitstream" for m in modules if m.packed):
            # AutoGPTQ's 3-bit stream fixes lanes and bit order (interleaved, lsb): only the code table / op are open
            return [Candidate(t[0], "lsb", "interleaved", None, op, t[1]) if isinstance(t, MixedTables)
                    else Candidate(t, "lsb", "interleaved", None, op) for t in tables for op in ops]
        if tables:
            single = all(INT_DTYPES[m.weight.dtype] == m.bits for m in modules if m.packed)  # 1 value/element
            orders = ("lsb",) if single else (("msb", "lsb") if convention == "hqq" else ("lsb", "msb"))
            # per-part packing of fused tensors only matters where lanes span more than one container, or where
            # parts need not fill whole containers (five trits a byte: 128 rows are 25.6 bytes)
            b3 = any(m.codec in ("base3", "sign_masks") for m in modules if m.packed)
            return [Candidate(t[0], bo, ln, blk, op, t[1], per_part=pp) if isinstance(t, MixedTables)
                    else Candidate(t, bo, ln, blk, op, per_part=pp)
                    for ln, blk in lane_options(modules)
                    for pp in (per_part_options(modules) if ln != "interleaved" or b3 else (False,))
                    for bo in orders for t in tables for op in ops]  # by layout: DecodeCache unpacks each once
        return [Candidate((-1, 0, 1, None), op=op) for op in ops]

    cands = candidates(tables, ops)
    ids = None
    if use_loss and (why := _gguf_tokenizer_problem(model_dir)) is not None:
        findings.append(Finding("candidate scoring", "statistics only",
                                f"a GGUF model without tokenizer.json / tokenizer.model / tokenizer_config.json, and "
                                f"none from its metadata ({why}): no text to score candidates on", "n/a"))
        use_loss = False
    if use_loss:
        from .decode import text_ids

        ids = text_ids(model_dir, text, n_seq=n_seq, seq_len=seq_len)
        if int(ids.max()) >= cfg.vocab_size:
            raise InspectError(f"{model_dir}: the tokenizer gives token id {int(ids.max())}, config.json's vocab_size "
                               f"is {cfg.vocab_size}: the tokenizer files do not belong to this model (pass --no-loss "
                               f"to rely on statistics only)")
    scored = search(modules, floats, cands, cfg, ckpt, ids)
    # the q / k row order: the names' choice, scored against the other orders on the best decode (with text)
    f, switched = _rope_rows_finding(modules, floats, scored[0] if math.isfinite(scored[0].loss) else None, cfg,
                                     ckpt, ids, meta)
    if f is not None:
        findings.append(f)
    if switched:  # the loss overruled the names: every decode scored again under the new order
        scored = search(modules, floats, cands, cfg, ckpt, ids)
    # the order of a fused tensor's parts of one size ([gate; up] or [up; gate], k and v), by loss
    f, scored = _fused_order_search(modules, floats, scored, cfg, ckpt, ids,
                                    lambda: search(modules, floats, cands, cfg, ckpt, ids))
    if f is not None:
        findings.append(f)
    # the group size of group scales whose shape fits more than one (an exact divisor of K, a padded power of two)
    scored = _group_size_search(modules, floats, scored, cfg, ckpt, ids, findings,
                                lambda: search(modules, floats, cands, cfg, ckpt, ids))
    if ids is not None and scored[0].loss > math.log(cfg.vocab_size) - UNTRAINED_BAND and (widen_codes or widen_ops):
        # no working model among the candidates: the zero code (from code counts) or the scale op (from magnitudes)
        # may be what is wrong - a function-preserving sign flip evens the counts, an unusual scale magnitude
        # fools the magnitude rule; score every zero code and both ops once before concluding anything
        scratch: list = []
        wide = candidates(code_candidates(modules, zero_code, scratch, cfg, widen=True) if widen_codes else tables,
                          op_candidates(modules, cfg, ckpt, scratch, widen=True) if widen_ops else ops)
        extra = [c for c in wide if c not in set(cands)]
        if extra:
            rescored = search(modules, floats, extra, cfg, ckpt, ids)
            # taken only where it works (an untrained model's decodes differ by noise and work under none of them)
            if rescored[0].loss < min(scored[0].loss - NAMED_MARGIN, math.log(cfg.vocab_size) - UNTRAINED_BAND):
                findings.append(Finding(
                    "widened search", rescored[0].cand.label(),
                    f"the statistics' choice (zero code from code counts, scale op from magnitudes) decoded to no "
                    f"working model ({scored[0].loss:.3f} nats, ln(vocab) {math.log(cfg.vocab_size):.3f}); with every "
                    f"zero code and both scale ops scored, {rescored[0].loss:.3f}: the statistics' findings above are "
                    f"overruled by loss", confidence(scored[0].loss - rescored[0].loss)))
                cands = cands + extra
                scored = sorted(scored + rescored, key=lambda r: r.loss)
    if not math.isfinite(scored[0].loss):
        # a layout that fits the stored shapes but does not decode says more than the first shape mismatch
        fail = next((s for s in scored if s.note.startswith(UNDECODABLE)), scored[0])
        raise InspectError(f"{model_dir}: no candidate decodes cleanly; first failure: {fail.note}")
    best = scored[0].cand
    if ids is not None and len(cands) > 1:
        best = _prior_tie_break(scored, modules, floats, cfg, ckpt, ids, findings)
    if ids is not None and len(cands) > 1 and best == scored[0].cand:
        for axis, (margin, alt) in axis_margins(scored).items():
            if math.isnan(margin):
                continue
            val = {"codes": best.codes_label(), "bit_order": best.bit_order, "op": best.op,
                   "per_part": "fused tensors packed part by part" if best.per_part else "fused tensors packed whole",
                   "lanes": f"{best.lanes}" + (f" block={best.block}" if best.block else "")}[axis]
            findings.append(Finding(f"{axis} (by loss)", str(val),
                                    f"loss {scored[0].loss:.4f} nats; best alternative {alt} is "
                                    f"+{margin:.4f}", confidence(margin)))
    elif ids is None and len(cands) > 1:
        # no text to score on: the a-priori most plausible candidate that decodes cleanly (public
        # conventions first, then codes increasing with value), not merely the first one generated
        valid = [s for s in scored if math.isfinite(s.loss)]
        best = min(valid, key=lambda s: _prior_key(s.cand, modules, cfg)).cand
        # listed in that order (the chosen one first): their "loss" is only the order they were generated in
        scored = sorted(valid, key=lambda s: _prior_key(s.cand, modules, cfg)) + \
            [s for s in scored if not math.isfinite(s.loss)]
        distinct = len({s.fp for s in valid})
        findings.append(Finding("search", best.label(), f"no loss scoring: the a-priori most plausible of {distinct} "
                                f"distinct decodes (public conventions, then codes increasing with value); the others "
                                f"are listed under candidate decodes", "low"))
        if any(m.gguf_i2s for m in modules) and best.block == 128:
            findings.append(Finding("ambiguous decode", "GGUF I2_S: bitnet.cpp's x86 layout (128-value blocks) kept",
                                    "its ARM build writes 64-value blocks under the same type id and size; without "
                                    "text to score on (a tokenizer) the two cannot be told apart", "low (prior)"))
    spec = build_spec(modules, floats, best, cfg, f"inspected:{model_dir.name}")
    spec.validate(cfg, ckpt)
    findings.append(_activation_finding(cfg, spec, modules, ckpt, ids))
    zr = {}
    for hf, e in spec.linears.items():
        d = decode_linear(ckpt, e, hf)  # strict: an unused code at a logical position fails here
        zr[hf] = float((d.values == 0).float().mean())
    for m in modules:
        vals = [zr[hf] for hf, _ in m.parts if hf in zr]  # none for a float linear (kept as a tensor)
        m.weight.zero_ratio_decoded = sum(vals) / len(vals) if vals else None
    loss = scored[0].loss if ids is not None else None
    if loss is not None and loss >= math.log(cfg.vocab_size):
        findings.append(Finding(
            "decode quality", "no candidate decode gives a working model",
            f"the best decode scores {loss:.3f} nats a token, not below ln(vocab_size {cfg.vocab_size}) = "
            f"{math.log(cfg.vocab_size):.3f}, what predicting every token uniformly scores: either the weights are "
            f"untrained (random: the loss then tells nothing) or the checkpoint's format is none of those tried "
            f"(see the code width / layout findings; the decisions above are then guesses)", "low"))
    return Inspection(model_dir, cfg, spec, stats, modules, floats, findings, scored, loss, zr)


#: fused roles -> the two parts of one size a writer could store the other way round: [up; gate] (every public writer
#: we know of - transformers, vLLM, Microsoft BitNet's w13, Phi-3 - stores [gate; up]) and [q; v; k] (k / v of one
#: size: MHA, or GQA's k and v)
FUSED_SWAPS = {"gate_up": (0, 1), "qkv": (1, 2)}


def _swap_parts(m: Module, i: int, j: int) -> None:
    """Module ``m``'s parts i and j trade modules: each keeps its stored rows (and per-part scale index, packing
    segment), which now belong to the other module."""
    (hi, ri), (hj, rj) = m.parts[i], m.parts[j]
    m.parts[i], m.parts[j] = (hj, ri), (hi, rj)


def _fused_order_search(modules, floats, scored, cfg, ckpt, ids, research) -> tuple[Optional[Finding], list]:
    """The order of the parts of fused tensors (config.json gives their sizes, not their order): for each fused role
    with two parts of one size (FUSED_SWAPS), the order transformers / vLLM write ([gate; up], [q; k; v]) against the
    swapped one, every combination of the roles. With a working best decode (below ln V - UNTRAINED_BAND) each
    combination is scored with that decode; without one (a swapped order can leave no candidate working: every
    decode scored on the wrong rows) each re-runs the search (``research()``). A combination is taken where it beats
    the writers' order by NAMED_MARGIN and works. Before, a gate_up stored [up; gate] decoded to a model that worked
    poorly (2.37 nats against 0.15 on the tiny trained model), reported with high confidence; gate_up and qkv both
    swapped left no working decode. Without text the writers' order stands, unsaid.
    Returns (a finding where an order was swapped, else None; the scored candidates under the order kept)."""
    from itertools import combinations

    from .decode import model_loss

    top = scored[0] if scored and math.isfinite(scored[0].loss) else None
    roles = []
    for role, (i, j) in FUSED_SWAPS.items():
        ms = [m for m in modules if m.role == role and len(m.parts) > j
              and m.parts[i][1][1] - m.parts[i][1][0] == m.parts[j][1][1] - m.parts[j][1][0]]
        if ms:
            roles.append((role, i, j, ms))
    if ids is None or top is None or not roles:
        return None, scored
    untrained = math.log(cfg.vocab_size) - UNTRAINED_BAND
    working = top.loss < untrained

    def swap(combo):
        for role, i, j, ms in combo:
            for m in ms:
                _swap_parts(m, i, j)

    def order(m):
        return "[" + "; ".join(hf.rsplit(".", 1)[-1] for hf, _ in m.parts) + "]"

    if working:
        base = top.loss if top.stage == "full" else model_loss(
            cfg, build_spec(modules, floats, top.cand, cfg, "fused-order"), ckpt, ids)
    else:
        base = top.loss
    best = (base, (), None)
    for n in range(1, len(roles) + 1):
        for combo in combinations(roles, n):
            swap(combo)
            if working:
                loss, sc = model_loss(cfg, build_spec(modules, floats, top.cand, cfg, "fused-order"), ckpt, ids), None
            else:
                sc = research()
                loss = sc[0].loss
            if loss < best[0]:
                best = (loss, combo, sc)
            swap(combo)  # back to the writers' order
    loss, combo, sc = best
    if not combo or not loss < min(base - NAMED_MARGIN, untrained):
        return None, scored
    was = {role: order(ms[0]) for role, _, _, ms in combo}
    swap(combo)
    what = "; ".join(f"{role} stored {order(ms[0])} ({len(ms)} modules)" for role, _, _, ms in combo)
    ev = (f"{loss:.4f} nats with the fused rows read as {', '.join(order(ms[0]) for _, _, _, ms in combo)}, "
          f"{base:.4f} as {', '.join(was.values())} (the writers' order)"
          + ("" if working else ": no decode worked in the writers' order, the search was re-run in each")
          + "; no public writer we know of stores this order, the loss overrules the convention")
    return Finding("fused part order", what, ev, confidence(base - loss)), sc if sc is not None else research()


def _group_size_search(modules, floats, scored, cfg, ckpt, ids, findings, research) -> list:
    """The group size of grouped scales whose shape leaves more than one open (``Module.group_sizes``: K = 384 in 2
    groups is 192 exactly or 256 with a shorter last group), scored by loss like the other unnamed choices: with a
    working best decode (below ln V - UNTRAINED_BAND) each size is scored with that decode, without one each re-runs
    the search (``research()``).  Another size is taken where it beats the prior (``_group_size_options``: the exact
    divisor) by PRIOR_MARGIN (NAMED_MARGIN, and working, where no decode works: an untrained model's decodes differ
    by noise).  A g_idx (``check_zero_points``: its own group counts) or config.json's group_size decided already:
    nothing to score.  The "scale group size" finding says the pick, the losses and the confidence.  Before, the size
    was a power of two by prior alone: groups of 192 over K = 384 read as 256, inputs 192 - 255 under the wrong
    scale.  Returns the scored candidates under the size kept."""
    from .decode import model_loss
    from .inspect_search import PRIOR_MARGIN

    grouped = [m for m in modules if len(m.group_sizes) > 1]
    top = scored[0] if scored and math.isfinite(scored[0].loss) else None
    if ids is None or top is None or not grouped or any(m.g_idx is not None for m in grouped):
        return scored
    opts = grouped[0].group_sizes
    if any(m.group_sizes != opts for m in grouped):  # (consensus gives every module one tuple)
        return scored
    untrained = math.log(cfg.vocab_size) - UNTRAINED_BAND
    working = top.loss < untrained

    def use(gs):
        for m in grouped:
            m.scale_kw = [dict(kw, group_size=gs) if kw and kw.get("granularity") == "group" else kw
                          for kw in m.scale_kw]
            if m.zero_kw and m.zero_kw.get("granularity") == "group":
                m.zero_kw = dict(m.zero_kw, group_size=gs)

    prior = opts[0]
    use(prior)
    losses = {prior: top.loss if top.stage == "full" else model_loss(
        cfg, build_spec(modules, floats, top.cand, cfg, "group-size"), ckpt, ids)}
    rescored = {}
    for gs in opts[1:]:
        use(gs)
        if working:
            losses[gs] = model_loss(cfg, build_spec(modules, floats, top.cand, cfg, "group-size"), ckpt, ids)
        else:
            rescored[gs] = research()
            losses[gs] = rescored[gs][0].loss
    use(prior)
    best = min(opts, key=lambda gs: (losses[gs], gs != prior))
    margin = PRIOR_MARGIN if working else NAMED_MARGIN
    switch = best != prior and losses[best] < losses[prior] - margin and losses[best] < untrained
    chosen = best if switch else prior
    use(chosen)
    gap = min(v for gs, v in losses.items() if gs != chosen) - losses[chosen]
    i = next((i for i, f in enumerate(findings) if f.what == "scale group size"), None)
    ev = (findings[i].evidence if i is not None else
          f"the {len(grouped)} grouped scale's shape fits group sizes {' / '.join(map(str, opts))} (prior {prior}: "
          f"an exact divisor of K, then a power of two)")
    ev += "; loss " + ", ".join(f"{v:.4f} nats at {gs}" for gs, v in sorted(losses.items(), key=lambda kv: kv[1]))
    if switch:
        ev += ": the loss overrules the prior"
    elif gap < margin:
        ev += f": within {margin} nats, the prior decides"
    f = Finding("scale group size", str(chosen), ev,
                confidence(gap) if switch or gap >= margin else "low (prior)")
    if i is None:
        findings.append(f)
    else:
        findings[i] = f
    if not switch:
        return scored
    return rescored.get(chosen) or research()


META_QK = ("wq", "wk", "wqkv")  # the Meta-style q / k module names whose rows Meta's writers store interleaved


def _rope_expressible(m: Module) -> bool:
    """Whether a q / k module's rows can be put back in transformers' order by the spec (LinearEntry.rope_interleave):
    not with a bias (vLLM's own loader reads it) nor for a linear kept in float (a plain tensor, no entry)."""
    return m.bias is None and not m.part_bias and not plain_float_linear(m)


def _rope_rows_finding(modules, floats, top, cfg, ckpt, ids, meta) -> tuple[Optional[Finding], bool]:
    """The q / k row order (``Module.rope``, set from the names: Meta's consolidated checkpoints and Microsoft
    BitNet's GPU converter store q / k rows in interleaved-RoPE order). With text to score on and a decode that
    decodes (``top``: the search's best), three orders are scored on it - by the names, every q / k module
    interleaved, none - and one that beats the names' by NAMED_MARGIN and works (below ln V - UNTRAINED_BAND) is
    taken: a renamed-only conversion (Meta names over transformers' rows), HF names over interleaved rows, a mix.
    Returns (the finding, or None for transformers' names kept as stored; whether the modules' flags changed)."""
    from .decode import model_loss

    qk = [m for m in modules if m.role in ("q", "k", "qkv") and _rope_expressible(m)]
    fixed = [m.weight.name for m in modules if m.role in ("q", "k", "qkv") and not _rope_expressible(m)]
    names = (f"Meta-style names {meta}: Meta's consolidated checkpoints and Microsoft BitNet's GPU converter "
             f"(gpu/convert_safetensors.py, '(h l d) i -> (h d l) i') store q / k rows in interleaved-RoPE order"
             if meta else "transformers' names")
    if meta and fixed:  # a bias (vLLM loads it itself) or a linear kept in float (a plain tensor): no row order field
        names += (f"; read as stored, whatever their order: {fixed[:4]}{' ...' if len(fixed) > 4 else ''} (a bias, "
                  f"or kept in float: the spec cannot put their rows back)")
    if not qk:
        return (Finding("q / k row order", "as stored (transformers' order)", names, "low") if meta else None), False
    if ids is None and not meta:
        return None, False
    default = frozenset(id(m) for m in qk if m.rope)

    def said(sel):
        if not sel:
            return "as stored (transformers' order)"
        which = "" if len(sel) == len(qk) else \
            f" for {sorted(m.weight.name for m in qk if id(m) in sel)} only"
        return (f"interleaved-RoPE order (heads of {cfg.head_dim} rows){which}, put back in transformers' order on "
                f"read")
    if ids is None or top is None:
        return Finding("q / k row order", said(default), names + ("; no text to score the other order on"
                       if ids is None else "; no decode to score the other order with"), "medium (names)"), False
    options = {default: None, frozenset(id(m) for m in qk): None, frozenset(): None}
    if top.stage == "full":  # the search scored the names' order on the whole sample already
        options[default] = top.loss
    for sel in options:
        if options[sel] is None:
            for m in qk:
                m.rope = id(m) in sel
            options[sel] = model_loss(cfg, build_spec(modules, floats, top.cand, cfg, "rope-order"), ckpt, ids)
    best = min(options, key=lambda sel: (options[sel], sel != default))
    untrained = math.log(cfg.vocab_size) - UNTRAINED_BAND
    switch = best != default and options[best] < min(options[default] - NAMED_MARGIN, untrained)
    chosen = best if switch else default
    for m in qk:
        m.rope = id(m) in chosen
    ev = names + "; loss " + ", ".join(
        f"{v:.4f} nats {'as stored' if not sel else 'all q / k un-permuted' if len(sel) == len(qk) else 'by names'}"
        for sel, v in sorted(options.items(), key=lambda kv: kv[1]))
    margin = min(v for sel, v in options.items() if sel != chosen) - options[chosen]  # (all != none: >= 2 options)
    if switch:
        return Finding("q / k row order", said(chosen), ev + ": the loss overrules the names", confidence(margin)), True
    if not meta:  # transformers' names, and their order holds: nothing to say
        return None, False
    if options[chosen] < untrained and margin >= NAMED_MARGIN:
        return Finding("q / k row order", said(chosen), ev, confidence(margin)), False
    return Finding("q / k row order", said(chosen), ev + " (no working model tells them apart: the names decide)",
                   "medium (names)"), False


def _activation_finding(cfg, spec, modules, ckpt, ids) -> Finding:
    """How the spec's activation_quant was decided (inspect_search.build_spec's rule), said in the report: BitNet's
    architecture, quant_method 'bitnet' or a declared per-token int8 scheme give int8_per_token; a ternary Llama
    without any of them runs bf16 activations (weights-only ternary, e.g. TriLM), which a checkpoint trained as
    W1.58A8 does not - nothing in the weights tells the two apart (a trained W1.58A8 model scores about the same
    loss either way), so that case is low confidence, with both losses where a text sample is scored."""
    q = (cfg.quantization or {}).get("quant_method")
    act = spec.activation_quant
    if not spec.linears:
        return Finding("activation quantization", act, "no ternary / packed linear: plain float linears", "high")
    if q == "bitnet":
        return Finding("activation quantization", act, "config.json quant_method 'bitnet': per-token absmax int8 "
                       "(BitNet b1.58's W1.58A8)", "high (config)")
    if cfg.arch == "bitnet" and act == "int8_per_token":
        return Finding("activation quantization", act, "BitNet architecture: per-token absmax int8 in front of every "
                       "BitLinear (W1.58A8)", "high (architecture)")
    if cfg.arch == "bitnet":  # build_spec: no linear holds codes (every weight an unconstrained float, scaled or not)
        return Finding("activation quantization", act, "BitNet architecture, but no linear holds ternary or integer "
                       "codes (unconstrained float weights): plain linears without activation quantisation, as "
                       "transformers builds a BitNet model without a quantization_config", "high (architecture)")
    if act == "int8_per_token":
        return Finding("activation quantization", act, "config.json quantization_config declares dynamic per-token "
                       "int8 input_activations", "high (config)")
    ev = (f"{cfg.arch} architecture and no activation scheme in config.json: bf16 activations (weights-only "
          f"ternary). A checkpoint trained as W1.58A8 needs activation_quant 'int8_per_token' in {SPEC_FILENAME} (or "
          f"quantization_config.quant_method 'bitnet' in config.json): the weights cannot tell")
    if ids is not None:
        from dataclasses import replace

        from .decode import model_loss

        other = replace(spec, activation_quant="int8_per_token")
        ev += (f"; loss {model_loss(cfg, spec, ckpt, ids):.4f} nats as chosen, "
               f"{model_loss(cfg, other, ckpt, ids):.4f} with int8_per_token")
    return Finding("activation quantization", act, ev, "low")


def _online_inspection(model_dir, cfg, ckpt, stats, modules, floats, findings) -> Inspection:
    """transformers' online BitNet mode (quantization_mode 'online', AutoBitLinear): float latent weights
    that the model ternarizes at run time with each module's mean |W|; not plain float linears."""
    from .spec import spec_from_hf_bitnet

    foreign = [m.weight.name for m in modules if len(m.parts) != 1 or m.weight.name != f"{m.parts[0][0]}.weight"]
    if foreign:  # transformers' online mode reads its own names only; the config path builds them from config.json
        raise InspectError(f"{foreign[0]} ({len(foreign)} such): config.json says quant_method bitnet with "
                           f"quantization_mode online (float latent weights transformers ternarizes at load), but "
                           f"this tensor is not under transformers' name or is fused; rename the tensors to "
                           f"transformers' (e.g. model.layers.0.self_attn.q_proj.weight) or drop the "
                           f"quantization_config")
    spec = spec_from_hf_bitnet(cfg, ckpt)
    findings.append(Finding("online quantization", "every linear ternarized at load (LinearEntry.online 'absmean')",
                            f"config.json: quant_method bitnet, quantization_mode online, linear_class "
                            f"{(cfg.quantization or {}).get('linear_class')!r}; {len(modules)} float latent weights: "
                            f"round(W / mean|W|) clamped to [-1, 1], times mean|W| (transformers' WeightQuant)",
                            "high (config)"))
    spec.validate(cfg, ckpt)
    zr = {}
    for hf, e in spec.linears.items():
        zr[hf] = float((decode_linear(ckpt, e, hf).values == 0).float().mean())
    for m in modules:
        vals = [zr[hf] for hf, _ in m.parts if hf in zr]
        m.weight.zero_ratio_decoded = sum(vals) / len(vals) if vals else None
    return Inspection(model_dir, cfg, spec, stats, modules, floats, findings, [], None, zr)


def _keep_previous(path: Path, new_text: str) -> tuple[Path, Path] | None:
    """An existing `path` whose text differs from `new_text` (a spec edited by hand, an earlier inspection) is
    renamed to PATH.prev-<timestamp>[-n] before the new one is written, never overwritten: (path, where it went),
    or None when there was nothing to keep."""
    from .io import aside_path

    try:
        old = path.read_text()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        old = None
    if old == new_text:
        return None
    dest = aside_path(path)
    path.rename(dest)
    return path, dest


def _say_kept(kept: list, stream) -> None:
    for path, dest in kept:
        print(f"  the previous {path.name} differed: kept as {dest}", file=stream)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference.inspect", description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="checkpoint directory (config.json + *.safetensors, or one llama.cpp .gguf model)")
    ap.add_argument("--out", default=None, help=f"spec JSON (default DIR/{SPEC_FILENAME}; an existing one that "
                    f"differs is kept as NAME.prev-<timestamp>)")
    ap.add_argument("--report", default=None, help="Markdown report (default: next to the spec, .md)")
    ap.add_argument("--text", default=None, help="text file to score candidates on (default: corpus tail)")
    ap.add_argument("--no-loss", action="store_true", help="statistics only; no model evaluation")
    a = ap.parse_args(argv)
    kept: list = []
    try:
        from .inspect_report import render
        from .io import atomic_write_text

        try:
            text = Path(a.text).read_text() if a.text else None
        except UnicodeDecodeError as e:
            raise CheckpointError(f"--text {a.text}: not UTF-8 text ({e.reason} at byte {e.start}); pass a UTF-8 "
                                  f"text file") from None
        out = Path(a.out) if a.out else spec_home(a.dir) / SPEC_FILENAME  # a .gguf file: the spec beside it
        rep = Path(a.report) if a.report else out.with_suffix(".md")
        if out.resolve() == rep.resolve():
            raise FormatError(f"--out {out} and the report {rep} are the same file; pass --report (or an --out "
                              f"not ending in .md: the report goes next to the spec as .md)")
        res = inspect_dir(a.dir, text=text, use_loss=not a.no_loss)
        for path, body in ((out, res.spec.to_json()), (rep, render(res))):
            k = _keep_previous(path, body)  # a differing file is renamed aside, then the new one written
            if k:
                kept.append(k)
            atomic_write_text(path, body)
    except (CheckpointError, FormatError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        _say_kept(kept, sys.stderr)
        return 2
    except Exception as e:  # never a bare traceback from the CLI
        print(f"error: unexpected {type(e).__name__}: {e}", file=sys.stderr)
        _say_kept(kept, sys.stderr)
        return 2
    print(f"wrote {out} and {rep}")
    _say_kept(kept, sys.stdout)
    for f in res.findings:
        print(f"  {f.what}: {f.decision}  [{f.confidence}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
