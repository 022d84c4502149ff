"""Config variants a user's checkpoint may bring: quantization_config.modules_to_not_convert (some linears
kept in float next to packed ones), read as transformers reads it, by the reference, the inspector and
(tests/test_vllm_families.py) the vLLM plugin."""
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from parity.names import canonical_names
from parity.targets import get_target
from reference.checkpoint import CheckpointError
from reference.config import ModelConfig
from reference.make_model import Preset, config_dict, make_state_dict, write_model
from reference.spec import linear_modules, spec_from_hf_bitnet


def with_float_modules(p: Preset, d, patterns, mods):
    """write preset p to d with modules_to_not_convert = patterns and the linears mods stored as plain floats
    (as transformers saves a module it did not convert)."""
    write_model(p, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = patterns
    (d / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(d / "model.safetensors"))
    fl = make_state_dict(dataclasses.replace(p, quantized=False))
    for m in mods:
        for k in [k for k in sd if k.startswith(m + ".")]:
            del sd[k]
        sd.update({k: v for k, v in fl.items() if k.startswith(m + ".")})
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


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
