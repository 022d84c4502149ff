"""Golden sets: atomic, never overwritten silently, stale when the model changes, verified."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from parity.dump import DEFAULT_MODEL, dump_reference, main as dump_main
from parity.golden import GoldenError, GoldenSet, StaleGolden, bit_faithful_here, compute_fingerprint
from parity.run import load_fresh_golden, run_parity
from parity.inputs import NUM_PROMPTS, SEQ_LEN


@pytest.fixture
def gold(fresh_golden):  # read only: tests that change a set copy it first
    return fresh_golden


def test_manifest_contents(gold):
    gs = GoldenSet.load(gold)
    m = gs.manifest
    assert gs.input_ids.shape == (NUM_PROMPTS, SEQ_LEN)
    assert m["inputs"]["source"] == "tokenizer" and len(m["inputs"]["prompts"]) == 4
    assert m["order"][0] == "embed" and m["order"][-1] == "logits"
    assert "layer3.attn.v_proj" in m["order"] and m["tensors"]["layer3.attn.v_proj"]["tier"] == "operator"
    assert m["reference_version"] and m["model"]["spec_name"] == "hf-bitnet-bitlinear"
    assert gs.top10.shape == (NUM_PROMPTS, SEQ_LEN, 10)
    for n in ("layer0.attn.q_proj", "layer0.mlp.act", "layer0.attn.attn_out", "final_norm"):
        assert m["tensors"][n]["dtype"] == "float32" and len(m["tensors"][n]["sha256"]) == 64


def test_committed_golden_is_fresh_and_reproducible(gold):
    """Regenerated here, the committed set comes back to the last ulps where it was computed the
    same way (its manifest's `compute`); on another CPU ISA an int8 activation-quantisation flip is
    one int8 step, so there it must come back within the tier an independent fp32 implementation
    of this W1.58A8 model gets (fp32-a8), which the harness then applies (parity.golden.bit_faithful_here).
    The comparison is parity.golden_diff's, as `bash ci/main.sh` runs it."""
    from parity.golden_diff import diff
    committed = load_fresh_golden(DEFAULT_MODEL.parent.parent / "golden" / "tiny-bitnet", DEFAULT_MODEL)
    problems = diff(GoldenSet.load(gold), committed, rtol=1e-6, cross_column="fp32-a8")
    assert not problems, f"computed {committed.manifest.get('compute')}, here {compute_fingerprint()}:\n" + \
        "\n".join(problems)


def test_fresh_golden_records_where_it_was_computed(gold):
    m = GoldenSet.load(gold).manifest
    assert m["compute"] == compute_fingerprint() and m["compute"].startswith("cpu:")
    assert f"threads {torch.get_num_threads()}" in m["compute"] and torch.__version__ in m["compute"]
    assert bit_faithful_here(m) and not bit_faithful_here({**m, "compute": "cpu:SOME_OTHER_ISA"})
    assert not bit_faithful_here({k: v for k, v in m.items() if k != "compute"})


def test_no_silent_overwrite_and_force_keeps_old(gold, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(gold, out)
    before = (out / "manifest.json").read_text()
    assert dump_main(["--ref", "--out", str(out)]) == 2  # refused, nothing touched
    assert (out / "manifest.json").read_text() == before
    assert dump_main(["--ref", "--out", str(out), "--force"]) == 0
    aside = list(tmp_path.glob("g.prev-*"))
    assert len(aside) == 1 and (aside[0] / "manifest.json").read_text() == before
    assert not list(tmp_path.glob(".g.tmp-*"))


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import parity.golden as G

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(OSError):
        dump_reference(DEFAULT_MODEL, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_non_finite_reference_outputs_are_not_written(tmp_path):
    """A reference that produces NaN / Inf (a degenerate checkpoint the checks let through) must not become a
    golden set: every target would then 'fail' on the reference's fault. Nothing is written."""
    from parity.golden import write_golden

    t = {"embed": torch.zeros(1, 3, 4), "layer0.mlp.down_proj": torch.full((1, 3, 4), float("nan")),
         "logits": torch.zeros(1, 3, 7)}
    with pytest.raises(GoldenError, match=r"not finite from 'layer0\.mlp\.down_proj'.*nothing written"):
        write_golden(tmp_path / "x", t, list(t), torch.zeros(1, 3, dtype=torch.long), model_dir=tmp_path / "m",
                     spec=None, inputs_desc={}, reference_version="r", arch="llama", num_layers=1)
    assert list(tmp_path.iterdir()) == []


def test_stale_golden_is_reported_as_stale(gold, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StaleGolden, match="config.json changed"):
        run_parity("reference", model_dir=model, golden_dir=gold, runs_dir=None)


def test_golden_of_another_model_points_at_that_model(gold, tmp_path):
    """A current golden set checked against another model (a --golden given without its --model): the message
    names the model the set belongs to and says to pass it, instead of advising a --force that would replace
    that model's goldens."""
    own = Path(GoldenSet.load(gold).manifest["model"]["dir"])  # the bundled model (dumped on this machine)
    other = tmp_path / "other"
    shutil.copytree(DEFAULT_MODEL, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StaleGolden) as e:
        run_parity("reference", model_dir=other, golden_dir=gold, runs_dir=None)
    msg = str(e.value)
    assert "config.json changed" in msg and f"It is current for {own}" in msg and f"--model {own}" in msg
    assert "--force" not in msg


def test_corrupted_golden_detected(gold, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(gold, out)
    m = json.loads((out / "manifest.json").read_text())
    m["tensors"]["logits"]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(GoldenError, match="logits does not match its sha256"):
        GoldenSet.load(out)
    t = out / "tensors.safetensors"
    t.write_bytes(t.read_bytes()[:-100])
    from reference.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="truncated"):
        GoldenSet.load(out)


def test_missing_golden_message(tmp_path):
    with pytest.raises(GoldenError, match="python -m parity.dump --ref"):
        GoldenSet.load(tmp_path)


def test_inputs_fill_rows_with_a_large_vocabulary_tokenizer(tmp_path):
    """A tokenizer that packs the prompts into few tokens still yields full 64-token rows."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from parity.inputs import PROMPTS, fixed_inputs

    words = sorted({w for p in PROMPTS for w in p.split()})
    vocab = {w: i + 3 for i, w in enumerate(words)}
    vocab.update({"<pad>": 0, "<s>": 1, "[UNK]": 2})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    ids, desc = fixed_inputs(tmp_path, len(vocab) + 3)
    assert ids.shape == (4, 64) and desc["source"] == "tokenizer"
    assert not torch.equal(ids[0], ids[1])


def test_golden_diff_strict_on_same_hardware_tiers_across(gold, tmp_path):
    """parity.golden_diff: a difference past 1e-6 fails between sets computed the same way, and is
    judged by the fp32-a8 tiers between sets from different hardware (a missing `compute` counts
    as different); past those tiers it fails there too."""
    from safetensors.torch import load_file, save_file
    from parity.golden import sha256_tensor
    from parity.golden_diff import main as gd_main

    def variant(name, scale, compute):
        out = tmp_path / name
        shutil.copytree(gold, out)
        data = load_file(str(out / "tensors.safetensors"))
        data["layer1.mlp.up_proj"] = data["layer1.mlp.up_proj"] * scale
        save_file(data, str(out / "tensors.safetensors"))
        m = json.loads((out / "manifest.json").read_text())
        m["tensors"]["layer1.mlp.up_proj"]["sha256"] = sha256_tensor(data["layer1.mlp.up_proj"])
        if compute is None:
            m.pop("compute")
        else:
            m["compute"] = compute
        (out / "manifest.json").write_text(json.dumps(m))
        return str(out)

    assert gd_main([str(gold), variant("same", 1.001, compute_fingerprint())]) == 1
    assert gd_main([str(gold), variant("other", 1.001, "cpu:SOME_OTHER_ISA")]) == 0
    assert gd_main([str(gold), variant("unrecorded", 1.001, None)]) == 0
    assert gd_main([str(gold), variant("other-far", 1.2, "cpu:SOME_OTHER_ISA")]) == 1


def test_force_never_replaces_a_directory_that_is_not_a_golden_set(tmp_path):
    """`--out` pointing at the model directory (or any non-golden directory) with --force moved it aside as
    NAME.prev-* and put a golden set in its place; it is refused, with or without --force."""
    model = tmp_path / "tiny-bitnet"
    shutil.copytree(DEFAULT_MODEL, model)
    before = sorted(p.name for p in model.iterdir())
    for extra in ([], ["--force"]):
        assert dump_main(["--ref", "--model", str(model), "--out", str(model), *extra]) == 2
    assert sorted(p.name for p in model.iterdir()) == before and not (model / "manifest.json").exists()
    assert not list(tmp_path.glob("tiny-bitnet.prev-*"))


def test_default_out_of_model_dot_is_named_after_the_model(tmp_path, monkeypatch):
    """`python -m parity.dump --ref --model .` (run inside the model directory): the default golden/<model dir
    name> was golden/ itself (Path('.').name is ''), so --force moved every golden set aside."""
    import parity.dump as dump

    model = tmp_path / "mymodel"
    shutil.copytree(DEFAULT_MODEL, model)
    (tmp_path / "golden" / "other").mkdir(parents=True)
    (tmp_path / "golden" / "other" / "manifest.json").write_text("{}")
    monkeypatch.setattr(dump, "ROOT", tmp_path)
    monkeypatch.chdir(model)
    assert dump_main(["--ref", "--model", ".", "--force"]) == 0
    assert (tmp_path / "golden" / "mymodel" / "manifest.json").exists()
    assert (tmp_path / "golden" / "other" / "manifest.json").exists() and not list(tmp_path.glob("golden.prev-*"))


def test_vocabulary_smaller_than_top10(tmp_path):
    """A vocabulary of fewer than 10 ids (a toy model): the golden keeps all of them as its top ids and the
    top-k agreement compares all of them (topk(10) raised 'selected index k out of range')."""
    import dataclasses

    from reference.make_model import PRESETS, write_model

    d = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], vocab=7), tmp_path / "m")
    dump_reference(d, tmp_path / "g")
    r = run_parity("reference", model_dir=d, golden_dir=tmp_path / "g", runs_dir=None, diagnose=False)
    assert r.golden.top10.shape[-1] == 7
    assert r.comparison.passed, r.comparison.summary()


def test_inputs_fit_a_short_context(tmp_path, capsys):
    """max_position_embeddings below the 64 input tokens: the inputs are cut to max_position_embeddings - 1 (one
    position for the token the vllm target samples), the manifest and stderr say so, and a run on them passes."""
    import dataclasses

    from reference.make_model import PRESETS, write_model

    d = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], max_pos=32), tmp_path / "m")
    dump_reference(d, tmp_path / "g")
    assert "cut from 64 to 31 tokens" in capsys.readouterr().err
    g = GoldenSet.load(tmp_path / "g")
    assert tuple(g.input_ids.shape) == (NUM_PROMPTS, 31)
    assert "max_position_embeddings 32" in g.manifest["inputs"]["seq_len_note"]
    r = run_parity("reference", model_dir=d, golden_dir=tmp_path / "g", runs_dir=None, diagnose=False)
    assert r.comparison.passed, r.comparison.summary()
    d2 = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], max_pos=2), tmp_path / "m2")
    with pytest.raises(ValueError, match=r"max_position_embeddings 2 leaves fewer than 2 input positions"):
        dump_reference(d2, tmp_path / "g2")
    full = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], max_pos=65), tmp_path / "m3")
    dump_reference(full, tmp_path / "g3")
    assert tuple(GoldenSet.load(tmp_path / "g3").input_ids.shape) == (NUM_PROMPTS, SEQ_LEN)


def test_cli_bad_paths_are_errors_not_tracebacks(tmp_path, capsys):
    """A missing --spec, a golden set without its tensors, --runs or --out under a file, and unusable target
    options: exit 2 with one line naming the problem (1 is kept for a divergence), nothing left half-written; the
    command suggested for a missing set names the model."""
    import dataclasses

    from parity.run import main as run_main
    from reference.make_model import PRESETS, write_model

    d = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], layers=2), tmp_path / "m")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert dump_main(["--ref", "--model", str(d), "--out", str(tmp_path / "g"), "--spec", str(tmp_path / "no.json")]) == 2
    assert "no.json" in capsys.readouterr().err and not (tmp_path / "g").exists()
    assert dump_main(["--ref", "--model", str(d), "--out", str(afile / "g")]) == 2
    assert "afile" in capsys.readouterr().err
    assert run_main(["--model", str(d), "--golden", str(tmp_path / "nothere")]) == 2
    assert f"--model {d} --out {tmp_path / 'nothere'}" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert dump_main(["--ref", "--model", str(d), "--out", str(empty)]) == 0  # an empty dir is no set to protect
    capsys.readouterr()
    for f in ("tensors.safetensors", "manifest.json"):
        assert (empty / f).stat().st_mode & 0o044 == 0o044, f"{f} not readable by others"  # umask 022 in CI
    base = ["--model", str(d), "--golden", str(empty), "--runs", str(tmp_path / "runs")]
    assert run_main(base[:4] + ["--runs", str(afile / "runs")]) == 2
    assert "NotADirectoryError" in capsys.readouterr().err
    for opt in (["--target-opt", "overrides=x"], ["--tol", "operator=nan"], ["--tol", "operator=-1"]):
        assert run_main(base + opt) == 2, opt
        assert "error" in capsys.readouterr().err
    assert run_main(base + ["--target", "reference", "--target-opt", "dtype=bfloat16"]) in (0, 1)  # runs, bf16 tiers
    capsys.readouterr()
    trunc = tmp_path / "trunc"
    shutil.copytree(empty, trunc)
    (trunc / "tensors.safetensors").unlink()
    assert run_main(["--model", str(d), "--golden", str(trunc)]) == 2
    assert "without tensors.safetensors" in capsys.readouterr().err


def test_interrupted_force_keeps_the_old_set_in_place(tmp_path, monkeypatch):
    """--force moves the old set aside, then the new one into place: an interrupt between the two renames puts
    the old set back (was: only NAME.prev-* left)."""
    import dataclasses
    from pathlib import Path

    from reference.make_model import PRESETS, write_model

    d = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], layers=1), tmp_path / "m")
    g = dump_reference(d, tmp_path / "g")
    before = (g / "manifest.json").read_text()
    real = Path.rename

    def rename(self, target):
        if self.name.startswith(".g.tmp-"):
            raise KeyboardInterrupt
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        dump_reference(d, tmp_path / "g", force=True)
    monkeypatch.undo()
    assert (g / "manifest.json").read_text() == before
    assert not list(tmp_path.glob("g.prev-*")) and not list(tmp_path.glob(".g.tmp-*"))


def test_noise_cli_errors_are_exit_2_not_tracebacks(tmp_path, capsys, monkeypatch):
    """parity.noise as parity.run / parity.dump: a missing --spec, a target that cannot run (device=cuda without a
    GPU: an AssertionError in torch), an unwritable golden dir (refused before the capture) - exit 2, one line."""
    import dataclasses
    import os

    from parity.noise import main as noise_main
    from reference.make_model import PRESETS, write_model

    d = write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], layers=1), tmp_path / "m")
    g = tmp_path / "g"
    assert dump_main(["--ref", "--model", str(d), "--out", str(g)]) == 0
    capsys.readouterr()
    assert noise_main(["--model", str(d), "--golden", str(g), "--spec", str(tmp_path / "no.json")]) == 2
    assert "no.json" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert noise_main(["--model", str(d), "--golden", str(g), "--target-opt", "device=cuda"]) == 2
        assert "could not run" in capsys.readouterr().err
    monkeypatch.setattr(os, "access", lambda p, mode: mode != os.W_OK and os.path.exists(p))
    assert noise_main(["--model", str(d), "--golden", str(g)]) == 2
    assert "not writable" in capsys.readouterr().err


def test_manifest_records_the_model_dir_absolute(tmp_path, monkeypatch, capsys):
    """A set dumped with a relative --model records the directory resolved, so that a later run from another cwd
    neither calls it 'made from m, not rel/m' nor checks whatever `m` is there."""
    import dataclasses

    from parity.golden import GoldenSet
    from reference.make_model import PRESETS, write_model

    write_model(dataclasses.replace(PRESETS["oracle-llama-gqa"], layers=1), tmp_path / "rel" / "m")
    monkeypatch.chdir(tmp_path / "rel")
    assert dump_main(["--ref", "--model", "m", "--out", "g"]) == 0
    assert GoldenSet.load(tmp_path / "rel" / "g").manifest["model"]["dir"] == str((tmp_path / "rel" / "m").resolve())


def test_golden_diff_unknown_column_is_a_usage_error(gold, capsys):
    from parity.golden_diff import main as gd_main

    with pytest.raises(SystemExit) as e:
        gd_main([str(gold), str(gold), "--cross-column", "bogus"])
    assert e.value.code == 2 and "bogus" in capsys.readouterr().err


def test_repeated_force_in_one_second_numbers_the_old_sets_from_one_base(gold, tmp_path, monkeypatch):
    """Three --force dumps within one clock second: g.prev-T, g.prev-T-1, g.prev-T-2 (was g.prev-T-1-2)."""
    import time as _time

    out = tmp_path / "g"
    shutil.copytree(gold, out)
    real = _time.strftime
    monkeypatch.setattr(_time, "strftime", lambda fmt, *a: "20261206-000000" if fmt == "%Y%m%d-%H%M%S" else
                        real(fmt, *a))
    for _ in range(3):
        assert dump_main(["--ref", "--out", str(out), "--force"]) == 0
    names = sorted(p.name for p in tmp_path.glob("g.prev-*"))
    assert names == ["g.prev-20261206-000000", "g.prev-20261206-000000-1", "g.prev-20261206-000000-2"], names


def test_edited_top10_ids_are_refused(gold, tmp_path):
    """top10_ids is checked against the manifest's top10_sha256 like every other tensor."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "g"
    shutil.copytree(gold, out)
    data = load_file(str(out / "tensors.safetensors"))
    data["top10_ids"] = data["top10_ids"].flip(-1).contiguous()
    save_file(data, str(out / "tensors.safetensors"))
    with pytest.raises(GoldenError, match="top10_ids do not match top10_sha256"):
        GoldenSet.load(out)


def test_suggested_commands_are_shell_quoted(tmp_path):
    """A path with a space in an error's suggested command is quoted: pasted into a shell, the command gets the
    path as one argument."""
    import re
    import shlex

    from parity.dump import DEFAULT_MODEL
    from parity.golden import GoldenError
    from parity.run import load_fresh_golden

    g = tmp_path / "my goldens"
    with pytest.raises(GoldenError) as e:
        load_fresh_golden(g, DEFAULT_MODEL)
    cmd = re.search(r"`(python -m parity\.dump [^`]*)`", str(e.value)).group(1)
    argv = shlex.split(cmd)
    assert argv[argv.index("--out") + 1] == str(g) and argv[argv.index("--model") + 1] == str(DEFAULT_MODEL)


def test_regenerate_advice_names_the_set_and_its_model(tmp_path):
    """A broken golden set's advice rebuilds that set from the model its manifest records (a bare
    `parity.dump --ref --force` would rebuild the default set instead)."""
    import shlex

    from parity.golden import GoldenError, GoldenSet

    from parity.dump import DEFAULT_GOLDEN

    g = tmp_path / "my set"
    shutil.copytree(DEFAULT_GOLDEN, g)
    (g / "tensors.safetensors").unlink()
    with pytest.raises(GoldenError, match="incomplete golden set") as e:
        GoldenSet.load(g)
    model = json.loads((g / "manifest.json").read_text())["model"]["dir"]
    assert f"--model {shlex.quote(model)} --out {shlex.quote(str(g))} --force" in str(e.value), str(e.value)
