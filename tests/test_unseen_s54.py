"""Unseen checkpoints and formats (helper pass, session 54): each test failed before its fix."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference import synth
from reference.checkpoint import Checkpoint
from reference.formats import SEED, pack
from reference.inspect import InspectError, inspect_dir
from reference.spec import decode_linear

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _decodes_to(out: Path, spec, truth: synth.Truth) -> None:
    ck = Checkpoint(out)
    for mod, t in truth.ternary.items():
        d = decode_linear(ck, spec.linears[mod], mod)
        wrong = int((d.values.to(torch.int8) != t).sum())
        assert wrong == 0, f"{mod}: {wrong} of {t.numel()} values decoded wrong"
        torch.testing.assert_close(d.effective(), truth.effective(mod), rtol=1e-6, atol=0)


def test_signed_one_value_per_element_reads_twos_complement_first(tmp_path):
    """int8 tensors holding -1 / 0 / +1 themselves (synth's int8-ternary), on a small untrained model
    without text: the code counts cannot name the zero code, so the prior decides - and it ranked the codes
    read unsigned ({0: -1, 1: 0, 255: +1}: 0xFF the largest) first, decoding every weight wrong while the zero-code
    finding itself said code 0.  A signed dtype's codes are two's complement first now."""
    from reference.formats import code_table
    from reference.make_model import write_model

    lg = synth.Logical.from_dir(write_model("odd-bitnet", tmp_path / "odd")).with_channel_jitter(seed=2)
    out = tmp_path / "int8"
    truth = synth.write(lambda g: synth.w_unpacked_int(g, code_table(8, {255: -1, 0: 0, 1: 1}), "int8"), lg, out)
    res = inspect_dir(out, use_loss=False)
    _decodes_to(out, res.spec, truth)


@pytest.mark.parametrize("dtype", [None, torch.int8, torch.bfloat16])
def test_no_scale_anywhere_is_a_finding_not_a_silent_multiplier_of_one(dtype, logical, tmp_path):
    """The trained model's codes with every scale tensor dropped (packed as the seed does, int8 -1 / 0 / +1, bf16
    -1 / 0 / +1): read with multiplier 1 - 0.94 nats against the true 0.15 - and reported with nothing about the
    scale at all (a module missing its scale where others have one is an error; all missing said nothing).  Now a
    low-confidence finding names the choice, an example tensor and the magnitude a trained linear would have."""
    def unscaled(lg):
        sd = synth._floats(lg, "hf")
        for mod, t in lg.ternary.items():
            sd[f"{mod}.weight"] = pack(t, SEED) if dtype is None else t.to(dtype)
        return sd, None, synth.Truth(dict(lg.ternary), {m: torch.ones(1, 1) for m in lg.ternary})

    out = tmp_path / "m"
    truth = synth.write(unscaled, logical, out)
    res = inspect_dir(out, use_loss=False)
    _decodes_to(out, res.spec, truth)  # what the file holds, unchanged
    f = next((f for f in res.findings if f.what == "scale"), None)
    assert f is not None and f.decision == "none: multiplier 1" and f.confidence.startswith("low")
    assert "model.layers.0." in f.evidence and "21 ternary linears" in f.evidence and "stored elsewhere" in f.evidence


@pytest.mark.parametrize("name", ["model.safetensors", "model-00002-of-00002.safetensors", "model.gguf"])
def test_git_lfs_pointer_is_named_as_one(name, tmp_path, capsys):
    """A repository cloned without git-lfs holds ~130-byte pointer files in place of its weights.  Read as a header,
    'version h' became a length of 2.3e18 bytes: 'header claims 2336927755350992246 bytes ... (truncated or not a
    safetensors file)' (GGUF: 'bad magic b'vers''), which sends one looking for a corrupt download.  Now the file is
    named as an LFS pointer with the size of the object it stands for, and how to fetch it."""
    import shutil

    from reference.inspect import main as inspect_main
    from reference.synth import save_checkpoint

    d = tmp_path / "m"
    shutil.copytree(TRAINED, d)
    if name.startswith("model-"):  # a sharded checkpoint whose second shard was not fetched
        (d / "model.safetensors").unlink()
        save_checkpoint(load_file(str(TRAINED / "model.safetensors")), d, shards=2)
    else:
        (d / "model.safetensors").unlink()
    pointer = ("version https://git-lfs.github.com/spec/v1\noid sha256:"
               "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 52428800\n")
    (d / name).write_text(pointer)
    assert inspect_main([str(d), "--no-loss"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert f"{d / name}: a Git LFS pointer" in err and "52428800-byte object" in err and "git lfs pull" in err


def _biased(tmp_path, arch="llama"):
    from reference.make_model import Preset, write_model

    return write_model(Preset(arch, 64, 136, 1, 2, 1, 79, False, seed=54, bias=True), tmp_path / f"{arch}-bias")


def _edit(d: Path, sd_fn=None, **cfg):
    import json

    if sd_fn is not None:
        sd = load_file(str(d / "model.safetensors"))
        sd_fn(sd)
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    c = json.loads((d / "config.json").read_text())
    c.update(cfg)
    (d / "config.json").write_text(json.dumps(c))


def test_declared_bias_the_checkpoint_lacks_is_refused(tmp_path):
    """config.json declares attention_bias, the tensors have none (a conversion that dropped them): the config path
    refused it (spec_from_hf_bitnet expects <module>.bias), but the inspector wrote a spec without biases and the
    reference ran another model than the one transformers and vLLM build (vLLM refuses the missing weights).  Now
    spec validation names the module, its weight and the config key."""
    from reference.checkpoint import CheckpointError

    d = _biased(tmp_path)
    _edit(d, lambda sd: [sd.pop(k) for k in [k for k in sd if k.endswith("self_attn.q_proj.bias")]])
    q = r"model\.layers\.0\.self_attn\.q_proj"
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: no bias for {q} \(weight '{q}\.weight'\): "
                                              r"config\.json's attention_bias is true"):
        inspect_dir(d, use_loss=False)


@pytest.mark.parametrize("arch,flag,why", [
    ("llama", "attention_bias", "attention_bias is false"), ("llama", "mlp_bias", "mlp_bias is false"),
    ("bitnet", None, "the BitNet architecture's MLP has no bias")])
def test_stored_bias_the_config_does_not_declare_is_refused(arch, flag, why, tmp_path):
    """Bias tensors the config does not build (attention_bias / mlp_bias false; any MLP bias of the BitNet
    architecture, whose BitNetMLP has none): the config path refused them as unknown keys, but the inspector mapped
    them and the reference added them, although transformers drops them and vLLM has no parameter for them.  Now
    refused naming the tensor and the config key."""
    from reference.checkpoint import CheckpointError

    d = _biased(tmp_path, arch)
    if flag is not None:
        _edit(d, **{flag: False})
    else:  # make_model writes no MLP bias for BitNet: store one
        _edit(d, lambda sd: sd.__setitem__("model.layers.0.mlp.up_proj.bias", torch.zeros(136)))
    mod = "self_attn.q_proj" if flag == "attention_bias" else "mlp.gate_proj" if flag else "mlp.up_proj"
    with pytest.raises(CheckpointError, match=rf"tensor 'model\.layers\.0\.{mod}\.bias' \(bias of model\.layers\.0\."
                                              rf"{mod}\): config\.json's {why}"):
        inspect_dir(d, use_loss=False)


def test_synth_writers_keep_a_biased_models_biases(tmp_path):
    """synth.Logical.from_dir read a biased model's biases nowhere, so every writer wrote a checkpoint whose config
    declares attention_bias / mlp_bias without a single bias (its reference logits 0.43 off the source's).  The
    biases are float tensors of their modules now, written under each naming scheme's names."""
    from reference.checkpoint import Checkpoint as Ck

    src = _biased(tmp_path)
    lg = synth.Logical.from_dir(src)
    for fmt in ("seed", "i2s"):  # transformers' names, GGUF names
        out = tmp_path / fmt
        synth.write(fmt, lg, out)
        res = inspect_dir(out, use_loss=False)
        ck, sk = Ck(out), Ck(src)
        for mod, e in res.spec.linears.items():
            assert e.bias_key is not None, (fmt, mod)
            assert torch.equal(ck.get(e.bias_key), sk.get(f"{mod}.bias")), (fmt, mod)


def test_activation_finding_says_what_the_spec_decided(logical, tmp_path):
    """A BitNet checkpoint whose linears are unconstrained floats with a scale beside them (here codes + 2 stored as
    bf16, a broken export): the spec runs them without activation quantisation (no linear holds codes), while the
    report said 'BitNet architecture: per-token absmax int8 in front of every BitLinear' under decision 'none'.
    The finding now gives the reason of the decision it reports."""
    def float_codes(lg):
        sd = synth._floats(lg, "hf")
        for mod, t in lg.ternary.items():
            sd[f"{mod}.weight"] = (t.float() + 2).to(torch.bfloat16)
            sd[f"{mod}.weight_scale"] = lg.mult[mod].reshape(1).clone()
        return sd, None, synth.Truth(dict(lg.ternary), dict(lg.mult))

    out = tmp_path / "m"
    synth.write(float_codes, logical, out)
    res = inspect_dir(out, use_loss=False)
    f = next(f for f in res.findings if f.what == "activation quantization")
    assert res.spec.activation_quant == f.decision == "none"
    assert "int8" not in f.evidence and "no linear holds ternary or integer codes" in f.evidence


@pytest.mark.parametrize("bad", [0.5, 2.0])
def test_float_stored_codes_with_a_stray_value_are_named(bad, logical, tmp_path):
    """Ternary codes stored as bf16 -1 / 0 / +1 beside a per-channel scale, one value corrupted: int8 codes with a
    stray value are refused by name, the same bytes' bf16 twin ran the stray value as a weight ('decoded as is').
    Now named with its tensor, count, value and position, like the int8 case."""
    def bf16_codes(lg):
        sd = synth._floats(lg, "hf")
        for mod, t in lg.ternary.items():
            sd[f"{mod}.weight"] = t.to(torch.bfloat16)
            sd[f"{mod}.weight_scale"] = lg.mult[mod].expand(t.shape[0], 1).reshape(-1).clone()
        return sd, None, synth.Truth(dict(lg.ternary), dict(lg.mult))

    out = tmp_path / "m"
    synth.write(bf16_codes, logical, out)
    inspect_dir(out, use_loss=False)  # clean: read
    key = "model.layers.1.mlp.up_proj.weight"

    def corrupt(sd):
        w = sd[key].clone()
        w[7, 9] = bad
        sd[key] = w
    _edit(out, corrupt)
    with pytest.raises(InspectError, match=rf"tensor '{key}': 1 values outside -1 / 0 / \+1 \(first {bad} at "
                                           rf"\[7, 9\]\) beside the scale '{key}_scale', where 20 other linears"):
        inspect_dir(out, use_loss=False)


def test_a_weights_file_given_as_the_model_is_named(capsys):
    """`python -m reference.inspect DIR/model.safetensors` (the weights file, not its directory) said only
    'model.safetensors: no config.json', as if the config were missing.  Now it says a file was given where a model
    directory belongs, and which directory that is."""
    from reference.inspect import main as inspect_main

    f = TRAINED / "model.safetensors"
    assert inspect_main([str(f), "--no-loss"]) == 2
    err = capsys.readouterr().err
    assert f"{f}: a file, not a model directory: pass the directory that holds config.json and the weights " \
           f"({TRAINED}" in err
