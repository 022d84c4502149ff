"""The pytest integration, run as a user would: ids carry canonical names, -k selects a
layer, the session summary names the first divergence, stale goldens say so."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _pytest(*args, cwd=ROOT):
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1"}
    p = subprocess.run([sys.executable, "-m", "pytest", "parity/", "-q", "-p", "no:cacheprovider", *args],
                       cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    return p.returncode, p.stdout + p.stderr


def _golden_with_layer2_o_proj_scaled(tmp_path) -> Path:
    """A copy of the bundled golden set whose layer2.attn.o_proj is 1.5x (manifest hash updated): a target that
    reproduces the reference diverges there first."""
    from parity.golden import sha256_tensor
    from safetensors.torch import load_file, save_file

    g = tmp_path / "golden"
    shutil.copytree(ROOT / "golden" / "tiny-bitnet", g)
    data = load_file(str(g / "tensors.safetensors"))
    data["layer2.attn.o_proj"] = data["layer2.attn.o_proj"] * 1.5
    save_file(data, str(g / "tensors.safetensors"))
    m = json.loads((g / "manifest.json").read_text())
    m["tensors"]["layer2.attn.o_proj"]["sha256"] = sha256_tensor(data["layer2.attn.o_proj"])
    (g / "manifest.json").write_text(json.dumps(m))
    return g


def test_k_layer3_selects_only_layer3(tmp_path):
    rc, out = _pytest("--target", "reference", "-k", "layer3", "--runs", str(tmp_path), "-v", "-v")
    assert rc == 0, out
    ids = [l for l in out.splitlines() if "test_parity[" in l and "PASSED" in l]
    assert len(ids) == 14 and all("test_parity[layer3." in l for l in ids), out
    assert "no divergence" in out


def test_failure_names_first_divergent_layer(tmp_path):
    g = _golden_with_layer2_o_proj_scaled(tmp_path)
    rc, out = _pytest("--target", "reference", "--golden", str(g), "--runs", str(tmp_path / "runs"))
    assert rc == 1, out
    assert "1 failed, 59 passed" in out, out
    assert "FIRST DIVERGENCE: layer2.attn.o_proj (layer 2, operator attn.o_proj)" in out
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "failures.safetensors").exists()


def test_stale_golden_fails_every_test_with_reason(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(ROOT / "models" / "tiny-bitnet", model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rope_parameters"]["rope_theta"] = 500000.0
    (model / "config.json").write_text(json.dumps(cfg))
    rc, out = _pytest("--target", "reference", "--model", str(model), "--golden",
                      str(ROOT / "golden" / "tiny-bitnet"), "-k", "layer0.attn", "--runs", str(tmp_path))
    assert rc == 1
    assert "StaleGolden" in out and "config.json changed" in out and "parity.dump --ref" in out


def test_k_selects_one_layer_of_a_deep_model(tmp_path):
    """pytest's -k matches substrings: on a model of 10+ layers `-k layer1` also takes layer10..layer11; the
    README's `-k layer1.` takes layer 1 alone (collection only, from a manifest of 12 layers)."""
    from parity.names import canonical_names

    g = tmp_path / "golden"
    g.mkdir()
    (g / "manifest.json").write_text(json.dumps({"order": canonical_names(12, "bitnet")}))
    for k, want in (("layer1", 3 * 14), ("layer1.", 14)):
        rc, out = _pytest("--golden", str(g), "--co", "-k", k)
        ids = [l for l in out.splitlines() if "test_parity[" in l]
        assert len(ids) == want, out
    assert all("test_parity[layer1." in l for l in ids), ids


def test_missing_or_corrupt_golden_is_said_even_when_k_deselects_it(tmp_path):
    """A missing golden set under -k (the placeholder test deselected) and a manifest that is not JSON (was a
    collection traceback): the terminal summary says what is wrong and how to make the set, naming the model."""
    rc, out = _pytest("--golden", str(tmp_path / "nothere"), "-k", "layer3", "--runs", str(tmp_path))
    assert rc != 0 and f"no golden set at {tmp_path / 'nothere'}" in out, out
    assert f"--model {ROOT / 'models' / 'tiny-bitnet'} --out {tmp_path / 'nothere'}" in out, out
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    rc, out = _pytest("--golden", str(bad), "--runs", str(tmp_path))
    assert rc != 0 and "manifest.json: invalid JSON" in out and "Traceback" not in out, out


def test_k_matching_no_tensor_says_which_layers_exist(tmp_path):
    """`-k layer7` on a model with fewer layers: pytest alone says only "deselected"; the summary names the
    expression, the golden set and the layers it has (and no target runs)."""
    order = json.loads((ROOT / "golden" / "tiny-bitnet" / "manifest.json").read_text())["order"]
    last = max(int(n.split(".")[0][5:]) for n in order if n.startswith("layer"))
    rc, out = _pytest("--target", "reference", "-k", f"layer{last + 4}", "--runs", str(tmp_path))
    assert rc != 0, out
    assert (f"-k 'layer{last + 4}' selected none of the {len(order) + 1} parity tests of "
            f"{ROOT / 'golden' / 'tiny-bitnet'} (layers 0-{last}" in out), out
    assert not any(tmp_path.iterdir()), "a -k that selects nothing must not run the target"
    rc, out = _pytest("--target", "reference", "-k", "layer1.attn.q_proj", "--runs", str(tmp_path))
    assert rc == 0 and "selected none" not in out, out
    # a -k that selects other tests, and -m (not -k) deselecting the parity tests: no such message
    rc, out = _pytest("tests/test_golden.py", "-k", "shell_quoted", "--runs", str(tmp_path))
    assert rc == 0 and "selected none" not in out, out
    rc, out = _pytest("-m", "not parity", "--runs", str(tmp_path))
    assert "selected none" not in out and "-k ''" not in out, out
    # another golden set: the listing command names it (quoted)
    g = tmp_path / "my gold"
    shutil.copytree(ROOT / "golden" / "tiny-bitnet", g)
    rc, out = _pytest("--golden", str(g), "-k", "layer99", "--runs", str(tmp_path / "r"))
    assert f"`pytest parity/ --collect-only -q --golden '{g}'` lists them" in out, out


def test_manifest_that_is_not_one_is_said_cleanly(tmp_path):
    """A manifest whose order holds non-strings, or a manifest.json that is a directory: one line saying so and the
    command that rebuilds that set (not the default one), no traceback."""
    ints = tmp_path / "ints"
    ints.mkdir()
    (ints / "manifest.json").write_text('{"order": [1, 2]}')
    rc, out = _pytest("--golden", str(ints), "-k", "layer7", "--runs", str(tmp_path))
    assert rc != 0 and "non-string entries" in out and "Traceback" not in out, out
    assert f"--out {ints} --force" in out, out
    d = tmp_path / "dir"
    (d / "manifest.json").mkdir(parents=True)
    rc, out = _pytest("--golden", str(d), "--runs", str(tmp_path))
    assert rc != 0 and "Is a directory" in out and "Traceback" not in out and "INTERNALERROR" not in out, out


def test_run_cli_prints_the_rows_around_the_failure_unless_all(tmp_path, capsys):
    """parity.run on a failing run prints the table around the first divergence (as the README says) and how many
    rows it left out; --all prints every row."""
    from parity.run import main as run_main

    g = _golden_with_layer2_o_proj_scaled(tmp_path)
    args = ["--target", "reference", "--golden", str(g), "--runs", str(tmp_path / "runs")]
    assert run_main(args) == 1
    short = capsys.readouterr().out
    assert run_main(args + ["--all"]) == 1
    full = capsys.readouterr().out
    rows = lambda out: [ln for ln in out.splitlines() if ln.lstrip().startswith(("layer", "embed", "final", "logits"))]  # noqa: E731
    assert len(rows(short)) == 11 and "layer2.attn.o_proj" in short and "--all prints every row" in short, short
    assert len(rows(full)) == len(json.loads((g / "manifest.json").read_text())["order"]) and "--all prints" not in full
