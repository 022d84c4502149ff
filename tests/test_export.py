"""Offline repack export (python -m trit.export): the exported tiny-bitnet decodes to the same
integers and scales, reproduces every reference tensor bit for bit, loads into vLLM layers as
stored (no repack) where the partitions allow, and generates the same greedy tokens in vLLM."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from reference.checkpoint import Checkpoint, CheckpointError
from reference.formats import FormatError, ScaleSpec
from reference.spec import SPEC_FILENAME, CheckpointSpec, LinearEntry, decode_linear, spec_for
from trit import export as tx
from trit.ops import repack

MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny-bitnet"
P0 = "model.layers.0"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("x") / "tiny-exported"
    tx.export(MODEL, out, log=lambda m: None)
    return out


@pytest.fixture(scope="module")
def exported_inv(tmp_path_factory):
    out = tmp_path_factory.mktemp("xi") / "tiny-exported-inv"
    tx.export(MODEL, out, invert_scales=True, log=lambda m: None)
    return out


# ---------------------------------------------------------------------------------------- spec


def test_spec_json_of_existing_specs_is_unchanged():
    spec = spec_for(MODEL)
    assert all(e.layout is None for e in spec.linears.values())
    assert '"layout"' not in spec.to_json()  # so existing digests (goldens' manifests) stay as they were
    e = LinearEntry("w", (40, 300), layout="trit-tile16x128", scale=ScaleSpec("s", "channel"))
    assert LinearEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e
    with pytest.raises(FormatError, match="no 'pack'"):
        LinearEntry("w", (40, 300), layout="trit-tile16x128", pack=spec.linears[f"{P0}.mlp.up_proj"].pack)
    with pytest.raises(FormatError, match="per-channel or per-tensor"):
        LinearEntry("w", (40, 300), layout="trit-tile16x128", scale=ScaleSpec("s", "group", group_size=64))
    with pytest.raises(FormatError, match="unknown layout"):
        LinearEntry("w", (40, 300), layout="tile8x64")


def test_export_layout_files_and_config(exported):
    spec = CheckpointSpec.load(exported / SPEC_FILENAME)
    ck = Checkpoint(exported)
    e = spec.linears[f"{P0}.mlp.down_proj"]  # logical (128, 344): K padded to 384
    assert e.layout == "trit-tile16x128" and e.pack is None and e.scale.op == "divide"  # bitlinear divisor kept
    assert ck.info(e.weight_key).dtype == "I32" and tuple(ck.info(e.weight_key).shape) == (8, 384)
    assert tuple(ck.info(e.scale.key).shape) == (128,)
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "ternary"
    assert cfg["quantization_config"]["source_quantization_config"]["quant_method"] == "bitnet"
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (exported / f).read_bytes() == (MODEL / f).read_bytes()


def test_decoded_integers_bit_identical_and_scales_exact(exported, exported_inv):
    src, s0 = Checkpoint(MODEL), spec_for(MODEL)
    for out, inverted in ((exported, False), (exported_inv, True)):
        ck, s1 = Checkpoint(out), spec_for(out)
        assert set(s1.linears) == set(s0.linears)
        for mod, e0 in s0.linears.items():
            a, b = decode_linear(src, e0, mod), decode_linear(ck, s1.linears[mod], mod)
            assert b.values.dtype == torch.int8 and torch.equal(a.values, b.values), mod
            n = a.values.shape[0]
            # the multiplier is 1/s, the same fp32 value the source decode computes
            assert torch.equal(a.mult.reshape(-1).expand(n), b.mult.reshape(-1)), mod
            if inverted:
                assert b.div is None and s1.linears[mod].scale.op == "multiply"
            else:
                assert torch.equal(a.div.reshape(-1).expand(n), b.div.reshape(-1)), mod


def test_reference_goldens_of_export_equal_the_originals(exported, tmp_path):
    """parity.dump on the exported dir: every canonical tensor (embed .. logits) and the inputs
    hash exactly as the original's (default export keeps the BitLinear divisor)."""
    from parity.dump import dump_reference

    g0, g1 = dump_reference(MODEL, tmp_path / "g0"), dump_reference(exported, tmp_path / "g1")
    m0, m1 = (json.loads((g / "manifest.json").read_text()) for g in (g0, g1))
    assert m0["order"] == m1["order"] and m0["inputs"] == m1["inputs"]
    diff = [n for n in m0["order"] if m0["tensors"][n]["sha256"] != m1["tensors"][n]["sha256"]]
    assert not diff, f"exported reference differs at {diff[:5]}"


def test_inverted_scales_export_within_a8_tier(exported_inv):
    """--invert-scales: the reference multiplies by 1/s instead of dividing by s; under int8
    activations the ulp differences compound (fp32-a8 tier, 5e-2), the integers do not change."""
    from reference.model import ReferenceModel

    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(7))
    a = ReferenceModel.from_dir(MODEL).forward(ids)
    b = ReferenceModel.from_dir(exported_inv).forward(ids)
    assert ((a - b).abs().max() / a.abs().max()).item() < 5e-2


def test_sharded_export_has_an_index_and_decodes_the_same(exported, tmp_path):
    out = tmp_path / "sharded"
    tx.export(MODEL, out, max_shard_bytes=150_000, log=lambda m: None)
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 1 and (out / "model.safetensors.index.json").exists()
    a, b = Checkpoint(exported), Checkpoint(out)  # the reader checks the index against the shards
    assert sorted(a.keys()) == sorted(b.keys())
    assert all(torch.equal(a.get(k), b.get(k)) for k in a.keys())


# ---------------------------------------------------------------------------------------- errors


def test_group_scales_are_refused_naming_the_module(tmp_path, capsys):
    spec = spec_for(MODEL)
    mod = "model.layers.2.mlp.up_proj"
    linears = dict(spec.linears)
    linears[mod] = dataclasses.replace(linears[mod], scale=ScaleSpec(key=f"{mod}.weight_scale",
                                                                     granularity="group", group_size=64))
    bad = tmp_path / "group_spec.json"
    dataclasses.replace(spec, linears=linears).save(bad)
    with pytest.raises(tx.ExportError, match=r"model\.layers\.2\.mlp\.up_proj: group-wise scale .*group_size 64"):
        tx.export(MODEL, tmp_path / "out", spec_path=bad)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
    assert tx.main([str(MODEL), "--out", str(tmp_path / "out"), "--spec", str(bad)]) == 2
    assert "model.layers.2.mlp.up_proj: group-wise scale" in capsys.readouterr().err


def test_refuses_existing_output_and_reexport(exported, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("keep")
    with pytest.raises(FileExistsError, match="--force"):
        tx.export(MODEL, tmp_path / "o")
    with pytest.raises(tx.ExportError, match="already in a kernel layout"):
        tx.export(exported, tmp_path / "again")


def test_force_never_deletes_what_is_not_an_export(tmp_path, monkeypatch):
    """--force replaced --out by rmtree: an --out that contained the source deleted the source (and the folder's other
    files); `--out ..` from inside emptied the parent; `--out .` failed with "PosixPath('.') has an empty name"."""
    parent = tmp_path / "parent"
    shutil.copytree(MODEL, parent / "src")
    (parent / "other.txt").write_text("keep")
    with pytest.raises(tx.ExportError, match=r"contains the source directory .*/parent/src"):
        tx.export(parent / "src", parent, force=True, log=lambda m: None)
    assert (parent / "src" / "config.json").exists() and (parent / "other.txt").read_text() == "keep"
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    for o in (".", ".."):
        with pytest.raises(tx.ExportError, match=r"contains the current directory"):
            tx.export(MODEL, o, force=True, log=lambda m: None)
    assert (parent / "other.txt").exists() and (tmp_path / "empty").is_dir()
    (tmp_path / "notexp").mkdir()
    (tmp_path / "notexp" / "x").write_text("keep")
    with pytest.raises(tx.ExportError, match=r"notexp exists and is not a trit export .* even with --force"):
        tx.export(MODEL, tmp_path / "notexp", force=True, log=lambda m: None)
    (tmp_path / "afile").write_text("keep")
    with pytest.raises(tx.ExportError, match=r"afile exists and is not a directory"):
        tx.export(MODEL, tmp_path / "afile", force=True, log=lambda m: None)
    assert (tmp_path / "notexp" / "x").read_text() == "keep" and (tmp_path / "afile").read_text() == "keep"
    out = tmp_path / "out"
    tx.export(MODEL, out, log=lambda m: None)
    tx.export(MODEL, out, force=True, log=lambda m: None)  # an export replaces an export
    assert (out / SPEC_FILENAME).is_file() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_leftovers_of_a_killed_export_are_cleaned(tmp_path):
    """A killed export left .OUT.tmp-PID (a hidden copy the size of the model) that no rerun removed (the name holds the
    dead process's id); one killed between its two renames left the old export only as .OUT.old-PID."""
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    out = tmp_path / "out"
    tx.export(MODEL, out, log=lambda m: None)
    stale = tmp_path / f".out.tmp-{dead}"
    shutil.copytree(out, stale)
    out.rename(tmp_path / f".out.old-{dead}")  # killed after moving the old export aside
    live = tmp_path / f".out.tmp-{__import__('os').getpid()}x"  # not a pid name: left alone
    live.mkdir()
    with pytest.raises(FileExistsError, match="--force"):  # the old export is back in place, and kept
        tx.export(MODEL, out, log=lambda m: None)
    assert (out / SPEC_FILENAME).is_file() and not stale.exists() and not (tmp_path / f".out.old-{dead}").exists()
    assert live.exists()


def test_corrupt_tiles_are_named(exported, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(exported, bad)
    sd = load_file(str(bad / "model.safetensors"))
    key = f"{P0}.self_attn.k_proj.weight"
    sd[key] = sd[key] | 3  # code 3 (unused) in every slot
    save_file(sd, str(bad / "model.safetensors"))
    e = spec_for(bad).linears[f"{P0}.self_attn.k_proj"]
    with pytest.raises(CheckpointError, match=r"k_proj\.weight.*unused code 3"):
        decode_linear(Checkpoint(bad), e, f"{P0}.self_attn.k_proj")


# ---------------------------------------------------------------------------------------- vLLM


def test_tiles_slice_like_tp_shards():
    """What vLLM's loaders do with packed_dim=0, packed_factor=16 (narrow 16-row tile rows) and
    with input_dim=1 (narrow words in 128-input k-blocks) equals repacking the logical shard."""
    w = torch.randint(-1, 2, (96, 512), dtype=torch.int8, generator=torch.Generator().manual_seed(5))
    p = repack(w)
    for tp in (2, 4):
        n, k = 96 // tp, 512 // tp
        for r in range(tp):
            if n % 16 == 0:
                assert torch.equal(p.narrow(0, r * n // 16, n // 16), repack(w[r * n:(r + 1) * n]))
            assert torch.equal(p.narrow(1, r * k, k), repack(w[:, r * k:(r + 1) * k]))
    # fused q|k|v: concatenated tiles == tiles of the concatenation when every part is a multiple of 16
    parts = [w[:64], w[64:80], w[80:96]]
    assert torch.equal(torch.cat([repack(x) for x in parts]), p)


def test_prepacked_route_conditions():
    from trit.vllm.keymap import prepacked_route

    e = [LinearEntry("w", (64, 128), layout="trit-tile16x128")]
    ok = dict(column_sharded=False, backend_name="trit.ops")
    assert prepacked_route(e, [64], 128, 128, **ok) is None
    assert prepacked_route(e, [70], 128, 128, **ok) is None  # unsharded, unfused: any N
    assert "multiples of 16" in prepacked_route(e * 2, [344, 344], 128, 128, **ok)
    assert "multiples of 16" in prepacked_route(e, [40], 128, 128, column_sharded=True, backend_name="trit.ops")
    assert "k-block" in prepacked_route(e, [64], 172, 344, **ok)  # row-parallel shard of 172 inputs
    assert "backend" in prepacked_route(e, [64], 128, 128, column_sharded=False, backend_name="torch-ref")
    assert "not every module" in prepacked_route([LinearEntry("w", (64, 128))], [64], 128, 128, **ok)


@pytest.mark.vllm
def test_vllm_loads_export_as_stored_and_generates_identically(vllm_target, exported):
    def layers(m):
        return {n: (bool(l.trit_prepacked), l.weight.data.clone(), l.weight_scale.data.clone())
                for n, l in m.named_modules() if hasattr(l, "trit_prepacked")}

    got = vllm_target.apply_model(exported, layers)
    want = vllm_target.apply_model(MODEL, layers)
    assert set(got) == set(want) and len(got) == 16
    for name, (pre, w, s) in got.items():
        # tiny-bitnet: q/k/v 128|64|64, o 128, down 128 rows -> as stored; gate|up 344|344 (not multiples
        # of 16) -> decode route; either way the kernel weight and scales equal the original route's
        assert pre == (not name.endswith("gate_up_proj")), name
        assert not want[name][0]
        assert torch.equal(w, want[name][1]) and torch.equal(s, want[name][2]), name
    ids = torch.randint(3, 512, (3, 12), generator=torch.Generator().manual_seed(11))
    assert torch.equal(vllm_target.generate(exported, ids, 16), vllm_target.generate(MODEL, ids, 16))


def test_online_mode_checkpoint_exports_with_its_multipliers(tmp_path):
    """quantization_mode 'online' (float latent weights): the export ternarizes each module as the
    model does and stores 1 / mean|W|'s divisor as the channel scale (the scale was dropped before:
    entry.scale is None there); the exported model's logits equal the original's bit for bit."""
    from reference.make_model import Preset, to_online, write_model
    from reference.model import ReferenceModel

    d = to_online(write_model(Preset("bitnet", 64, 96, 2, 4, 2, 67, False, linear_class="autobitlinear", seed=35),
                              tmp_path / "m"), seed=4)
    out = tmp_path / "x"
    tx.export(d, out, log=lambda m: None)
    ids = torch.arange(3, 40).reshape(1, -1)
    assert torch.equal(ReferenceModel.from_dir(out).forward(ids), ReferenceModel.from_dir(d).forward(ids))


def test_float_stored_ternary_exports_with_its_magnitudes_as_scales(tmp_path):
    """TriLM stores {-s, 0, +s} as float weights with no scale tensor. One s per output row (trilm-row): the export
    moves each row's s into the fp32 per-channel multiplier and packs sign(W) - every decoded weight equals the
    original's bit for bit, the reference output stays within the fp32-a8 tier. Megatron-sharded TriLM (trilm: o /
    down_proj with one s per column shard, varying along K) has no per-row multiplier: refused, naming the module."""
    from reference import synth
    from reference.inspect import inspect_dir

    logical = synth.Logical.from_dir(Path(__file__).resolve().parent.parent / "models" / "tiny-trained")
    for fmt in ("trilm", "trilm-row"):
        synth.write(fmt, logical, tmp_path / fmt)
        inspect_dir(tmp_path / fmt, use_loss=False).spec.save(tmp_path / fmt / SPEC_FILENAME)
    with pytest.raises(tx.ExportError, match=r"(o_proj|down_proj): tensor .* not one magnitude per output row"):
        tx.export(tmp_path / "trilm", tmp_path / "out0")
    assert not (tmp_path / "out0").exists()
    src = tmp_path / "trilm-row"
    out = tmp_path / "out"
    s1 = tx.export(src, out)
    s0 = spec_for(src)
    c0, c1 = Checkpoint(src), Checkpoint(out)
    for mod, e in s0.linears.items():
        a, b = decode_linear(c0, e, mod), decode_linear(c1, s1.linears[mod], mod)
        assert torch.equal(a.effective(), b.effective()), mod
        assert s1.linears[mod].scale.granularity == "channel" and b.values.dtype == torch.int8
    # the same weights; the reference now sums sign(W) and multiplies by s after the sum (ulps that int8
    # activations compound, as for --invert-scales): the fp32-a8 tier (5e-2)
    from reference.model import ReferenceModel

    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(7))
    a, b = ReferenceModel.from_dir(src).forward(ids), ReferenceModel.from_dir(out).forward(ids)
    assert ((a - b).abs().max() / a.abs().max()).item() < 5e-2
    w = torch.tensor([[0.5, -0.5, 0.0], [0.25, 0.0, -0.75]])
    assert tx._row_magnitudes(w) is None
    assert torch.equal(tx._row_magnitudes(torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]])), torch.tensor([0.5, 1.0]))
