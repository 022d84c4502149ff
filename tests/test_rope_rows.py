"""q / k rows stored in interleaved-RoPE order (``LinearEntry.rope_interleave``).

Meta's consolidated checkpoints and Microsoft BitNet's GPU converter (gpu/convert_safetensors.py:
rearrange '(h l d) i -> (h d l) i', l = 2) store each head's q / k rows with the two RoPE halves interleaved;
transformers' convert_llama_weights_to_hf undoes that with its permute().  Read as stored, RoPE rotates the wrong
pairs: on the tiny trained model the loss goes from 0.15 to 1.5 nats.  Every reader here (the reference's
finish_linear, the vLLM plugin's shard loaders) puts the rows back; the inspector sets the field from Meta-style
names and lets the loss overrule them; reference.synth's bitnet-gpu writer stores the rows as the converter does."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as hst
from safetensors.torch import load_file, save_file

from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError
from reference.config import ModelConfig
from reference.formats import HF_BITNET, FormatError, ScaleSpec
from reference.inspect import inspect_dir
from reference.spec import LinearEntry, decode_linear, rope_rows, rope_rows_index

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"


def hf_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' convert_llama_weights_to_hf permute(): Meta's (interleaved) rows -> transformers' order."""
    n, k = w.shape
    return w.view(heads, n // heads // 2, 2, k).transpose(1, 2).reshape(n, k)


@settings(max_examples=60, deadline=None)
@given(heads=hst.integers(1, 6), half=hst.integers(1, 9), k=hst.integers(1, 5), seed=hst.integers(0, 2**16))
def test_index_undoes_the_converters(heads, half, k, seed):
    """rope_rows_index is transformers' permute() on Meta's rows, and the inverse of the BitNet GPU converter's
    rearrange (synth.rope_interleave_rows) for any head count and head dim."""
    d = 2 * half
    w = torch.randn(heads * d, k, generator=torch.Generator().manual_seed(seed))
    stored = synth.rope_interleave_rows(w, d)
    # the converter's rearrange '(h l d) i -> (h d l) i' with l = 2, written out
    einops = w.view(heads, 2, half, k).permute(0, 2, 1, 3).reshape(heads * d, k)
    assert torch.equal(stored, einops)
    idx = rope_rows_index(heads * d, d)
    assert torch.equal(stored[idx], w)
    assert torch.equal(hf_permute(stored, heads), w)
    if half > 1:
        assert not torch.equal(stored, w)


def test_entry_field_round_trips_and_is_checked():
    q = "model.layers.0.self_attn.q_proj"
    e = LinearEntry(weight_key=f"{q}.weight", shape=(8, 16), pack=HF_BITNET,
                    scale=ScaleSpec(key=f"{q}.weight_scale", granularity="channel"), rope_interleave=4)
    assert e.to_dict()["rope_interleave"] == 4
    assert LinearEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e
    assert "rope_interleave" not in LinearEntry(weight_key="w", shape=(8, 16)).to_dict()  # old JSON unchanged
    for bad, msg in ((3, "even integer"), (0, "even integer"), (True, "even integer"), ("4", "even integer"),
                     (16, "not whole heads")):
        with pytest.raises(FormatError, match=msg):
            LinearEntry(weight_key="w", shape=(8, 16), rope_interleave=bad)
    with pytest.raises(FormatError, match="a bias"):
        LinearEntry(weight_key="w", shape=(8, 16), bias_key="b", rope_interleave=4)
    with pytest.raises(FormatError, match="a layout"):
        LinearEntry(weight_key="w", shape=(8, 16), layout="trit-tile16x128", rope_interleave=4)
    # a fused part: whole heads of its own rows
    LinearEntry(weight_key="w", shape=(24, 16), rows=(8, 16), rope_interleave=8)
    with pytest.raises(FormatError, match="not whole heads"):
        LinearEntry(weight_key="w", shape=(24, 16), rows=(8, 20), rope_interleave=8)


def test_rope_rows_permutes_per_output_tensors_only():
    e = LinearEntry(weight_key="w", shape=(8, 4), rope_interleave=4)
    v = torch.arange(8).reshape(8, 1).expand(8, 4)
    assert rope_rows(v, e)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert rope_rows(torch.arange(8.0), e).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]  # a row scale
    one = torch.ones(1, 1)
    assert rope_rows(one, e) is one and rope_rows(None, e) is None  # broadcast multiplier, nothing
    assert rope_rows(v, LinearEntry(weight_key="w", shape=(8, 4))) is v


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _finding(res):
    return next(f for f in res.findings if f.what == "q / k row order")


def _recovered(out: Path, spec, truth) -> None:
    ck = Checkpoint(out)
    for mod, t in truth.ternary.items():
        assert torch.equal(decode_linear(ck, spec.linears[mod], mod).values.to(torch.int8), t), mod


def test_bitnet_gpu_rows_recovered_by_names_and_by_loss(logical, tmp_path):
    """The BitNet GPU layout (q / k interleaved): the names alone set rope_interleave (medium), the loss confirms
    it (high, ~1.4 nats apart on the trained model); every module decodes to transformers' rows."""
    out = tmp_path / "gpu"
    truth = synth.write("bitnet-gpu", logical, out)
    hd = ModelConfig.load(out).head_dim
    for use_loss in (False, True):
        res = inspect_dir(out, use_loss=use_loss)
        f = _finding(res)
        assert f.decision.startswith("interleaved-RoPE order") and "['wqkv']" in f.evidence
        assert f.confidence == ("high" if use_loss else "medium (names)")
        for mod, e in res.spec.linears.items():
            assert e.rope_interleave == (hd if mod.endswith(("q_proj", "k_proj")) else None), mod
    _recovered(out, res.spec, truth)  # (without text the lanes are a prior's guess: checked with the loss only)
    assert res.loss < 0.3


def test_meta_names_in_transformers_order_are_overruled_by_loss(logical, tmp_path, monkeypatch):
    """Meta-style names over rows that were never permuted (a hand conversion that renamed only): the names say
    interleaved, the loss says as stored, and the loss wins."""
    monkeypatch.setattr(synth, "rope_interleave_rows", lambda w, d: w)
    out = tmp_path / "renamed"
    truth = synth.write("bitnet-gpu", logical, out)
    res = inspect_dir(out)
    f = _finding(res)
    assert f.decision == "as stored (transformers' order)" and "overrules the names" in f.evidence
    assert f.confidence == "high"
    assert all(e.rope_interleave is None for e in res.spec.linears.values())
    _recovered(out, res.spec, truth)
    assert res.loss < 0.3


def _unfused_meta(src: Path, out: Path) -> None:
    """The bitnet-gpu checkpoint with wqkv split into Meta's separate wq / wk / wv (each with its scale)."""
    cfg = ModelConfig.load(src)
    sd = load_file(str(src / "model.safetensors"))
    nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for L in range(cfg.num_layers):
        w = sd.pop(f"layers.{L}.attention.wqkv.weight")
        s = sd.pop(f"layers.{L}.attention.wqkv.weight_scale")
        for i, (name, r0, r1) in enumerate((("wq", 0, nq), ("wk", nq, nq + nkv), ("wv", nq + nkv, nq + 2 * nkv))):
            sd[f"layers.{L}.attention.{name}.weight"] = w[r0:r1].contiguous()
            sd[f"layers.{L}.attention.{name}.weight_scale"] = s[i:i + 1].clone()
    out.mkdir()
    save_file(sd, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            (out / f.name).write_bytes(f.read_bytes())


def test_unfused_meta_wq_wk(logical, tmp_path):
    src = tmp_path / "gpu"
    truth = synth.write("bitnet-gpu", logical, src)
    out = tmp_path / "meta"
    _unfused_meta(src, out)
    res = inspect_dir(out)
    f = _finding(res)
    assert f.decision.startswith("interleaved-RoPE order") and "'wq'" in f.evidence and "'wk'" in f.evidence
    assert f.confidence == "high"
    _recovered(out, res.spec, truth)


def test_validate_names_the_wrong_module_or_head_dim(logical, tmp_path):
    out = tmp_path / "gpu"
    synth.write("bitnet-gpu", logical, out)
    res = inspect_dir(out, use_loss=False)
    cfg, ck = ModelConfig.load(out), Checkpoint(out)
    linears = dict(res.spec.linears)
    v = "model.layers.0.self_attn.v_proj"
    bad = type(res.spec)(name="t", linears={**linears, v: LinearEntry.from_dict(
        {**linears[v].to_dict(), "rope_interleave": cfg.head_dim})}, tensors=res.spec.tensors,
        activation_quant=res.spec.activation_quant)
    with pytest.raises(CheckpointError, match=r"v_proj has rope_interleave .* only q_proj / k_proj"):
        bad.validate(cfg, ck)
    q = "model.layers.0.self_attn.q_proj"
    bad = type(res.spec)(name="t", linears={**linears, q: LinearEntry.from_dict(
        {**linears[q].to_dict(), "rope_interleave": cfg.head_dim // 2})}, tensors=res.spec.tensors,
        activation_quant=res.spec.activation_quant)
    with pytest.raises(CheckpointError, match=f"head_dim {cfg.head_dim}"):
        bad.validate(cfg, ck)


try:  # tests/ as a package or as rootdir-relative modules
    from .vllm_compare import vllm_vs_reference as _vllm_vs_reference
except ImportError:
    from vllm_compare import vllm_vs_reference as _vllm_vs_reference


@pytest.mark.vllm
def test_vllm_unpermutes_unfused_meta_q_k(tmp_path):
    """vLLM's own Llama on Meta's separate wq / wk with interleaved rows: the plugin's shard loaders put the rows
    back (before vLLM narrows them); every canonical tensor against the reference, which reads them through
    finish_linear, and that reference against the transformers-order model it was written from."""
    from reference.make_model import Preset, write_model
    from reference.model import ReferenceModel
    from reference.spec import SPEC_FILENAME

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=41), tmp_path / "base")
    src = tmp_path / "gpu"
    synth.write("bitnet-gpu", synth.Logical.from_dir(base), src)
    d = tmp_path / "meta"
    _unfused_meta(src, d)
    res = inspect_dir(d, use_loss=False)
    # a random model gives no loss to choose the lanes with (the prior's guess is not the GPU layout's): the
    # format's own PackSpec, everything else (rope_interleave included) as the inspector wrote it
    spec = dataclasses.replace(res.spec, linears={m: dataclasses.replace(e, pack=synth.BITNET_GPU_SPEC)
                                                  for m, e in res.spec.linears.items()})
    spec.save(d / SPEC_FILENAME)
    assert json.loads((d / SPEC_FILENAME).read_text())["linears"]["model.layers.0.self_attn.k_proj"][
        "rope_interleave"] == 32
    ids = torch.randint(3, 89, (1, 12), generator=torch.Generator().manual_seed(0))
    # bf16-stored scales (the GPU layout's) against the base model's: ~0.4% apart, far below a row-order error
    torch.testing.assert_close(ReferenceModel.from_dir(d).forward(ids), ReferenceModel.from_dir(base).forward(ids),
                               rtol=0.05, atol=0.05)
    _vllm_vs_reference(d, 89, 2, "llama")


def _meta_to_hf_names(src: Path, out: Path, only: tuple = ("wq", "wk", "wv", "wo")) -> None:
    """The unfused Meta checkpoint with some attention tensors renamed to transformers' names (rows untouched): a
    conversion that renamed without permuting."""
    hf = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}
    sd = load_file(str(src / "model.safetensors"))
    renamed = {}
    for k, v in sd.items():
        parts = k.split(".")
        if len(parts) >= 4 and parts[0] == "layers" and parts[2] == "attention" and parts[3] in only:
            k = f"model.layers.{parts[1]}.self_attn.{hf[parts[3]]}." + ".".join(parts[4:])
        renamed[k] = v
    out.mkdir()
    save_file(renamed, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            (out / f.name).write_bytes(f.read_bytes())


@pytest.mark.parametrize("only", [("wk",), ("wq", "wk", "wv", "wo")])
def test_interleaved_rows_under_other_names_found_by_loss(logical, tmp_path, only):
    """Interleaved q / k rows whatever the names: k renamed to transformers' k_proj beside a Meta wq (the names
    would un-permute q only), or every attention tensor under transformers' names (the names say nothing). The
    loss takes every q / k module interleaved (0.15 nats against 1.5 / 7)."""
    src = tmp_path / "gpu"
    truth = synth.write("bitnet-gpu", logical, src)
    meta = tmp_path / "meta"
    _unfused_meta(src, meta)
    out = tmp_path / "renamed"
    _meta_to_hf_names(meta, out, only)
    res = inspect_dir(out)
    f = _finding(res)
    assert f.decision.startswith("interleaved-RoPE order") and " only" not in f.decision, f
    assert "overrules the names" in f.evidence and f.confidence == "high"
    hd = ModelConfig.load(out).head_dim
    assert all(e.rope_interleave == (hd if m.endswith(("q_proj", "k_proj")) else None)
               for m, e in res.spec.linears.items())
    _recovered(out, res.spec, truth)
    assert res.loss < 0.3


def test_online_absmean_rows_unpermuted_by_the_reference(tmp_path):
    """A float latent weight quantized online (transformers' online BitNet mode) with interleaved q / k rows: the
    reference puts the values' rows back as the vLLM plugin's loader does (the multiplier is the whole matrix's)."""
    from reference.make_model import Preset, to_online, write_model
    from reference.spec import spec_for

    a = write_model(Preset("bitnet", 128, 192, 2, 4, 2, 89, False, linear_class="autobitlinear", seed=5),
                    tmp_path / "a")
    to_online(a)
    cfg = ModelConfig.load(a)
    spec = spec_for(a)
    q = "model.layers.0.self_attn.q_proj"
    sd = load_file(str(a / "model.safetensors"))
    sd[spec.linears[q].weight_key] = synth.rope_interleave_rows(sd[spec.linears[q].weight_key], cfg.head_dim)
    b = tmp_path / "b"
    b.mkdir()
    save_file(sd, str(b / "model.safetensors"))
    e = dataclasses.replace(spec.linears[q], rope_interleave=cfg.head_dim)
    da, db = decode_linear(Checkpoint(a), spec.linears[q], q), decode_linear(Checkpoint(b), e, q)
    assert e.online == "absmean" and torch.equal(da.values, db.values)
    # mean |W| over the stored order: the same sum in another order (an ulp apart at most)
    torch.testing.assert_close(da.mult, db.mult, rtol=1e-6, atol=0)


def test_transformers_target_refuses_a_checkpoint_it_cannot_load(logical, tmp_path):
    """transformers loads nothing of a Meta-named checkpoint and initialises every weight at random; the target
    said 0/45 pass (every layer 'diverged'). Now it names the missing parameters."""
    from parity.targets import get_target

    out = tmp_path / "gpu"
    synth.write("bitnet-gpu", logical, out)
    with pytest.raises(ValueError, match=r"no checkpoint tensor for \d+ of its parameters .* at random"):
        get_target("transformers").capture(out, torch.zeros(1, 4, dtype=torch.long))


def test_online_mode_under_meta_names_is_refused_by_name(tmp_path):
    """quantization_mode online is transformers' (its own tensor names); Meta-named latent weights under it used to
    end in a KeyError-like 'no tensor model.layers.0...' from the config path; now the inspector names the tensor."""
    from reference.inspect import InspectError
    from reference.make_model import Preset, to_online, write_model

    a = write_model(Preset("bitnet", 128, 192, 2, 4, 2, 89, False, linear_class="autobitlinear", seed=5),
                    tmp_path / "a")
    to_online(a)
    sd = load_file(str(a / "model.safetensors"))
    meta = {}
    for k, v in sd.items():
        base, suf = (k[:-len(".weight")], ".weight") if k.endswith(".weight") else (k, "")
        meta[synth.rename(base, "meta") + suf] = v
    (a / "model.safetensors").unlink()
    save_file(meta, str(a / "model.safetensors"))
    with pytest.raises(InspectError, match=r"layers\.0\.attention\.wo\.weight .* quantization_mode online .* not under "
                                           r"transformers' name"):
        inspect_dir(a, use_loss=False)


def _with_qkv_bias(out: Path, meta: bool = False) -> None:
    """Zero q / k / v / o biases (attention_bias: true, which gives o_proj a bias too in transformers and vLLM) on a
    written checkpoint: under transformers' or Meta's names."""
    cfg = ModelConfig.load(out)
    sd = load_file(str(out / "model.safetensors"))
    for L in range(cfg.num_layers):
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        for m, wm, n in (("q_proj", "wq", q), ("k_proj", "wk", kv), ("v_proj", "wv", kv),
                         ("o_proj", "wo", cfg.hidden_size)):
            key = f"layers.{L}.attention.{wm}.bias" if meta else f"model.layers.{L}.self_attn.{m}.bias"
            sd[key] = torch.zeros(n)
    save_file(sd, str(out / "model.safetensors"))
    c = json.loads((out / "config.json").read_text())
    c["attention_bias"] = True
    (out / "config.json").write_text(json.dumps(c))


def test_q_k_biases_keep_their_rows(logical, tmp_path):
    """A bias cannot be un-permuted (vLLM's own loader reads it): the order search leaves biased q / k modules out
    (it crashed every inspection with text of a biased model); under Meta names they are read as stored, said low."""
    out = tmp_path / "hf"
    synth.write("hf-bitlinear", logical, out)
    _with_qkv_bias(out)
    res = inspect_dir(out)
    assert not any(f.what == "q / k row order" for f in res.findings) and res.loss < 0.3
    src = tmp_path / "gpu"
    synth.write("bitnet-gpu", logical, src)
    meta = tmp_path / "meta"
    _unfused_meta(src, meta)
    _with_qkv_bias(meta, meta=True)
    res = inspect_dir(meta)
    f = _finding(res)
    assert f.decision == "as stored (transformers' order)" and f.confidence == "low" and "a bias" in f.evidence
    assert all(e.rope_interleave is None for e in res.spec.linears.values())


def test_transformers_target_refuses_interleaved_rows(logical, tmp_path):
    """transformers reads q / k rows as stored: a directory whose spec un-permutes them is no oracle case."""
    from parity.targets import get_target
    from reference.spec import SPEC_FILENAME

    out = tmp_path / "gpu"
    synth.write("bitnet-gpu", logical, out)
    inspect_dir(out, use_loss=False).spec.save(out / SPEC_FILENAME)
    with pytest.raises(ValueError, match=r"interleaved-RoPE order \(rope_interleave\), which transformers does not"):
        get_target("transformers").capture(out, torch.zeros(1, 4, dtype=torch.long))


def test_transformers_target_missing_head_says_why(tmp_path):
    from parity.targets import get_target
    from reference.make_model import Preset, write_model

    d = write_model(Preset("llama", 64, 96, 1, 2, 1, 50, True, seed=3), tmp_path / "m")
    c = json.loads((d / "config.json").read_text())
    c.pop("tie_word_embeddings", None)
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=r"\['lm_head.weight'\].* tie_word_embeddings is false or absent"):
        get_target("transformers").capture(d, torch.zeros(1, 4, dtype=torch.long))
