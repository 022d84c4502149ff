"""The synthetic checkpoints of reference.synth match each public convention bit for bit.

Each writer is checked against an *independent* packer: the real library function where it is
installed (transformers ``pack_weights``, compressed-tensors ``pack_to_int32``), otherwise a
line-by-line transcription of the public code (AutoGPTQ v1 ``QuantLinear.pack``, the seed's
``unpack_ternary_packed``, bitnet.cpp I2_S lane rule).  A writer that is wrong here would make
the inspector tests prove nothing.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as hst

from reference import synth
from reference.checkpoint import Checkpoint
from reference.config import ModelConfig
from reference.formats import PackSpec, pack, unpack

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
Q = "model.layers.1.self_attn.k_proj"  # (64, 128): non-square
D = "model.layers.1.mlp.down_proj"  # (128, 384)


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _write(fmt, logical, tmp_path):
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    return Checkpoint(out), truth


# ---------------------------------------------------------------------------------------
# independent packers


def seed_unpack(packed: torch.Tensor, out_dim: int, in_dim: int) -> torch.Tensor:
    """The seed article's unpack_ternary_packed, verbatim in logic: 0->0, 1->+1, 2->-1, 3->0."""
    packed = packed.reshape(out_dim, in_dim // 4).to(torch.uint8)
    out = torch.empty(out_dim, in_dim, dtype=torch.int8)
    for i in range(4):
        code = (packed >> (2 * i)) & 0x3
        out[:, i::4] = torch.where(code == 1, 1, torch.where(code == 2, -1, 0)).to(torch.int8)
    return out


def gptq_v1_pack(w: torch.Tensor, bits: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoGPTQ v1 QuantLinear.pack for symmetric ternary: intweight = w + 2 (z = 2), qzeros = z - 1."""
    intweight = (w.to(torch.int64) + 2).t().contiguous()  # (K, N)
    qweight = torch.zeros(intweight.shape[0] // 32 * bits, intweight.shape[1], dtype=torch.int64)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + 32 // bits):
            qweight[row] |= intweight[j] << (bits * (j - i))
        i += 32 // bits
        row += 1
    return qweight


def i2s_pack(w: torch.Tensor) -> torch.Tensor:
    """bitnet.cpp I2_S: per 128-block, byte j holds elements j, 32+j, 64+j, 96+j at bits 7-6..1-0."""
    q = (w.to(torch.int64) + 1).reshape(w.shape[0], -1, 4, 32)  # (N, K/128, slot, j)
    b = (q[:, :, 0] << 6) | (q[:, :, 1] << 4) | (q[:, :, 2] << 2) | q[:, :, 3]  # (N, K/128, 32)
    return b.reshape(w.shape[0], -1).to(torch.uint8)


def as_u32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,lc", [("hf-bitlinear", "bitlinear"), ("hf-autobitlinear", "autobitlinear")])
def test_hf_bitnet_matches_transformers(fmt, lc, logical, tmp_path):
    from transformers.integrations.bitnet import pack_weights

    ck, truth = _write(fmt, logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod]
        want = pack_weights(t.clone().to(torch.int8))  # pack_weights adds 1 in place: pass a copy
        assert torch.equal(ck.get(f"{mod}.weight"), want), mod
        s = ck.get(f"{mod}.weight_scale")
        m = float(logical.mult[mod])
        assert s.shape == (1,)
        assert float(s) == pytest.approx(1 / m if lc == "bitlinear" else m, rel=1e-6)


def test_seed_matches_article_unpack(logical, tmp_path):
    ck, truth = _write("seed", logical, tmp_path)
    for mod in (Q, D):
        n, k = logical.ternary[mod].shape
        packed = ck.get(f"{mod}.weight_ternary")
        assert packed.dtype == torch.uint8 and packed.shape == (n, k // 4)
        assert torch.equal(seed_unpack(packed, n, k), logical.ternary[mod])
        assert ck.get(f"{mod}.scale").shape == (n,)


def test_msb_variant_reverses_slots(logical, tmp_path):
    ck_l, _ = _write("seed", logical, tmp_path)
    ck_m, _ = _write("seed-msb", logical, tmp_path)
    a, b = ck_l.get(f"{Q}.weight_ternary").to(torch.int64), ck_m.get(f"{Q}.weight_ternary").to(torch.int64)
    rev = sum(((a >> (2 * s)) & 3) << (2 * (3 - s)) for s in range(4))
    assert torch.equal(rev, b)


def test_group_scales_shape(logical, tmp_path):
    ck, truth = _write("group", logical, tmp_path)
    s = ck.get(f"{D}.scale")
    assert s.shape == (128, 384 // 64) and s.dtype == torch.float16


@pytest.mark.parametrize("fmt", ["compressed-tensors", "compressed-tensors-group"])
def test_compressed_tensors_matches_library(fmt, logical, tmp_path):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    ck, truth = _write(fmt, logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod]
        got = ck.get(f"{mod}.weight_packed")
        assert torch.equal(got, pack_to_int32(t.to(torch.int8), 2))
        assert torch.equal(unpack_from_int32(got, 2, t.shape), t)  # library unpack: v = code - 2
        assert ck.get(f"{mod}.weight_shape").tolist() == list(t.shape)
    n = logical.ternary[D].shape[0]
    assert ck.get(f"{D}.weight_scale").shape == ((n, 1) if fmt == "compressed-tensors" else (n, 384 // 64))


def test_gptq_matches_autogptq_v1(logical, tmp_path):
    ck, truth = _write("gptq", logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod]
        n, k = t.shape
        assert torch.equal(as_u32(ck.get(f"{mod}.qweight")), gptq_v1_pack(t))
        qz = as_u32(ck.get(f"{mod}.qzeros"))
        assert qz.shape == (k // 64, n // 16)
        assert bool((qz == 0x55555555).all())  # every 2-bit field holds z - 1 = 1
        assert ck.get(f"{mod}.scales").shape == (k // 64, n)
        assert torch.equal(ck.get(f"{mod}.g_idx"), (torch.arange(k) // 64).to(torch.int32))


def test_i2s_lane_rule(logical, tmp_path):
    ck, truth = _write("i2s", logical, tmp_path)
    for mod in (Q, D):
        key = synth.rename(mod, "gguf")
        assert torch.equal(ck.get(f"{key}.weight"), i2s_pack(logical.ternary[mod]))
        assert ck.get(f"{key}.scale").dtype == torch.float32
    assert "token_embd.weight" in ck and "blk.0.attn_sub_norm.weight" in ck


@pytest.mark.parametrize("fmt", ["trilm", "trilm-row"])
def test_trilm_unpacked_shards(fmt, logical, tmp_path):
    ck, truth = _write(fmt, logical, tmp_path)
    w = ck.get(f"{Q}.weight")
    assert w.dtype == torch.float16
    mags = torch.unique(w.float().abs()[w != 0])
    assert (len(mags) == 2) if fmt == "trilm" else (len(mags) > 2)  # two row shards / one s per row
    assert torch.equal(torch.sign(w.float()).to(torch.int8), logical.ternary[Q])


def test_bitnet_gpu_fused(logical, tmp_path):
    ck, truth = _write("bitnet-gpu", logical, tmp_path)
    wqkv = ck.get("layers.1.attention.wqkv.weight")
    assert wqkv.dtype == torch.int8 and wqkv.shape == (128 + 64 + 64, 128 // 4)
    # q / k rows in interleaved-RoPE order (gpu/convert_safetensors.py: '(h l d) i -> (h d l) i', l = 2)
    hd = ModelConfig.from_dict(logical.config).head_dim
    t = torch.cat([synth.rope_interleave_rows(logical.ternary[f"model.layers.1.self_attn.{p}_proj"], hd)
                   if p in "qk" else logical.ternary[f"model.layers.1.self_attn.{p}_proj"] for p in "qkv"])
    assert not torch.equal(t[:128], logical.ternary["model.layers.1.self_attn.q_proj"])
    # lane rule: 4-byte groups, byte j of a group holds elements j, 4+j, 8+j, 12+j at bits 2s; code w+2
    u = wqkv.to(torch.int64) & 0xFF
    codes = torch.stack([(u >> (2 * s)) & 3 for s in range(4)], -1)  # (N, K/4, slot)
    codes = codes.reshape(256, -1, 4, 4).permute(0, 1, 3, 2).reshape(256, 128)  # (N, K)
    assert torch.equal(codes - 2, t.to(torch.int64))
    assert ck.get("layers.1.attention.wqkv.weight_scale").shape == (3,)
    assert ck.get("layers.1.feed_forward.w13.weight").shape == (2 * 384, 32)


def test_sharded_index(logical, tmp_path):
    out = tmp_path / "sharded"
    synth.write("seed", logical, out, shards=3)
    assert (out / "model.safetensors.index.json").exists()
    ck = Checkpoint(out)
    assert len({ck.info(k).file for k in ck.keys()}) == 3


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 40), k=hst.integers(1, 70), container=hst.sampled_from(["uint8", "int8", "int16", "int32"]),
       axis=hst.integers(0, 1), lanes=hst.sampled_from(["interleaved", "blocked", "block_interleaved"]),
       order=hst.sampled_from(["lsb", "msb"]), transposed=hst.booleans(), seed=hst.integers(0, 2**16))
def test_packspec_roundtrip(n, k, container, axis, lanes, order, transposed, seed):
    """Any point of the PackSpec space the inspector searches round-trips exactly (odd sizes pad)."""
    v = {"uint8": 4, "int8": 4, "int16": 8, "int32": 16}[container]
    spec = PackSpec(bits=2, container=container, pack_axis=axis, lanes=lanes, block=4 * v if lanes == "block_interleaved"
                    else None, bit_order=order, codes=(None, -1, 0, 1), transposed=transposed, pad_code=2)
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (n, k), generator=g).to(torch.int8)
    assert torch.equal(unpack(pack(w, spec), spec, (n, k)), w)


# ---------------------------------------------------------------------------------------
# unpacked integer ternary, 4-bit containers, symmetric low-bit integers


def test_unpacked_int8_ternary_stores_values(logical, tmp_path):
    ck, _ = _write("int8-ternary", logical, tmp_path)
    for mod in (Q, D):
        w = ck.get(f"{mod}.weight")
        assert w.dtype == torch.int8 and torch.equal(w, logical.ternary[mod])  # -1 / 0 / +1 as is
        assert ck.get(f"{mod}.weight_scale").dtype == torch.bfloat16


@pytest.mark.parametrize("fmt,code", [("uint8-ternary", lambda t: t + 1),
                                      ("uint8-ternary-perm", lambda t: torch.where(t < 0, 2, t))])
def test_unpacked_uint8_codes(fmt, code, logical, tmp_path):
    ck, _ = _write(fmt, logical, tmp_path)
    for mod in (Q, D):
        w = ck.get(f"{mod}.weight")
        assert w.dtype == torch.uint8 and w.shape == logical.ternary[mod].shape
        assert torch.equal(w.to(torch.int64), code(logical.ternary[mod].to(torch.int64)))


def test_nibble_ternary_high_nibble_first(logical, tmp_path):
    ck, _ = _write("nibble-ternary", logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod].to(torch.int64)
        w = ck.get(f"{mod}.weight").to(torch.int64)
        assert w.shape == (t.shape[0], t.shape[1] // 2)
        assert torch.equal(w, ((t[:, 0::2] + 1) << 4) | (t[:, 1::2] + 1))


@pytest.mark.parametrize("fmt,bits", [("compressed-tensors-int4-ternary", 4), ("compressed-tensors-int2", 2),
                                      ("compressed-tensors-int4", 4)])
def test_compressed_tensors_int_matches_library(fmt, bits, logical, tmp_path):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    lg = logical if fmt.endswith("ternary") else logical.requantized(bits, seed=1)
    out = tmp_path / fmt
    synth.write(fmt, lg, out)
    ck = Checkpoint(out)
    for mod in (Q, D):
        t = lg.ternary[mod]
        got = ck.get(f"{mod}.weight_packed")
        assert torch.equal(got, pack_to_int32(t.to(torch.int8), bits))
        assert torch.equal(unpack_from_int32(got, bits, t.shape), t)
    if not fmt.endswith("ternary"):
        levels = torch.unique(torch.cat([t.reshape(-1) for t in lg.ternary.values()]))
        assert levels.tolist() == list(range(-(1 << (bits - 1)), 1 << (bits - 1)))  # every level used


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 40), k=hst.integers(1, 70), container=hst.sampled_from(["uint8", "int8", "int16", "int32"]),
       bits=hst.sampled_from([4, 8]), axis=hst.integers(0, 1),
       lanes=hst.sampled_from(["interleaved", "blocked", "block_interleaved"]), order=hst.sampled_from(["lsb", "msb"]),
       transposed=hst.booleans(), levels=hst.booleans(), seed=hst.integers(0, 2**16))
def test_packspec_roundtrip_wide_codes(n, k, container, bits, axis, lanes, order, transposed, levels, seed):
    """4-bit and one-per-element (8-bit) codes, ternary or full symmetric integer range, round-trip."""
    from reference.formats import code_table, offset_table, twos_complement_table

    if bits == 8 and container not in ("uint8", "int8"):
        bits = 4
    v = {"uint8": 8, "int8": 8, "int16": 16, "int32": 32}[container] // bits
    lanes = "interleaved" if v == 1 else lanes
    codes = (offset_table(bits, 1 << (bits - 1)) if bits == 4 else twos_complement_table(bits)) if levels \
        else code_table(bits, {(1 << bits) - 1: -1, 0: 0, 1: 1})
    spec = PackSpec(bits=bits, container=container, pack_axis=axis, lanes=lanes,
                    block=4 * v if lanes == "block_interleaved" else None, bit_order=order, codes=codes,
                    transposed=transposed, pad_code=codes.index(0))
    g = torch.Generator().manual_seed(seed)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if levels else (-1, 2)
    w = torch.randint(lo, hi, (n, k), generator=g)
    got = unpack(pack(w, spec), spec, (n, k))
    assert torch.equal(got.to(torch.int64), w)


@pytest.mark.parametrize("fmt", ["gptq-int4-ternary", "gptq-int4"])
def test_gptq_int4_matches_autogptq_v1(fmt, logical, tmp_path):
    """AutoGPTQ v1 QuantLinear.pack at bits=4: intweight = w + 8, 8 per int32 along K; qzeros = z - 1 = 7."""
    lg = logical if fmt.endswith("ternary") else logical.requantized(4, seed=4)
    out = tmp_path / fmt
    synth.write(fmt, lg, out)
    ck = Checkpoint(out)
    for mod in (Q, D):
        t = lg.ternary[mod]
        n, k = t.shape
        intweight = (t.to(torch.int64) + 8).t().contiguous()  # (K, N)
        want = torch.zeros(k // 8, n, dtype=torch.int64)
        for row in range(k // 8):
            for j in range(8):
                want[row] |= intweight[row * 8 + j] << (4 * j)
        assert torch.equal(as_u32(ck.get(f"{mod}.qweight")), want)
        assert bool((as_u32(ck.get(f"{mod}.qzeros")) == 0x77777777).all())


def autogptq_rtn(W: torch.Tensor, bits: int, group_size: int, perm, static_groups: bool):
    """AutoGPTQ ``GPTQ.fasterquant``'s index bookkeeping (auto_gptq/quantization/gptq.py), loop for loop, without
    the Hessian's error feedback (round to nearest, as synth.w_gptq_asym): W permuted by ``perm`` (None: actorder
    off), ``Quantizer.find_params`` (sym=False: xmin = min(min, 0), xmax = max(max, 0), scale = (xmax - xmin) /
    maxq, zero = round(-xmin / scale); the scale rounded to fp16 first, the writer's simplification) at every
    group_size-th column of the permuted W, or per static group of the unpermuted W picked through
    ``perm[idx] // group_size``; ``quantize`` per column; then g_idx = [perm[i] // gs (static) or i // gs] and
    ``Q[:, invperm]``, ``g_idx[invperm]``.  Returns (q int [N, K], scales [N, G] fp16, zeros [N, G], g_idx int32)."""
    maxq = (1 << bits) - 1
    n, columns = W.shape
    gs = group_size if group_size != -1 else columns

    def find_params(x):
        xmin = torch.minimum(x.min(1).values, torch.zeros(n))
        xmax = torch.maximum(x.max(1).values, torch.zeros(n))
        scale = ((xmax - xmin) / maxq).half()
        return scale, torch.round(-xmin / scale.float())

    scale, zero, groups = [], [], []
    if static_groups:
        for i in range(0, columns, gs):
            groups.append(find_params(W[:, i:i + gs]))
            scale.append(groups[-1][0])
            zero.append(groups[-1][1])
    if perm is not None:
        W = W[:, perm]
        invperm = torch.argsort(perm)
    Q = torch.zeros(n, columns)
    params = None
    for i in range(columns):
        if not static_groups:
            if i % gs == 0:
                params = find_params(W[:, i:i + gs])
                scale.append(params[0])
                zero.append(params[1])
        else:
            idx = int(perm[i]) if perm is not None else i
            params = groups[idx // gs]
        Q[:, i] = torch.clamp(torch.round(W[:, i] / params[0].float()) + params[1], 0, maxq)
    if static_groups and perm is not None:
        g_idx = [int(perm[i]) // gs for i in range(columns)]
    else:
        g_idx = [i // gs for i in range(columns)]
    g_idx = torch.tensor(g_idx, dtype=torch.int32)
    if perm is not None:
        Q = Q[:, invperm]
        g_idx = g_idx[invperm]
    return Q.to(torch.int64), torch.stack(scale, 1), torch.stack(zero, 1), g_idx
def stream_fields(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Independent reader of AutoGPTQ-packed int32 words along axis 0 (qweight rows, or qzeros columns after a
    transpose): each column's words as one little-endian integer (word r at bits 32r), field j at bits [bits*j,
    bits*(j+1)).  For 2 / 4 / 8 bits the plain 32/b fields per word; for 3 bits QuantLinear.pack's straddling
    stream."""
    w = as_u32(words).tolist()
    rows, cols = len(w), len(w[0])
    out = torch.zeros(rows * 32 // bits, cols, dtype=torch.int64)
    for c in range(cols):
        big = sum(w[r][c] << (32 * r) for r in range(rows))
        out[:, c] = torch.tensor([(big >> (bits * j)) & ((1 << bits) - 1) for j in range(rows * 32 // bits)])
    return out


@pytest.mark.parametrize("fmt", sorted(synth.GPTQ_ASYM_FORMATS))
def test_gptq_asym_matches_autogptq(fmt, logical, tmp_path):
    """AutoGPTQ sym=False (round to nearest): find_params' scale / zero per row and group (xmin <= 0 <= xmax,
    zero = round(-xmin / scale)), QuantLinear.pack of q (no offset: the zero point carries it) along K and of
    the zero points along N (z - 1 for v1, z for gptq_v2; 3-bit: one bit stream, 32 codes in 3 words); AutoGPTQ's
    dequantization ``scales[g_idx] * (weight - zeros[g_idx])`` (qlinear_cuda.py's torch path) of what was stored =
    the ground truth; AutoGPTQ's own pack loops (transcribed in test_bitstream) of the q and z read back give the
    stored tensors bit for bit; every level occurs; config sym false, bits as written.  Act-order (desc_act true;
    static_groups; group_size -1): q, scales, zeros and g_idx are those of ``autogptq_rtn``, fasterquant's group
    bookkeeping transcribed, on the writer's float model and activation order; g_idx is non-trivial exactly where
    fasterquant makes it so (desc_act without static groups, > 1 group)."""
    import json

    from test_bitstream import autogptq_pack_rows, autogptq_pack_zeros

    bits = int(fmt.split("int")[1][0])
    v2 = "-v2" in fmt
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["sym"] is False and qc["desc_act"] is ("actorder" in fmt) and qc["bits"] == bits
    floats, perms = synth.gptq_float_model(logical), synth.actorder_perms(logical)
    for mod in (Q, D):
        n, k = logical.ternary[mod].shape
        gs = k if qc["group_size"] == -1 else qc["group_size"]
        qw, sc, qz = ck.get(f"{mod}.qweight"), ck.get(f"{mod}.scales").float(), ck.get(f"{mod}.qzeros")
        gi = ck.get(f"{mod}.g_idx")
        assert qw.shape == (k * bits // 32, n) and sc.shape == (k // gs, n) and qz.shape == (k // gs, n * bits // 32)
        assert gi.dtype == torch.int32 and gi.shape == (k,)
        q = stream_fields(qw, bits)  # (K, N)
        zs = stream_fields(qz.t(), bits).t()  # (G, N): stored z - 1 (v1) or z
        assert torch.equal(torch.from_numpy(autogptq_pack_rows(q.numpy(), bits)), qw)
        assert torch.equal(torch.from_numpy(autogptq_pack_zeros(zs.numpy(), bits)), qz)
        z = zs + (0 if v2 else 1)
        g = gi.long()
        w = (sc[g] * (q - z[g])).t()  # AutoGPTQ's dequant, (N, K)
        assert torch.equal(w, truth.effective(mod)), mod
        assert len(torch.unique(q)) >= min(1 << bits, 64) and len(torch.unique(z)) > 1
        want_q, want_s, want_z, want_gi = autogptq_rtn(floats[mod], bits, qc["group_size"],
                                                       perms[mod] if qc["desc_act"] else None,
                                                       qc.get("static_groups", False))
        assert torch.equal(q.t(), want_q) and torch.equal(ck.get(f"{mod}.scales"), want_s.t()), mod
        assert torch.equal(z - (0 if v2 else 1), (want_z.t().to(torch.int64) - (0 if v2 else 1)) & ((1 << bits) - 1))
        assert torch.equal(gi, want_gi), mod
        trivial = torch.equal(g, torch.arange(k) // gs)
        assert trivial is not (qc["desc_act"] and not qc.get("static_groups") and k > gs), mod


@pytest.mark.parametrize("fmt", ["gptq-int3-ternary", "gptq-int3"])
def test_gptq_int3_matches_autogptq_v1(fmt, logical, tmp_path):
    """AutoGPTQ v1 QuantLinear.pack at bits=3 (sym=True): intweight = w + 4 packed as the 3-bit stream (32 inputs in
    3 int32 rows), qzeros = z - 1 = 3 streamed along N, exactly what AutoGPTQ's pack loops (test_bitstream's
    transcription) write; the constant zero point reads back everywhere."""
    from test_bitstream import autogptq_pack_rows, autogptq_pack_zeros

    lg = logical if fmt.endswith("ternary") else logical.requantized(3, seed=4)
    out = tmp_path / fmt
    truth = synth.write(fmt, lg, out)
    ck = Checkpoint(out)
    for mod in (Q, D):
        t = lg.ternary[mod]
        n, k = t.shape
        want = autogptq_pack_rows((t.to(torch.int64) + 4).t().numpy(), 3)
        assert torch.equal(ck.get(f"{mod}.qweight"), torch.from_numpy(want)) and want.shape == (k // 32 * 3, n)
        zwant = autogptq_pack_zeros(torch.full((k // 64, n), 3).numpy(), 3)
        assert torch.equal(ck.get(f"{mod}.qzeros"), torch.from_numpy(zwant))
        assert torch.equal(stream_fields(ck.get(f"{mod}.qweight"), 3) - 4, t.t().to(torch.int64))
        assert torch.equal(truth.ternary[mod], t)


# ---------------------------------------------------------------------------------------
# AutoAWQ 0.2.9, transcribed line by line (no awq import: the package needs CUDA-era pins): the quantizer
# (awq/quantize/quantizer.py AwqQuantizer.pseudo_quantize_tensor, zero_point=True), the gemm packer
# (awq/modules/linear/gemm.py WQLinear_GEMM.from_linear) and the dequantization (awq/utils/packing_utils.py
# unpack_awq + reverse_awq_order + dequantize_gemm)

AWQ_ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]  # from_linear's order_map for w_bit 4 (= packing_utils.AWQ_ORDER)
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # packing_utils.AWQ_REVERSE_ORDER


def awq_pseudo_quantize_tensor(w, w_bit, group_size):
    org_w_shape = w.shape
    if group_size > 0:
        assert org_w_shape[-1] % group_size == 0
        w = w.reshape(-1, group_size)
    assert w.dim() == 2
    assert torch.isnan(w).sum() == 0
    max_val = w.amax(dim=1, keepdim=True)
    min_val = w.amin(dim=1, keepdim=True)
    max_int = 2**w_bit - 1
    min_int = 0
    scales = (max_val - min_val).clamp(min=1e-5) / max_int
    zeros = (-torch.round(min_val / scales)).clamp_(min_int, max_int)
    w = (torch.clamp(torch.round(w / scales) + zeros, min_int, max_int) - zeros) * scales
    zeros = zeros.view(org_w_shape[0], -1)
    scales = scales.view(org_w_shape[0], -1)
    w = w.reshape(org_w_shape)
    return w, scales, zeros


def awq_gemm_from_linear(weight, w_bit, group_size, scales, zeros):
    """from_linear after _apply_quant's scales.t() / zeros.t() (version gemm); ``group_size`` as the module's
    own (in_features for -1: from_linear's ``idx // -1`` indexing fails there, see synth.w_awq)."""
    in_features = weight.shape[1]
    scale_zeros = zeros * scales
    qscales = scales.clone().half()
    pack_num = 32 // w_bit
    intweight = []
    for idx in range(in_features):
        intweight.append(torch.round((weight[:, idx] + scale_zeros[idx // group_size])
                                     / qscales[idx // group_size]).to(torch.int)[:, None])
    intweight = torch.cat(intweight, dim=1)
    intweight = intweight.t().contiguous()
    intweight = intweight.to(dtype=torch.int32)
    qweight = torch.zeros((intweight.shape[0], intweight.shape[1] // 32 * w_bit), dtype=torch.int32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight_col = intweight[:, col * pack_num + AWQ_ORDER_MAP[i]]
            qweight[:, col] |= qweight_col << (i * w_bit)
    zeros = zeros.to(dtype=torch.int32)
    qzeros = torch.zeros((zeros.shape[0], zeros.shape[1] // 32 * w_bit), dtype=torch.int32)
    for col in range(zeros.shape[1] // pack_num):
        for i in range(pack_num):
            qzero_col = zeros[:, col * pack_num + AWQ_ORDER_MAP[i]]
            qzeros[:, col] |= qzero_col << (i * w_bit)
    return qweight, qzeros, qscales


def awq_dequantize_gemm(qweight, qzeros, scales, bits, group_size):
    shifts = torch.arange(0, 32, bits)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    reverse_order_tensor = torch.arange(iweights.shape[-1], dtype=torch.int32)
    reverse_order_tensor = reverse_order_tensor.view(-1, 32 // bits)
    reverse_order_tensor = reverse_order_tensor[:, AWQ_REVERSE_ORDER]
    reverse_order_tensor = reverse_order_tensor.view(-1)
    izeros = izeros[:, reverse_order_tensor]
    iweights = iweights[:, reverse_order_tensor]
    iweight = torch.bitwise_and(iweights, (2**bits) - 1)
    izeros = torch.bitwise_and(izeros, (2**bits) - 1)
    scales = scales.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweight - izeros) * scales  # (K, N)


@pytest.mark.parametrize("fmt", sorted(f for f in synth.AWQ_FORMATS if f.startswith("awq-gemm-")))
def test_awq_matches_autoawq(fmt, logical, tmp_path):
    """AutoAWQ gemm: what synth.write stores is bit for bit what AutoAWQ's pseudo_quantize_tensor + from_linear
    (transcribed loops) store for the same fp16 float model; AutoAWQ's dequantize_gemm of the stored tensors is the
    ground truth in fp32 (scales as fp32) and, in AutoAWQ's own fp16 arithmetic, the truth rounded to fp16 and the
    quantizer's fake-quantized weight; every one of the 16 codes occurs; config.json as AwqConfig writes it."""
    import json

    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    gs = -1 if fmt.endswith("-row") else int(fmt.rsplit("g", 1)[1])
    assert qc == {"quant_method": "awq", "bits": 4, "group_size": gs, "zero_point": True, "version": "gemm",
                  "modules_to_not_convert": None}
    floats = synth.awq_float_model(logical)
    for mod in (Q, D, "model.layers.0.mlp.gate_proj"):
        n, k = logical.ternary[mod].shape
        G = k if gs == -1 else gs
        wq, scales, zeros = awq_pseudo_quantize_tensor(floats[mod].clone(), 4, gs)
        qweight, qzeros, qscales = awq_gemm_from_linear(wq, 4, G, scales.t().contiguous(), zeros.t().contiguous())
        assert qweight.shape == (k, n // 8) and qzeros.shape == (k // G, n // 8) and qscales.shape == (k // G, n)
        assert torch.equal(ck.get(f"{mod}.qweight"), qweight), mod
        assert torch.equal(ck.get(f"{mod}.qzeros"), qzeros), mod
        assert ck.get(f"{mod}.scales").dtype == torch.float16 and torch.equal(ck.get(f"{mod}.scales"), qscales), mod
        deq = awq_dequantize_gemm(qweight, qzeros, qscales.float(), 4, G).t()  # exact: (q - z) * s in fp32
        assert torch.equal(deq, truth.effective(mod)), mod
        deq16 = awq_dequantize_gemm(qweight, qzeros, qscales, 4, G).t()  # AutoAWQ's own fp16 result
        assert deq16.dtype == torch.float16 and torch.equal(deq16, truth.effective(mod).half()), mod
        assert torch.equal(deq16, wq), mod  # the packed codes are the quantizer's q
        q = torch.stack([(as_u32(qweight) >> (4 * j)) & 15 for j in range(8)], 2)
        assert len(torch.unique(q)) == 16


@settings(max_examples=25, deadline=None)
@given(blocks=hst.integers(1, 4), groups=hst.integers(1, 4), gs=hst.sampled_from([32, 64, 128, -1]),
       spread=hst.floats(0.01, 4.0), seed=hst.integers(0, 2 ** 31))
def test_awq_packer_and_decode_any_shape(blocks, groups, gs, spread, seed):
    """For any AutoAWQ shape (N = 32 * blocks outputs: from_linear sizes qweight as N // 32 * 4 columns, so it writes
    no other N; K = groups * G inputs, G in 32 / 64 / 128 or -1) and weight
    scale: synth's vectorised quantizer + formats.pack(AWQ_GEMM / AWQ_GEMM_ZEROS) = AutoAWQ's loops bit for bit, and
    the reference's decode of the stored tensors (unpack, zero_points through the zero_pack, expand_scale, as
    reference.spec.finish_linear) = AutoAWQ's dequantize_gemm."""
    from reference.formats import AWQ_GEMM, AWQ_GEMM_ZEROS, ScaleSpec, expand_scale
    from reference.spec import subtract_zero

    n = 32 * blocks
    G = 128 if gs == -1 else gs
    k = groups * G
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * spread + torch.rand(n, 1, generator=g) * spread).half()
    wq, scales, zeros = awq_pseudo_quantize_tensor(w.clone(), 4, gs)
    G = k if gs == -1 else gs
    qweight, qzeros, qscales = awq_gemm_from_linear(wq, 4, G, scales.t().contiguous(), zeros.t().contiguous())
    swq, ss, sz = synth.awq_pseudo_quantize(w.clone(), 4, gs)
    assert torch.equal(swq, wq) and torch.equal(ss, scales) and torch.equal(sz, zeros)
    code = synth.awq_gemm_intweight(swq, ss.t().contiguous(), sz.t().contiguous(), G)  # (K, N)
    assert torch.equal(pack(code.t(), AWQ_GEMM), qweight)
    assert torch.equal(pack(sz.t().to(torch.int64), AWQ_GEMM_ZEROS), qzeros)
    spec = ScaleSpec("qzeros", "group", group_size=G, transposed=True)
    vals = subtract_zero(unpack(qweight, AWQ_GEMM, (n, k)), qzeros, spec, (n, k), "t", zpack=AWQ_GEMM_ZEROS)
    mult = expand_scale(qscales, dataclasses.replace(spec, key="scales"), (n, k))
    assert torch.equal(vals.float() * mult, awq_dequantize_gemm(qweight, qzeros, qscales.float(), 4, G).t())


# AutoAWQ 0.2.9 version "gemv", transcribed line by line: awq/modules/linear/gemv.py make_divisible,
# calculate_zeros_width and WQLinear_GEMV.__init__ / from_linear (scales / zeros as _apply_quant hands them for gemv:
# [N, groups], not transposed).  AutoAWQ has no Python dequantizer for gemv (its awq_ext kernels read the buffers);
# awq_gemv_dequantize below reads them back as the kernel's layout says: word col of a row holds input / group
# col * 8 + i at bits 4i, W = (q - z) * s.


def awq_make_divisible(c, divisor):
    return (c + divisor - 1) // divisor


def awq_calculate_zeros_width(in_features, group_size=128, pack_num=8):
    if group_size >= 128:
        size_multiplier = 1
    elif group_size == 64:
        size_multiplier = 2
    elif group_size == 32:
        size_multiplier = 4
    else:
        raise NotImplementedError

    base_width = awq_make_divisible(in_features // group_size, pack_num)
    base_width = awq_make_divisible(base_width, size_multiplier) * size_multiplier
    return base_width


def awq_gemv_from_linear(weight, w_bit, group_size, scales, zeros):
    """WQLinear_GEMV.from_linear (w_bit 4, no bias); ``group_size`` the module's (in_features for -1, as __init__
    sizes the buffers: from_linear itself raises in calculate_zeros_width(K, -1))."""
    in_features, out_features = weight.shape[1], weight.shape[0]
    assert in_features % group_size == 0
    assert out_features % (32 // w_bit) == 0
    scale_zeros = zeros * scales
    pack_num = 32 // w_bit
    qscales = torch.zeros((scales.shape[0], awq_calculate_zeros_width(in_features, group_size) * pack_num),
                          dtype=torch.float16)
    qscales[:, : scales.shape[1]] = scales
    intweight = []
    for idx in range(in_features):
        intweight.append(torch.round((weight[:, idx] + scale_zeros[:, idx // group_size])
                                     / qscales[:, idx // group_size]).to(torch.int)[:, None])
    intweight = torch.cat(intweight, dim=1)
    intweight = intweight.to(dtype=torch.int32)
    qweight = torch.zeros((intweight.shape[0], intweight.shape[1] // 32 * w_bit), dtype=torch.int32)
    for col in range(intweight.shape[1] // pack_num):
        order_map = [0, 1, 2, 3, 4, 5, 6, 7]
        for i in range(pack_num):
            qweight_col = intweight[:, col * pack_num + order_map[i]]
            qweight[:, col] |= qweight_col << (i * w_bit)
    zeros = zeros.to(dtype=torch.int32)
    qzeros = torch.zeros((zeros.shape[0], awq_calculate_zeros_width(in_features, group_size)), dtype=torch.int32)
    for col in range((zeros.shape[1] + pack_num - 1) // pack_num):
        order_map = [0, 1, 2, 3, 4, 5, 6, 7]
        for i in range(pack_num):
            if col * pack_num + order_map[i] >= zeros.shape[1]:
                continue
            qzero_col = zeros[:, col * pack_num + order_map[i]]
            qzeros[:, col] |= qzero_col << (i * w_bit)
    return qweight, qzeros, qscales


def awq_gemv_dequantize(qweight, qzeros, qscales, k, group_size):
    """(q - z) * s of WQLinear_GEMV's buffers in fp32, unpacked with shifts (independent of formats.unpack)."""
    shifts = torch.arange(0, 32, 4)
    q = ((as_u32(qweight)[:, :, None] >> shifts) & 15).reshape(qweight.shape[0], -1)[:, :k]
    z = ((as_u32(qzeros)[:, :, None] >> shifts) & 15).reshape(qzeros.shape[0], -1)[:, :k // group_size]
    s = qscales.float()[:, :k // group_size]
    return (q - z.repeat_interleave(group_size, dim=1)).float() * s.repeat_interleave(group_size, dim=1)


@pytest.mark.parametrize("fmt", sorted(f for f in synth.AWQ_FORMATS if f.startswith("awq-gemv-")))
def test_awq_gemv_matches_autoawq(fmt, logical, tmp_path):
    """AutoAWQ gemv: what synth.write stores is bit for bit what AutoAWQ's pseudo_quantize_tensor + WQLinear_GEMV.
    from_linear (transcribed loops, calculate_zeros_width) store for the same fp16 float model - qweight [N, K/8],
    qzeros [N, W], scales [N, 8 W] with zero padding; their (q - z) * s is the ground truth in fp32 and, in fp16,
    the quantizer's fake-quantized weight; every one of the 16 codes occurs; config.json as AwqConfig writes it."""
    import json

    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    gs = -1 if fmt.endswith("-row") else int(fmt.rsplit("g", 1)[1])
    assert qc == {"quant_method": "awq", "bits": 4, "group_size": gs, "zero_point": True, "version": "gemv",
                  "modules_to_not_convert": None}
    floats = synth.awq_float_model(logical)
    for mod in (Q, D, "model.layers.0.mlp.gate_proj"):
        n, k = logical.ternary[mod].shape
        G = k if gs == -1 else gs
        W = awq_calculate_zeros_width(k, G)
        wq, scales, zeros = awq_pseudo_quantize_tensor(floats[mod].clone(), 4, gs)
        qweight, qzeros, qscales = awq_gemv_from_linear(wq, 4, G, scales, zeros)
        assert qweight.shape == (n, k // 8) and qzeros.shape == (n, W) and qscales.shape == (n, 8 * W)
        assert torch.equal(ck.get(f"{mod}.qweight"), qweight), mod
        assert torch.equal(ck.get(f"{mod}.qzeros"), qzeros), mod
        assert ck.get(f"{mod}.scales").dtype == torch.float16 and torch.equal(ck.get(f"{mod}.scales"), qscales), mod
        assert 8 * W > k // G and not bool(qscales[:, k // G:].any())  # padding exercised, and zero
        deq = awq_gemv_dequantize(qweight, qzeros, qscales, k, G)
        assert torch.equal(deq, truth.effective(mod)), mod
        assert torch.equal(deq.half(), wq), mod  # the packed codes are the quantizer's q (fp16 (q - z) * s exact)
        q = torch.stack([(as_u32(qweight) >> (4 * j)) & 15 for j in range(8)], 2)
        assert len(torch.unique(q)) == 16


@settings(max_examples=30, deadline=None)
@given(odd=hst.integers(0, 5), groups=hst.integers(1, 11), gs=hst.sampled_from([32, 64, 128, 256, -1]),
       spread=hst.floats(0.01, 4.0), seed=hst.integers(0, 2 ** 31))
def test_awq_gemv_packer_and_decode_any_shape(odd, groups, gs, spread, seed):
    """For any AutoAWQ gemv shape - N = 8 * (2 odd + 1) outputs (gemv asserts only N % 8, unlike gemm's N % 32),
    K = groups * G inputs with 1..11 groups (so the zero padding of calculate_zeros_width varies: 1..11 groups in
    8 / 16 / 32 columns), G in 32 / 64 / 128 / 256 or -1 - and weight scale: synth's awq_gemv_from_linear =
    AutoAWQ's loops bit for bit, and the reference's decode of the stored tensors (formats.unpack with AWQ_GEMV,
    subtract_zero through AWQ_GEMV_ZEROS with padded_groups, expand_scale, as reference.spec.finish_linear) = the
    shift-and-mask (q - z) * s."""
    from reference.formats import AWQ_GEMV, AWQ_GEMV_ZEROS, ScaleSpec, awq_gemv_zeros_width, expand_scale
    from reference.spec import subtract_zero

    n = 8 * (2 * odd + 1)
    k = groups * (128 if gs == -1 else gs)
    G = k if gs == -1 else gs
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * spread + torch.rand(n, 1, generator=g) * spread).half()
    wq, scales, zeros = awq_pseudo_quantize_tensor(w.clone(), 4, gs)
    qweight, qzeros, qscales = awq_gemv_from_linear(wq, 4, G, scales, zeros)
    W = awq_gemv_zeros_width(k, G)
    assert W == awq_calculate_zeros_width(k, G)
    sq, sz, ss, q, z = synth.awq_gemv_from_linear(wq, scales, zeros, G)
    assert torch.equal(sq, qweight) and torch.equal(sz, qzeros) and torch.equal(ss, qscales)
    spec = ScaleSpec("qzeros", "group", group_size=G, padded_groups=8 * W)
    vals = subtract_zero(unpack(qweight, AWQ_GEMV, (n, k)), qzeros, spec, (n, k), "t", zpack=AWQ_GEMV_ZEROS)
    mult = expand_scale(qscales, dataclasses.replace(spec, key="scales"), (n, k))
    assert torch.equal(vals.float() * mult, awq_gemv_dequantize(qweight, qzeros, qscales, k, G))
    assert torch.equal(vals.to(torch.int64), q - z.repeat_interleave(G, dim=1))


def test_awq_gemv_writer_refuses_what_autoawq_refuses():
    """calculate_zeros_width's group sizes (>= 128, 64, 32) and from_linear's K // 32 * 4 qweight columns: the
    writer refuses G = 16 and K = 136 (G = 136: K // 8 = 17 words, from_linear sizes 16) as AutoAWQ fails on them."""
    from reference.formats import FormatError

    w = torch.zeros(8, 136, dtype=torch.float16)
    s, z = torch.ones(8, 1, dtype=torch.float16), torch.zeros(8, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"K = 136 \(K % 32 = 8\) overruns it"):
        synth.awq_gemv_from_linear(w, s, z, 136)
    with pytest.raises(FormatError, match="calculate_zeros_width raises NotImplementedError for 16"):
        synth.awq_gemv_from_linear(torch.zeros(8, 32, dtype=torch.float16), s.repeat(1, 2), z.repeat(1, 2), 16)
    with pytest.raises(NotImplementedError):
        awq_calculate_zeros_width(32, 16)


# ---------------------------------------------------------------------------------------
# compressed-tensors symmetric: false.  The installed compressed-tensors (vLLM's dependency, 0.17) is the
# independent implementation: calculate_qparams, quantize, PackedQuantizationCompressor / NaiveQuantizationCompressor
# .compress / .decompress and QuantizationConfig parse what synth writes.  llm-compressor's min-max observer is not
# installed: its per-group min / max (observers/helpers.py _flatten_weight, min_max.py _get_min_max) is transcribed
# as synth.ct_observe and checked against a plain reshape below.  compressed-tensors <= 0.9.3 (unpacked int8 zero
# points, truncated) is transcribed from its source (quantization/utils/helpers.py calculate_qparams,
# quantized_compressors/pack_quantized.py decompress_weight), since 0.17 cannot read those checkpoints.

CT_LIBRARY_FORMATS = sorted(f for f in synth.CT_ASYM_FORMATS if not f.endswith("-legacy"))


def _ct_scheme(bits, strategy, group_size, actorder=None, symmetric=False):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy,
                            group_size=group_size if strategy == "group" else None, actorder=actorder)
    return QuantizationScheme(targets=["Linear"], weights=args)


def _ct_library(w, bits, strategy, group_size, fmt="pack-quantized", actorder=None, perm=None):
    """compressed-tensors 0.17 on one float weight: qparams from the observer's min / max, then the compressor.
    ``actorder`` 'group' with the activation order ``perm``: llm-compressor's quantize_weight for
    ActivationOrdering.GROUP - the observer on W[:, perm] (groups of the permuted columns), g_idx = arange(K) //
    group_size in that order, then ``g_idx[invperm]`` - and the compressor quantizes W with that weight_g_idx."""
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = _ct_scheme(bits, strategy, group_size, actorder)
    sd = {"weight": w}
    if actorder == "group":
        g_idx = torch.arange(w.shape[1], dtype=torch.int) // group_size
        sd["weight_g_idx"] = g_idx[torch.argsort(perm)]
        w = w[:, perm]
    scale, zp = calculate_qparams(*synth.ct_observe(w, strategy, group_size), scheme.weights)
    comp = PackedQuantizationCompressor if fmt == "pack-quantized" else NaiveQuantizationCompressor
    return comp, scheme, comp.compress(dict(sd, weight_scale=scale, weight_zero_point=zp), scheme)


def _ct_fmt_args(fmt):
    """(bits, strategy, group size, compressor format, per-module width overrides, actorder) of a CT_ASYM_FORMATS
    name."""
    bits = int(fmt.split("int")[1][0]) if "int" in fmt else 4
    strategy = "channel" if "-channel" in fmt else "tensor" if fmt.endswith("-tensor") else "group"
    wide = {"down_proj": 8, "layers.0.": 2} if fmt.endswith("-mixed") else {}
    actorder = ("weight" if fmt.endswith("-weight") else "group") if "-actorder" in fmt else None
    return bits, strategy, 64, "naive-quantized" if "naive" in fmt else "pack-quantized", wide, actorder


@pytest.mark.parametrize("fmt", CT_LIBRARY_FORMATS)
def test_compressed_tensors_asym_matches_library(fmt, logical, tmp_path):
    """compressed-tensors symmetric false: every stored tensor bit for bit what compressed-tensors' own compressor
    stores for the same bf16 weight and qparams (weight_packed, weight_shape, weight_scale, weight_zero_point
    packed along N for group / channel, int8 [1] for tensor; naive-quantized: weight int8 and zero point int8);
    its decompressor on the stored tensors gives the ground truth exactly with fp32 scales and the truth rounded to
    bf16 in its own arithmetic; config.json parses as its QuantizationConfig with these weight args; the zero points
    vary and (4-bit) every code occurs."""
    import json

    from compressed_tensors.quantization import QuantizationConfig

    bits, strategy, gs, cfmt, wide, actorder = _ct_fmt_args(fmt)
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    qc = QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    assert qc.format == cfmt and qc.quant_method == "compressed-tensors" and qc.ignore == ["lm_head"]
    floats, perms = synth.ct_float_model(logical), synth.actorder_perms(logical)
    for mod in (Q, D, "model.layers.0.mlp.gate_proj", "model.layers.0.self_attn.q_proj"):
        b = next((v for s, v in wide.items() if s in mod), bits)
        group = next(g for g in qc.config_groups.values() if (mod in g.targets) or g.targets == ["Linear"]
                     and not any(mod in h.targets for h in qc.config_groups.values()))
        assert (group.weights.num_bits, group.weights.symmetric, group.weights.strategy) == (b, False, strategy)
        assert group.weights.actorder == actorder
        comp, scheme, want = _ct_library(floats[mod], b, strategy, gs, cfmt, actorder, perms[mod])
        assert ("weight_g_idx" in want) is (actorder == "group")
        if actorder == "group":  # a permutation of arange(K) // 64 that moves inputs between groups
            gi = want["weight_g_idx"].long()
            assert torch.equal(gi.sort().values, torch.arange(gi.numel()) // gs)
            assert not torch.equal(gi, torch.arange(gi.numel()) // gs)
        stored = {k: ck.get(f"{mod}.{k}") for k in want}
        assert set(want) == {k.rsplit(".", 1)[1] for k in ck.keys() if k.startswith(mod + ".")}, mod
        for k, v in want.items():
            assert stored[k].dtype == v.dtype and torch.equal(stored[k], v), (mod, k)
        zp = want["weight_zero_point"]
        if cfmt == "pack-quantized" and strategy != "tensor":
            n = floats[mod].shape[0]
            assert zp.dtype == torch.int32 and zp.shape == (-(-n // (32 // b)), want["weight_scale"].shape[1])
        else:
            assert zp.dtype == torch.int8 and zp.shape == want["weight_scale"].shape
        exact = dict(stored, weight_scale=stored["weight_scale"].float())
        assert torch.equal(comp.decompress(exact, scheme)["weight"], truth.effective(mod)), mod
        own = comp.decompress(stored, scheme)["weight"]
        assert own.dtype == torch.bfloat16 and torch.equal(own, truth.effective(mod).bfloat16()), mod
        if strategy != "tensor":  # lopsided rows: the zero points differ between groups / channels
            assert len(torch.unique(synth.ct_asym_quantize(floats[mod], b, strategy, gs)[2])) > 1, mod
    if bits == 4 and strategy == "group" and cfmt == "pack-quantized" and not wide:
        q = torch.stack([(ck.get(f"{D}.weight_packed").to(torch.int64) >> (4 * j)) & 15 for j in range(8)])
        assert len(torch.unique(q)) == 16


def ct093_calculate_qparams(min_vals, max_vals, bits):
    """compressed-tensors 0.9.3 quantization/utils/helpers.py calculate_qparams, symmetric false, type int."""
    min_vals = torch.min(min_vals, torch.zeros_like(min_vals))
    max_vals = torch.max(max_vals, torch.zeros_like(max_vals))
    bit_range = 2 ** bits
    bit_min, bit_max = torch.tensor(-bit_range / 2), torch.tensor(bit_range / 2 - 1)
    bit_range = bit_max - bit_min
    zp_dtype = torch.int8
    scales = (max_vals - min_vals) / float(bit_range)
    scales = torch.clamp(scales, min=torch.finfo(torch.float32).eps)
    zero_points = bit_min - (min_vals / scales)
    zero_points = torch.clamp(zero_points, bit_min, bit_max)
    zero_points = zero_points.to(zp_dtype)
    if scales.ndim == 0:
        scales = scales.reshape(1)
        zero_points = zero_points.reshape(1)
    return scales, zero_points


def ct093_unpack_from_int32(value, num_bits, shape):
    """compressed-tensors 0.9.3 unpack_from_int32 (packed_dim 1 only)."""
    pack_factor = 32 // num_bits
    mask = (1 << num_bits) - 1
    unpacked = torch.zeros((value.shape[0], value.shape[1] * pack_factor), dtype=torch.int32)
    for i in range(pack_factor):
        unpacked[:, i::pack_factor] = (value >> (num_bits * i)) & mask
    unpacked = unpacked[:, : int(shape[1])]
    offset = pow(2, num_bits) // 2
    return (unpacked - offset).to(torch.int8)


@pytest.mark.parametrize("fmt", sorted(f for f in synth.CT_ASYM_FORMATS if f.endswith("-legacy")))
def test_compressed_tensors_asym_legacy_matches_093(fmt, logical, tmp_path):
    """compressed-tensors <= 0.9.3: the zero point is the int8 [N, G] parameter itself (signed z, cast without
    rounding), the weight packed as today; decompress_weight (unpack_from_int32, then dequantize with the unpacked
    zero points) of the stored tensors is the truth.  compressed-tensors 0.17 cannot read it (its decompressor
    unpacks weight_zero_point as int32 and raises)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize

    bits, strategy, gs, _, _, _ = _ct_fmt_args(fmt)
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    ck = Checkpoint(out)
    floats = synth.ct_float_model(logical)
    for mod in (Q, D):
        w = floats[mod]
        scale, zp = ct093_calculate_qparams(*synth.ct_observe(w, strategy, gs), bits)
        scheme = _ct_scheme(bits, strategy, gs)
        q = quantize(w, scale, zp, scheme.weights, dtype=torch.int8)  # 0.9.3's _quantize: the same ops
        assert torch.equal(ck.get(f"{mod}.weight_packed"), pack_to_int32(q, bits))
        assert torch.equal(ck.get(f"{mod}.weight_scale"), scale)
        z = ck.get(f"{mod}.weight_zero_point")
        assert z.dtype == torch.int8 and torch.equal(z, zp) and z.shape == scale.shape
        x_q = ct093_unpack_from_int32(ck.get(f"{mod}.weight_packed"), bits, w.shape)
        assert torch.equal(dequantize(x_q, scale.float(), z), truth.effective(mod)), mod
        stored = {k: ck.get(f"{mod}.{k}") for k in ("weight_packed", "weight_scale", "weight_zero_point",
                                                     "weight_shape")}
        with pytest.raises(ValueError, match="Expected torch.int32"):
            PackedQuantizationCompressor.decompress(stored, scheme)
    rounded = synth.ct_qparams(*synth.ct_observe(floats[D], strategy, gs), bits)[1]
    assert not torch.equal(rounded, ck.get(f"{D}.weight_zero_point"))  # 0.9.4+ rounds, 0.9.3 truncated


def test_ct_observer_is_a_plain_min_max():
    """synth.ct_observe (llm-compressor's flatten_for_calibration + amin / amax over dims (0, -1)) = per group /
    channel / tensor min and max, in the weight's dtype."""
    w = torch.randn(6, 12).bfloat16()
    mn, mx = synth.ct_observe(w, "group", 4)
    assert torch.equal(mn, w.reshape(6, 3, 4).amin(-1)) and torch.equal(mx, w.reshape(6, 3, 4).amax(-1))
    mn, mx = synth.ct_observe(w, "channel")
    assert torch.equal(mn, w.amin(1, keepdim=True)) and mn.dtype == torch.bfloat16
    mn, mx = synth.ct_observe(w, "tensor")
    assert mn.shape == (1,) and float(mx) == float(w.max())


@settings(max_examples=30, deadline=None)
@given(n=hst.integers(1, 70), groups=hst.integers(1, 4), gs=hst.sampled_from([8, 32, 64, 128]),
       bits=hst.integers(2, 8), strategy=hst.sampled_from(["group", "channel", "tensor"]),
       dtype=hst.sampled_from([torch.bfloat16, torch.float16, torch.float32]), spread=hst.floats(0.01, 4.0),
       seed=hst.integers(0, 2 ** 31))
def test_ct_asym_packer_and_decode_any_shape(n, groups, gs, bits, strategy, dtype, spread, seed):
    """For any shape (N not a multiple of 32/b: the packed zero points' last word padded; widths 3 / 5 / 6 / 7 that
    do not tile an int32), strategy and weight dtype: synth's transcribed qparams / quantize + formats.pack
    (ct_pack_spec / ct_zero_pack_spec) = compressed-tensors' compressor bit for bit, and the reference's decode of the
    stored tensors (unpack, the zero points through the zero_pack, expand_scale, as reference.spec.finish_linear) =
    its decompressor with fp32 scales, exactly."""
    from reference.formats import ScaleSpec, ct_pack_spec, ct_zero_pack_spec, expand_scale
    from reference.spec import subtract_zero

    k = groups * gs
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * spread + torch.rand(n, 1, generator=g) * spread).to(dtype)
    comp, scheme, want = _ct_library(w, bits, strategy, gs)
    q, scale, zp = synth.ct_asym_quantize(w, bits, strategy, gs)
    assert torch.equal(scale, want["weight_scale"])
    assert torch.equal(pack(q, ct_pack_spec(bits)), want["weight_packed"])
    kw = {"group": dict(granularity="group", group_size=gs), "channel": dict(granularity="channel"),
          "tensor": dict(granularity="tensor")}[strategy]
    zspec = ScaleSpec("weight_zero_point", **kw)
    zpack = None
    if strategy == "tensor":
        assert torch.equal(zp, want["weight_zero_point"])
    else:
        zpack = ct_zero_pack_spec(bits)
        assert torch.equal(pack(zp, zpack), want["weight_zero_point"])
    vals = subtract_zero(unpack(want["weight_packed"], ct_pack_spec(bits), (n, k)), want["weight_zero_point"], zspec,
                         (n, k), "t", zpack=zpack)
    mult = expand_scale(want["weight_scale"], dataclasses.replace(zspec, key="weight_scale"), (n, k))
    exact = dict(want, weight_scale=want["weight_scale"].float())
    assert torch.equal(vals.float() * mult, comp.decompress(exact, scheme)["weight"])


# ---------------------------------------------------------------------------------------
# llama.cpp TQ2_0 (ggml-quants.c, block_tq2_0: qs[QK_K/4] then ggml_half d; QK_K = 256)


def tq2_0_quantize_ref(w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """llama.cpp quantize_row_tq2_0_ref, transcribed loop for loop, on an already ternary row with
    given block scales d (fp16): for j in (0, 32): for m < 32: q = sum_n (x[m + 32n] + 1) << 2n ->
    qs[j + m]; x += 128.  Then the 2 bytes of d (little-endian fp16).  -> uint8 [N, K/256 * 66]."""
    n, k = w.shape
    assert k % 256 == 0
    out = torch.zeros(n, k // 256 * 66, dtype=torch.uint8)
    dh = d.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    for r in range(n):
        for i in range(k // 256):
            x = w[r, i * 256:(i + 1) * 256].tolist()
            blk = out[r, i * 66:(i + 1) * 66]
            off = 0
            for j in range(0, 64, 32):
                for m in range(32):
                    q = 0
                    for nn in range(4):
                        q += ((x[off + m + nn * 32] + 1) & 3) << (2 * nn)
                    blk[j + m] = q
                off += 128
            blk[64], blk[65] = int(dh[r, i]) & 0xFF, int(dh[r, i]) >> 8
    return out


def tq2_0_dequantize_ref(raw: torch.Tensor, k: int) -> torch.Tensor:
    """llama.cpp dequantize_row_tq2_0: y = (float)(((qs[j + m] >> 2l) & 3) - 1) * d, in the order
    j in (0, 32), l < 4, m < 32.  -> float32 [N, K]."""
    n = raw.shape[0]
    y = torch.empty(n, k)
    for r in range(n):
        out = []
        for i in range(k // 256):
            blk = raw[r, i * 66:(i + 1) * 66]
            d = float(blk[64:66].clone().view(torch.float16)[0])
            for j in (0, 32):
                for l in range(4):
                    for m in range(32):
                        q = (int(blk[j + m]) >> (l * 2)) & 3
                        out.append(float(torch.tensor((q - 1) * d, dtype=torch.float32)))
        y[r] = torch.tensor(out)
    return y


def test_tq2_0_lane_rule_on_a_hand_built_block():
    """Bytes built by hand (not by pack): byte m of half h holds element 128h + m + 32n at bits 2n.
    The TQ2_0 PackSpec + in-block scale must decode them as llama.cpp's dequantize_row_tq2_0 does."""
    from reference.formats import TQ2_0, expand_scale, tq2_0_scale

    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 3, (3, 512), generator=g)  # two blocks per row, codes 0..2 = w + 1
    raw = torch.zeros(3, 132, dtype=torch.uint8)
    d = torch.tensor([[0.5, -0.125], [0.0625, 3.0], [1.0, 0.01]], dtype=torch.float16)
    for r in range(3):
        for b in range(2):
            for h in range(2):
                for m in range(32):
                    byte = sum(int(codes[r, 256 * b + 128 * h + m + 32 * n]) << (2 * n) for n in range(4))
                    raw[r, 66 * b + 32 * h + m] = byte
            raw[r, 66 * b + 64:66 * b + 66] = d[r, b:b + 1].view(torch.uint8)
    vals = unpack(raw, TQ2_0, (3, 512))
    assert torch.equal(vals.to(torch.int64), codes - 1)
    eff = vals.float() * expand_scale(raw, tq2_0_scale("w"), (3, 512))
    assert torch.equal(eff, tq2_0_dequantize_ref(raw, 512))
    # the same bytes from llama.cpp's quantizer transcription, and from our packer
    assert torch.equal(tq2_0_quantize_ref(codes - 1, d), raw)
    from reference.formats import write_record_scales
    assert torch.equal(write_record_scales(pack(codes - 1, TQ2_0), d, tq2_0_scale("w"), (3, 512)), raw)


def test_tq2_0_writer_matches_llamacpp(logical, tmp_path):
    """synth 'tq2_0' on a K % 256 == 0 model slice: bytes equal llama.cpp's quantize_row_tq2_0_ref
    output; spec decode gives T bit-exact and W_eff = llama.cpp's dequantize_row_tq2_0 exactly."""
    from reference.formats import TQ2_0, tq2_0_scale
    from reference.spec import LinearEntry, decode_linear

    g = torch.Generator().manual_seed(3)
    t = torch.randint(-1, 2, (24, 768), generator=g).to(torch.int8)
    m = (0.02 + 0.01 * torch.rand(24, 3, generator=g)).repeat_interleave(256, dim=1)  # per-256-block multipliers
    lg = synth.Logical({}, {"model.layers.0.mlp.down_proj": t}, {"model.layers.0.mlp.down_proj": m}, {})
    sd, qcfg, truth = synth.w_tq2_0(lg)
    key = "blk.0.ffn_down.weight"
    assert qcfg is None and set(sd) == {key}
    raw = sd[key]
    assert raw.dtype == torch.uint8 and raw.shape == (24, 3 * 66)
    d = m[:, ::256].to(torch.float16)
    assert torch.equal(raw, tq2_0_quantize_ref(t, d))
    from safetensors.torch import save_file
    save_file({key: raw}, str(tmp_path / "model.safetensors"))
    e = LinearEntry(weight_key=key, shape=(24, 768), pack=TQ2_0, scale=tq2_0_scale(key))
    dec = decode_linear(Checkpoint(tmp_path), e, "down")
    assert torch.equal(dec.values.to(torch.int8), t)
    assert torch.equal(dec.effective(), tq2_0_dequantize_ref(raw, 768))
    assert torch.equal(dec.effective(), truth.effective("model.layers.0.mlp.down_proj"))
    torch.testing.assert_close(dec.effective(), t.float() * m, rtol=1e-3, atol=0)  # fp16 rounding of d only


def tq1_0_quantize_ref(w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """llama.cpp ggml-quants.c quantize_row_tq1_0_ref, transcribed (uint8 arithmetic as in C), for ternary rows
    w (N, K % 256 == 0) whose block absmax is d: per block qs[48] (5 digits a byte: x[m + n*32], then
    x[160 + m + n*16]), qh[4] (4 digits: x[240 + j + m*4], then one more factor 3), each byte ceil(q * 256 / 243),
    then fp16 d."""
    n, k = w.shape
    out = torch.zeros(n, k // 256 * 54, dtype=torch.uint8)
    for r in range(n):
        row = bytearray()
        for b in range(k // 256):
            x = (w[r, b * 256:(b + 1) * 256].to(torch.int64) + 1).tolist()  # lroundf(x * id) + 1
            qs, qh = [], []
            for base, width in ((0, 32), (160, 16)):
                for m in range(width):
                    q = 0
                    for j in range(5):
                        q = (q * 3 + x[base + m + j * width]) & 0xFF
                    qs.append(((q * 256 + 242) // 243) & 0xFF)
            for j in range(4):
                q = 0
                for m in range(4):
                    q = (q * 3 + x[240 + j + m * 4]) & 0xFF
                q = (q * 3) & 0xFF
                qh.append(((q * 256 + 242) // 243) & 0xFF)
            row += bytes(qs) + bytes(qh) + d[r, b].reshape(1).view(torch.uint8).numpy().tobytes()
        out[r] = torch.tensor(list(row), dtype=torch.uint8)
    return out


def tq1_0_dequantize_ref(raw: torch.Tensor, k: int) -> torch.Tensor:
    """llama.cpp dequantize_row_tq1_0, transcribed: digit n of a byte is ((byte * 3^n) mod 256) * 3 >> 8."""
    pow3 = (1, 3, 9, 27, 81, 243)
    n = raw.shape[0]
    blk = raw.reshape(n, -1, 54).to(torch.int64)
    d = blk[:, :, 52:54].to(torch.uint8).clone().view(torch.float16).float().reshape(n, -1, 1)
    ys = []
    for lo, width, nd in ((0, 32, 5), (32, 16, 5), (48, 4, 4)):
        for j in range(nd):
            q = (blk[:, :, lo:lo + width] * pow3[j]) & 0xFF
            ys.append(((q * 3) >> 8) - 1)
    return (torch.cat(ys, dim=2).float() * d).reshape(n, -1)[:, :k]


def test_tq1_0_writer_matches_llamacpp(tmp_path):
    """synth 'tq1_0' (llama.cpp TQ1_0, base-3 digits): bytes equal llama.cpp's quantize_row_tq1_0_ref output; the
    spec decode gives T bit-exact and W_eff = dequantize_row_tq1_0 exactly; a partial last block (K % 256) pads
    with trit 1 (= 0) and round-trips."""
    from safetensors.torch import save_file

    from reference.formats import TQ1_0, pack, tq1_0_scale, unpack
    from reference.spec import LinearEntry, decode_linear

    g = torch.Generator().manual_seed(4)
    t = torch.randint(-1, 2, (8, 512), generator=g).to(torch.int8)
    m = (0.02 + 0.01 * torch.rand(8, 2, generator=g)).repeat_interleave(256, dim=1)
    lg = synth.Logical({}, {"model.layers.0.mlp.down_proj": t}, {"model.layers.0.mlp.down_proj": m}, {})
    sd, qcfg, truth = synth.w_tq1_0(lg)
    key = "blk.0.ffn_down.weight"
    raw = sd[key]
    assert qcfg is None and raw.dtype == torch.uint8 and raw.shape == (8, 2 * 54)
    assert torch.equal(raw, tq1_0_quantize_ref(t, m[:, ::256].to(torch.float16)))
    save_file({key: raw}, str(tmp_path / "model.safetensors"))
    e = LinearEntry(weight_key=key, shape=(8, 512), pack=TQ1_0, scale=tq1_0_scale(key))
    dec = decode_linear(Checkpoint(tmp_path), e, "down")
    assert torch.equal(dec.values.to(torch.int8), t)
    assert torch.equal(dec.effective(), tq1_0_dequantize_ref(raw, 512))
    assert torch.equal(dec.effective(), truth.effective("model.layers.0.mlp.down_proj"))
    part = torch.randint(-1, 2, (3, 300), generator=g).to(torch.int8)
    assert pack(part, TQ1_0).shape == (3, 108) and torch.equal(unpack(pack(part, TQ1_0), TQ1_0, (3, 300)), part)
    assert PackSpec.from_dict(TQ1_0.to_dict()) == TQ1_0


def test_tq2_0_trained_model_partial_blocks(logical, tmp_path):
    """tiny-trained (K = 128 / 384: a partial last block, padded with code 1 = 0) with per-256
    group multipliers: T bit-exact, W_eff within fp16 rounding of d, GGUF names, no scale tensor."""
    from reference.formats import TQ2_0, tq2_0_scale
    from reference.spec import LinearEntry, decode_linear

    lg = logical.with_group_jitter(256, seed=2)
    ck, truth = _write("tq2_0", lg, tmp_path)
    assert not any(k.endswith("scale") for k in ck.keys())
    for mod in (Q, D):
        key = f"{synth.rename(mod, 'gguf')}.weight"
        n, k = lg.ternary[mod].shape
        raw = ck.get(key)
        assert raw.shape == (n, -(-k // 256) * 66)
        rec = raw.reshape(n, -1, 66)
        if k % 256:  # padding fields of the last block hold code 1 (value 0)
            tail = unpack(raw, TQ2_0.replace(codes=(0, 1, 2, 3)), (n, -(-k // 256) * 256))[:, k:]
            assert bool((tail == 1).all())
        d = rec[:, :, 64:66].contiguous().view(torch.float16).reshape(n, -1)
        assert torch.equal(d, lg.mult[mod][:, ::256].to(torch.float16))
        dec = decode_linear(ck, LinearEntry(weight_key=key, shape=(n, k), pack=TQ2_0, scale=tq2_0_scale(key)), mod)
        assert torch.equal(dec.values.to(torch.int8), lg.ternary[mod])
        assert torch.equal(dec.effective(), truth.effective(mod))
        torch.testing.assert_close(dec.effective(), lg.effective(mod), rtol=1e-3, atol=0)


@pytest.mark.parametrize("fmt", ["tq2_0", "tq1_0"])
def test_llamacpp_blocks_from_channel_multipliers(fmt, logical, tmp_path):
    """Per-channel multipliers (N, 1) in llama.cpp blocks, K = 128 <= 256 (one block a row): the d of each row's
    block came as a stride-0 column (the multiplier expanded), which write_record_scales' byte view refused with a
    torch RuntimeError; now every block holds its row's d."""
    from reference.spec import LinearEntry, decode_linear
    from reference.formats import TQ1_0, TQ2_0, tq1_0_scale, tq2_0_scale

    lg = logical.with_channel_jitter(seed=3)
    ck, truth = _write(fmt, lg, tmp_path)
    pack_spec, scale = (TQ2_0, tq2_0_scale) if fmt == "tq2_0" else (TQ1_0, tq1_0_scale)
    for mod in (Q, D):
        key = f"{synth.rename(mod, 'gguf')}.weight"
        n, k = lg.ternary[mod].shape
        dec = decode_linear(ck, LinearEntry(weight_key=key, shape=(n, k), pack=pack_spec, scale=scale(key)), mod)
        assert torch.equal(dec.values.to(torch.int8), lg.ternary[mod])
        assert torch.equal(dec.effective(), truth.effective(mod))
        torch.testing.assert_close(dec.effective(), lg.effective(mod), rtol=1e-3, atol=0)


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 12), k=hst.integers(1, 700), block=hst.sampled_from([8, 32, 128, 256]),
       order=hst.sampled_from(["lsb", "msb"]), rec_bytes=hst.integers(2, 8), seed=hst.integers(0, 2**16))
def test_record_packspec_roundtrip(n, k, block, order, rec_bytes, seed):
    """Record-packed weights (codes + side bytes per record, partial last record) round-trip exactly;
    the side bytes do not disturb the codes and hold what write_record_scales put there."""
    from reference.formats import ScaleSpec, expand_scale, write_record_scales

    spec = PackSpec(bits=2, container="uint8", lanes="block_interleaved", block=block, bit_order=order,
                    codes=(-1, 0, 1, None), pad_code=1, record=(256, 64 + rec_bytes))
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (n, k), generator=g).to(torch.int8)
    p = pack(w, spec)
    assert p.shape == (n, -(-k // 256) * (64 + rec_bytes))
    sc = ScaleSpec(key="w", granularity="block", group_size=256, record_bytes=64 + rec_bytes,
                   byte_offset=64 + rec_bytes - 2, dtype="float16")
    d = (torch.rand(n, -(-k // 256), generator=g) + 0.01).to(torch.float16)
    p2 = write_record_scales(p, d, sc, (n, k))
    assert torch.equal(unpack(p2, spec, (n, k)), w)
    assert torch.equal(expand_scale(p2, sc, (n, k)), d.float().repeat_interleave(256, dim=1)[:, :k])


def test_tq2_0_spec_json_roundtrip_and_old_json_unchanged():
    """The TQ2_0 entry serialises (record, in-block scale) and reads back equal; entries of the
    existing formats serialise without any of the new keys."""
    import json

    from reference.formats import TQ2_0, ScaleSpec, tq2_0_scale
    from reference.spec import CheckpointSpec, LinearEntry

    e = LinearEntry(weight_key="blk.0.attn_q.weight", shape=(128, 512), pack=TQ2_0,
                    scale=tq2_0_scale("blk.0.attn_q.weight"))
    d = json.loads(json.dumps(e.to_dict()))
    assert d["pack"]["record"] == [256, 66]
    assert d["scale"] == {"key": "blk.0.attn_q.weight", "granularity": "block", "op": "multiply",
                          "group_size": 256, "index": None, "transposed": False, "record_bytes": 66,
                          "byte_offset": 64, "dtype": "float16"}
    assert LinearEntry.from_dict(d) == e
    old = LinearEntry(weight_key="w", shape=(4, 8), pack=synth.SEED, scale=ScaleSpec(key="s", granularity="channel"))
    od = old.to_dict()
    assert "record" not in od["pack"] and not {"record_bytes", "byte_offset", "dtype"} & set(od["scale"])
    spec = CheckpointSpec(name="x", linears={"m": e}, tensors={})
    assert CheckpointSpec.from_dict(json.loads(spec.to_json())).linears["m"] == e


@pytest.mark.parametrize("bad", [
    dict(key="other"),  # an in-block scale must name the weight itself
    dict(record_bytes=68),  # record size disagrees with the PackSpec
    dict(byte_offset=10),  # inside the code bytes
])
def test_tq2_0_inconsistent_in_block_scale_is_refused(bad):
    import dataclasses

    from reference.formats import TQ2_0, FormatError, tq2_0_scale
    from reference.spec import LinearEntry

    sc = dataclasses.replace(tq2_0_scale("w"), **bad)
    with pytest.raises(FormatError, match="in-block scale"):
        LinearEntry(weight_key="w", shape=(4, 256), pack=TQ2_0, scale=sc)


# ---------------------------------------------------------------------------------------
# HQQ 2-bit (mobiusml/hqq hqq/core/quantize.py: Quantizer.quantize axis=1, BitPack.pack_2bit_u8)


def hqq_pack_2bit_u8(W_q: torch.Tensor) -> torch.Tensor:
    """mobiusml/hqq BitPack.pack_2bit_u8, verbatim: four axis-0 chunks, chunk 0 in bits 7-6."""
    W_q = W_q.to(torch.uint8)
    _step = int(len(W_q) / 4)
    return W_q[:_step] << 6 | W_q[_step:2 * _step] << 4 | W_q[2 * _step:3 * _step] << 2 | W_q[3 * _step:]


def hqq_dequantize(W_q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, shape) -> torch.Tensor:
    """Quantizer.dequantize for nbits=2 (BitPack.unpack_2bit_u8, then (W_q - zero) * scale, reshape),
    in float32 (HQQ computes in the model's compute dtype)."""
    W_q_p = torch.cat([(W_q & 0b11000000) >> 6, (W_q & 0b00110000) >> 4, (W_q & 0b00001100) >> 2,
                       W_q & 0b00000011], axis=0).float()
    return ((W_q_p - zero.float()) * scale.float()).reshape(shape)


def test_hqq_matches_bitpack_and_dequantize(logical, tmp_path):
    """W_q = HQQ's pack_2bit_u8 of the axis=1 group view of q = w + z (z in {1, 2} per group);
    HQQ's dequantize of what synth wrote = the ground truth; the spec decode agrees bit for bit."""
    from reference.formats import ScaleSpec
    from reference.spec import LinearEntry, decode_linear

    lg = logical.with_group_jitter(64, seed=5)
    ck, truth = _write("hqq", lg, tmp_path)
    for mod in (Q, D):
        t = lg.ternary[mod]
        n, k = t.shape
        W_q, s, z = ck.get(f"{mod}.W_q"), ck.get(f"{mod}.scale"), ck.get(f"{mod}.zero")
        assert W_q.dtype == torch.uint8 and W_q.shape == (n * k // 64 // 4, 64)
        assert s.shape == z.shape == (n * k // 64, 1) and s.dtype == z.dtype == torch.float16
        assert set(torch.unique(z).tolist()) == {1.0, 2.0}  # both zero points occur
        q = (t.reshape(-1, 64).to(torch.int64) + z.to(torch.int64))  # axis=1 view: one row per group
        assert torch.equal(W_q, hqq_pack_2bit_u8(q))
        eff = hqq_dequantize(W_q, s, z, (n, k))
        assert torch.equal(eff, truth.effective(mod))
        torch.testing.assert_close(eff, lg.effective(mod), rtol=1e-3, atol=0)
        e = LinearEntry(weight_key=f"{mod}.W_q", shape=(n, k), pack=synth.HQQ_SPEC,
                        scale=ScaleSpec(f"{mod}.scale", "group", group_size=64),
                        zero=ScaleSpec(f"{mod}.zero", "group", group_size=64))
        d = decode_linear(ck, e, mod)
        assert torch.equal(d.values, t) and torch.equal(d.effective(), eff)


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 12), groups=hst.integers(1, 6), g=hst.sampled_from([4, 16, 64]),
       order=hst.sampled_from(["lsb", "msb"]), lanes=hst.sampled_from(["interleaved", "blocked"]),
       seed=hst.integers(0, 2**16))
def test_group_view_roundtrip(n, groups, g, order, lanes, seed):
    """Any packing of the [N*K/G, G] group view (padding when N*K/G is not a multiple of 4)."""
    spec = PackSpec(bits=2, container="uint8", pack_axis=0, lanes=lanes, bit_order=order, codes=(0, 1, 2, 3),
                    group_view=g)
    w = torch.randint(0, 4, (n, groups * g), generator=torch.Generator().manual_seed(seed))
    assert torch.equal(unpack(pack(w, spec), spec, (n, groups * g)).to(torch.int64), w)


def test_hqq_zero_points_must_make_ternary_values(logical, tmp_path):
    """Under ``levels: ternary`` a non-integer zero point, or an integer one that puts (q - z) outside
    {-1, 0, 1}, is a clear 'not ternary' error naming the tensor; without it the decode is HQQ's own
    q - z (float32 where a zero point is not an integer, integers otherwise)."""
    import dataclasses

    from safetensors.torch import load_file, save_file

    from reference.checkpoint import CheckpointError
    from reference.formats import ScaleSpec, unpack_codes
    from reference.spec import LinearEntry, decode_linear

    out = tmp_path / "hqq"
    synth.write("hqq", logical, out)
    sd = load_file(str(out / "model.safetensors"))
    n, k = logical.ternary[D].shape
    e = LinearEntry(weight_key=f"{D}.W_q", shape=(n, k), pack=synth.HQQ_SPEC,
                    scale=ScaleSpec(f"{D}.scale", "group", group_size=64),
                    zero=ScaleSpec(f"{D}.zero", "group", group_size=64), levels="ternary")
    q = unpack_codes(sd[f"{D}.W_q"], synth.HQQ_SPEC, (n, k)).float()
    for bad, want in ((1.5, "non-integer values (e.g. 1.5 at element 3)"), (3.0, "not ternary")):
        z = sd[f"{D}.zero"].clone()
        z[3] = bad
        save_file({**sd, f"{D}.zero": z}, str(out / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(CheckpointError) as ei:
            decode_linear(Checkpoint(out), e, D)
        assert f"{D}.zero" in str(ei.value) and want in str(ei.value) and "not ternary" in str(ei.value)
        d = decode_linear(Checkpoint(out), dataclasses.replace(e, levels=None), D)
        zz = z.float().reshape(n, k // 64).repeat_interleave(64, dim=1)
        assert d.values.is_floating_point() == (bad == 1.5)
        assert torch.equal(d.values.float(), q - zz)


def hqq_unpack(W_q: torch.Tensor, packing: str) -> torch.Tensor:
    """mobiusml/hqq BitPack.unpack_<packing>, transcribed from its masks and shifts (one chunk of rows per field,
    chunk 0 from the highest field; unpack_3bit_32 keeps the 10 fields of bits 29-0)."""
    bits, shifts = {"8bit_u8": (8, [0]), "4bit_u8": (4, [4, 0]), "2bit_u8": (2, [6, 4, 2, 0]),
                    "1bit_u8": (1, [7, 6, 5, 4, 3, 2, 1, 0]), "3bit_32": (3, [27, 24, 21, 18, 15, 12, 9, 6, 3, 0])}[packing]
    return torch.cat([(W_q >> sh) & ((1 << bits) - 1) for sh in shifts], dim=0)


@pytest.mark.parametrize("fmt", sorted(f for f in synth.HQQ_FORMATS if f != "hqq-mixed"))
def test_hqq_quantizer_writer_matches_hqq_dequantize(fmt, logical, tmp_path):
    """HQQ's quantizer on a float model (any nbits, both axes, meta or not): HQQ's unpack of the stored W_q, then
    Quantizer.dequantize ((W_q - zero) * scale, the 3-bit rows cut to the group view, reshape) = the ground
    truth bit for bit in float32; the zero points are non-integer except where HQQ rounds them (nbits 4); W_q has
    the dtype and shape of HQQ's packing; the spec decode of HQQ's own layout agrees."""
    from reference.formats import ScaleSpec
    from reference.inspect_search import hqq_pack_spec
    from reference.spec import LinearEntry, decode_linear

    ck, truth = _write(fmt, logical, tmp_path)
    nbits = int(fmt.split("-")[1][0])
    packing = synth.HQQ_PACKING[nbits]
    axis = 0 if "axis0" in fmt else 1
    view = fmt.split("-")[2] if fmt.endswith("-view") else None  # view_as_float: W_q.view(compute_dtype)
    cdt = getattr(torch, view or "float16")
    for mod in (Q, D):
        n, k = logical.ternary[mod].shape
        cols = n * k // 64
        W_q, s, z = ck.get(f"{mod}.W_q"), ck.get(f"{mod}.scale"), ck.get(f"{mod}.zero")
        if view:  # Quantizer.dequantize: W_q.view(meta["unpack_view_dtype"]) before unpacking
            assert W_q.dtype == cdt
            W_q = W_q.view(torch.int32 if nbits == 3 else torch.uint8)
        f = synth.HQQ_BITPACK[packing][1]
        rows = -(-(cols if axis == 1 else 64) // f)
        assert W_q.dtype == (torch.int32 if nbits == 3 else torch.uint8)
        assert tuple(W_q.shape) == ((rows, 64) if axis == 1 else (rows, cols))
        assert s.shape == z.shape == ((cols, 1) if axis == 1 else (1, cols)) and s.dtype == z.dtype == cdt
        frac = (z != z.round()).float().mean().item()
        assert (frac == 0) if nbits == 4 else frac > 0.8, frac  # (fp16 zeros near 128 are integers 1 in 16)
        q = hqq_unpack(W_q, packing)[:cols if axis == 1 else 64].float()
        assert int(q.min()) >= 0 and int(q.max()) <= 2 ** nbits - 1 and len(torch.unique(q)) >= min(2 ** nbits, 64)
        eff = ((q - z.float()) * s.float()).reshape(n, k)
        assert torch.equal(eff, truth.effective(mod)), mod
        zs = ScaleSpec(f"{mod}.zero", "group", group_size=64, group_axis=axis)
        e = LinearEntry(weight_key=f"{mod}.W_q", shape=(n, k), pack=hqq_pack_spec(axis, 64, packing, stored_as=view),
                        scale=dataclasses.replace(zs, key=f"{mod}.scale"), zero=zs)
        d = decode_linear(ck, e, mod)
        assert torch.equal(d.values.float(), truth.ternary[mod]) and torch.equal(d.effective(), eff)
        assert d.values.is_floating_point() == (nbits != 4)


VIEW_FORMATS = {"hqq-2bit-float16-view": (2, torch.float16), "hqq-4bit-bfloat16-view": (4, torch.bfloat16),
                "hqq-3bit-float16-view": (3, torch.float16)}


@pytest.mark.parametrize("fmt", sorted(VIEW_FORMATS))
def test_hqq_view_as_float_bytes_round_trip(fmt, logical, tmp_path):
    """HQQ view_as_float (hqq/core/quantize.py Quantizer.quantize: ``W_q = W_q.view(compute_dtype)`` after packing,
    dequantize: ``W_q.view(meta["unpack_view_dtype"])``): the stored W_q is a compute_dtype tensor whose bytes
    are those of the integer-packed writer's W_q (uint8 [a, b] as [a, b/2], int32 [a, b] as [a, 2b]); the meta
    says view_as_float True (uint8 1) and nothing else changes; PackSpec ``stored_as`` unpacks it bit for bit and
    packs the codes back to the same bytes."""
    from reference.formats import FormatError, unpack_codes
    from reference.inspect_search import hqq_pack_spec

    nbits, cdt = VIEW_FORMATS[fmt]
    ck, _ = _write(fmt, logical, tmp_path)
    plain, _ = synth.w_hqq_quant(logical, nbits, compute_dtype=cdt)[:2]  # the same quantizer, view_as_float False
    idt = torch.int32 if nbits == 3 else torch.uint8
    packing = synth.HQQ_PACKING[nbits]
    name = str(cdt).removeprefix("torch.")
    for mod in (Q, D):
        n, k = logical.ternary[mod].shape
        W_q, ref = ck.get(f"{mod}.W_q"), plain[f"{mod}.W_q"]
        ratio = idt.itemsize / cdt.itemsize
        assert W_q.dtype == cdt and tuple(W_q.shape) == (ref.shape[0], int(ref.shape[1] * ratio))
        assert torch.equal(W_q.view(idt), ref)  # the bytes, bit for bit
        assert W_q.numpy().tobytes() == ref.numpy().tobytes() if cdt != torch.bfloat16 else \
            W_q.view(torch.int16).numpy().tobytes() == ref.numpy().tobytes()
        assert ck.get(f"{mod}.view_as_float").dtype == torch.uint8 and int(ck.get(f"{mod}.view_as_float")) == 1
        for key in ("scale", "zero", "nbits", "packing", "unpack_view_dtype", "compute_dtype", "shape"):
            assert torch.equal(ck.get(f"{mod}.{key}"), plain[f"{mod}.{key}"]), key
        spec = hqq_pack_spec(1, 64, packing, stored_as=name)
        assert spec.packed_shape((n, k)) == tuple(W_q.shape)
        codes = unpack_codes(W_q, spec, (n, k))
        assert torch.equal(codes, unpack_codes(ref, hqq_pack_spec(1, 64, packing), (n, k)))
        again = pack(codes, spec)
        assert again.dtype == cdt and torch.equal(again.view(idt), ref)
        with pytest.raises(FormatError, match=f"expected dtype {cdt}"):
            unpack_codes(ref, spec, (n, k))
        with pytest.raises(FormatError, match=f"needs {name}"):
            unpack_codes(W_q[:, :-2], spec, (n, k))


def test_stored_as_spec_json_and_checks():
    """``stored_as`` is absent from JSON when unset (older specs byte-identical), round trips when set, and is
    validated: an unknown dtype, a stored tensor of another dtype, a last dim with no container view."""
    import json

    from reference.formats import FormatError, dumps, unpack_codes

    base = synth.HQQ_SPEC
    assert "stored_as" not in base.to_dict() and dumps(base) == dumps(PackSpec.from_dict(base.to_dict()))
    sp = base.replace(stored_as="bfloat16")
    d = json.loads(json.dumps(sp.to_dict()))
    assert d["stored_as"] == "bfloat16" and PackSpec.from_dict(d) == sp
    with pytest.raises(FormatError, match="unknown stored_as 'int8'"):
        base.replace(stored_as="int8")
    f32 = base.replace(group_view=None, stored_as="float32")  # uint8 [16, 6]: 6 bytes a row, no float32 view
    with pytest.raises(FormatError, match=r"uint8 \[16, 6\] container tensor has no float32 view"):
        f32.packed_shape((64, 6))
    with pytest.raises(FormatError, match=r"tensor: stored as torch.float16, .* expected dtype torch.float32"):
        unpack_codes(torch.zeros(16, 2, dtype=torch.float16), f32, (64, 8))
    with pytest.raises(FormatError, match=r"no uint8 view|needs float32 \(16, 2\)"):
        unpack_codes(torch.zeros(16, 3, dtype=torch.float32), f32, (64, 8))
    codes = torch.randint(0, 4, (64, 8))
    packed = pack(codes, f32.replace(codes=(0, 1, 2, 3)))
    assert packed.dtype == torch.float32 and tuple(packed.shape) == (16, 2)
    assert torch.equal(unpack_codes(packed, f32, (64, 8)), codes)


def test_hqq_spec_json_roundtrip_and_old_json_unchanged():
    import json

    from reference.formats import ScaleSpec
    from reference.spec import LinearEntry

    e = LinearEntry(weight_key="m.W_q", shape=(8, 128), pack=synth.HQQ_SPEC,
                    scale=ScaleSpec("m.scale", "group", group_size=64), zero=ScaleSpec("m.zero", "group", group_size=64))
    d = json.loads(json.dumps(e.to_dict()))
    assert d["pack"]["group_view"] == 64 and d["zero"]["key"] == "m.zero"
    assert LinearEntry.from_dict(d) == e
    od = LinearEntry(weight_key="w", shape=(4, 8), pack=synth.SEED).to_dict()
    assert "zero" not in od and "group_view" not in od["pack"]


# HQQ axis=0 grouping and meta tensors (hqq/core/quantize.py Quantizer.quantize: W.reshape([group_size, -1]) for
# axis=0; HQQLinear.state_dict + hqq/core/utils.py encode_safetensor_type for the meta)

#: HQQLinear.state_dict_keys() (hqq/core/quantize.py), transcribed
HQQ_STATE_DICT_KEYS = {"W_q", "nbits", "group_size", "shape", "scale", "zero", "axis", "packing", "unpack_view_dtype",
                       "view_as_float", "quant_scale", "quant_zero", "compute_dtype", "bias", "offload_meta",
                       "encoded_state_dict", "stores_quant_config", "channel_wise", "optimize", "round_zero"}


def hqq_decode_safetensor_type(data: torch.Tensor, data_type: str):
    """hqq/core/utils.py decode_safetensor_type, transcribed (torch.dtype: the string, not eval'd)."""
    if data_type == "size":
        return list(torch.Size(data))
    if data_type == "bool":
        return bool(data.item())
    if data_type == "int":
        return int(data.item())
    if data_type == "float":
        return float(data.item())
    return "".join([chr(i) for i in data])  # str, torch.dtype


def test_hqq_axis0_matches_bitpack_and_dequantize(logical, tmp_path):
    """Axis=0: W_q = HQQ's pack_2bit_u8 of the [64, N*K/64] view of q = w + z (one zero z in {1, 2} per column),
    scale / zero [1, N*K/64]; HQQ's dequantize of what synth wrote = the ground truth (element f of the flattened
    W takes scale and zero f mod N*K/64); reference.formats packs the same bytes, and the spec decode agrees bit
    for bit."""
    from reference.formats import ScaleSpec
    from reference.spec import LinearEntry, decode_linear

    lg = logical.with_group_jitter(64, seed=5, axis=0)
    ck, truth = _write("hqq-axis0", lg, tmp_path)
    for mod in (Q, D):
        t = lg.ternary[mod]
        n, k = t.shape
        cols = n * k // 64
        W_q, s, z = ck.get(f"{mod}.W_q"), ck.get(f"{mod}.scale"), ck.get(f"{mod}.zero")
        assert W_q.dtype == torch.uint8 and W_q.shape == (16, cols)
        assert s.shape == z.shape == (1, cols) and s.dtype == z.dtype == torch.float16
        assert set(torch.unique(z).tolist()) == {1.0, 2.0}
        q = t.reshape(64, -1).to(torch.int64) + z.to(torch.int64)  # axis=0 view: one column per group
        assert torch.equal(W_q, hqq_pack_2bit_u8(q))
        assert torch.equal(W_q, pack(q.reshape(n, k), synth.HQQ_AXIS0_SPEC))
        eff = hqq_dequantize(W_q, s, z, (n, k))
        assert torch.equal(eff, truth.effective(mod))
        torch.testing.assert_close(eff, lg.effective(mod), rtol=1e-3, atol=0)
        flat = torch.arange(n * k)
        assert torch.equal(truth.mult[mod].reshape(-1), s.float().reshape(-1)[flat % cols])
        e = LinearEntry(weight_key=f"{mod}.W_q", shape=(n, k), pack=synth.HQQ_AXIS0_SPEC,
                        scale=ScaleSpec(f"{mod}.scale", "group", group_size=64, group_axis=0),
                        zero=ScaleSpec(f"{mod}.zero", "group", group_size=64, group_axis=0))
        d = decode_linear(ck, e, mod)
        assert torch.equal(d.values, t) and torch.equal(d.effective(), eff)


def test_hqq_meta_tensors_are_what_hqqlinear_writes(logical, tmp_path):
    """hqq-meta / hqq-axis0-meta: next to W_q / scale / zero exactly HQQLinear.state_dict_keys() (no bias here),
    each non-tensor value encoded as encode_safetensor_type does (bool -> uint8 0-d, int -> int32 0-d, str and
    torch.dtype -> uint8 character codes, torch.Size -> int64) and decoding to the quantizer's settings."""
    types = {"nbits": "int", "group_size": "int", "shape": "size", "axis": "int", "packing": "str",
             "unpack_view_dtype": "str", "view_as_float": "bool", "quant_scale": "bool", "quant_zero": "bool",
             "compute_dtype": "str", "offload_meta": "bool", "encoded_state_dict": "bool",
             "stores_quant_config": "bool", "channel_wise": "bool", "optimize": "bool", "round_zero": "bool"}
    dtypes = {"int": torch.int32, "bool": torch.uint8, "str": torch.uint8, "size": torch.int64}
    for fmt, axis in (("hqq-meta", 1), ("hqq-axis0-meta", 0)):
        ck, truth = _write(fmt, logical, tmp_path)
        n, k = logical.ternary[D].shape
        keys = {key[len(D) + 1:] for key in ck.keys() if key.startswith(D + ".")}
        assert keys == HQQ_STATE_DICT_KEYS - {"bias"} and set(types) == keys - {"W_q", "scale", "zero"}
        got = {}
        for leaf, ty in types.items():
            v = ck.get(f"{D}.{leaf}")
            assert v.dtype == dtypes[ty] and v.dim() == (0 if ty in ("int", "bool") else 1), leaf
            got[leaf] = hqq_decode_safetensor_type(v, ty)
        assert got == {"nbits": 2, "group_size": 64, "shape": [n, k], "axis": axis, "packing": "2bit_u8",
                       "unpack_view_dtype": "torch.uint8", "view_as_float": False, "quant_scale": False,
                       "quant_zero": False, "compute_dtype": "torch.float16", "offload_meta": False,
                       "encoded_state_dict": True, "stores_quant_config": True, "channel_wise": True,
                       "optimize": True, "round_zero": False}
        plain, _ = _write("hqq" if axis == 1 else "hqq-axis0", logical, tmp_path)
        for key in ("W_q", "scale", "zero"):  # the meta tensors are added next to the same packed data
            assert torch.equal(ck.get(f"{D}.{key}"), plain.get(f"{D}.{key}"))


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 12), k=hst.integers(1, 40), g=hst.sampled_from([1, 2, 4, 8, 16, 64]),
       order=hst.sampled_from(["lsb", "msb"]), lanes=hst.sampled_from(["interleaved", "blocked"]),
       seed=hst.integers(0, 2**16))
def test_group_view_axis0_roundtrip(n, k, g, order, lanes, seed):
    """Any packing of the [G, N*K/G] group view (group_axis 0; G | N*K, padding when G % 4); HQQ's own layout
    (blocked, msb) is exactly pack_2bit_u8 of that view when 4 | G."""
    if (n * k) % g:
        k = k * g  # make G divide N*K
    spec = PackSpec(bits=2, container="uint8", pack_axis=0, lanes=lanes, bit_order=order, codes=(0, 1, 2, 3),
                    group_view=g, group_axis=0)
    w = torch.randint(0, 4, (n, k), generator=torch.Generator().manual_seed(seed))
    p = pack(w, spec)
    assert p.shape == spec.packed_shape((n, k)) == (-(-g // 4), n * k // g)
    assert torch.equal(unpack(p, spec, (n, k)).to(torch.int64), w)
    if (lanes, order) == ("blocked", "msb") and g % 4 == 0:
        assert torch.equal(p, hqq_pack_2bit_u8(w.reshape(g, -1)))


def test_hqq_axis0_spec_json_roundtrip_and_checks():
    """group_axis 0 round-trips through JSON on the pack and on the scale / zero; group_axis 1 stays absent (old
    JSON unchanged); inconsistent uses are FormatErrors; an axis-0 scale of the wrong shape is named."""
    import json

    from reference.formats import FormatError, ScaleSpec, expand_scale
    from reference.spec import LinearEntry

    e = LinearEntry(weight_key="m.W_q", shape=(8, 128), pack=synth.HQQ_AXIS0_SPEC,
                    scale=ScaleSpec("m.scale", "group", group_size=64, group_axis=0),
                    zero=ScaleSpec("m.zero", "group", group_size=64, group_axis=0))
    d = json.loads(json.dumps(e.to_dict()))
    assert d["pack"]["group_axis"] == d["scale"]["group_axis"] == d["zero"]["group_axis"] == 0
    assert LinearEntry.from_dict(d) == e
    one = LinearEntry(weight_key="m.W_q", shape=(8, 128), pack=synth.HQQ_SPEC,
                      scale=ScaleSpec("m.scale", "group", group_size=64)).to_dict()
    assert "group_axis" not in one["pack"] and "group_axis" not in one["scale"]
    assert LinearEntry.from_dict(one).pack.group_axis == 1
    with pytest.raises(FormatError, match="group_axis"):
        PackSpec(group_axis=0)  # no group view
    with pytest.raises(FormatError, match="group_axis"):
        PackSpec(group_view=64, group_axis=2)
    with pytest.raises(FormatError, match="group_axis"):
        ScaleSpec("s", "channel", group_axis=0)
    with pytest.raises(FormatError, match="group_axis"):
        ScaleSpec("s", "group", group_size=64, group_axis=0, transposed=True)
    with pytest.raises(FormatError, match="N\\*K % 48 == 0"):
        synth.HQQ_AXIS0_SPEC.replace(group_view=48).view_shape((8, 128))
    sc = ScaleSpec("m.scale", "group", group_size=64, group_axis=0)
    with pytest.raises(FormatError, match=r"'m.scale' must have shape \(1, 16\)"):
        expand_scale(torch.ones(16, 1), sc, (8, 128))
    s = torch.arange(16, dtype=torch.float32).reshape(1, 16)
    assert torch.equal(expand_scale(s, sc, (8, 128)).reshape(-1), torch.arange(8 * 128).remainder(16).float())


def test_compressed_tensors_mixed_widths_match_library(logical, tmp_path):
    """compressed-tensors-mixed: int-4 for layer 0 and every down_proj, int-2 elsewhere, each tensor
    packed as the library packs its own width; one config_group per width."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    ck, truth = _write("compressed-tensors-mixed", logical, tmp_path)
    widths = {}
    for mod, t in logical.ternary.items():
        bits = 4 if mod.startswith("model.layers.0.") or mod.endswith("down_proj") else 2
        got = ck.get(f"{mod}.weight_packed")
        assert got.shape == (t.shape[0], t.shape[1] * bits // 32), mod
        assert torch.equal(got, pack_to_int32(t.to(torch.int8), bits)), mod
        assert torch.equal(unpack_from_int32(got, bits, t.shape), t), mod
        widths[mod] = bits
    assert set(widths.values()) == {2, 4}
    cfg = __import__("json").loads((tmp_path / "compressed-tensors-mixed" / "config.json").read_text())
    groups = cfg["quantization_config"]["config_groups"]
    assert sorted(g["weights"]["num_bits"] for g in groups.values()) == [2, 4]
    wide = next(g for g in groups.values() if g["weights"]["num_bits"] == 4)["targets"]
    assert sorted(wide) == sorted(m for m, b in widths.items() if b == 4)


# ---------------------------------------------------------------------------------------
# act-order group indices (AutoGPTQ / GPTQModel desc_act, compressed-tensors actorder 'group')


def _actorder_jitter(logical, group_size=64):
    """The logical model with per-group multipliers over synth's act-order groups (so that a group index applied
    wrongly shows in the effective weights)."""
    gi = {m: synth.actorder_g_idx(p, group_size) for m, p in synth.actorder_perms(logical).items()}
    return logical.with_group_jitter(group_size, seed=3, g_idx=gi), gi


def test_gptq_actorder_matches_autogptq_v1(logical, tmp_path):
    """AutoGPTQ v1 symmetric ternary with desc_act true: qweight exactly as without act-order (QuantLinear.pack
    packs q = w + 2 in input order; the order only decides the groups), qzeros z - 1 = 1, g_idx = fasterquant's
    ``[i // 64 for i in range(K)][invperm]`` (transcribed here from synth's activation order), each group's fp16
    scale the multiplier of its members, and AutoGPTQ's dequantization scales[g_idx] * (q - zeros[g_idx]) = the
    ground truth = the jittered logical weights within fp16; q / k / v share one order (one Hessian)."""
    import json

    lg, gis = _actorder_jitter(logical)
    ck, truth = _write("gptq-actorder", lg, tmp_path)
    qc = json.loads((tmp_path / "gptq-actorder" / "config.json").read_text())["quantization_config"]
    assert (qc["desc_act"], qc["static_groups"], qc["sym"]) == (True, False, True)
    perms = synth.actorder_perms(logical)
    assert torch.equal(perms["model.layers.1.self_attn.q_proj"], perms[Q])
    assert not torch.equal(perms["model.layers.1.self_attn.o_proj"], perms[Q])
    for mod in (Q, D):
        t = lg.ternary[mod]
        n, k = t.shape
        invperm = torch.argsort(perms[mod])
        want_gi = torch.tensor([i // 64 for i in range(k)], dtype=torch.int32)[invperm]
        gi = ck.get(f"{mod}.g_idx")
        assert gi.dtype == torch.int32 and torch.equal(gi, want_gi) and torch.equal(gi, gis[mod])
        assert torch.equal(as_u32(ck.get(f"{mod}.qweight")), gptq_v1_pack(t))
        assert bool((as_u32(ck.get(f"{mod}.qzeros")) == 0x55555555).all())
        sc = ck.get(f"{mod}.scales")
        assert sc.shape == (k // 64, n) and sc.dtype == torch.float16
        for g in range(k // 64):  # every member of group g carries the multiplier stored for g
            members = (gi == g).nonzero().flatten()
            assert members.numel() == 64
            assert torch.equal(lg.mult[mod][:, members].half(), sc[g].unsqueeze(1).expand(n, 64))
        g = gi.long()
        w = (sc.float()[g] * ((t.t().to(torch.int64) + 2) - 2)).t()  # scales[g_idx] * (q - zeros[g_idx])
        assert torch.equal(w, truth.effective(mod))
        torch.testing.assert_close(w, lg.effective(mod), rtol=1e-3, atol=0)
        consecutive = sc.float().t().repeat_interleave(64, dim=1) * t.float()
        assert not torch.equal(consecutive, w)  # the index matters: consecutive groups give another weight


def test_compressed_tensors_int_actorder_matches_library(logical, tmp_path):
    """compressed-tensors symmetric int4 with actorder 'group': compressed-tensors 0.17's PackedQuantization
    Compressor, given the ground-truth weight, the stored fp16 scales and weight_g_idx, stores exactly these tensors
    (weight_packed through _process_group's sort by g_idx, weight_scale, weight_shape, weight_g_idx; no zero point),
    its decompressor returns the truth, and the config parses with actorder 'group'."""
    import json

    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    lg = _actorder_jitter(logical.requantized(4, seed=1))[0]
    ck, truth = _write("compressed-tensors-int4-actorder", lg, tmp_path)
    qc = QuantizationConfig.model_validate(
        json.loads((tmp_path / "compressed-tensors-int4-actorder" / "config.json").read_text())["quantization_config"])
    assert qc.config_groups["group_0"].weights.actorder == "group"
    scheme = _ct_scheme(4, "group", 64, "group", symmetric=True)
    for mod in (Q, D):
        k = lg.ternary[mod].shape[1]
        stored = {key.rsplit(".", 1)[1]: ck.get(key) for key in ck.keys() if key.startswith(mod + ".")}
        assert set(stored) == {"weight_packed", "weight_scale", "weight_shape", "weight_g_idx"}
        gi = stored["weight_g_idx"]
        assert gi.dtype == torch.int32 and torch.equal(gi.sort().values.long(), torch.arange(k) // 64)
        want = PackedQuantizationCompressor.compress(
            {"weight": truth.effective(mod), "weight_scale": stored["weight_scale"], "weight_g_idx": gi}, scheme)
        assert set(want) == set(stored)
        for key, v in want.items():
            assert stored[key].dtype == v.dtype and torch.equal(stored[key], v), (mod, key)
        exact = dict(stored, weight_scale=stored["weight_scale"].float())
        assert torch.equal(PackedQuantizationCompressor.decompress(exact, scheme)["weight"], truth.effective(mod))


@settings(max_examples=30, deadline=None)
@given(n=hst.integers(1, 40), groups=hst.integers(2, 5), gs=hst.sampled_from([8, 32, 64]), bits=hst.integers(2, 8),
       fmt=hst.sampled_from(["pack-quantized", "naive-quantized"]),
       dtype=hst.sampled_from([torch.bfloat16, torch.float16, torch.float32]), seed=hst.integers(0, 2 ** 31))
def test_ct_actorder_packer_and_decode_any_shape(n, groups, gs, bits, fmt, dtype, seed):
    """For any shape, width, weight dtype and activation order: synth's act-order bookkeeping (the observer and
    quantizer on W[:, perm], q unpermuted, g_idx = actorder_g_idx) stores what compressed-tensors' compressor stores
    given llm-compressor's qparams and g_idx, and the reference's decode (formats.group_index, the zero points
    and scales expanded through the index, as reference.spec.finish_linear) = its decompressor with fp32 scales;
    the same tensors decoded without the index (consecutive groups) differ."""
    from reference.formats import (ScaleSpec, ct_pack_spec, ct_zero_pack_spec, expand_scale, group_index,
                                   twos_complement_table)
    from reference.spec import subtract_zero

    k = groups * gs
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) + torch.rand(n, 1, generator=g)).to(dtype)
    perm = torch.randperm(k, generator=g)
    comp, scheme, want = _ct_library(w, bits, "group", gs, fmt, "group", perm)
    q, scale, zp = synth.ct_asym_quantize(w[:, perm], bits, "group", gs)
    q = q[:, torch.argsort(perm)]
    gi = synth.actorder_g_idx(perm, gs)
    assert torch.equal(gi, want["weight_g_idx"]) and torch.equal(scale, want["weight_scale"])
    packed = fmt == "pack-quantized"
    wspec = ct_pack_spec(bits) if packed else PackSpec(bits=8, container="int8", pack_axis=1,
                                                         codes=twos_complement_table(8))
    assert torch.equal(pack(q, wspec) if packed else q, want["weight_packed" if packed else "weight"])
    zpack = ct_zero_pack_spec(bits) if packed else None
    assert torch.equal(pack(zp, zpack) if packed else zp, want["weight_zero_point"])
    idx = group_index(want["weight_g_idx"], k, gs)
    zspec = ScaleSpec("weight_zero_point", "group", group_size=gs)
    codes = unpack(want["weight_packed"], wspec, (n, k)) if packed else want["weight"]
    vals = subtract_zero(codes, want["weight_zero_point"], zspec, (n, k), "t", zpack=zpack, g_idx=idx)
    mult = expand_scale(want["weight_scale"], dataclasses.replace(zspec, key="weight_scale"), (n, k), g_idx=idx)
    exact = dict(want, weight_scale=want["weight_scale"].float())
    dec = comp.decompress(exact, scheme)["weight"]
    assert torch.equal(vals.float() * mult, dec)
    plain = subtract_zero(codes, want["weight_zero_point"], zspec, (n, k), "t", zpack=zpack).float() * \
        expand_scale(want["weight_scale"], dataclasses.replace(zspec, key="weight_scale"), (n, k))
    if not torch.equal(idx, torch.arange(k) // gs) and bool((scale.float().amax(1) != scale.float().amin(1)).any()):
        assert not torch.equal(plain, dec)


@settings(max_examples=60, deadline=None)
@given(k=hst.integers(1, 300), gs=hst.sampled_from([1, 3, 8, 32, 64, 128]), static=hst.booleans(),
       seed=hst.integers(0, 2 ** 31))
def test_group_index_accepts_fasterquant_and_names_bad_ones(k, gs, static, seed):
    """formats.group_index accepts every index AutoGPTQ's fasterquant can write (any K, also K % group_size != 0,
    any order, static groups or not) and refuses, naming the tensor and the input / group, a float dtype, a wrong
    length, a value outside [0, G), -1 (compressed-tensors' unset index) and groups of the wrong size."""
    from reference.formats import FormatError, group_index

    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(k, generator=g)
    gi = synth.actorder_g_idx(perm, gs, static_groups=static)
    got = group_index(gi, k, gs, key="m.g_idx", name="f.safetensors")
    assert got.dtype == torch.int64 and torch.equal(got, gi.long())
    assert torch.equal(got, torch.arange(k) // gs) or not static
    G = -(-k // gs)
    with pytest.raises(FormatError, match=r"f\.safetensors: group index 'm\.g_idx' is float32, expected an integer"):
        group_index(gi.float(), k, gs, key="m.g_idx", name="f.safetensors")
    with pytest.raises(FormatError, match=rf"'m\.g_idx' has shape \[{k + 1}\], expected \[{k}\]"):
        group_index(torch.cat([gi, gi[:1]]), k, gs, key="m.g_idx", name="f.safetensors")
    i = int(torch.randint(k, (1,), generator=g))
    for v, hint in ((G, ""), (-1, "compressed-tensors' unset index")):
        bad = gi.clone()
        bad[i] = v
        with pytest.raises(FormatError, match=rf"'m\.g_idx': input {i} is in group {v}, outside \[0, {G}\).*{hint}"):
            group_index(bad, k, gs, key="m.g_idx", name="f.safetensors")
    if G > 1:  # move one input to another group: both groups have the wrong size
        bad = gi.clone()
        bad[i] = (int(gi[i]) + 1) % G
        lo = min(int(gi[i]), int(bad[i]))
        with pytest.raises(FormatError, match=rf"'m\.g_idx': group {lo} holds \d+ inputs, expected \d+: .*permutation"):
            group_index(bad, k, gs, key="m.g_idx", name="f.safetensors")


def test_act_order_spec_json_roundtrip_and_checks():
    """LinearEntry.g_idx round-trips through JSON and is absent when None (old specs unchanged); it needs a
    granularity 'group' scale of consecutive-input groups and zero points of the same groups; expand_scale refuses
    an index for another granularity."""
    import json

    from reference.formats import FormatError, ScaleSpec, expand_scale
    from reference.spec import LinearEntry

    sc = ScaleSpec("m.scales", "group", group_size=64, transposed=True)
    e = LinearEntry(weight_key="m.qweight", shape=(8, 128), pack=synth.GPTQ_SPEC, scale=sc,
                    zero=dataclasses.replace(sc, key="m.qzeros"), g_idx="m.g_idx")
    d = json.loads(json.dumps(e.to_dict()))
    assert d["g_idx"] == "m.g_idx" and LinearEntry.from_dict(d) == e
    plain = dataclasses.replace(e, g_idx=None).to_dict()
    assert "g_idx" not in plain and LinearEntry.from_dict(plain).g_idx is None
    for bad in (dict(scale=ScaleSpec("m.scales", "channel")), dict(scale=None),
                dict(zero=ScaleSpec("m.qzeros", "group", group_size=32, transposed=True))):
        with pytest.raises(FormatError, match=r"'m\.qweight': act-order group index 'm\.g_idx' needs a granularity "
                                              r"'group' scale"):
            dataclasses.replace(e, **bad)
    with pytest.raises(FormatError, match=r"'m\.s': an act-order group index applies to a granularity 'group'"):
        expand_scale(torch.ones(8), ScaleSpec("m.s", "channel"), (8, 128), g_idx=torch.zeros(128, dtype=torch.long))
    s = torch.arange(16, dtype=torch.float32).reshape(8, 2)
    gi = torch.arange(128) % 2
    assert torch.equal(expand_scale(s, ScaleSpec("m.s", "group", group_size=64), (8, 128), g_idx=gi),
                       s[:, gi])
