"""Session 57: the inspector's reads of a model of sign-bitmask pairs (each test failed before its change)."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as hst

from reference import synth
from reference.checkpoint import Checkpoint
from reference.inspect import inspect_dir
from reference.scan import bool_as_u8_stats, tensor_stats

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(0, 37), k=hst.integers(1, 70), p=hst.sampled_from([0.0, 0.02, 0.5, 1.0]),
       seed=hst.integers(0, 2 ** 16), dim=hst.sampled_from([1, 2]),
       leaf=hst.sampled_from(["weight_pos", "neg_mask", "minus"]))
def test_bool_stats_as_bytes_equal_a_scan_of_the_bytes(n, k, p, seed, dim, leaf):
    """``bool_as_u8_stats`` (the U8 statistics of a bool tensor's bytes, derived from its BOOL scan) equals
    ``tensor_stats`` of the bytes field for field: all-zero, all-one, sparse and empty masks, 1-D and 2-D."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand((n, k) if dim == 2 else (n * k,), generator=g) < p
    name = f"model.layers.0.mlp.down_proj.{leaf}"
    b = tensor_stats(t, name, "f.safetensors", "BOOL", t.numel())
    assert asdict(bool_as_u8_stats(b)) == asdict(tensor_stats(t.view(torch.uint8), name, "f.safetensors", "U8",
                                                              t.numel()))


def test_bool_as_u8_stats_refuses_other_dtypes():
    st = tensor_stats(torch.zeros(3, 4, dtype=torch.uint8), "a.weight_pos", "f.safetensors", "U8", 12)
    with pytest.raises(ValueError, match=r"f.safetensors: tensor 'a.weight_pos': dtype U8, expected BOOL"):
        bool_as_u8_stats(st)


def test_bool_masks_are_not_read_again_for_their_byte_stats(monkeypatch, tmp_path):
    """A model of bool sign-mask pairs: every mask was read once more after the scan only to take its uint8 stats
    (``_sign_mask_bytes``). Now the inspector reads a mask no more often than a uint8 one - the scan, the pair check,
    the decode - and the result is the uint8 model's."""
    lg = synth.Logical.from_dir(TRAINED)
    reads: Counter = Counter()
    get = Checkpoint.get

    def counting(self, name, *a, **kw):
        reads[name] += 1
        return get(self, name, *a, **kw)

    monkeypatch.setattr(Checkpoint, "get", counting)
    specs = {}
    for fmt in ("sign-masks-bool", "sign-masks-u8"):
        out = tmp_path / fmt
        synth.write(fmt, lg, out)
        reads.clear()
        specs[fmt] = inspect_dir(out, use_loss=False).spec
        masks = {n: c for n, c in reads.items() if n.endswith(("weight_pos", "weight_neg"))}
        assert masks, fmt
        specs[fmt + " reads"] = max(masks.values())
    assert specs["sign-masks-bool reads"] <= specs["sign-masks-u8 reads"]
    for key, e in specs["sign-masks-u8"].linears.items():
        b = specs["sign-masks-bool"].linears[key]
        assert b == e, key
