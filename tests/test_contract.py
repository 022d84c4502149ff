"""The harness's contract under tampering and misuse (an adversarial pass, 2026-12-05): a golden set whose
manifest or tensors were edited, two dumps racing for one --out, misspelt spec fields, unexpected errors, a
broken tokenizer file, a NaN golden, --tol overrides, an integer scale. Each case once passed silently,
crashed with a traceback and exit 1 (the "divergence" status), or named the wrong file."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from parity import run as prun
from parity.compare import Comparison, compare
from parity.dump import DEFAULT_MODEL, dump_reference, main as dump_main
from parity.golden import GoldenError, GoldenSet, sha256_tensor
from parity.inputs import fixed_inputs
from parity.report import write_report
from reference.checkpoint import CheckpointError
from reference.formats import FormatError
from reference.spec import CheckpointSpec


@pytest.fixture
def gcopy(fresh_golden, tmp_path):
    d = tmp_path / "g"
    shutil.copytree(fresh_golden, d)
    return d


def _edit_manifest(d, fn):
    p = d / "manifest.json"
    m = json.loads(p.read_text())
    r = fn(m)
    p.write_text(json.dumps(r if isinstance(r, list) else m))


def _edit_tensors(d, fn):
    data = load_file(str(d / "tensors.safetensors"))
    fn(data)
    save_file(data, str(d / "tensors.safetensors"))


@pytest.mark.parametrize("cut", ["all", "layer3", "swap"])
def test_manifest_order_must_be_the_whole_canonical_list(gcopy, cut):
    """Names dropped from 'order' were never compared: an empty order passed every target (0/0), a planted
    fault in a dropped layer passed."""
    def edit(m):
        if cut == "all":
            m["order"] = []
        elif cut == "layer3":
            m["order"] = [n for n in m["order"] if not n.startswith("layer3.")]
        else:
            m["order"][1], m["order"][2] = m["order"][2], m["order"][1]
    _edit_manifest(gcopy, edit)
    with pytest.raises(GoldenError, match=r"manifest.json: 'order' is not the 59 canonical names of a 4-layer bitnet"):
        GoldenSet.load(gcopy)


def test_manifest_tensor_entry_missing_is_named_in_the_manifest(gcopy):
    _edit_manifest(gcopy, lambda m: m["tensors"].pop("layer2.mlp.act"))
    with pytest.raises(GoldenError, match=r"manifest.json: 'order' lists 'layer2.mlp.act' but 'tensors' has no entry"):
        GoldenSet.load(gcopy)


@pytest.mark.parametrize("case,pattern", [
    ("list", r"manifest.json: expected a JSON object"),
    ("no_model", r"manifest.json: no 'model'"),
    ("no_sha", r"manifest.json: tensors\['embed'\] has no \['sha256'\]"),
    ("layers_str", r"manifest.json: 'num_layers' is a str, expected a int"),
])
def test_malformed_manifest_is_named(gcopy, case, pattern):
    def edit(m):
        if case == "list":
            return [m]
        if case == "no_model":
            del m["model"]
        elif case == "no_sha":
            del m["tensors"]["embed"]["sha256"]
        else:
            m["num_layers"] = "4"
    _edit_manifest(gcopy, edit)
    with pytest.raises(GoldenError, match=pattern):
        GoldenSet.load(gcopy)


def test_manifest_layers_unlike_the_config_are_stale(gcopy):
    """A manifest that claims 2 layers with a matching 2-layer order loads, but is stale for the 4-layer model."""
    from parity import names as N
    from reference.config import ModelConfig
    from reference.model import REFERENCE_VERSION
    from reference.spec import spec_for

    def edit(m):
        m["num_layers"] = 2
        m["order"] = N.canonical_names(2, m["arch"])
    _edit_manifest(gcopy, edit)
    gs = GoldenSet.load(gcopy)
    why = gs.staleness(DEFAULT_MODEL, spec_for(DEFAULT_MODEL, ModelConfig.load(DEFAULT_MODEL)), REFERENCE_VERSION)
    assert any("2-layer bitnet model, the config describes a 4-layer" in w for w in why), why


@pytest.mark.parametrize("case,pattern", [
    ("id_changed", r"input_ids do not match inputs.input_ids_sha256"),
    ("id_dtype", r"input_ids is torch.int32 \[4, 64\]; expected int64"),
    ("bf16_golden", r"embed is torch.bfloat16 \(manifest: 'float32'\); golden tensors are float32"),
])
def test_golden_tensor_file_edits_are_named(gcopy, case, pattern):
    """A changed input id read as a numeric divergence at embed (exit 1), an id past the vocabulary crashed the
    forward, a bf16 golden crashed sha256_tensor."""
    def edit(d):
        if case == "id_changed":
            d["input_ids"] = d["input_ids"].clone()
            d["input_ids"][0, 5] = (d["input_ids"][0, 5] + 1) % 512
        elif case == "id_dtype":
            d["input_ids"] = d["input_ids"].int()
        else:
            d["embed"] = d["embed"].bfloat16()
    _edit_tensors(gcopy, edit)
    with pytest.raises(GoldenError, match=pattern):
        GoldenSet.load(gcopy)


def test_nan_golden_is_refused_and_never_passes(gcopy):
    """max_abs NaN > limit is False: a NaN golden passed every target."""
    t = {}

    def edit(d):
        x = d["layer1.mlp.up_proj"].clone() * 100
        x[0, 0, 0] = float("nan")
        d["layer1.mlp.up_proj"] = t["x"] = x
    _edit_tensors(gcopy, edit)
    _edit_manifest(gcopy, lambda m: m["tensors"]["layer1.mlp.up_proj"].update(sha256=sha256_tensor(t["x"])))
    with pytest.raises(GoldenError, match=r"layer1.mlp.up_proj holds 1 NaN/Inf values; expected finite goldens"):
        GoldenSet.load(gcopy)
    g = {"a": t["x"]}
    c = compare(g, {"a": torch.zeros_like(t["x"])}, order=["a"], dtype="fp32")
    assert not c.passed and c.results[0].status == "nonfinite" and "in the golden" in c.results[0].detail
    # and the comparison itself: a NaN error fails (not `NaN > limit` = False)
    g2 = {"embed": torch.ones(1, 2, 3)}
    tgt = {"embed": torch.ones(1, 2, 3)}
    r = compare(g2, tgt, order=["embed"], dtype="fp32").results[0]
    assert r.passed
    nan_metrics = compare({"embed": torch.ones(1, 2, 3)}, {"embed": torch.ones(1, 2, 3)}, order=["embed"],
                          dtype="fp32", tol_overrides={"block.atol": float("nan")}).results[0]
    assert not nan_metrics.passed  # a NaN limit cannot pass either


def test_nothing_compared_is_no_pass():
    c = Comparison(target="t", dtype="fp32", results=[])
    assert not c.passed and "NOTHING COMPARED" in c.summary()


def test_racing_dump_does_not_replace_the_other_set(tmp_path, monkeypatch):
    """Two dumps into one --out without --force: the first to finish wins, the second refuses (it moved the
    first's set aside as .prev-*, unasked)."""
    import parity.golden as pg

    out = tmp_path / "g"
    real = pg.write_golden
    import safetensors.torch as st
    real_save = st.save_file
    state = {"other": False}

    def slow_save(data, path, *aa, **kk):  # another process writes its set while this one writes its tensors
        if not state["other"]:
            state["other"] = True
            monkeypatch.setattr(st, "save_file", real_save)
            real(*state["args"], **state["kw"])  # the "other" dump lands first
        return real_save(data, path, *aa, **kk)

    def write_golden(*a, **k):
        state["args"], state["kw"] = a, k
        monkeypatch.setattr(st, "save_file", slow_save)
        return real(*a, **k)
    monkeypatch.setattr("parity.dump.write_golden", write_golden)
    with pytest.raises(GoldenError, match=r"now holds a golden set written while this dump ran"):
        dump_reference(DEFAULT_MODEL, out)
    assert (out / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]  # no .prev-*, no temporary directory left
    GoldenSet.load(out)


def _spec_dict():
    from reference.config import ModelConfig
    from reference.spec import spec_for
    return spec_for(DEFAULT_MODEL, ModelConfig.load(DEFAULT_MODEL)).to_dict()


def test_spec_unknown_fields_are_refused(tmp_path):
    """'activation_quantization' for 'activation_quant' was dropped: the goldens came out without int8
    activation quantisation, exit 0."""
    d = _spec_dict()
    d["activation_quantization"] = d.pop("activation_quant")
    p = tmp_path / "typo.json"
    p.write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"typo.json: unknown field\(s\) \['activation_quantization'\]"):
        CheckpointSpec.load(p)
    d = _spec_dict()
    mod = next(iter(d["linears"]))
    d["linears"][mod]["lvels"] = "ternary"
    with pytest.raises(FormatError, match=rf"spec: linears\['{mod}'\]: unknown field\(s\) \['lvels'\]"):
        CheckpointSpec.from_dict(d)


@pytest.mark.parametrize("case,pattern", [
    ("spec_list", r"s.json: expected a JSON object"),
    ("linears_list", r"s.json: 'linears' is a list, expected a JSON object"),
    ("shape_str", r"s.json: linears\['[^']+'\]: shape '128x344': expected \[N, K\]"),
    ("bad_pack", r"s.json: linears\['[^']+'\]: .*pack_axis"),
])
def test_spec_errors_name_the_file_and_module(tmp_path, case, pattern):
    d = _spec_dict()
    mod = next(iter(d["linears"]))
    if case == "spec_list":
        d = [d]
    elif case == "linears_list":
        d["linears"] = list(d["linears"].values())
    elif case == "shape_str":
        d["linears"][mod]["shape"] = "128x344"
    else:
        d["linears"][mod]["pack"]["pack_axis"] = 2
    p = tmp_path / "s.json"
    p.write_text(json.dumps(d))
    with pytest.raises(FormatError, match=pattern):
        CheckpointSpec.load(p)
    assert dump_main(["--ref", "--spec", str(p), "--out", str(tmp_path / "g")]) == 2
    assert not (tmp_path / "g").exists()


def test_unexpected_errors_exit_2_not_1(monkeypatch, capsys, tmp_path):
    """1 is a measured divergence (a CI gate reads it so); a crash before any comparison is 2, with its traceback."""
    def boom(*a, **k):
        raise TypeError("an unexpected failure")
    monkeypatch.setattr(prun, "run_parity", boom)
    assert prun.main(["--target", "reference"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "the run failed before a comparison: TypeError: an unexpected failure" in err
    monkeypatch.setattr("parity.dump.dump_reference", boom)
    assert dump_main(["--ref", "--out", str(tmp_path / "g")]) == 2
    assert "the dump failed: TypeError" in capsys.readouterr().err


def test_broken_tokenizer_file_is_named(tmp_path):
    m = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, m)
    (m / "tokenizer.json").write_text("")
    with pytest.raises(ValueError, match=r"m/tokenizer.json: not a readable tokenizers file"):
        fixed_inputs(m, 512)
    assert dump_main(["--ref", "--model", str(m), "--out", str(tmp_path / "g")]) == 2


def test_tol_overrides_are_reported(fresh_golden, tmp_path):
    """A loosened run read exactly like a strict one in summary.json / report.md / the table."""
    res = prun.run_parity("reference", model_dir=DEFAULT_MODEL, golden_dir=fresh_golden, runs_dir=tmp_path,
                          tol_overrides={"operator": 10.0, "attention.atol": 0.5}, diagnose=False)
    c = res.comparison
    assert c.passed and c.overrides == {"operator.rtol": 10.0, "attention.atol": 0.5}
    assert "OVERRIDDEN attention.atol=0.5, operator.rtol=10" in c.summary()
    src = {r.name: r.limit_source for r in c.results}
    assert src["layer0.attn.q_proj"] == "override" and src["layer0.attn.attn_out"] == "override"
    assert src["layer0.input_norm"] == "tier"
    s = json.loads((res.run_dir / "summary.json").read_text())
    assert s["tol_overrides"] == {"operator.rtol": 10.0, "attention.atol": 0.5}
    assert s["tolerances"]["operator"]["rtol"] == 10.0
    assert "tolerance overrides (--tol): attention.atol=0.5, operator.rtol=10" in (res.run_dir / "report.md").read_text()
    assert "override" in (res.run_dir / "report.csv").read_text()


def test_integer_scale_dtype_is_refused(tmp_path):
    """An F32 scale whose header says I32 was read as 1102703775 and the goldens written."""
    from reference.checkpoint import read_header

    m = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, m)
    f = m / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    key = "model.layers.0.mlp.down_proj.weight_scale"
    assert hdr[key]["dtype"] == "F32"
    hdr[key]["dtype"] = "I32"
    new = json.dumps(hdr, separators=(",", ":")).encode()
    new += b" " * (n - len(new))
    assert len(new) == n
    raw[8:8 + n] = new
    f.write_bytes(bytes(raw))
    read_header(f)
    from reference.model import ReferenceModel
    with pytest.raises(CheckpointError, match=rf"model.safetensors: scale '{key}' .* is torch.int32; expected a float"):
        ReferenceModel.from_dir(m)
    assert dump_main(["--ref", "--model", str(m), "--out", str(tmp_path / "g")]) == 2


def test_missing_tie_key_and_no_head_say_why(tmp_path):
    """A tied model whose config.json lost tie_word_embeddings (transformers' default: untied) and stores no head:
    the inspector and the spec check say that the key is false or absent, not only that lm_head.weight is missing."""
    import json as _json

    from reference.inspect import InspectError, inspect_dir
    from reference.make_model import Preset, write_model
    from reference.spec import spec_for

    d = write_model(Preset("bitnet", 64, 96, 1, 2, 1, 50, True, seed=3), tmp_path / "m")
    cfg = _json.loads((d / "config.json").read_text())
    cfg.pop("tie_word_embeddings", None)
    (d / "config.json").write_text(_json.dumps(cfg))
    with pytest.raises(InspectError, match=r"lm_head .* tie_word_embeddings is false or absent"):
        inspect_dir(d, use_loss=False)
    from reference.checkpoint import Checkpoint, CheckpointError
    from reference.config import ModelConfig

    with pytest.raises(CheckpointError, match=r"lm_head.weight.* tie_word_embeddings is false or absent"):
        spec_for(d).validate(ModelConfig.load(d), Checkpoint(d))
