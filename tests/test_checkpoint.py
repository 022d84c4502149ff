"""Bad input to the reference loader: clear errors naming file, tensor and expectation."""
import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import save_file

from parity.dump import DEFAULT_MODEL
from reference.checkpoint import Checkpoint, CheckpointError, read_header
from reference.model import ReferenceModel


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, d)
    return d


def _rewrite(d, fn):
    from safetensors.torch import load_file
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


def test_truncated_file(model):
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor .*truncated"):
        Checkpoint(model)


def test_header_lies_about_offsets(tmp_path):
    f = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(4)}, str(f))
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h["b"]["data_offsets"] = [8, 24]  # overlaps a
    hb = json.dumps(h).encode()
    f.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    with pytest.raises(CheckpointError, match="overlap"):
        read_header(f)


def test_garbage_and_tiny_files(tmp_path):
    f = tmp_path / "x.safetensors"
    f.write_bytes(b"\x05")
    with pytest.raises(CheckpointError, match="too short"):
        read_header(f)
    f.write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_header(f)


def test_pickle_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(CheckpointError, match="refusing to load a pickle.*safetensors"):
        Checkpoint(tmp_path)


def test_nan_scale(model):
    _rewrite(model, lambda sd: sd.__setitem__("model.layers.1.self_attn.k_proj.weight_scale",
                                              torch.tensor([float("nan")])))
    with pytest.raises(CheckpointError, match=r"k_proj.weight_scale.*NaN"):
        ReferenceModel.from_dir(model)


def test_zero_divided_scale(model):
    _rewrite(model, lambda sd: sd.__setitem__("model.layers.0.mlp.up_proj.weight_scale", torch.tensor([0.0])))
    with pytest.raises(CheckpointError, match=r"up_proj.*zero"):
        ReferenceModel.from_dir(model)


def test_unknown_key(model):
    _rewrite(model, lambda sd: sd.__setitem__("model.layers.0.mystery", torch.zeros(3)))
    with pytest.raises(CheckpointError, match=r"not used by spec.*model.layers.0.mystery"):
        ReferenceModel.from_dir(model)


def test_missing_key(model):
    _rewrite(model, lambda sd: sd.pop("model.layers.2.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"no tensor 'model.layers.2.mlp.down_proj.weight'"):
        ReferenceModel.from_dir(model)


def test_wrong_packed_shape(model):
    _rewrite(model, lambda sd: sd.__setitem__("model.layers.0.self_attn.q_proj.weight",
                                              torch.zeros(31, 128, dtype=torch.uint8)))
    with pytest.raises(CheckpointError, match=r"q_proj.weight' has shape \[31, 128\].*needs \[32, 128\]"):
        ReferenceModel.from_dir(model)


def test_config_inconsistent_with_shapes(model):
    cfg = json.loads((model / "config.json").read_text())
    cfg["intermediate_size"] = 352
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"gate_proj.weight' has shape \[86, 128\].*needs \[88, 128\]"):
        ReferenceModel.from_dir(model)


def test_unused_code_occurs(model):
    def plant(sd):
        w = sd["model.layers.3.mlp.up_proj.weight"]
        w[5, 7] = 0b11  # code 3 is unused in HF-BitNet
    _rewrite(model, plant)
    with pytest.raises(CheckpointError, match=r"up_proj.weight.*code 3 .*unused"):
        ReferenceModel.from_dir(model)


def test_sharded_index_consistency(tmp_path):
    save_file({"a": torch.zeros(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(2)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    idx = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match="maps 'b' to model-00001"):
        Checkpoint(tmp_path)
    idx["weight_map"]["b"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    assert sorted(Checkpoint(tmp_path).keys()) == ["a", "b"]


def test_sharded_index_names_a_missing_shard(tmp_path):
    """A shard the index lists but the directory lacks (an interrupted download) is named as missing,
    not reported as a tensor no shard holds."""
    save_file({"a": torch.zeros(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    idx = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors: shard listed in "
                                              r"model\.safetensors\.index\.json is missing \(1 tensors mapped to it, e\.g\. 'b'\)"):
        Checkpoint(tmp_path)


def test_sharded_index_ignores_files_it_does_not_list(tmp_path):
    """With an index, the checkpoint is the shards it lists (vLLM reads it so, and transformers where no
    model.safetensors exists): a consolidated copy of the same tensors beside the shards is not a duplicate-tensor
    error."""
    save_file({"a": torch.zeros(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(2)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    save_file({"a": torch.zeros(2), "b": torch.ones(2)}, str(tmp_path / "consolidated.safetensors"))
    idx = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    ck = Checkpoint(tmp_path)
    assert sorted(ck.keys()) == ["a", "b"] and ck.info("b").file.name == "model-00002-of-00002.safetensors"


def test_a_stale_single_file_beside_an_index_is_named(tmp_path):
    """model.safetensors beside a sharded index that does not list it: transformers loads model.safetensors (it looks
    for it before the index), vLLM and the harness the index's shards - the targets would run different weights (a
    stale one-file copy with other scales decoded silently before).  Named, with both files."""
    save_file({"a": torch.zeros(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(2)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    save_file({"a": torch.zeros(2), "b": 2 * torch.ones(2)}, str(tmp_path / "model.safetensors"))
    idx = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match=r"holds both model\.safetensors and model\.safetensors\.index\.json "
                                              r"\(shards model-00001-of-00002\.safetensors, model-00002-of-00002\."
                                              r"safetensors\): transformers loads model\.safetensors"):
        Checkpoint(tmp_path)
    idx["weight_map"]["b"] = "model.safetensors"  # listed by the index: one checkpoint (a shard named so)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    save_file({"b": 2 * torch.ones(2)}, str(tmp_path / "model.safetensors"))
    assert sorted(Checkpoint(tmp_path).keys()) == ["a", "b"]


@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize("n", [1, 65])
def test_bias_shape_is_checked(tmp_path, quantized, n):
    """A [1] bias would broadcast silently over the 64 outputs; any other length must name the tensor."""
    import dataclasses
    from reference.make_model import PRESETS, write_model
    d = write_model(dataclasses.replace(PRESETS["oracle-llama-bias"], quantized=quantized), tmp_path / "m")
    key = "model.layers.1.self_attn.k_proj.bias"  # k_proj: 1 KV head x head_dim 32
    _rewrite(d, lambda sd: sd.__setitem__(key, torch.zeros(n)))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor '{key}' .*has shape \[{n}\], "
                                              rf"config.json implies \[32\]"):
        ReferenceModel.from_dir(d)


def test_rope_inv_freq_buffers_are_skipped(model):
    """Older Llama checkpoints carry each layer's RoPE inverse frequencies
    (``...self_attn.rotary_emb.inv_freq``), a buffer computed from config.json that transformers and
    vLLM skip: the reference and the inspector skip it too (same logits), other extra keys stay errors."""
    from reference.inspect import inspect_dir
    ids = torch.randint(3, 200, (1, 10), generator=torch.Generator().manual_seed(0))
    before = ReferenceModel.from_dir(model).forward(ids)
    hd = 32  # any length: the buffer is never read
    _rewrite(model, lambda sd: sd.update({f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.rand(hd // 2)
                                          for i in range(4)}))
    torch.testing.assert_close(ReferenceModel.from_dir(model).forward(ids), before, rtol=0, atol=0)
    assert inspect_dir(model, use_loss=False).spec is not None
    _rewrite(model, lambda sd: sd.__setitem__("model.layers.0.self_attn.rotary_emb.other", torch.zeros(3)))
    with pytest.raises(CheckpointError, match="rotary_emb.other"):
        ReferenceModel.from_dir(model)


@pytest.mark.parametrize("key", ["model.embed_tokens.weight", "model.layers.1.post_attention_layernorm.weight"])
def test_nan_float_parameter(model, key):
    """A NaN in a float parameter (an embedding row, a norm weight) is named at load, not found later
    as NaN logits."""
    def poison(sd):
        sd[key] = sd[key].clone()
        sd[key].view(-1)[3] = float("nan")
    _rewrite(model, poison)
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor '{key}'.*1 NaN/Inf"):
        ReferenceModel.from_dir(model)



def test_tied_model_with_a_stored_lm_head(model):
    """tie_word_embeddings=true and lm_head.weight stored anyway: a copy of the embedding changes nothing; a
    different one is the output embedding (transformers' tie_weights and vLLM untie then); a wrong shape is
    an error naming the tensor.  Not an 'unknown key'."""
    ids = torch.arange(3, 20).reshape(1, -1)
    want = ReferenceModel.from_dir(model).forward(ids)
    _rewrite(model, lambda sd: sd.__setitem__("lm_head.weight", sd["model.embed_tokens.weight"].clone()))
    assert torch.equal(ReferenceModel.from_dir(model).forward(ids), want)
    head = torch.randn(512, 128, generator=torch.Generator().manual_seed(0)) * 0.02
    _rewrite(model, lambda sd: sd.__setitem__("lm_head.weight", head))
    taps = {}
    logits = ReferenceModel.from_dir(model).forward(ids, tap=lambda n, t: taps.__setitem__(n, t))
    torch.testing.assert_close(logits, taps["final_norm"] @ head.t(), rtol=1e-5, atol=1e-6)
    _rewrite(model, lambda sd: sd.__setitem__("lm_head.weight", torch.zeros(3, 128)))
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' \(lm_head.weight\) has shape \[3, 128\], config.json "
                                              r"implies \[512, 128\] \(tie_word_embeddings=true"):
        ReferenceModel.from_dir(model)


def test_bitnet_config_without_kv_heads_reads_as_transformers_does():
    """A BitNet config.json without num_key_value_heads: transformers' BitNetConfig (and vLLM, which loads
    it) assume 5, not num_attention_heads; the reference reads it the same, and where 5 cannot divide the
    heads the error says where the 5 comes from.  An explicit null means num_attention_heads."""
    from transformers import BitNetConfig
    from reference.config import ModelConfig
    from reference.make_model import PRESETS, config_dict
    d = config_dict(PRESETS["bitnet-2b"])
    del d["num_key_value_heads"]
    assert ModelConfig.from_dict(d).num_kv_heads == BitNetConfig(**d).num_key_value_heads == 5
    assert ModelConfig.from_dict({**d, "num_key_value_heads": None}).num_kv_heads == 20
    with pytest.raises(CheckpointError, match=r"num_attention_heads 4 is not a multiple of num_key_value_heads 5 "
                                              r"\(config.json has no num_key_value_heads: transformers' BitNetConfig"):
        ModelConfig.from_dict({**d, "num_attention_heads": 4, "hidden_size": 256})
    llama = {**d, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    assert ModelConfig.from_dict(llama).num_kv_heads == 20  # LlamaConfig: a missing key means MHA


def test_unknown_architecture_with_a_known_model_type_is_refused():
    """architectures names a custom class (MistralForCausalLM with model_type llama): not run as a plain Llama,
    an error naming the key and the supported classes; 1bitLLM's BitnetForCausalLM is read as BitNet
    (tests/test_onebit_llm.py) only under model_type llama. model_type alone (no architectures) and the
    LLaMAForCausalLM spelling still read as Llama."""
    from reference.config import ModelConfig
    from reference.make_model import PRESETS, config_dict
    d = config_dict(PRESETS["oracle-llama-gqa"])
    with pytest.raises(CheckpointError, match=r"config.json: architectures=\['MistralForCausalLM'\] names no class "
                                              r"the reference implements \(BitNetForCausalLM, LlamaForCausalLM"):
        ModelConfig.from_dict({**d, "architectures": ["MistralForCausalLM"]})
    with pytest.raises(CheckpointError, match=r"architectures=\['BitnetForCausalLM'\] names no class"):
        ModelConfig.from_dict({**d, "architectures": ["BitnetForCausalLM"], "model_type": "bitnet"})
    assert ModelConfig.from_dict({k: v for k, v in d.items() if k != "architectures"}).arch == "llama"
    assert ModelConfig.from_dict({**d, "architectures": ["LLaMAForCausalLM"]}).arch == "llama"
