"""Config variants a user's checkpoint may bring: quantization_config.modules_to_not_convert (some linears
kept in float next to packed ones), read as transformers reads it, by the reference, the inspector and
(tests/test_vllm_families.py) the vLLM plugin."""
import pytest
import torch

from parity.names import canonical_names
from parity.targets import get_target
from reference.checkpoint import CheckpointError
from reference.config import ModelConfig
from reference.make_model import Preset, config_dict, keep_float, write_model
from reference.spec import linear_modules, spec_from_hf_bitnet


def with_float_modules(p: Preset, d, patterns, mods):
    return keep_float(write_model(p, d), p, patterns, mods)


PATTERNS = [["model.layers.*.mlp.down_proj", "lm_head"],  # a regular expression
            ["model.layers.1"],  # a prefix: transformers' re.match also catches layers 10 and 11
            ["down_proj", "self_attn.q_proj"],  # name endings
            ["model.layers.0.self_attn", "lm_head"],
            ["model.layers.1[01].mlp"]]


@pytest.mark.parametrize("patterns", PATTERNS, ids=lambda p: p[0])
def test_modules_to_not_convert_as_transformers_reads_it(patterns):
    """The linears the spec keeps in float are exactly those transformers' quantizer leaves as nn.Linear
    (quantizers_utils.should_convert_module: re.match from the start, or the name's ending)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    c = config_dict(Preset("llama", 64, 96, 12, 4, 2, 67, False))
    c["quantization_config"]["modules_to_not_convert"] = patterns
    cfg = ModelConfig.from_dict(c)
    spec = spec_from_hf_bitnet(cfg)
    kept = {m for m in linear_modules(cfg) if m not in spec.linears}
    assert kept == {m for m in linear_modules(cfg) if not should_convert_module(m, patterns)}
    assert kept and all(spec.tensors[m + ".weight"] == m + ".weight" for m in kept)


def test_modules_to_not_convert_bad_pattern_is_named():
    c = config_dict(Preset("llama", 64, 96, 1, 4, 2, 67, False))
    c["quantization_config"]["modules_to_not_convert"] = ["model.layers.(0"]
    with pytest.raises(CheckpointError, match=r"modules_to_not_convert: 'model.layers.\(0' is not a valid regular"):
        spec_from_hf_bitnet(ModelConfig.from_dict(c))


def test_modules_to_not_convert_regex_matches_transformers(tmp_path):
    """A regex entry (model.layers.*.mlp.down_proj): both down_proj linears stored in float; the reference
    reads them as plain linears and matches transformers on every captured tensor."""
    p = Preset("llama", 64, 96, 2, 4, 2, 67, False, seed=51)
    d = with_float_modules(p, tmp_path / "m", ["model.layers.*.mlp.down_proj", "lm_head"],
                           [f"model.layers.{i}.mlp.down_proj" for i in range(2)])
    ids = torch.randint(3, 67, (2, 23), generator=torch.Generator().manual_seed(7))
    ref = get_target("reference").capture(d, ids)
    hf = get_target("transformers").capture(d, ids)
    for n in canonical_names(2, "llama"):
        rel = float((ref[n] - hf[n]).abs().max() / hf[n].abs().max())
        assert rel <= 1e-5, f"{n} differs from transformers by {rel:.2e} relative"


@pytest.mark.parametrize("arch", ["bitnet", "llama"])
def test_inspector_keeps_float_linears_of_a_ternary_checkpoint_in_float(arch, tmp_path):
    """A ternary checkpoint with some linears kept in float (modules_to_not_convert): the inspector maps them
    to float tensors (plain linears, no int8 activation quantisation, as transformers runs them), not to linear
    entries that the spec's activation_quant would apply to; its spec computes what config.json's does."""
    from reference.inspect import main as inspect_main
    from reference.spec import CheckpointSpec

    p = Preset(arch, 64, 96, 2, 4, 2, 67, arch == "bitnet", seed=52)
    mods = [f"model.layers.0.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj", "o_proj")]
    d = with_float_modules(p, tmp_path / "m", ["model.layers.0.self_attn", "lm_head"], mods)
    out = tmp_path / "spec.json"
    assert inspect_main([str(d), "--no-loss", "--out", str(out)]) == 0
    spec = CheckpointSpec.load(out)
    assert not set(mods) & set(spec.linears) and all(spec.tensors[m + ".weight"] == m + ".weight" for m in mods)
    assert "model.layers.1.self_attn.q_proj" in spec.linears
    ids = torch.randint(3, 67, (2, 23), generator=torch.Generator().manual_seed(7))
    ref = get_target("reference").capture(d, ids)
    ins = get_target("reference").capture(d, ids, spec_path=out)
    for n in ref:
        assert torch.equal(ref[n], ins[n]), n


def _set_quant(d, **kv):
    import json

    c = json.loads((d / "config.json").read_text())
    c["quantization_config"].update(kv)
    (d / "config.json").write_text(json.dumps(c))


def test_inspector_names_exclusion_lists_that_contradict_the_tensors(tmp_path):
    """modules_to_not_convert naming a module stored packed, or leaving out one stored as plain floats: the
    inspector decodes what is stored (same spec as with a consistent list) and says so in one finding naming the
    modules, their tensors and the entry; a consistent list gives no such finding."""
    from reference.inspect import inspect_dir

    p = Preset("bitnet", 64, 96, 2, 4, 2, 67, True, seed=52)
    mods = [f"model.layers.0.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj", "o_proj")]
    d = with_float_modules(p, tmp_path / "m", ["model.layers.0.self_attn", "lm_head"], mods)
    good = inspect_dir(d, use_loss=False)
    assert not [f for f in good.findings if f.what == "config vs tensors"]
    _set_quant(d, modules_to_not_convert=["model.layers.0.self_attn.q_proj", "down_proj", "lm_head"])
    res = inspect_dir(d, use_loss=False)
    assert res.spec == good.spec
    (f,) = [f for f in res.findings if f.what == "config vs tensors"]
    assert f.confidence == "medium (config contradicted)"
    assert ("listed as kept in float but stored quantized (decoded as stored): model.layers.0.mlp.down_proj "
            "('model.layers.0.mlp.down_proj.weight' U8 [16, 96]; modules_to_not_convert entry 'down_proj')") in f.evidence
    assert "model.layers.1.mlp.down_proj" in f.evidence
    assert ("stored as plain float, which the list would quantize (kept in float): model.layers.0.self_attn.k_proj "
            "('model.layers.0.self_attn.k_proj.weight' F32)") in f.evidence
    assert "self_attn.q_proj (" not in f.evidence  # listed and float: consistent


def test_inspector_names_a_compressed_tensors_ignore_list_that_contradicts_the_tensors(tmp_path):
    """compressed-tensors: an ``ignore`` entry (exact name or 're:') naming a packed module is a finding; a float
    module that a config group's targets cover without an ignore entry too; one no target covers is not."""
    from pathlib import Path

    from reference import synth
    from reference.inspect import inspect_dir

    out = tmp_path / "ct"
    synth.write("compressed-tensors", synth.Logical.from_dir(Path(__file__).parents[1] / "models" / "tiny-trained"),
                out)
    base = inspect_dir(out, use_loss=False)
    assert not [f for f in base.findings if f.what == "config vs tensors"]
    _set_quant(out, ignore=["lm_head", "re:.*layers\\.1\\.mlp\\.up_proj$"])
    res = inspect_dir(out, use_loss=False)
    assert res.spec == base.spec
    (f,) = [f for f in res.findings if f.what == "config vs tensors"]
    assert "model.layers.1.mlp.up_proj (" in f.evidence and "ignore entry 're:" in f.evidence
    assert "stored as plain float" not in f.evidence


@pytest.mark.parametrize("tie", [False, True])
def test_transformers_target_refuses_modules_to_not_convert_without_lm_head(tie, tmp_path):
    """transformers adds lm_head to its skips only when modules_to_not_convert is null; a list without it makes
    lm_head a BitLinear, which the float head (or tied embedding) does not fit: the oracle target says so
    instead of a shape error mid-forward, and the reference (float lm_head, as vLLM) still runs."""
    p = Preset("llama", 64, 96, 1, 4, 2, 67, tie, seed=53)
    d = with_float_modules(p, tmp_path / "m", ["down_proj"], ["model.layers.0.mlp.down_proj"])
    ids = torch.arange(3, 9).reshape(1, -1)
    with pytest.raises(ValueError, match=r"m/config.json: quantization_config.modules_to_not_convert=\['down_proj'\] "
                                         r"does not list 'lm_head'"):
        get_target("transformers").capture(d, ids)
    assert torch.isfinite(get_target("reference").capture(d, ids)["logits"]).all()


@pytest.mark.parametrize("field,value,match", [
    ("hidden_size", None, r"hidden_size is None; expected a positive integer"),
    ("num_hidden_layers", None, r"num_hidden_layers is None"),
    ("intermediate_size", "abc", r"intermediate_size is 'abc'"),
    ("num_attention_heads", 12.5, r"num_attention_heads is 12.5"),  # was truncated to 12
    ("num_key_value_heads", 2.5, r"num_key_value_heads is 2.5"),  # was truncated to 2
    ("num_key_value_heads", -2, r"num_key_value_heads is -2"),  # passed the GQA check, failed in the forward
    ("num_key_value_heads", "2", r"num_key_value_heads is '2'"),
    ("head_dim", 32.5, r"head_dim is 32.5"),  # was truncated to 32
    ("head_dim", -32, r"head_dim is -32"),
    ("vocab_size", 0, r"vocab_size is 0"),
    ("vocab_size", True, r"vocab_size is True"),
    ("max_position_embeddings", None, r"wrong type \(TypeError"),
    ("rope_parameters", [1], r"wrong type \(TypeError: rope_parameters is list \[1\], not a dict"),
])
def test_config_fields_of_the_wrong_type_are_named(field, value, match):
    """A config.json field of the wrong type gave a raw traceback (TypeError from int(None)) or an error naming
    neither file nor field; a fractional head count was silently truncated."""
    d = config_dict(Preset("llama", 96, 200, 2, 6, 2, 89, False))
    d[field] = value
    with pytest.raises(CheckpointError, match=r"^/x/config\.json: .*" + match):
        ModelConfig.from_dict(d, where="/x/config.json")
    with pytest.raises(CheckpointError, match=r"/x/config\.json: expected a JSON object .* got a list"):
        ModelConfig.from_dict([d], where="/x/config.json")
    assert ModelConfig.from_dict(config_dict(Preset("llama", 96, 200, 2, 6, 2, 89, False))).hidden_size == 96


def test_transformers_target_names_packed_weights_without_a_quantization_config(tmp_path):
    """Packed HF-BitNet weights with the quantization_config removed: transformers would build float linears and fail
    with a size-mismatch dump; the target names the tensor, its dtype and what to use instead."""
    import json

    d = write_model(Preset("llama", 64, 96, 1, 4, 2, 67, False, seed=3), tmp_path / "m")
    c = json.loads((d / "config.json").read_text())
    c.pop("quantization_config")
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight is stored as U8 \[16, 64\] "
                                         r"\(7 such linear weights\) and config\.json has no quantization_config"):
        get_target("transformers").capture(d, torch.zeros(1, 4, dtype=torch.long))


def test_bitnet_ignores_mlp_bias_as_transformers_does():
    """transformers' BitNetMLP has bias=False whatever config.json says (BitNetConfig has no mlp_bias): the reference
    needed biases transformers never loads (a checkpoint without them was refused, one with them diverged from
    transformers and vLLM at the first gate_proj). Llama keeps its mlp_bias."""
    from reference.config import ModelConfig
    base = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 97, "mlp_bias": True}
    assert not ModelConfig.from_dict({**base, "architectures": ["BitNetForCausalLM"]}).mlp_bias
    assert ModelConfig.from_dict({**base, "architectures": ["LlamaForCausalLM"]}).mlp_bias


@pytest.mark.parametrize("arch,model_type", [("bitnet", "llama"), ("llama", "bitnet")])
def test_absent_fields_take_the_defaults_of_model_types_config_class(arch, model_type, tmp_path):
    """architectures and model_type of different families (BitNetForCausalLM with model_type llama, or the reverse)
    and no rms_norm_eps / rope_theta / hidden_act / num_key_value_heads: transformers' AutoConfig and vLLM build
    model_type's config class and take its defaults; the reference took the architecture's (vLLM passed 5 of 31
    tensors, first divergence at layer0.attn.attn_out). transformers builds model_type's model class too: that
    target names the mismatch instead of failing on a missing sub-norm mid-capture."""
    from transformers import BitNetConfig, LlamaConfig

    d = config_dict(Preset(arch, 160, 200, 1, 5, 5, 89, True))
    for k in ("rms_norm_eps", "rope_parameters", "hidden_act", "num_key_value_heads"):
        del d[k]
    d["model_type"] = model_type
    c = ModelConfig.from_dict(d)
    t = {"llama": LlamaConfig, "bitnet": BitNetConfig}[model_type](hidden_size=160, num_attention_heads=5)
    assert c.arch == arch
    assert (c.rms_norm_eps, c.rope.theta, c.hidden_act, c.num_kv_heads) == (
        t.rms_norm_eps, t.rope_parameters["rope_theta"], t.hidden_act, t.num_key_value_heads)
    m = write_model(Preset(arch, 64, 96, 1, 2, 2, 67, True, seed=54), tmp_path / "m")
    import json

    cfg = json.loads((m / "config.json").read_text())
    cfg["model_type"] = model_type
    (m / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=rf"m/config\.json: architectures \[.*\] \(a {arch} model\) but model_type "
                                         rf"'{model_type}': transformers builds its {model_type} class"):
        get_target("transformers").capture(m, torch.arange(3, 9).reshape(1, -1))
