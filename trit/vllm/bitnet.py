"""BitNet b1.58 for vLLM (``BitNetForCausalLM``), registered when vLLM lacks it.

Same math as ``reference.model`` with arch "bitnet" and transformers' ``BitNetForCausalLM``:

    x = input_layernorm(h)
    q, k, v = qkv_proj(x)                       fused QKVParallelLinear (GQA), RoPE (neox)
    a = attn(q, k, v)                           (T, H*D)
    h = h + o_proj(attn_sub_norm(a))            sub-norm over H*D, before o_proj
    x = post_attention_layernorm(h)
    g, u = gate_up_proj(x)                      fused MergedColumnParallelLinear
    h = h + down_proj(ffn_sub_norm(relu(g)^2 * u))   (hidden_act silu: silu(g) * u)
    logits = norm(h) @ embed_tokens^T           tied embeddings (untied: lm_head)

The residual stream uses vLLM's fused add+RMSNorm (``norm(x, residual)``), like its Llama.
Under TRIT_CHAIN (trit.vllm.quant.chain_selected) the decoder layer runs everything from ``a`` to
the MLP output (attn_sub_norm -> o_proj, the residual add + post_attention_layernorm -> gate_up_proj,
act * up -> ffn_sub_norm -> down_proj) as one trit::ternary_chain where the tail qualifies
(``chain_tail``) - in steps of one token, unless TRIT_CHAIN=all (``route_tokens``) - else the modules'
forwards as above.
Under tensor parallelism the sub-norms see a slice of their features (heads / intermediate
columns); ``ShardedRMSNorm`` all-reduces the sum of squares so the result equals the unsharded
norm.  Weights load through the explicit key map (``keymap.build_key_map``), driven by the spec;
an unknown or missing checkpoint key is an error naming it.

Every vLLM API used here exists with the same signature in 0.26 and 0.32 (QKVParallelLinear,
MergedColumnParallelLinear, RowParallelLinear, RMSNorm, get_rope(head_size, max_position,
is_neox_style, rope_parameters), Attention (vllm.model_executor.layers.attention),
VocabParallelEmbedding / ParallelLMHead.tie_weights, LogitsProcessor, support_torch_compile
(dynamic_arg_dims), make_layers, embed_input_ids).  0.32's Llama adds compute_logits_local /
aux-hidden-state plumbing for speculative decoding, which this model does not implement.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice
from typing import Optional

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_reduce)
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.utils import PPMissingLayer, make_layers, maybe_prefix
from vllm.sequence import IntermediateTensors

from reference.config import MLP_ACTS
from reference.model import mlp_act
from reference.spec import derived_buffer

from . import tp_heads_error, tp_intermediate_error
from .keymap import IGNORED, KeyMapError, build_key_map, check_coverage, expected_float_params


class ShardedRMSNorm(nn.Module):
    """RMSNorm over features that tensor parallelism splits across ranks (the BitNet
    sub-norms): the mean of squares is all-reduced, the weight is sharded like the features."""

    def __init__(self, total_size: int, eps: float):
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.total_size, self.eps = total_size, eps
        self.weight = nn.Parameter(torch.ones(total_size // self.tp_size), requires_grad=False)
        self.weight.weight_loader = self._load

    def _load(self, param, loaded):
        n = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, F / tp)
        xf = x.float()
        ss = xf.pow(2).sum(-1, keepdim=True)
        ss = tensor_model_parallel_all_reduce(ss)
        y = xf * torch.rsqrt(ss / self.total_size + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def norm_weight_as(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The RMSNorm's weight in x's dtype (what the fused norm ops take)."""
    return norm.weight if norm.weight.dtype == x.dtype else norm.weight.to(x.dtype)


def bias_of(linear: nn.Module) -> Optional[torch.Tensor]:
    """The bias the layer adds itself (None where vLLM adds it later: skip_bias_add)."""
    return None if getattr(linear, "skip_bias_add", False) else getattr(linear, "bias", None)


def norm_then_linear(norm: nn.Module, linear: nn.Module, x: torch.Tensor, residual: Optional[torch.Tensor] = None,
                     pre=None):
    """(linear(norm(x)), None) or, with residual, (linear(norm(x + residual)), x + residual): vLLM's
    (fused add +) RMSNorm and then the layer. Where the layer's ternary method set trit_fused_norm
    (TRIT_FUSED_NORM_QUANT, trit.vllm.quant.fused_norm_selected), one trit::rms_norm_a8q kernel computes
    the norm, the residual stream and the layer's int8 input, and the layer runs on that quantization
    (TernaryLinearMethod.apply_quantized): no quantizer launch in front of the M <= 32 GEMV.
    ``pre``: x -> the norm's input, computed in front of everything above (BitNet's act(gate) * up in front of
    ffn_sub_norm): under the one-token routing (trit_fused_norm_one) inside both branches of the torch.cond, so
    that at other token counts Inductor fuses it into vLLM's norm as in the default route - a cond's operands
    are materialized, and outside it the activation was one more kernel and a round trip of its output per layer
    (the BitNet B = 32 forward 2.1% slower under the route than the default, H100 run 96)."""
    routed = (getattr(linear, "trit_fused_norm", False) and getattr(linear, "trit_fused_norm_one", False)
              and not getattr(linear, "trit_prologue", False) and isinstance(norm, RMSNorm) and x.dim() == 2)
    if pre is not None and not routed:  # (the prologue takes the norm's input; the other routes compute it first)
        x, pre = pre(x), None
    if getattr(linear, "trit_prologue", False) and isinstance(norm, RMSNorm) and x.dim() == 2:
        # TRIT_A8_PROLOGUE: (the residual add and) the norm inside the layer's GEMV at M = 1
        y, res = linear.quant_method.apply_prologue(linear, x, residual, norm_weight_as(norm, x),
                                                    norm.variance_epsilon, 0, bias_of(linear))
        return y, (res if residual is not None else None)
    if getattr(linear, "trit_fused_norm", False) and isinstance(norm, RMSNorm) and x.dim() == 2:
        def fused(x, residual):
            if pre is not None:
                x = pre(x)
            layout = getattr(linear, "trit_fnorm_layout", 0)  # TRIT_FUSED_NORM_LAYOUT: 1 = the tiled xq
            h, res, xq, xs, rowsum = torch.ops.trit.rms_norm_a8q(x.contiguous(), residual, norm_weight_as(norm, x),
                                                                norm.variance_epsilon, layout)
            y = linear.quant_method.apply_quantized(linear, h, xq, xs, rowsum, bias_of(linear), layout)
            return y, (res if residual is not None else None)

        if getattr(linear, "trit_fused_norm_one", False):  # TRIT_FUSED_NORM_QUANT=one: one-token steps only
            return route_tokens(fused, lambda x, r: _norm_linear(norm, linear, x if pre is None else pre(x), r),
                                x, residual)
        return fused(x, residual)
    return _norm_linear(norm, linear, x if pre is None else pre(x), residual)


def _norm_linear(norm: nn.Module, linear: nn.Module, x: torch.Tensor, residual: Optional[torch.Tensor]):
    """vLLM's (fused add +) norm, then the layer through its own forward: (y, residual_out or None)."""
    if residual is None:
        y, _ = linear(norm(x))
        return y, None
    h, residual = norm(x, residual)
    y, _ = linear(h)
    return y, residual


def route_tokens(one, many, x: torch.Tensor, residual: Optional[torch.Tensor]):
    """one(x, residual) where x holds one token (a decode step at batch 1), many(x, residual) at every other
    token count; both return (y, residual_out) of the same shapes (residual_out None where residual is). vLLM
    traces the model once for a dynamic token count, so a Python branch on it would be decided at trace time
    for every batch size: under torch.compile the choice is a torch.cond on the symbolic count, kept in the
    graph and decided per call (and per captured CUDA graph size). A cond's operands and outputs are tensors:
    with residual None (the first decoder layer) it routes x alone and returns (y, None)."""
    if not torch.compiler.is_compiling():
        return one(x, residual) if x.shape[0] == 1 else many(x, residual)
    if residual is None:
        y = torch.cond(x.shape[0] == 1, lambda x: one(x, None)[0], lambda x: many(x, None)[0], (x,))
        return y, None
    return tuple(torch.cond(x.shape[0] == 1, one, many, (x, residual)))


def chain_tail(x: torch.Tensor, residual: Optional[torch.Tensor], residual_stage: int, stages: list, other=None):
    """(y, residual_out) of ``stages`` [(norm or None, linear, act code)] in a row as one trit::ternary_chain
    (TRIT_CHAIN, trit.vllm.quant.chain_selected): stage s is linear(norm(act(gate) * up or its input, + the
    residual at residual_stage)), as norm_then_linear and the prologue route compute it. ``other(x,
    residual)``: the caller's own route for the same tail, run instead at token counts other than one
    (route_tokens) unless every stage's layer says trit_chain_all (TRIT_CHAIN=all). None where the
    stages do not qualify, and the caller runs its own route unchanged: a layer without trit_chain (not
    W1.58A8 on the trit ops at TP = 1, or not compiled), a bias the layer adds itself (the op has none), an
    activation without a prologue code (act None), a norm other than vLLM's full-width RMSNorm (BitNet's
    ShardedRMSNorm under TP, or a partial-variance norm), norms of different eps (the op takes one)."""
    if x.dim() != 2:
        return None
    if not all(getattr(lin, "trit_chain", False) and bias_of(lin) is None and act is not None
               for _, lin, act in stages):
        return None
    norms = [n for n, _, _ in stages if n is not None]
    if not all(isinstance(n, RMSNorm) and getattr(n, "variance_size_override", None) is None for n in norms):
        return None
    eps = {n.variance_epsilon for n in norms}
    if len(eps) > 1:
        return None
    from trit.ops import CHAIN_MAX_STAGES  # (here, not at import: trit.ops loads the CUDA extension)
    from .quant import apply_chain

    if len(stages) > CHAIN_MAX_STAGES:
        return None
    eps = eps.pop() if eps else 0.0

    def chain(x, residual):
        return apply_chain([lin for _, lin, _ in stages], x, residual, residual_stage,
                           [None if n is None else norm_weight_as(n, x) for n, _, _ in stages],
                           [act for _, _, act in stages], eps)

    if other is None or residual is None or all(getattr(lin, "trit_chain_all", False) for _, lin, _ in stages):
        return chain(x, residual)
    return route_tokens(chain, other, x, residual)


def sub_norm(size: int, eps: float) -> nn.Module:
    # unsharded: vLLM's RMSNorm (its fused kernel, same numerics as the other norms)
    return RMSNorm(size, eps=eps) if get_tensor_model_parallel_world_size() == 1 else ShardedRMSNorm(size, eps)


class BitNetMLP(nn.Module):
    def __init__(self, config, quant_config, prefix: str):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        why = tp_intermediate_error(i, get_tensor_model_parallel_world_size())
        if why:
            raise ValueError(why)
        # transformers' BitNetMLP takes ACT2FN[hidden_act]; b1.58 checkpoints use relu2
        self.act = getattr(config, "hidden_act", "relu2")
        if self.act not in MLP_ACTS:
            raise ValueError(f"BitNet hidden_act {self.act!r} is not supported ({', '.join(MLP_ACTS)})")
        from trit.ops import PROLOGUE_ACTS  # (here, not at import: trit.ops loads the CUDA extension)

        self.pro_act = PROLOGUE_ACTS.get(self.act)  # trit::ternary_mm_a8_prologue's code for it, or None
        self.gate_up_proj = MergedColumnParallelLinear(h, [i, i], bias=False, quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.ffn_sub_norm = sub_norm(i, config.rms_norm_eps)
        self.down_proj = RowParallelLinear(i, h, bias=False, quant_config=quant_config, prefix=f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor, norm: nn.Module, residual: torch.Tensor):
        """(mlp(norm(x + residual)), x + residual): the post-attention norm comes in, so that it can
        compute gate_up's int8 input (norm_then_linear)."""
        gu, residual = norm_then_linear(norm, self.gate_up_proj, x, residual)  # (T, 2 * I / tp)
        down, sn = self.down_proj, self.ffn_sub_norm
        if (getattr(down, "trit_prologue", False) and isinstance(sn, RMSNorm) and gu.dim() == 2
                and self.pro_act is not None):
            # TRIT_A8_PROLOGUE: act(gate) * up and the sub-norm inside down_proj's GEMV at M = 1
            x, _ = down.quant_method.apply_prologue(down, gu, None, norm_weight_as(sn, gu), sn.variance_epsilon,
                                                    self.pro_act, bias_of(down))
            return x, residual
        # act(gate) * up, as transformers' ACT2FN[hidden_act], in front of the sub-norm (inside the one-token
        # routing's cond where down_proj takes it: norm_then_linear's pre)
        x, _ = norm_then_linear(self.ffn_sub_norm, self.down_proj, gu, pre=self._act_mul)
        return x, residual

    def _act_mul(self, gu: torch.Tensor) -> torch.Tensor:
        g, u = gu.chunk(2, dim=-1)
        return mlp_act(self.act, g) * u


class BitNetAttention(nn.Module):
    def __init__(self, config, quant_config, cache_config, prefix: str):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or self.total_num_heads
        why = tp_heads_error(self.total_num_heads, self.total_num_kv_heads, tp)
        if why:
            raise ValueError(why)
        self.num_heads = self.total_num_heads // tp
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp)
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.total_num_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, self.total_num_heads,
                                          self.total_num_kv_heads, bias=getattr(config, "attention_bias", False),
                                          quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        self.attn_sub_norm = sub_norm(self.total_num_heads * self.head_dim, config.rms_norm_eps)
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, config.hidden_size,
                                        bias=getattr(config, "attention_bias", False), quant_config=quant_config,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(self.head_dim, max_position=getattr(config, "max_position_embeddings", 8192),
                                   is_neox_style=True, rope_parameters=_rope_parameters(config))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, num_kv_heads=self.num_kv_heads,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, norm: nn.Module,
                residual: Optional[torch.Tensor]):
        """(attn(norm(h)), h) with h = hidden_states (+ residual): the input norm comes in, so that it
        can compute qkv_proj's int8 input (norm_then_linear)."""
        a, residual = self.attend(positions, hidden_states, norm, residual)
        out, _ = norm_then_linear(self.attn_sub_norm, self.o_proj, a)
        return out, residual

    def attend(self, positions: torch.Tensor, hidden_states: torch.Tensor, norm: nn.Module,
               residual: Optional[torch.Tensor]):
        """(a, h): forward up to the attention output a, before attn_sub_norm -> o_proj, which the decoder
        layer may run as the first stage of its TRIT_CHAIN tail (chain_tail)."""
        qkv, res = norm_then_linear(norm, self.qkv_proj, hidden_states, residual)  # (T, (H + 2 Hkv) D / tp)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        a = self.attn(q, k, v)  # (T, H D / tp)
        return a, (hidden_states if residual is None else res)


def _rope_parameters(config) -> dict:
    """transformers 5 keeps rope_theta inside rope_parameters; older configs have it top-level."""
    rp = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rp.setdefault("rope_type", rp.pop("type", "default"))
    rp.setdefault("rope_theta", getattr(config, "rope_theta", 500000.0))
    if rp["rope_type"] == "default":
        # transformers' BitNet (BitNetRotaryEmbedding.compute_default_rope_parameters) rotates all of head_dim
        # whatever partial_rotary_factor says; vLLM's get_rope would rotate int(head_dim * factor)
        rp.pop("partial_rotary_factor", None)
    return rp


def dynamic_rope_len_error(config, max_model_len) -> Optional[str]:
    """Why dynamic-NTK RoPE cannot serve ``max_model_len`` tokens, or None.  transformers rescales the base
    once a sequence passes max_position_embeddings; vLLM's DynamicNTKScalingRotaryEmbedding keeps the
    unscaled base and a cos/sin cache of max_position_embeddings positions (NaN attention past it), although
    vLLM derives a max_model_len of max_position_embeddings * factor."""
    mp = getattr(config, "max_position_embeddings", None)
    rp = _rope_parameters(config)
    if rp.get("rope_type") == "dynamic" and mp and max_model_len and max_model_len > mp:
        return (f"BitNet rope type 'dynamic' with max_model_len {max_model_len} > max_position_embeddings {mp}: "
                f"vLLM's dynamic-NTK RoPE does not rescale past max_position_embeddings as transformers does; "
                f"serve with --max-model-len {mp}")
    if rp.get("rope_type") == "yarn" and max_model_len:
        # vLLM's YaRN RoPE has a cos/sin cache of original_max_position_embeddings * factor positions (NaN past it)
        orig = rp.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings",
                                                                     None) or mp
        if orig and rp.get("factor"):
            cache = math.ceil(float(orig) * float(rp["factor"]))
            if max_model_len > cache:
                return (f"BitNet rope type 'yarn' with max_model_len {max_model_len} > original_max_position_embeddings "
                        f"{orig} x factor {float(rp['factor']):g} = {cache}: vLLM's YaRN RoPE computes cos / sin for "
                        f"{cache} positions only; serve with --max-model-len {cache}")
    return None


class BitNetDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        config = vllm_config.model_config.hf_config
        qc, cc = vllm_config.quant_config, vllm_config.cache_config
        self.self_attn = BitNetAttention(config, qc, cc, prefix=f"{prefix}.self_attn")
        self.mlp = BitNetMLP(config, qc, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        # (mlp_out, residual): the layer's output h is their sum (fused into the next norm); each norm
        # goes to the module whose first linear it feeds (norm_then_linear)
        attn, mlp = self.self_attn, self.mlp
        a, residual = attn.attend(positions, hidden_states, self.input_layernorm, residual)
        # TRIT_CHAIN: o_proj, gate_up_proj and down_proj with the norms / activation in front of them as one
        # trit::ternary_chain (one persistent kernel at M = 1) in one-token steps, _tail at other token counts
        # (route_tokens; TRIT_CHAIN=all: the chain at every count); None: the tail does not qualify (chain_tail)
        tail = chain_tail(a, residual, 1, [(attn.attn_sub_norm, attn.o_proj, 0),
                                           (self.post_attention_layernorm, mlp.gate_up_proj, 0),
                                           (mlp.ffn_sub_norm, mlp.down_proj, mlp.pro_act)], self._tail)
        if tail is not None:
            return tail
        return self._tail(a, residual)

    def _tail(self, a, residual):
        """(mlp_out, residual) from the attention output: the tail without the chain."""
        hidden_states, _ = norm_then_linear(self.self_attn.attn_sub_norm, self.self_attn.o_proj, a)
        return self.mlp(hidden_states, self.post_attention_layernorm, residual)


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "intermediate_tensors": 0,
                                         "inputs_embeds": 0})
class BitNetModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, lambda prefix: BitNetDecoderLayer(vllm_config, prefix),
            prefix=f"{prefix}.layers")
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps) if get_pp_group().is_last_rank \
            else PPMissingLayer()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if get_pp_group().is_first_rank:
            hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            hidden_states, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class BitNetForCausalLM(nn.Module):
    # fused vLLM layer -> HF modules, read by vLLM's SupportsQuant/LoRA machinery
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config, self.quant_config = config, vllm_config.quant_config
        why = dynamic_rope_len_error(config, vllm_config.model_config.max_model_len)
        if why:
            raise ValueError(why)
        if self.quant_config is not None:
            self.quant_config.packed_modules_mapping = dict(self.packed_modules_mapping)
        self.model = BitNetModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        if get_pp_group().is_last_rank:
            # the quant config gives a ternary lm_head its method (TernaryConfig.get_quant_method), else None
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=self.quant_config,
                                          prefix=maybe_prefix(prefix, "lm_head"))
            if getattr(config, "tie_word_embeddings", False):
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
            self.logits_processor = LogitsProcessor(config.vocab_size)
        else:
            self.lm_head = PPMissingLayer()

    def make_empty_intermediate_tensors(self, batch_size: int, dtype: torch.dtype, device: torch.device):
        h = self.config.hidden_size
        return IntermediateTensors({k: torch.zeros((batch_size, h), dtype=dtype, device=device)
                                    for k in ("hidden_states", "residual")})

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor, *args) -> Optional[torch.Tensor]:
        return self.logits_processor(self.lm_head, hidden_states)

    # -- weights -----------------------------------------------------------------------
    def key_map(self):
        """The explicit {checkpoint key: [Target]} of this model (see keymap.build_key_map)."""
        spec = getattr(self.quant_config, "spec", None)
        floats = expected_float_params(self.config.num_hidden_layers, "bitnet",
                                       bool(getattr(self.config, "tie_word_embeddings", False)))
        if spec is None:
            if self.quant_config is not None:
                raise KeyMapError(f"BitNetForCausalLM on vLLM supports the ternary method or no quantization; got "
                                  f"quant_config={self.quant_config!r}")
            from reference.config import ONEBIT_LLM, ONEBIT_LLM_QUANTIZATION

            if ONEBIT_LLM in (getattr(self.config, "architectures", None) or []):
                # 1bitLLM: float latent weights that its remote code ternarises; run as float they would be a
                # different model
                import json

                raise KeyMapError(f"{ONEBIT_LLM} (1bitLLM) stores float latent weights that it ternarises on the "
                                  f"fly, and config.json has no quantization_config to say so: pass hf_overrides "
                                  f"{json.dumps({'quantization_config': ONEBIT_LLM_QUANTIZATION})} (vllm serve "
                                  f"--hf-overrides ...) to serve it ternary")
            spec = _unquantized_spec(self.config, floats)
        return build_key_map(spec, floats)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        key_map = self.key_map()
        params = dict(self.named_parameters())
        seen: set[str] = set()
        loaded: set[str] = set()
        for key, tensor in weights:
            targets = key_map.get(key)
            if targets is None and derived_buffer(key):  # RoPE inv_freq: recomputed from the config
                continue
            if targets is None:
                raise KeyMapError(f"checkpoint tensor {key!r} has no vLLM parameter in the BitNet key map "
                                  f"(unknown key; the spec's mapping does not name it)")
            seen.add(key)
            if any(t.kind in ("bias", "float") for t in targets) and tensor.is_floating_point() \
                    and not bool(torch.isfinite(tensor).all()):  # every output NaN otherwise, named nowhere
                raise KeyMapError(f"checkpoint tensor {key!r} ({targets[0].param}) has "
                                  f"{int((~torch.isfinite(tensor)).sum())} NaN/Inf values, expected finite floats")
            for t in targets:
                if t.kind == IGNORED:  # listed under the spec's "ignored" (g_idx, weight_shape, ...)
                    continue
                if t.param not in params:
                    if _pp_missing(t.param, self):
                        continue
                    raise KeyMapError(f"checkpoint tensor {key!r} maps to vLLM parameter {t.param!r}, which this "
                                      f"model does not have")
                p = params[t.param]
                loader = getattr(p, "weight_loader", default_weight_loader)
                part = tensor[t.rows[0]:t.rows[1]] if t.rows is not None else tensor  # its rows of a fused bias
                if t.shard_id is None:
                    loader(p, part)
                else:
                    loader(p, part, t.shard_id)
                loaded.add(t.param)
        check_coverage({k: v for k, v in key_map.items()}, seen, where="BitNet checkpoint")
        if getattr(self.config, "tie_word_embeddings", False):
            loaded.add("lm_head.weight")
        return loaded


def _unquantized_spec(config, floats: dict):
    """A float BitNet checkpoint (e.g. bf16 master weights, or the bf16 baseline of a benchmark):
    every linear is a plain tensor under its HF name, the attention's biases too where config.json has
    attention_bias (transformers' BitNet: q / k / v / o)."""
    from reference.spec import CheckpointSpec

    tensors = {hf: hf for hf in floats}
    attn = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    for L in range(config.num_hidden_layers):
        for m in attn + ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            tensors[f"model.layers.{L}.{m}.weight"] = f"model.layers.{L}.{m}.weight"
        if getattr(config, "attention_bias", False):
            for m in attn:
                tensors[f"model.layers.{L}.{m}.bias"] = f"model.layers.{L}.{m}.bias"
    return CheckpointSpec(name="unquantized", linears={}, tensors=tensors)


def _pp_missing(name: str, model: nn.Module) -> bool:
    from vllm.model_executor.models.utils import is_pp_missing_parameter

    return is_pp_missing_parameter(name, model)
