"""Rows shorter than a packing block: a 2-bit layout that pads each row to one block of 128 (or 256) inputs stores
exactly twice the row's length in codes, which is also the size of an unpadded 4-bit packing of it. Where the longer
rows of the same model fit only 2 bits, the code-width vote must take 2 bits for every tensor (a bitnet.cpp
I2_S-style hidden-64 model was split across 2 and 4 bits and refused: "no candidate decodes cleanly"). Where every
row is half a block long (hidden and intermediate 64), every tensor fits both readings: the inspector must decode
both and keep the one that decodes (a padded reading whose padding holds data does not) with the lower loss (an
I2_S model of 64-input rows was read as 4-bit codes, a working but wrong decode), while a genuine 4-bit packing of
the same shapes stays 4-bit."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reference import synth, train_tiny
from reference.checkpoint import Checkpoint
from reference.config import ModelConfig
from reference.formats import code_table
from reference.inspect import AmbiguousWidth, infer_structure, inspect_dir, layout_options, map_keys
from reference.scan import scan
from reference.spec import decode_linear

SMALL = dict(hidden_size=64, intermediate_size=172, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
ALL_SHORT = dict(SMALL, intermediate_size=64)  # every linear's rows 64 inputs: half an I2_S block


def _train(tmp_path_factory, name: str, sizes: dict) -> Path:
    out = tmp_path_factory.mktemp(name) / name
    saved = train_tiny.CONFIG
    train_tiny.CONFIG = dict(saved, **sizes)
    try:
        train_tiny.train(out, steps=120, log_every=1000)
    finally:
        train_tiny.CONFIG = saved
    return out


@pytest.fixture(scope="module")
def small_trained(tmp_path_factory) -> Path:
    """A QAT-trained model with hidden 64 (every attention row shorter than a 128-input block) and intermediate 172
    (down_proj rows padded to 256), trained briefly: enough for the loss to tell decodes apart."""
    return _train(tmp_path_factory, "tiny-64", SMALL)


@pytest.fixture(scope="module")
def all_short(tmp_path_factory) -> synth.Logical:
    """A QAT-trained model with hidden and intermediate 64: no tensor's shape forces 2 bits."""
    return synth.Logical.from_dir(_train(tmp_path_factory, "tiny-64-64", ALL_SHORT))


def test_layout_options_one_block_pad_only_where_asked():
    # [N, 32] bytes for 64 inputs: 4-bit codes unpadded; 2-bit codes padded to one 128-input block only where asked
    assert layout_options((8, 32), (8, 64), 8, 4) == [(False, 1)]
    assert layout_options((8, 32), (8, 64), 8, 2) == []
    assert layout_options((8, 32), (8, 64), 8, 2, one_block=True) == [(False, 1)]
    # an unpacked int8 matrix read as 2-bit codes in blocks longer than its rows (4x padding) stays refused
    assert layout_options((8, 64), (8, 64), 8, 2, one_block=True) == []


def _assert_exact(res, out: Path, truth: synth.Truth, fmt: str) -> None:
    ck = Checkpoint(out)
    assert set(res.spec.linears) == set(truth.ternary)
    for mod, t in truth.ternary.items():
        d = decode_linear(ck, res.spec.linears[mod], mod)
        bad = (d.values.to(torch.int8) != t).nonzero()
        assert bad.numel() == 0, f"{fmt} {mod}: {len(bad)} wrong ternary values, first at {bad[0].tolist()}"
        torch.testing.assert_close(d.effective(), truth.effective(mod), rtol=1e-6, atol=0)


@pytest.mark.parametrize("fmt", ["i2s", "hf-bitlinear", "tq2_0", "seed"])
def test_short_rows_decode_bit_for_bit(small_trained, fmt, tmp_path):
    lg = synth.Logical.from_dir(small_trained)
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    res = inspect_dir(out)
    _assert_exact(res, out, truth, fmt)
    if fmt == "i2s":
        pack = res.spec.linears[next(iter(res.spec.linears))].pack
        assert (pack.bits, pack.lanes, pack.block, pack.bit_order) == (2, "block_interleaved", 128, "msb")


def _width(res):
    return next(f for f in res.findings if f.what == "code width")


def _with_bits(writer, bits: int):
    """``writer`` with config.json's quantization_config naming the code width only."""
    def write(lg):
        sd, _, truth = writer(lg)
        return sd, {"bits": bits}, truth
    return write


def test_short_rows_config_bits(small_trained, tmp_path):
    """config.json's bits 2 with the short rows padded to one block: read so (they were refused as too wide for
    2-bit codes, the config's width applied without the padded reading)."""
    out = tmp_path / "i2s-bits-2"
    truth = synth.write(_with_bits(synth.w_i2s, 2), synth.Logical.from_dir(small_trained), out)
    res = inspect_dir(out)
    _assert_exact(res, out, truth, "i2s with config bits 2")
    f = _width(res)
    assert f.decision == "2-bit codes, rows padded to one block" and "config.json says 2 bits" in f.evidence, f


#: 2-bit layouts that pad a 64-input row to one 128-input block (bitnet.cpp I2_S, and its lanes low bits first in
#: int8 containers with per-channel scales), and llama.cpp's 256-input records (their own structure: no width question)
PADDED = {"i2s": "i2s",
          "i2s-lsb-int8": lambda lg: synth.w_custom(lg, synth.I2S_SPEC.replace(bit_order="lsb", container="int8")),
          "tq2_0": "tq2_0", "tq1_0": "tq1_0"}
#: 4-bit packings of the same shapes (uint8 [N, K/2]): nibbles w + 1 high first, and AutoGPTQ-style codes w + 8 low
#: first; read at 2 bits with rows padded to one block, their "padding" holds half the weights
NIBBLES = {"nibble-ternary": "nibble-ternary",
           "nibble-w8-lsb": lambda lg: synth.w_custom(lg, synth.NIBBLE_SPEC.replace(
               bit_order="lsb", codes=code_table(4, {7: -1, 8: 0, 9: 1}), pad_code=8))}


@pytest.mark.parametrize("fmt", sorted(PADDED))
def test_all_short_rows_padded_two_bit(all_short, fmt, tmp_path):
    """Every row 64 inputs: the padded 2-bit layouts decode bit for bit; where the shapes fit 4-bit codes too, the
    width is decided by decoding both readings (the 4-bit one works, worse: the loss decides)."""
    out = tmp_path / fmt
    truth = synth.write(PADDED[fmt], all_short, out)
    res = inspect_dir(out)
    _assert_exact(res, out, truth, fmt)
    assert {e.pack.bits for e in res.spec.linears.values()} == {2}
    if fmt.startswith("i2s"):
        f = _width(res)
        assert f.decision == "2-bit codes, rows padded to one block (ambiguous width, decided by decode)", f
        assert "4-bit unpadded: loss" in f.evidence and "the loss decides" in f.evidence, f.evidence
        assert f.confidence == "high", f


@pytest.mark.parametrize("fmt", sorted(NIBBLES))
def test_all_short_rows_genuine_four_bit_stays_four_bit(all_short, fmt, tmp_path):
    """The same shapes as genuine 4-bit codes: both readings are tried, and the padded one fails to decode."""
    out = tmp_path / fmt
    truth = synth.write(NIBBLES[fmt], all_short, out)
    res = inspect_dir(out)
    _assert_exact(res, out, truth, fmt)
    assert {e.pack.bits for e in res.spec.linears.values()} == {4}
    f = _width(res)
    assert f.decision == "4-bit codes (ambiguous width, decided by decode)", f
    assert "2-bit padded to one block: fails (" in f.evidence and f.evidence.endswith(
        "the 2-bit padded to one block reading fails"), f
    if fmt == "nibble-ternary":  # codes 0 / 1 / 2 in both halves of each nibble: the padded reading fails on its pads
        assert "holds more than one code: expected one pad code" in f.evidence, f


def test_all_short_rows_without_text(all_short, tmp_path):
    """No text to score on: the padded reading decodes only where every tensor's padding holds one code."""
    for fmt, table, bits in (("i2s", PADDED, 2), ("nibble-ternary", NIBBLES, 4)):
        out = tmp_path / fmt
        truth = synth.write(table[fmt], all_short, out)
        res = inspect_dir(out, use_loss=False)
        assert {e.pack.bits for e in res.spec.linears.values()} == {bits}, (fmt, _width(res))
        if bits == 2:  # (a nibble's order within its byte needs the loss: only the width is asked of it)
            _assert_exact(res, out, truth, fmt)


def test_all_short_rows_ambiguity_named_or_settled_by_config(all_short, tmp_path):
    """choose_bits names the open width (file, tensor, both readings, the config key that would settle it);
    config.json's bits settle it without decoding twice."""
    out = tmp_path / "i2s"
    synth.write("i2s", all_short, out)
    cfg, ck = ModelConfig.load(out), Checkpoint(out)
    modules, _ = map_keys(scan(ck), cfg)
    with pytest.raises(AmbiguousWidth, match=r"model\.safetensors: tensor 'blk\.\d+\.\w+\.weight': shape \[\d+, 32\] "
                       r"U8 holds the logical \d+x64 matrix as 4-bit codes unpadded and as 2-bit codes with each row "
                       r"padded to one block \(twice its length\).*; config\.json names no width: expected "
                       r"quantization_config bits 4 or 2"):
        infer_structure(modules, cfg, ck, [])
    # config.json's bits name the reading: nothing to decode twice
    truth = synth.write(_with_bits(synth.w_i2s, 2), all_short, out)
    res = inspect_dir(out)
    _assert_exact(res, out, truth, "i2s with config bits 2")
    f = _width(res)
    assert f.decision == "2-bit codes, rows padded to one block" and "config.json says 2 bits" in f.evidence, f


def test_width_by_decode_passes_on_a_failure_both_readings_share():
    """Where both readings fail with the same error (e.g. a tokenizer of another model, checked after the width), that
    error is raised as it is, not as 'neither reading decodes' around two copies of it; different failures are named
    per reading."""
    from reference.inspect import InspectError, _width_by_decode

    amb = AmbiguousWidth("m/model.safetensors: tensor 'w'", 4, 2)
    same = {False: InspectError("tokenizer gives token id 900"), True: InspectError("tokenizer gives token id 900")}
    with pytest.raises(InspectError, match=r"^tokenizer gives token id 900$"):
        _width_by_decode(amb, same)
    other = {False: InspectError("a"), True: InspectError("b")}
    with pytest.raises(InspectError, match=r"neither reading decodes - 4-bit unpadded: a; 2-bit padded to one block: b"):
        _width_by_decode(amb, other)
