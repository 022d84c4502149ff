"""Planted faults are localised to exactly the planted layer and operator, with the right hint.

Against a golden set dumped on this machine: the planted-fault targets are copies of the reference,
bit-faithful (fp32 tier, sensitive to an RMSNorm eps of 1e-5 vs 1e-6) only against a set computed
the same way (parity.golden.bit_faithful_here); the committed set may come from another CPU ISA."""
import pytest

from parity import faults
from parity.dump import DEFAULT_MODEL
from parity.run import run_parity
from parity.targets.reference import FaultyTarget
from reference.config import ModelConfig

CASES = [
    ("code table swapped in layer 3 v_proj", faults.code_table_swapped("model.layers.3.self_attn.v_proj"),
     "layer3.attn.v_proj", "code"),
    ("bit order reversed in layer 1 gate_proj", faults.bit_order_reversed("model.layers.1.mlp.gate_proj"),
     "layer1.mlp.gate_proj", "bit order"),
    ("scale dropped in layer 2 o_proj", faults.scale_dropped("model.layers.2.self_attn.o_proj"),
     "layer2.attn.o_proj", "scale"),
    ("wrong qkv split in layer 2", faults.wrong_qkv_split(2), "layer2.attn.v_proj", "permuted|wrong weights"),
    ("MLP residual dropped in layer 1", faults.residual_dropped(1, "mlp"), "layer1.output",
     "MLP's residual add dropped"),
    ("attention residual dropped in layer 3", faults.residual_dropped(3, "attn"), "layer3.post_attn_norm",
     "attention's residual add dropped"),
]


@pytest.fixture
def local_golden(fresh_golden):
    return fresh_golden


@pytest.mark.parametrize("desc,ov,where,hint", CASES, ids=[c[0] for c in CASES])
def test_fault_is_localised(desc, ov, where, hint, tmp_path, local_golden):
    res = run_parity(FaultyTarget(ov), runs_dir=tmp_path, golden_dir=local_golden)
    cmp = res.comparison
    fd = cmp.first_divergence
    assert fd is not None, f"{desc}: the harness saw no divergence"
    assert fd.name == where, f"{desc}: first divergence reported at {fd.name}, planted at {where}\n{cmp.summary()}"
    import re
    assert any(re.search(hint, h) for h in fd.hints), f"{desc}: hints {fd.hints} do not point at /{hint}/"
    # everything before the planted operator still passes
    assert all(r.passed for r in cmp.results[:fd.order])
    # the failure snapshot was kept
    assert (res.run_dir / "failures.safetensors").exists()
    assert fd.name in (res.run_dir / "report.md").read_text()


def test_norm_eps_fault_is_localised(tmp_path, local_golden):
    cfg = ModelConfig.load(DEFAULT_MODEL)
    from parity.names import canonical_names
    norms = [n for n in canonical_names(cfg.num_layers, cfg.arch) if n.endswith("norm")]
    res = run_parity(FaultyTarget(faults.norm_eps(norms, 1e-5)), runs_dir=tmp_path, golden_dir=local_golden)
    fd = res.comparison.first_divergence
    assert fd is not None and fd.name == "layer0.input_norm", res.comparison.summary()
    assert any("normalisation" in h for h in fd.hints), fd.hints


def test_eps_fault_in_one_later_norm(tmp_path, local_golden):
    res = run_parity(FaultyTarget(faults.norm_eps(["layer2.post_attn_norm"], 1e-2)), runs_dir=tmp_path,
                     golden_dir=local_golden)
    fd = res.comparison.first_divergence
    assert fd is not None and fd.name == "layer2.post_attn_norm", res.comparison.summary()
