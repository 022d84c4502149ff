"""vLLM plugin: the ``ternary`` quantization method and the BitNet b1.58 architecture.

vLLM calls ``register()`` in every process (API server, engine core, workers) through the
``vllm.general_plugins`` entry point declared in pyproject.toml:

    [project.entry-points."vllm.general_plugins"]
    trit = "trit.vllm:register"

The method goes through ``register_quantization_config`` and the model through
``ModelRegistry.register_model``, the two public registries (same API in vLLM 0.26 and 0.32). One
thing is patched, and only under TRIT_CHAIN=1 or TRIT_FUSED_NORM_QUANT=one (the one-token routing's torch.cond): vLLM's
``split_graph`` is wrapped so that each cond keeps its predicate and each compiled piece its placeholders
first (trit.vllm.fx_compat: with torch 2.11, vLLM 0.26 compiled such a piece with too few inputs); under the same
two settings VLLM_USE_MEGA_AOT_ARTIFACT=1 is set where it is unset and off by default (quant.keep_cond_pieces_cacheable:
vLLM's compile cache then keeps the cond piece).
With TRIT_FUSED_NORM_QUANT, TRIT_A8_PROLOGUE, TRIT_ACT_QUANT or TRIT_CHAIN set when it registers, ``LlamaForCausalLM``
is registered as trit.vllm.llama's subclass (vLLM's class unless a ternary layer is flagged for the fused norm).
``register()`` is idempotent: vLLM may call it more than once per process.
"""
from __future__ import annotations

_registered = False


def tp_heads_error(num_heads: int, num_kv_heads: int, tp: int):
    """None when vLLM can shard the attention heads over ``tp`` ranks, else why not: query heads
    must divide by tp; KV heads must divide by tp or divide tp (then they are replicated)."""
    if num_heads % tp or (num_kv_heads % tp and tp % num_kv_heads):
        return (f"tensor_parallel_size={tp} cannot shard {num_heads} attention heads / {num_kv_heads} KV heads "
                f"(vLLM needs heads % tp == 0 and kv_heads % tp == 0 or tp % kv_heads == 0)")
    return None


def tp_intermediate_error(intermediate_size: int, tp: int):
    """None when vLLM can split the MLP over ``tp`` ranks, else why not: gate_up_proj (column parallel) and
    down_proj (row parallel) give each rank intermediate_size / tp columns, and vLLM's MergedColumnParallelLinear
    asserts an even split (a bare AssertionError inside the workers)."""
    if intermediate_size % tp:
        return (f"tensor_parallel_size={tp} cannot split intermediate_size {intermediate_size} (vLLM's gate_up_proj / "
                f"down_proj give each rank intermediate_size / tp columns: needs intermediate_size % tp == 0)")
    return None


def register() -> None:
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry
    from vllm.model_executor.layers.quantization import register_quantization_config

    from .quant import NAME, TernaryConfig

    register_quantization_config(NAME)(TernaryConfig)  # re-registering the same class is harmless
    if "BitNetForCausalLM" not in ModelRegistry.get_supported_archs():
        # the class itself, not a lazy "module:Class" string: vLLM inspects lazy models in a
        # subprocess that may not have this repository on sys.path
        from .bitnet import BitNetForCausalLM

        ModelRegistry.register_model("BitNetForCausalLM", BitNetForCausalLM)
    from reference.config import ONEBIT_LLM

    if ONEBIT_LLM not in ModelRegistry.get_supported_archs():
        # 1bitLLM's remote-code class (reference.config.ONEBIT_LLM): the same model with hidden_act silu, its
        # sub-norms under other names (the spec maps them) and online ternarisation (its quantization_config,
        # which config.json lacks, comes through hf_overrides: see the README)
        from .bitnet import BitNetForCausalLM

        ModelRegistry.register_model(ONEBIT_LLM, BitNetForCausalLM)
    from .quant import (act_quant_selected, chain_mode, chain_selected, fused_norm_mode, fused_norm_selected,
                        prologue_selected)

    if chain_mode() == "one" or fused_norm_mode() == "one":
        # the one-token routing's torch.cond through vLLM's piecewise compile (fx_compat)
        from .fx_compat import install_split_graph_fix
        from .quant import keep_cond_pieces_cacheable

        install_split_graph_fix()
        # and vLLM's compile cache keeps that piece (its mega AOT artifact) where its default would not
        keep_cond_pieces_cacheable()
    if fused_norm_selected() or prologue_selected() or act_quant_selected() or chain_selected():
        # vLLM's Llama with the norms fused into the ternary layers (and its tail chained)
        from .llama import TritLlamaForCausalLM

        ModelRegistry.register_model("LlamaForCausalLM", TritLlamaForCausalLM)
    _registered = True

