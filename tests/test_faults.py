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


# ---- diagnosis of faults found by an adversarial pass (2026-12-05): each hint used to be wrong or missing


def _gold(*shape, seed=0):
    import torch
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


def test_structural_hints_follow_the_tensor_kind():
    import torch

    from parity.diagnose import structural_hints
    g = _gold(2, 16, 64)
    w = torch.ones(64)
    w[::3] = 1.7
    assert "norm's weight missing" in structural_hints(g * w, g, "layer0.input_norm")[0]
    assert "norm's weight missing" in structural_hints(g * w, g, "final_norm")[0]
    assert "per-channel or per-block scale" in structural_hints(g * w, g, "layer0.attn.q_proj")[0]
    heads = g.reshape(2, 16, 4, 16).flip(2).reshape(2, 16, 64)  # heads merged in reverse order
    assert "heads merged in another order" in structural_hints(heads, g, "layer2.attn.attn_out")[0]
    assert "lane layout" in structural_hints(heads, g, "layer2.attn.q_proj")[0]
    b = torch.linspace(-0.3, 0.3, 64)
    h = structural_hints(g + b, g, "layer1.attn.q_proj")  # a bias added twice: cosine 0.99, read as drift
    assert "same per-channel offset" in h[0] and "bias added twice" in h[0]


def test_exact_targets_get_no_noise_explanation():
    from parity.diagnose import structural_hints
    g = _gold(4, 32, 64, seed=1)
    t = g + 3e-2 * _gold(4, 32, 64, seed=2)  # cosine ~0.9995, no factor fits
    assert "noise-like" in structural_hints(t, g)[0]
    h = structural_hints(t, g, "layer1.attn.o_proj", exact=True)[0]
    assert "noise-like" not in h and "claims the reference's arithmetic bit for bit" in h


def test_doubled_residual_branch_is_named():
    from parity.diagnose import residual_hints
    h, o, d = _gold(2, 8, 32, seed=3), _gold(2, 8, 32, seed=4), _gold(2, 8, 32, seed=5)
    tgt = {"layer0.output": h, "layer1.attn.o_proj": o, "layer1.mlp.down_proj": d}
    assert "MLP branch added twice" in residual_hints("layer1.output", h + o + 2 * d, tgt)[0]
    assert "residual stream added twice" in residual_hints("layer1.output", 2 * h + o + d, tgt)[0]


def test_scale_fault_gets_no_depth_hint_and_eps_fault_names_the_first_nonzero(tmp_path, local_golden):
    """A 1.01 scale on one down_proj spreads downstream and grows with depth: the 'accumulation rather than one broken
    operator' hint contradicted the right diagnosis. A norm eps fault first fails two operators later (mlp.act
    amplifies it); on a bit-faithful target the first nonzero difference says where it started."""
    from parity.golden import GoldenSet, bit_faithful_here
    assert bit_faithful_here(GoldenSet.load(local_golden).manifest)  # fresh_golden: dumped on this machine

    import dataclasses

    from parity.faults import Overrides, _only
    scaled = Overrides(linear_hook=_only("model.layers.0.mlp.down_proj",
                                         lambda d: dataclasses.replace(d, mult=d.mult * 1.01, div=None if d.div is None
                                                                       else d.div / 1.01)))
    res = run_parity(FaultyTarget(scaled), runs_dir=None,
                     golden_dir=local_golden)
    fd = res.comparison.first_divergence
    assert fd.name == "layer0.mlp.down_proj" and "1.01 x golden" in fd.hints[0]
    assert not any("grows steadily with depth" in h for h in fd.hints), fd.hints
    res = run_parity(FaultyTarget(faults.norm_eps(["layer0.post_attn_norm"], 1e-4)), runs_dir=None,
                     golden_dir=local_golden)
    fd = res.comparison.first_divergence
    assert any("first nonzero difference" in h and "layer0.post_attn_norm" in h for h in fd.hints), fd.hints


@pytest.mark.parametrize("ov,what", [
    (faults.code_table_swapped("model.layers.3.self_attn.v_prj"), r"module 'model\.layers\.3\.self_attn\.v_prj'"),
    (faults.scale_dropped("model.layers.9.mlp.down_proj"), r"module 'model\.layers\.9\.mlp\.down_proj'"),
    (faults.wrong_qkv_split(7), r"module 'model\.layers\.7\.self_attn\.k_proj'"),
    (faults.norm_eps(["layer2.post_attention_norm"], 1e-2), r"norm 'layer2\.post_attention_norm'"),
    (faults.residual_dropped(4, "attn"), r"residual \(4, 'attn'\)"),
    # the bundled model ties its head to the embedding: no hook ever sees an lm_head to change
    (faults.scale_dropped("lm_head"), r"module 'lm_head' \(not a quantised linear of this checkpoint\)")])
def test_a_fault_aimed_at_nothing_is_refused(ov, what):
    """A misspelt module / norm or a layer the model lacks planted nothing, and the run passed (the fault facility's
    promise silently broken): the model names what it does not have."""
    from reference.checkpoint import Checkpoint
    from reference.model import ReferenceModel
    from reference.spec import spec_for

    cfg = ModelConfig.load(DEFAULT_MODEL)  # the bundled model: 4 layers
    with pytest.raises(ValueError, match=r"overrides aim at what this model \(bitnet, 4 layers\) does not have: " + what):
        ReferenceModel(cfg, spec_for(DEFAULT_MODEL, cfg), Checkpoint(DEFAULT_MODEL), overrides=ov)


def test_a_scale_under_a_targets_own_rounding_is_named():
    """x1.5 on a bf16-like target (the factor plus ~3% rounding noise of its own): the exact fit's 1e-2 residual
    bound failed and the hint said "noise-like: accumulation / dtype", sending the user to the tolerances."""
    from parity.diagnose import structural_hints
    g = _gold(4, 32, 64, seed=1)
    noisy = 1.5 * g + 3e-2 * _gold(4, 32, 64, seed=2)
    h = structural_hints(noisy, g, "layer4.mlp.down_proj")[0]
    assert "every element is about 1.5" in h and "scale" in h and "noise-like" not in h
    drift = g + 3e-2 * _gold(4, 32, 64, seed=2)  # no factor: still read as drift, not as a scale
    assert "noise-like" in structural_hints(drift, g, "layer4.mlp.down_proj")[0]
    assert "about" not in structural_hints(1.5 * g + 3e-2 * _gold(4, 32, 64, seed=2), g, "layer4.mlp.down_proj",
                                           exact=True)[0]  # exact targets keep the strict fit (and its wording)


def test_a_dropped_residual_inside_its_tier_is_named_upstream(tmp_path):
    """Layer 0's attention residual dropped in a BitNet model with a small embedding (std 0.02): norm(o_proj) is so
    close to norm(embed + o_proj) that layer0.post_attn_norm stays inside its bf16 tier, the first failing tensor lies
    layers later, and its hint said drift ("noise-like" / "close but drifted"), sending the user to the tolerances.
    The wiring check of the stream before the failing tensor names the layer."""
    from parity.dump import dump_reference
    from parity.targets.reference import Bf16Target
    from reference.make_model import Preset, write_model

    d = write_model(Preset("bitnet", 64, 100, 11, 2, 1, 89, True, seed=5), tmp_path / "m")
    gold = dump_reference(d, tmp_path / "g")
    res = run_parity(Bf16Target(overrides=faults.residual_dropped(0, "attn")), model_dir=d, golden_dir=gold,
                     runs_dir=tmp_path / "runs")
    fd = res.comparison.first_divergence
    assert fd is not None
    joined = " | ".join(fd.hints)
    assert ("layer0.post_attn_norm" in fd.name and "attention's residual add dropped" in joined) or (
        "upstream, inside its tier: layer0.post_attn_norm" in joined and "attention's residual add dropped" in joined), \
        res.comparison.summary()


def test_a_sub_tier_difference_of_a_bit_faithful_target_is_noted(tmp_path, local_golden):
    """final_norm's eps doubled: every tensor stays inside the fp32 tier, and a target that claims the reference's
    arithmetic bit for bit said "no divergence" with nothing else; now the summary notes the first nonzero
    difference (the verdict stays the tiers')."""
    eps = ModelConfig.load(DEFAULT_MODEL).rms_norm_eps
    res = run_parity(FaultyTarget(faults.norm_eps(["final_norm"], 2 * eps)), runs_dir=tmp_path, golden_dir=local_golden)
    cmp = res.comparison
    assert cmp.first_divergence is None, cmp.summary()
    assert "NOTE: " in cmp.summary() and "the first nonzero difference is final_norm" in cmp.summary()
    clean = run_parity(FaultyTarget(faults.norm_eps([], eps)), runs_dir=tmp_path, golden_dir=local_golden).comparison
    assert clean.passed and "NOTE" not in clean.summary()


def test_the_upstream_scan_never_names_a_tensor_that_failed_itself(tmp_path, local_golden):
    """Layer 1's attention residual dropped: layer1.post_attn_norm fails with its own wiring hint; the next failing
    tensor's diagnosis used to run the upstream scan and call that failed tensor "inside its tier"."""
    res = run_parity(FaultyTarget(faults.residual_dropped(1, "attn")), runs_dir=tmp_path, golden_dir=local_golden)
    fd = res.comparison.first_divergence
    assert fd.name == "layer1.post_attn_norm" and "attention's residual add dropped" in " ".join(fd.hints)
    assert not [r.name for r in res.comparison.results if any(h.startswith("upstream") for h in r.hints)]


def test_a_hook_object_with_a_modules_method_is_not_read_as_names():
    """An nn.Module used as a hook has a .modules() method: it must not be iterated as the names it aims at."""
    import torch

    from reference.checkpoint import Checkpoint
    from reference.model import Overrides, ReferenceModel
    from reference.spec import spec_for

    class Hook(torch.nn.Module):
        def forward(self, name, d):
            return d

    cfg = ModelConfig.load(DEFAULT_MODEL)
    ReferenceModel(cfg, spec_for(DEFAULT_MODEL, cfg), Checkpoint(DEFAULT_MODEL), overrides=Overrides(linear_hook=Hook()))
