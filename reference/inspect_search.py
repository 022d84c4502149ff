"""Candidate search of ``reference.inspect``: what statistics cannot decide is scored by loss.

A ``Candidate`` is one global choice of code table, bit order, lane layout (+ block) and scale
op; with the per-module structure already inferred (container, pack axis, transposition, logical
shape, scale layout) it becomes a full ``CheckpointSpec``.  Every candidate is strictly decoded
once (``DecodeCache``: lanes unpacked once per layout, code tables applied on top); candidates
with identical decodes share one loss; the rest are screened on a short sequence and the best
``FINALISTS`` re-scored on the whole text sample.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from .checkpoint import Checkpoint, CheckpointError
from .config import ModelConfig
from .formats import (FormatError, PackSpec, ScaleSpec, code_lut, group_index, pack_codes, unpack_codes,
                      unpack_sign_masks)
from .scan import CONTAINER_OF, INT_DTYPES
from .spec import (CheckpointSpec, DecodedLinear, InputNorm, LinearEntry, decode_linear, finish_linear, subtract_zero,
                   zero_points)

if TYPE_CHECKING:  # Module lives in reference.inspect, which imports this file
    from .inspect import Module

TQ2_0_RECORD = (256, 66)  # llama.cpp TQ2_0 blocks: lanes block_interleaved 128, lsb
BLOCKS = (8, 16, 32, 64, 128, 256, 512)  # block_interleaved block sizes tried (I2_S / TQ2_0 use 128)
#: HQQ meta keys that reference.inspect checks against the stored tensors / config.json (the others
#: - optimize, round_zero, encoded_state_dict, stores_quant_config - are only decoded)
HQQ_CHECKED = frozenset({"nbits", "group_size", "shape", "axis", "packing", "unpack_view_dtype", "view_as_float",
                         "quant_scale", "quant_zero", "offload_meta", "channel_wise", "compute_dtype"})
SCREEN_TOKENS = 32  # tokens per candidate in the screening pass
FINALISTS = 3  # distinct decodes re-scored on the whole text sample




@dataclass(frozen=True)
class Candidate:
    codes: tuple
    bit_order: str = "lsb"
    lanes: str = "interleaved"
    block: Optional[int] = None
    op: str = "multiply"
    # mixed code widths: the code tables of the other widths (``codes`` is the main width's);
    # each packed module takes the table with 2^bits entries
    extra: tuple = ()
    # fused tensors packed along their (fused) output axis: each part (q / k / v, gate / up) packed on
    # its own and the packed parts concatenated (PackSpec.segments), instead of the fused matrix at once
    per_part: bool = False

    def table(self, bits: int) -> tuple:
        for t in (self.codes,) + tuple(self.extra):
            if len(t) == 1 << bits:
                return t
        raise FormatError(f"candidate {self.label()} has no {bits}-bit code table")

    def codes_label(self) -> str:
        if not self.extra:
            return codes_str(self.codes)
        return "; ".join(f"{(len(t) - 1).bit_length()}-bit {codes_str(t)}" for t in (self.codes,) + tuple(self.extra))

    def label(self) -> str:
        lanes = f"{self.lanes}({self.block})" if self.block else self.lanes
        return f"codes={self.codes_label()} {self.bit_order} {lanes}{' per-part' if self.per_part else ''} {self.op}"


def codes_str(codes) -> str:
    """A code table for humans: the list when short (2-bit), else its rule or its used codes."""
    codes = tuple(codes)
    if len(codes) <= 4:
        return str(list(codes))
    bits = (len(codes) - 1).bit_length()
    if None not in codes:
        if all(v == codes[0] + c for c, v in enumerate(codes)):
            return f"code{codes[0]:+d} ({bits}-bit offset binary)"
        if all(v == (c - len(codes) if c >= len(codes) // 2 else c) for c, v in enumerate(codes)):
            return f"two's complement ({bits}-bit)"
        half = len(codes) // 2
        if all(v == (-(c - half) if c >= half else c) for c, v in enumerate(codes)):
            return f"sign-magnitude ({bits}-bit, sign bit high)"
        if all(v == (-(c >> 1) if c & 1 else c >> 1) for c, v in enumerate(codes)):
            return f"sign-magnitude ({bits}-bit, sign bit low)"
    return "{" + ", ".join(f"{c}: {v}" for c, v in enumerate(codes) if v is not None) + f"}} ({bits}-bit, rest unused)"


def per_part_options(modules: list[Module]) -> tuple:
    """(False, True) when a fused packed tensor is packed along its fused output axis (then its parts may
    have been packed one by one and concatenated), else (False,)."""
    fused = [m for m in modules if m.packed and len(m.parts) > 1 and m.pack_axis == 0 and m.record is None
             and m.group_view is None and INT_DTYPES[m.weight.dtype] != m.bits]
    return (False, True) if fused else (False,)


def lane_options(modules: list[Module]) -> list[tuple[str, Optional[int]]]:
    packed = [m for m in modules if m.packed]
    if not packed or any(m.codec in ("base3", "sign_masks") for m in packed):
        # (base-3: five consecutive elements a byte, digit order searched; sign masks: eight consecutive flags a byte)
        return [("interleaved", None)]
    # values per container of every packed module (several when code widths are mixed); a module
    # with one value per element has no lanes and does not constrain them
    vs = {INT_DTYPES[m.weight.dtype] // m.bits for m in packed} - {1}
    if not vs:
        return [("interleaved", None)]  # one value per element: lanes do not exist

    def fits(b):
        return all(b % v == 0 and b > v for v in vs)

    rec = packed[0].record
    if rec is not None:  # records (TQ2_0): lanes inside a record; 'blocked' spans the whole axis
        opts = [("interleaved", None)] + [("block_interleaved", b) for b in BLOCKS
                                          if fits(b) and rec[0] % b == 0]
        if tuple(rec) == TQ2_0_RECORD:  # llama.cpp's own lanes first (the order is the no-loss prior)
            opts.remove(("block_interleaved", 128))
            opts.insert(0, ("block_interleaved", 128))
        return opts
    axis0 = sum(m.pack_axis == 0 for m in packed) > len(packed) / 2
    opts = [("blocked", None), ("interleaved", None)] if axis0 else [("interleaved", None), ("blocked", None)]
    opts += [("block_interleaved", b) for b in BLOCKS if fits(b)]
    return opts


def pack_spec(m: Module, c: Candidate) -> PackSpec:
    codes = m.codes if m.codes is not None else c.table(m.bits)  # a table the format fixes, else the candidate's
    # one value per element (an int8 layer of a mixed-width model): no lanes, no bit order
    single = INT_DTYPES[m.weight.dtype] == m.bits
    segments = tuple(r1 - r0 for _, (r0, r1) in m.parts) \
        if c.per_part and not single and len(m.parts) > 1 and m.pack_axis == 0 else None
    return PackSpec(bits=m.bits, container=CONTAINER_OF[m.weight.dtype], pack_axis=m.pack_axis,
                    lanes="interleaved" if single else c.lanes, block=None if single else c.block,
                    bit_order="lsb" if single else c.bit_order, codes=codes, transposed=m.transposed,
                    pad_code=codes.index(0) if m.pad_code is None else m.pad_code, record=m.record, group_view=m.group_view, group_axis=m.group_axis,
                    segments=segments, fields=m.fields, codec=m.codec, order=m.order, stored_as=m.stored_as)


def hqq_pack_spec(axis: int, group_size: int, packing: str, stored_as: Optional[str] = None) -> PackSpec:
    """HQQ's own layout (mobiusml/hqq hqq/core/bitpack.py) of a ``packing`` ('2bit_u8', '3bit_32', ...): the
    group view cut along its axis 0 into one chunk per field, chunk 0 in the highest field; identity codes;
    ``stored_as``: W_q stored as that float view of its bytes (HQQ view_as_float)."""
    from .inspect import HQQ_BITPACK

    bits, dt, f = HQQ_BITPACK[packing]
    return PackSpec(bits=bits, container=CONTAINER_OF[dt], pack_axis=0, lanes="blocked" if f > 1 else "interleaved",
                    bit_order="msb" if f > 1 else "lsb", codes=tuple(range(1 << bits)), group_view=group_size,
                    group_axis=axis, fields=f if packing == "3bit_32" else None, stored_as=stored_as)


def zero_spec(m: Module) -> Optional[ScaleSpec]:
    return ScaleSpec(key=m.zeros.name, **m.zero_kw) if m.zero_kw else None


def declared_activation_quant(cfg: ModelConfig, where: str = "config.json") -> Optional[str]:
    """The activation quantisation a compressed-tensors config declares (config_groups.*.input_activations):
    'int8_per_token' for dynamic symmetric per-token int8 (W2A8 / W1.58A8: absmax / 127 per token, what
    BitNet computes), None where no group declares one; any other scheme (static, per-tensor, per-group,
    float, other widths, or groups that disagree) is a FormatError naming it - the spec cannot run it, and
    running the linears unquantized would check another model."""
    q = cfg.quantization or {}
    if q.get("quant_method") != "compressed-tensors":
        return None
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise FormatError(f"{where}: quantization_config.config_groups is {type(groups).__name__}, expected a mapping")
    acts = {g: (v or {}).get("input_activations") if isinstance(v, dict) else None for g, v in groups.items()}
    declared = {g: a for g, a in acts.items() if a}
    if not declared:
        return None
    if len(declared) != len(acts):
        raise FormatError(f"{where}: quantization_config.config_groups {sorted(declared)} quantize input activations "
                          f"and {sorted(set(acts) - set(declared))} do not: one activation scheme per model is supported")
    for g, a in declared.items():
        if not isinstance(a, dict):
            raise FormatError(f"{where}: config_groups.{g}.input_activations is {a!r}, expected a mapping")
        got = (a.get("num_bits"), a.get("type", "int"), a.get("symmetric", True), a.get("strategy"), a.get("dynamic"))
        if got != (8, "int", True, "token", True):
            raise FormatError(f"{where}: config_groups.{g}.input_activations = {a!r}: only dynamic symmetric "
                              f"per-token int8 (num_bits 8, type int, symmetric true, strategy 'token', dynamic true) "
                              f"is supported (got num_bits={got[0]!r}, type={got[1]!r}, symmetric={got[2]!r}, "
                              f"strategy={got[3]!r}, dynamic={got[4]!r})")
    return "int8_per_token"


def build_spec(modules: list[Module], floats: dict, c: Candidate, cfg: ModelConfig, name: str) -> CheckpointSpec:
    from .inspect import in_norm_eps

    linears = {}
    for m in modules:
        pk = pack_spec(m, c) if m.packed else None
        if pk is not None and pk.packed_shape(m.logical) != tuple((m.stored or m.weight).shape):
            raise FormatError(f"{m.where()}: {c.label()} needs shape {list(pk.packed_shape(m.logical))}")
        for (hf, rows), kw in zip(m.parts, m.scale_kw):
            # an in-block scale (TQ2_0 'block') is read from the weight tensor itself
            key = m.weight.name if kw and kw.get("granularity") == "block" else (m.scale.name if kw else None)
            sc = ScaleSpec(key=key, op=c.op, **kw) if kw else None
            linears[hf] = LinearEntry(weight_key=m.weight.name, shape=m.logical, pack=pk, scale=sc,
                                      rows=rows if len(m.parts) > 1 else None,
                                      bias_key=getattr(m.bias or m.part_bias.get(hf), "name", None),
                                      zero=zero_spec(m),
                                      levels=m.levels, zero_pack=m.zero_pack,
                                      g_idx=m.g_idx.name if m.act_order else None,
                                      input_norm=InputNorm(m.in_norm.name, in_norm_eps(cfg))
                                      if m.in_norm is not None else None,
                                      rope_interleave=cfg.head_dim if m.rope and hf.endswith(("q_proj", "k_proj"))
                                      else None, neg_key=m.neg.name if m.neg is not None else None)
    # BitNet b1.58 quantises activations to int8, unless no linear is ternary / packed at all: a float
    # checkpoint (every weight an unconstrained float) runs plain linears, as transformers does and as
    # spec_for's "unquantized" spec says
    quantized = any(m.packed or m.weight.kind != "float" for m in modules)
    act = "int8_per_token" if (cfg.arch == "bitnet" and quantized) or \
        (cfg.quantization or {}).get("quant_method") == "bitnet" or \
        (quantized and declared_activation_quant(cfg) == "int8_per_token") else "none"
    ignored = {}
    for m in modules:
        for t, why in ((None if m.zero_kw else m.zeros, "constant zero point, folded into the code table"),
                       (None if m.act_order else m.g_idx, "g_idx == arange(K) // group_size (no act-order)"),
                       (m.shape_t, "logical shape, checked against config.json")):
            if t is not None:
                ignored[t.name] = why
        for leaf, t in m.hqq_meta.items():  # HQQ meta tensors next to W_q (reference.inspect.detect_hqq)
            ignored[t.name] = (f"HQQ meta {leaf} = {m.hqq_values.get(leaf)!r}, "
                               + ("checked against the stored tensors and config.json" if leaf in HQQ_CHECKED
                                  else "not needed to decode"))
    tensors = dict(floats)
    plain = [m for m in modules if plain_float_linear(m)]
    if not quantized and len(plain) == len(modules):
        # a plain float checkpoint: its linears are float tensors under their names, as in spec_for's
        # "unquantized" spec, so that vLLM loads them into unquantised layers (a linear entry would
        # send them to the ternary method, which needs integer values)
        linears = {}
    elif not quantized:
        plain = []
    for m in plain:
        # in a ternary checkpoint, a linear stored as unconstrained floats (no scale, unfused, its logical
        # shape) is one kept in float (transformers' modules_to_not_convert, a quantizer's ignore list): a
        # plain nn.Linear there, with no int8 activation quantisation, so a float tensor here, not a linear
        # entry (which the reference would run through the spec's activation_quant)
        hf = m.parts[0][0]
        linears.pop(hf, None)
        tensors[hf + ".weight"] = m.weight.name
        if m.bias is not None:
            tensors[hf + ".bias"] = m.bias.name
    return CheckpointSpec(name=name, linears=linears, tensors=tensors, activation_quant=act, ignored=ignored)


def plain_float_linear(m: Module) -> bool:
    """A linear stored as an ordinary float matrix: unconstrained values, no scale, unfused, logical shape."""
    return (not m.packed and m.weight.kind == "float" and m.scale is None and len(m.parts) == 1
            and tuple(m.weight.shape) == tuple(m.logical))


class DecodeCache:
    """Strict unpack of every packed weight under a candidate, memoised by (tensor, PackSpec);
    doubles as the reference model's decoder so each candidate is unpacked once."""

    def __init__(self, ckpt: Checkpoint, modules: list[Module]):
        self.ckpt = ckpt
        self.raw = {m.weight.name: ckpt.get(m.weight.name) for m in modules if m.packed}
        self.raw.update({m.neg.name: ckpt.get(m.neg.name) for m in modules if m.neg is not None})  # -1 masks
        self.codes: dict = {}
        self.vals: dict = {}
        self.zeros: dict = {}  # zero point key -> (N, K) float32 (spec.zero_points)
        self.pads: dict = {}  # (key, layout) -> the code its padding holds (pad_code)

    def values(self, key: str, pack: PackSpec, shape: tuple, where: str, neg: Optional[str] = None) -> torch.Tensor:
        """(N, K) int8 values.  The lane/bit unpacking is shared by all code tables of one layout
        (candidates arrive grouped by layout, so only the current layout's codes are kept).  ``neg``: the -1 mask
        of a sign-mask pair whose +1 mask is ``key`` (codec 'sign_masks': W = pos - neg, no code table)."""
        k = (key, pack)
        if k in self.vals:
            return self.vals[k]
        if neg is not None:
            if len(self.vals) >= 2 * len(self.raw):
                self.vals.clear()
            self.vals[k] = unpack_sign_masks(self.raw[key], self.raw[neg], pack, shape, name=where,
                                             neg_name=f"tensor {neg!r}")
            return self.vals[k]
        ncodes = 1 << pack.bits
        layout = pack.replace(codes=tuple(range(ncodes)), pad_code=0)
        if (key, layout) not in self.codes:
            if len(self.codes) >= len(self.raw):
                self.codes.clear()
            c = unpack_codes(self.raw[key], layout, shape)  # (N, K) int64
            self.codes[(key, layout)] = (c, torch.bincount(c.reshape(-1), minlength=ncodes).tolist())
        codes, counts = self.codes[(key, layout)]
        lut, unused = code_lut(pack)
        for code in range(ncodes):
            if bool(unused[code]) and counts[code]:
                raise FormatError(f"{where}: code {code} is unused in table {list(pack.codes)} but occurs "
                                  f"{counts[code]} times at logical positions")
        if len(self.vals) >= 2 * len(self.raw):
            self.vals.clear()
        self.vals[k] = lut.to(torch.int16 if int(lut.abs().max()) > 127 else torch.int8)[codes]
        return self.vals[k]

    def pad_code(self, key: str, pack: PackSpec, shape: tuple, where: str) -> int:
        """The one code that every padding slot of ``pack``'s layout holds in tensor ``key``: the stored tensor must
        be exactly the packing of its codes with that pad code, else a FormatError names the tensor.  Asked of
        the rows a layout pads to one block (Module.one_block), where it tells the padded reading from an unpadded
        packing at twice the width: a writer fills the padding with one code, while the unpadded packing keeps
        half its weights in those slots."""
        layout = pack.replace(codes=tuple(range(1 << pack.bits)), pad_code=0)
        if (key, layout) not in self.pads:
            codes = unpack_codes(self.raw[key], layout, shape)
            found = next((p for p in range(3 if pack.codec == "base3" else 1 << pack.bits)
                          if torch.equal(pack_codes(codes, layout.replace(pad_code=p)), self.raw[key])), None)
            if found is None:
                lanes = f"{pack.lanes}({pack.block})" if pack.block else pack.lanes
                raise FormatError(f"{where}: the padding of its {shape[pack.pack_axis]}-long pack axis to {lanes} "
                                  f"{pack.bit_order} holds more than one code: expected one pad code (what a writer "
                                  f"pads with) in every padding slot")
            self.pads[(key, layout)] = found
        return self.pads[(key, layout)]

    def zero_padded(self, key: str, pack: PackSpec, shape: tuple, where: str) -> None:
        """A bit-packed sign mask (codec 'sign_masks', bits 1) whose pack axis is no multiple of 8: the stored tensor
        must be exactly the packing of its flags with 0 in every padding bit (numpy's packbits and shift-and-or
        packers pad with zeros), else a FormatError names the tensor.  Under the wrong bit order the padding bits are
        read as flags and real flags land in the padding, which a mask of any density does not leave all zero."""
        if (key, pack) not in self.pads:
            raw = self.raw[key]
            if not torch.equal(pack_codes(unpack_codes(raw, pack, shape), pack), raw):
                raise FormatError(f"{where}: the padding bits of its {shape[pack.pack_axis]}-long pack axis (eight "
                                  f"flags per byte, {pack.bit_order} first) are not all 0: expected the writer's zero "
                                  f"padding (wrong bit order?)")
            self.pads[(key, pack)] = 0

    def fingerprint(self, modules: list[Module], c: Candidate) -> str:
        h = hashlib.sha256(c.op.encode())
        for m in modules:
            if m.packed:
                pk = pack_spec(m, c)
                v = self.values(m.weight.name, pk, m.logical, m.where(), m.neg.name if m.neg is not None else None)
                if m.one_block or (pk.codec == "base3" and pk.packed_len(m.logical[pk.pack_axis]) * 5
                                   != m.logical[pk.pack_axis]):
                    # base-3 with a partial last byte: only the right digit order leaves one trit in its padding
                    self.pad_code(m.weight.name, pk, m.logical, m.where())
                if pk.codec == "sign_masks" and pk.bits == 1 and pk.packed_len(m.logical[pk.pack_axis]) * 8 \
                        != m.logical[pk.pack_axis]:
                    # bit-packed masks with a partial last byte: only the right bit order leaves the writer's one
                    # padding flag (0) in both masks' padding bits
                    for key in (m.weight.name, m.neg.name):
                        self.zero_padded(key, pk, m.logical, f"{m.weight.file}: tensor {key!r}")
                if m.zero_kw:  # values = q - zero (ternary HQQ: must be ternary, or the candidate is invalid)
                    zs = zero_spec(m)
                    if m.zeros.name not in self.zeros:  # the same for every candidate: expanded once
                        gi = group_index(self.ckpt.get(m.g_idx.name), m.logical[1], zs.group_size, key=m.g_idx.name,
                                         name=str(m.g_idx.file)) if m.act_order else None
                        self.zeros[m.zeros.name] = zero_points(self.ckpt.get(m.zeros.name), zs, m.logical, m.where(),
                                                               m.zero_pack, gi)
                    v = subtract_zero(v, None, zs, m.logical, m.where(), z=self.zeros[m.zeros.name],
                                      ternary=m.levels == "ternary")
                h.update(v.numpy().tobytes())
        return h.hexdigest()

    def decoder(self, ckpt: Checkpoint, entry: LinearEntry, name: str) -> DecodedLinear:
        if entry.pack is None:
            return decode_linear(ckpt, entry, name)
        vals = self.values(entry.weight_key, entry.pack, entry.shape, entry.weight_key, entry.neg_key)
        return finish_linear(ckpt, entry, vals, name)


@dataclass
class Scored:
    cand: Candidate
    loss: float
    note: str = ""
    stage: str = "screen"  # "screen": SCREEN_TOKENS tokens; "full": the whole text sample
    screen: float = float("inf")  # loss on the screening sequence
    fp: str = ""  # fingerprint of the decoded values (equal -> identical decode)


#: the note of a candidate that fits the stored shapes but does not decode (an unused code at a logical position,
#: padding of more than one code): its failure says more about the checkpoint than a shape mismatch
UNDECODABLE = "does not decode: "


def search(modules, floats, cands: list[Candidate], cfg, ckpt, ids: Optional[torch.Tensor]) -> list[Scored]:
    """Score every candidate (identical decodes share one loss).  Sorted best first; candidates
    that do not fit the stored shapes ('invalid') or do not decode (UNDECODABLE: an unused code, padding of more
    than one code where DecodeCache.pad_code is asked) are kept with loss inf."""
    from .decode import model_loss
    from .model import Overrides

    cache = DecodeCache(ckpt, modules)
    ov = Overrides(decoder=cache.decoder)
    # stage 1 screens every distinct decode on one short sequence; stage 2 re-scores the best few
    # on the whole sample (wrong decodes are off by nats, so the screen cannot lose the right one)
    screen = ids[:1, : SCREEN_TOKENS + 1] if ids is not None else None
    seen: dict[str, tuple[float, Candidate, CheckpointSpec]] = {}
    out = []
    for i, c in enumerate(cands):
        try:
            spec = build_spec(modules, floats, c, cfg, "candidate")
        except (FormatError, CheckpointError) as e:
            out.append(Scored(c, float("inf"), f"invalid: {str(e)[-200:]}", screen=float("inf")))
            continue
        try:
            fp = cache.fingerprint(modules, c)
        except (FormatError, CheckpointError) as e:  # fits the stored shapes, but its codes do not decode
            out.append(Scored(c, float("inf"), f"{UNDECODABLE}{c.label()}: {str(e)[-200:]}", screen=float("inf")))
            continue
        if fp in seen:
            out.append(Scored(c, seen[fp][0], f"identical decode to {seen[fp][1].label()}", screen=seen[fp][0], fp=fp))
            continue
        loss = model_loss(cfg, spec, ckpt, screen, overrides=ov) if screen is not None else float(i)  # prior
        seen[fp] = (loss, c, spec)
        out.append(Scored(c, loss, screen=loss, fp=fp))
    if ids is not None:
        finalists = sorted(seen.items(), key=lambda kv: kv[1][0])[:FINALISTS]
        full = {fp: model_loss(cfg, spec, ckpt, ids) for fp, (_, c, spec) in finalists}  # plain decode path
        for s in out:
            if s.fp in full:
                s.loss, s.stage = full[s.fp], "full"
    return sorted(out, key=lambda s: (s.stage != "full", s.loss, bool(s.note)))


def axis_margins(scored: list[Scored]) -> dict[str, tuple[float, str]]:
    """For each axis, the loss gap from the best to the best candidate that differs in it (on the
    whole sample when that candidate was a finalist, else on the screening sequence)."""
    best = scored[0]
    out = {}
    for axis in ("codes", "bit_order", "lanes", "op", "per_part"):
        key = (lambda c: (c.lanes, c.block)) if axis == "lanes" else \
            (lambda c: (c.codes, c.extra)) if axis == "codes" else (lambda c, a=axis: getattr(c, a))
        alts = [s for s in scored if key(s.cand) != key(best.cand) and math.isfinite(s.loss)]
        if not alts:
            out[axis] = (float("nan"), "no alternative")
            continue
        alt = alts[0]
        if alt.fp == best.fp:
            out[axis] = (0.0, "identical decode (irrelevant here)")
        elif alt.stage == "full":
            out[axis] = (alt.loss - best.loss, alt.cand.label())
        else:
            out[axis] = (alt.screen - best.screen, alt.cand.label() + f" (screen, {SCREEN_TOKENS} tokens)")
    return out


#: below this loss margin (nats) the text sample cannot tell candidates apart (e.g. an untrained
#: model); the inspector then keeps the candidate that public conventions make most likely
PRIOR_MARGIN = 0.05
#: the same for a layout the checkpoint itself names (prior_rank's first class: config.json's
#: quant_method, a TQ2_0 record, HQQ zero points): only a loss this much better overrides it.  Decodes
#: of an untrained model differ by ~0.1 nats (a random BitNet of hidden 128: 0.074), while a wrong decode
#: of a trained one costs far more than 0.5 (tests/test_inspect.py asserts that for every format)
NAMED_MARGIN = 0.5
#: a best decode whose loss lies within this many nats of ln(vocab_size) (a uniform guess) is an untrained
#: model's: its decodes differ by noise (two decodes of one random model up to ~0.1 nats apart, each just under
#: ln V by chance), so only NAMED_MARGIN overrides the prior there; a trained model's decode scores far lower
#: (models/tiny-trained: 0.15 nats against ln 512 = 6.24)
UNTRAINED_BAND = 1.0

#: (lanes, block, bit order) of public conventions (../shared/FORMATS.md), most common first
KNOWN_LAYOUTS = [("blocked", None, "lsb"),  # transformers HF-BitNet pack_weights
                 ("interleaved", None, "lsb"),  # the seed, compressed-tensors, GPTQ
                 ("block_interleaved", 128, "msb"),  # bitnet.cpp I2_S
                 ("block_interleaved", 128, "lsb"),  # llama.cpp TQ2_0 lanes
                 ("blocked", None, "msb"),  # HQQ: chunk 0 in the high bits
                 ("interleaved", None, "msb")]


def prior_rank(c: Candidate, cfg: ModelConfig, record: Optional[tuple] = None, hqq: bool = False,
               axis0: bool = True, i2s: bool = False, signed: bool = False, masks: bool = False) -> tuple:
    """Smaller = more plausible a priori.  A config that names transformers' bitnet method
    points at its layout first, llama.cpp TQ2_0 blocks (``record``) at theirs; codes increasing
    with value (-1 < 0 < +1) beat swapped tables.  ``axis0``: most packed tensors are packed along
    their output axis; when not, transformers' blocked layout (an axis-0 convention) ranks after the
    consecutive-inputs one that every public axis-1 packer uses.  ``signed``: every packed tensor holds one
    value per element of a signed integer dtype (int8 -1 / 0 / +1): its codes are read as two's complement
    first (int8 0xFF is -1, not the largest code).  ``masks``: bit-packed sign-bitmask pairs (codec 'sign_masks'),
    whose usual writer is numpy's ``packbits`` - element 0 in the high bit (bitorder 'big', its default) - msb first."""
    q = (cfg.quantization or {}).get("quant_method")
    layout = (c.lanes, c.block, c.bit_order)
    order = KNOWN_LAYOUTS if axis0 else [KNOWN_LAYOUTS[1], KNOWN_LAYOUTS[0]] + KNOWN_LAYOUTS[2:]
    known = order.index(layout) if layout in order else len(order)
    if q == "bitnet" and layout == ("blocked", None, "lsb"):
        known = -1
    if record is not None and tuple(record) == TQ2_0_RECORD and layout == ("block_interleaved", 128, "lsb"):
        known = -1
    if hqq and layout == ("blocked", None, "msb"):  # HQQ BitPack: four axis-0 chunks, chunk 0 in the high bits
        known = -1
    # GGUF I2_S (``i2s``): the type names bitnet.cpp's layouts, x86's 128-value blocks first, then its ARM build's
    # 64-value blocks (same type id and size; only the loss on text tells them apart)
    if i2s and layout == ("block_interleaved", 128, "msb"):
        known = -1
    if i2s and layout == ("block_interleaved", 64, "msb"):
        known = -0.5
    if masks and layout == ("interleaved", None, "msb"):
        known = -1
    # GPTQ / AWQ / compressed-tensors, and 4-bit packers in general, put consecutive inputs low bits first
    if (q in ("gptq", "awq", "compressed-tensors") or _table_bits(c.codes) == 4) and layout == ("interleaved", None, "lsb"):
        known = -1
    # mixed code widths: the least monotone of the widths' tables
    return (known, max(_monotone(t, signed) for t in (c.codes,) + tuple(c.extra)), c.per_part)


def _table_bits(codes) -> int:
    return max(1, (len(codes) - 1).bit_length())


def _monotone(codes, signed_first: bool = False) -> int:
    """Codes increasing with value, read unsigned (offset binary: 0) or as two's complement (int8
    {-1, 0, 1}: 1); else 2.  ``signed_first``: the codes are elements of a signed dtype, so two's complement
    ranks 0 and offset binary 1."""
    bits = _table_bits(codes)
    vals = [v for v in codes if v is not None]
    signed = [v for _, v in sorted((code - (1 << bits) if code >= 1 << (bits - 1) else code, v)
                                   for code, v in enumerate(codes) if v is not None)]
    ranks = [vals == sorted(vals), signed == sorted(signed)]
    if signed_first:
        ranks.reverse()
    return next((i for i, ok in enumerate(ranks) if ok), 2)


def confidence(margin: float) -> str:
    if math.isnan(margin):
        return "n/a"
    if margin == 0:
        return "equivalent"
    return "high" if margin >= 0.5 else ("medium" if margin >= 0.05 else "low")


