"""Checkpoint spec: how every linear weight of a model is stored, in one JSON file.

The spec is what the inspector produces and what the reference model, ``parity.dump`` and
the vLLM plugin consume.  It is explicit per module, so mixed precision per layer, fused
tensors and odd key names need no special cases:

    {"spec_version": 1, "name": "hf-bitnet-bitlinear", "activation_quant": "int8_per_token",
     "linears": {"model.layers.0.self_attn.q_proj": {
         "weight_key": "model.layers.0.self_attn.q_proj.weight",
         "shape": [128, 128],            # logical [N, K] of the stored (maybe fused) tensor
         "rows": null,                   # [start, stop) of a fused tensor's rows, or null
         "pack": {...PackSpec...},       # null = stored unpacked (float ternary, TriLM)
         "scale": {...ScaleSpec...},     # null = no scale
         "bias_key": null,
         "layout": "trit-tile16x128",    # optional, absent = the "pack" route; see LAYOUTS
         "zero": {...ScaleSpec...},      # optional, absent = none: per-group zero points,
                                         # values = code - zero (HQQ, GPTQ sym=False); see finish_linear
         "zero_pack": {...PackSpec...},  # optional: the zero tensor is packed (GPTQ / AutoAWQ qzeros)
         "g_idx": "model...q_proj.g_idx",  # optional: act-order group index (GPTQ desc_act, compressed-tensors
                                         # actorder group): input k takes group g_idx[k]'s scale / zero point
         "levels": "ternary",            # optional, absent = none: a check that the decoded values
                                         # are -1 / 0 / +1 (HQQ's ternary case)
         "input_norm": {"key": "model...q_proj.rms_norm.weight", "eps": 1e-6},
                                         # optional, absent = none: an RMSNorm of the input inside the
                                         # linear, before its activation quantization (transformers'
                                         # use_rms_norm; InputNorm)
         "neg_key": "model...q_proj.weight_neg",  # optional, absent = none: the -1 mask of a sign-mask pair
                                         # (pack codec 'sign_masks'; weight_key holds the +1 mask, W = pos - neg)
         "rope_interleave": 64},         # optional, absent = none (q / k only): the module's rows are
                                         # stored in interleaved-RoPE order with heads of 64 rows (Meta's
                                         # consolidated checkpoints, Microsoft BitNet's GPU converter:
                                         # '(h l d) -> (h d l)', l = 2) and are put back in transformers'
                                         # order on read (rope_rows_index)
         ...},
     "tensors": {"model.embed_tokens.weight": "model.embed_tokens.weight", ...}}

Module names are the Hugging Face Llama / BitNet names (``model.layers.N.self_attn.q_proj``);
``tensors`` maps every float parameter's HF name to its checkpoint key.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .checkpoint import Checkpoint, CheckpointError
from .config import ModelConfig


def derived_buffer(key: str) -> bool:
    """Checkpoint keys that hold a buffer computed from config.json, not a weight: the RoPE inverse
    frequencies older Llama checkpoints carry (``model.layers.N.self_attn.rotary_emb.inv_freq``).
    transformers and vLLM skip them on load; the reference, the inspector and the BitNet plugin do too."""
    return key.endswith("rotary_emb.inv_freq")
from .formats import HF_BITNET, FormatError, PackSpec, ScaleSpec, expand_scale, group_index, unpack, unpack_sign_masks

SPEC_VERSION = 1
ACT_QUANT = ("none", "int8_per_token")
SPEC_FILENAME = "ternary_spec.json"
#: ``LinearEntry.layout`` values.  ``trit-tile16x128``: ``weight_key`` holds the trit kernel's own
#: packed layout (``trit.ops.repack``: int32 [ceil(N/16), ceil(K/128)*128]) of the logical [N, K]
#: matrix, no ``pack`` / ``rows``, and ``scale`` (if any) is per output channel or per tensor
#: (``multiply``, or ``divide`` when the export keeps a BitLinear divisor so that the reference
#: reproduces the source's arithmetic bit for bit); written by ``python -m trit.export``.
#: ``None`` (the default, omitted from JSON) = the ``pack`` route.
LAYOUTS = ("trit-tile16x128",)
#: ``LinearEntry.levels`` values: ``None`` (any values the format decodes to) or ``"ternary"`` (checked)
LEVELS = (None, "ternary")


@dataclass(frozen=True)
class InputNorm:
    """An RMSNorm applied to a linear's *input* inside the linear, before its activation quantization:
    transformers' BitLinear / AutoBitLinear with ``quantization_config.use_rms_norm`` (a LlamaRMSNorm of
    in_features, eps ``rms_norm_eps``, its weight stored as ``<module>.rms_norm.weight``).  Each module has its
    own weight, so modules that share an input (q / k / v, gate / up) see differently normalized inputs."""
    key: str  # checkpoint key of the norm weight, float [in_features]
    eps: float = 1e-6

    def __post_init__(self):
        eps = self.eps
        if not isinstance(self.key, str) or not self.key or isinstance(eps, bool) or not isinstance(eps, (int, float)) \
                or not math.isfinite(eps) or eps < 0:
            raise FormatError(f"input_norm {{'key': {self.key!r}, 'eps': {eps!r}}}: expected a checkpoint key and a "
                              f"finite eps >= 0")
        object.__setattr__(self, "eps", float(eps))

    def to_dict(self) -> dict:
        return {"key": self.key, "eps": self.eps}


@dataclass(frozen=True)
class LinearEntry:
    weight_key: str
    shape: tuple[int, int]
    pack: Optional[PackSpec] = None
    scale: Optional[ScaleSpec] = None
    rows: Optional[tuple[int, int]] = None
    bias_key: Optional[str] = None
    layout: Optional[str] = None  # None = ``pack`` route; "trit-tile16x128" = kernel layout (LAYOUTS)
    # per-group zero points (HQQ W = (q - z) * s): a ScaleSpec read as the zero z of each group;
    # the packed codes decode to q (code table = identity) and values = q - z: integers where every z
    # is one, else float32 (HQQ's asymmetric quantization stores float zero points)
    zero: Optional[ScaleSpec] = None
    # "ternary": the decoded values must be -1 / 0 / +1 (a CheckpointError otherwise), the inspector's
    # decision for HQQ with integer zero points; None = whatever the format decodes to
    levels: Optional[str] = None
    # the zero point tensor is itself packed integers (GPTQ ``qzeros`` int32 [G, N*b/32]; AutoAWQ's [G, N/8] in
    # AWQ_ORDER, formats.AWQ_GEMM_ZEROS; compressed-tensors >= 0.9.4 ``weight_zero_point`` int32 [ceil(N*b/32), G]
    # packed along N, formats.ct_zero_pack_spec): unpacked with this PackSpec to its [G, N] ([N, G] unless
    # ``zero.transposed``; G = 1 for a 'channel' zero) matrix first, its code table giving the zero (AutoGPTQ v1
    # stores z - 1: code c -> c + 1; AutoAWQ z itself; compressed-tensors z + 2^(b-1): c -> c - 2^(b-1));
    # None = the tensor holds the zero points themselves
    zero_pack: Optional[PackSpec] = None
    # "absmean": the stored weight is the float latent of transformers' online BitNet mode
    # (quantization_mode: online, AutoBitLinear.WeightQuant): values = round(W / mean|W|) clamped to
    # [-1, 1] over this module's matrix, multiplier mean|W| (as 1 / (1 / mean|W|.clamp(1e-5)) in fp32)
    online: Optional[str] = None
    # act-order group index (AutoGPTQ / GPTQModel ``g_idx`` with desc_act, compressed-tensors ``weight_g_idx`` with
    # actorder 'group'): the key of an int [K] tensor; input k takes the scale (and zero point) of group g_idx[k]
    # instead of k // group_size (``formats.group_index`` checks it: a permutation of arange(K) // group_size).
    # Needs a granularity 'group' scale of consecutive-input groups (zero points, if any, of the same groups).
    # None (the default, omitted from JSON) = consecutive groups; a trivial g_idx is listed under ``ignored``
    g_idx: Optional[str] = None
    # an RMSNorm of the input inside the linear (InputNorm: transformers' use_rms_norm); None = none
    input_norm: Optional[InputNorm] = None
    # q / k rows stored in interleaved-RoPE order, heads of this many rows (the head dim D): within each head, stored
    # row 2i + l is transformers' row l * D / 2 + i (Meta's consolidated checkpoints and Microsoft BitNet's GPU
    # converter, gpu/convert_safetensors.py: rearrange '(h l d) i -> (h d l) i', l = 2; transformers'
    # convert_llama_weights_to_hf undoes it with its permute()).  Every reader puts the rows back in transformers'
    # order (rope_rows_index) after decoding, with the row scales; None (the default, omitted from JSON) = as stored
    rope_interleave: Optional[int] = None
    # a weight stored as two sign masks (pack codec 'sign_masks': '<module>.weight_pos' / '.weight_neg', bool / uint8
    # / int8, one flag per element or eight per byte): the key of the -1 mask, ``weight_key`` the +1 mask's, W = pos -
    # neg (formats.unpack_sign_masks); both masks share the PackSpec.  None (the default, omitted from JSON) = one
    # weight tensor
    neg_key: Optional[str] = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        masks = self.pack is not None and self.pack.codec == "sign_masks"
        if masks != (self.neg_key is not None) or (masks and (
                not isinstance(self.neg_key, str) or not self.neg_key or self.neg_key == self.weight_key
                or self.layout is not None or self.zero is not None or self.online is not None)):
            raise FormatError(f"linear {self.weight_key!r}: a sign-mask pair is pack codec 'sign_masks' with neg_key, "
                              f"the -1 mask's key (not the weight's own), and no layout / zero / online; got pack "
                              f"codec {self.pack.codec if self.pack is not None else None!r}, neg_key "
                              f"{self.neg_key!r}")
        if isinstance(self.input_norm, dict):
            object.__setattr__(self, "input_norm", InputNorm(**self.input_norm))
        if self.online is not None and (self.online != "absmean" or self.pack is not None or self.scale is not None
                                        or self.zero is not None or self.layout is not None):
            raise FormatError(f"linear {self.weight_key!r}: online {self.online!r}: only 'absmean', on a float weight "
                              f"without pack / scale / zero / layout (the multiplier comes from the weight itself)")
        if self.rows is not None:
            object.__setattr__(self, "rows", tuple(int(r) for r in self.rows))
        if self.levels not in LEVELS:
            raise FormatError(f"linear {self.weight_key!r}: levels {self.levels!r}, expected one of {list(LEVELS)}")
        if self.layout is not None:
            where = f"linear {self.weight_key!r}"
            if self.layout not in LAYOUTS:
                raise FormatError(f"{where}: unknown layout {self.layout!r}; known: {list(LAYOUTS)}")
            if self.pack is not None or self.rows is not None:
                raise FormatError(f"{where}: layout {self.layout!r} takes no 'pack' and no 'rows' (one "
                                  f"unfused module per tensor, already in the kernel layout)")
        if self.scale is not None and self.scale.granularity == "block":
            _check_block_scale(self)
        if self.zero is not None and (self.pack is None or self.zero.op != "multiply" or self.layout is not None):
            raise FormatError(f"linear {self.weight_key!r}: zero points {self.zero.key!r} need a packed weight "
                              f"('pack', no 'layout') and op 'multiply' (the zero is subtracted, not scaled)")
        if self.zero_pack is not None and (self.zero is None or self.zero.granularity not in ("group", "channel")
                                           or self.zero.group_axis != 1):
            raise FormatError(f"linear {self.weight_key!r}: zero_pack needs group zero points of consecutive inputs "
                              f"or per-channel ones ('zero' with granularity 'group' or 'channel'), got zero "
                              f"{self.zero}")
        if self.g_idx is not None:
            sc, z = self.scale, self.zero
            if sc is None or sc.granularity != "group" or sc.group_axis != 1 or self.layout is not None or (
                    z is not None and (z.granularity != "group" or z.group_axis != 1
                                       or z.group_size != sc.group_size)):
                raise FormatError(f"linear {self.weight_key!r}: act-order group index {self.g_idx!r} needs a "
                                  f"granularity 'group' scale of consecutive-input groups (group_axis 1), zero points "
                                  f"(if any) of the same groups and no 'layout'; got scale {sc}, zero {z}")
        if self.rope_interleave is not None:
            d, n = self.rope_interleave, self.out_shape[0]
            if isinstance(d, bool) or not isinstance(d, int) or d < 2 or d % 2:
                raise FormatError(f"linear {self.weight_key!r}: rope_interleave {d!r}: expected the head dim, an even "
                                  f"integer >= 2")
            if n % d:
                raise FormatError(f"linear {self.weight_key!r}: rope_interleave {d}: its {n} rows are not whole heads "
                                  f"of {d} rows")
            if self.layout is not None or self.bias_key is not None:
                raise FormatError(f"linear {self.weight_key!r}: rope_interleave with "
                                  f"{'a layout' if self.layout is not None else 'a bias'}: not supported (a trit.export "
                                  f"checkpoint is written in transformers' order; no interleaved-RoPE writer stores "
                                  f"q / k biases)")
        if self.layout is not None:
            where = f"linear {self.weight_key!r}"
            if self.scale is not None and (self.scale.granularity not in ("tensor", "channel")
                                           or self.scale.index is not None or self.scale.transposed):
                raise FormatError(f"{where}: layout {self.layout!r} takes a per-channel or per-tensor scale "
                                  f"(no index, not transposed), got {self.scale}")

    @property
    def out_shape(self) -> tuple[int, int]:
        if self.rows is None:
            return self.shape
        return (self.rows[1] - self.rows[0], self.shape[1])

    def to_dict(self) -> dict:
        return {
            "weight_key": self.weight_key,
            "shape": list(self.shape),
            "rows": list(self.rows) if self.rows else None,
            "pack": self.pack.to_dict() if self.pack else None,
            "scale": self.scale.to_dict() if self.scale else None,
            "bias_key": self.bias_key,
            **({"layout": self.layout} if self.layout is not None else {}),  # absent: old JSON unchanged
            **({"zero": self.zero.to_dict()} if self.zero is not None else {}),  # likewise
            **({"online": self.online} if self.online is not None else {}),  # likewise
            **({"levels": self.levels} if self.levels is not None else {}),  # likewise
            **({"zero_pack": self.zero_pack.to_dict()} if self.zero_pack is not None else {}),  # likewise
            **({"g_idx": self.g_idx} if self.g_idx is not None else {}),  # likewise
            **({"input_norm": self.input_norm.to_dict()} if self.input_norm is not None else {}),  # likewise
            **({"rope_interleave": self.rope_interleave} if self.rope_interleave is not None else {}),  # likewise
            **({"neg_key": self.neg_key} if self.neg_key is not None else {}),  # likewise
        }

    @classmethod
    def from_dict(cls, d: dict) -> "LinearEntry":
        fields = [f.name for f in dataclasses.fields(cls)]  # = to_dict's keys
        if not isinstance(d, dict):
            raise FormatError(f"expected an object with {fields[:2]} ..., got a {type(d).__name__}")
        unknown = sorted(set(d) - set(fields))
        if unknown:  # a misspelt field would otherwise be dropped and its default used
            raise FormatError(f"unknown field(s) {unknown}; a linear entry has {fields}")
        for k in ("weight_key", "shape"):
            if k not in d:
                raise FormatError(f"no {k!r} (a linear entry needs weight_key and shape)")
        if not (isinstance(d["shape"], (list, tuple)) and len(d["shape"]) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in d["shape"])):
            raise FormatError(f"shape {d['shape']!r}: expected [N, K], two positive integers")
        return cls(
            weight_key=d["weight_key"], shape=tuple(d["shape"]),
            rows=tuple(d["rows"]) if d.get("rows") else None,
            pack=PackSpec.from_dict(d["pack"]) if d.get("pack") else None,
            scale=ScaleSpec(**d["scale"]) if d.get("scale") else None,
            bias_key=d.get("bias_key"), layout=d.get("layout"),
            zero=ScaleSpec(**d["zero"]) if d.get("zero") else None, online=d.get("online"), levels=d.get("levels"),
            zero_pack=PackSpec.from_dict(d["zero_pack"]) if d.get("zero_pack") else None, g_idx=d.get("g_idx"),
            input_norm=InputNorm(**d["input_norm"]) if d.get("input_norm") else None,
            rope_interleave=d.get("rope_interleave"), neg_key=d.get("neg_key"))


@dataclass(frozen=True)
class CheckpointSpec:
    name: str
    linears: dict = field(hash=False)  # module name -> LinearEntry
    tensors: dict = field(hash=False)  # HF float param name -> checkpoint key
    activation_quant: str = "none"
    # checkpoint keys that were checked and are not needed to compute (a trivial GPTQ g_idx, constant qzeros,
    # compressed-tensors weight_shape): key -> why.  Optional; omitted from JSON when empty.
    ignored: dict = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if self.activation_quant not in ACT_QUANT:
            raise FormatError(f"spec {self.name!r}: activation_quant must be one of {ACT_QUANT}")

    def to_dict(self) -> dict:
        d = {"spec_version": SPEC_VERSION, "name": self.name, "activation_quant": self.activation_quant,
             "linears": {k: v.to_dict() for k, v in self.linears.items()}, "tensors": dict(self.tensors)}
        if self.ignored:
            d["ignored"] = dict(self.ignored)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict, where: str = "spec") -> "CheckpointSpec":
        if not isinstance(d, dict):
            raise FormatError(f"{where}: expected a JSON object (spec_version, name, activation_quant, linears, "
                              f"tensors), got a {type(d).__name__}")
        if d.get("spec_version") != SPEC_VERSION:
            raise FormatError(f"{where}: spec_version {d.get('spec_version')!r}, this code reads {SPEC_VERSION}")
        known = ["spec_version"] + [f.name for f in dataclasses.fields(cls)]  # = to_dict's keys
        unknown = sorted(set(d) - set(known))
        if unknown:  # e.g. 'activation_quantization': dropped, the goldens would be computed without quantisation
            raise FormatError(f"{where}: unknown field(s) {unknown}; a spec has {list(known)}")
        for k, typ in (("name", str), ("linears", dict), ("tensors", dict)):
            if k not in d:
                raise FormatError(f"{where}: no {k!r}")
            if not isinstance(d[k], typ):
                raise FormatError(f"{where}: {k!r} is a {type(d[k]).__name__}, expected a "
                                  f"{'JSON object' if typ is dict else 'string'}")
        linears = {}
        for k, v in d["linears"].items():
            try:
                linears[k] = LinearEntry.from_dict(v)
            except (ValueError, KeyError, TypeError) as e:  # FormatError is a ValueError
                raise FormatError(f"{where}: linears[{k!r}]: {e}") from e
        try:
            return cls(name=d["name"], activation_quant=d.get("activation_quant", "none"), linears=linears,
                       tensors=dict(d["tensors"]), ignored=dict(d.get("ignored") or {}))
        except (KeyError, TypeError) as e:
            raise FormatError(f"{where}: malformed spec ({e!r})")
        except FormatError as e:
            raise FormatError(f"{where}: {e}") from e

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CheckpointSpec":
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise FormatError(f"{p}: invalid JSON ({e})") from e
        return cls.from_dict(d, where=str(p))

    def save(self, path: str | os.PathLike) -> None:
        from .io import atomic_write_text

        atomic_write_text(Path(path), self.to_json())

    def digest(self) -> str:
        import hashlib

        return hashlib.sha256(self.to_json().encode()).hexdigest()

    # -- validation against a model ---------------------------------------------------
    def validate(self, cfg: ModelConfig, ckpt: Checkpoint) -> None:
        """Every module the architecture needs is covered, shapes agree, every key exists,
        and every checkpoint key is used by something (an unknown key is an error)."""
        check_layer_count(cfg, ckpt, ckpt.path)
        need = cfg.linear_shapes()
        if cfg.tie_word_embeddings and "lm_head" not in self.linears:
            need.pop("lm_head")  # a ternary lm_head stored although tied is untied (see tied_lm_head_key)
        used: set[str] = set()
        for mod, shape in need.items():
            e = self.linears.get(mod)
            if e is None:
                key = self.tensors.get(mod + ".weight")
                if key is not None:  # a float linear (unquantised model, modules_to_not_convert, lm_head)
                    if mod == "lm_head" and key not in ckpt:
                        raise CheckpointError(f"{ckpt.path}: no tensor {key!r} (lm_head.weight): {UNTIED_HEAD_HINT}")
                    info = ckpt.info(key)
                    if tuple(info.shape) != tuple(shape):
                        raise CheckpointError(f"{info.file}: tensor {key!r} ({mod}) has shape {list(info.shape)}, "
                                              f"config.json implies {list(shape)}")
                    _check_float_dtype(info, mod)
                    used.add(key)
                    bkey = self.tensors.get(mod + ".bias")
                    _check_bias_declared(cfg, ckpt, mod, bkey, key)
                    if bkey is not None:
                        _check_bias(ckpt, bkey, mod, shape[0])
                    continue
                raise CheckpointError(f"spec {self.name!r}: no entry for module {mod!r} (expected logical shape {shape})")
            if e.out_shape != shape:
                raise CheckpointError(f"spec {self.name!r}: {mod} has logical shape {e.out_shape}, config.json "
                                      f"implies {shape}")
            if e.rope_interleave is not None and (not mod.endswith(("self_attn.q_proj", "self_attn.k_proj"))
                                                  or e.rope_interleave != cfg.head_dim):
                raise CheckpointError(f"spec {self.name!r}: {mod} has rope_interleave {e.rope_interleave}; only q_proj / "
                                      f"k_proj rows are rotated, in heads of config.json's head_dim {cfg.head_dim}")
            info = ckpt.info(e.weight_key)
            if e.layout is not None:
                want = layout_shape(e.layout, e.shape)
                if tuple(info.shape) != want:
                    raise CheckpointError(
                        f"{info.file}: tensor {e.weight_key!r} has shape {list(info.shape)}, a logical "
                        f"{list(e.shape)} matrix in layout {e.layout} needs {list(want)}")
            elif e.pack is not None:
                want = e.pack.packed_shape(e.shape)
                for key in (e.weight_key, e.neg_key) if e.neg_key is not None else (e.weight_key,):
                    got = ckpt.info(key)
                    if tuple(got.shape) != want:
                        what = (f"the {'+1' if key == e.weight_key else '-1'} mask of a sign-mask pair "
                                f"({'one flag per element' if e.pack.bits == 8 else 'eight flags per byte'})"
                                if e.neg_key is not None else
                                f"format {e.pack.container}/{e.pack.lanes}/axis{e.pack.pack_axis}")
                        raise CheckpointError(f"{got.file}: tensor {key!r} has shape {list(got.shape)}, a logical "
                                              f"{list(e.shape)} matrix in {what} needs {list(want)}")
                if e.neg_key is not None:
                    used.add(e.neg_key)
            elif tuple(info.shape) != e.shape:
                raise CheckpointError(f"{info.file}: tensor {e.weight_key!r} has shape {list(info.shape)}, "
                                      f"expected {list(e.shape)}")
            used.add(e.weight_key)
            if e.scale:
                ckpt.info(e.scale.key)
                used.add(e.scale.key)
            if e.zero:
                ckpt.info(e.zero.key)
                used.add(e.zero.key)
            if e.g_idx:
                ckpt.info(e.g_idx)
                used.add(e.g_idx)
            if e.input_norm is not None:
                _check_input_norm(ckpt, e.input_norm.key, mod, shape[1])
                used.add(e.input_norm.key)
            _check_bias_declared(cfg, ckpt, mod, e.bias_key, e.weight_key)
            if e.bias_key:
                _check_bias(ckpt, e.bias_key, mod, shape[0], fused=e if e.rows is not None else None)
                used.add(e.bias_key)
        for extra in set(self.linears) - set(need):
            raise CheckpointError(f"spec {self.name!r}: module {extra!r} is not part of this architecture")
        for hf, shape in cfg.float_params().items():
            key = self.tensors.get(hf)
            if key is None:
                raise CheckpointError(f"spec {self.name!r}: no checkpoint key for parameter {hf!r}")
            info = ckpt.info(key)
            if tuple(info.shape) != tuple(shape):
                raise CheckpointError(f"{info.file}: tensor {key!r} ({hf}) has shape {list(info.shape)}, "
                                      f"config.json implies {list(shape)}")
            _check_float_dtype(info, hf)
            used.add(key)
        linear_params = {f"{m}.{w}" for m in need for w in ("weight", "bias")}
        if cfg.tie_word_embeddings:
            linear_params.add("lm_head.weight")  # a stored copy (tied_lm_head_key)
        for hf, key in self.tensors.items():
            if hf not in cfg.float_params() and hf not in linear_params:
                raise CheckpointError(f"spec {self.name!r}: maps unknown parameter {hf!r} -> {key!r}")
            ckpt.info(key)
            used.add(key)
        for key in self.ignored:
            ckpt.info(key)  # must exist: a spec naming a missing key is wrong
            used.add(key)
        head = tied_lm_head_key(cfg, self, ckpt)
        if head is not None:
            used.add(head)
        unknown = [k for k in ckpt.keys() if k not in used and not derived_buffer(k)]
        if unknown:
            raise CheckpointError(
                f"{ckpt.path}: {len(unknown)} checkpoint tensors are not used by spec {self.name!r}: "
                f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''} (unknown keys; fix the spec's key mapping)")


#: safetensors dtypes of float tensors (embeddings, norms, float linears): what the inspector accepts there too
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def _check_float_dtype(info, what: str) -> None:
    """A float parameter (embedding, norm weight, float linear) stored as a float: an integer or bool tensor there
    is a mis-mapped key or a damaged file (its codes were read as values: an I8 embedding gave goldens, exit 0),
    refused as the inspector refuses it."""
    if info.dtype not in FLOAT_DTYPES:
        raise CheckpointError(f"{info.file}: tensor {info.name!r} ({what}) is {info.dtype}, expected a float tensor "
                              f"({' / '.join(FLOAT_DTYPES)})")


def _check_input_norm(ckpt: Checkpoint, key: str, mod: str, k: int) -> None:
    """The input RMSNorm weight of module ``mod`` (InputNorm): a float [in_features] tensor."""
    info = ckpt.info(key)
    if info.dtype not in ("F64", "F32", "F16", "BF16") or tuple(info.shape) != (k,):
        raise CheckpointError(f"{info.file}: tensor {key!r} (the input RMSNorm weight of {mod}) is {info.dtype} "
                              f"{list(info.shape)}, expected a float [{k}] (in_features)")


#: why a model needs an lm_head tensor: transformers' default (and the reference's) for a missing key is untied
UNTIED_HEAD_HINT = ("config.json's tie_word_embeddings is false or absent (transformers' default: false), so the "
                    "output embedding is its own tensor; set \"tie_word_embeddings\": true if the model reuses the "
                    "input embedding")


def tied_lm_head_key(cfg: ModelConfig, spec: "CheckpointSpec", ckpt: Checkpoint) -> Optional[str]:
    """The checkpoint key of an output embedding stored although config.json ties it (spec.tensors'
    "lm_head.weight", else a tensor named lm_head.weight), or None.  transformers (PreTrainedModel.tie_weights)
    and vLLM (ModelConfig.maybe_untie_word_embeddings) then tie only if it equals the input embedding and
    otherwise use it as an untied lm_head; the reference does the same (ReferenceModel).  A *ternary* lm_head
    (a spec entry "lm_head": packed + scale) never equals the float embedding, so it is untied as well; it is
    a linear entry, not a float copy, and this returns None for it."""
    if not cfg.tie_word_embeddings or "lm_head" in spec.linears:
        return None
    key = spec.tensors.get("lm_head.weight") or ("lm_head.weight" if "lm_head.weight" in ckpt else None)
    if key is None:
        return None
    info = ckpt.info(key)
    want = (cfg.vocab_size, cfg.hidden_size)
    if tuple(info.shape) != want:
        raise CheckpointError(f"{info.file}: tensor {key!r} (lm_head.weight) has shape {list(info.shape)}, "
                              f"config.json implies {list(want)} (tie_word_embeddings=true and an lm_head stored)")
    return key


def _check_block_scale(e: LinearEntry) -> None:
    """An in-block scale (ScaleSpec granularity 'block') lives in the records of its own weight:
    same key, a record-packed weight whose record size / elements it matches, scale bytes outside
    the code bytes."""
    sc, pk = e.scale, e.pack
    where = f"linear {e.weight_key!r}"
    if pk is None or pk.record is None:
        raise FormatError(f"{where}: in-block scale {sc.key!r} needs a record-packed weight ('pack' with 'record')")
    if sc.key != e.weight_key:
        raise FormatError(f"{where}: in-block scale key {sc.key!r} must be the weight's own key")
    if (sc.group_size, sc.record_bytes) != tuple(pk.record):
        raise FormatError(f"{where}: in-block scale covers {sc.group_size} values in {sc.record_bytes}-byte records, "
                          f"the weight's records are {pk.record[0]} values in {pk.record[1]} bytes")
    if sc.byte_offset < pk.code_bytes:
        raise FormatError(f"{where}: in-block scale at byte {sc.byte_offset} overlaps the {pk.code_bytes} code bytes "
                          f"of each record")


def _check_bias_declared(cfg: ModelConfig, ckpt: Checkpoint, mod: str, bias_key: Optional[str],
                         weight_key: str) -> None:
    """A linear has a bias exactly where config.json builds one (attention_bias / mlp_bias; BitNet's MLP never), as
    transformers and vLLM do: a declared bias the checkpoint lacks ran as no bias at all, and a stored one the config
    does not declare was added although transformers drops it (unexpected key) and vLLM's loader has no such
    parameter - either way another model than theirs, with no word.  (lm_head has no bias in either family.)"""
    if mod == "lm_head":
        return
    attn = ".self_attn." in mod
    flag = "attention_bias" if attn else "mlp_bias"
    want = _has_bias(cfg, mod)
    if want and bias_key is None:
        info = ckpt.info(weight_key)
        raise CheckpointError(f"{info.file}: no bias for {mod} (weight {weight_key!r}): config.json's {flag} is true, "
                              f"so transformers and vLLM build {mod}.bias; expected a bias tensor beside the weight "
                              f"(the spec's bias key), or {flag}: false if the model has none")
    if not want and bias_key is not None:
        flagged = attn or cfg.arch != "bitnet"  # (BitNet's MLP: no config key gives it a bias)
        why = (f"{flag} is false" if flagged
               else "the BitNet architecture's MLP has no bias (transformers' BitNetMLP, whatever mlp_bias says)")
        raise CheckpointError(f"{ckpt.info(bias_key).file}: tensor {bias_key!r} (bias of {mod}): config.json's {why}, "
                              f"so transformers drops this tensor as an unexpected key and vLLM has no parameter for "
                              f"it; expected no bias" + (f", or {flag}: true if the model has one" if flagged else ""))


def _check_bias(ckpt: Checkpoint, key: str, mod: str, n: int, fused: Optional["LinearEntry"] = None) -> None:
    """A linear's bias holds one value per output feature (a [1] bias would broadcast silently), all finite.  A
    module of a fused-on-disk tensor (``fused``: its entry, with ``rows``) may keep its own bias or share the fused
    tensor's, one value per row of the fused tensor, in the weight's row order (``module_bias`` slices it)."""
    info = ckpt.info(key)
    if fused is not None and tuple(info.shape) == (fused.shape[0],):
        pass
    elif tuple(info.shape) != (n,):
        also = (f" (or [{fused.shape[0]}], the rows of the fused tensor {fused.weight_key!r})"
                if fused is not None else "")
        raise CheckpointError(f"{info.file}: tensor {key!r} (bias of {mod}) has shape {list(info.shape)}, "
                              f"config.json implies [{n}]{also}")
    b = ckpt.get(key)
    if b.is_floating_point() and not bool(torch.isfinite(b).all()):  # every output NaN otherwise, named nowhere
        raise CheckpointError(f"{info.file}: tensor {key!r} (bias of {mod}) has {int((~torch.isfinite(b)).sum())} "
                              f"NaN/Inf values, expected finite floats")


# ---------------------------------------------------------------------------------------
# loading one linear


@dataclass
class DecodedLinear:
    """Integer matrix + float multiplier of one module: W_eff = values * mult."""

    values: torch.Tensor  # (N, K) int8 (int16 past int8; float32 for unpacked storage or float zero points)
    mult: torch.Tensor  # float32, broadcastable to (N, K): (1,1) | (N,1) | (N,K)
    bias: Optional[torch.Tensor] = None
    div: Optional[torch.Tensor] = None  # the stored scale when the format divides (mult = 1/div)

    def effective(self) -> torch.Tensor:
        return self.values.to(torch.float32) * self.mult


def layout_shape(layout: str, shape: tuple[int, int]) -> tuple[int, int]:
    """Stored shape of a logical [N, K] matrix in a kernel ``layout`` (see LAYOUTS)."""
    if layout != "trit-tile16x128":
        raise FormatError(f"unknown layout {layout!r}; known: {list(LAYOUTS)}")
    n, k = shape
    return (-(-n // 16), -(-k // 128) * 128)  # = trit.ops.packed_shape, without importing trit


def unpack_layout(raw: torch.Tensor, layout: str, shape: tuple[int, int], *, where: str = "tensor",
                  strict: bool = True) -> torch.Tensor:
    """A tensor stored in a kernel ``layout`` -> int8 [N, K] in {-1, 0, +1} (exact)."""
    want = layout_shape(layout, shape)
    if raw.dtype != torch.int32 or tuple(raw.shape) != want:
        raise CheckpointError(f"{where}: layout {layout} of a logical {list(shape)} matrix needs int32 "
                              f"{list(want)}, got {raw.dtype} {list(raw.shape)}")
    from trit.ops import unpack as trit_unpack  # lazy: only exported checkpoints need trit

    vals = trit_unpack(raw.contiguous(), *shape)
    if strict and vals.numel() and int(vals.abs().max()) > 1:
        idx = tuple(int(i) for i in (vals.abs() > 1).nonzero()[0])
        raise CheckpointError(f"{where}: unused code 3 at logical index {idx} (layout {layout} holds codes "
                              f"0/1/2 = -1/0/+1 only) — corrupt or not a trit export")
    return vals


def decode_linear(ckpt: Checkpoint, entry: LinearEntry, name: str, *, strict: bool = True) -> DecodedLinear:
    """Read and decode one module's weight through its spec entry (fp32 multiplier)."""
    raw = ckpt.get(entry.weight_key)
    where = f"{ckpt.info(entry.weight_key).file}: tensor {entry.weight_key!r} ({name})"
    if entry.online is not None:  # (one multiplier for the whole matrix: only the values' rows move)
        d = online_absmean(raw, entry, where, ckpt.get(entry.bias_key).to(torch.float32) if entry.bias_key else None)
        return dataclasses.replace(d, values=rope_rows(d.values, entry).contiguous())
    if entry.layout is not None:
        vals = unpack_layout(raw, entry.layout, entry.shape, where=where, strict=strict)
    elif entry.pack is not None:
        try:
            if entry.neg_key is not None:  # a sign-mask pair: W = pos (this tensor) - neg
                vals = unpack_sign_masks(raw, ckpt.get(entry.neg_key), entry.pack, entry.shape, name=where,
                                         neg_name=f"{ckpt.info(entry.neg_key).file}: tensor {entry.neg_key!r}")
            else:
                vals = unpack(raw, entry.pack, entry.shape, name=where, strict=strict)
        except FormatError as e:
            raise CheckpointError(str(e) if where in str(e) else f"{where}: {e}") from None
    else:
        if tuple(raw.shape) != entry.shape:
            raise CheckpointError(f"{where}: shape {list(raw.shape)}, expected {list(entry.shape)}")
        vals = raw.to(torch.float32)
        if not bool(torch.isfinite(vals).all()):
            raise CheckpointError(f"{where}: has NaN/Inf values")
    return finish_linear(ckpt, entry, vals, where)


def online_absmean(raw: torch.Tensor, entry: LinearEntry, where: str, bias: Optional[torch.Tensor] = None,
                   ) -> DecodedLinear:
    """transformers' online BitNet weight quantizer (WeightQuant) on a stored float weight, over this
    module's rows: s = 1 / mean|W|.clamp(1e-5) in fp32, values = round(W * s).clamp(-1, 1), and the
    module divides by s (div = s, mult = 1 / s: bit for bit what W_q / s gives for W_q in {-1, 0, 1})."""
    if tuple(raw.shape) != entry.shape:
        raise CheckpointError(f"{where}: shape {list(raw.shape)}, expected {list(entry.shape)} (float weight, "
                              f"quantized online)")
    if not raw.is_floating_point():
        raise CheckpointError(f"{where}: dtype {raw.dtype}, expected a float latent weight (quantization_mode online)")
    w = raw.to(torch.float32)
    if entry.rows is not None:
        w = w[entry.rows[0]:entry.rows[1]]
    if not bool(torch.isfinite(w).all()):
        raise CheckpointError(f"{where}: has NaN/Inf values, expected a finite float latent weight")
    s = 1.0 / w.abs().mean().clamp(min=1e-5)
    vals = (w * s).round().clamp(-1, 1).to(torch.int8)
    return DecodedLinear(vals.contiguous(), (1.0 / s).reshape(1, 1), bias, s.reshape(1, 1))


def zero_matrix(zero: torch.Tensor, zspec: ScaleSpec, zpack: Optional[PackSpec], shape: tuple[int, int],
                where: str) -> torch.Tensor:
    """The zero point tensor as stored, or, packed (``zpack``: GPTQ / AutoAWQ qzeros, compressed-tensors
    weight_zero_point), its unpacked [G, N] (``transposed``) / [N, G] matrix of zero points (the code table's
    values), G = ceil(K / group_size), or 1 for per-channel zero points; ``zspec.padded_groups`` where the packed
    tensor holds padding groups too (AutoAWQ gemv qzeros [N, calculate_zeros_width]: its [N, padded_groups]
    matrix, whose padding ``expand_scale`` checks and drops)."""
    if zpack is None:
        return zero
    n, k = shape
    g = 1 if zspec.granularity == "channel" else zspec.padded_groups or -(-k // zspec.group_size)
    try:
        return unpack(zero, zpack, (g, n) if zspec.transposed else (n, g), name=f"{where}: zero points {zspec.key!r}")
    except FormatError as e:
        raise FormatError(f"{e} (expected {zpack.bits}-bit zero points of {g} groups x {n} outputs packed in "
                          f"{zpack.container}{', stored transposed' if zspec.transposed else ''})") from None


def zero_points(zero: torch.Tensor, zspec: ScaleSpec, shape: tuple[int, int], where: str,
                zpack: Optional[PackSpec] = None, g_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-group zero points (HQQ, GPTQ) broadcast to (N, K) as float32 (finite, shape-checked by ``expand_scale``;
    unpacked first where ``zpack`` says the tensor is packed; ``g_idx``: a checked act-order group index,
    ``formats.group_index``)."""
    return expand_scale(zero_matrix(zero, zspec, zpack, shape, where), zspec, shape, name=where, g_idx=g_idx)


def group_index_of(ckpt: Checkpoint, entry: LinearEntry) -> Optional[torch.Tensor]:
    """The entry's act-order group index (``LinearEntry.g_idx``) read and checked (``formats.group_index``: int
    [K], values in [0, G), a permutation of arange(K) // group_size), or None; a CheckpointError names the file and
    tensor."""
    if entry.g_idx is None:
        return None
    try:
        return group_index(ckpt.get(entry.g_idx), entry.shape[1], entry.scale.group_size, key=entry.g_idx,
                           name=str(ckpt.info(entry.g_idx).file))
    except FormatError as e:
        raise CheckpointError(str(e)) from None


def subtract_zero(codes: torch.Tensor, zero: Optional[torch.Tensor], zspec: ScaleSpec, shape: tuple[int, int],
                  where: str, *, z: Optional[torch.Tensor] = None, ternary: bool = False,
                  zpack: Optional[PackSpec] = None, g_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Values ``codes - z`` of a format with per-group zero points (HQQ): integers (int8, or int16 where
    they do not fit) when every zero point is an integer, else float32 (exact: codes and zero points
    are narrow).  ``ternary``: z must be integer-valued and every value in {-1, 0, +1}, else a
    FormatError naming the zero point tensor.  ``z``: the ``zero_points`` of ``zero``, when the caller
    already has them (the inspector's search).  ``g_idx``: the act-order group index (``group_index_of``)."""
    if z is None:
        z = zero_points(zero, zspec, shape, where, zpack, g_idx)
    frac = z != z.round()
    if bool(frac.any()):
        if ternary:
            src = zero.detach().float().reshape(-1) if zero is not None and zpack is None else z.reshape(-1)
            i = int((src != src.round()).nonzero()[0]) if bool((src != src.round()).any()) else 0
            raise FormatError(f"{where}: zero point tensor {zspec.key!r} holds non-integer values (e.g. "
                              f"{float(src[i])} at element {i}): (q - z) is not ternary; expected integer zero "
                              f"points (1 or 2 for 2-bit codes)")
        return codes.to(torch.float32) - z
    vals = codes.to(torch.int16) - z.to(torch.int16)
    if ternary and vals.numel() and int(vals.abs().max()) > 1:
        idx = tuple(int(i) for i in (vals.abs() > 1).nonzero()[0])
        raise FormatError(f"{where}: code - zero = {int(vals[idx])} at logical index {idx} (zero points "
                          f"{zspec.key!r}): not ternary; expected every (q - z) in {{-1, 0, +1}}")
    fits = not (vals.numel() and int(vals.abs().max()) > 127)
    return vals.to(torch.int8) if fits else vals


def check_levels(vals: torch.Tensor, entry: LinearEntry, where: str) -> None:
    """``levels`` 'ternary': every decoded value -1, 0 or +1 (a CheckpointError naming the first other one)."""
    if entry.levels == "ternary" and vals.numel():
        bad = vals.abs() > 1
        if vals.is_floating_point():
            bad |= vals != vals.round()
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            raise CheckpointError(f"{where}: value {float(vals[idx])} at logical index {idx}, but the spec says "
                                  f"levels 'ternary': expected -1, 0 or +1")


def rope_rows_index(n: int, head_dim: int) -> torch.Tensor:
    """Row index that puts n = H * head_dim rows stored in interleaved-RoPE order (``LinearEntry.rope_interleave``)
    back in transformers' order: ``hf = stored[idx]``, i.e. transformers' row h*D + l*D/2 + i is stored row
    h*D + 2*i + l (D = head_dim, l in {0, 1}, i < D / 2) - convert_llama_weights_to_hf's permute()."""
    if head_dim < 2 or head_dim % 2 or n % head_dim:
        raise FormatError(f"rope_rows_index: {n} rows are not whole heads of an even head dim {head_dim}")
    return torch.arange(n).view(n // head_dim, head_dim // 2, 2).transpose(1, 2).reshape(-1)


def rope_rows(t: Optional[torch.Tensor], entry: LinearEntry) -> Optional[torch.Tensor]:
    """``t``'s rows in transformers' order where ``entry`` stores its rows in interleaved-RoPE order and ``t`` holds
    one row per output of the module (values, row scales, zero points); t itself otherwise (None, a (1, ...)
    broadcast multiplier, no rope_interleave)."""
    if t is None or entry.rope_interleave is None or t.dim() == 0:
        return t
    n = entry.out_shape[0]
    if t.shape[0] != n or n == 1:
        return t
    return t[rope_rows_index(n, entry.rope_interleave).to(t.device)]


def module_bias(ckpt: Checkpoint, entry: LinearEntry) -> Optional[torch.Tensor]:
    """The bias of one module as stored, or None: its own tensor, or - a module of a fused-on-disk tensor whose bias is
    fused too (one value per row of the fused tensor, as a writer that fuses q / k / v stores their biases) - its
    ``rows`` of that bias.  Before, the fused bias was taken whole: refused as misshapen by the spec's validation,
    while vLLM's own loader splits such a bias."""
    if not entry.bias_key:
        return None
    b = ckpt.get(entry.bias_key)
    if entry.rows is not None and b.dim() == 1 and b.shape[0] == entry.shape[0] != entry.out_shape[0]:
        b = b[entry.rows[0]:entry.rows[1]].contiguous()
    return b


def finish_linear(ckpt: Checkpoint, entry: LinearEntry, vals: torch.Tensor, where: str) -> DecodedLinear:
    """The shared tail of every decoder: zero points (values = code - z), the fused-row slice, the scale (and the stored divisor
    of a 'divide' format, so the reference can follow its arithmetic order) and the bias.  An act-order group index
    (``LinearEntry.g_idx``) picks each input's group column of the zero points and scales."""
    gi = group_index_of(ckpt, entry)
    if entry.zero is not None:
        try:
            vals = subtract_zero(vals, ckpt.get(entry.zero.key), entry.zero, entry.shape, where,
                                 ternary=entry.levels == "ternary", zpack=entry.zero_pack, g_idx=gi)
        except FormatError as e:
            raise CheckpointError(str(e)) from None
    else:  # (subtract_zero checked these)
        check_levels(vals, entry, where)
    if entry.rows is not None:
        vals = vals[entry.rows[0]:entry.rows[1]]
    div = None
    if entry.scale is not None:
        raw_s = ckpt.get(entry.scale.key)
        if entry.scale.granularity != "block" and not raw_s.is_floating_point():
            # (block scales sit inside byte records, read by record_scales) an integer header dtype would be read as
            # numbers: 1102703775 for the bytes of 23.24
            raise CheckpointError(f"{ckpt.info(entry.scale.key).file}: scale {entry.scale.key!r} ({where}) is "
                                  f"{raw_s.dtype}; expected a float tensor (F32 / F16 / BF16)")
        try:
            mult = expand_scale(raw_s, entry.scale, entry.shape, rows=entry.rows, name=where,
                                g_idx=gi)
            if entry.scale.op == "divide":
                div = expand_scale(raw_s, dataclasses.replace(entry.scale, op="multiply"),
                                   entry.shape, rows=entry.rows, name=where, g_idx=gi)
        except FormatError as e:
            raise CheckpointError(str(e)) from None
    else:
        mult = torch.ones(1, 1)
    bias = module_bias(ckpt, entry)
    bias = bias.to(torch.float32) if bias is not None else None
    if entry.rope_interleave is not None:  # q / k rows of an interleaved-RoPE writer: transformers' order
        vals, mult, div = rope_rows(vals, entry), rope_rows(mult, entry), rope_rows(div, entry)
    return DecodedLinear(vals.contiguous(), mult, bias, div)


# ---------------------------------------------------------------------------------------
# spec builders for known conventions


def linear_modules(cfg: ModelConfig) -> list[str]:
    return [m for m in cfg.linear_shapes() if m != "lm_head"]


#: other spellings of the BitNet sub-norms: 1bitLLM's remote code (config.ONEBIT_LLM) names them inner_attn_ln /
#: ffn_layernorm (as llama.cpp's tensor map knows them)
SUB_NORM_ALIASES = {".self_attn.attn_sub_norm.weight": ".self_attn.inner_attn_ln.weight",
                    ".mlp.ffn_sub_norm.weight": ".mlp.ffn_layernorm.weight"}


def _float_tensors(cfg: ModelConfig, ckpt_keys) -> dict[str, str]:
    """{HF parameter name: checkpoint key} of the non-linear parameters: the name itself, or a sub-norm's other
    spelling (``SUB_NORM_ALIASES``) where the checkpoint stores that one instead."""
    keys = set(ckpt_keys or ())
    # a sub-norm stored under neither name is looked for (and named missing) under the spelling the others use
    aliased = any(k.endswith(b) for k in keys for b in SUB_NORM_ALIASES.values())
    t = {}
    for k in cfg.float_params():
        alias = next((k[: -len(a)] + b for a, b in SUB_NORM_ALIASES.items() if k.endswith(a)), None)
        t[k] = alias if alias is not None and k not in keys and (alias in keys or aliased) else k
    if not cfg.tie_word_embeddings:
        t["lm_head.weight"] = "lm_head.weight"
    return t


#: checkpoint key suffixes a linear's scale is found under, transformers' own first:
#: ``<module>.weight_scale``, ``<module>.weight.scale``, ``<module>.scale``, ``<module>.weight_scale_inv``
SCALE_SUFFIXES = ("weight_scale", "weight.scale", "scale", "weight_scale_inv")
#: suffixes whose op the name leaves open: ``weight_scale_inv`` is the reciprocal of a ``weight_scale``
#: to some writers (so the op flips) and the dequantisation multiplier to others (DeepSeek / FP8
#: checkpoints, which transformers' and vLLM's fp8 loaders multiply by); the inspector scores both
INVERSE_SCALE_SUFFIXES = ("weight_scale_inv",)


def scale_key_of(mod: str, keys, ckpt: Optional[Checkpoint] = None) -> Optional[str]:
    """The checkpoint key of module ``mod``'s scale: the one ``<mod>.<suffix>`` of SCALE_SUFFIXES that
    ``keys`` holds, or None when none does.  Two of them is an error naming both (which one is the scale?)."""
    found = [f"{mod}.{s}" for s in SCALE_SUFFIXES if f"{mod}.{s}" in keys]
    if len(found) > 1:
        where = ckpt.info(found[0]).file if ckpt is not None else "checkpoint"
        raise CheckpointError(f"{where}: module {mod!r} has {len(found)} scale tensors {found}; expected exactly one "
                              f"of {[f'{mod}.{s}' for s in SCALE_SUFFIXES]}")
    return found[0] if found else None


BITNET_LINEAR_CLASSES = ("bitlinear", "autobitlinear")


def bitnet_linear_class(q: dict) -> str:
    """quantization_config.linear_class of a quant_method 'bitnet' config: 'bitlinear' (the default when the key
    is absent; the stored scale divides the output) or 'autobitlinear' (it multiplies).  Anything else - null,
    another spelling - transformers refuses, and reading it as either would give a silently wrong model."""
    lc = q.get("linear_class", "bitlinear")
    if lc not in BITNET_LINEAR_CLASSES:
        raise CheckpointError(f"config.json: quantization_config.linear_class is {lc!r}; expected one of "
                              f"{list(BITNET_LINEAR_CLASSES)} (absent means 'bitlinear'): it decides whether "
                              f"weight_scale divides or multiplies")
    return lc


def check_layer_count(cfg: ModelConfig, ckpt_keys, where) -> None:
    """config.json's num_hidden_layers against the checkpoint, before anything lists the modules per layer: every layer
    stores tensors of its own (norms, linears), so more layers than tensors is a config that does not describe these
    weights (a num_hidden_layers of 10**23 listed modules until memory ran out, with no message)."""
    n = len(ckpt_keys.keys() if isinstance(ckpt_keys, Checkpoint) else ckpt_keys)
    if n and cfg.num_layers > n:
        raise CheckpointError(f"{Path(where) / 'config.json' if where else 'config.json'}: num_hidden_layers is "
                              f"{cfg.num_layers}, but the checkpoint holds "
                              f"only {n} tensors; each layer stores its own norms and linears, so expected at most "
                              f"{n} layers (the config does not describe these weights)")


def spec_from_hf_bitnet(cfg: ModelConfig, ckpt_keys=()) -> CheckpointSpec:
    """The transformers ``quant_method: bitnet`` convention (BitLinear / AutoBitLinear).

    ``ckpt_keys`` (the checkpoint's keys, or the ``Checkpoint`` itself, whose files then appear in
    errors): when given, each module's scale is looked up under every name of SCALE_SUFFIXES
    (``weight_scale`` when the keys are not known).  A ``weight_scale_inv`` is refused: whether it is
    divided or multiplied is not fixed by its name (see INVERSE_SCALE_SUFFIXES); the inspector settles
    it by magnitudes and loss."""
    ckpt = ckpt_keys if isinstance(ckpt_keys, Checkpoint) else None
    keys = set(ckpt.keys()) if ckpt is not None else set(ckpt_keys)
    check_layer_count(cfg, keys, ckpt.path if ckpt is not None else "")
    q = cfg.quantization or {}
    if q.get("quant_method") != "bitnet":
        raise CheckpointError(f"quantization_config.quant_method is {q.get('quant_method')!r}, not 'bitnet'")
    use_norm = bitnet_use_rms_norm(q)
    mode = q.get("quantization_mode", "offline")
    if mode not in ("offline", "online"):
        raise CheckpointError(f"quantization_config.quantization_mode is {mode!r}; expected 'offline' or 'online'")
    linear_class = bitnet_linear_class(q)
    if mode == "online" and linear_class != "autobitlinear":
        raise CheckpointError(f"quantization_mode 'online' with linear_class {linear_class!r}: transformers quantizes "
                              f"online only in AutoBitLinear (linear_class 'autobitlinear')")
    op = "divide" if linear_class == "bitlinear" else "multiply"
    skip = not_converted(q.get("modules_to_not_convert"))
    shapes = cfg.linear_shapes()
    linears = {}
    tensors = _float_tensors(cfg, keys)
    head = _hf_bitnet_lm_head(cfg, keys, ckpt, mode, op)
    if head is not None:
        linears["lm_head"] = head
        tensors.pop("lm_head.weight", None)
    for mod in linear_modules(cfg):
        if skip(mod):
            tensors[mod + ".weight"] = mod + ".weight"
            if _has_bias(cfg, mod):
                tensors[mod + ".bias"] = mod + ".bias"
            continue
        bias_key = f"{mod}.bias" if _has_bias(cfg, mod) else None
        norm = _bitnet_input_norm(mod, q, keys, ckpt, ckpt_keys) if use_norm else None
        if mode == "online":  # the float latent weight, quantized as transformers' WeightQuant does
            linears[mod] = LinearEntry(weight_key=f"{mod}.weight", shape=shapes[mod], bias_key=bias_key,
                                       online="absmean", input_norm=norm)
            continue
        skey = scale_key_of(mod, keys, ckpt) or f"{mod}.weight_scale"
        if skey.endswith(tuple("." + s for s in INVERSE_SCALE_SUFFIXES)):
            where = ckpt.info(skey).file if ckpt is not None else "checkpoint"
            raise CheckpointError(
                f"{where}: tensor {skey!r}: quant_method 'bitnet' (linear_class {linear_class!r}) defines "
                f"{mod}.weight_scale, {'divided' if op == 'divide' else 'multiplied'}; a weight_scale_inv may be its "
                f"reciprocal or the dequantisation multiplier (as FP8 checkpoints store it), so multiply vs divide is "
                f"ambiguous. Expected {mod}.weight_scale; or run `python -m reference.inspect {shlex.quote(str(ckpt.path)) if ckpt else 'DIR'}`, "
                f"which settles the op by magnitudes and loss and writes {SPEC_FILENAME}")
        linears[mod] = LinearEntry(weight_key=f"{mod}.weight", shape=shapes[mod], pack=HF_BITNET,
                                   scale=ScaleSpec(key=skey, granularity="tensor", op=op),
                                   bias_key=bias_key, input_norm=norm)
    if use_norm and "lm_head" in linears:
        linears["lm_head"] = dataclasses.replace(linears["lm_head"],
                                                 input_norm=_bitnet_input_norm("lm_head", q, keys, ckpt, ckpt_keys))
    return CheckpointSpec(name=f"hf-bitnet-{linear_class}" + ("-online" if mode == "online" else ""),
                          linears=linears, tensors=tensors,
                          activation_quant="int8_per_token")


def bitnet_use_rms_norm(q: dict) -> bool:
    """quantization_config.use_rms_norm of a ``quant_method: bitnet`` config (transformers' BitNetQuantConfig,
    default false): true gives every converted BitLinear / AutoBitLinear an RMSNorm of its input (a
    LlamaRMSNorm of in_features, eps ``rms_norm_eps``, default 1e-6) in front of the activation quantization."""
    v = q.get("use_rms_norm", False)
    if v is None:
        v = False
    if not isinstance(v, bool):
        raise CheckpointError(f"config.json: quantization_config.use_rms_norm is {v!r}; expected true or false")
    if v:
        eps = q.get("rms_norm_eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise CheckpointError(f"config.json: quantization_config.rms_norm_eps is {eps!r}; use_rms_norm=true needs "
                                  f"a finite number >= 0 (transformers' default 1e-6 when absent)")
    return v


def _bitnet_input_norm(mod: str, q: dict, keys: set, ckpt: Optional[Checkpoint], ckpt_keys) -> InputNorm:
    """The input RMSNorm of converted module ``mod`` under use_rms_norm: ``<mod>.rms_norm.weight`` (the
    LlamaRMSNorm inside transformers' BitLinear).  A checkpoint that does not store it is refused, naming the
    key: transformers would initialise the missing weight to ones with only a warning, which hides a
    checkpoint written without its norms."""
    key = f"{mod}.rms_norm.weight"
    if (ckpt is not None or ckpt_keys) and key not in keys:
        where = ckpt.path if ckpt is not None else "checkpoint"
        raise CheckpointError(f"{where}: quantization_config.use_rms_norm is true, so {mod} (a BitLinear) normalizes "
                              f"its input with an RMSNorm whose weight is {key!r}, a float [in_features] tensor; the "
                              f"checkpoint has no such tensor")
    return InputNorm(key=key, eps=float(q.get("rms_norm_eps", 1e-6)))


def not_converted(patterns) -> Callable[[str], bool]:
    """quantization_config.modules_to_not_convert as transformers reads it (quantizers_utils.
    should_convert_module): a module stays a float nn.Linear if a pattern matches its name as a regular
    expression from the start (a prefix: "model.layers.1" also catches model.layers.10..19; a regex:
    "model.layers.*.mlp.down_proj") or the name ends with the pattern ("down_proj", "mlp.down_proj")."""
    import re

    if patterns is None:
        patterns = []
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise CheckpointError(f"quantization_config.modules_to_not_convert is {patterns!r}; expected a list of "
                              f"module names / patterns (or null)")
    rx = []
    for p in patterns:
        try:
            rx.append((re.compile(p), p))
        except re.error as e:
            raise CheckpointError(f"quantization_config.modules_to_not_convert: {p!r} is not a valid regular "
                                  f"expression ({e}); transformers matches each entry with re.match") from None
    return lambda mod: any(r.match(mod) or mod.endswith(p) for r, p in rx)


def _hf_converts(name: str, patterns) -> bool:
    """transformers' should_convert_module: whether ``name`` is quantized given modules_to_not_convert."""
    return patterns is None or not not_converted(patterns)(name)


def _hf_bitnet_lm_head(cfg: ModelConfig, keys: set, ckpt: Optional[Checkpoint], mode: str, op: str
                       ) -> Optional[LinearEntry]:
    """The lm_head of a ``quant_method: bitnet`` checkpoint as transformers builds it: a BitLinear only when
    quantization_config.modules_to_not_convert is a list that does not name it (null = the quantizer's default
    skips, get_keys_to_not_convert, which include the output embedding: a float nn.Linear).  Under
    tie_word_embeddings a stored BitLinear head differs from the embedding, and it is used untied, as vLLM's
    maybe_untie_word_embeddings does and PreTrainedModel.tie_weights means to for a stored head that differs
    (transformers 5 itself then fails at load: BitLinear keeps its weight as a buffer, which tie_weights
    cannot fetch as a parameter; the transformers target refuses that case).  Returns its entry, or None for
    a float (or tied, not stored) head; a packed head where transformers expects a float one is refused,
    naming file and tensor."""
    q = cfg.quantization or {}
    mtnc = q.get("modules_to_not_convert")
    key = "lm_head.weight"
    stored = key in keys
    if mtnc is not None and _hf_converts("lm_head", mtnc) and mode == "online" and not stored \
            and cfg.tie_word_embeddings:
        # transformers builds lm_head as an online AutoBitLinear (an nn.Linear: its weight is the tied embedding's
        # Parameter) and ternarizes the embedding matrix on the fly, with int8 activations: logits the float head
        # the reference and vLLM tie would not give (0.86 relative on a 1-layer model)
        raise CheckpointError(
            f"{Path(ckpt.path) / 'config.json' if ckpt is not None else 'config.json'}: "
            f"quantization_config.modules_to_not_convert is {mtnc!r} (no 'lm_head') with "
            f"quantization_mode 'online' and tie_word_embeddings true, and the checkpoint stores no lm_head.weight: "
            f"transformers then makes lm_head an online AutoBitLinear over the tied embedding (ternarized with its "
            f"mean |W|, int8 activations), which the reference and vLLM do not compute (they tie a float head); "
            f"add 'lm_head' to modules_to_not_convert (or set it to null) for a float tied head")
    if mtnc is not None and _hf_converts("lm_head", mtnc) and (stored or not cfg.tie_word_embeddings):
        shape = (cfg.vocab_size, cfg.hidden_size)
        if mode == "online":
            return LinearEntry(weight_key=key, shape=shape, online="absmean")
        skey = scale_key_of("lm_head", keys, ckpt)
        if stored and ckpt is not None and skey is None and ckpt.info(key).dtype in ("F64", "F32", "F16", "BF16") \
                and tuple(ckpt.info(key).shape) == shape:
            # a float [V, H] head without a scale where transformers would build a BitLinear (a config that
            # forgot lm_head in modules_to_not_convert): read as the float head it is; the transformers
            # target refuses this checkpoint (transformers would read the floats as packed codes)
            return None
        skey = skey or "lm_head.weight_scale"
        return LinearEntry(weight_key=key, shape=shape, pack=HF_BITNET,
                           scale=ScaleSpec(key=skey, granularity="tensor", op=op))
    if ckpt is None or not stored:
        return None
    info = ckpt.info(key)
    skey = scale_key_of("lm_head", keys, ckpt)
    if info.dtype in ("F64", "F32", "F16", "BF16") and skey is None:
        return None  # a float head (tied_lm_head_key / validate check its shape)
    why = ("null: transformers' default skips (get_keys_to_not_convert) include the output embedding"
           if mtnc is None else f"{mtnc!r}, which names lm_head")
    tied = " (or none: tie_word_embeddings is true)" if cfg.tie_word_embeddings else ""
    raise CheckpointError(
        f"{info.file}: tensor {key!r} is {info.dtype} {list(info.shape)}"
        f"{f' with scale {skey!r}' if skey else ''}: a packed ternary lm_head, but quantization_config."
        f"modules_to_not_convert is {why}, so transformers keeps lm_head a float nn.Linear and expects {key!r} as a "
        f"float [{cfg.vocab_size}, {cfg.hidden_size}] tensor{tied}. If lm_head is a BitLinear, set "
        f"modules_to_not_convert to a list without 'lm_head' (e.g. [])")


def _has_bias(cfg: ModelConfig, mod: str) -> bool:
    return cfg.attention_bias if ".self_attn." in mod else cfg.mlp_bias


def spec_unquantized(cfg: ModelConfig) -> CheckpointSpec:
    """A plain float checkpoint (no quantization_config): every linear under its HF name."""
    tensors = _float_tensors(cfg, ())
    for mod in linear_modules(cfg):
        tensors[mod + ".weight"] = mod + ".weight"
        if _has_bias(cfg, mod):
            tensors[mod + ".bias"] = mod + ".bias"
    return CheckpointSpec(name="unquantized", linears={}, tensors=tensors)


def spec_home(path) -> Path:
    """The directory a checkpoint path's ternary_spec.json lives in: the path itself, or for a file (a .gguf model)
    the directory beside it."""
    path = Path(path)
    return path.parent if path.is_file() else path


def spec_for(model_dir, cfg: Optional[ModelConfig] = None, spec_path=None) -> CheckpointSpec:
    """The spec of a model directory: an explicit file, the directory's ternary_spec.json,
    or one built from config.json's quantization_config."""
    cfg = cfg or ModelConfig.load(model_dir)
    if spec_path:
        return CheckpointSpec.load(spec_path)
    p = spec_home(model_dir) / SPEC_FILENAME
    if p.exists():
        return CheckpointSpec.load(p)
    q = cfg.quantization or {}
    if q.get("quant_method") == "bitnet":
        return spec_from_hf_bitnet(cfg, Checkpoint(model_dir))
    if not q:
        # no quantization_config: a float model if its linears are stored as float tensors
        # under their HF names; otherwise an undocumented format the inspector must work out
        ckpt = Checkpoint(model_dir)
        probe = "model.layers.0.self_attn.q_proj.weight"
        if probe in ckpt and ckpt.info(probe).dtype in ("F32", "F16", "BF16") and \
                tuple(ckpt.info(probe).shape) == cfg.linear_shapes()["model.layers.0.self_attn.q_proj"]:
            return spec_unquantized(cfg)
    if q.get("quant_method") == "ternary" and q.get("trit_layout"):
        # a trit.export directory without its spec: the inspector cannot work the tiles out (it guesses GPTQ-like
        # packings of the int32 tensors and fails on the first padded one); the spec is the export's own file
        raise CheckpointError(
            f"{model_dir}: no {SPEC_FILENAME}, but config.json's quantization_config (trit_layout "
            f"{q.get('trit_layout')!r}, source_spec {q.get('source_spec')!r}) says this is a trit.export directory, "
            f"which is read through its {SPEC_FILENAME}: restore that file, or export the source again into a new "
            f"directory (`python -m trit.export SRC --out NEWDIR`)")
    raise CheckpointError(
        f"{model_dir}: no {SPEC_FILENAME} and quantization_config is {q or None}; run "
        f"`python -m reference.inspect {shlex.quote(str(model_dir))}` to infer the format")
