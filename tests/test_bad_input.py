"""Bad input never ends in a bare traceback: each case gives a message naming file, tensor and
the expectation, and the CLI prints ``error: ...`` and exits 2.  The scanner is fuzzed."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as hst
from safetensors.torch import load_file, save_file

from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError
from reference.formats import FormatError
from reference.inspect import InspectError, inspect_dir, main as inspect_main
from reference.decode import main as decode_main
from reference.scan import scan

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
W = "model.layers.1.self_attn.k_proj.weight"
S = "model.layers.1.self_attn.k_proj.weight_scale"


@pytest.fixture
def model(tmp_path) -> Path:
    d = tmp_path / "m"
    shutil.copytree(TRAINED, d)
    return d


def edit(d: Path, fn, name="model.safetensors"):
    sd = load_file(str(d / name))
    fn(sd)
    save_file(sd, str(d / name))


def edit_config(d: Path, **kw):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kw)
    (d / "config.json").write_text(json.dumps(cfg))


def cli_error(d: Path, capsys) -> str:
    assert inspect_main([str(d), "--no-loss"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


# ---------------------------------------------------------------------------------------
# file-level corruption


def test_truncated_file(model, capsys):
    f = model / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    err = cli_error(model, capsys)
    assert "model.safetensors" in err and "truncated" in err


def test_header_lies_about_offsets(model, capsys):
    f = model / "model.safetensors"
    data = f.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    b, e = header[W]["data_offsets"]
    header[W]["data_offsets"] = [b, e + 4]  # claims 4 more bytes than dtype x shape needs
    raw = json.dumps(header).encode()
    raw += b" " * (hlen - len(raw)) if len(raw) <= hlen else b""
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + hlen:])
    err = cli_error(model, capsys)
    assert W in err and "needs" in err


def test_overlapping_tensors(model):
    f = model / "model.safetensors"
    data = f.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    a, b = names[0], names[1]
    n_b = header[b]["data_offsets"][1] - header[b]["data_offsets"][0]
    header[b]["data_offsets"] = [header[a]["data_offsets"][0], header[a]["data_offsets"][0] + n_b]
    raw = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + hlen:])
    with pytest.raises(CheckpointError, match="overlap"):
        Checkpoint(model)


def test_pickle_is_refused(tmp_path, capsys):
    d = tmp_path / "pt"
    d.mkdir()
    shutil.copy(TRAINED / "config.json", d)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle, never opened")
    err = cli_error(d, capsys)
    assert "pytorch_model.bin" in err and "pickle" in err and "safetensors" in err and "save_file" in err


def test_index_points_to_missing_tensor(model):
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.layers.9.mlp.up_proj.weight": "model.safetensors"}}))
    with pytest.raises(CheckpointError, match="model.layers.9.mlp.up_proj.weight"):
        Checkpoint(model)


# ---------------------------------------------------------------------------------------
# content that contradicts the config or the format


def test_config_inconsistent_with_shapes(model):
    edit_config(model, intermediate_size=400)
    with pytest.raises(InspectError) as e:
        inspect_dir(model, use_loss=False)
    msg = str(e.value)
    assert "model.safetensors" in msg and "mlp" in msg and "config.json implies" in msg and "400" in msg


def test_shape_not_divisible_by_pack_factor(tmp_path):
    d = tmp_path / "seed"
    synth.write("seed", synth.Logical.from_dir(TRAINED), d)
    edit_config(d, intermediate_size=386)  # 386 rows cannot come from [384, 32] uint8 / 4 per byte
    with pytest.raises(InspectError, match=r"not divisible by 4"):
        inspect_dir(d, use_loss=False)


def test_missing_key(model):
    edit(model, lambda sd: sd.pop(W))
    with pytest.raises(InspectError, match=r"missing key.*model\.layers\.1\.self_attn\.k_proj"):
        inspect_dir(model, use_loss=False)


def test_missing_float_key(model):
    edit(model, lambda sd: sd.pop("model.layers.2.mlp.ffn_sub_norm.weight"))
    with pytest.raises(InspectError, match=r"missing key.*ffn_sub_norm"):
        inspect_dir(model, use_loss=False)


def test_extra_key(model):
    edit(model, lambda sd: sd.__setitem__("model.layers.0.self_attn.rotary_junk.weight", torch.zeros(4)))
    with pytest.raises(InspectError, match=r"rotary_junk.*extra keys"):
        inspect_dir(model, use_loss=False)


def test_extra_companion_key(model):
    edit(model, lambda sd: sd.__setitem__(W.replace(".weight", ".weight_extra"), torch.zeros(2, dtype=torch.int32)))
    with pytest.raises(InspectError, match=r"weight_extra.*extra key"):
        inspect_dir(model, use_loss=False)


@pytest.mark.parametrize("leaf", ["input_scale", "k_scale"])
def test_static_activation_scale_is_named_not_read_as_the_weight_scale(model, leaf):
    """A static activation / cache scale beside a weight (FP8 and compressed-tensors checkpoints carry input_scale) is
    refused by its own name: it used to take the scale slot when it came first in the file, and the error then blamed
    the real weight_scale as the extra key (a module with only an input_scale would have been scaled by it)."""
    name = W.replace(".weight", f".{leaf}")
    edit(model, lambda sd: sd.__setitem__(name, torch.tensor([0.05])))
    with pytest.raises(InspectError) as e:
        inspect_dir(model, use_loss=False)
    msg = str(e.value)
    assert name in msg and "static activation / cache scale" in msg and "not supported" in msg
    assert f"{S!r}" not in msg.split("next to weight")[0]  # the weights' own scale is not the one blamed


def test_two_scales_are_named_together(model):
    """Two float tensors a module could read as its scale: both named, whichever comes first in the file."""
    other = W.replace(".weight", ".weight_scale_2")
    edit(model, lambda sd: sd.__setitem__(other, torch.tensor([0.5])))
    with pytest.raises(InspectError, match=r"two tensors read as its scale") as e:
        inspect_dir(model, use_loss=False)
    assert S in str(e.value) and other in str(e.value)


@pytest.mark.parametrize("bad,word", [(float("nan"), "NaN/Inf"), (float("inf"), "NaN/Inf"), (0.0, "zero")])
def test_bad_scale(model, bad, word, capsys):
    edit(model, lambda sd: sd.__setitem__(S, torch.tensor([bad])))
    err = cli_error(model, capsys)
    assert S in err and word in err and "model.safetensors" in err


def test_unused_code_occurs(model):
    def plant(sd):
        w = sd[W].clone()
        w[3, 5] = w[3, 5] | 0b11  # code 3 in slot 0: unused everywhere else
        sd[W] = w
    edit(model, plant)
    with pytest.raises(InspectError) as e:
        inspect_dir(model, use_loss=False)
    assert W in str(e.value) and "code 3" in str(e.value) and "expected 0" in str(e.value)


def test_asymmetric_gptq_zero_points(tmp_path):
    """Zero points that differ between groups are GPTQ's sym=False: read as per-group zero points (values q - z),
    not folded into the code table; here one tensor's zero points flip 1 -> 2 in one field of every word."""
    from reference.spec import decode_linear

    d = tmp_path / "gptq"
    lg = synth.Logical.from_dir(TRAINED)
    synth.write("gptq", lg, d)
    qz = "model.layers.0.self_attn.q_proj.qzeros"
    edit(d, lambda sd: sd.__setitem__(qz, sd[qz] ^ 0b11))  # one zero point per column flips 1 -> 2
    res = inspect_dir(d, use_loss=False)
    e = res.spec.linears["model.layers.0.self_attn.q_proj"]
    assert e.zero is not None and e.zero.key == qz
    t = lg.ternary["model.layers.0.self_attn.q_proj"].to(torch.int16)
    got = decode_linear(Checkpoint(d), e, "model.layers.0.self_attn.q_proj").values.to(torch.int16)
    # (q - z): the flipped fields (every 16th output column, z = 3 instead of 2) decode one lower
    moved = torch.zeros_like(t, dtype=torch.bool)
    moved[0::16] = True
    assert torch.equal(got, torch.where(moved, t - 1, t))


def test_permuted_g_idx_under_desc_act_false_is_named(tmp_path, capsys):
    """A valid act-order index (a permutation of arange(K) // 64) in a checkpoint whose config says desc_act false:
    readers that follow the config take consecutive groups, so the disagreement is an error naming the tensor and
    the key, not a silent choice."""
    d = tmp_path / "gptq"
    synth.write("gptq", synth.Logical.from_dir(TRAINED), d)
    gi = "model.layers.0.mlp.down_proj.g_idx"
    edit(d, lambda sd: sd.__setitem__(gi, sd[gi].flip(0).contiguous()))
    with pytest.raises(InspectError, match=rf"tensor '{gi}' permutes the inputs into groups .*config.json says "
                                           rf"quantization_config.desc_act False.*fix the config \(desc_act: true\)"):
        inspect_dir(d, use_loss=False)
    assert gi in cli_error(d, capsys)


GI = "model.layers.0.mlp.down_proj.g_idx"  # K = 384: 6 groups of 64


def _shuffle_one(t: torch.Tensor) -> torch.Tensor:
    """Input 5 moved to the next group: groups of 63 and 65 inputs."""
    t = t.clone()
    t[5] = (int(t[5]) + 1) % 6
    return t


@pytest.mark.parametrize("case,fn,want", [
    ("wrong length", lambda t: t[:-1].contiguous(), rf"tensor '{GI}' has 383 elements, expected one per input: K = 384"),
    ("out of range", lambda t: torch.where(torch.arange(384) == 7, 6, t).to(torch.int32),
     rf"group index '{GI}': input 7 is in group 6, outside \[0, 6\)"),
    ("negative", lambda t: torch.where(torch.arange(384) == 0, -1, t).to(torch.int32),
     rf"group index '{GI}': input 0 is in group -1, outside \[0, 6\)"),
    ("group sizes", _shuffle_one, rf"group index '{GI}': group \d holds (63|65) inputs, expected 64: an act-order "
                                  rf"index is a permutation of arange\(K\) // group_size"),
    ("float (NaN)", lambda t: torch.where(torch.arange(384) == 3, float("nan"), t.float()),
     rf"group index '{GI}' is float32, expected an integer tensor"),
])
def test_act_order_g_idx_is_checked(tmp_path, case, fn, want, capsys):
    """A GPTQ desc_act checkpoint whose g_idx is damaged: the error names the file, the tensor and what it must
    hold (one group per input, values in [0, G), each group group_size inputs, an integer dtype), from the API and
    the CLI; the same checks guard a decode through an already written spec."""
    from reference.decode import effective_weights
    from reference.spec import CheckpointSpec

    d = tmp_path / "gptq"
    synth.write("gptq-asym-int4-actorder", synth.Logical.from_dir(TRAINED), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    assert CheckpointSpec.load(d / "ternary_spec.json").linears["model.layers.0.mlp.down_proj"].g_idx == GI
    edit(d, lambda sd: sd.__setitem__(GI, fn(sd[GI])))
    with pytest.raises(InspectError, match=want):
        inspect_dir(d, use_loss=False)
    assert GI in cli_error(d, capsys), case
    # the spec written before the damage: its decode checks the index itself (formats.group_index)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: " + (
            rf"group index '{GI}' has shape \[383\], expected \[384\]" if case == "wrong length" else want)):
        effective_weights(d, validate=False)


def test_act_order_config_and_tensors_must_agree(tmp_path, capsys):
    """desc_act true with a module that has no g_idx (the groups of its scales cannot be placed), NaN scales in an
    act-order checkpoint: errors naming the tensor; static_groups (trivial g_idx) reads as consecutive groups."""
    d = tmp_path / "gptq"
    synth.write("gptq-asym-int4-actorder", synth.Logical.from_dir(TRAINED), d)
    edit(d, lambda sd: sd.pop(GI))
    with pytest.raises(InspectError, match=r"down_proj.qweight.*no g_idx next to it, but config.json says "
                                           r"quantization_config.desc_act True"):
        inspect_dir(d, use_loss=False)
    synth.write("gptq-asym-int4-actorder", synth.Logical.from_dir(TRAINED), d)
    sc = "model.layers.0.mlp.down_proj.scales"
    edit(d, lambda sd: sd[sc].__setitem__((1, 2), float("nan")))
    with pytest.raises(InspectError, match=rf"scale tensor '{sc}' has 1 NaN/Inf values"):
        inspect_dir(d, use_loss=False)
    assert sc in cli_error(d, capsys)


AWQ_MOD = "model.layers.1.self_attn.k_proj"  # logical 64 x 128: AutoAWQ g64 stores qweight [128, 8], qzeros [2, 8]


@pytest.fixture
def awq(tmp_path) -> Path:
    d = tmp_path / "awq"
    synth.write("awq-gemm-g64", synth.Logical.from_dir(TRAINED), d)
    return d


@pytest.mark.parametrize("case,fn,want", [
    ("qzeros missing", lambda sd: sd.pop(f"{AWQ_MOD}.qzeros"),
     rf"{AWQ_MOD}.qweight'.*qzeros missing.*qzeros int32 \[K/G, N/8\] = \[2, 8\].*'{AWQ_MOD}.qzeros'"),
    ("GPTQ-shaped qweight", lambda sd: sd.__setitem__(f"{AWQ_MOD}.qweight", torch.zeros(16, 64, dtype=torch.int32)),
     rf"{AWQ_MOD}.qweight'.*I32 \[16, 64\].*qweight int32 \[K, N/8\] = \[128, 8\].*GPTQ's"),
    ("qzeros shape", lambda sd: sd.__setitem__(f"{AWQ_MOD}.qzeros", sd[f"{AWQ_MOD}.qzeros"][:, :4].contiguous()),
     rf"{AWQ_MOD}.qzeros' is I32 \[2, 4\].*qzeros int32 \[K/G, N/8\] = \[2, 8\]"),
    ("scales shape", lambda sd: sd.__setitem__(f"{AWQ_MOD}.scales", sd[f"{AWQ_MOD}.scales"][:1].contiguous()),
     rf"{AWQ_MOD}.scales' is F16 \[1, 64\].*scales fp16 \[K/G, N\] = \[2, 64\]"),
    ("NaN scales", lambda sd: sd[f"{AWQ_MOD}.scales"].__setitem__((1, 5), float("nan")),
     rf"scales '{AWQ_MOD}.scales' have 1 NaN/Inf values \(first nan at group 1, output 5\)"),
    ("zero scales", lambda sd: sd[f"{AWQ_MOD}.scales"].__setitem__((0, 0), 0.0),
     rf"scales '{AWQ_MOD}.scales' have 1 zero values"),
])
def test_awq_broken_tensor_is_named(awq, case, fn, want, capsys):
    """A damaged AutoAWQ gemm module: the error names the tensor and the shape AutoAWQ's layout gives it (or the
    bad values), from the API and as the CLI's one-line error."""
    edit(awq, fn)
    with pytest.raises(InspectError, match=want):
        inspect_dir(awq, use_loss=False)
    err = cli_error(awq, capsys)
    assert AWQ_MOD in err and "AutoAWQ" in err, case


@pytest.mark.parametrize("change,want", [
    ({"bits": 8}, r"quantization_config.bits is 8: AutoAWQ packs 4-bit codes only"),
    ({"version": "gemv"}, r"qweight': I32 \[384, 16\], but AutoAWQ gemv \(group_size 64\) stores .* as qweight int32 "
                          r"\[N, K/8\] = \[128, 48\] \(that is AutoAWQ gemm's \[K, N/8\] qweight; config.json says "
                          r"version gemv\)"),
    ({"version": None, "format": "gemv_fast"},
     r"quantization_config.format is 'gemv_fast': AutoAWQ's gemv_fast layout \(awq/modules/linear/gemv_fast.py "
     r"WQLinear_GEMVFast\) is not read: qweight int16 \[N/4, K\].*qzeros fp16 \[8 W, N\] holding -\(scale \* z\)"),
    ({"version": "marlin"}, r"quantization_config.version is 'marlin': AutoAWQ's marlin layout .* is not read"),
    ({"version": "gemm_v9"}, r"quantization_config.version is 'gemm_v9': a layout this inspector has not read; "
                             r"AutoAWQ's 'gemm' .* and 'gemv' .* layouts are supported"),
    ({"zero_point": False}, r"quantization_config.zero_point is False: AutoAWQ writes gemm checkpoints with zero "
                            r"points only"),
    ({"group_size": 0}, r"quantization_config.group_size is 0"),
    ({"group_size": 128}, r"qzeros' is I32 \[(\d+), (\d+)\], but AutoAWQ gemm \(group_size 128\) stores .* as qzeros "
                          r"int32 \[K/G, N/8\] = \[(?!\1\])\d+, \2\]"),
    ({"group_size": 100}, r"K = \d+ inputs .* not a multiple of quantization_config.group_size 100"),
])
def test_awq_config_it_cannot_follow_is_named(awq, change, want, capsys):
    """quantization_config of quant_method awq that AutoAWQ's gemm layout does not cover (bits 8, other versions,
    zero_point false) or that contradicts the stored tensors (group_size): an error naming the key / tensor."""
    cfg = json.loads((awq / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (awq / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=want):
        inspect_dir(awq, use_loss=False)
    cli_error(awq, capsys)


# AutoAWQ gemv g64, module k_proj (64 x 128): 2 groups, calculate_zeros_width(128, 64) = 2 -> qweight [64, 16],
# qzeros [64, 2] (groups 2..15 padding), scales [64, 16] (columns 2..15 padding)
@pytest.fixture
def awq_gemv(tmp_path) -> Path:
    d = tmp_path / "awq-gemv"
    synth.write("awq-gemv-g64", synth.Logical.from_dir(TRAINED), d)
    return d


def _set(key, idx, value):
    def fn(sd):
        sd[key][idx] = value
    return fn


@pytest.mark.parametrize("case,fn,want", [
    ("qzeros missing", lambda sd: sd.pop(f"{AWQ_MOD}.qzeros"),
     rf"{AWQ_MOD}.qweight'.*qzeros missing.*qzeros int32 \[N, W\] = \[64, 2\].*'{AWQ_MOD}.qzeros'"),
    ("gemm-shaped qweight", lambda sd: sd.__setitem__(f"{AWQ_MOD}.qweight", torch.zeros(128, 8, dtype=torch.int32)),
     rf"{AWQ_MOD}.qweight'.*I32 \[128, 8\].*AutoAWQ gemv \(group_size 64\).*qweight int32 \[N, K/8\] = \[64, 16\] "
     rf"\(that is AutoAWQ gemm's \[K, N/8\] qweight"),
    ("qzeros shape", lambda sd: sd.__setitem__(f"{AWQ_MOD}.qzeros", sd[f"{AWQ_MOD}.qzeros"][:, :1].contiguous()),
     rf"{AWQ_MOD}.qzeros' is I32 \[64, 1\].*qzeros int32 \[N, W\] = \[64, 2\] \(W = calculate_zeros_width\(128, 64\): "
     rf"2 groups padded\)"),
    ("scales unpadded", lambda sd: sd.__setitem__(f"{AWQ_MOD}.scales", sd[f"{AWQ_MOD}.scales"][:, :2].contiguous()),
     rf"{AWQ_MOD}.scales' is F16 \[64, 2\].*scales fp16 \[N, 8 W\] = \[64, 16\] \(2 groups, zero-padded to 16"),
    ("NaN scales", _set(f"{AWQ_MOD}.scales", (5, 1), float("nan")),
     rf"scales '{AWQ_MOD}.scales' have 1 NaN/Inf values \(first nan at output 5, group 1\)"),
    ("zero scales", _set(f"{AWQ_MOD}.scales", (0, 0), 0.0), rf"scales '{AWQ_MOD}.scales' have 1 zero values"),
    ("scale padding", _set(f"{AWQ_MOD}.scales", (3, 9), 0.5),
     rf"scales '{AWQ_MOD}.scales' hold 0.5 at output 3, padding column 9 \(1 nonzero padding values\).*expected 0"),
    ("NaN in the scale padding", _set(f"{AWQ_MOD}.scales", (4, 2), float("nan")),
     rf"scales '{AWQ_MOD}.scales' hold nan at output 4, padding column 2 .*expected 0"),
    ("qzeros padding, second word", _set(f"{AWQ_MOD}.qzeros", (7, 1), 5),
     rf"qzeros '{AWQ_MOD}.qzeros' hold 5 at output 7, padding column 8 .*expected 0"),
    ("qzeros padding, first word", lambda sd: sd[f"{AWQ_MOD}.qzeros"].__setitem__((0, 0), sd[f"{AWQ_MOD}.qzeros"][0, 0]
                                                                                   | 0x300),
     rf"qzeros '{AWQ_MOD}.qzeros' hold 3 at output 0, padding column 2 .*expected 0"),
])
def test_awq_gemv_broken_tensor_is_named(awq_gemv, case, fn, want, capsys):
    """A damaged AutoAWQ gemv module: the error names the file, the tensor and the shape / value AutoAWQ's gemv layout
    gives it (WQLinear_GEMV's buffers; padding columns zero as from_linear leaves them), from the API and the CLI."""
    edit(awq_gemv, fn)
    with pytest.raises(InspectError, match=want) as ei:
        inspect_dir(awq_gemv, use_loss=False)
    assert "model.safetensors" in str(ei.value), case
    err = cli_error(awq_gemv, capsys)
    assert AWQ_MOD in err and "AutoAWQ" in err, case


@pytest.mark.parametrize("change,want", [
    ({"group_size": 16}, r"quantization_config.group_size is 16: AutoAWQ gemv takes group_size >= 128, 64 or 32 "
                         r"\(awq/modules/linear/gemv.py calculate_zeros_width raises NotImplementedError"),
    ({"group_size": 256}, r"K = 384 inputs .* not a multiple of quantization_config.group_size 256 \(WQLinear_GEMV "
                          r"asserts in_features % group_size == 0\)"),
    ({"group_size": 128}, r"qzeros' is I32 \[128, 2\], but AutoAWQ gemv \(group_size 128\) .* qzeros int32 \[N, W\] = "
                          r"\[128, 1\] \(W = calculate_zeros_width\(384, 128\): 3 groups padded\)"),
    ({"group_size": 32}, r"qzeros' is I32 \[128, 2\], but AutoAWQ gemv \(group_size 32\) .* \[N, W\] = \[128, 4\]"),
    ({"version": "gemm"}, r"qweight': I32 \[128, 48\], but AutoAWQ gemm \(group_size 64\) .* qweight int32 \[K, N/8\] = "
                          r"\[384, 16\] \(that is AutoAWQ gemv's \[N, K/8\] qweight; config.json says version gemm\)"),
    ({"zero_point": False}, r"quantization_config.zero_point is False: AutoAWQ writes gemv checkpoints with zero "
                            r"points only \(WQLinear_GEMV.from_linear"),
])
def test_awq_gemv_config_it_cannot_follow_is_named(awq_gemv, change, want, capsys):
    """A gemv checkpoint under a quantization_config that contradicts it (group sizes gemv cannot write or that the
    stored widths do not fit, version gemm, zero_point false): an error naming the key or the tensor."""
    cfg = json.loads((awq_gemv / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (awq_gemv / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=want):
        inspect_dir(awq_gemv, use_loss=False)
    cli_error(awq_gemv, capsys)


def test_awq_gemv_padding_is_checked_at_decode_too(awq_gemv):
    """The spec route (reference.decode / the reference model) after inspection: a nonzero scale or zero point in
    the padding columns is a CheckpointError naming the tensor, the column and the expected 0 (expand_scale /
    zero_matrix with ScaleSpec.padded_groups), not silently cropped."""
    from reference.spec import decode_linear

    spec = inspect_dir(awq_gemv, use_loss=False).spec
    e = spec.linears[AWQ_MOD]
    assert (e.scale.padded_groups, e.zero.padded_groups) == (16, 16)
    decode_linear(Checkpoint(awq_gemv), e, AWQ_MOD)  # clean
    edit(awq_gemv, _set(f"{AWQ_MOD}.scales", (3, 15), 1.0))
    with pytest.raises(CheckpointError, match=rf"'{AWQ_MOD}.scales' holds 1.0 at output 3, padding column 15 .*"
                                              rf"columns 2..15 past the 2 groups of K = 128 must be 0"):
        decode_linear(Checkpoint(awq_gemv), e, AWQ_MOD)
    edit(awq_gemv, _set(f"{AWQ_MOD}.scales", (3, 15), 0.0))
    edit(awq_gemv, _set(f"{AWQ_MOD}.qzeros", (2, 0), 1 << 28))  # group 7 of row 2
    with pytest.raises(CheckpointError, match=rf"'{AWQ_MOD}.qzeros' holds 1.0 at output 2, padding column 7"):
        decode_linear(Checkpoint(awq_gemv), e, AWQ_MOD)


def test_gptq_tensors_under_an_awq_config_are_said_to_be_gptq(tmp_path, capsys):
    """An AutoGPTQ checkpoint (qweight [K/8, N] with g_idx, as AutoGPTQ always writes) whose config.json says
    quant_method awq: the error says these are AutoGPTQ's tensors and which quant_method reads them (it named the
    g_idx an extra key of AWQ's layout before)."""
    d = tmp_path / "gptq-under-awq"
    synth.write("gptq-asym-int4", synth.Logical.from_dir(TRAINED), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                                  "version": "gemm"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=r"qweight'.*next to g_idx .*AutoGPTQ's layout \(qweight \[K/8, N\] \+ "
                                           r"g_idx\).*quant_method 'awq'.*needs quant_method 'gptq'"):
        inspect_dir(d, use_loss=False)
    assert "AutoGPTQ" in cli_error(d, capsys)


def test_bare_compressed_tensors_at_an_odd_width_asks_for_its_config(tmp_path, capsys):
    """compressed-tensors int3 without its quantization_config: the width is guessed from codes and shapes (2 / 4 /
    8-bit only), so the shape error says to add the config that names num_bits."""
    d = tmp_path / "ct3-bare"
    synth.write(lambda lg: synth.w_compressed_tensors_asym(lg, 3, "group", 64), synth.Logical.from_dir(TRAINED), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("quantization_config")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=r"weight_packed'.*cannot hold.*compressed-tensors' packed weight.*"
                                           r"quantization_config.*num_bits 3 / 5 / 6 / 7"):
        inspect_dir(d, use_loss=False)
    cli_error(d, capsys)


CT_MOD = "model.layers.1.self_attn.k_proj"  # logical 64 x 128: int4 g64 stores weight_packed [64, 16], zp [8, 2]


@pytest.fixture
def ct_asym(tmp_path) -> Path:
    d = tmp_path / "ct-asym"
    synth.write("compressed-tensors-asym-int4", synth.Logical.from_dir(TRAINED), d)
    return d


@pytest.mark.parametrize("case,fn,want", [
    ("zero point missing", lambda sd: sd.pop(f"{CT_MOD}.weight_zero_point"),
     rf"{CT_MOD}.weight_packed'.*weight_zero_point missing.*symmetric false.*weight_zero_point int32 \[ceil\(N/8\), G\] "
     rf"= \[8, 2\].*'{CT_MOD}.weight_zero_point'"),
    ("zero point shape", lambda sd: sd.__setitem__(f"{CT_MOD}.weight_zero_point",
                                                   sd[f"{CT_MOD}.weight_zero_point"][:4].contiguous()),
     rf"{CT_MOD}.weight_zero_point' is I32 \[4, 2\].*weight_zero_point int32 \[ceil\(N/8\), G\] = \[8, 2\].*or int8 "
     rf"\[64, 2\]"),
    ("zero point unpacked out of range", lambda sd: sd.__setitem__(f"{CT_MOD}.weight_zero_point",
                                                                   torch.full((64, 2), 12, dtype=torch.int8)),
     rf"zero points '{CT_MOD}.weight_zero_point' hold 12..12, outside the signed int4 range \[-8, 7\]"),
    ("weight_packed shape", lambda sd: sd.__setitem__(f"{CT_MOD}.weight_packed",
                                                      sd[f"{CT_MOD}.weight_packed"][:, :8].contiguous()),
     rf"{CT_MOD}.weight_packed'.*I32 \[64, 8\].*weight_packed int32 \[N, ceil\(K/8\)\] = \[64, 16\]"),
    ("scale shape", lambda sd: sd.__setitem__(f"{CT_MOD}.weight_scale", sd[f"{CT_MOD}.weight_scale"][:, :1].contiguous()),
     rf"{CT_MOD}.weight_scale' is BF16 \[64, 1\].*weight_scale \(float\) \[64, 2\]"),
    ("NaN scales", lambda sd: sd[f"{CT_MOD}.weight_scale"].__setitem__((3, 1), float("nan")),
     rf"scales '{CT_MOD}.weight_scale' have 1 NaN/Inf values \(first nan at output 3, group 1\)"),
    ("zero scales", lambda sd: sd[f"{CT_MOD}.weight_scale"].__setitem__((0, 0), 0.0),
     rf"scales '{CT_MOD}.weight_scale' have 1 zero values"),
    ("weight_shape", lambda sd: sd.__setitem__(f"{CT_MOD}.weight_shape", torch.tensor([64, 256])),
     rf"{CT_MOD}.weight_shape' says logical shape \[64, 256\], config.json implies \[64, 128\]"),
])
def test_ct_asym_broken_tensor_is_named(ct_asym, case, fn, want, capsys):
    """A damaged compressed-tensors symmetric-false module: the error names the tensor and the shape compressed-
    tensors' layout gives it (both zero point generations where it could be either), or the bad values, from the
    API and as the CLI's one-line error."""
    edit(ct_asym, fn)
    with pytest.raises(InspectError, match=want):
        inspect_dir(ct_asym, use_loss=False)
    err = cli_error(ct_asym, capsys)
    assert CT_MOD in err and "compressed-tensors" in err, case


def _ct_weights(**kw):
    return lambda q: q["config_groups"]["group_0"]["weights"].update(kw)


@pytest.mark.parametrize("change,want", [
    (_ct_weights(num_bits=16), r"config_groups.group_0.weights.num_bits is 16: expected 2..8"),
    (_ct_weights(num_bits=8), r"weight_packed'.*I32 \[\d+, (\d+)\], but compressed-tensors pack-quantized int8 "
                              r"asymmetric group 64.*weight_packed int32 \[N, ceil\(K/4\)\] = \[\d+, (?!\1\])\d+\]"),
    (_ct_weights(type="float"), r"weights.type is 'float': only integer weights"),
    (_ct_weights(strategy="block"), r"weights.strategy is 'block'.*only \['group', 'channel', 'tensor'\]"),
    (_ct_weights(actorder="group"), r"_proj.weight_packed': weight_g_idx missing: config group group_0 says "
                                    r"weights.actorder 'group'.*'model.layers.\d.\w+.\w+.weight_g_idx' int32 \[K\] = \[\d+\]"),
    (_ct_weights(actorder="group", strategy="channel", group_size=None),
     r"weights.actorder is 'group' with strategy 'channel': group activation ordering needs the group strategy"),
    (_ct_weights(actorder="sideways"), r"weights.actorder is 'sideways': expected 'group' / 'dynamic', 'weight'"),
    (_ct_weights(dynamic=True), r"weights.dynamic is True"),
    (_ct_weights(group_size=100), r"K = \d+ inputs .* not a multiple of group_size 100"),
    (_ct_weights(group_size=128), r"weight_scale' is BF16 \[128, 6\].*group 128.*weight_scale \(float\) \[128, 3\]"),
    (_ct_weights(strategy="channel", group_size=None), r"weight_scale' is BF16 \[\d+, \d+\].*asymmetric channel .*"
                                                       r"weight_scale \(float\) \[\d+, 1\]"),
    (_ct_weights(symmetric=True, zp_dtype=None), r"weight_zero_point' next to weight .* but config group group_0 is "
                                                 r"symmetric: compressed-tensors drops symmetric zero points"),
    (lambda q: q["config_groups"]["group_0"].update(format="marlin-24"),
     r"config_groups.group_0: format 'marlin-24'.*read from \['pack-quantized', 'naive-quantized', 'int-quantized'\]"),
    (lambda q: q["config_groups"]["group_0"].update(targets=["re:.*mlp.*"]),
     r"no quantization_config.config_groups target matches model.layers.0.self_attn.\w+ \(targets \['re:.\*mlp.\*'\]\)"),
    (lambda q: q.update(ignore=["lm_head", CT_MOD]),
     rf"{CT_MOD} is listed in quantization_config.ignore .* but its weight is stored as integers"),
])
def test_ct_asym_config_it_cannot_follow_is_named(ct_asym, change, want, capsys):
    """quantization_config of a compressed-tensors symmetric-false checkpoint that the readers do not cover (widths
    outside 2..8, float weights, block strategy, act-order groups, dynamic weights, other formats) or that
    contradicts the stored tensors (num_bits, group_size, strategy, symmetric, targets, ignore): an error naming the
    key / tensor."""
    cfg = json.loads((ct_asym / "config.json").read_text())
    change(cfg["quantization_config"])
    (ct_asym / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InspectError, match=want):
        inspect_dir(ct_asym, use_loss=False)
    cli_error(ct_asym, capsys)


def test_ct_asym_legacy_zero_point_shape_is_named(tmp_path, capsys):
    """compressed-tensors <= 0.9.3 zero points (int8 [N, G], unpacked) of the wrong shape: named, with both
    generations' shapes."""
    d = tmp_path / "legacy"
    synth.write("compressed-tensors-asym-int4-legacy", synth.Logical.from_dir(TRAINED), d)
    edit(d, lambda sd: sd.__setitem__(f"{CT_MOD}.weight_zero_point", sd[f"{CT_MOD}.weight_zero_point"].t().contiguous()))
    with pytest.raises(InspectError, match=rf"{CT_MOD}.weight_zero_point' is I8 \[2, 64\].*int32 \[ceil\(N/8\), G\] = "
                                           rf"\[8, 2\] \(compressed-tensors >= 0.9.4.*or int8 \[64, 2\] \(<= 0.9.3"):
        inspect_dir(d, use_loss=False)
    cli_error(d, capsys)


def test_config_missing_field(model, capsys):
    cfg = json.loads((model / "config.json").read_text())
    del cfg["hidden_size"]
    (model / "config.json").write_text(json.dumps(cfg))
    err = cli_error(model, capsys)
    assert "config.json" in err and "hidden_size" in err


def test_cli_subprocess_no_traceback(tmp_path):
    for mod in ("reference.inspect", "reference.decode"):
        args = [sys.executable, "-m", mod, str(tmp_path / "nope")] + (["--out", str(tmp_path / "w")]
                                                                      if mod == "reference.decode" else [])
        p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr and "nope" in p.stderr


def test_decode_refuses_inconsistent_spec(model, tmp_path, capsys):
    spec = {"spec_version": 1, "name": "x", "linears": {}, "tensors": {}}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    assert decode_main([str(model), "--spec", str(tmp_path / "s.json"), "--out", str(tmp_path / "w")]) == 2
    assert "no entry for module" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# fuzzing the scanner: anything goes in, only CheckpointError comes out


def _scan_file(path: Path):
    try:
        scan(Checkpoint(path))
    except CheckpointError as e:
        assert str(path) in str(e) or path.name in str(e)


json_leaf = hst.one_of(hst.integers(-2**40, 2**40), hst.text(max_size=6), hst.booleans(), hst.none(),
                       hst.floats(allow_nan=True))
entry = hst.fixed_dictionaries({"dtype": hst.one_of(hst.sampled_from(["U8", "I32", "F16", "F32", "BF16", "I64"]),
                                                    json_leaf),
                                "shape": hst.one_of(hst.lists(hst.integers(-2, 6), max_size=3), json_leaf),
                                "data_offsets": hst.one_of(hst.lists(hst.integers(-4, 80), min_size=2, max_size=2),
                                                           hst.lists(json_leaf, max_size=3))})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=hst.dictionaries(hst.text(min_size=1, max_size=8), hst.one_of(entry, json_leaf), max_size=4),
       payload=hst.binary(max_size=96))
def test_fuzz_header(header, payload, tmp_path):
    f = tmp_path / "fuzz.safetensors"
    try:
        raw = json.dumps(header).encode()
    except ValueError:
        return
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)
    _scan_file(f)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=hst.integers(0, 2000), flips=hst.lists(hst.tuples(hst.integers(0, 1500), hst.integers(1, 255)), max_size=6))
def test_fuzz_mutated_file(cut, flips, tmp_path):
    f = tmp_path / "mut.safetensors"
    save_file({"a.weight": torch.arange(64, dtype=torch.uint8).reshape(8, 8),
               "a.weight_scale": torch.tensor([0.5]), "n.weight": torch.ones(8, dtype=torch.float16)}, str(f))
    data = bytearray(f.read_bytes())
    for pos, x in flips:
        if pos < len(data):
            data[pos] ^= x
    f.write_bytes(bytes(data[: max(0, len(data) - cut)]))
    _scan_file(f)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=hst.binary(max_size=64))
def test_fuzz_random_bytes(data, tmp_path):
    f = tmp_path / "rand.safetensors"
    f.write_bytes(data)
    _scan_file(f)
