"""Comparison mechanics: metrics, tiers and overrides, first divergence, jumps, top-10."""
import math
import re

import pytest
import torch

from parity import names as N
from parity.compare import compare, tensor_metrics, topk_agreement
from parity.diagnose import structural_hints
from parity.tolerances import parse_overrides, resolve


def _golden(L=3, F=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    order = N.canonical_names(L, "llama")
    return order, {n: torch.randn(2, 5, F, generator=g) for n in order}


def test_metrics():
    g = torch.tensor([[1.0, -2.0, 4.0]])
    t = torch.tensor([[1.0, -2.5, 4.0]])
    m = tensor_metrics(t, g)
    assert m["max_abs"] == 0.5 and m["max_rel"] == 0.125 and m["worst_index"] == (0, 1)
    assert m["worst_target"] == -2.5 and m["worst_golden"] == -2.0
    assert math.isclose(m["sqnr_db"], 10 * math.log10(21 / 0.25))
    assert tensor_metrics(g, g)["sqnr_db"] == math.inf


def test_first_divergence_is_earliest_in_execution_order():
    order, gold = _golden()
    tgt = {n: t.clone() for n, t in gold.items()}
    tgt["layer2.mlp.down_proj"] += 1.0
    tgt["layer1.attn.v_proj"] += 1.0
    cmp = compare(gold, tgt, order=order, dtype="fp32")
    assert cmp.first_divergence.name == "layer1.attn.v_proj"
    assert not cmp.passed
    assert "FIRST DIVERGENCE: layer1.attn.v_proj (layer 1, operator attn.v_proj)" in cmp.summary()


def test_attention_tier_is_looser_and_overrides_apply():
    order, gold = _golden()
    tgt = {n: t.clone() for n, t in gold.items()}
    absmax = float(gold["layer0.attn.attn_out"].abs().max())
    tgt["layer0.attn.attn_out"] = gold["layer0.attn.attn_out"] * (1 + 5e-3)  # 5e-3 relative
    assert compare(gold, tgt, order=order, dtype="fp32").passed  # attention tier 1e-2
    tgt["layer0.attn.attn_out"] = gold["layer0.attn.attn_out"] * (1 + 5e-2)
    assert not compare(gold, tgt, order=order, dtype="fp32").passed
    assert compare(gold, tgt, order=order, dtype="fp32", tol_overrides={"attention": 0.1}).passed
    with pytest.raises(KeyError):
        resolve("fp32", {"bogus": 1.0})
    assert parse_overrides(["operator.atol=1e-4"]) == {"operator.atol": 1e-4}


def test_missing_shape_nonfinite():
    order, gold = _golden(L=1)
    tgt = {n: t.clone() for n, t in gold.items()}
    del tgt["layer0.attn.q_proj"]
    tgt["layer0.attn.k_proj"] = tgt["layer0.attn.k_proj"][:, :, :3]
    tgt["layer0.mlp.act"][0, 0, 0] = float("nan")
    r = compare(gold, tgt, order=order, dtype="fp32").by_name()
    assert r["layer0.attn.q_proj"].status == "missing"
    assert r["layer0.attn.k_proj"].status == "shape"
    assert r["layer0.mlp.act"].status == "nonfinite"


def test_nonfinite_target_gets_its_own_hint_not_a_structural_one():
    """A NaN in the target is said as the first NaN / Inf, not read by the structural diagnosis (whose comparisons
    are all False on NaN: it once called it a per-channel offset), and a shape mismatch gets no diagnosis error."""
    order, gold = _golden(L=1)
    tgt = {n: t.clone() for n, t in gold.items()}
    tgt["layer0.mlp.act"][0, 0, 0] = float("nan")
    tgt["layer0.attn.k_proj"] = tgt["layer0.attn.k_proj"][:, :, :3]
    r = compare(gold, tgt, order=order, dtype="fp32", diagnose=structural_hints).by_name()
    assert r["layer0.mlp.act"].hints and "NaN / Inf" in r["layer0.mlp.act"].hints[0]
    assert not any("offset" in h for h in r["layer0.mlp.act"].hints)
    assert not any("diagnosis failed" in h for h in r["layer0.attn.k_proj"].hints)


def test_jump_flagged_inside_tolerance():
    order, gold = _golden(L=4)
    tgt = {n: t.clone() for n, t in gold.items()}
    for L, rel in enumerate([1e-6, 1.2e-6, 8e-4, 9e-4]):  # layer 2 jumps x600, still < 1e-3
        n = f"layer{L}.mlp.down_proj"
        tgt[n] = gold[n] + rel * gold[n].abs().max()
    cmp = compare(gold, tgt, order=order, dtype="fp32")
    assert cmp.passed
    assert [r.name for r in cmp.jumps] == ["layer2.mlp.down_proj"]
    assert "jumps inside tolerance: layer2.mlp.down_proj" in cmp.summary()


def test_topk_near_ties_are_explained():
    g = torch.zeros(1, 3, 20)
    g[..., :10] = torch.arange(10, 0, -1).float()  # clear top-10 at positions 0 and 2
    g[0, 1, 9], g[0, 1, 10] = 1.0, 0.999  # position 1: near tie between ids 9 and 10
    t = g.clone()
    t[0, 1, 10] = 1.001  # swaps the near tie: explained
    assert topk_agreement(t, g, limit=0.01).passed
    t[0, 2, 15] = 100.0  # an id far outside the golden top-10 jumps in: unexplained
    r = topk_agreement(t, g, limit=0.01)
    assert not r.passed and r.unexplained == 1 and "position 2" in r.worst


def test_topk_swap_of_two_logits_each_within_the_limit_is_explained():
    """Two logits each off by < limit in opposite directions swap when their golden gap is < 2 * limit: a near tie
    the tier allows (1.5 x limit here; explained), while 2.5 x limit cannot come from logits within the tier."""
    g = torch.zeros(1, 1, 20)
    g[..., :10] = torch.arange(10, 0, -1).float()
    g[0, 0, 10] = 1.0 - 0.015  # 1.5 x limit below the golden 10th value (id 9: 1.0)
    t = g.clone()
    t[0, 0, 9] -= 0.0099
    t[0, 0, 10] += 0.0099  # 0.9949 > 0.9901: swapped, each logit 0.99 x limit off
    assert set(t[0, 0].topk(10).indices.tolist()) != set(g[0, 0].topk(10).indices.tolist())
    assert (t - g).abs().max() < 0.01
    assert topk_agreement(t, g, limit=0.01).passed
    g[0, 0, 10] = 1.0 - 0.025  # 2.5 x limit: a swap needs an error past the tier
    t[0, 0, 10] = 1.0
    assert not topk_agreement(t, g, limit=0.01).passed


def test_summary_names_a_top10_failure_when_every_tensor_passes():
    """A comparison that fails only on the top-10 ranking says so as its first divergence, not 'no divergence'."""
    from parity.compare import Comparison, TopKResult

    order, gold = _golden(L=1)
    cmp = compare(gold, {n: t.clone() for n, t in gold.items()}, order=order, dtype="fp32")
    cmp.topk = TopKResult(positions=4, top1_agree=1.0, overlap=0.975, unexplained=1, worst="position 3: ...")
    assert not cmp.passed
    assert "FIRST DIVERGENCE: top-10" in cmp.summary() and "no divergence" not in cmp.summary()


def test_structural_hints():
    torch.manual_seed(0)
    g = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(1))
    assert "negated" in structural_hints(-g, g)[0]
    assert "scale" in structural_hints(g * 3.0, g)[0]
    perm = torch.arange(64).roll(16)
    assert "permuted" in structural_hints(g[..., perm], g)[0]
    per_tok = g * (1 + 0.01 * torch.rand(4, 8, 1))
    assert "normalisation" in structural_hints(per_tok, g)[0]
    e = torch.zeros(64)
    e[::4] = 1.0
    noisy = g + 0.05 * e * torch.randn(4, 8, 64)
    assert "period 4" in structural_hints(noisy, g)[0]
    ch = g.clone()
    ch[..., 5] *= 2
    assert "per-channel" in structural_hints(ch, g)[0]


def test_unstructured_hint_bands_by_cosine():
    """A correct target that drifted (cosine 0.99-0.999, e.g. bf16 over 12 layers) is not told 'wrong weights or
    wiring'; unrelated numbers still are; near-identical ones read as noise."""
    import torch

    from parity.diagnose import structural_hints

    g = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(64, 96, generator=torch.Generator().manual_seed(2))
    for scale, want in ((0.02, "noise-like"), (0.08, "close but drifted"), (3.0, "a different computation")):
        (h,) = structural_hints(g + scale * noise, g)
        assert want in h, (scale, h)


def test_a_failing_line_says_how_far_over_the_limit():
    """A failure 0.03% over its limit printed as max_abs=1.155e-01 (limit 1.155e-01), which reads like a pass."""
    g = torch.ones(4, 8)
    t = g.clone()
    t[0, 0] += 1.0012e-3  # the fp32 operator tier: 1e-6 + 1e-3 * max|golden| = 1.001e-3
    r = compare({"layer0.attn.q_proj": g}, {"layer0.attn.q_proj": t}, order=["layer0.attn.q_proj"], dtype="fp32").results[0]
    assert r.status == "FAIL" and re.search(r"\(limit 1\.001e-03; exceeded x1\.000[1-3]\d\d,", r.line()), r.line()
    t[0, 0] = 1.5
    big = compare({"layer0.attn.q_proj": g}, {"layer0.attn.q_proj": t}, order=["layer0.attn.q_proj"], dtype="fp32")
    assert "; exceeded x500," in big.results[0].line()
    ok = compare({"layer0.attn.q_proj": g}, {"layer0.attn.q_proj": g}, order=["layer0.attn.q_proj"], dtype="fp32")
    assert "exceeded" not in ok.results[0].line()
