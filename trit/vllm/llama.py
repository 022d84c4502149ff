"""vLLM's Llama with the norms (and SiLU-mul) in front of the W1.58A8 layers fused with them.

Registered over ``LlamaForCausalLM`` only when TRIT_FUSED_NORM_QUANT, TRIT_A8_PROLOGUE, TRIT_ACT_QUANT or TRIT_CHAIN
is set when the plugin registers (trit.vllm.register), and behaving as vLLM's own class except where the ternary
method flagged a layer (compiled, TP = 1). ``trit_fused_norm`` (trit.vllm.quant.fused_norm_selected): the input
norm -> qkv_proj and post-attention norm -> gate_up_proj pairs run as trit::rms_norm_a8q + ternary_mm_a8q;
o_proj and down_proj keep their own quantizer. ``trit_prologue`` (trit.vllm.quant.prologue_selected): those
two pairs and SiLU-mul -> down_proj run as trit::ternary_mm_a8_prologue, the norm / activation inside the
layer's GEMV (trit.vllm.bitnet.norm_then_linear). ``trit_act_quant`` (trit.vllm.quant.act_quant_selected):
SiLU-mul -> down_proj alone runs as trit::ternary_mm_a8_prologue, the activation inside down_proj's activation
quantizer; the norms stay vLLM's. ``trit_chain`` (trit.vllm.quant.chain_selected): the
layer's tail from the attention output - o_proj, (+ residual) post-attention norm -> gate_up_proj, SiLU-mul ->
down_proj - runs as one trit::ternary_chain (trit.vllm.bitnet.chain_tail); with trit_prologue too, the input
norm -> qkv_proj keeps the prologue. The decoder layer's forward below is vLLM's
(0.26 and 0.32 have the same LlamaDecoderLayer / LlamaAttention / LlamaMLP forwards) with the two
pairs routed through norm_then_linear; any other attention or MLP class runs vLLM's forward.
"""
from __future__ import annotations

from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

from .bitnet import bias_of, chain_tail, norm_then_linear

_FLAGS = ("trit_fused_norm", "trit_prologue", "trit_act_quant", "trit_chain")


def fused_layer(layer) -> bool:
    """Whether this decoder layer takes the fused route: vLLM's own attention and MLP classes (whose
    forwards this module repeats) with a flagged qkv_proj or gate_up_proj."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return (type(attn) is LlamaAttention and type(mlp) is LlamaMLP
            and any(getattr(m, f, False) for m in (attn.qkv_proj, mlp.gate_up_proj, mlp.down_proj) for f in _FLAGS))


class TritLlamaDecoderLayer(LlamaDecoderLayer):
    def forward(self, positions, hidden_states, residual):
        if not fused_layer(self):
            return super().forward(positions, hidden_states, residual)
        attn, mlp = self.self_attn, self.mlp
        qkv, res = norm_then_linear(self.input_layernorm, attn.qkv_proj, hidden_states, residual)
        residual = hidden_states if residual is None else res
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb(positions, q, k)
        a = attn.attn(q, k, v)
        from trit.ops import PROLOGUE_ACTS  # (here, not at import: trit.ops loads the CUDA extension)

        silu = PROLOGUE_ACTS["silu"] if type(mlp.act_fn) is SiluAndMul else None
        # TRIT_CHAIN: o_proj, (+ residual) post-attention norm -> gate_up_proj, SiLU-mul -> down_proj as one
        # trit::ternary_chain; None: the tail does not qualify (chain_tail) and runs as below
        tail = chain_tail(a, residual, 1, [(None, attn.o_proj, 0), (self.post_attention_layernorm, mlp.gate_up_proj, 0),
                                           (None, mlp.down_proj, silu)], lambda a, r: self._tail(a, r, silu))
        if tail is not None:
            return tail
        return self._tail(a, residual, silu)

    def _tail(self, a, residual, silu):
        """(mlp_out, residual) from the attention output: the tail without the chain."""
        attn, mlp = self.self_attn, self.mlp
        out, _ = attn.o_proj(a)
        x, residual = norm_then_linear(self.post_attention_layernorm, mlp.gate_up_proj, out, residual)
        down = mlp.down_proj
        if ((getattr(down, "trit_prologue", False) or getattr(down, "trit_act_quant", False)) and silu is not None
                and x.dim() == 2):
            # SiLU(gate) * up inside down_proj's GEMV (TRIT_A8_PROLOGUE, M = 1) or its quantizer (TRIT_ACT_QUANT)
            x, _ = down.quant_method.apply_prologue(down, x, None, None, 0.0, silu, bias_of(down))
            return x, residual
        x, _ = down(mlp.act_fn(x))
        return x, residual


class TritLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "", layer_type=TritLlamaDecoderLayer):
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)
