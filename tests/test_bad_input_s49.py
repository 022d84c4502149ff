"""Bad input, adversarial pass of session 49: each case ended in a traceback, a message without the file / key /
expected value, a hang, or a silent pass before. Every test here fails without its fix."""
from __future__ import annotations

import json
import shutil
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference.checkpoint import Checkpoint, CheckpointError, load_config
from reference.config import ModelConfig
from reference.inspect import main as inspect_main
from reference.spec import spec_for

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
BUNDLED = ROOT / "models" / "tiny-bitnet"
GOLDEN = ROOT / "golden" / "tiny-bitnet"
K = "model.layers.1.self_attn.k_proj.weight"


@pytest.fixture
def model(tmp_path) -> Path:
    d = tmp_path / "m"
    shutil.copytree(TRAINED, d)
    return d


@pytest.fixture
def gcopy(tmp_path) -> Path:
    d = tmp_path / "g"
    shutil.copytree(GOLDEN, d)
    return d


@contextmanager
def deadline(seconds: int):
    """A hang fails the test instead of stalling the suite."""
    def boom(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def set_config_text(d: Path, old: str, new: str) -> None:
    p = d / "config.json"
    t = p.read_text()
    assert old in t
    p.write_text(t.replace(old, new))


def header(f: Path):
    data = f.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    return data, hlen, json.loads(data[8:8 + hlen])


def write_header(f: Path, h: dict, body: bytes) -> None:
    raw = json.dumps(h).encode()
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def cli_error(capsys, argv) -> str:
    assert inspect_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "unexpected" not in err, err
    return err


# ---------------------------------------------------------------------------------------
# config.json


def test_config_infinity_is_named_not_an_overflow(model, capsys):
    # was: "error: unexpected OverflowError: cannot convert float infinity to integer" (no file, no key)
    set_config_text(model, '"hidden_size": 128', '"hidden_size": Infinity')
    with pytest.raises(CheckpointError, match=r"config.json: hidden_size is Infinity; expected a finite number"):
        ModelConfig.load(model)
    err = cli_error(capsys, [str(model), "--no-loss", "--out", str(model / "s.json")])
    assert "config.json" in err and "hidden_size" in err


def test_config_nan_eps_is_refused_by_name(model):
    # was accepted: inspect / decode exit 0, and parity.dump named only 'layer0.input_norm' as not finite
    set_config_text(model, '"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN')
    with pytest.raises(CheckpointError, match=r"config.json: rms_norm_eps is NaN; expected a finite number"):
        ModelConfig.load(model)


def test_config_nested_nan_names_its_key_path(model):
    set_config_text(model, '"rope_theta": 10000.0', '"rope_theta": -Infinity')
    with pytest.raises(CheckpointError, match=r"rope_parameters\.rope_theta is -Infinity"):
        load_config(model)


def test_config_not_utf8_names_the_file(model):
    # was a bare UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 ... (no file)
    p = model / "config.json"
    p.write_bytes(p.read_bytes().replace(b'"model_type"', b'"author": "Jos\xe9", "model_type"'))
    with pytest.raises(CheckpointError, match=r"config.json: not UTF-8 text .*at byte \d+"):
        load_config(model)


@pytest.mark.parametrize("value", [["bitnet"], "bitnet", 3])
def test_quantization_config_that_is_not_an_object(model, value, capsys):
    # was: AttributeError: 'list' object has no attribute 'get' (a traceback from parity.dump)
    from parity.dump import main as dump_main

    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = value
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config.json: quantization_config is a \w+ .*expected a JSON object"):
        spec_for(model)
    assert dump_main(["--ref", "--model", str(model), "--out", str(model.parent / "g"), "--no-floor"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "quantization_config" in err and not (model.parent / "g").exists()


def test_absurd_layer_count_is_refused_before_listing_modules(model):
    # 10**23 layers listed modules until memory ran out (no message); a smaller absurd count failed on a missing key
    cfg = json.loads((model / "config.json").read_text())
    for n in (200_000, 10 ** 23):
        cfg["num_hidden_layers"] = n
        (model / "config.json").write_text(json.dumps(cfg))
        with deadline(20), pytest.raises(CheckpointError, match=rf"num_hidden_layers is {n}, but the checkpoint holds "
                                                                 rf"only 56 tensors"):
            spec_for(model)


# ---------------------------------------------------------------------------------------
# safetensors headers, indexes, pickles


def test_gap_between_tensors_is_named_with_the_header(model):
    # Checkpoint() accepted it; the first read of the tensor behind the gap failed in safetensors' own words
    f = model / "model.safetensors"
    data, hlen, h = header(f)
    body = data[8 + hlen:]
    b, e = h[K]["data_offsets"]
    for name, meta in h.items():
        if name != "__metadata__" and meta["data_offsets"][0] >= e:
            meta["data_offsets"] = [meta["data_offsets"][0] + 16, meta["data_offsets"][1] + 16]
    write_header(f, h, body[:e] + bytes(16) + body[e:])
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor '.*' starts at data byte {e + 16}, "
                                              rf"expected {e}: 16 unused bytes after tensor '{K}'"):
        Checkpoint(model)


def test_bytes_past_the_last_tensor_are_named(model):
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes() + bytes(32))
    with pytest.raises(CheckpointError, match=r"model.safetensors: the tensors end at data byte \d+ but the file has "
                                              r"\d+ data bytes: 32 bytes past the last tensor"):
        Checkpoint(model)


def test_metadata_that_safetensors_cannot_read_is_named(model):
    f = model / "model.safetensors"
    data, hlen, h = header(f)
    h["__metadata__"] = {"format": "pt", "step": 5}
    write_header(f, h, data[8 + hlen:])
    with pytest.raises(CheckpointError, match=r"model.safetensors: __metadata__ is .*expected an object of string"):
        Checkpoint(model)


def shard(d: Path) -> dict:
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    keys = list(sd)
    wm = {}
    for i, part in enumerate((keys[:len(keys) // 2], keys[len(keys) // 2:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(d / name))
        wm.update({k: name for k in part})
    return wm


def test_index_not_utf8_names_the_index(model):
    # was a bare UnicodeDecodeError (no file named)
    wm = shard(model)
    (model / "model.safetensors.index.json").write_bytes(json.dumps({"weight_map": wm}).encode() + b"\xff")
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: not a valid safetensors index \(not "
                                              r"UTF-8"):
        Checkpoint(model)


def test_index_that_is_a_directory_is_named(model):
    shard(model)
    (model / "model.safetensors.index.json").mkdir()
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: cannot read the safetensors index"):
        Checkpoint(model)


@pytest.mark.parametrize("name", ["pytorch_model.BIN", "consolidated.00.PTH", "model.Ckpt"])
def test_pickle_of_any_suffix_case_is_refused_as_a_pickle(model, name):
    # was "no *.safetensors files in the directory": the pickle was not named (and never opened either way)
    (model / "model.safetensors").unlink()
    (model / name).write_bytes(b"\x80\x04not a pickle, never opened")
    with pytest.raises(CheckpointError, match=rf"{name}: refusing to load a pickle checkpoint"):
        Checkpoint(model)
    with pytest.raises(CheckpointError, match="refusing to load a pickle"):
        Checkpoint(model / name)


@pytest.mark.parametrize("key,dtype", [("model.embed_tokens.weight", torch.int8), ("model.norm.weight", torch.int32)])
def test_integer_float_parameter_is_refused_outside_the_inspector(model, key, dtype):
    # the inspector refused it; the config path (parity.dump, reference.decode, trit.export) read the integers as
    # values and wrote goldens, exit 0
    sd = load_file(str(model / "model.safetensors"))
    sd[key] = sd[key].to(dtype)
    save_file(sd, str(model / "model.safetensors"))
    cfg = ModelConfig.load(model)
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor '{key}' .* is I\d+, expected a float "
                                              rf"tensor"):
        spec_for(model, cfg).validate(cfg, Checkpoint(model))


# ---------------------------------------------------------------------------------------
# golden sets and noise floors


def edit_manifest(g: Path, fn) -> None:
    p = g / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))


def test_manifest_not_utf8_names_the_manifest(gcopy):
    from parity.golden import GoldenError, GoldenSet

    with open(gcopy / "manifest.json", "ab") as f:
        f.write(b"\xff")
    with pytest.raises(GoldenError, match=r"manifest.json: not UTF-8 text"):
        GoldenSet.load(gcopy)


def test_manifest_format_is_said_as_written_and_newer_named(gcopy):
    from parity.golden import GoldenSet, StaleGolden

    edit_manifest(gcopy, lambda m: m.__setitem__("format", "1"))
    with pytest.raises(StaleGolden, match=r"golden format '1', this harness reads format 1"):  # was "format 1 ... 1"
        GoldenSet.load(gcopy)
    edit_manifest(gcopy, lambda m: m.__setitem__("format", 2))
    with pytest.raises(StaleGolden, match=r"golden format 2, .* written by a newer harness"):
        GoldenSet.load(gcopy)


def test_manifest_layer_count_beyond_its_order_is_refused_at_once(gcopy):
    # num_layers 10**9 listed canonical names without end; this one listed 1.4 M names to say they differ
    from parity.golden import GoldenError, GoldenSet

    edit_manifest(gcopy, lambda m: m.__setitem__("num_layers", 100_000))
    with deadline(20), pytest.raises(GoldenError, match=r"num_layers 100000 but 'order' holds 59 names; .* at most 4"):
        GoldenSet.load(gcopy)


def test_manifest_inputs_shape_is_checked(gcopy):
    # was: TypeError: 'int' object is not iterable (traceback from parity.run)
    from parity.golden import GoldenError, GoldenSet

    edit_manifest(gcopy, lambda m: m["inputs"].__setitem__("shape", 5))
    with pytest.raises(GoldenError, match=r"inputs.shape is 5; expected \[prompts, tokens\]"):
        GoldenSet.load(gcopy)


def test_input_ids_beyond_the_vocabulary_are_named(gcopy):
    # consistently edited ids (sha updated) reached the target: IndexError in its embedding, a traceback
    from parity.golden import GoldenError, sha256_tensor
    from parity.run import load_fresh_golden

    tf = gcopy / "tensors.safetensors"
    d = load_file(str(tf))
    d["input_ids"] = d["input_ids"].clone()
    d["input_ids"][0, 0] = 100_000
    save_file(d, str(tf))
    edit_manifest(gcopy, lambda m: m["inputs"].__setitem__("input_ids_sha256", sha256_tensor(d["input_ids"])))
    with pytest.raises(GoldenError, match=r"tensors.safetensors: input_ids hold token 100000, .* vocab_size 512"):
        load_fresh_golden(gcopy, BUNDLED)


@pytest.mark.parametrize("body,pattern", [(b"[1, 2]", r"a list, not a noise file"),
                                          (b'{"format": \xff}', r"unreadable noise file \(.*utf-8")])
def test_noise_file_not_an_object_or_not_utf8_is_named(gcopy, body, pattern):
    # was AttributeError: 'list' object has no attribute 'get' / a UnicodeDecodeError without the file
    from parity.golden import GoldenError
    from parity.noise import load_noise

    (gcopy / "noise-bf16.json").write_bytes(body)
    with pytest.raises(GoldenError, match=rf"noise-bf16.json: {pattern}"):
        load_noise(gcopy, "bf16")


def test_run_checks_the_runs_path_before_the_capture(gcopy, tmp_path, monkeypatch, capsys):
    # a --runs that is a file failed after the whole capture, as "FileExistsError: [Errno 17] File exists"
    import parity.run as run
    from parity.targets.base import Target

    class NoCapture(Target):
        name = "nocapture"
        compute_dtype = "bfloat16"

        def capture(self, *a, **kw):
            raise AssertionError("captured although --runs cannot hold the report")

    monkeypatch.setattr(run, "get_target", lambda *a, **kw: NoCapture())
    runs = tmp_path / "afile"
    runs.write_text("")
    assert run.main(["--model", str(BUNDLED), "--golden", str(gcopy), "--runs", str(runs / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"--runs {runs / 'sub'}: {runs} is a file, not a directory" in err and "captured" not in err


def test_run_unknown_target_is_said_without_quotes(gcopy, capsys):
    from parity.run import main

    assert main(["--target", "nosuch", "--model", str(BUNDLED), "--golden", str(gcopy)]) == 2
    assert capsys.readouterr().err.startswith("error: unknown target 'nosuch'")  # was: error: "unknown target ...


@pytest.mark.parametrize("rtol", ["nan", "-1"])
def test_golden_diff_rtol_must_be_a_finite_number(gcopy, rtol, capsys):
    # --rtol nan passed every difference (rel > nan is False): two different sets 'agreed', exit 0
    from parity.golden_diff import main

    with pytest.raises(SystemExit) as e:
        main([str(gcopy), str(GOLDEN), "--rtol", rtol])
    assert e.value.code == 2 and "--rtol" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# bench records


@pytest.mark.parametrize("body,pattern", [
    (b"{bad", r"not a readable bench.kernels JSON record"),
    (b'{"meta": {}, "rows": []}\xff', r"not a readable bench.kernels JSON record"),
    (b'{"meta": {"device": "x"}, "rows": 5}', r"'meta' must be an object and 'rows' a list"),
    (b'{"meta": {"device": "x"}, "rows": [{"N": 2560, "M": 1}]}', r"rows\[0\] has K = None; expected a positive"),
    (b'{"meta": {"device": "x"}, "rows": [{"N": 2560, "K": 2560, "M": 1, "a8_us": "fast", "bf16_us": 3}]}',
     r"rows\[0\] \(N=2560, K=2560, M=1\) has a8_us = 'fast'; expected a time"),
])
def test_bench_targets_names_a_malformed_record(tmp_path, body, pattern):
    # were JSONDecodeError / UnicodeDecodeError / TypeError / KeyError tracebacks
    from bench.targets import main

    p = tmp_path / "rec.json"
    p.write_bytes(body)
    with pytest.raises(SystemExit, match=rf"bench.targets: {p}: {pattern}"):
        main([str(p), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_bench_targets_names_a_malformed_read_floor(tmp_path):
    from bench.targets import load_floor

    p = tmp_path / "floor.json"
    p.write_text('{"rows": [{"N": 2560, "K": 2560, "read_us": "1.0"}]}')
    with pytest.raises(SystemExit, match=r"floor.json: rows\[0\] .* has read_us = '1.0'; expected a time"):
        load_floor(p)


@pytest.mark.parametrize("arg", ["1=nan", "0=2.5", "32=-1"])
def test_bench_ceiling_targets_must_be_finite_ratios(arg):
    # 1=nan was taken: every check against it read 'not met', nothing said about the argument
    from bench.ceiling import parse_targets

    with pytest.raises(SystemExit, match=rf"--targets: '{arg}': expected a batch size >= 1 and a finite ratio > 0"):
        parse_targets(arg)
