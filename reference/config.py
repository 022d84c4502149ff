"""Model configuration: a frozen dataclass built once from a Hugging Face config.json."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .checkpoint import CheckpointError, load_config

ARCHITECTURES = {"BitNetForCausalLM": "bitnet", "LlamaForCausalLM": "llama",
                 "LLaMAForCausalLM": "llama"}  # the early-conversion spelling (vLLM's registry maps it to Llama)
MODEL_TYPES = {"bitnet": "bitnet", "llama": "llama"}
#: 1bitLLM's remote-code class (1bitLLM/bitnet_b1_58-large, -xl, -3B: the b1.58 paper's reproductions; config
#: model_type llama, so a LlamaConfig with its defaults, plus weight_bits 1 / input_bits 8): float latent weights
#: ternarised on the fly (utils_quant.BitLinear: absmean weights, per-token absmax int8 activations) and sub-norms
#: self_attn.inner_attn_ln / mlp.ffn_layernorm before o_proj / down_proj - transformers' BitNet with hidden_act silu
#: in its online mode (quantization_mode online, AutoBitLinear's WeightQuant / ActQuant compute the same), which is
#: how the reference reads it (``ONEBIT_LLM_QUANTIZATION``)
ONEBIT_LLM = "BitnetForCausalLM"
ONEBIT_LLM_QUANTIZATION = {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online",
                           "modules_to_not_convert": None}


# transformers' ACT2FN names the reference computes (reference.model.mlp_act): SiLU (Llama), relu^2 (BitNet
# b1.58), exact and tanh-approximated GELU
MLP_ACTS = ("silu", "relu2", "gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # ROPE_KINDS
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 2048  # "dynamic": sequences longer than this rescale the base
    # "yarn" (transformers' _compute_yarn_parameters): the ramp between interpolated and extrapolated
    # frequencies, and the factor cos / sin are multiplied by (attention_factor, or derived from factor and
    # mscale / mscale_all_dim at load; 1.0 for every other kind)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0


#: num_key_value_heads of a BitNet config.json that lacks the key: BitNetConfig's default (its __post_init__
#: maps an explicit null to num_attention_heads, as LlamaConfig does for a missing key)
BITNET_DEFAULT_KV_HEADS = 5

#: rope_type values the reference computes as transformers does (ROPE_INIT_FUNCTIONS)
ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")


def _count(d: dict, key: str, where: str) -> int:
    """A required positive integer field of config.json (KeyError when absent, for the caller's message)."""
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or int(v) < 1:
        raise CheckpointError(f"{where}: {key} is {v!r}; expected a positive integer")
    return int(v)


def rope_dict(d: dict) -> dict:
    """The RoPE parameters of a config.json dict as transformers resolves them (convert_rope_params_to_dict:
    ``self.rope_parameters = rope_scaling or self.rope_parameters``): a non-empty ``rope_scaling`` (the key of
    configs written before transformers 5) wins over ``rope_parameters`` when both are present, and vLLM reads the
    config transformers built.  The rope_theta of the dict not taken is not used either (the top-level key or the
    architecture's default fills a dict without one)."""
    key = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    rp = d.get(key) or {}
    if not isinstance(rp, dict):
        raise TypeError(f"{key} is {type(rp).__name__} {rp!r}, not a dict")
    return rp


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" | "bitnet"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    hidden_act: str  # one of MLP_ACTS
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 2048
    quantization: Optional[dict] = field(default=None, compare=False, hash=False)

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "ModelConfig":
        if not isinstance(d, dict):
            raise CheckpointError(f"{where}: expected a JSON object of model settings, got a {type(d).__name__}")
        archs = d.get("architectures") or []
        arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        quant = d.get("quantization_config")
        defaults = None  # the config class whose defaults fill absent fields: that of arch unless 1bitLLM's
        if arch is None and ONEBIT_LLM in archs and d.get("model_type") == "llama":
            arch, defaults = "bitnet", "llama"
            for key, want in (("weight_bits", 1), ("input_bits", 8)):
                if d.get(key, want) != want:
                    raise CheckpointError(f"{where}: {ONEBIT_LLM} (1bitLLM) with {key}={d.get(key)!r}: only the "
                                          f"b1.58 setting {key}={want} (ternary weights, int8 activations) is read")
            quant = quant if quant is not None else dict(ONEBIT_LLM_QUANTIZATION)
        if arch is None and archs and d.get("model_type") in MODEL_TYPES:
            # another class with a Llama/BitNet model_type (custom code): running it as the plain model_type
            # would be a wrong answer, not a parity check (1bitLLM's BitnetForCausalLM, model_type llama,
            # stores float weights and ternarises them on the fly)
            raise CheckpointError(
                f"{where}: architectures={archs} names no class the reference implements "
                f"({', '.join(ARCHITECTURES)}); model_type {d.get('model_type')!r} alone would run it as a plain "
                f"{d.get('model_type')} model, which a custom class need not compute. If the checkpoint is one of "
                f"those models, set architectures to its class")
        if arch is None:
            arch = MODEL_TYPES.get(d.get("model_type", ""))
        # absent fields take the defaults of the config class model_type names: transformers' AutoConfig and vLLM
        # build that class whatever architectures says (a BitNetForCausalLM with model_type llama gets
        # LlamaConfig's rms_norm_eps 1e-6, rope_theta 1e4, hidden_act silu and num_key_value_heads = heads)
        defaults = defaults or MODEL_TYPES.get(d.get("model_type", "")) or arch
        if arch is None:
            raise CheckpointError(
                f"{where}: architectures={archs} model_type={d.get('model_type')!r}: only Llama-family and "
                f"BitNet b1.58 models are supported (LlamaForCausalLM, BitNetForCausalLM)")
        size = lambda key: _count(d, key, where)  # noqa: E731 - a required positive integer field
        try:
            hidden = size("hidden_size")
            heads = size("num_attention_heads")
            # optional sizes: null (or no key) derives them as transformers does; any other value must be a
            # positive integer (a fractional one was truncated, a negative one failed deep in the forward)
            opt = lambda key: None if d.get(key) is None else size(key)  # noqa: E731
            head_dim = opt("head_dim") or hidden // heads
            rp = rope_dict(d)
            theta = float(rp.get("rope_theta", d.get("rope_theta", 10000.0 if defaults == "llama" else 500000.0)))
            kind = rp.get("rope_type", rp.get("type", "default")) or "default"
            if kind not in ROPE_KINDS:
                raise CheckpointError(f"{where}: rope_type {kind!r} is not supported ({', '.join(ROPE_KINDS)})")
            if kind in ("linear", "dynamic", "llama3", "yarn") and rp.get("factor") is None:
                raise CheckpointError(f"{where}: rope_type {kind!r} needs a 'factor'")
            if kind == "llama3":
                # transformers (_validate_llama3_rope_parameters) and vLLM require both; no default
                miss = [k for k in ("low_freq_factor", "high_freq_factor") if rp.get(k) is None]
                if miss:
                    raise CheckpointError(f"{where}: rope_type 'llama3' needs {' and '.join(map(repr, miss))}")
            prf = rp.get("partial_rotary_factor", d.get("partial_rotary_factor"))
            if prf is not None and float(prf) != 1.0 and kind != "default":
                # default RoPE: transformers' Llama / BitNet rotate all of head_dim whatever the key says (so does
                # the reference); its scaled RoPE functions take int(head_dim * factor) dims and the model then
                # fails on cos / sin narrower than head_dim: nothing to compare against
                raise CheckpointError(f"{where}: partial_rotary_factor {prf} with rope_type {kind!r}: transformers "
                                      f"builds {kind} frequencies for part of head_dim and cannot run the model; "
                                      f"expected 1.0 (or no key)")
            max_pos = int(d.get("max_position_embeddings", 2048))
            # transformers' standardize_rope_params: a top-level original_max_position_embeddings wins, else the
            # rope dict's, else max_position_embeddings (for llama3 / yarn / longrope)
            orig = d.get("original_max_position_embeddings") or rp.get("original_max_position_embeddings") or max_pos
            factor = float(rp.get("factor") or 1.0)
            attn = rp.get("attention_factor")
            if kind == "yarn" and attn is None:
                ms, ms_all = rp.get("mscale"), rp.get("mscale_all_dim")
                attn = (_yarn_mscale(factor, ms) / _yarn_mscale(factor, ms_all) if ms and ms_all
                        else _yarn_mscale(factor))
            rope = RopeConfig(
                theta=theta, kind=kind, factor=factor,
                low_freq_factor=float(rp.get("low_freq_factor") or 1.0),
                high_freq_factor=float(rp.get("high_freq_factor") or 4.0),
                original_max_position_embeddings=int(orig),
                max_position_embeddings=max_pos,
                beta_fast=float(rp.get("beta_fast") or 32), beta_slow=float(rp.get("beta_slow") or 1),
                truncate=bool(rp.get("truncate", True)),
                attention_factor=float(attn) if kind == "yarn" else 1.0)
            act = d.get("hidden_act", "relu2" if defaults == "bitnet" else "silu")
            if act not in MLP_ACTS:
                raise CheckpointError(f"{where}: hidden_act {act!r} is not supported ({', '.join(MLP_ACTS)})")
            cfg = cls(
                arch=arch,
                vocab_size=size("vocab_size"),
                hidden_size=hidden,
                intermediate_size=size("intermediate_size"),
                num_layers=size("num_hidden_layers"),
                num_heads=heads,
                num_kv_heads=opt("num_key_value_heads") or
                             (BITNET_DEFAULT_KV_HEADS if defaults == "bitnet" and "num_key_value_heads" not in d
                              else heads),
                head_dim=head_dim,
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-5 if defaults == "bitnet" else 1e-6)),
                rope=rope,
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                hidden_act=act,
                attention_bias=bool(d.get("attention_bias", False)),
                # transformers' BitNetMLP has no bias whatever config.json says (BitNetConfig has no mlp_bias; 1bitLLM's
                # remote code predates the field): ignored for the BitNet arch, so a stored MLP bias is an unknown key
                mlp_bias=bool(d.get("mlp_bias", False)) and arch != "bitnet",
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                quantization=quant,
            )
        except KeyError as e:
            raise CheckpointError(f"{where}: missing required field {e.args[0]!r}")
        except CheckpointError:
            raise
        except (TypeError, ValueError, AttributeError) as e:  # a field of the wrong type (null, a string, a list)
            raise CheckpointError(f"{where}: a field has a value of the wrong type ({type(e).__name__}: {e}); "
                                  f"expected the types of a transformers config.json") from None
        # values no norm or rotary embedding can use (transformers takes them and computes NaN / inf: a negative
        # eps in the rsqrt, theta <= 0 or a factor <= 0 in the frequencies); the dump named the first non-finite
        # tensor, not the field
        for key, val, ok, want in (("rms_norm_eps", cfg.rms_norm_eps, cfg.rms_norm_eps >= 0, ">= 0"),
                                   ("rope_theta", cfg.rope.theta, cfg.rope.theta > 0, "> 0"),
                                   ("rope factor", cfg.rope.factor, cfg.rope.factor > 0, "> 0"),
                                   ("max_position_embeddings", cfg.max_position_embeddings,
                                    cfg.max_position_embeddings > 0, "> 0")):
            if not ok:
                raise CheckpointError(f"{where}: {key} is {val}; expected a number {want}")
        if cfg.num_heads % cfg.num_kv_heads:
            why = (f" (config.json has no num_key_value_heads: transformers' BitNetConfig, and vLLM with it, then "
                   f"assume {BITNET_DEFAULT_KV_HEADS}; set it, = num_attention_heads for full multi-head attention)"
                   if defaults == "bitnet" and "num_key_value_heads" not in d else "")
            raise CheckpointError(f"{where}: num_attention_heads {cfg.num_heads} is not a multiple of "
                                  f"num_key_value_heads {cfg.num_kv_heads}{why}")
        if cfg.arch == "llama" and cfg.hidden_size % cfg.num_heads:
            # transformers' LlamaConfig.validate_architecture refuses it whatever head_dim says (so vLLM, which
            # loads the config through transformers, cannot start); BitNetConfig has no such check
            raise CheckpointError(f"{where}: hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads "
                                  f"{cfg.num_heads}: transformers' LlamaConfig (and vLLM with it) refuses such a "
                                  f"config even with an explicit head_dim ({cfg.head_dim})")
        if cfg.head_dim % 2:
            raise CheckpointError(f"{where}: head_dim {cfg.head_dim} must be even for RoPE")
        return cfg

    @classmethod
    def load(cls, model_dir) -> "ModelConfig":
        return cls.from_dict(load_config(model_dir), where=f"{model_dir}/config.json")

    # logical [out, in] shape of every linear module, by its HF module name
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        out = {}
        for L in range(self.num_layers):
            p = f"model.layers.{L}"
            out[f"{p}.self_attn.q_proj"] = (q, h)
            out[f"{p}.self_attn.k_proj"] = (kv, h)
            out[f"{p}.self_attn.v_proj"] = (kv, h)
            out[f"{p}.self_attn.o_proj"] = (h, q)
            out[f"{p}.mlp.gate_proj"] = (i, h)
            out[f"{p}.mlp.up_proj"] = (i, h)
            out[f"{p}.mlp.down_proj"] = (h, i)
        out["lm_head"] = (self.vocab_size, h)
        return out

    def float_params(self) -> dict[str, tuple[int, ...]]:
        """Non-linear parameters (HF names) and their shapes."""
        h = self.hidden_size
        out = {"model.embed_tokens.weight": (self.vocab_size, h), "model.norm.weight": (h,)}
        for L in range(self.num_layers):
            p = f"model.layers.{L}"
            out[f"{p}.input_layernorm.weight"] = (h,)
            out[f"{p}.post_attention_layernorm.weight"] = (h,)
            if self.arch == "bitnet":
                # the sub-norm normalises the attention output (heads * head_dim, = hidden_size unless
                # config.json sets another head_dim), before o_proj
                out[f"{p}.self_attn.attn_sub_norm.weight"] = (self.num_heads * self.head_dim,)
                out[f"{p}.mlp.ffn_sub_norm.weight"] = (self.intermediate_size,)
        return out
