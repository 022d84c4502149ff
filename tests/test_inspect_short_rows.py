"""Rows shorter than a packing block: a 2-bit layout that pads each row to one block of 128 (or 256) inputs stores
exactly twice the row's length in codes, which is also the size of an unpadded 4-bit packing of it. Where the longer
rows of the same model fit only 2 bits, the code-width vote must take 2 bits for every tensor (a bitnet.cpp
I2_S-style hidden-64 model was split across 2 and 4 bits and refused: "no candidate decodes cleanly")."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reference import synth, train_tiny
from reference.checkpoint import Checkpoint
from reference.inspect import inspect_dir, layout_options
from reference.spec import decode_linear

SMALL = dict(hidden_size=64, intermediate_size=172, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


@pytest.fixture(scope="module")
def small_trained(tmp_path_factory) -> Path:
    """A QAT-trained model with hidden 64 (every attention row shorter than a 128-input block) and intermediate 172
    (down_proj rows padded to 256), trained briefly: enough for the loss to tell decodes apart."""
    out = tmp_path_factory.mktemp("small") / "tiny-64"
    saved = train_tiny.CONFIG
    train_tiny.CONFIG = dict(saved, **SMALL)
    try:
        train_tiny.train(out, steps=120, log_every=1000)
    finally:
        train_tiny.CONFIG = saved
    return out


def test_layout_options_one_block_pad_only_where_asked():
    # [N, 32] bytes for 64 inputs: 4-bit codes unpadded; 2-bit codes padded to one 128-input block only where asked
    assert layout_options((8, 32), (8, 64), 8, 4) == [(False, 1)]
    assert layout_options((8, 32), (8, 64), 8, 2) == []
    assert layout_options((8, 32), (8, 64), 8, 2, one_block=True) == [(False, 1)]
    # an unpacked int8 matrix read as 2-bit codes in blocks longer than its rows (4x padding) stays refused
    assert layout_options((8, 64), (8, 64), 8, 2, one_block=True) == []


@pytest.mark.parametrize("fmt", ["i2s", "hf-bitlinear", "tq2_0", "seed"])
def test_short_rows_decode_bit_for_bit(small_trained, fmt, tmp_path):
    lg = synth.Logical.from_dir(small_trained)
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    res = inspect_dir(out)
    ck = Checkpoint(out)
    assert set(res.spec.linears) == set(truth.ternary)
    for mod, t in truth.ternary.items():
        d = decode_linear(ck, res.spec.linears[mod], mod)
        bad = (d.values.to(torch.int8) != t).nonzero()
        assert bad.numel() == 0, f"{fmt} {mod}: {len(bad)} wrong ternary values, first at {bad[0].tolist()}"
        torch.testing.assert_close(d.effective(), truth.effective(mod), rtol=1e-6, atol=0)
    if fmt == "i2s":
        pack = res.spec.linears[next(iter(res.spec.linears))].pack
        assert (pack.bits, pack.lanes, pack.block, pack.bit_order) == (2, "block_interleaved", 128, "msb")
