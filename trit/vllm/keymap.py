"""Checkpoint key -> vLLM parameter mapping, and the loader's staging layout.

Everything the loader does to a checkpoint tensor is declared here, per format, as data:

* ``FUSED`` — which Hugging Face modules vLLM fuses into one layer and under which shard id
  (``qkv_proj`` <- q/k/v, ``gate_up_proj`` <- gate/up).  vLLM's own ``weight_loader`` then
  places (and, under tensor parallelism, slices) each shard.
* ``FLOAT_PARAMS`` — float tensors (embeddings, norms) by HF suffix -> vLLM suffix.
* ``build_key_map(spec, ...)`` — the explicit dict {checkpoint key: [Target, ...]} for one model,
  driven by the ``CheckpointSpec``: the weight, scale and bias keys of every linear, split into
  the fused vLLM parameter + shard id.  A checkpoint key not in the dict, or a dict key the
  checkpoint lacks, is an error that names the key (``KeyMapError``).

Staging layout (what a ternary ``weight`` parameter holds between loading and
``process_weights_after_loading``): HF-BitNet packs 4 values per byte along the *output* axis in
*blocked* lanes (row r of an N-row matrix in byte r % ceil(N/4)), so a fused qkv cannot be made
by concatenating packed rows and a TP shard is not a contiguous byte range.  The loader therefore
decodes each shard to int8 through the spec and re-packs it into the staging layout

    stage: uint8 (ceil(N / f), K); f = 4: element (n, k) at bits 2*(n % 4) of byte [n // 4, k];
           f = 1: one code per byte.  code = w + 1 (0 -> -1, 1 -> 0, 2 -> +1).

which *is* sliceable along the output axis in units of f rows, so it carries vLLM's
``packed_dim=0, packed_factor=f, output_dim=0, input_dim=1`` attributes and vLLM's loaders do the
qkv/gate_up placement and the TP slicing.  f = 4 when every output partition is a multiple of 4
(0.25 byte per weight while loading), else f = 1.

Pre-packed checkpoints (``python -m trit.export``; spec entries with ``layout:
"trit-tile16x128"``) skip all of this when they can: the kernel layout itself is sliceable along
the output axis in units of 16 rows (one int32 tile row) and along the input axis in units of
128 words (one k-block), so the ``weight`` parameter *is* the kernel weight, int32 with
``packed_dim=0, packed_factor=16`` (see ``prepacked_route``), and vLLM's loaders copy the tiles
straight in.  When a layer's partitions do not fall on those boundaries the entry goes through
``decode_weight`` (``trit.ops.unpack``) and the staging layout above, like any other format.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from reference.formats import FormatError, expand_scale, record_scales, unpack, unpack_sign_masks, unpad_groups
from reference.spec import CheckpointSpec, LinearEntry, unpack_layout

ShardId = Union[str, int, None]

#: vLLM fused layer (last name component) -> {shard id: HF module (last name component)}
FUSED: dict[str, dict[ShardId, str]] = {
    "qkv_proj": {"q": "q_proj", "k": "k_proj", "v": "v_proj"},
    "gate_up_proj": {0: "gate_proj", 1: "up_proj"},
}
#: HF module (last component) -> (vLLM layer (last component), shard id)
UNFUSE: dict[str, tuple[str, ShardId]] = {
    hf: (fused, sid) for fused, shards in FUSED.items() for sid, hf in shards.items()}

#: float parameters by HF name suffix -> vLLM parameter suffix (BitNet and Llama share them)
FLOAT_PARAMS: dict[str, str] = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "self_attn.attn_sub_norm.weight": "self_attn.attn_sub_norm.weight",
    "mlp.ffn_sub_norm.weight": "mlp.ffn_sub_norm.weight",
    "model.embed_tokens.weight": "model.embed_tokens.weight",
    "model.norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}

STAGE_BITS = 2
PREPACKED_LAYOUT = "trit-tile16x128"  # the only kernel layout loaded as is (trit.ops.repack's)
TILE_ROWS, TILE_K = 16, 128  # its slicing units: output rows per int32 tile row, inputs per k-block


class KeyMapError(KeyError):
    """A checkpoint key has no vLLM parameter, or a vLLM parameter has no checkpoint key."""

    def __str__(self):  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


# ---------------------------------------------------------------------------------------
# names


def hf_modules(vllm_prefix: str) -> dict[ShardId, str]:
    """'model.layers.0.self_attn.qkv_proj' -> {'q': 'model.layers.0.self_attn.q_proj', ...};
    an unfused layer -> {None: its own name}."""
    head, _, last = vllm_prefix.rpartition(".")
    shards = FUSED.get(last)
    if shards is None:
        return {None: vllm_prefix}
    return {sid: (f"{head}.{hf}" if head else hf) for sid, hf in shards.items()}


def vllm_target(hf_module: str) -> tuple[str, ShardId]:
    """'model.layers.0.self_attn.k_proj' -> ('model.layers.0.self_attn.qkv_proj', 'k')."""
    head, _, last = hf_module.rpartition(".")
    if last in UNFUSE:
        fused, sid = UNFUSE[last]
        return (f"{head}.{fused}" if head else fused), sid
    return hf_module, None


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: vLLM parameter name, shard id, and what it is."""

    param: str  # e.g. "model.layers.0.self_attn.qkv_proj.weight"
    shard_id: ShardId
    kind: str  # "weight" | "weight_neg" | "scale" | "zero" | "g_idx" | "bias" | "in_norm" | "float"
    hf_module: Optional[str] = None  # the spec's module name (linears only)
    rows: Optional[tuple[int, int]] = None  # a bias: this module's rows of a fused tensor's bias (else all of it)


#: ``Target.kind`` of a checkpoint key the spec lists under ``ignored`` (a trivial GPTQ g_idx, constant qzeros,
#: compressed-tensors weight_shape): read and dropped by the model's load_weights
IGNORED = "ignored"


def build_key_map(spec: CheckpointSpec, float_params: dict[str, str]) -> dict[str, list[Target]]:
    """The explicit {checkpoint key: [Target]} dict of one model.

    ``float_params`` is {HF parameter name: vLLM parameter name} for the model's float tensors
    (``expected_float_params``).  Linear weights, scales and biases come from the spec; a fused
    checkpoint tensor (entries with ``rows``) maps to several targets."""
    out: dict[str, list[Target]] = {}

    def add(key: str, t: Target):
        out.setdefault(key, []).append(t)

    refuse_zero_points(spec)
    # a bias key shared by the modules of a fused-on-disk tensor is that tensor's bias, one value per fused row: each
    # module loads its own rows of it (vLLM's loader, given the whole of it with a shard id, narrows it to its first
    # rows: k / v / up got q's / gate's biases, with no error)
    bias_users: dict[str, int] = {}
    for e in spec.linears.values():
        if e.bias_key:
            bias_users[e.bias_key] = bias_users.get(e.bias_key, 0) + 1
    for mod, e in spec.linears.items():
        layer, sid = vllm_target(mod)
        add(e.weight_key, Target(f"{layer}.weight", sid, "weight", mod))
        if e.neg_key is not None:  # a sign-mask pair's -1 mask: the layer's weight_neg, paired with it on load
            add(e.neg_key, Target(f"{layer}.weight_neg", sid, "weight_neg", mod))
        if e.scale is not None and e.scale.key != e.weight_key:  # in-block scales: the weight's loader fills them
            add(e.scale.key, Target(f"{layer}.weight_scale", sid, "scale", mod))
        if e.zero is not None:
            add(e.zero.key, Target(f"{layer}.weight_zero", sid, "zero", mod))
        if e.g_idx is not None:  # act-order group index: the dense fallback's weight_g_idx
            add(e.g_idx, Target(f"{layer}.weight_g_idx", sid, "g_idx", mod))
        if e.bias_key:
            fused = e.rows is not None and bias_users[e.bias_key] > 1
            add(e.bias_key, Target(f"{layer}.bias", sid, "bias", mod, e.rows if fused else None))
        if e.input_norm is not None:  # use_rms_norm: the module's own input RMSNorm weight
            add(e.input_norm.key, Target(f"{layer}.weight_in_norm", sid, "in_norm", mod))
    for hf, vname in float_params.items():
        if hf == "lm_head.weight" and "lm_head" in spec.linears:
            continue  # a ternary lm_head: its weight and scale are the linear's, above
        key = spec.tensors.get(hf)
        if key is None and hf == "lm_head.weight" and tied_in_spec(spec):
            # config.json ties the embeddings but the checkpoint stores lm_head.weight: vLLM
            # (maybe_untie_word_embeddings) then builds an untied lm_head and loads it (re-tied if equal)
            key = hf
        if key is None:
            raise KeyMapError(f"spec {spec.name!r}: no checkpoint key for parameter {hf!r} (vLLM {vname!r})")
        add(key, Target(vname, None, "float"))
    # a float linear kept unquantised (modules_to_not_convert) is listed in spec.tensors
    for hf, key in spec.tensors.items():
        if hf in float_params or hf == "lm_head.weight":
            continue
        for leaf, kind in ((".weight", "float"), (".bias", "bias")):  # its bias too (attention_bias, mlp_bias)
            if hf.endswith(leaf) and hf[: -len(leaf)] not in spec.linears:
                layer, sid = vllm_target(hf[: -len(leaf)])
                add(key, Target(f"{layer}{leaf}", sid, kind))
    for key in getattr(spec, "ignored", None) or {}:
        if key not in out:
            add(key, Target("", None, IGNORED))
    return out


def refuse_zero_points(spec: CheckpointSpec) -> None:
    """KeyMapError naming the first module whose zero points the dense fallback cannot load (checked at config
    time, so vLLM's own Llama refuses them as our BitNet does): any granularity but group (consecutive inputs of a
    row, or HQQ axis=0's columns of W's [G, N*K/G] view, which the fallback loads elementwise), channel and
    tensor (compressed-tensors' channel / tensor strategies)."""
    for mod, e in spec.linears.items():
        if e.zero is not None and e.zero.granularity not in ("group", "channel", "tensor"):
            raise KeyMapError(f"spec {spec.name!r}: {mod} has {e.zero.granularity} zero points {e.zero.key!r}, "
                              f"which the vLLM plugin does not load (it takes group, channel and tensor zero "
                              f"points); decode the checkpoint with `python -m reference.decode` and serve the "
                              f"float weights")


def float_valued(entry: LinearEntry, stored_dtype: str) -> bool:
    """A module the spec leaves undecoded - no packing, layout, scale, zero or online quantization - stored in a
    float dtype (TriLM's fp16 {-s, 0, +s}, which the inspector reads as is): its values are the weight itself,
    not integer levels, so the trit kernels cannot take it; the dense fallback loads it as float."""
    return (entry.pack is None and entry.layout is None and entry.scale is None and entry.zero is None
            and entry.online is None and stored_dtype.upper().startswith(("F", "BF")))


def checkpoint_renames(spec: CheckpointSpec) -> dict[str, str]:
    """{checkpoint key: the Hugging Face name vLLM's own models load it under} for every key that the
    checkpoint stores under another name.  vLLM's Llama loads through AutoWeightsLoader, which finds
    parameters by name; ``TernaryConfig.get_checkpoint_weight_mapper`` renames these keys first.

    * unfused ternary modules: a scale at ``<module>.weight.scale``, ``<module>.scale`` or
      ``<module>.weight_scale_inv`` (-> ``<module>.weight_scale``), a weight at ``<module>.weight_ternary`` or
      under a foreign name (GGUF ``blk.N.attn_q.weight`` -> ``<module>.weight``), a bias;
    * float tensors (``spec.tensors``: embeddings, norms, a float lm_head) under foreign names (GGUF
      ``token_embd.weight``, Meta ``layers.N.attention_norm.weight``);
    * tensors fused on disk (entries with ``rows``): a tensor that holds exactly the modules of one vLLM
      fused layer (Meta ``wqkv`` = q|k|v, ``w13`` = gate|up, in any row order) is renamed to that layer's
      parameter (``<layer>.qkv_proj.weight``); vLLM then hands it to the layer's loader without a shard id
      and the loader cuts each module's rows out by the spec (``_SpecLinearMethod._shard_loader``).  A
      fused-on-disk tensor that holds any other set of modules cannot be expressed as a rename
      (``KeyMapError`` naming it: the BitNet architecture loads it, through ``build_key_map``).

    An act-order group index (``LinearEntry.g_idx``: GPTQ ``<module>.g_idx``) loads as ``<module>.weight_g_idx``,
    the dense fallback's parameter, and the -1 mask of a sign-mask pair (``LinearEntry.neg_key``) as
    ``<module>.weight_neg`` (the +1 mask as ``<module>.weight``; the layer's loader pairs them).  In-block scales
    (the weight's own key) keep their names."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}  # every key's parameter, kept ones too: a key loads into one parameter only

    def put(key, want):
        if key is None:
            return
        if seen.get(key, want) != want:
            # (one tensor serving two parameters, e.g. an untied lm_head.weight mapped to the embedding's key: a
            # rename would load it into one of them and leave the other as allocated, a silently wrong model)
            raise KeyMapError(f"spec {spec.name!r}: checkpoint key {key!r} would load as both {seen[key]!r} "
                              f"and {want!r}; vLLM's Llama loads each checkpoint tensor into one parameter: serve "
                              f"it with the BitNet architecture (trit's own model loads it through the spec), or "
                              f"store the tensor once per parameter")
        seen[key] = want
        if key != want:
            out[key] = want

    fused_on_disk: dict[str, list[str]] = {}  # weight key -> modules stored in it
    for mod, e in spec.linears.items():
        # use_rms_norm: a module's own input RMSNorm weight (one per module, fused on disk or not)
        put(e.input_norm.key if e.input_norm is not None else None, f"{mod}.weight_in_norm")
        if e.rows is not None:
            fused_on_disk.setdefault(e.weight_key, []).append(mod)
            continue
        scale = e.scale.key if e.scale is not None and e.scale.key != e.weight_key else None
        put(e.weight_key, f"{mod}.weight")
        put(e.neg_key, f"{mod}.weight_neg")
        put(scale, f"{mod}.weight_scale")
        put(e.zero.key if e.zero is not None else None, f"{mod}.weight_zero")
        put(e.g_idx, f"{mod}.weight_g_idx")
        put(e.bias_key, f"{mod}.bias")
    for key, mods in fused_on_disk.items():
        layers = {vllm_target(m)[0] for m in mods}
        layer = next(iter(layers))
        whole = hf_modules(layer)
        if len(layers) != 1 or None in whole or sorted(whole.values()) != sorted(mods):
            want = sorted(map(str, whole.values())) if len(layers) == 1 and None not in whole else "one vLLM layer"
            raise KeyMapError(
                f"spec {spec.name!r}: checkpoint tensor {key!r} holds the rows of {sorted(mods)}; vLLM's Llama can "
                f"load a tensor fused on disk only when it holds exactly the modules of one of its fused layers "
                f"({want}). Serve it with the BitNet architecture (trit's own model loads any fused layout through "
                f"the spec), or split the tensor per module")
        entries = [spec.linears[m] for m in whole.values()]  # vLLM's shard order (q|k|v, gate|up)
        put(key, f"{layer}.weight")
        negs = {e.neg_key for e in entries}
        if negs != {None}:  # a sign-mask pair fused on disk: its -1 mask holds the same rows
            if len(negs) != 1:
                raise KeyMapError(f"spec {spec.name!r}: the modules {sorted(mods)} of the fused +1 mask {key!r} name "
                                  f"different -1 masks {sorted(map(str, negs))}; expected one fused -1 mask")
            put(next(iter(negs)), f"{layer}.weight_neg")
        scales = {e.scale.key for e in entries if e.scale is not None and e.scale.key != e.weight_key}
        if len(scales) == 1:  # one scale tensor for the fused layer (a scalar per module, or per-channel rows)
            put(next(iter(scales)), f"{layer}.weight_scale")
        else:  # one per module (or in-block scales): each loads as its module's, under vLLM's shard id
            for m, e in zip(whole.values(), entries):
                if e.scale is not None and e.scale.key != e.weight_key:
                    put(e.scale.key, f"{m}.weight_scale")
        zeros = {e.zero.key for e in entries if e.zero is not None}
        if len(zeros) == 1 and all(e.zero is not None for e in entries):
            put(next(iter(zeros)), f"{layer}.weight_zero")
        else:
            for m, e in zip(whole.values(), entries):
                put(e.zero.key if e.zero is not None else None, f"{m}.weight_zero")
        idx = {e.g_idx for e in entries}
        if len(idx) == 1 and None not in idx:  # one group index for the fused tensor (its inputs are shared)
            put(next(iter(idx)), f"{layer}.weight_g_idx")
        else:
            for m, e in zip(whole.values(), entries):
                put(e.g_idx, f"{m}.weight_g_idx")
        biases = {e.bias_key for e in entries}
        if biases == {None}:
            continue
        if len(biases) == 1:
            # one bias tensor: vLLM splits it in its own shard order, so it must be stored in that order
            starts = [e.rows for e in entries]
            if starts[0][0] != 0 or any(a[1] != b[0] for a, b in zip(starts, starts[1:])):
                raise KeyMapError(f"spec {spec.name!r}: bias {next(iter(biases))!r} of the fused tensor {key!r} stores "
                                  f"its modules in rows {starts}, not in vLLM's order {list(whole.values())}; vLLM's "
                                  f"Llama would split it wrongly (the BitNet architecture loads it)")
            put(next(iter(biases)), f"{layer}.bias")
        else:
            for m, e in zip(whole.values(), entries):
                put(e.bias_key, f"{m}.bias")
    for hf, key in spec.tensors.items():
        put(key, hf)
    return out


def expected_float_params(num_layers: int, arch: str, tie_word_embeddings: bool) -> dict[str, str]:
    """HF float parameter -> vLLM parameter of the BitNet/Llama models in this package."""
    out = {"model.embed_tokens.weight": "model.embed_tokens.weight", "model.norm.weight": "model.norm.weight"}
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    if arch == "bitnet":
        per_layer += ["self_attn.attn_sub_norm.weight", "mlp.ffn_sub_norm.weight"]
    for L in range(num_layers):
        for s in per_layer:
            out[f"model.layers.{L}.{s}"] = f"model.layers.{L}.{FLOAT_PARAMS[s]}"
    if not tie_word_embeddings:
        out["lm_head.weight"] = "lm_head.weight"
    return out


def tied_in_spec(spec) -> bool:
    """A spec built for a tied model (no lm_head of its own): an untied vLLM model of it got untied by vLLM
    because the checkpoint carries a copy of the output embedding."""
    return "lm_head.weight" not in spec.tensors and "lm_head" not in spec.linears


def check_coverage(key_map: dict[str, list[Target]], checkpoint_keys, where: str = "checkpoint") -> None:
    """Every checkpoint key is mapped and every mapped key exists; errors name the keys."""
    ck = set(checkpoint_keys)
    unknown = sorted(ck - set(key_map))
    if unknown:
        raise KeyMapError(f"{where}: {len(unknown)} checkpoint tensor(s) have no vLLM parameter in the key map: "
                          f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''} (unknown key; fix the spec's mapping)")
    missing = sorted(set(key_map) - ck)
    if missing:
        first = key_map[missing[0]][0]
        raise KeyMapError(f"{where}: missing checkpoint tensor {missing[0]!r} (for vLLM parameter {first.param!r}"
                          f"{'' if first.shard_id is None else f', shard {first.shard_id!r}'})"
                          f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}")


# ---------------------------------------------------------------------------------------
# decode one shard through the spec


def decode_weight(raw: torch.Tensor, entry: LinearEntry, name: str, *, fused: bool = False,
                  neg: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Checkpoint tensor -> int8 (n, K) ternary values of module ``name`` (its ``rows`` of a
    fused tensor, or the whole fused tensor when ``fused``): ``decode_levels`` + the ternary check.
    ``neg``: the -1 mask of a sign-mask pair whose +1 mask is ``raw`` (``LinearEntry.neg_key``)."""
    vals = decode_levels(raw, entry, name, fused=fused, neg=neg)
    if vals.numel() and int(vals.abs().max()) > 1:
        raise FormatError(f"tensor {entry.weight_key!r} ({name}): values outside {{-1, 0, 1}}; the trit ops are "
                          f"ternary only (the dense fallback takes other integer levels)")
    return vals


def shard_scale(raw: torch.Tensor, entry: LinearEntry, name: str, *, fused: bool = False) -> torch.Tensor:
    """Checkpoint scale -> fp32 (n,) multiplier per output row of module ``name``
    ('divide' scales inverted here, once, at load time)."""
    if entry.scale is None:
        n = entry.shape[0] if fused else entry.out_shape[0]
        return torch.ones(n)
    if entry.scale.granularity in ("group", "block"):
        raise FormatError(f"{name}: {entry.scale.granularity}-wise scale {entry.scale.key!r} (group_size {entry.scale.group_size}) is not "
                          f"supported by the trit ops, which take one scale per output row")
    m = expand_scale(raw.detach().cpu(), entry.scale, entry.shape, rows=None if fused else entry.rows,
                     name=f"tensor {entry.scale.key!r} ({name})")  # (1, 1) or (n, 1)
    n = entry.shape[0] if fused else entry.out_shape[0]
    return m.reshape(-1).expand(n).contiguous() if m.numel() == 1 else m.reshape(-1).contiguous()


# ---------------------------------------------------------------------------------------
# the dense fallback (what the trit kernels cannot express)

TERNARY_LEVELS = frozenset((-1, 0, 1))


def dense_reason(entry: LinearEntry) -> Optional[str]:
    """Why module ``entry`` cannot run on the trit kernels (so its layer takes the dense
    fallback), or ``None``: group-wise scales (stored apart, or inside the weight's blocks as
    llama.cpp TQ2_0 does), or integer levels beyond {-1, 0, +1}."""
    why = []
    if entry.scale is not None and entry.scale.granularity == "group":
        why.append(f"group-wise scale (group_size {entry.scale.group_size}"
                   + (f", act-order groups of g_idx {entry.g_idx!r})" if entry.g_idx is not None else ")"))
    if entry.scale is not None and entry.scale.granularity == "block":
        why.append(f"in-block scale (one {entry.scale.dtype} per {entry.scale.group_size}-value block, "
                   f"{entry.scale.record_bytes}-byte blocks)")
    if entry.zero is not None:
        kind = {"group": "per-group", "channel": "per-channel", "tensor": "per-tensor"}.get(entry.zero.granularity,
                                                                                           entry.zero.granularity)
        why.append(f"{kind} zero points {entry.zero.key!r} (W = (q - zero) * scale)")
    elif entry.pack is not None:
        levels = sorted({int(v) for v in entry.pack.codes if v is not None})
        if not set(levels) <= TERNARY_LEVELS:
            why.append(f"integer levels {levels[0]}..{levels[-1]} ({entry.pack.bits}-bit codes)")
    return " and ".join(why) or None


def decode_levels(raw: torch.Tensor, entry: LinearEntry, name: str, *, fused: bool = False,
                  floats: bool = False, neg: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Checkpoint tensor -> int8 (n, K) integer values of module ``name`` (its ``rows`` of a fused
    tensor, or the whole fused tensor when ``fused``); any levels that fit int8. ``floats``: an undecoded
    float-valued module (``float_valued``) -> its fp32 values as stored.  A module with zero points: its
    codes q as fp32 (the dense fallback subtracts the zero points once every tensor has arrived).  A sign-mask
    pair (``LinearEntry.neg_key``): ``raw`` is its +1 mask and ``neg`` its -1 mask, W = pos - neg."""
    where = f"tensor {entry.weight_key!r} ({name})"
    raw = raw.detach()  # unpack runs where raw is: the loaders hand it over on the layer's device
    if entry.online is not None:  # its multiplier comes with the values: online_decode, in the ternary loader
        raise FormatError(f"{where}: quantized online (float latent weight): its multiplier comes from the weight "
                          f"itself, which only the ternary method's loader (online_decode) carries; this route "
                          f"would drop it")
    if entry.layout is not None:  # a trit.export checkpoint on the decode route (see quant.prepacked_route)
        try:
            vals = unpack_layout(raw, entry.layout, entry.shape, where=where)
        except ValueError as e:
            raise FormatError(str(e)) from None
    elif entry.neg_key is not None:  # a sign-mask pair (the layer's loader holds the first mask until both arrived)
        if neg is None:
            raise FormatError(f"{where}: the +1 mask of a sign-mask pair, decoded without its -1 mask "
                              f"{entry.neg_key!r}; W = pos - neg needs both")
        vals = unpack_sign_masks(raw, neg.detach(), entry.pack, entry.shape, name=where,
                                 neg_name=f"tensor {entry.neg_key!r} ({name})")
    elif entry.pack is not None:
        try:
            vals = unpack(raw, entry.pack, entry.shape, name=where)
        except FormatError as e:
            raise FormatError(str(e) if where in str(e) else f"{where}: {e}") from None
    else:
        if tuple(raw.shape) != entry.shape:
            raise FormatError(f"{where}: shape {list(raw.shape)}, the spec says {list(entry.shape)}")
        vals = raw.float()
        if floats:
            if not bool(torch.isfinite(vals).all()):
                raise FormatError(f"{where}: non-finite values")
            return (vals[entry.rows[0]:entry.rows[1]] if entry.rows is not None and not fused else vals).contiguous()
        if not bool((vals == vals.round()).all()):
            raise FormatError(f"{where}: stored unpacked but not integer-valued; fold float weights into the "
                              f"scale first")
    if entry.rows is not None and not fused:
        vals = vals[entry.rows[0]:entry.rows[1]]
    if entry.zero is not None:  # the codes q (HQQ: up to 255); the dense fallback subtracts the zero points
        return vals.to(torch.float32).contiguous()
    if vals.numel() and (int(vals.min()) < -128 or int(vals.max()) > 127):
        raise FormatError(f"{where}: integer values outside int8 [-128, 127]")
    return vals.to(torch.int8).contiguous()


def online_decode(raw: torch.Tensor, entry: LinearEntry, name: str):
    """A module quantized online (LinearEntry.online): the reference's quantizer over the whole checkpoint
    matrix (its rows; vLLM slices for TP only after this) -> DecodedLinear (int8 values, (1, 1) mult)."""
    from reference.checkpoint import CheckpointError
    from reference.spec import online_absmean

    try:
        return online_absmean(raw.detach(), entry, f"tensor {entry.weight_key!r} ({name})")
    except CheckpointError as e:
        raise FormatError(str(e)) from None


def group_mult(raw: Optional[torch.Tensor], entry: LinearEntry, name: str, group_size: Optional[int], *,
               fused: bool = False) -> torch.Tensor:
    """Checkpoint scale -> fp32 (n, ceil(K / group_size)) multipliers of module ``name`` ('divide'
    inverted; a per-tensor / per-channel scale repeated over the groups), or (n, 1) when the layer
    has no group scale (``group_size`` None)."""
    n = entry.shape[0] if fused else entry.out_shape[0]
    k = entry.shape[1]
    cols = 1 if group_size is None else -(-k // group_size)
    rows = None if fused else entry.rows
    if entry.scale is None:
        return torch.ones(n, cols)
    where = f"tensor {entry.scale.key!r} ({name})"
    sc = entry.scale
    if group_size == 1:  # an elementwise layer (HQQ axis=0 groups): one multiplier per weight, any granularity
        m = expand_scale(raw.detach().cpu(), sc, entry.shape, rows=rows, name=where)  # broadcastable to (n, k)
        return m.expand(n, k).contiguous()
    if sc.group_axis == 0:
        raise FormatError(f"{where}: HQQ axis=0 group scale (one value per column of W's [{sc.group_size}, N*K/"
                          f"{sc.group_size}] view) needs the dense fallback's elementwise layout (group_size 1, "
                          f"DenseFallbackLinearMethod picks it for a layer with such a scale), got group_size "
                          f"{group_size}")
    if sc.granularity in ("group", "block"):
        if sc.group_size != group_size:
            raise FormatError(f"{where}: group_size {sc.group_size}, but its fused vLLM layer uses {group_size}")
        if sc.granularity == "block":  # the weight tensor itself: its in-block scales (finite, checked there)
            s = record_scales(raw.detach().cpu(), sc, entry.shape, name=where)
        else:
            s = raw.detach().cpu().to(torch.float32)
        if sc.transposed and s.dim() == 2:
            s = s.t()
        elif sc.granularity == "group" and tuple(s.shape) in ((entry.shape[0] * cols,), (entry.shape[0] * cols, 1)):
            s = s.reshape(entry.shape[0], cols)  # one per group, row-major (HQQ axis=1: [N*K/G, 1])
        if sc.padded_groups is not None:  # AutoAWQ gemv: [N, P] with zero padding columns past the groups
            s = unpad_groups(s, sc, entry.shape, name=where)
        if tuple(s.shape) != (entry.shape[0], cols):
            raise FormatError(f"{where}: group scale must have shape {(entry.shape[0], cols)} (group_size "
                              f"{group_size}), has {tuple(raw.shape)}")
        if not bool(torch.isfinite(s).all()):
            raise FormatError(f"{where}: scale has NaN/Inf values")
        if rows is not None:
            s = s[rows[0]:rows[1]]
        if sc.op == "divide":
            if bool((s == 0).any()):
                raise FormatError(f"{where}: scale is zero but the format divides by it")
            s = 1.0 / s
        return s.contiguous()
    m = expand_scale(raw.detach().cpu(), sc, entry.shape, rows=rows, name=where)  # (1, 1) | (n, 1)
    return m.reshape(-1, 1).expand(n, cols).contiguous()


# ---------------------------------------------------------------------------------------
# pre-packed (trit.export) checkpoints


def prepacked_route(entries: list[LinearEntry], output_partition_sizes: list[int], input_size_per_partition: int,
                    input_size: int, *, column_sharded: bool, backend_name: str) -> Optional[str]:
    """``None`` when a layer's tiles can be loaded as they are stored, else why not (the layer
    then takes the decode route).  ``column_sharded``: the output axis is split across TP ranks."""
    if not all(e.layout == PREPACKED_LAYOUT for e in entries):
        return "not every module of the layer is in the trit-tile16x128 layout"
    if backend_name != "trit.ops":
        return f"kernel backend {backend_name!r} does not consume the trit-tile16x128 layout"
    parts = list(output_partition_sizes)
    if (len(parts) > 1 or column_sharded) and any(p % TILE_ROWS for p in parts):
        return (f"output partitions {parts} are not all multiples of {TILE_ROWS} rows, so the shards' tiles do not "
                f"concatenate / slice into the layer's tiles")
    if input_size_per_partition != input_size and input_size_per_partition % TILE_K:
        return (f"the input partition ({input_size_per_partition} of {input_size}) is not a multiple of "
                f"{TILE_K} (one k-block)")
    return None


def check_tile_codes(raw: torch.Tensor, entry: LinearEntry, name: str) -> None:
    """Refuse int32 tiles holding code 3 (a 2-bit field with both bits set) anywhere: trit.export writes codes 0 / 1 / 2
    (= -1 / 0 / +1, padding 1) only, and the kernels would read a 3 as a weight of their own (a silently other
    model; the reference's ``unpack_layout`` refuses the same tensor).  One pass of bit operations over the words."""
    w = raw.detach()
    bad = (w & (w >> 1) & 0x55555555) != 0
    if not bool(bad.any()):
        return
    t, j = (int(v) for v in bad.nonzero()[0])
    where = "in the padding"
    if entry.shape is not None:
        from trit.ops import unpack as trit_unpack

        vals = trit_unpack(w.cpu().contiguous(), *entry.shape)
        if bool((vals.abs() > 1).any()):
            where = f"at logical index {tuple(int(i) for i in (vals.abs() > 1).nonzero()[0])}"
    raise KeyMapError(f"tensor {entry.weight_key!r} ({name}): unused code 3 {where} (word [{t}, {j}]; layout "
                      f"{entry.layout} holds codes 0/1/2 = -1/0/+1 only) — corrupt or not a trit export")


def prepacked_shape(output_partition_sizes: list[int], k_part: int) -> tuple[int, int]:
    """int32 shape of a pre-packed layer weight (the kernel layout of the layer's partition)."""
    n = sum(output_partition_sizes)
    return (-(-n // TILE_ROWS), -(-k_part // TILE_K) * TILE_K)


# ---------------------------------------------------------------------------------------
# staging layout (see module docstring)


def stage_factor(output_partition_sizes: list[int]) -> int:
    return 4 if all(s % 4 == 0 for s in output_partition_sizes) else 1


def stage_pack(w: torch.Tensor, f: int) -> torch.Tensor:
    """int8 (N, K) -> uint8 (ceil(N/f), K) staging layout."""
    codes = (w.to(torch.int16) + 1).to(torch.uint8)  # (N, K) in {0, 1, 2}
    if f == 1:
        return codes.contiguous()
    n, k = codes.shape
    pad = (-n) % f
    if pad:
        codes = torch.cat([codes, torch.ones(pad, k, dtype=torch.uint8, device=codes.device)])  # code 1 = value 0
    c = codes.view(-1, f, k)  # (N/f, f, K)
    out = torch.zeros(c.shape[0], k, dtype=torch.uint8, device=codes.device)
    for s in range(f):
        out |= c[:, s] << (STAGE_BITS * s)
    return out


def stage_unpack(staged: torch.Tensor, f: int, n: int) -> torch.Tensor:
    """uint8 (ceil(n/f), K) staging layout -> int8 (n, K)."""
    if f == 1:
        codes = staged
    else:
        shifts = torch.arange(f, device=staged.device, dtype=torch.uint8) * STAGE_BITS
        codes = (staged.unsqueeze(1) >> shifts.view(1, f, 1)) & 3  # (N/f, f, K)
        codes = codes.reshape(-1, staged.shape[-1])
    return (codes[:n].to(torch.int16) - 1).to(torch.int8).contiguous()
