"""The inspector, given only a checkpoint directory, recovers every public convention.

Ground truth: the QAT-trained models/tiny-trained (reference.train_tiny), re-written by
reference.synth in each convention.  For every format the inspected spec must decode the
ternary matrix bit for bit, the effective weights within the rounding of the stored scale, and
reproduce the trained model's loss; the loss of every wrong candidate must be far higher.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError
from reference.config import ModelConfig
from reference.decode import main as decode_main, model_loss, text_ids
from reference.formats import SEED, PackSpec, code_table, offset_table, pack, twos_complement_table
from reference.inspect import InspectError, inspect_dir, main as inspect_main
from reference.model import ReferenceModel
from reference.spec import CheckpointSpec, decode_linear, spec_for

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
JITTER = {"seed", "seed-msb", "group", "compressed-tensors", "compressed-tensors-group", "gptq", "int8-ternary",
          "uint8-ternary-perm", "nibble-ternary", "compressed-tensors-int4-ternary"}  # channel / group scales
GROUP_JITTER = {"tq2_0": 256, "tq1_0": 256, "hqq": 64, "hqq-meta": 64,  # per-block scales (llama.cpp TQ2_0 / TQ1_0: one fp16 d per 256
                "hqq-axis0": 64, "hqq-axis0-meta": 64}  # inputs; HQQ: one scale per group)
AXIS0_JITTER = {"hqq-axis0", "hqq-axis0-meta"}  # HQQ axis=0: the groups are columns of W's [64, N*K/64] view
SCALE_RTOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}  # rounding of a stored scale
ACT_ORDER_JITTER = {"gptq-actorder"}  # per-group scales over synth's act-order groups (actorder_g_idx)


def _actorder_jitter(logical: synth.Logical, group_size: int = 64) -> synth.Logical:
    gi = {m: synth.actorder_g_idx(p, group_size) for m, p in synth.actorder_perms(logical).items()}
    return logical.with_group_jitter(group_size, seed=1, g_idx=gi)


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


@pytest.fixture(scope="module")
def trained_loss():
    cfg = ModelConfig.load(TRAINED)
    return model_loss(cfg, spec_for(TRAINED, cfg), Checkpoint(TRAINED), text_ids(TRAINED))


def check_recovered(model_dir: Path, spec: CheckpointSpec, truth: synth.Truth, logical: synth.Logical,
                    rtol_vs_logical: float):
    ck = Checkpoint(model_dir)
    assert set(spec.linears) == set(truth.ternary)
    for mod, t in truth.ternary.items():
        d = decode_linear(ck, spec.linears[mod], mod)
        if spec.linears[mod].pack is not None:
            bad = (d.values.to(torch.int8) != t).nonzero()
            assert bad.numel() == 0, f"{mod}: {len(bad)} wrong ternary values, first at {bad[0].tolist()}"
        eff = d.effective()
        torch.testing.assert_close(eff, truth.effective(mod), rtol=1e-6, atol=0, msg=lambda m: f"{mod}: {m}")
        torch.testing.assert_close(eff, logical.effective(mod), rtol=rtol_vs_logical, atol=0,
                                   msg=lambda m: f"{mod} vs unrounded: {m}")


@pytest.mark.parametrize("fmt", sorted(synth.FORMATS))
def test_recovers_public_format(fmt, logical, trained_loss, tmp_path):
    lg = logical.with_channel_jitter(seed=1) if fmt in JITTER else logical
    if fmt in GROUP_JITTER:  # block scales that differ block to block (a misplaced d shows)
        lg = logical.with_group_jitter(GROUP_JITTER[fmt], seed=1, axis=0 if fmt in AXIS0_JITTER else 1)
    if fmt in ACT_ORDER_JITTER:  # scales that differ between the act-order groups (a misplaced g_idx shows)
        lg = _actorder_jitter(logical)
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out, shards=2 if fmt == "gptq" else 1)
    res = inspect_dir(out)
    # bf16 / fp16 stored scales; TriLM shards carry their own +-3% scales by construction
    rtol = {"bitnet-gpu": 8e-3, "int8-ternary": 8e-3, "trilm": 0.05, "trilm-row": 0.05}.get(fmt, 1e-3)
    check_recovered(out, res.spec, truth, lg, rtol)
    # the reference reproduces the trained model's loss (jittered channel scales move it a hair)
    assert res.loss == pytest.approx(trained_loss, abs=0.03 if fmt in JITTER | set(GROUP_JITTER) | ACT_ORDER_JITTER
                                     | {"trilm", "trilm-row"} else 0.01)
    # every decode that differs from the chosen one is far worse
    wrong = [s for s in res.scored[1:] if s.loss != res.scored[0].loss and s.loss != float("inf")]
    if wrong:
        assert wrong[0].loss - res.loss > 0.5, f"{fmt}: best alternative {wrong[0].cand.label()} only " \
                                               f"{wrong[0].loss - res.loss:.3f} nats worse"


UNSEEN = {
    # conventions nobody named: the inspector must find them in the PackSpec space
    "int16-axis0-bi32-msb": dict(pack_spec=PackSpec(bits=2, container="int16", pack_axis=0, lanes="block_interleaved",
                                                    block=32, bit_order="msb", codes=(1, None, 0, -1), pad_code=2),
                                 scale="tensor"),
    "u8-transposed-msb-group-divide": dict(pack_spec=PackSpec(bits=2, container="uint8", pack_axis=1, transposed=True,
                                                              bit_order="msb", codes=(0, 1, -1, None)),
                                           scale="group", op="divide", group_size=32),
    "int64-blocked-axis1": dict(pack_spec=PackSpec(bits=2, container="int64", pack_axis=1, lanes="blocked",
                                                   codes=(-1, 0, 1, None), pad_code=1), scale="channel",
                                scale_dtype=torch.float32),
    # one value per byte, an arbitrary code permutation
    "u8-unpacked-odd-codes": dict(pack_spec=PackSpec(bits=8, container="uint8", pad_code=7,
                                                     codes=code_table(8, {3: -1, 7: 0, 200: 1})),
                                  scale="group", group_size=32),
    # int8 holding -1 / 0 / +1, stored transposed [K, N]: square q / o follow the non-square modules
    "i8-unpacked-transposed": dict(pack_spec=PackSpec(bits=8, container="int8", transposed=True,
                                                      codes=code_table(8, {255: -1, 0: 0, 1: 1})), scale="channel"),
    # 4-bit containers: two's-complement nibbles, packed along the output axis in blocked lanes
    "int16-nibbles-axis0-blocked": dict(pack_spec=PackSpec(bits=4, container="int16", pack_axis=0, lanes="blocked",
                                                           codes=code_table(4, {15: -1, 0: 0, 1: 1})),
                                        scale="tensor", op="divide", scale_dtype=torch.float32),
    # 8-bit codes tiled four to an int32 word (GPTQ int8's qweight layout), and two to an int16 in blocked lanes
    "i32-byte-codes-axis1": dict(pack_spec=PackSpec(bits=8, container="int32", pack_axis=1, pad_code=1,
                                                    codes=code_table(8, {0: -1, 1: 0, 2: 1})), scale="channel"),
    "i16-byte-codes-blocked": dict(pack_spec=PackSpec(bits=8, container="int16", pack_axis=1, lanes="blocked",
                                                      codes=code_table(8, {255: -1, 0: 0, 1: 1})), scale="group"),
    "u8-nibbles-i2s-lanes": dict(pack_spec=PackSpec(bits=4, container="uint8", pack_axis=1, lanes="block_interleaved",
                                                    block=64, bit_order="msb", codes=code_table(4, {1: -1, 2: 0, 3: 1}),
                                                    pad_code=2), scale="channel"),
}


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_recovers_unseen_layouts(name, logical, trained_loss, tmp_path):
    kw = UNSEEN[name]
    out = tmp_path / name
    truth = synth.write(lambda lg: synth.w_custom(lg, **kw), logical, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, logical, 1e-3)
    assert res.loss == pytest.approx(trained_loss, abs=0.01)


def test_a_decode_worse_than_uniform_is_flagged(logical, trained_loss, tmp_path):
    """A layout outside the search (int64 containers in 128-blocks along an output axis of 64: k / v pad to twice
    their rows, which the width search reads as 4-bit codes) decodes to a broken model: its loss is above
    ln(vocab_size), so a low-confidence 'decode quality' finding says no candidate works; the committed model's
    inspection has none."""
    import math

    spec = PackSpec(bits=2, container="int64", pack_axis=0, lanes="block_interleaved", block=128, bit_order="msb",
                    codes=(0, None, 1, -1))
    out = tmp_path / "odd"
    synth.write(lambda g: synth.w_custom(g, spec, scale="tensor", scale_dtype=torch.float32), logical, out)
    res = inspect_dir(out)
    assert res.loss > math.log(512) > trained_loss
    (f,) = [f for f in res.findings if f.what == "decode quality"]
    assert f.confidence == "low" and "not below ln(vocab_size 512) = 6.238" in f.evidence
    assert not [f for f in inspect_dir(TRAINED).findings if f.what == "decode quality"]


def test_rerun_keeps_a_differing_spec_aside(tmp_path, capsys):
    """A spec that differs from what the inspector writes (edited by hand) is never overwritten: it is kept as
    NAME.prev-<timestamp> and the CLI says so; an identical one is left as is (no .prev file)."""
    out, rep = tmp_path / "spec.json", tmp_path / "report.md"
    args = [str(TRAINED), "--out", str(out), "--report", str(rep), "--no-loss"]
    assert inspect_main(args) == 0
    first = out.read_text()
    assert inspect_main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "spec.json"]
    edited = json.loads(first)
    edited["name"] = "edited by hand"
    out.write_text(json.dumps(edited))
    capsys.readouterr()
    assert inspect_main(args) == 0
    kept = sorted(tmp_path.glob("spec.json.prev-*"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["name"] == "edited by hand"
    assert out.read_text() == first and f"the previous spec.json differed: kept as {kept[0]}" in capsys.readouterr().out


def test_spec_and_report_on_one_path_refused_and_a_failed_report_names_what_was_kept(tmp_path, capsys):
    """--out and --report on one file (also an --out ending in .md, whose default report is itself) is refused
    before anything is touched; a report that cannot be written after the spec was replaced says where the old
    spec went (nothing is lost)."""
    same = tmp_path / "same.json"
    same.write_text("{}")
    assert inspect_main([str(TRAINED), "--no-loss", "--out", str(same), "--report", str(same)]) == 2
    md = tmp_path / "spec.md"
    assert inspect_main([str(TRAINED), "--no-loss", "--out", str(md)]) == 2
    assert "are the same file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.json"] and same.read_text() == "{}"
    spec = tmp_path / "s.json"
    spec.write_text('{"x": 1}')
    (tmp_path / "r.md").mkdir()  # the report path is a directory: its write fails after the spec's
    assert inspect_main([str(TRAINED), "--no-loss", "--out", str(spec), "--report", str(tmp_path / "r.md")]) == 2
    kept = list(tmp_path.glob("s.json.prev-*"))
    assert len(kept) == 1 and kept[0].read_text() == '{"x": 1}'
    assert f"kept as {kept[0]}" in capsys.readouterr().err


def test_trained_margin_and_report(tmp_path, trained_loss, capsys):
    """The committed model: correct decode far below every wrong candidate; CLI writes spec + report."""
    out, rep = tmp_path / "spec.json", tmp_path / "report.md"
    assert inspect_main([str(TRAINED), "--out", str(out), "--report", str(rep)]) == 0
    spec = CheckpointSpec.load(out)
    res = inspect_dir(TRAINED)
    assert spec.to_dict() == res.spec.to_dict()
    got = spec.linears["model.layers.0.self_attn.q_proj"].pack
    assert got.replace(pad_code=0) == PackSpec(pack_axis=0, lanes="blocked")  # HF_BITNET; no padding to see
    finite = sorted({s.loss for s in res.scored if s.loss != float("inf")})
    margin = finite[1] - finite[0]
    print(f"\ntrained model: correct decode {finite[0]:.4f} nats, best wrong {finite[1]:.4f} (margin {margin:.3f})")
    assert finite[0] == pytest.approx(trained_loss, abs=1e-4)
    assert margin > 1.0
    # the reference consumes the spec file
    m = ReferenceModel.from_dir(TRAINED, spec_path=out)
    ids = text_ids(TRAINED)
    logits = m.forward(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    assert float(loss) == pytest.approx(trained_loss, abs=1e-5)
    text = rep.read_text()
    for section in ("## Inferences", "## Candidate decodes", "## Tensors", "## Zero ratio", "## Key mapping"):
        assert section in text
    assert "model.layers.0.self_attn.qkv_proj.weight" in text and "merge as shard 'q'" in text
    assert "| 0 | 0." in text or "| 0 | 0" in text  # per-layer zero ratio rows


def test_decode_cli_splits_fused(logical, tmp_path):
    out = tmp_path / "gpu"
    truth = synth.write("bitnet-gpu", logical, out)
    assert inspect_main([str(out)]) == 0  # writes out/ternary_spec.json
    w_path = tmp_path / "w.safetensors"
    assert decode_main([str(out), "--out", str(w_path)]) == 0
    w = load_file(str(w_path))
    for mod in truth.ternary:
        assert w[f"{mod}.weight"].dtype == torch.float32
        torch.testing.assert_close(w[f"{mod}.weight"], truth.effective(mod), rtol=1e-6, atol=0)
    assert "model.embed_tokens.weight" in w and "model.layers.2.mlp.ffn_sub_norm.weight" in w
    spec = json.loads((out / "ternary_spec.json").read_text())
    assert spec["linears"]["model.layers.0.self_attn.k_proj"]["rows"] == [128, 192]


def test_no_loss_mode_still_structural(logical, tmp_path):
    out = tmp_path / "ct"
    truth = synth.write("compressed-tensors", logical, out)
    res = inspect_dir(out, use_loss=False)
    # code table, axis and scale are statistical/config facts; the interleaved prior is right here
    check_recovered(out, res.spec, truth, logical, 1e-3)
    assert res.loss is None


def test_untrained_model_falls_back_to_the_convention_prior(tmp_path):
    """On the random (untrained) bundled model the loss cannot separate layouts; the inspector
    must keep the convention its config names (HF-BitNet) and say the decision is a prior."""
    import torch
    from reference.checkpoint import Checkpoint
    from reference.inspect import inspect_dir
    from reference.spec import decode_linear, spec_for
    from parity.dump import DEFAULT_MODEL

    ins = inspect_dir(DEFAULT_MODEL)
    truth = spec_for(DEFAULT_MODEL)
    ck = Checkpoint(DEFAULT_MODEL)
    for mod in ("model.layers.0.mlp.gate_proj", "model.layers.3.self_attn.o_proj"):
        a = decode_linear(ck, ins.spec.linears[mod], mod)
        b = decode_linear(ck, truth.linears[mod], mod)
        assert torch.equal(a.values, b.values) and torch.equal(a.mult, b.mult)
    assert any(f.what.startswith("layout (prior") for f in ins.findings)


@pytest.mark.parametrize("arch", ["llama", "bitnet"])
def test_activation_quantization_is_a_finding(arch, tmp_path):
    """Packed HF-BitNet weights with the quantization_config removed: BitNet's architecture implies W1.58A8 (high
    confidence, said so); a Llama-shaped one gets bf16 activations, which the weights cannot confirm - a low-
    confidence finding naming the alternative and both losses, in the report too."""
    from reference.inspect_report import render
    from reference.make_model import Preset, write_model

    d = write_model(Preset(arch, 64, 96, 2, 4, 2, 512, arch == "bitnet", seed=12), tmp_path / arch)
    shutil.copy(TRAINED / "tokenizer.json", d / "tokenizer.json")  # a text sample to score the losses on
    c = json.loads((d / "config.json").read_text())
    c.pop("quantization_config")
    (d / "config.json").write_text(json.dumps(c))
    res = inspect_dir(d)
    (f,) = [f for f in res.findings if f.what == "activation quantization"]
    if arch == "bitnet":
        assert (f.decision, f.confidence) == ("int8_per_token", "high (architecture)")
        assert res.spec.activation_quant == "int8_per_token"
    else:
        assert (f.decision, f.confidence) == ("none", "low") and res.spec.activation_quant == "none"
        assert "int8_per_token" in f.evidence and f.evidence.count("nats") == 1 and "with int8_per_token" in f.evidence
    assert "activation quantization" in render(res)
    with_qc = inspect_dir(write_model(Preset(arch, 64, 96, 2, 4, 2, 67, arch == "bitnet", seed=12), tmp_path / "qc"),
                          use_loss=False)
    (f,) = [f for f in with_qc.findings if f.what == "activation quantization"]
    assert (f.decision, f.confidence) == ("int8_per_token", "high (config)")


@pytest.mark.parametrize("fmt", sorted(synth.INT_FORMATS))
def test_recovers_symmetric_integer_formats(fmt, logical, trained_loss, tmp_path):
    """int2 with all four levels {-2..1}, int3 (AutoGPTQ's bit stream) with 8 and int4 with 16 levels: the used extra
    codes are integer levels, not corruption; decode bit-exact, far below every wrong code table."""
    bits = int(fmt.split("-int")[1][0])
    lg = logical.requantized(bits, seed=5)
    assert len(torch.unique(torch.cat([t.reshape(-1) for t in lg.ternary.values()]))) == 1 << bits
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    pk = res.spec.linears["model.layers.0.mlp.down_proj"].pack
    assert pk.bits == bits and pk.codes == offset_table(bits, 1 << (bits - 1))
    assert res.spec.activation_quant == "int8_per_token"  # a BitNet architecture: as its config implies
    assert res.loss < trained_loss + 0.5  # the requantised model is still (nearly) the trained one
    wrong = [s for s in res.scored[1:] if s.loss != res.scored[0].loss and s.loss != float("inf")]
    assert wrong and wrong[0].loss - res.loss > 0.5
    assert any(f.what == "code table: integer levels" for f in res.findings)


@pytest.mark.parametrize("bits,table", [(4, "twos"), (8, "twos"), (2, "twos")])
def test_integer_twos_complement_storage(bits, table, logical, tmp_path):
    """Symmetric integers stored two's complement (int8 weights, signed nibbles, signed 2-bit)."""
    lg = logical.requantized(min(bits, 4), seed=2)
    container = "int8" if bits == 8 else "uint8"
    spec = PackSpec(bits=bits, container=container, pack_axis=1, codes=twos_complement_table(bits))
    out = tmp_path / f"twos{bits}"
    truth = synth.write(lambda g: synth.w_custom(g, spec, scale="group", group_size=32), lg, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    assert res.spec.linears["model.layers.1.self_attn.k_proj"].pack.codes == twos_complement_table(bits)


def test_code_width_follows_shape_ratio(logical, tmp_path):
    """The same ternary model at 1, 2 and 4 values per byte: the width comes from the shape ratio."""
    for bits in (2, 4, 8):
        spec = PackSpec(bits=bits, container="uint8", codes=code_table(bits, {0: -1, 1: 0, 2: 1}), pad_code=1)
        out = tmp_path / f"w{bits}"
        truth = synth.write(lambda g: synth.w_custom(g, spec, scale="channel"), logical, out)
        res = inspect_dir(out, use_loss=False)
        check_recovered(out, res.spec, truth, logical, 1e-3)
        assert {e.pack.bits for e in res.spec.linears.values()} == {bits}
        assert any(f.what == "code width" and f.decision.startswith(str(bits)) for f in res.findings)


def test_unpacked_int8_stray_value_is_named(logical, tmp_path):
    """An int8 ternary checkpoint with one stray value 5: not a fourth level, a named corrupt tensor."""
    from safetensors.torch import save_file

    out = tmp_path / "int8"
    synth.write("int8-ternary", logical, out)
    sd = load_file(str(out / "model.safetensors"))
    key = "model.layers.1.mlp.up_proj.weight"
    sd[key] = sd[key].clone()
    sd[key][7, 9] = 5
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    from reference.inspect import InspectError

    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    assert key in str(e.value) and "code 5" in str(e.value) and "expected 0" in str(e.value)


def test_int2_with_a_rare_extreme_level(logical, tmp_path):
    """Symmetric int2 where -2 occurs only once per 8th row (~0.1% of weights, below the 'significant'
    share) in every tensor: integer levels, not a corrupt ternary checkpoint."""
    lg = logical.requantized(2, rare=True)
    out = tmp_path / "ct2-rare"
    truth = synth.write("compressed-tensors-int2", lg, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    assert res.spec.linears["model.layers.2.mlp.gate_proj"].pack.codes == (-2, -1, 0, 1)


UNSEEN_INT = {
    "int4-i32-axis0-transposed-msb": (4, PackSpec(bits=4, container="int32", pack_axis=0, transposed=True,
                                                  bit_order="msb", codes=offset_table(4, 8), pad_code=8)),
    "int2-u8-axis0-blocked": (2, PackSpec(bits=2, container="uint8", pack_axis=0, lanes="blocked",
                                          codes=offset_table(2, 2), pad_code=2)),
}


@pytest.mark.parametrize("name", sorted(UNSEEN_INT))
def test_recovers_unseen_integer_layouts(name, logical, tmp_path):
    """Symmetric integer levels in layouts no public convention uses, no quantization_config."""
    bits, spec = UNSEEN_INT[name]
    lg = logical.requantized(bits, seed=9)
    out = tmp_path / name
    truth = synth.write(lambda g: synth.w_custom(g, spec, scale="group", group_size=32), lg, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    wrong = [s for s in res.scored[1:] if s.loss != res.scored[0].loss and s.loss != float("inf")]
    assert wrong and wrong[0].loss - res.loss > 0.5


@pytest.mark.parametrize("fmt", ["compressed-tensors", "compressed-tensors-int4-ternary", "int8-ternary",
                                 "uint8-ternary"])
def test_untrained_padded_model_keeps_ternary_and_config_prior(fmt, tmp_path):
    """The random bundled model (K = 344 is not a multiple of 8 / 16: compressed-tensors pads with code
    0): padding is not an integer level, and where the loss cannot tell layouts apart the prior picks
    the convention (compressed-tensors / 4-bit: consecutive inputs, low bits first)."""
    from parity.dump import DEFAULT_MODEL

    lg = synth.Logical.from_dir(DEFAULT_MODEL)
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    res = inspect_dir(out)
    ck = Checkpoint(out)
    for mod, t in truth.ternary.items():
        assert torch.equal(decode_linear(ck, res.spec.linears[mod], mod).values.to(torch.int8), t), mod
    codes = res.spec.linears["model.layers.0.mlp.down_proj"].pack.codes
    assert sum(v is not None for v in codes) == 3  # a ternary table


def test_float_bitnet_checkpoint_keeps_float_activations(tmp_path):
    """A BitNet-architecture checkpoint whose linears are plain float weights (no quantization_config)
    runs unquantised linears in transformers and in spec_for's 'unquantized' spec; the inspected spec
    must not add int8 activation quantisation (it would change every layer's output)."""
    from parity.targets import get_target
    from reference.make_model import write_model
    d = write_model("oracle-bitnet-float", tmp_path / "m")
    ids = torch.randint(3, 73, (1, 12), generator=torch.Generator().manual_seed(0))
    before = get_target("reference").capture(d, ids)["logits"]
    assert inspect_main([str(d), "--no-loss"]) == 0
    assert CheckpointSpec.load(d / "ternary_spec.json").activation_quant == "none"
    torch.testing.assert_close(get_target("reference").capture(d, ids)["logits"], before, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------
# llama.cpp TQ2_0 in safetensors (66-byte blocks with an in-block fp16 scale)


def _random_logical(hidden: int, inter: int, seed: int = 0) -> synth.Logical:
    """An untrained ternary BitNet model of the given sizes (K a multiple of 256: whole TQ2_0
    blocks, as llama.cpp writes them), per-256 group multipliers."""
    cfg = json.loads((TRAINED / "config.json").read_text())
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=hidden // 4)
    mc = ModelConfig.from_dict(cfg)
    g = torch.Generator().manual_seed(seed)
    tern, mult = {}, {}
    for mod, (n, k) in mc.linear_shapes().items():
        if mod == "lm_head":
            continue
        u = torch.rand(n, k, generator=g)  # 40% zeros, 30% each sign (absmean-like; zero = the odd code)
        tern[mod] = ((u > 0.7).to(torch.int8) - (u < 0.3).to(torch.int8))
        mult[mod] = torch.full((1, 1), 0.05)
    floats = {hf: (torch.randn(shape, generator=g) * 0.02 if len(shape) == 2 else torch.ones(shape))
              for hf, shape in mc.float_params().items()}
    return synth.Logical(cfg, tern, mult, floats, TRAINED).with_group_jitter(256, seed=seed)


@pytest.mark.parametrize("use_loss", [False, True])
def test_tq2_0_whole_blocks_untrained(use_loss, tmp_path):
    """K = 256 / 512 (whole blocks, no padding), an untrained model: the 66-byte block structure is
    found from the tensors alone; without loss (or when the loss cannot tell) the llama.cpp lane
    rule is the prior.  Decode bit-exact, W_eff = T * d exactly."""
    lg = _random_logical(256, 512)
    out = tmp_path / "tq2"
    truth = synth.write("tq2_0", lg, out)
    res = inspect_dir(out, use_loss=use_loss)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    e = res.spec.linears["model.layers.1.mlp.down_proj"]
    assert e.pack.record == (256, 66) and (e.pack.lanes, e.pack.block, e.pack.bit_order) == \
        ("block_interleaved", 128, "lsb") and e.pack.codes == (-1, 0, 1, None)
    assert e.scale.granularity == "block" and e.scale.key == e.weight_key == "blk.1.ffn_down.weight"
    assert (e.scale.group_size, e.scale.record_bytes, e.scale.byte_offset, e.scale.dtype) == (256, 66, 64, "float16")
    assert any(f.what == "block structure" and "TQ2_0" in f.decision for f in res.findings)


def test_tq2_0_cli_writes_a_spec_the_reference_runs(logical, trained_loss, tmp_path):
    """CLI on the trained model in TQ2_0 (partial last blocks): the spec file round-trips through
    JSON, the reference model runs it at the trained loss, and the report names the block structure."""
    out = tmp_path / "tq2"
    synth.write("tq2_0", logical.with_group_jitter(256, seed=4), out)
    assert inspect_main([str(out)]) == 0
    spec = CheckpointSpec.load(out / "ternary_spec.json")
    assert spec.linears["model.layers.0.self_attn.q_proj"].scale.granularity == "block"
    cfg = ModelConfig.load(out)
    assert model_loss(cfg, spec, Checkpoint(out), text_ids(TRAINED)) == pytest.approx(trained_loss, abs=0.03)
    assert "block structure" in (out / "ternary_spec.md").read_text()


def _rewrite(out: Path, key: str, fn) -> None:
    from safetensors.torch import save_file

    sd = load_file(str(out / "model.safetensors"))
    sd[key] = fn(sd[key].clone()).contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})


def test_tq2_0_bad_width_is_named(logical, tmp_path):
    """One tensor of a TQ2_0 model whose width is not a multiple of 66: the inspector and the decoder
    name the tensor and the expected [N, ceil(K/256)*66]."""
    from reference.checkpoint import CheckpointError
    from reference.formats import TQ2_0, tq2_0_scale
    from reference.inspect import InspectError
    from reference.spec import LinearEntry

    out = tmp_path / "tq2"
    synth.write("tq2_0", logical.with_group_jitter(256), out)
    key = "blk.1.ffn_down.weight"  # logical 128 x 384: [128, 132]
    _rewrite(out, key, lambda t: t[:, :-1])
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert key in msg and "width 131 is not a multiple of the 66-byte block" in msg and "[128, 132]" in msg
    entry = LinearEntry(weight_key=key, shape=(128, 384), pack=TQ2_0, scale=tq2_0_scale(key))
    with pytest.raises(CheckpointError) as e:
        decode_linear(Checkpoint(out), entry, "model.layers.1.mlp.down_proj")
    msg = str(e.value)
    assert key in msg and "(128, 132)" in msg and "131 is not a multiple of 66" in msg


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_tq2_0_non_finite_block_scale_is_named(bad, logical, tmp_path):
    """A NaN / Inf in-block scale d: the inspector and the decoder name tensor, row and block and
    say finite scales are expected."""
    from reference.checkpoint import CheckpointError
    from reference.formats import TQ2_0, tq2_0_scale
    from reference.inspect import InspectError
    from reference.spec import LinearEntry

    out = tmp_path / "tq2"
    synth.write("tq2_0", logical.with_group_jitter(256), out)
    key = "blk.2.attn_k.weight"

    def poison(t):
        t[5, 64:66] = torch.tensor([bad], dtype=torch.float16).view(torch.uint8)  # row 5, block 0
        return t

    _rewrite(out, key, poison)
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert key in msg and "row 5 block 0" in msg and "expected finite block scales" in msg
    entry = LinearEntry(weight_key=key, shape=(64, 128), pack=TQ2_0, scale=tq2_0_scale(key))
    with pytest.raises(CheckpointError) as e:
        decode_linear(Checkpoint(out), entry, "model.layers.2.self_attn.k_proj")
    msg = str(e.value)
    assert key in msg and "row 5 block 0" in msg and "expected finite scales" in msg


def test_tq1_0_corrupt_byte_and_scale_are_named(logical, tmp_path):
    """llama.cpp TQ1_0: a code byte its quantizer never writes (1: ceil(v * 256 / 243) skips it) and a NaN block
    scale are errors naming the tensor; the format's own layout is found without a search (one candidate)."""
    from reference.inspect import InspectError

    out = tmp_path / "tq1"
    synth.write("tq1_0", logical, out)
    res = inspect_dir(out, use_loss=False)
    assert len(res.scored) == 1 and res.spec.linears["model.layers.0.mlp.down_proj"].pack.codec == "tq1_0"
    key = "blk.1.attn_k.weight"

    def byte(w):
        w = w.clone()
        w[3, 7] = 1
        return w

    def nan_d(w):
        w = w.clone()
        w[2, 52:54] = torch.tensor([float("nan")], dtype=torch.float16).view(torch.uint8)
        return w

    for fn, want in ((byte, "code bytes (e.g. 1) that llama.cpp TQ1_0 never writes"), (nan_d, "nan")):
        synth.write("tq1_0", logical, out)
        _rewrite(out, key, fn)
        with pytest.raises(InspectError) as e:
            inspect_dir(out, use_loss=False)
        assert repr(key) in str(e.value) and want in str(e.value), str(e.value)


def test_tq1_0_corrupt_in_every_tensor_is_still_named_as_tq1_0(logical, tmp_path):
    """A bad byte in every TQ1_0 tensor (no tensor clean): still read as TQ1_0, and the error names a tensor and
    the byte (was: the generic path's 'cannot hold' message)."""
    from safetensors.torch import save_file

    from reference.inspect import InspectError

    out = tmp_path / "tq1"
    synth.write("tq1_0", logical, out)
    sd = load_file(str(out / "model.safetensors"))
    for k, v in sd.items():
        if k.startswith("blk.") and v.dtype == torch.uint8:
            sd[k] = v.clone()
            sd[k][0, 5] = 1
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InspectError, match=r"'blk\.\d+\..*weight': 1 code bytes \(e\.g\. 1\) that llama\.cpp TQ1_0 never"):
        inspect_dir(out, use_loss=False)


# ---------------------------------------------------------------------------------------
# HQQ 2-bit with integer zero points (ternary case)


@pytest.mark.parametrize("use_loss", [False, True])
def test_hqq_structure_and_prior(use_loss, logical, tmp_path):
    """HQQ W_q / scale / zero: the group view, HQQ's chunk layout (blocked, chunk 0 in the high bits),
    group scales and per-group zero points are found; wrong lanes decode non-ternary (q - z) and
    are invalid candidates."""
    lg = logical.with_group_jitter(64, seed=6)
    out = tmp_path / "hqq"
    truth = synth.write("hqq", lg, out)
    res = inspect_dir(out, use_loss=use_loss)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    e = res.spec.linears["model.layers.2.mlp.up_proj"]
    assert (e.pack.group_view, e.pack.pack_axis, e.pack.lanes, e.pack.bit_order) == (64, 0, "blocked", "msb")
    assert e.zero.key == "model.layers.2.mlp.up_proj.zero" and e.scale.granularity == "group"
    assert e.levels == "ternary"  # integer zero points that give ternary values: checked on every decode
    assert "model.layers.2.mlp.up_proj.zero" not in res.spec.ignored
    assert any(f.what == "block structure" and "HQQ" in f.decision for f in res.findings)


def test_hqq_non_integer_zero_is_not_ternary(logical, tmp_path):
    from reference.inspect import InspectError

    out = tmp_path / "hqq"
    synth.write("hqq", logical, out)
    key = "model.layers.0.self_attn.o_proj.zero"

    def frac(z):
        z[7] = 1.25
        return z

    _rewrite(out, key, frac)
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert key in msg and "non-integer" in msg and "1.25 at group 7" in msg and "not ternary" in msg


@pytest.mark.parametrize("bad,what", [(3.0, "integer"), (1.5, "non-integer")])
def test_hqq_ternary_with_one_corrupt_zero_is_named(bad, what, logical, tmp_path):
    """A ternary HQQ checkpoint where one zero point is off: an integer one puts a few q - z outside {-1, 0, 1}, a
    non-integer one stands alone among integers; either is an error naming the tensor (HQQ's asymmetric levels
    would be so throughout)."""
    from reference.inspect import InspectError

    out = tmp_path / "hqq"
    synth.write("hqq", logical, out)
    key = "model.layers.0.self_attn.o_proj.zero"

    def edit(z):
        z[7] = bad
        return z

    _rewrite(out, key, edit)
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert key in msg and ("corrupt codes or zero points" if bad == 3.0 else "1.5 at group 7") in msg, msg


@pytest.mark.parametrize("fmt", sorted(synth.HQQ_FORMATS))
def test_hqq_quantizer_checkpoints_recovered(fmt, logical, tmp_path):
    """HQQ's own quantizer on a float model: 1- / 2- / 3- / 4- / 8-bit packings (3bit_32 in int32 with 10 fields),
    axis 1 and 0, with and without meta tensors, float zero points (integers for nbits 4, round_zero), 4-bit
    attention beside a 2-bit MLP in one model, W_q stored as a float16 / bfloat16 view of its bytes
    (view_as_float; the spec's pack.stored_as): the
    packing, group view and zero points are found and the decode is HQQ's dequantize bit for bit; not ternary
    (no 'levels' check), said in the block-structure finding."""
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    res = inspect_dir(out, use_loss=False)
    axis = 0 if "axis0" in fmt else 1
    ck = Checkpoint(out)
    for mod in truth.ternary:
        nbits = (4 if ".self_attn." in mod else 2) if fmt == "hqq-mixed" else int(fmt.split("-")[1][0])
        e = res.spec.linears[mod]
        assert (e.pack.bits, e.pack.group_view, e.pack.group_axis, e.levels) == (nbits, 64, axis, None), mod
        assert e.pack.fields == (10 if nbits == 3 else None) and e.zero.key == f"{mod}.zero"
        d = decode_linear(ck, e, mod)
        assert torch.equal(d.values.float(), truth.ternary[mod]) and torch.equal(d.effective(), truth.effective(mod))
    f = next(f for f in res.findings if f.what == "block structure")
    assert f.decision.startswith("HQQ asymmetric low-bit") and f"axis={axis}" in f.decision
    assert ("non-integer" in f.evidence) == (not fmt.startswith("hqq-4bit"))
    assert ("4bit_u8" in f.decision and "2bit_u8" in f.decision) == (fmt == "hqq-mixed")
    view = fmt.split("-")[2] if fmt.endswith("-view") else None  # view_as_float: W_q.view(compute_dtype)
    assert {e.pack.stored_as for e in res.spec.linears.values() if e.pack} == {view}
    assert ("view_as_float" in f.evidence) == (view is not None)
    again = CheckpointSpec.from_dict(json.loads(json.dumps(res.spec.to_dict())))
    assert again == res.spec


@pytest.mark.parametrize("writer", ["a2m4", "8bit-bf16", "2bit-rz-outliers"])
def test_hqq_not_ternary_despite_integer_looking_zeros(writer, logical, tmp_path):
    """Checkpoints whose zero points are mostly integers but are not ternary are HQQ's levels, not a corrupt ternary
    model: 2-bit attention beside a 4-bit MLP (HQQ rounds the 4-bit zeros), 8-bit with bf16 zeros (a bf16 zero
    near 128 is an integer), and 2-bit round_zero with one outlier per group (few values, but in every group,
    leave {-1, 0, +1}). Decoded as stored."""
    if writer == "2bit-rz-outliers":
        tern = {}
        for mod, t in logical.ternary.items():
            t = t.clone()
            t.view(-1, 128)[:, 5] = 8  # one outlier per group of 128 (K is a multiple of 128)
            tern[mod] = t
        lg = synth.Logical(logical.config, tern, logical.mult, logical.floats, logical.tokenizer_dir)
        w = lambda g: synth.w_hqq_quant(g, 2, group_size=128, round_zero=True, noise=0.0)  # noqa: E731
    else:
        lg = logical
        w = (lambda g: synth.w_hqq_mixed(g, 2, 4)) if writer == "a2m4" else \
            (lambda g: synth.w_hqq_quant(g, 8, compute_dtype=torch.bfloat16))
    out = tmp_path / writer
    truth = synth.write(w, lg, out)
    res = inspect_dir(out, use_loss=False)
    ck = Checkpoint(out)
    for mod in truth.ternary:
        assert res.spec.linears[mod].levels is None
        assert torch.equal(decode_linear(ck, res.spec.linears[mod], mod).effective(), truth.effective(mod)), mod
    assert next(f for f in res.findings if f.what == "block structure").decision.startswith("HQQ asymmetric")


def test_hqq_broken_module_without_meta_is_named(logical, tmp_path):
    """Without meta tensors, one HQQ module whose W_q lost a row: the error names that W_q and HQQ's expected
    shape (not another module through the generic path)."""
    from reference.inspect import InspectError

    out = tmp_path / "hqq"
    synth.write("hqq-2bit-nometa", logical, out)
    key = f"{HQQ_MOD}.W_q"
    _rewrite(out, key, lambda w: w[:-1].contiguous())
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert repr(key) in msg and "not an HQQ layout" in msg and "expected uint8 [32, 64] (2bit_u8)" in msg, msg


def test_hqq_asymmetric_layout_by_loss(logical, tmp_path):
    """With a text sample, HQQ's own chunk layout (blocked, chunk 0 in the high bits) wins by loss over the
    other lanes and bit orders of the same codes."""
    out = tmp_path / "hqq-2bit"
    truth = synth.write("hqq-2bit", logical, out)
    res = inspect_dir(out)
    e = res.spec.linears[HQQ_MOD]
    assert (e.pack.lanes, e.pack.bit_order) == ("blocked", "msb")
    check = next(f for f in res.findings if f.what == "lanes (by loss)")
    assert check.confidence == "high", check
    d = decode_linear(Checkpoint(out), e, HQQ_MOD)
    assert torch.equal(d.effective(), truth.effective(HQQ_MOD))


@pytest.mark.parametrize("fmt", sorted(synth.GPTQ_ASYM_FORMATS))
def test_gptq_asymmetric_zero_points_recovered(fmt, logical, tmp_path):
    """AutoGPTQ sym=False (int2 / int4 / int8, v1 and gptq_v2): per-group zero points (packed qzeros, v1's z - 1
    undone by the zero_pack's code table), identity codes, GPTQ's layout; the decode is scale * (q - z) bit for
    bit, with and without a text sample; the qzeros are not listed as ignored."""
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    bits = int(fmt.split("int")[1][0])
    for use_loss in (False, True):
        res = inspect_dir(out, use_loss=use_loss)
        ck = Checkpoint(out)
        permuted = "actorder" in fmt and not fmt.endswith(("-static", "-row"))  # static groups / one group: trivial
        for mod in truth.ternary:
            e = res.spec.linears[mod]
            assert e.pack.codes == tuple(range(1 << bits)) and e.zero.key == f"{mod}.qzeros" and e.zero.transposed
            assert e.zero_pack.codes[0] == (0 if "-v2" in fmt else 1)
            assert e.g_idx == (f"{mod}.g_idx" if permuted else None), mod
            assert (f"{mod}.g_idx" in res.spec.ignored) is not permuted
            d = decode_linear(ck, e, mod)
            assert torch.equal(d.values.to(torch.int16), truth.ternary[mod]), mod
            assert torch.equal(d.effective(), truth.effective(mod)), mod
            if permuted:  # the index matters: consecutive groups decode to another weight
                plain = decode_linear(ck, dataclasses.replace(e, g_idx=None), mod)
                assert not torch.equal(plain.effective(), truth.effective(mod)), mod
        assert f"{HQQ_MOD}.qzeros" not in res.spec.ignored
        assert any(f.what == "act-order" for f in res.findings) is permuted
        assert any(f.what == "zero point" and "per-group" in f.decision for f in res.findings)
        again = CheckpointSpec.from_dict(json.loads(json.dumps(res.spec.to_dict())))
        assert again == res.spec


def _drop_quant_keys(d: Path, keys=None) -> None:
    """config.json without its quantization_config (``keys`` None) or without those of its keys."""
    cfg = json.loads((d / "config.json").read_text())
    if keys is None:
        del cfg["quantization_config"]
    else:
        for k in keys:
            del cfg["quantization_config"][k]
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("fmt", ["gptq-int3-ternary", "gptq-int3", "gptq-asym-int3-g32"])
def test_gptq_3bit_stream_read_from_shapes_alone(fmt, logical, tmp_path):
    """AutoGPTQ 3-bit without a quantization_config: an int32 qweight of K/32*3 rows fits no whole-container width,
    only the bit stream, so the width, the codec (and the qzeros' stream along N) come from the shapes; ternary
    codes q = w + 4 read as the table (-1, 0, 1 at codes 3, 4, 5), the 8 int3 levels as offset codes; bit for bit,
    with a finding naming the layout."""
    lg = logical.requantized(3, seed=4) if fmt == "gptq-int3" else logical
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    _drop_quant_keys(out)
    res = inspect_dir(out, use_loss=False)
    ck = Checkpoint(out)
    for mod in truth.ternary:
        e = res.spec.linears[mod]
        assert (e.pack.bits, e.pack.codec, e.pack.container) == (3, "bitstream", "int32"), mod
        assert (e.zero_pack is not None and e.zero_pack.codec == "bitstream") is ("asym" in fmt)
        assert torch.equal(decode_linear(ck, e, mod).effective(), truth.effective(mod)), mod
    if fmt == "gptq-int3-ternary":
        assert res.spec.linears[HQQ_MOD].pack.codes == (None, None, None, -1, 0, 1, None, None)
    assert any(f.what == "GPTQ 3-bit layout" for f in res.findings)


def test_gptq_config_bits_contradicting_the_tensors_is_named(logical, tmp_path):
    """3-bit tensors under quantization_config.bits 4: the weight reads at the only width its rows allow (3), the
    qzeros at the config's, which does not fit them; the error names the qzeros and says the config's bits
    contradict the weight's width."""
    out = tmp_path / "g3"
    synth.write("gptq-asym-int3-g32", logical, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 4
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=r"zero points '.*qzeros'.*quantization_config.bits says 4, but the weight "
                                           r"'.*qweight' reads as 3-bit codes: is config.json's bits right\?"):
        inspect_dir(out, use_loss=False)


def test_gptq_3bit_ambiguous_width_and_bad_k(tmp_path):
    """K = 48: a 4-bit qweight's K/8 = 6 rows are also ceil(48/32)*3 = 6 rows of a 3-bit stream; without ``bits``
    in the config the inspector refuses to guess, naming tensor, both readings and the config key; with bits 3
    the 4-bit qzeros have the wrong width for a 3-bit stream along N (named with the expected shape); an int3
    writer refuses K not a multiple of 32 (AutoGPTQ's pack needs whole 32-input periods)."""
    from reference.make_model import Preset, write_model

    base = write_model(Preset("llama", 48, 96, 1, 2, 1, 67, False, seed=3), tmp_path / "base")
    lg = synth.Logical.from_dir(base)
    d = tmp_path / "g4"
    synth.write("gptq-int4", lg.requantized(4, seed=1), d)
    assert inspect_dir(d, use_loss=False).spec.linears["model.layers.0.mlp.gate_proj"].pack.bits == 4
    _drop_quant_keys(d, ["bits"])
    with pytest.raises(InspectError, match=r"gate_proj.qweight': shape \[6, 96\] I32 holds the logical 96x48 matrix "
                                           r"at 4-bit and at 3-bit codes .*config.json names no width.*bits 4 or 3"):
        inspect_dir(d, use_loss=False)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=r"zero points 'model.layers.0.*qzeros'.*needs \(1, 9\).*32 codes per 3 "
                                           r"containers.*3-bit fields packed along the 96 output channels"):
        inspect_dir(d, use_loss=False)
    with pytest.raises(ValueError, match=r"K = 48 is not a multiple of 32: AutoGPTQ's 3-bit QuantLinear.pack"):
        synth.write("gptq-int3", lg.requantized(3), tmp_path / "g3")


@pytest.mark.parametrize("act_order,config", [(True, True), (False, True), (True, False)])
def test_gptq_group_size_that_does_not_divide_k(act_order, config, logical, tmp_path):
    """AutoGPTQ group_size 96 on K = 128 / 384: ceil(K / 96) groups, the last one shorter on K = 128 (96 + 32).  The
    2 groups of K = 128 also fit group_size 64, which the scales' shape alone suggests; config.json's group_size, or
    the g_idx's own group sizes without a config, say 96 (was: the valid g_idx refused as 'group 0 holds 96 inputs,
    expected 64').  3-bit stream, desc_act with a permuted index or consecutive groups: bit for bit."""
    lg = logical.requantized(3, seed=4)
    perms = synth.actorder_perms(lg)
    gi = {m: synth.actorder_g_idx(p if act_order else torch.arange(p.numel()), 96) for m, p in perms.items()}
    lg = lg.with_group_jitter(96, seed=1, g_idx=gi)
    out = tmp_path / "g96"
    truth = synth.write(lambda l: synth.w_gptq(l, 96, bits=3, ternary=False, act_order=act_order), lg, out)
    if not config:
        _drop_quant_keys(out)
    res = inspect_dir(out, use_loss=False)
    ck = Checkpoint(out)
    for mod in truth.ternary:
        e = res.spec.linears[mod]
        assert e.scale.group_size == 96 and (e.g_idx is not None) is act_order, mod
        assert torch.equal(decode_linear(ck, e, mod).effective(), truth.effective(mod)), mod


def test_gptq_quantize_config_json(logical, tmp_path):
    """AutoGPTQ / GPTQModel also write quantize_config.json (AutoGPTQ before 0.7 only that, without quant_method);
    AutoGPTQ's from_quantized and vLLM's GPTQ config read it.  Where config.json has no quantization_config, its
    checkpoint_format gptq_v2 decides that qzeros store z (was: read as v1's z - 1 from the tensors alone, every
    weight off by one zero step without a word); a finding names the file."""
    out = tmp_path / "v2"
    truth = synth.write("gptq-asym-int3-v2", logical, out)
    cfg = json.loads((out / "config.json").read_text())
    q = cfg.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(cfg))
    for qc in (q, {k: v for k, v in q.items() if k != "quant_method"}):
        (out / "quantize_config.json").write_text(json.dumps(qc))
        res = inspect_dir(out, use_loss=False)
        assert any(f.what == "quantization config" and "quantize_config.json" in f.decision for f in res.findings)
        ck = Checkpoint(out)
        for mod in truth.ternary:
            e = res.spec.linears[mod]
            assert e.zero_pack.codes[0] == 0, mod
            assert torch.equal(decode_linear(ck, e, mod).effective(), truth.effective(mod)), mod


@pytest.mark.parametrize("drop", [["bits"], None])
def test_gptq_int8_without_bits_in_the_config(drop, logical, tmp_path):
    """GPTQ int8 (four 8-bit codes per int32: qweight [K/4, N], qzeros [G, N/4]) with no bits in
    quantization_config, or no quantization_config: the width comes from the K/4 rows, the qzeros are read at it;
    bit for bit."""
    out = tmp_path / "g8"
    truth = synth.write("gptq-asym-int8", logical, out)
    _drop_quant_keys(out, drop)
    res = inspect_dir(out, use_loss=False)
    ck = Checkpoint(out)
    for mod in truth.ternary:
        e = res.spec.linears[mod]
        assert e.pack.bits == 8 and e.pack.container == "int32" and e.zero_pack.bits == 8, mod
        assert torch.equal(decode_linear(ck, e, mod).effective(), truth.effective(mod)), mod


def test_gptq_zero_point_edge_cases(logical, tmp_path):
    """sym=False edge cases: a module without qzeros among modules with them is an error naming the missing tensor;
    zero points constant per module but different between modules, and v1's stored 2^b - 1 everywhere (z = 2^b:
    no code of the weight's table), are per-group zero points read as stored (values q - z)."""
    from safetensors.torch import save_file

    from reference.inspect import InspectError

    def write_edit(name, fn):
        out = tmp_path / name
        synth.write("gptq-asym-int4", logical, out)
        sd = load_file(str(out / "model.safetensors"))
        fn(sd)
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out

    out = write_edit("missing", lambda sd: sd.pop("model.layers.0.self_attn.q_proj.qzeros"))
    with pytest.raises(InspectError, match=r"q_proj\.qweight.*no zero point tensor.*'model\.layers\.0\.self_attn\.q_proj\.qzeros'"):
        inspect_dir(out, use_loss=False)

    def const(sd, alternate):
        for i, k in enumerate(sorted(k for k in sd if k.endswith("qzeros"))):
            sd[k] = torch.full_like(sd[k], (0x66666666 if i % 2 else 0x77777777) if alternate else -1)

    for name, alternate in (("per-module", True), ("z0", False)):
        out = write_edit(name, lambda sd: const(sd, alternate))
        res = inspect_dir(out, use_loss=False)
        ck = Checkpoint(out)
        for mod in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"):
            e = res.spec.linears[mod]
            z = 16 if not alternate else (7 if ck.get(f"{mod}.qzeros").flatten()[0] == 0x66666666 else 8)
            codes = decode_linear(ck, dataclasses.replace(e, zero=None, zero_pack=None), mod).values.to(torch.int16)
            assert torch.equal(decode_linear(ck, e, mod).values.to(torch.int16), codes - z), (name, mod)


@pytest.mark.parametrize("fmt", sorted(f for f in synth.AWQ_FORMATS if f.startswith("awq-gemm-")))
def test_awq_zero_points_recovered(fmt, logical, tmp_path):
    """AutoAWQ gemm (groups of 128 / 64 / 32 / one per row), from config.json: qweight in AWQ_GEMM (int32 [K, N/8],
    AWQ_ORDER), qzeros through AWQ_GEMM_ZEROS as per-group zero points (stored as z), transposed fp16 group scales,
    identity codes; the decode is (q - z) * s bit for bit, with and without a text sample, one candidate (the
    layout is AutoAWQ's own); the qzeros are not listed as ignored; the spec survives JSON."""
    from reference.formats import AWQ_GEMM, AWQ_GEMM_ZEROS

    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    for use_loss in (False, True):
        res = inspect_dir(out, use_loss=use_loss)
        for mod in truth.ternary:
            e = res.spec.linears[mod]
            k = e.shape[1]
            gs = k if fmt.endswith("-row") else int(fmt.rsplit("g", 1)[1])
            assert e.weight_key == f"{mod}.qweight" and e.pack == AWQ_GEMM and e.zero_pack == AWQ_GEMM_ZEROS
            assert (e.zero.key, e.zero.group_size, e.zero.transposed) == (f"{mod}.qzeros", gs, True)
            assert (e.scale.key, e.scale.granularity, e.scale.group_size, e.scale.transposed, e.scale.op) == \
                (f"{mod}.scales", "group", gs, True, "multiply")
            d = decode_linear(ck, e, mod)
            assert torch.equal(d.values.to(torch.int8), truth.ternary[mod]), mod
            assert torch.equal(d.effective(), truth.effective(mod)), mod
        assert not any(k.endswith(".qzeros") for k in res.spec.ignored)
        assert len(res.scored) == 1  # nothing to search: AutoAWQ's layout
        assert any(f.what == "block structure" and "AutoAWQ gemm" in f.decision and f.confidence == "high (config)"
                   for f in res.findings)
        assert any(f.what == "zero point" and "per-group" in f.decision for f in res.findings)
        again = CheckpointSpec.from_dict(json.loads(json.dumps(res.spec.to_dict())))
        assert again == res.spec


def test_awq_without_quantization_config_and_config_aliases(logical, tmp_path):
    """AutoAWQ's tensors without a quantization_config are recognised by their names and shapes (qweight int32
    [K, N/8] with qzeros [K/G, N/8] and scales [K/G, N]: GPTQ's qweight is [K/8, N]) with the same spec; a config
    in AutoAWQ's own spellings (w_bit, q_group_size) or transformers' (format instead of version) reads the same."""
    bare = tmp_path / "bare"
    truth = synth.write("awq-gemm-g64", logical, bare, keep_quant_config=False)
    res = inspect_dir(bare, use_loss=False)
    ref = tmp_path / "ref"
    synth.write("awq-gemm-g64", logical, ref)
    want = inspect_dir(ref, use_loss=False).spec
    assert res.spec.linears == want.linears
    assert any(f.what == "block structure" and f.confidence == "medium (names and shapes)" for f in res.findings)
    ck = Checkpoint(bare)
    mod = HQQ_MOD
    assert torch.equal(decode_linear(ck, res.spec.linears[mod], mod).effective(), truth.effective(mod))
    cfg = json.loads((ref / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True,
                                  "format": "gemm"}
    (ref / "config.json").write_text(json.dumps(cfg))
    assert inspect_dir(ref, use_loss=False).spec.linears == want.linears


@pytest.mark.parametrize("fmt", sorted(f for f in synth.AWQ_FORMATS if f.startswith("awq-gemv-")))
def test_awq_gemv_zero_points_recovered(fmt, logical, tmp_path):
    """AutoAWQ gemv (groups of 128 / 64 / 32 / one per row), from config.json: qweight in AWQ_GEMV (int32 [N, K/8],
    eight inputs per word in natural order), qzeros through AWQ_GEMV_ZEROS and fp16 scales [N, 8 W] as per-group
    zero points / scales with padded_groups = 8 * calculate_zeros_width(K, G); the decode is (q - z) * s bit for bit,
    with and without a text sample, one candidate; the spec survives JSON (padded_groups included)."""
    from reference.formats import AWQ_GEMV, AWQ_GEMV_ZEROS, awq_gemv_zeros_width

    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    for use_loss in (False, True):
        res = inspect_dir(out, use_loss=use_loss)
        for mod in truth.ternary:
            e = res.spec.linears[mod]
            k = e.shape[1]
            gs = k if fmt.endswith("-row") else int(fmt.rsplit("g", 1)[1])
            P = 8 * awq_gemv_zeros_width(k, gs)
            assert e.weight_key == f"{mod}.qweight" and e.pack == AWQ_GEMV and e.zero_pack == AWQ_GEMV_ZEROS
            assert (e.zero.key, e.zero.group_size, e.zero.transposed, e.zero.padded_groups) == \
                (f"{mod}.qzeros", gs, False, P)
            assert (e.scale.key, e.scale.granularity, e.scale.group_size, e.scale.transposed, e.scale.op,
                    e.scale.padded_groups) == (f"{mod}.scales", "group", gs, False, "multiply", P)
            assert P > k // gs  # padding present in every module of this model
            d = decode_linear(ck, e, mod)
            assert torch.equal(d.values.to(torch.int8), truth.ternary[mod]), mod
            assert torch.equal(d.effective(), truth.effective(mod)), mod
        assert not any(k.endswith(".qzeros") for k in res.spec.ignored)
        assert len(res.scored) == 1
        assert any(f.what == "block structure" and "AutoAWQ gemv" in f.decision and f.confidence == "high (config)"
                   for f in res.findings)
        again = CheckpointSpec.from_dict(json.loads(json.dumps(res.spec.to_dict())))
        assert again == res.spec
        assert "padded_groups" in json.dumps(res.spec.to_dict())


def test_awq_gemv_without_quantization_config(logical, tmp_path):
    """AutoAWQ gemv's tensors without a quantization_config: recognised by names and shapes (qweight [N, K/8],
    qzeros [N, W], scales [N, 8 W]: gemm's share no first axis) with the group size from the qzeros widths where
    only one fits every module (g64: K = 128 -> W = 2, K = 384 -> W = 2; g32: 4 / 4) - the same spec as from the
    config; where several fit (g128: W = 1 for K = 128 and 384 fits 128 and -1), an error that says the shapes are
    ambiguous, lists the group sizes and asks for the quantization_config.  A config in AutoAWQ's own spellings
    (w_bit, q_group_size) or transformers' (format) reads the same."""
    from reference.inspect import InspectError

    for fmt in ("awq-gemv-g64", "awq-gemv-g32"):
        bare, ref = tmp_path / f"{fmt}-bare", tmp_path / fmt
        truth = synth.write(fmt, logical, bare, keep_quant_config=False)
        res = inspect_dir(bare, use_loss=False)
        synth.write(fmt, logical, ref)
        want = inspect_dir(ref, use_loss=False).spec
        assert res.spec.linears == want.linears, fmt
        assert any(f.what == "block structure" and "AutoAWQ gemv" in f.decision
                   and f.confidence == "medium (names and shapes)" for f in res.findings)
        mod = HQQ_MOD
        assert torch.equal(decode_linear(Checkpoint(bare), res.spec.linears[mod], mod).effective(),
                           truth.effective(mod))
    cfg = json.loads((ref / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "w_bit": 4, "q_group_size": 32, "zero_point": True,
                                  "format": "gemv"}
    (ref / "config.json").write_text(json.dumps(cfg))
    assert inspect_dir(ref, use_loss=False).spec.linears == want.linears
    bare = tmp_path / "g128-bare"
    synth.write("awq-gemv-g128", logical, bare, keep_quant_config=False)
    with pytest.raises(InspectError, match=r"AutoAWQ gemv's .* without a quantization_config the group size is "
                                           r"ambiguous: \(K, W\) = \[\(128, 1\), \(384, 1\)\] fit group sizes "
                                           r"\[-1, 128\]; add config.json quantization_config .*\"version\": \"gemv\""):
        inspect_dir(bare, use_loss=False)


CT_MOD = "model.layers.1.self_attn.k_proj"  # logical 64 x 128


def _ct_expected(fmt: str, mod: str, n: int, k: int):
    """(bits, strategy, pack, zero granularity, zero_pack, generation) of a synth.CT_ASYM_FORMATS module."""
    from reference.formats import ct_pack_spec, ct_zero_pack_spec

    bits = int(fmt.split("int")[1][0]) if "int" in fmt else 4
    if fmt.endswith("-mixed"):
        bits = 8 if "down_proj" in mod else 2 if "layers.0." in mod else 4
    strategy = "channel" if "-channel" in fmt else "tensor" if fmt.endswith("-tensor") else "group"
    naive = "naive" in fmt
    pack = PackSpec(bits=8, container="int8", pack_axis=1, codes=twos_complement_table(8)) if naive \
        else ct_pack_spec(bits)
    zpack = None if naive or strategy == "tensor" or fmt.endswith("-legacy") else ct_zero_pack_spec(bits)
    return bits, strategy, pack, zpack


@pytest.mark.parametrize("fmt", sorted(synth.CT_ASYM_FORMATS))
def test_compressed_tensors_asym_recovered(fmt, logical, tmp_path):
    """compressed-tensors symmetric false (int2 / int4 / int8; group 64, channel, tensor; zero points packed along N
    as compressed-tensors >= 0.9.4 writes them, or int8 unpacked as <= 0.9.3, a tensor strategy and naive-quantized
    keep them; mixed widths from config groups with name targets), from config.json: weight_packed through
    ct_pack_spec (naive: the int8 q), zero points through ct_zero_pack_spec where packed, scales as stored; the
    decode is (q - z) * s bit for bit, with and without a text sample, one candidate; weight_shape is ignored (and
    checked), the zero points are not; the spec survives JSON."""
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    for use_loss in (False, True):
        res = inspect_dir(out, use_loss=use_loss)
        for mod in truth.ternary:
            e = res.spec.linears[mod]
            n, k = e.shape
            bits, strategy, pack, zpack = _ct_expected(fmt, mod, n, k)
            assert e.pack == pack and e.zero_pack == zpack, mod
            assert e.weight_key == f"{mod}.{'weight' if 'naive' in fmt else 'weight_packed'}"
            gran = (e.zero.key, e.zero.granularity, e.zero.group_size)
            assert gran == (f"{mod}.weight_zero_point", strategy, 64 if strategy == "group" else None), mod
            assert (e.scale.key, e.scale.granularity, e.scale.op) == (f"{mod}.weight_scale", strategy, "multiply")
            permuted = "-actorder" in fmt and not fmt.endswith("-weight")  # actorder 'weight' stores no g_idx
            assert e.g_idx == (f"{mod}.weight_g_idx" if permuted else None), mod
            d = decode_linear(ck, e, mod)
            assert torch.equal(d.values.to(torch.int16), truth.ternary[mod]), mod
            assert torch.equal(d.effective(), truth.effective(mod)), mod
        assert not any(k.endswith(".weight_zero_point") for k in res.spec.ignored)
        assert ("naive" in fmt) != any(k.endswith(".weight_shape") for k in res.spec.ignored)
        assert len(res.scored) == 1  # nothing to search: compressed-tensors' layout
        assert any(f.what == "block structure" and "compressed-tensors" in f.decision and
                   f.confidence == "high (config)" for f in res.findings)
        assert any(f.what == "zero point" and "symmetric false" in f.decision for f in res.findings)
        again = CheckpointSpec.from_dict(json.loads(json.dumps(res.spec.to_dict())))
        assert again == res.spec


@pytest.mark.parametrize("fmt", ["compressed-tensors-asym-int4", "compressed-tensors-asym-int8-channel",
                                 "compressed-tensors-asym-int4-tensor", "compressed-tensors-asym-int4-legacy"])
def test_compressed_tensors_asym_without_quantization_config(fmt, logical, tmp_path):
    """compressed-tensors' tensors without a quantization_config are recognised by their names and shapes
    (weight_packed int32 [N, ceil(K*b/32)] at one of b = 2 / 4 / 8, weight_shape, weight_scale [N, G] / [N, 1] /
    [1], weight_zero_point packed [ceil(N*b/32), G] or int8): the same spec as from config.json, medium confidence."""
    bare, ref = tmp_path / "bare", tmp_path / "ref"
    truth = synth.write(fmt, logical, bare, keep_quant_config=False)
    synth.write(fmt, logical, ref)
    res = inspect_dir(bare, use_loss=False)
    assert res.spec.linears == inspect_dir(ref, use_loss=False).spec.linears
    assert any(f.what == "block structure" and f.confidence == "medium (names and shapes)" for f in res.findings)
    assert torch.equal(decode_linear(Checkpoint(bare), res.spec.linears[CT_MOD], CT_MOD).effective(),
                       truth.effective(CT_MOD))


def test_compressed_tensors_asym_config_variants(logical, tmp_path):
    """config.json as other compressed-tensors versions / tools write it reads the same: no per-group 'format'
    (the top-level one), top-level 'mixed-precision' with per-group formats, no 'strategy' (from group_size, as
    QuantizationArgs infers it), 're:' targets picked before the class target 'Linear' (vLLM's find_matched_target),
    and a symmetric group next to an asymmetric one (its modules without zero points: their values q)."""
    out = tmp_path / "ct"
    truth = synth.write("compressed-tensors-asym-mixed", logical, out)
    want = inspect_dir(out, use_loss=False).spec.linears
    cfg = json.loads((out / "config.json").read_text())

    def variant(edit):
        c = json.loads(json.dumps(cfg))
        edit(c["quantization_config"])
        (out / "config.json").write_text(json.dumps(c))
        return inspect_dir(out, use_loss=False).spec.linears

    def no_group_format(q):
        for g in q["config_groups"].values():
            g.pop("format")

    def mixed_precision(q):
        q["format"] = "mixed-precision"

    def no_strategy(q):
        for g in q["config_groups"].values():
            g["weights"].pop("strategy")

    def regex_targets(q):
        for g in q["config_groups"].values():
            if g["targets"] != ["Linear"]:
                g["targets"] = ["re:" + "|".join(t.replace(".", r"\.") + "$" for t in g["targets"])]
        q["config_groups"] = dict(reversed(list(q["config_groups"].items())))  # 'Linear' first: names still win

    for edit in (no_group_format, mixed_precision, no_strategy, regex_targets):
        assert variant(edit) == want, edit.__name__
    # a symmetric int4 group for the 4-bit modules: stored without zero points, decoded as q (offset binary)
    sym = tmp_path / "sym"
    shutil.copytree(out, sym)
    c = json.loads(json.dumps(cfg))
    g4 = next(g for g in c["quantization_config"]["config_groups"].values() if g["weights"]["num_bits"] == 4)
    g4["weights"].update(symmetric=True, zp_dtype=None)
    (sym / "config.json").write_text(json.dumps(c))
    sd = load_file(str(sym / "model.safetensors"))
    four = [m for m in truth.ternary if "down_proj" not in m and "layers.0." not in m]
    for m in four:
        del sd[f"{m}.weight_zero_point"]
    from safetensors.torch import save_file

    save_file(sd, str(sym / "model.safetensors"))
    spec = inspect_dir(sym, use_loss=False).spec
    ck = Checkpoint(sym)
    for m in truth.ternary:
        e = spec.linears[m]
        assert (e.zero is None) == (m in four), m
        if m in four:  # q itself: the stored codes minus 8
            q = torch.stack([(sd[f"{m}.weight_packed"].to(torch.int64) >> (4 * j)) & 15 for j in range(8)], 2)
            assert torch.equal(decode_linear(ck, e, m).values.to(torch.int64), q.reshape(e.shape[0], -1) - 8)
        else:
            assert torch.equal(decode_linear(ck, e, m).effective(), truth.effective(m)), m


# ---------------------------------------------------------------------------------------
# HQQ meta tensors and axis=0 grouping (mobiusml/hqq; the rule is in reference/inspect.py's docstring)

HQQ_MOD = "model.layers.1.self_attn.k_proj"  # logical 64 x 128: not square


ACT_MOD = "model.layers.0.mlp.down_proj"  # K = 384: six groups of 64


def test_act_order_report_and_trivial_g_idx_unchanged(logical, tmp_path):
    """The report's key table says what happens to each g_idx: an act-order index is used ("act-order g_idx,
    groups permuted"), a trivial one (desc_act false; desc_act with static_groups) is "checked trivial, dropped"
    and listed under ``ignored`` as before, with no g_idx in the spec's JSON (old specs byte-for-byte the same
    form) and no act-order finding."""
    from reference.inspect import main as inspect_main

    for fmt, permuted in (("gptq-asym-int4-actorder", True), ("gptq-asym-int4", False),
                          ("gptq-asym-int4-actorder-static", False), ("gptq", False)):
        out = tmp_path / fmt
        synth.write(fmt, logical, out)
        assert inspect_main([str(out), "--no-loss"]) == 0
        report = (out / "ternary_spec.md").read_text()
        raw = json.loads((out / "ternary_spec.json").read_text())
        row = next(r for r in report.splitlines() if r.startswith(f"| `{ACT_MOD}.g_idx` | - |"))  # key table
        if permuted:
            assert "act-order g_idx, groups permuted" in row and raw["linears"][ACT_MOD]["g_idx"] == f"{ACT_MOD}.g_idx"
            assert f"{ACT_MOD}.g_idx" not in raw.get("ignored", {}) and "act-order" in report
        else:
            assert "checked trivial, dropped" in row, (fmt, row)
            assert not any("g_idx" in e for e in raw["linears"].values()), fmt
            assert raw["ignored"][f"{ACT_MOD}.g_idx"] == "g_idx == arange(K) // group_size (no act-order)"
            assert "act-order g_idx, groups permuted" not in report


@pytest.mark.parametrize("fmt", ["gptq-asym-int4-actorder", "compressed-tensors-asym-int4-actorder"])
def test_act_order_without_quantization_config(fmt, logical, tmp_path):
    """Without a quantization_config the group index is read from the tensors alone (GPTQ's g_idx, compressed-
    tensors' weight_g_idx next to group scales): the same decode, bit for bit."""
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out, keep_quant_config=False)
    res = inspect_dir(out, use_loss=False)
    ck = Checkpoint(out)
    for mod in (ACT_MOD, CT_MOD):
        e = res.spec.linears[mod]
        assert e.g_idx is not None and e.g_idx.endswith("g_idx")
        assert torch.equal(decode_linear(ck, e, mod).effective(), truth.effective(mod)), mod


def test_compressed_tensors_g_idx_must_match_the_config(logical, tmp_path):
    """compressed-tensors stores weight_g_idx only for actorder 'group' (compression_param_names) and always then: a
    weight_g_idx under actorder null is an extra key (asymmetric groups) or an index the config does not declare
    (symmetric groups, read by the general search), a missing one under actorder 'group' is named, and one with
    groups of the wrong size is refused naming the tensor and the group."""
    from reference.inspect import InspectError

    def with_config(out, fn):
        cfg = json.loads((out / "config.json").read_text())
        fn(cfg["quantization_config"]["config_groups"]["group_0"]["weights"])
        (out / "config.json").write_text(json.dumps(cfg))

    asym = tmp_path / "asym"
    synth.write("compressed-tensors-asym-int4-actorder", logical, asym)
    with_config(asym, lambda w: w.update(actorder=None))
    with pytest.raises(InspectError, match=r"weight_g_idx' next to weight .* not part of compressed-tensors' layout "
                                           r".*only with weights.actorder 'group'"):
        inspect_dir(asym, use_loss=False)
    with_config(asym, lambda w: w.update(actorder="dynamic"))  # compressed-tensors' alias of 'group'
    assert inspect_dir(asym, use_loss=False).spec.linears[CT_MOD].g_idx == f"{CT_MOD}.weight_g_idx"
    sd = load_file(str(asym / "model.safetensors"))
    gi = sd[f"{CT_MOD}.weight_g_idx"]
    sd[f"{CT_MOD}.weight_g_idx"] = torch.where(gi == 1, 0, gi).to(torch.int32)  # K = 128: group 0 takes all
    from safetensors.torch import save_file
    save_file(sd, str(asym / "model.safetensors"))
    with pytest.raises(InspectError, match=rf"group index '{CT_MOD}.weight_g_idx': group 0 holds 128 inputs, expected "
                                           rf"64.*\(config group group_0"):
        inspect_dir(asym, use_loss=False)

    sym = tmp_path / "sym"
    synth.write("compressed-tensors-int4-actorder", logical.requantized(4, seed=5), sym)
    assert inspect_dir(sym, use_loss=False).spec.linears[CT_MOD].g_idx == f"{CT_MOD}.weight_g_idx"
    with_config(sym, lambda w: w.pop("actorder"))
    with pytest.raises(InspectError, match=r"'model.layers.\d.\w+.\w+.weight_g_idx' permutes the inputs into groups .*"
                                           r"weights.actorder None .*fix the config \(weights.actorder: 'group'\)"):
        inspect_dir(sym, use_loss=False)
    with_config(sym, lambda w: w.update(actorder="group"))
    sd = load_file(str(sym / "model.safetensors"))
    sd.pop(f"{CT_MOD}.weight_g_idx")
    save_file(sd, str(sym / "model.safetensors"))
    with pytest.raises(InspectError, match=rf"'{CT_MOD}.weight_packed': no g_idx next to it, but config.json says "
                                           rf"weights.actorder 'group'"):
        inspect_dir(sym, use_loss=False)


@pytest.mark.parametrize("fmt,axis,meta", [("hqq-meta", 1, True), ("hqq-axis0", 0, False),
                                           ("hqq-axis0-meta", 0, True)])
def test_hqq_meta_and_axis0_recovered(fmt, axis, meta, logical, tmp_path):
    """Axis=1 with HQQ's meta tensors, axis=0 with and without them: the group view and axis, scales and zero
    points are found, the decode equals the generator's ternary values times its scales bit for bit (also after
    a spec JSON round trip, and through `python -m reference.decode`), and every meta tensor is listed as
    checked under the spec's 'ignored'."""
    lg = logical.with_group_jitter(64, seed=7, axis=axis)
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    res = inspect_dir(out, use_loss=False)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    e = res.spec.linears[HQQ_MOD]
    assert (e.pack.group_view, e.pack.group_axis, e.pack.pack_axis, e.pack.lanes, e.pack.bit_order) == \
        (64, axis, 0, "blocked", "msb")
    assert e.scale.group_axis == e.zero.group_axis == axis and e.zero.key == f"{HQQ_MOD}.zero"
    assert any(f.what == "block structure" and f"axis={axis} groups of [64]" in f.decision for f in res.findings)
    metas = [k for k in Checkpoint(out).keys() if k.rsplit(".", 1)[-1] in synth.hqq_meta((1, 1), 1, 1)]
    assert (len(metas) == 16 * len(truth.ternary)) == meta and (len(metas) == 0) != meta
    assert set(metas) <= set(res.spec.ignored)
    if meta:
        assert res.spec.ignored[f"{HQQ_MOD}.axis"].startswith(f"HQQ meta axis = {axis}, checked")
        assert res.spec.ignored[f"{HQQ_MOD}.shape"].startswith("HQQ meta shape = [64, 128], checked")
        assert any(f.what == "HQQ meta tensors" for f in res.findings)
    res.spec.save(out / "ternary_spec.json")
    again = CheckpointSpec.load(out / "ternary_spec.json")
    assert again == res.spec and again.linears[HQQ_MOD].pack.group_axis == axis
    assert decode_main([str(out), "--out", str(tmp_path / "dense.safetensors")]) == 0
    dense = load_file(str(tmp_path / "dense.safetensors"))
    for mod in truth.ternary:
        assert torch.equal(dense[f"{mod}.weight"].float(), truth.effective(mod)), mod


@pytest.mark.parametrize("axis", [0, 1])
def test_hqq_axis_from_shapes_when_group_view_is_square(axis, logical, tmp_path):
    """Group size 128 on a 128 x 128 module: W_q is [32, 128] for either axis; without meta tensors the scale /
    zero shapes HQQ writes ([1, N*K/G] for axis=0, [N*K/G, 1] for axis=1) decide, and the decode is exact."""
    lg = logical.with_group_jitter(128, seed=8, axis=axis)
    out = tmp_path / f"hqq{axis}"
    truth = synth.write(lambda g: synth.w_hqq(g, axis=axis, group_size=128), lg, out)
    mod = "model.layers.0.self_attn.q_proj"
    assert tuple(Checkpoint(out).info(f"{mod}.W_q").shape) == (32, 128)
    res = inspect_dir(out, use_loss=False)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    assert (res.spec.linears[mod].pack.group_view, res.spec.linears[mod].pack.group_axis) == (128, axis)


def _with(out: Path, key: str, value) -> None:
    """Replace (or add; None: delete) one tensor of a single-file checkpoint."""
    from safetensors.torch import save_file

    sd = load_file(str(out / "model.safetensors"))
    if value is None:
        del sd[key]
    else:
        sd[key] = value
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})


def _chars(s: str) -> torch.Tensor:
    return torch.tensor([ord(c) for c in s], dtype=torch.uint8)  # encode_safetensor_type of a str


I32 = torch.int32
BAD_META = [  # (format, meta key, stored value, what the message must say)
    ("hqq-meta", "nbits", torch.tensor(4, dtype=I32), "nbits 4"),
    ("hqq-axis0-meta", "nbits", torch.tensor(3, dtype=I32), "nbits 3, which packs as '3bit_32'"),
    ("hqq-meta", "shape", torch.tensor([128, 64]), "expected [64, 128]"),
    ("hqq-axis0-meta", "shape", torch.tensor([64, 128, 1]), "expected [64, 128]"),
    ("hqq-meta", "group_size", torch.tensor(48, dtype=I32), "group_size 48 does not divide N*K = 64*128 = 8192"),
    ("hqq-axis0-meta", "group_size", torch.tensor(96, dtype=I32), "expected a divisor of 8192"),
    ("hqq-meta", "group_size", torch.tensor(32, dtype=I32), "expected uint8 [64, 32]"),
    ("hqq-axis0-meta", "group_size", torch.tensor(128, dtype=I32), "expected uint8 [32, 64]"),
    ("hqq-meta", "packing", _chars("2bit_u9"), "unknown packing '2bit_u9'"),
    ("hqq-meta", "packing", _chars("4bit_u8"), "nbits 2, which packs as '2bit_u8'"),
    ("hqq-meta", "nbits", torch.tensor(7, dtype=I32), "nbits 7, expected one of HQQ's"),
    ("hqq-axis0-meta", "axis", torch.tensor(2, dtype=I32), "axis 2, expected 0 or 1"),
    ("hqq-axis0-meta", "axis", torch.tensor(1, dtype=I32), "for axis=1, group_size=64"),
    ("hqq-meta", "axis", torch.tensor(0, dtype=I32), "expected uint8 [16, 128]"),
    ("hqq-meta", "view_as_float", torch.tensor(1, dtype=torch.uint8), "expected a float16 tensor"),
    ("hqq-meta", "unpack_view_dtype", _chars("torch.int32"), "expected 'torch.uint8'"),
    ("hqq-meta", "nbits", torch.tensor([2, 2], dtype=I32), "expected one value"),
]


@pytest.mark.parametrize("fmt,leaf,value,want", BAD_META, ids=[f"{f}-{k}-{i}" for i, (f, k, _, _) in
                                                               enumerate(BAD_META)])
def test_hqq_bad_meta_is_named(fmt, leaf, value, want, logical, tmp_path):
    """A meta value that contradicts the stored tensors or config.json is an error naming the file, the meta
    tensor and the expected value."""
    from reference.inspect import InspectError

    out = tmp_path / fmt
    synth.write(fmt, logical, out)
    key = f"{HQQ_MOD}.{leaf}"
    _with(out, key, value)
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert str(out / "model.safetensors") in msg and repr(key) in msg and want in msg, msg


def _vf_wq(out: Path) -> torch.Tensor:
    return Checkpoint(out).get(f"{HQQ_MOD}.W_q").clone()


VIEW_BAD = [  # (format, what to store, what the message must say)
    ("hqq-2bit-float16-view", "meta-false", "without view_as_float HQQ stores W_q as its packing's integers; "
                                            "expected uint8"),
    ("hqq-2bit-float16-view", "integer", "expected a float16 tensor holding the packed uint8 bytes"),
    ("hqq-2bit-float16-view", "bf16", "expected float16 (HQQ meta"),
    ("hqq-2bit-float16-view", "short", "expected uint8 [32, 64] (2bit_u8) (read as the uint8 view of the stored "
                                       "float16 [32, 31], view_as_float; expected float16 [32, 32])"),
    ("hqq-3bit-float16-view", "odd", "a row of 127 * 2 bytes is not a multiple of 4"),
    ("hqq-2bit", "float-nometa-false", "expected uint8"),
]


@pytest.mark.parametrize("fmt,how,want", VIEW_BAD, ids=[f"{f}-{h}" for f, h, _ in VIEW_BAD])
def test_hqq_view_as_float_inconsistent_is_named(fmt, how, want, logical, tmp_path):
    """HQQ view_as_float (W_q = W_q.view(compute_dtype)): a float W_q whose meta says view_as_float False, an
    integer W_q whose meta says True, a float dtype other than compute_dtype, a float W_q of the wrong size (a
    column short: its uint8 view does not give HQQ's shape) and an int32 packing whose float row is no whole number
    of int32 are errors naming the file, W_q and the expected dtype / shape."""
    from reference.inspect import InspectError

    out = tmp_path / fmt
    synth.write(fmt, logical, out)
    wq, key = _vf_wq(out), f"{HQQ_MOD}.W_q"
    if how == "meta-false":
        _with(out, f"{HQQ_MOD}.view_as_float", torch.tensor(0, dtype=torch.uint8))
    elif how == "integer":
        _with(out, key, wq.view(torch.uint8))
    elif how == "bf16":
        _with(out, key, wq.view(torch.bfloat16))
    elif how == "short":
        _with(out, key, wq[:, :-1].contiguous())
    elif how == "odd":
        _with(out, key, wq[:, :-1].contiguous())
    else:  # an integer-packed checkpoint (view_as_float False) whose W_q is stored as a float view anyway
        _with(out, key, wq.view(torch.float16))
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert str(out / "model.safetensors") in msg and repr(key) in msg and want in msg, msg


def test_hqq_nbits_1_58_is_two_bit(logical, tmp_path):
    """nbits 1.58 (a float, stored float32 by encode_safetensor_type) packs as '2bit_u8' in HQQ: accepted."""
    out = tmp_path / "hqq158"
    truth = synth.write("hqq-axis0-meta", logical, out)
    _with(out, f"{HQQ_MOD}.nbits", torch.tensor(1.58, dtype=torch.float32))
    res = inspect_dir(out, use_loss=False)
    check_recovered(out, res.spec, truth, logical, 1e-3)
    assert res.spec.ignored[f"{HQQ_MOD}.nbits"].startswith("HQQ meta nbits = 1.58, checked")


def test_hqq_meta_needs_an_hqq_packed_weight(logical, tmp_path):
    """Meta tensors next to a weight that is not HQQ-packed stay an error: a module of a transformers BitNet
    checkpoint (extra key, as before), a W_q stored as floats, and an HQQ W_q whose zero tensor is missing."""
    from reference.inspect import InspectError

    out = tmp_path / "hf"
    synth.write("hf-bitlinear", logical, out)
    _with(out, "model.layers.0.self_attn.q_proj.nbits", torch.tensor(2, dtype=I32))
    with pytest.raises(InspectError, match=r"q_proj\.nbits.*extra key"):
        inspect_dir(out, use_loss=False)

    out = tmp_path / "float"
    synth.write("hqq-meta", logical, out)
    _with(out, f"{HQQ_MOD}.W_q", logical.effective(HQQ_MOD).to(torch.float16))
    _with(out, f"{HQQ_MOD}.scale", None)
    _with(out, f"{HQQ_MOD}.zero", None)
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert "extra key" in msg and "an HQQ meta tensor" in msg and f"{HQQ_MOD}.W_q" in msg and "not HQQ-packed" in msg

    out = tmp_path / "nozero"
    synth.write("hqq-axis0-meta", logical, out)
    _with(out, f"{HQQ_MOD}.zero", None)
    with pytest.raises(InspectError) as e:
        inspect_dir(out, use_loss=False)
    msg = str(e.value)
    assert str(out / "model.safetensors") in msg and f"no zero tensor '{HQQ_MOD}.zero'" in msg


def _mixed_writer(lg):
    # 2-bit int32 for most modules, 4-bit int32 for every down_proj and layer 1's k_proj (a fused
    # vLLM qkv_proj of mixed widths), int8 one value per element for two more
    return synth.w_compressed_tensors_mixed(lg, wide=("down_proj", "layers.1.self_attn.k_proj"),
                                            unpacked=("layers.2.self_attn.o_proj", "layers.1.mlp.up_proj"))


def test_mixed_code_widths_per_module(logical, trained_loss, tmp_path):
    """Mixed code widths in one model (2-bit, 4-bit and one value per int8 element): the width is
    chosen per module from its stored/logical shape ratio, code tables are inferred per width,
    and inspect -> spec JSON -> decode (library and ``reference.decode`` CLI) matches the ground
    truth for every layer.  Before per-module widths the inspector chose one width (2-bit) for
    the whole model and refused the first 4-bit tensor ("shape [128, 48] I32 cannot hold the
    logical 128x384 matrix ... at 16 2-bit values per int32")."""
    lg = logical.with_channel_jitter(seed=1)
    out = tmp_path / "mixed"
    truth = synth.write(_mixed_writer, lg, out)
    assert inspect_main([str(out)]) == 0
    spec = CheckpointSpec.load(out / "ternary_spec.json")  # the JSON round trip keeps each entry's width
    check_recovered(out, spec, truth, lg, 1e-3)
    want = {m: 8 if m in ("model.layers.2.self_attn.o_proj", "model.layers.1.mlp.up_proj")
            else 4 if m.endswith("down_proj") or m == "model.layers.1.self_attn.k_proj" else 2 for m in truth.ternary}
    assert {m: e.pack.bits for m, e in spec.linears.items()} == want
    assert {m: e.pack.container for m, e in spec.linears.items() if want[m] == 8} == \
        {m: "int8" for m in want if want[m] == 8}
    res = inspect_dir(out)
    assert res.spec.to_dict() == spec.to_dict()
    assert res.loss == pytest.approx(trained_loss, abs=0.03)
    f = {x.what: x for x in res.findings}
    assert f["code width"].decision == "mixed: 2-bit for 15 modules, 4-bit for 4 modules, 8-bit for 2 modules"
    assert f["code width"].confidence == "high"
    assert "model.layers.1.self_attn.k_proj I32 [64, 16] = 64x128" in f["code width: 4-bit modules"].evidence
    assert "model.layers.1.mlp.up_proj I8 [384, 128] = 384x128" in f["code width: 8-bit modules"].evidence
    for b in (2, 4, 8):  # per-width code-table evidence
        assert f"code table: zero code [{b}-bit modules]" in f
    report = (out / "ternary_spec.md").read_text()
    assert "- 4-bit modules: 4, in ['int32'] ([8]/container)" in report
    assert "- 8-bit modules: 2, in ['int8'] ([1]/container)" in report
    w_path = tmp_path / "w.safetensors"
    assert decode_main([str(out), "--out", str(w_path)]) == 0
    w = load_file(str(w_path))
    for mod in truth.ternary:
        torch.testing.assert_close(w[f"{mod}.weight"], truth.effective(mod), rtol=1e-6, atol=0)


def test_mixed_widths_keep_the_shape_error_for_a_tensor_no_width_fits(logical, tmp_path):
    """Per-module widths only when every packed tensor fits some width: a tensor that fits none is
    still named with the main width's expectation."""
    out = tmp_path / "mixed-bad"
    synth.write("compressed-tensors-mixed", logical, out)
    sd = load_file(str(out / "model.safetensors"))
    key = "model.layers.2.self_attn.q_proj.weight_packed"
    sd[key] = sd[key][:, :7].contiguous()
    from safetensors.torch import save_file
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Exception, match=r"q_proj\.weight_packed.*\[128, 7\] I32 cannot hold the logical 128x128"):
        inspect_dir(out, use_loss=False)


def test_mixed_code_widths_no_loss_mode(logical, tmp_path):
    """Without loss scoring the per-width code tables (statistics) and the compressed-tensors prior
    (interleaved, LSB first) still decode every layer of the mixed-width model."""
    out = tmp_path / "mixed"
    truth = synth.write("compressed-tensors-mixed", logical, out)
    res = inspect_dir(out, use_loss=False)
    check_recovered(out, res.spec, truth, logical, 1e-3)
    assert {e.pack.bits for e in res.spec.linears.values()} == {2, 4}
    assert res.loss is None


def test_declared_single_width_names_a_tensor_that_fits_only_another(logical, tmp_path):
    """config.json declares one code width (compressed-tensors num_bits 2): a tensor stored at another
    width's shape (here 4-bit, [N, K/8] int32) is a damaged tensor named with the declared width's
    expectation, not read as a 4-bit module of a mixed-precision model."""
    out = tmp_path / "ct2"
    synth.write("compressed-tensors", logical, out)
    key = "model.layers.1.mlp.down_proj.weight_packed"

    def widen(t):  # [N, K/16] -> [N, K/8]: what a 4-bit packing of the same matrix would occupy
        return torch.cat([t, t], dim=1)

    _rewrite(out, key, widen)
    with pytest.raises(Exception, match=r"down_proj\.weight_packed.*cannot hold the logical"):
        inspect_dir(out, use_loss=False)


def test_tied_model_with_saved_lm_head_copy(tmp_path):
    """A tied checkpoint that also stores lm_head.weight (transformers and vLLM tie it only if it equals the
    embedding): the inspector maps it as the output embedding and the spec validates."""
    from reference.make_model import Preset, write_model
    from safetensors.torch import save_file
    d = write_model(Preset("llama", 64, 96, 2, 4, 2, 67, True, seed=31), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, str(d / "model.safetensors"))
    res = inspect_dir(d, use_loss=False)
    assert res.spec.tensors["lm_head.weight"] == "lm_head.weight"
    res.spec.validate(ModelConfig.load(d), Checkpoint(d))


def test_untrained_model_keeps_the_layout_its_config_names(tmp_path):
    """An untrained (random) BitNet with quant_method bitnet: its decodes' losses differ by noise (here the
    layout transformers defines scores 0.074 nats worse than another), which must not override the layout
    config.json names; the inspected spec decodes as the HF-BitNet spec does."""
    import shutil
    from reference.make_model import Preset, write_model
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 2, 512, False, seed=21), tmp_path / "m")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "models" / "tiny-bitnet" / f, d / f)
    res = inspect_dir(d)
    pk = res.spec.linears["model.layers.0.self_attn.q_proj"].pack
    assert (pk.lanes, pk.bit_order, pk.codes) == ("blocked", "lsb", (-1, 0, 1, None))
    ids = torch.arange(3, 40).reshape(1, -1)
    cfg, ck = ModelConfig.load(d), Checkpoint(d)
    assert torch.equal(ReferenceModel(cfg, res.spec, ck).forward(ids), ReferenceModel.from_dir(d).forward(ids))


def test_sign_magnitude_with_negative_zero(logical, trained_loss, tmp_path):
    """2-bit sign-magnitude ternary (bit 1 = sign, bit 0 = magnitude) whose packer took the sign from the
    float weight: "-0" (code 2) occurs wherever a small negative weight rounded to 0, so all four codes
    are used.  That is not int2: both zeros must decode to 0 (before: read as int2, -0 -> -2)."""
    spec = PackSpec(bits=2, container="uint8", pack_axis=1, codes=(0, 1, 0, -1), pad_code=0)

    def writer(lg):
        sd, q, truth = synth.w_custom(lg, spec, scale="tensor", op="divide", scale_dtype=torch.float32)
        g = torch.Generator().manual_seed(0)
        for key in [k for k in sd if sd[k].dtype == torch.uint8]:
            x = sd[key]
            for s in range(4):  # a third of the +0 fields become -0
                f = (x >> (2 * s)) & 3
                flip = (f == 0) & (torch.rand(x.shape, generator=g) < 0.3)
                x = torch.where(flip, x | (2 << (2 * s)), x)
            sd[key] = x
        return sd, q, truth

    out = tmp_path / "signmag"
    truth = synth.write(writer, logical, out)
    hist = Checkpoint(out).get("model.layers.0.mlp.up_proj.weight")
    assert int((((hist >> 2) & 3) == 2).sum()) > 0  # -0 really is there
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, logical, 1e-3)
    assert res.spec.linears["model.layers.0.mlp.up_proj"].pack.codes == (0, 1, 0, -1)
    assert res.loss == pytest.approx(trained_loss, abs=0.01)


def test_fused_tensors_packed_part_by_part(logical, trained_loss, tmp_path):
    """The inspector tries PackSpec.segments (one per fused part) for fused tensors packed along their
    output axis; before, every candidate packed the fused matrix at once and the best one was silently
    wrong (loss ~6.4 nats instead of ~0.15)."""
    out = tmp_path / "fused-per-part"
    truth = synth.write(synth.FORMATS["hf-fused-per-part"], logical, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, logical, 1e-3)
    e = res.spec.linears["model.layers.1.self_attn.k_proj"]
    assert e.pack.segments == (128, 64, 64) and e.rows == (128, 192)
    assert res.spec.linears["model.layers.1.mlp.up_proj"].pack.segments == (384, 384)
    assert res.spec.linears["model.layers.1.mlp.down_proj"].pack.segments is None
    assert res.loss == pytest.approx(trained_loss, abs=0.01)
    assert any(f.what == "per_part (by loss)" for f in res.findings)
    assert not any(f.what == "fused part order" for f in res.findings)  # the writers' order: nothing to say
    # the spec file round-trips, and the bf16 target's independent byte-LUT decoder reads the segments
    from parity.targets.reference import lut_decoder

    spec = CheckpointSpec.from_dict(json.loads(res.spec.to_json()))
    ck = Checkpoint(out)
    for mod in ("model.layers.0.self_attn.v_proj", "model.layers.2.mlp.gate_proj"):
        assert torch.equal(lut_decoder(ck, spec.linears[mod], mod).values.to(torch.int8), truth.ternary[mod])


def test_untrained_axis1_packing_prior_is_consecutive_inputs(tmp_path):
    """The random bundled model packed along K, 4 consecutive inputs per byte low bits first (the seed /
    compressed-tensors lanes), no quantization_config: the loss cannot tell layouts apart, and the prior
    must not prefer transformers' blocked layout -- an axis-0 convention -- for axis-1 packing
    (before: blocked was kept and every weight decoded wrong)."""
    from parity.dump import DEFAULT_MODEL

    lg = synth.Logical.from_dir(DEFAULT_MODEL)
    spec = PackSpec(bits=2, container="uint8", pack_axis=1, codes=(-1, 0, 1, None), pad_code=1)
    out = tmp_path / "axis1"
    truth = synth.write(lambda g: synth.w_custom(g, spec, scale="tensor", op="divide", scale_dtype=torch.float32),
                        lg, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    assert res.spec.linears["model.layers.0.mlp.down_proj"].pack.lanes == "interleaved"
    assert any(f.what.startswith("layout (prior") for f in res.findings)
    # the alternatives the loss cannot rule out are named, not dropped silently
    amb = next(f for f in res.findings if f.what == "ambiguous decode")
    assert "blocked" in amb.evidence and amb.confidence.startswith("low")


def test_no_loss_small_untrained_model_zero_code_within_noise(tmp_path):
    """A tiny untrained model (odd-bitnet, no tokenizer: statistics only) whose codes are split ~1/3 each:
    the count asymmetry that names the zero code is within sampling noise, so every close zero code
    stays a candidate and the prior (codes increasing with value) decides -- not the first candidate
    generated (before: code 2 was taken as zero 'with high confidence' and every weight decoded wrong)."""
    from reference.make_model import write_model

    src = write_model("odd-bitnet", tmp_path / "odd")
    lg = synth.Logical.from_dir(src)
    out = tmp_path / "odd-axis0"
    truth = synth.write(lambda g: synth.w_custom(g, synth.HF_BITNET, scale="tensor", op="divide",
                                                 scale_dtype=torch.float32), lg, out)
    res = inspect_dir(out, use_loss=False)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    zero = next(f for f in res.findings if f.what == "code table: zero code")
    assert zero.confidence.startswith("low") and "sampling noise" in zero.evidence
    assert any(f.what == "search" and f.confidence == "low" for f in res.findings)


def test_fused_gate_up_stored_up_first_is_found_by_loss(logical, trained_loss, tmp_path):
    """A gate_up tensor stored [up; gate] (halves swapped, per-part scales with them; q|k|v as transformers writes
    them): the search alone found the right packing and read the halves in the writers' order - a model that works
    poorly (2.37 nats against 0.15) reported with high confidence. The part order is scored now: the swap is taken,
    said, and every module decodes to its true values; the spec's rows say where each module's rows lie."""
    src, out = tmp_path / "src", tmp_path / "up-first"
    truth = synth.write(synth.FORMATS["hf-fused-per-part"], logical, src)
    sd = load_file(str(src / "model.safetensors"))
    for key in [k for k in sd if k.endswith("mlp.gate_up_proj.weight")]:
        w = sd[key]
        sd[key] = torch.cat([w[w.shape[0] // 2:], w[: w.shape[0] // 2]]).contiguous()
        sd[key + "_scale"] = sd[key + "_scale"].flip(0).contiguous()
    out.mkdir()
    save_file(sd, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, logical, 1e-3)
    assert res.loss == pytest.approx(trained_loss, abs=0.01)
    (f,) = [f for f in res.findings if f.what == "fused part order"]
    assert f.decision == "gate_up stored [up_proj; gate_proj] (3 modules)" and f.confidence.startswith("high")
    assert res.spec.linears["model.layers.0.mlp.up_proj"].rows == (0, 384)
    assert res.spec.linears["model.layers.0.mlp.gate_proj"].rows == (384, 768)
    assert res.spec.linears["model.layers.0.self_attn.k_proj"].rows == (128, 192)  # q|k|v: as written


def test_fused_parts_padded_one_by_one(tmp_path):
    """Fused qkv whose parts (50 / 10 / 10 rows, none a multiple of 4) were each packed and padded on
    their own along axis 0: 13 + 3 + 3 = 19 packed rows, which no whole-matrix layout of 70 rows has
    (18 or 20); the shape alone must admit it (before: a shape error for a decodable tensor)."""
    from reference.make_model import Preset, write_model

    src = write_model(Preset("bitnet", 50, 64, 2, 5, 1, 61, True, head_dim=10, seed=3), tmp_path / "src")
    lg = synth.Logical.from_dir(src)
    out = tmp_path / "fused-odd"
    truth = synth.write(synth.FORMATS["hf-fused-per-part"], lg, out)
    assert list(Checkpoint(out).info("model.layers.0.self_attn.qkv_proj.weight").shape) == [19, 50]
    res = inspect_dir(out, use_loss=False)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    assert res.spec.linears["model.layers.0.self_attn.v_proj"].pack.segments == (50, 10, 10)


def test_text_ids_from_a_sentencepiece_tokenizer_model(tmp_path):
    """Llama-2-style checkpoints ship tokenizer.model (sentencepiece) and no tokenizer.json: the loss
    search tokenizes with transformers' tokenizer for it instead of stopping; a tokenizer whose ids
    exceed config.json's vocab_size is named as not belonging to the model; no tokenizer at all
    still asks for --no-loss."""
    spm = pytest.importorskip("sentencepiece")
    from transformers import AutoTokenizer

    from reference.checkpoint import CheckpointError
    from reference.inspect import InspectError

    corpus = tmp_path / "c.txt"
    corpus.write_text((ROOT / "models" / "corpus.txt").read_text()[:100000])
    d = tmp_path / "m"
    shutil.copytree(TRAINED, d)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (d / f).unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="no tokenizer.json, tokenizer.model or tokenizer_config.json"):
        text_ids(d)
    vocab = ModelConfig.load(d).vocab_size
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=min(200, vocab),
                                   model_type="bpe", minloglevel=2)
    shutil.copy(tmp_path / "sp.model", d / "tokenizer.model")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    ids = text_ids(d, n_seq=2, seq_len=32)
    text = (ROOT / "models" / "corpus.txt").read_text()
    want = AutoTokenizer.from_pretrained(str(d))(text[int(len(text) * 0.95):])["input_ids"]
    assert ids.shape == (2, 33) and ids.reshape(-1).tolist() == want[:66]
    inspect_dir(d, n_seq=1, seq_len=32)  # runs the loss search on those ids
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = int(ids.max())  # now the tokenizer's ids run past the model's vocabulary
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((InspectError, CheckpointError), match=r"tokenizer gives token id \d+, config.json's vocab_size"):
        inspect_dir(d, n_seq=1, seq_len=32)


def test_online_mode_checkpoint_is_not_read_as_float_linears(tmp_path):
    """quantization_mode 'online' (float latent weights, ternarized by the model at run time): the
    inspector says so and writes online entries (it read them as plain float linears before: a model
    that computes something else)."""
    from reference.make_model import Preset, to_online, write_model

    d = to_online(write_model(Preset("bitnet", 64, 96, 2, 4, 2, 67, False, linear_class="autobitlinear", seed=33),
                              tmp_path / "m"), seed=2)
    res = inspect_dir(d, use_loss=False)
    assert len(res.spec.linears) == 14 and all(e.online == "absmean" for e in res.spec.linears.values())
    assert any(f.what == "online quantization" for f in res.findings)
    ids = torch.arange(3, 30).reshape(1, -1)
    spec = CheckpointSpec.from_dict(json.loads(res.spec.to_json()))  # the JSON round-trips the entries
    ck, mc = Checkpoint(d), ModelConfig.load(d)
    assert torch.equal(ReferenceModel(mc, spec, ck).forward(ids), ReferenceModel.from_dir(d).forward(ids))


@pytest.mark.parametrize("lc", [None, "BitLinear", "bitlinaer"])
def test_unknown_linear_class_is_refused(tmp_path, lc):
    """quantization_config.linear_class decides whether weight_scale divides (bitlinear) or multiplies
    (autobitlinear); a value transformers refuses (null, another spelling) was read as 'multiply': a wrong
    model without a word. Both the config path and the inspector now name the value."""
    from reference.make_model import write_model

    d = write_model("oracle-llama-gqa", tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["linear_class"] = lc
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"linear_class is .*expected one of \['bitlinear', 'autobitlinear'\]"):
        spec_for(d, ModelConfig.load(d))
    with pytest.raises(CheckpointError, match=r"linear_class is"):
        inspect_dir(d, use_loss=False)
    del cfg["quantization_config"]["linear_class"]  # absent: bitlinear, as in transformers
    (d / "config.json").write_text(json.dumps(cfg))
    assert spec_for(d, ModelConfig.load(d)).linears["model.layers.0.self_attn.q_proj"].scale.op == "divide"


def test_compressed_tensors_declared_int8_activations(tmp_path):
    """compressed-tensors config_groups.*.input_activations: dynamic symmetric per-token int8 (W2A8) gives the
    spec int8_per_token activations and a finding (it was read as unquantized activations: another model);
    a scheme the spec cannot run (per-tensor, static) is refused with the file and the scheme named."""
    from reference.formats import FormatError
    from reference.make_model import write_model

    out = tmp_path / "ct"
    synth.write("compressed-tensors", synth.Logical.from_dir(write_model("oracle-llama-gqa", tmp_path / "m")), out)
    plain = inspect_dir(out, use_loss=False)
    assert plain.spec.activation_quant == "none"
    cfg = json.loads((out / "config.json").read_text())
    for g in cfg["quantization_config"]["config_groups"].values():
        g["input_activations"] = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    (out / "config.json").write_text(json.dumps(cfg))
    res = inspect_dir(out, use_loss=False)
    assert res.spec.activation_quant == "int8_per_token"
    assert any(f.what == "activation quantisation" for f in res.findings)
    assert res.spec.linears.keys() == plain.spec.linears.keys()
    for change in ({"strategy": "tensor"}, {"dynamic": False}, {"num_bits": 4}):
        bad = json.loads(json.dumps(cfg))
        for g in bad["quantization_config"]["config_groups"].values():
            g["input_activations"].update(change)
        (out / "config.json").write_text(json.dumps(bad))
        with pytest.raises(FormatError, match=rf"{out / 'config.json'}: config_groups\.\w+\.input_activations"):
            inspect_dir(out, use_loss=False)


@pytest.mark.parametrize("fmt,hidden", [("compressed-tensors", 20), ("compressed-tensors-group", 20)])
def test_heavy_padding_does_not_hide_the_zero_code(tmp_path, fmt, hidden):
    """A small K padded to whole int32 containers (hidden 20: 12 of 32 slots padding, zero-filled = code 0)
    made the pad code outnumber the real zero code, which the inspector then called unused and the
    checkpoint corrupted. The padding is now taken out of the ranking: the table is v + 2 and the
    decoded model is the written one."""
    import dataclasses

    from reference.make_model import PRESETS, write_model

    p = dataclasses.replace(PRESETS["oracle-llama-gqa"], hidden=hidden, heads=2, kv_heads=2, head_dim=hidden // 2,
                            intermediate=30, vocab=50)
    base = write_model(p, tmp_path / "m")
    out = tmp_path / "ct"
    synth.write(fmt, synth.Logical.from_dir(base), out)
    res = inspect_dir(out, use_loss=False)
    assert res.spec.linears["model.layers.0.self_attn.q_proj"].pack.codes == (None, -1, 0, 1)
    assert any(f.what == "code table: padding" for f in res.findings)
    want_spec, ck0, ck1 = spec_for(base, ModelConfig.load(base)), Checkpoint(base), Checkpoint(out)
    for hf, e in res.spec.linears.items():  # the written ternary values, every linear
        got, want = decode_linear(ck1, e, hf), decode_linear(ck0, want_spec.linears[hf], hf)
        assert torch.equal(got.values, want.values), hf


def test_untrained_model_noise_above_prior_margin_keeps_the_convention(tmp_path):
    """The seed's layout on a random Llama (head_dim 32 with 2 heads, MQA, K = 344, a 256-token tokenizer; no
    quantization_config): a layout no public convention uses scored 0.05 nats better than the seed's by chance -
    more than PRIOR_MARGIN - and every weight decoded wrong with no "ambiguous decode" finding (an adversarial user
    pass). The best loss lies within UNTRAINED_BAND of ln V, so only NAMED_MARGIN overrides the prior now."""
    import math

    from reference.inspect_search import UNTRAINED_BAND
    from reference.make_model import Preset, write_model

    base = write_model(Preset("llama", 128, 344, 2, 2, 1, 256, False, head_dim=32, seed=24, tokenizer_vocab=256),
                       tmp_path / "base")
    lg = synth.Logical.from_dir(base)
    out = tmp_path / "seed"
    truth = synth.write("seed", lg, out)
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    assert res.loss > math.log(256) - UNTRAINED_BAND
    tie = next(f for f in res.findings if f.what == "layout (prior tie-break)")
    assert "untrained model" in tie.evidence
    assert next(f for f in res.findings if f.what == "ambiguous decode").confidence.startswith("low")


def test_nan_norm_weight_is_named_by_the_inspector(tmp_path):
    """A NaN in a layer's RMSNorm weight: the inspector (which checks scales) refuses it too, naming the file, the
    tensor and the first bad index, and writes no spec (it wrote one; only parity.dump named the tensor)."""
    from safetensors.torch import load_file as lf, save_file

    from parity.dump import DEFAULT_MODEL

    d = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, d)
    for f in d.glob("ternary_spec.*"):
        f.unlink()
    sd = lf(str(d / "model.safetensors"))
    sd["model.layers.1.post_attention_layernorm.weight"][7] = float("nan")
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InspectError, match=r"model\.safetensors: norm weight 'model\.layers\.1\.post_attention_"
                                           r"layernorm\.weight' has 1 NaN/Inf values \(first nan at index 7\)"):
        inspect_dir(d)
    assert inspect_main([str(d)]) != 0 and not (d / "ternary_spec.json").exists()


def test_statistics_choices_are_rescored_when_no_decode_works(tmp_path):
    """The scale op was taken from magnitudes at 'high' and never scored by loss: a function-preserving rescale of a
    trained model (every multiplier x100, the RMSNorm weight in front /100) read as 'divide' and decoded to 16 nats
    (ln V = 6.2), with every finding confident. When the statistics' choice decodes to no working model, every zero
    code and both ops are scored once; a decode that works overrules them, and says so."""
    from reference.formats import pack
    lg = synth.Logical.from_dir(TRAINED)
    feeds = ("input_layernorm", "self_attn.attn_sub_norm", "post_attention_layernorm", "mlp.ffn_sub_norm")
    floats = {k: (v / 100 if any(k.endswith(f"{n}.weight") for n in feeds) else v) for k, v in lg.floats.items()}
    lg = synth.Logical(lg.config, lg.ternary, {m: v * 100 for m, v in lg.mult.items()}, floats, lg.tokenizer_dir)
    spec = PackSpec(bits=2, container="uint8", pack_axis=1, codes=(0, 1, -1, None), pad_code=0)

    def writer(lg):
        sd, truth = synth._packed_convention(lg, spec, scale="channel", op="multiply", scale_dtype=torch.float32)
        return sd, None, truth
    out = tmp_path / "rescaled"
    truth = synth.write(writer, lg, out)
    res = inspect_dir(out)
    f = {x.what: x for x in res.findings}
    assert f["scale op"].decision == "divide" and "widened search" in f, [x.what for x in res.findings]
    assert res.loss < 1.0
    ck = Checkpoint(out)
    for mod, e in res.spec.linears.items():
        torch.testing.assert_close(decode_linear(ck, e, mod).effective(), truth.effective(mod), rtol=1e-6, atol=0)


def test_unreadable_tokenizer_and_text_are_named(tmp_path, capsys):
    out = tmp_path / "m"
    synth.write("hf-bitlinear", synth.Logical.from_dir(TRAINED), out)
    (tmp_path / "t.txt").write_bytes(b"\xff\xfe not utf-8")
    assert inspect_main([str(out), "--text", str(tmp_path / "t.txt")]) == 2
    assert "t.txt: not UTF-8 text" in capsys.readouterr().err
    (out / "tokenizer.json").write_text("{\n")
    assert inspect_main([str(out)]) == 2
    err = capsys.readouterr().err
    assert "m/tokenizer.json: not a readable tokenizers file" in err and "--no-loss" in err


def test_group_size_is_one_for_the_whole_model(tmp_path):
    """Group scales of size 96: the K = 384 modules allow only 96..127, the K = 128 ones (2 groups) 64..127, and each
    module picked its own first power of two - 64 for the K = 128 modules, effective weights off by ~30% on inputs
    64-95, with no finding. The sizes every module allows are intersected."""
    lg = synth.Logical.from_dir(TRAINED)
    spec = PackSpec(bits=2, container="uint8", pack_axis=1, codes=(-1, 0, 1, None), pad_code=1)

    def writer(lg):
        g = torch.Generator().manual_seed(0)
        jit = synth.Logical(lg.config, lg.ternary, {m: v * (1 + 0.2 * torch.rand(v.shape[0], 1, generator=g))
                                                    for m, v in lg.mult.items()}, lg.floats, lg.tokenizer_dir)
        sd, truth = synth._packed_convention(jit, spec, scale="group", op="multiply", scale_dtype=torch.float32,
                                             group_size=96)
        return sd, None, truth
    out = tmp_path / "g96"
    truth = synth.write(writer, lg, out)
    res = inspect_dir(out, use_loss=False)
    assert {e.scale.group_size for e in res.spec.linears.values()} == {96}
    f = next(x for x in res.findings if x.what == "scale group size")
    assert f.decision == "96" and "96..127" in f.evidence and "would have picked [64, 96]" in f.evidence
    ck = Checkpoint(out)
    for mod, e in res.spec.linears.items():
        torch.testing.assert_close(decode_linear(ck, e, mod).effective(), truth.effective(mod), rtol=1e-6, atol=0)


def test_meta_style_q_k_names_get_a_row_order_finding(tmp_path):
    """Meta's consolidated checkpoints and Microsoft BitNet's GPU converter store q / k rows permuted for interleaved
    RoPE: the inspector says what it decided wherever it sees wq / wk / wqkv (tests/test_rope_rows.py: how), and
    nothing where the names are transformers'."""
    out = tmp_path / "gpu"
    synth.write("bitnet-gpu", synth.Logical.from_dir(TRAINED), out)
    res = inspect_dir(out, use_loss=False)
    f = next(x for x in res.findings if x.what == "q / k row order")
    assert f.confidence == "medium (names)" and "['wqkv']" in f.evidence and "(h l d) i -> (h d l) i" in f.evidence
    out2 = tmp_path / "hf"
    synth.write("hf-bitlinear", synth.Logical.from_dir(TRAINED), out2)
    assert not any(x.what == "q / k row order" for x in inspect_dir(out2, use_loss=False).findings)


@pytest.mark.parametrize("fmt,keep_config", [("seed", True), ("hf-bitlinear", True), ("hf-bitlinear", False)])
def test_one_missing_scale_is_named_not_read_as_one(fmt, keep_config, logical, tmp_path):
    """One packed linear without its scale tensor where every other has one (a conversion that skipped a module):
    decoded with a multiplier of 1 it was 14x too large, with exit 0 and no finding. The inspector names the
    module, the key it expected and how many others have theirs."""
    out = tmp_path / fmt
    synth.write(fmt, logical, out, keep_quant_config=keep_config)
    sd = load_file(str(out / "model.safetensors"))
    key = next(k for k in sorted(sd) if k.startswith("model.layers.1.mlp.down_proj.") and "scale" in k)
    suffix = key[len("model.layers.1.mlp.down_proj."):]
    del sd[key]
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InspectError, match=rf"'model\.layers\.1\.mlp\.down_proj\.weight\w*'.*no scale tensor next to "
                                           rf"it, but \d+ other packed linear\(s\) have one.*expected "
                                           rf"model\.layers\.1\.mlp\.down_proj\.{suffix}"):
        inspect_dir(out, use_loss=False)


def test_scales_contradicting_the_config_op_are_a_finding(logical, tmp_path):
    """quant_method bitnet with linear_class bitlinear (divide) over scales stored as multipliers: the spec follows
    config.json as transformers and vLLM do, and a finding says the tensors look like the other op's."""
    out = tmp_path / "hf-mult"
    synth.write(lambda lg: synth.w_hf(lg, op="multiply"), logical, out)
    res = inspect_dir(out, use_loss=False)
    ops = {f.what: f for f in res.findings if f.what.startswith("scale op")}
    assert ops["scale op"].decision == "divide"
    assert "multiply" in ops["scale op vs config"].decision
    clean = tmp_path / "hf"
    synth.write("hf-bitlinear", logical, clean)
    assert not [f for f in inspect_dir(clean, use_loss=False).findings if f.what == "scale op vs config"]


CT_CHANNEL_2BIT = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                       "num_bits": 2, "type": "int", "symmetric": True, "strategy": "channel"}}}}


@pytest.mark.parametrize("fmt,qc", [
    ("hf-bitlinear", CT_CHANNEL_2BIT),
    ("hf-bitlinear", {"quant_method": "gptq", "bits": 2, "group_size": 64, "sym": True, "desc_act": False}),
    ("compressed-tensors", {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"})],
    ids=["ct-config-on-hf-bitnet", "gptq-config-on-hf-bitnet", "bitnet-config-on-ct"])
def test_a_config_of_another_method_does_not_set_the_scale_op(fmt, qc, logical, tmp_path):
    """A quantization_config copied from another method (compressed-tensors / GPTQ over HF-BitNet's `weight` +
    divided `weight_scale`, or quant_method bitnet over compressed-tensors' `weight_packed`): that method's loader
    could not read these tensors, so its op is no evidence.  The spec used to take it anyway ('high (config)') and
    decode every effective weight off by s^2, exit 0; now the magnitudes decide and a finding names the tensor."""
    lg = logical.with_channel_jitter(seed=1) if fmt.startswith("compressed") else logical
    out = tmp_path / "x"
    truth = synth.write(fmt, lg, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg))
    res = inspect_dir(out)
    check_recovered(out, res.spec, truth, lg, 1e-3)
    f = next(f for f in res.findings if f.what == "config vs tensors")
    assert qc["quant_method"] in f.evidence and "model.layers." in f.evidence and str(out) in f.evidence
    # the method's own tensors keep the config's op, with no such finding
    own = tmp_path / "own"
    synth.write("compressed-tensors" if fmt.startswith("hf") else "hf-bitlinear", logical, own)
    assert not [f for f in inspect_dir(own, use_loss=False).findings if f.what == "config vs tensors"]


@pytest.mark.parametrize("layout,why", [
    ("int32-unpacked", r"the shape is the logical matrix itself: one value per int32 \(unpacked integer weights are "
                       r"read from int8 / uint8 containers only"),
    ("base3-5-per-byte", r"5 values per byte fits base-3 packing .* read as such \(PackSpec codec 'base3'\) where most "
                         r"packed weights of the model fit only it, which is not the case here")])
def test_unsupported_layouts_are_named_for_what_they_look_like(layout, why, logical, tmp_path):
    """Shapes no supported layout explains, but that say what they are: the error names it rather than only the
    2-bit shapes it expected.  (Base-3 packing is read where most packed weights have its shape - tests/
    test_unseen_s55.py; here only the down_proj are base-3 among seed-packed 2-bit weights.)"""
    out = tmp_path / layout
    out.mkdir()
    cfg = dict(logical.config)
    cfg.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(cfg))
    sd = dict(logical.floats)
    for mod, t in logical.ternary.items():
        if layout == "int32-unpacked":
            w = t.to(torch.int32)
        elif not mod.endswith("down_proj"):
            w = pack(t, SEED)
        else:  # base 3, 5 trits per byte, the first input the lowest digit
            c = torch.nn.functional.pad(t.to(torch.int32) + 1, (0, -t.shape[1] % 5)).reshape(t.shape[0], -1, 5)
            w = (c * torch.tensor([1, 3, 9, 27, 81], dtype=torch.int32)).sum(-1).to(torch.uint8)
        sd[f"{mod}.weight"] = w.contiguous()
        sd[f"{mod}.weight_scale"] = logical.mult[mod].reshape(1).float()
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(InspectError, match=why):
        inspect_dir(out, use_loss=False)
