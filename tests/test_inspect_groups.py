"""Group scales whose shape fits more than one group size: [N, G] scales give G = ceil(K / size), so K = 384 in 2
groups is 192 exactly or a power of two, 256, with a shorter last group.  The inspector takes an exact divisor of K
first (what AutoAWQ / compressed-tensors / HQQ can write at all) and lets the loss overrule it
(reference.inspect._group_size_options, _group_size_search).  Ground truth: models/tiny-trained (K = 128 and 384)
re-written by reference.synth; every decode is checked weight for weight against the written one."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reference import synth
from reference.checkpoint import Checkpoint
from reference.formats import PackSpec, twos_complement_table
from reference.inspect import _group_size_options, inspect_dir
from reference.spec import decode_linear

TRAINED = Path(__file__).resolve().parent.parent / "models" / "tiny-trained"
TERNARY = PackSpec(bits=2, container="uint8", pack_axis=1, codes=(-1, 0, 1, None), pad_code=1)
INT8 = PackSpec(bits=8, container="int8", pack_axis=1, codes=twos_complement_table(8))
DOWN = "model.layers.0.mlp.down_proj"  # K = 384: the one module the group sizes here split into several groups


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _levels(lg: synth.Logical, gs: int, levels=(120, 24)) -> synth.Logical:
    """8-bit integers T * L with L alternating 120 / 24 from one group of ``gs`` inputs to the next, and multipliers
    m / L: the trained model's effective weights (a working model), whose group scales differ 5x from group to group,
    so a scale applied to the wrong inputs shows in the loss."""
    tern, mult = {}, {}
    for mod, t in lg.ternary.items():
        n, k = t.shape
        lev = torch.tensor(levels)[(torch.arange(k) // gs) % len(levels)]
        tern[mod] = (t.to(torch.int32) * lev).to(torch.int8)
        mult[mod] = (lg.mult[mod].expand(n, k) / lev).float().contiguous()
    return synth.Logical(lg.config, tern, mult, lg.floats, lg.tokenizer_dir)


def _write(lg: synth.Logical, spec: PackSpec, gs: int, out: Path) -> synth.Truth:
    return synth.write(lambda g: synth.w_custom(g, spec, scale="group", group_size=gs), lg, out)


def _check(out: Path, res, truth: synth.Truth, gs: int) -> None:
    """The inspected spec reads ``gs`` for the K = 384 modules and decodes every module to the written weights."""
    ck = Checkpoint(out)
    assert res.spec.linears[DOWN].scale.group_size == gs
    for mod in truth.ternary:
        eff = decode_linear(ck, res.spec.linears[mod], mod).effective()
        assert torch.equal(eff, truth.effective(mod)), f"{mod}: {(eff - truth.effective(mod)).abs().max()}"


def _group_finding(res):
    return next(f for f in res.findings if f.what == "scale group size")


def test_group_size_options():
    """The exact divisor first, then the power of two with a shorter last group; neither: the smallest fit."""
    assert _group_size_options([(384, 2)]) == [192, 256]
    assert _group_size_options([(384, 3)]) == [128]
    assert _group_size_options([(128, 2), (384, 4)]) == [96]  # 96 over K = 128: 96 + 32; no power of two fits both
    assert _group_size_options([(4544, 36)]) == [128]  # Falcon-7B's K in groups of 128: padded, no exact divisor
    assert _group_size_options([(100, 3)]) == [34]
    assert _group_size_options([(128, 2), (384, 2)]) == []


@pytest.mark.parametrize("use_loss", [True, False])
def test_group_size_192_over_k_384(use_loss, logical, tmp_path):
    """Groups of 192 over K = 384 (2 scale columns, which 256 with a shorter last group also fits): 192, the exact
    divisor, with and without text (was: 256, the power-of-two prior, inputs 192 - 255 under the wrong scale)."""
    lg = logical.with_group_jitter(192, seed=1)
    out = tmp_path / "g192"
    truth = _write(lg, TERNARY, 192, out)
    res = inspect_dir(out, use_loss=use_loss)
    _check(out, res, truth, 192)
    f = _group_finding(res)
    assert f.decision == "192" and "192 / 256" in f.evidence, f
    if use_loss:  # jitter of 2% moves the loss by less than PRIOR_MARGIN: the prior decides, and says so
        assert "nats at 256" in f.evidence and f.confidence == "low (prior)", f


@pytest.mark.parametrize("gs", [96, 128])
def test_group_size_that_divides_k(gs, logical, tmp_path):
    """Sizes that divide K = 384 (4 groups of 96, 3 of 128; K = 128 modules: 96 + 32, or one group) still read."""
    lg = logical.with_group_jitter(gs, seed=2)
    out = tmp_path / f"g{gs}"
    truth = _write(lg, TERNARY, gs, out)
    res = inspect_dir(out)
    _check(out, res, truth, gs)
    assert _group_finding(res).decision == str(gs)


@pytest.mark.parametrize("gs", [256, 192])
def test_group_size_scored_by_loss(gs, logical, tmp_path):
    """Groups of 256 (the last one 128 wide) or 192 over K = 384, scales 5x apart: at 256 the prior (192, the exact
    divisor) is overruled by the loss with high confidence, and without text the prior stands, said with low
    confidence; at 192 the loss agrees with the prior and says so above low."""
    lg = _levels(logical, gs)
    out = tmp_path / f"g{gs}"
    truth = _write(lg, INT8, gs, out)
    res = inspect_dir(out)
    _check(out, res, truth, gs)
    f = _group_finding(res)
    assert f.decision == str(gs), f
    if gs == 192:
        assert f.confidence in ("medium", "high"), f
        return
    assert "overrules the prior" in f.evidence and f.confidence == "high", f
    res = inspect_dir(out, use_loss=False)
    assert res.spec.linears[DOWN].scale.group_size == 192 and _group_finding(res).confidence == "low (prior)"
