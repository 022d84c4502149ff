"""1bitLLM's BitnetForCausalLM (1bitLLM/bitnet_b1_58-large, -xl, -3B: config model_type llama, architectures
BitnetForCausalLM, weight_bits 1 / input_bits 8, no quantization_config; float latent weights ternarised on the
fly; sub-norms self_attn.inner_attn_ln / mlp.ffn_layernorm): read as transformers' BitNet with hidden_act silu in
its online mode (reference.config.ONEBIT_LLM), by the reference, the spec, the inspector and the vLLM plugin; the
transformers target refuses it (transformers would build a float Llama)."""
import json

import pytest
import torch

from reference.checkpoint import CheckpointError
from reference.config import ONEBIT_LLM_QUANTIZATION, ModelConfig
from reference.make_model import Preset, to_onebit_llm, to_online, write_model
from reference.model import ReferenceModel
from reference.spec import spec_for

#: hidden 128 / 4 heads: head_dim 32, which vLLM's CPU attention runs
PRESET = Preset("bitnet", 128, 96, 2, 4, 4, 67, False, linear_class="autobitlinear", seed=21)


@pytest.fixture(scope="module")
def onebit(tmp_path_factory):
    return to_onebit_llm(write_model(PRESET, tmp_path_factory.mktemp("onebit") / "m"), seed=3)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The same weights as transformers' BitNet online checkpoint with hidden_act silu."""
    d = to_online(write_model(PRESET, tmp_path_factory.mktemp("twin") / "m"), seed=3)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "silu"
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_config_reads_as_online_bitnet_with_llama_defaults(onebit):
    """arch bitnet, hidden_act from the file (silu), the quantization config.json implies; absent fields take
    LlamaConfig's defaults (model_type llama): num_key_value_heads = heads, rms_norm_eps 1e-6, rope_theta 1e4."""
    raw = json.loads((onebit / "config.json").read_text())
    assert "quantization_config" not in raw and raw["architectures"] == ["BitnetForCausalLM"]
    cfg = ModelConfig.load(onebit)
    assert (cfg.arch, cfg.hidden_act, cfg.quantization) == ("bitnet", "silu", ONEBIT_LLM_QUANTIZATION)
    bare = {k: v for k, v in raw.items() if k not in ("num_key_value_heads", "rms_norm_eps", "rope_parameters",
                                                      "hidden_act")}
    c = ModelConfig.from_dict(bare)
    assert (c.num_kv_heads, c.rms_norm_eps, c.rope.theta, c.hidden_act) == (4, 1e-6, 10000.0, "silu")


@pytest.mark.parametrize("key,value", [("weight_bits", 2), ("input_bits", 4)])
def test_other_bit_settings_are_refused(onebit, key, value):
    raw = json.loads((onebit / "config.json").read_text())
    with pytest.raises(CheckpointError, match=rf"BitnetForCausalLM \(1bitLLM\) with {key}={value}: only the b1.58 "
                                              rf"setting"):
        ModelConfig.from_dict({**raw, key: value})


def test_reference_matches_the_transformers_bitnet_twin_bit_for_bit(onebit, twin):
    """The spec maps the sub-norms to 1bitLLM's names; logits equal those of the transformers-named twin."""
    spec = spec_for(onebit)
    assert spec.tensors["model.layers.1.self_attn.attn_sub_norm.weight"] == "model.layers.1.self_attn.inner_attn_ln.weight"
    assert spec.tensors["model.layers.0.mlp.ffn_sub_norm.weight"] == "model.layers.0.mlp.ffn_layernorm.weight"
    assert all(e.online == "absmean" for e in spec.linears.values()) and "lm_head" not in spec.linears
    ids = torch.randint(3, 67, (2, 11), generator=torch.Generator().manual_seed(0))
    a, b = ReferenceModel.from_dir(onebit).forward(ids), ReferenceModel.from_dir(twin).forward(ids)
    assert torch.equal(a, b)
    plain = json.loads((twin / "config.json").read_text())
    plain["hidden_act"] = "relu2"
    (twin / "config.json").write_text(json.dumps(plain))
    assert not torch.equal(a, ReferenceModel.from_dir(twin).forward(ids))  # the activation matters
    plain["hidden_act"] = "silu"
    (twin / "config.json").write_text(json.dumps(plain))


def test_a_missing_sub_norm_is_named_under_1bitllms_spelling(onebit, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "m"
    shutil.copytree(onebit, d)
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.1.mlp.ffn_layernorm.weight"]
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no tensor 'model.layers.1.mlp.ffn_layernorm.weight'"):
        ReferenceModel.from_dir(d)


def test_inspector_reads_it_as_online_ternary(onebit):
    from reference.inspect import inspect_dir

    res = inspect_dir(onebit, use_loss=False)
    assert res.spec.name.endswith("online") and len(res.spec.linears) == 14
    assert any(f.what == "online quantization" for f in res.findings)


def test_transformers_target_refuses_it(onebit):
    from parity.targets import get_target

    with pytest.raises(ValueError, match=r"BitnetForCausalLM \(1bitLLM\) is remote code.*float LlamaForCausalLM "
                                         r"without the sub-norms or the ternarisation"):
        get_target("transformers").load(onebit)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_serves_it_within_fp32_a8_of_the_reference(onebit):
    """vLLM: BitnetForCausalLM registered as the plugin's BitNet model, the implied quantization_config passed as
    hf_overrides, the sub-norms loaded under 1bitLLM's names; every canonical tensor within the fp32-a8 tiers."""
    try:  # tests/ as a package or as rootdir-relative modules
        from .vllm_compare import vllm_vs_reference
    except ImportError:
        from vllm_compare import vllm_vs_reference
    c = vllm_vs_reference(onebit, 67, 2, "bitnet")
    assert c.topk.top1_agree == 1.0, c.summary()


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_without_the_quantization_config_names_the_override(onebit):
    """Served without hf_overrides, vLLM would build float linears: the plugin's BitNet model refuses, naming the
    quantization_config to pass."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import trit.vllm
    from vllm import LLM

    trit.vllm.register()
    with pytest.raises(Exception, match=r"BitnetForCausalLM \(1bitLLM\) stores float latent weights.*pass "
                                        r"hf_overrides"):
        LLM(model=str(onebit), dtype="float32", enforce_eager=True, max_model_len=64, skip_tokenizer_init=True)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_tp2_matches_the_reference(onebit):
    """TP = 2 (worker processes: the override travels in hf_overrides; the sub-norm over the intermediate split
    across ranks): top-10 next tokens against the fp32 reference."""
    from parity.compare import topk_ids_agreement
    from parity.targets.vllm import VllmTarget
    from parity.tolerances import column, resolve

    ids = torch.randint(3, 67, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = ReferenceModel.from_dir(onebit).forward(ids)
    limit = resolve(column("fp32", spec_for(onebit).activation_quant, bit_faithful=False))["model"].limit(
        float(logits.abs().max()))
    tk = topk_ids_agreement(VllmTarget("fp32", tensor_parallel_size=2).topk_ids(onebit, ids, 10), logits, limit)
    assert tk.passed and tk.top1_agree == 1.0, tk
