"""Unseen checkpoints and configs (helper pass, session 51): each test failed before its fix."""
from __future__ import annotations

import json

import pytest
import torch

from parity.names import canonical_names
from parity.targets import get_target
from reference.config import ModelConfig
from reference.make_model import Preset, config_dict, write_model

TINY_LLAMA = Preset("llama", 64, 96, 1, 4, 2, 67, False, seed=51)


# ---------------------------------------------------------------------------------------
# reference.make_model: RoPE scaling written as asked


def test_make_model_reads_the_legacy_rope_scaling_type_key(tmp_path):
    """Preset(rope_scaling={"type": "linear", ...}) - the key configs written before transformers 4.45 use - was
    written beside the writer's rope_type 'default', which wins in transformers (standardize_rope_params) and the
    reference: a model with plain RoPE, although asked for linear scaling, and nothing said so.  Now it is the
    rope_type-spelled config, read as linear by the reference and transformers."""
    from transformers import AutoConfig

    legacy = Preset("llama", 64, 96, 1, 4, 2, 67, False, rope_scaling={"type": "linear", "factor": 4.0})
    modern = Preset("llama", 64, 96, 1, 4, 2, 67, False, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert config_dict(legacy) == config_dict(modern)
    d = write_model(legacy, tmp_path / "m")
    rope = ModelConfig.load(d).rope
    assert (rope.kind, rope.factor) == ("linear", 4.0)
    assert AutoConfig.from_pretrained(str(d)).rope_parameters["rope_type"] == "linear"
    with pytest.raises(ValueError, match=r"'type' 'linear' and 'rope_type' 'yarn' name different RoPE kinds"):
        config_dict(Preset("llama", 64, 96, 1, 4, 2, 67, False,
                           rope_scaling={"type": "linear", "rope_type": "yarn", "factor": 4.0}))


def test_make_model_refuses_a_rope_theta_the_preset_overrides():
    """A rope_theta inside Preset.rope_scaling was overwritten by Preset.rope_theta (10000 unless set): a llama3
    preset meant for theta 500000 was written with 10000.  Refused, naming the field to set; the same value passes."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "rope_theta": 500000.0}
    with pytest.raises(ValueError, match=r"rope_theta 500000.0 differs from Preset.rope_theta 10000.0; set "
                                         r"Preset\(rope_theta=500000.0\)"):
        config_dict(Preset("llama", 64, 96, 1, 4, 2, 67, False, rope_scaling=scaling))
    cfg = config_dict(Preset("llama", 64, 96, 1, 4, 2, 67, False, rope_scaling=scaling, rope_theta=500000.0))
    assert ModelConfig.from_dict(cfg).rope.theta == 500000.0


# ---------------------------------------------------------------------------------------
# reference.make_model: fp16 checkpoints


def test_make_model_writes_fp16_checkpoints(tmp_path):
    """write_model(dtype=torch.float16) (and --dtype fp16) was a KeyError: torch.float16 after the directory was
    made: fp16 checkpoints (fp16 embeddings, norms and weight_scale, torch_dtype float16) could not be built.  Now
    they are, and the reference reads them as transformers does (the same fp32 values, bit for bit); another dtype
    is named before anything is written."""
    from reference.checkpoint import Checkpoint
    from reference.make_model import main

    d = write_model(TINY_LLAMA, tmp_path / "m", dtype=torch.float16)
    assert json.loads((d / "config.json").read_text())["torch_dtype"] == "float16"
    ck = Checkpoint(d)
    assert {ck.info(k).dtype for k in ck.keys()} == {"F16", "U8"}  # every float tensor fp16; packed codes uint8
    ids = torch.randint(3, 67, (2, 13), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    hf = get_target("transformers").capture(d, ids)
    for n in canonical_names(1, "llama"):
        assert torch.equal(ref[n], hf[n]), n
    main(["--preset", "oracle-llama-bias", "--out", str(tmp_path / "cli"), "--dtype", "fp16"])
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["torch_dtype"] == "float16"
    with pytest.raises(ValueError, match=r"dtype torch.float64 is not one of \[torch.float32, torch.bfloat16, "
                                         r"torch.float16\]"):
        write_model(TINY_LLAMA, tmp_path / "f64", dtype=torch.float64)
    assert not (tmp_path / "f64.tmp").exists() and not (tmp_path / "f64").exists()


# ---------------------------------------------------------------------------------------
# the kernel target: weights the trit kernels cannot hold


def test_kernel_target_names_levels_beyond_ternary(tmp_path):
    """A per-tensor / per-channel scaled module whose levels are not ternary (a spec with int levels -2 / 0 / +2):
    the kernel target failed in trit.ops.repack ('weight must be in {-1, 0, +1}; W[0, 1] = 2', no module, no way
    out); now it names the module, its levels and the targets that run it."""
    import dataclasses

    from reference.spec import spec_for

    d = write_model(TINY_LLAMA, tmp_path / "m")
    spec = spec_for(d)
    mod = "model.layers.0.mlp.up_proj"
    e = spec.linears[mod]
    spec.linears[mod] = dataclasses.replace(e, pack=e.pack.replace(codes=(-2, 0, 2, None)))
    path = tmp_path / "spec.json"
    spec.save(path)
    ids = torch.randint(3, 67, (1, 5), generator=torch.Generator().manual_seed(0))
    get_target("reference").capture(d, ids, spec_path=path)  # the spec itself is fine
    with pytest.raises(NotImplementedError, match=rf"{mod}: values -2..2: the trit kernels hold ternary weights"):
        get_target("kernel", device="cpu").capture(d, ids, spec_path=path)


def test_kernel_linear_refuses_non_integer_values():
    """Non-integer values with a per-channel scale (q - z with float zero points) were cast to int8 - 1.4 became 1 -
    and the kernel target computed another model without a word (its 'divergence' blamed on the kernel)."""
    from parity.targets.kernel import KernelLinear
    from reference.spec import DecodedLinear

    vals = torch.tensor([[1.0, 0.0, -1.0, 0.4], [0.0, 1.0, 1.0, -0.6]])
    d = DecodedLinear(vals, torch.ones(2, 1))
    with pytest.raises(NotImplementedError, match=r"lin: values -1..1, not all integers"):
        KernelLinear(d, True, torch.float32, "lin", "cpu")
    KernelLinear(DecodedLinear(vals.round(), torch.ones(2, 1)), True, torch.float32, "lin", "cpu")  # ternary: taken
