"""The fp32 reference against transformers' own implementation (BitNetForCausalLM /
LlamaForCausalLM with quant_method bitnet: BitLinear, AutoBitLinear, HF-BitNet packing,
int8 activation quantisation): logits and every captured layer output within 1e-5 relative."""
import pytest
import torch

from parity.names import canonical_names
from parity.targets import get_target
from reference.config import ModelConfig
from reference.make_model import PRESETS, make_state_dict, write_model
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
