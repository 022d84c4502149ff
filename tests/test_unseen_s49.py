"""Unseen checkpoints and configs (helper pass, session 49): each test failed before its fix."""
from __future__ import annotations

import re

import pytest
import torch

from parity.names import canonical_names
from parity.targets import get_target
from reference.make_model import Preset, to_online, write_model


# ---------------------------------------------------------------------------------------
# transformers target: quantization_mode online is an nn.Linear over the float latent weight


@pytest.mark.parametrize("inter,bias", [(90, False), (96, True)], ids=["inter90", "bias"])
def test_transformers_target_runs_online_odd_rows_and_bias(inter, bias, tmp_path):
    """An online (float latent) BitNet checkpoint with 90 MLP rows (not a multiple of 4), or with attention biases:
    transformers' AutoBitLinear in online mode is an nn.Linear (any shape; F.linear adds the bias, no weight_scale),
    so it is an oracle for it.  The target refused both ('BitLinear cannot hold ... not a multiple of 4' /
    'offline AutoBitLinear multiplies the bias'); it agrees with the reference to the fp32-a8 tier."""
    p = Preset("bitnet", 64, inter, 1, 4, 2, 67, False, seed=46, linear_class="autobitlinear", bias=bias)
    d = to_online(write_model(p, tmp_path / "m"))
    ids = torch.randint(3, 67, (2, 17), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    hf = get_target("transformers").capture(d, ids)
    for n in canonical_names(1, "bitnet"):
        rel = float((ref[n] - hf[n]).abs().max() / hf[n].abs().max())
        assert rel <= 5e-2, f"{n} differs from transformers by {rel:.2e} relative"


# ---------------------------------------------------------------------------------------
# quant_method bitnet, online mode: a converted lm_head over tied embeddings


def test_online_tied_converted_head_is_refused_not_read_as_float(tmp_path):
    """modules_to_not_convert [] (no lm_head), quantization_mode online, tie_word_embeddings true, no lm_head stored:
    transformers makes lm_head an online AutoBitLinear whose weight is the tied embedding, ternarized on the fly
    (logits 0.86 relative away from a float head).  The reference (and vLLM) tied a float head and dumped goldens of
    another model, exit 0; now the config path refuses it, naming the config and the fix."""
    import json

    from reference.checkpoint import Checkpoint, CheckpointError
    from reference.config import ModelConfig
    from reference.spec import spec_from_hf_bitnet

    p = Preset("bitnet", 64, 96, 1, 4, 2, 67, True, seed=47, linear_class="autobitlinear")
    d = to_online(write_model(p, tmp_path / "m"))
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"]["modules_to_not_convert"] = []
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(CheckpointError, match=r"m/config.json: quantization_config.modules_to_not_convert is \[\].*"
                                              r"online AutoBitLinear over the tied embedding.*add 'lm_head'"):
        spec_from_hf_bitnet(ModelConfig.load(d), Checkpoint(d))
    c["quantization_config"]["modules_to_not_convert"] = ["lm_head"]  # the float tied head: read as before
    (d / "config.json").write_text(json.dumps(c))
    assert "lm_head" not in spec_from_hf_bitnet(ModelConfig.load(d), Checkpoint(d)).linears


@pytest.mark.parametrize("field,value,named", [("rms_norm_eps", -1e-6, "rms_norm_eps is -1e-06; expected a number >= 0"),
                                               ("rope_theta", 0, "rope_theta is 0.0; expected a number > 0"),
                                               ("rope_theta", -10000.0, "rope_theta is -10000.0"),
                                               ("max_position_embeddings", 0, "max_position_embeddings is 0")])
def test_config_values_no_norm_or_rope_can_use_are_named(field, value, named, tmp_path):
    """A negative rms_norm_eps or a rope_theta <= 0 passed the config reader (transformers takes them too) and made
    NaN / inf from the first norm or rotary embedding on: the dump named the first non-finite tensor, not the field."""
    import json

    from reference.checkpoint import CheckpointError
    from reference.config import ModelConfig

    p = Preset("bitnet", 64, 96, 1, 4, 2, 67, False, seed=3)
    d = write_model(p, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    where = cfg["rope_parameters"] if field == "rope_theta" else cfg  # the writer keeps theta in rope_parameters
    where[field] = value
    with pytest.raises(CheckpointError, match=re.escape(named)) as e:
        ModelConfig.from_dict(cfg, where=str(d / "config.json"))
    assert "config.json" in str(e.value)
    where[field] = {"rms_norm_eps": 0.0, "rope_theta": 10000.0, "max_position_embeddings": 64}[field]  # valid: accepted
    ModelConfig.from_dict(cfg, where=str(d / "config.json"))
