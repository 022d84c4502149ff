"""The fp32 reference against transformers' own implementation (BitNetForCausalLM /
LlamaForCausalLM with quant_method bitnet: BitLinear, AutoBitLinear, HF-BitNet packing,
int8 activation quantisation): logits and every captured layer output within 1e-5 relative."""
import pytest
import torch

from parity.names import canonical_names
from parity.targets import get_target
from reference.config import ModelConfig
from reference.make_model import PRESETS, Preset, make_state_dict, write_model
from reference.model import ReferenceModel

ORACLE = ["oracle-bitnet-gqa", "oracle-bitnet-auto", "oracle-llama-gqa", "oracle-llama-auto",
          "oracle-llama-bias", "oracle-llama-float", "oracle-bitnet-float"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    return {p: write_model(p, root / p) for p in ORACLE + ["odd-bitnet"]}


@pytest.mark.parametrize("preset", ORACLE)
def test_reference_matches_transformers(preset, models):
    d = models[preset]
    cfg = ModelConfig.load(d)
    ids = torch.randint(3, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(7))
    ref = get_target("reference").capture(d, ids)
    hf = get_target("transformers").capture(d, ids)
    names = canonical_names(cfg.num_layers, cfg.arch)
    assert set(names) <= set(ref) and set(names) <= set(hf)
    worst = []
    for n in names:
        rel = float((ref[n] - hf[n]).abs().max() / hf[n].abs().max())
        worst.append((rel, n))
        assert rel <= 1e-5, f"{preset}: {n} differs from transformers by {rel:.2e} relative"
    assert max(worst)[0] < 1e-5


def test_odd_sizes_decode_exactly(models):
    """out_features not a multiple of 4 (head_dim 14, intermediate 102): transformers' BitLinear
    cannot hold these (its buffer is out//4 rows), our HF-BitNet decode pads and crops exactly."""
    d = models["odd-bitnet"]
    m = ReferenceModel.from_dir(d)
    sd = make_state_dict(PRESETS["odd-bitnet"])
    from reference.formats import HF_BITNET, unpack
    from reference.checkpoint import Checkpoint
    from reference.spec import decode_linear, spec_for
    cfg = ModelConfig.load(d)
    spec = spec_for(d, cfg)
    ck = Checkpoint(d)
    for mod, (n, k) in cfg.linear_shapes().items():
        if mod == "lm_head":
            continue
        dl = decode_linear(ck, spec.linears[mod], mod)
        assert dl.values.shape == (n, k)
        assert torch.equal(dl.values, unpack(sd[mod + ".weight"], HF_BITNET, (n, k)))
    logits = m.forward(torch.arange(3, 20).reshape(1, -1))
    assert torch.isfinite(logits).all()


def test_greedy_generation_matches_transformers(models):
    d = models["oracle-llama-gqa"]
    ids = torch.randint(3, 80, (2, 9), generator=torch.Generator().manual_seed(3))
    ours = get_target("reference").generate(d, ids, 8)
    theirs = get_target("transformers").generate(d, ids, 8)
    assert torch.equal(ours, theirs)


def _edited(root, name, preset, edit):
    import json
    d = write_model(preset, root / name)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _old_rope(**scaling):
    def edit(c):
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
        c["rope_scaling"] = scaling
    return edit


LLAMA = Preset("llama", 64, 96, 2, 4, 2, 67, False, eps=1e-5, seed=12)
ROPE_VARIANTS = {
    "linear": lambda c: c["rope_parameters"].update(rope_type="linear", factor=4.0),
    "linear-old-spelling": _old_rope(type="linear", factor=4.0),
    # NTK base rescaling only once the sequence (23) is longer than max_position_embeddings
    "dynamic-beyond-max-pos": lambda c: (c.update(max_position_embeddings=16),
                                         c["rope_parameters"].update(rope_type="dynamic", factor=3.0)),
    "dynamic-old-spelling": lambda c: (c.update(max_position_embeddings=12),
                                       _old_rope(type="dynamic", factor=2.0)(c)),
    # YaRN (transformers' _compute_yarn_parameters): ramp between interpolated and extrapolated frequencies,
    # cos / sin times the attention factor (derived from factor, from mscale / mscale_all_dim, or given)
    "yarn": lambda c: c["rope_parameters"].update(rope_type="yarn", factor=4.0, original_max_position_embeddings=128),
    "yarn-mscale-betas": lambda c: c["rope_parameters"].update(
        rope_type="yarn", factor=8.0, original_max_position_embeddings=64, mscale=0.707, mscale_all_dim=1.0,
        beta_fast=16, beta_slow=2),
    "yarn-attention-factor-untruncated": lambda c: c["rope_parameters"].update(
        rope_type="yarn", factor=2.0, original_max_position_embeddings=256, attention_factor=1.3, truncate=False),
    "yarn-old-spelling": _old_rope(type="yarn", factor=4.0, original_max_position_embeddings=128),
    # llama3 without original_max_position_embeddings: transformers takes max_position_embeddings (a top-level
    # original_max_position_embeddings wins over the rope dict's), not Llama 3.1's 8192
    "llama3-no-original-max": lambda c: (c.update(max_position_embeddings=64), c["rope_parameters"].update(
        rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0)),
    "llama3-top-level-original-max": lambda c: (c.update(max_position_embeddings=64, original_max_position_embeddings=16),
                                                c["rope_parameters"].update(
        rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)),
    # both keys (a config edited by hand or converted twice): transformers' convert_rope_params_to_dict takes a
    # non-empty rope_scaling over rope_parameters, the rope_theta inside the dict not taken included
    "linear-both-keys": lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "default-both-keys-scaling-wins": lambda c: (c["rope_parameters"].update(rope_type="linear", factor=2.0,
                                                                            rope_theta=500.0),
                                                 c.update(rope_scaling={"rope_type": "default"})),
    "dynamic-both-keys-null-scaling": lambda c: (c.update(max_position_embeddings=16, rope_scaling=None),
                                                 c["rope_parameters"].update(rope_type="dynamic", factor=3.0)),
}


@pytest.mark.parametrize("rope", sorted(ROPE_VARIANTS))
def test_rope_scaling_variants_match_transformers(rope, tmp_path):
    """transformers' linear, dynamic-NTK, YaRN and llama3 RoPE (rope_parameters and the old rope_scaling spelling)."""
    d = _edited(tmp_path, rope, LLAMA, ROPE_VARIANTS[rope])
    assert ModelConfig.load(d).rope.kind == rope.split("-")[0]
    _assert_matches_transformers(d)


@pytest.mark.parametrize("rope,why", [
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "rope_type 'llama3' needs 'low_freq_factor'"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "rope_type 'yarn' needs a 'factor'"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}, "rope_type 'longrope' is not supported"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
     "partial_rotary_factor 0.5 with rope_type 'linear'")])
def test_incomplete_or_unknown_rope_is_refused_by_name(rope, why):
    """transformers requires these keys (its rope validation raises KeyError) and vLLM indexes them: the
    reference names the file and the key instead of assuming a default."""
    from reference.checkpoint import CheckpointError
    from reference.make_model import config_dict
    c = config_dict(LLAMA)
    c["rope_parameters"].update(rope)
    with pytest.raises(CheckpointError, match=rf"m/config.json: {why}"):
        ModelConfig.from_dict(c, where="m/config.json")


def test_llama_hidden_not_a_multiple_of_heads_is_refused_by_name():
    """transformers' LlamaConfig refuses hidden_size % num_attention_heads != 0 even with an explicit head_dim, and
    vLLM loads the config through it: the reference must not write goldens for a model no target can load."""
    from reference.checkpoint import CheckpointError
    from reference.make_model import config_dict
    c = config_dict(Preset("llama", 70, 102, 2, 3, 1, 67, False, head_dim=32, eps=1e-5, seed=12))
    with pytest.raises(CheckpointError, match=r"m/config.json: hidden_size 70 is not a multiple of "
                                              r"num_attention_heads 3.*head_dim \(32\)"):
        ModelConfig.from_dict(c, where="m/config.json")
    c["architectures"], c["model_type"] = ["BitNetForCausalLM"], "bitnet"  # BitNetConfig has no such check
    assert ModelConfig.from_dict(c, where="m/config.json").head_dim == 32


def test_bitnet_head_dim_not_hidden_over_heads(tmp_path):
    """head_dim from config.json with heads * head_dim != hidden_size: the attention sub-norm spans
    heads * head_dim (as in transformers and the vLLM plugin), not hidden_size."""
    d = write_model(Preset("bitnet", 64, 100, 2, 2, 1, 61, True, head_dim=16, seed=13), tmp_path / "m")
    assert ModelConfig.load(d).float_params()["model.layers.0.self_attn.attn_sub_norm.weight"] == (32,)
    _assert_matches_transformers(d)


def test_transformers_target_names_shapes_bitlinear_cannot_hold(models):
    with pytest.raises(ValueError, match=r"odd-bitnet: transformers. BitLinear cannot hold model\.layers\.0\."
                                         r"self_attn\.q_proj \(70 output features, not a multiple of 4"):
        get_target("transformers").capture(models["odd-bitnet"], torch.arange(3, 9).reshape(1, -1))


def _assert_matches_transformers(d):
    cfg = ModelConfig.load(d)
    ids = torch.randint(3, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(7))
    ref = get_target("reference").capture(d, ids)
    hf = get_target("transformers").capture(d, ids)
    for n in canonical_names(cfg.num_layers, cfg.arch):
        rel = float((ref[n] - hf[n]).abs().max() / hf[n].abs().max())
        assert rel <= 1e-5, f"{d.name}: {n} differs from transformers by {rel:.2e} relative"


def test_transformers_target_refuses_autobitlinear_bias(tmp_path):
    """transformers' offline AutoBitLinear computes (x T + b) * s: a comparison would report a bogus
    divergence at the first biased linear, so the target says why it cannot serve as the oracle."""
    d = write_model(Preset("llama", 64, 96, 1, 2, 1, 67, True, linear_class="autobitlinear", bias=True, seed=14),
                    tmp_path / "m")
    with pytest.raises(ValueError, match=r"AutoBitLinear multiplies the bias by weight_scale.*q_proj"):
        get_target("transformers").capture(d, torch.arange(3, 9).reshape(1, -1))


def test_tied_config_with_a_different_stored_lm_head(tmp_path):
    """config.json ties the embeddings but the checkpoint stores another lm_head.weight: transformers
    (tie_weights) keeps them apart and uses it; so does the reference."""
    from safetensors.torch import load_file, save_file
    d = write_model(Preset("bitnet", 64, 100, 2, 4, 2, 61, True, seed=22), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = torch.randn(61, 64, generator=torch.Generator().manual_seed(1)) * 0.02
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    _assert_matches_transformers(d)


@pytest.mark.parametrize("arch", ["bitnet", "llama"])
def test_online_mode_float_latent_weights_match_transformers(arch, tmp_path):
    """quantization_mode 'online' (as microsoft/bitnet-b1.58-2B-4T-bf16 ships: float latent weights,
    AutoBitLinear ternarizes each with its mean |W| at run time): the reference quantizes the same way
    (LinearEntry.online 'absmean') and matches transformers on every captured tensor; a NaN weight is
    named; 'online' with BitLinear (no online mode in transformers) is refused."""
    import json

    from safetensors.torch import load_file, save_file

    from reference.checkpoint import CheckpointError

    from reference.make_model import to_online

    d = to_online(write_model(Preset(arch, 64, 176, 2, 4, 2, 101, False, linear_class="autobitlinear", seed=41),
                              tmp_path / "m"), seed=5)
    cfg_d = json.loads((d / "config.json").read_text())
    sd = load_file(str(d / "model.safetensors"))
    cfg = ModelConfig.load(d)
    ids = torch.randint(3, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(7))
    ref = get_target("reference").capture(d, ids)
    hf = get_target("transformers").capture(d, ids)
    # the fp32-a8 tiers: float-order noise (~3e-7) can flip one int8 activation step at a rounding
    # boundary (seen: a llama gate_proj 7.8e-4 relative after 2-6e-7 everywhere before)
    from parity.compare import compare

    c = compare(ref, hf, order=canonical_names(cfg.num_layers, cfg.arch), dtype="fp32-a8", target_name="transformers")
    assert c.passed, c.summary()
    assert float((ref["layer0.attn.q_proj"] - hf["layer0.attn.q_proj"]).abs().max()) <= 1e-5 * float(
        hf["layer0.attn.q_proj"].abs().max())  # the first quantized layer: no flip yet, the same weights
    key = "model.layers.1.mlp.down_proj.weight"
    w = sd[key].clone()
    sd[key][0, 3] = float("nan")
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"tensor '{key}'.*NaN/Inf"):
        ReferenceModel.from_dir(d)
    sd[key] = w
    save_file(sd, str(d / "model.safetensors"))
    cfg_d["quantization_config"]["linear_class"] = "bitlinear"
    (d / "config.json").write_text(json.dumps(cfg_d))
    with pytest.raises(CheckpointError, match="online only in AutoBitLinear"):
        ReferenceModel.from_dir(d)


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh"])
def test_bitnet_gelu_matches_transformers(act, tmp_path):
    """transformers' BitNetMLP takes ACT2FN[hidden_act]: exact and tanh GELU as well as relu2 / silu."""
    d = _edited(tmp_path, act, Preset("bitnet", 64, 96, 2, 4, 2, 67, True, seed=17), lambda c: c.update(hidden_act=act))
    assert ModelConfig.load(d).hidden_act == act
    _assert_matches_transformers(d)


def test_transformers_target_is_not_bit_faithful_on_online_checkpoints(tmp_path):
    """parity.run / parity.noise pick the strict fp32 column for transformers (bit_faithful) - but not on a
    quantization_mode 'online' checkpoint, where its torch.compile'd quantizers differ by an ulp and move
    int8 activation steps (a correct model failed the strict tier: 13/31 tensors)."""
    from parity.golden import compute_fingerprint, target_bit_faithful
    from reference.make_model import to_online

    off = write_model(Preset("bitnet", 64, 100, 2, 4, 2, 61, False, linear_class="autobitlinear", seed=43),
                      tmp_path / "off")
    on = to_online(write_model(Preset("bitnet", 64, 100, 2, 4, 2, 61, False, linear_class="autobitlinear", seed=43),
                               tmp_path / "on"), seed=1)
    t = get_target("transformers")
    assert t.faithful_for(off) and not t.faithful_for(on) and t.faithful_for(None)
    here = {"compute": compute_fingerprint("cpu")}
    assert target_bit_faithful(t, here, off) and not target_bit_faithful(t, here, on)
    assert get_target("reference").faithful_for(on)  # the reference itself stays bit-faithful


@pytest.mark.parametrize("preset", ["odd-bitnet", "oracle-llama-bias", "oracle-llama-auto"])
def test_state_dict_same_with_packing_threads(preset):
    """make_state_dict with the ternarisation and packing on worker threads (what the real-model presets do)
    gives the same tensors, bit for bit and in the same key order, as the one-thread path: the draws and
    each matrix's absmean stay on the calling thread, in order."""
    p = PRESETS[preset]
    one = make_state_dict(p, workers=0)
    for w in (1, 3):
        many = make_state_dict(p, workers=w)
        assert list(many) == list(one), w
        for k in one:
            assert many[k].dtype == one[k].dtype and torch.equal(many[k], one[k]), (w, k)
