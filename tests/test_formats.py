"""Format specs: pack/unpack are exact inverses for every combination (hypothesis), and the
built-in conventions match their public definitions bit for bit."""
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from reference.formats import (HF_BITNET, SEED, FormatError, PackSpec, ScaleSpec, expand_scale, pack,
                               pack_codes, unpack, unpack_codes)

CONTAINERS = ["uint8", "int8", "int16", "int32", "int64"]


@st.composite
def specs(draw):
    container = draw(st.sampled_from(CONTAINERS))
    bits = draw(st.sampled_from([b for b in (1, 2, 4, 8) if {"uint8": 8, "int8": 8, "int16": 16, "int32": 32,
                                                               "int64": 64}[container] % b == 0]))
    v = {"uint8": 8, "int8": 8, "int16": 16, "int32": 32, "int64": 64}[container] // bits
    lanes = draw(st.sampled_from(["interleaved", "blocked", "block_interleaved"]))
    block = v * draw(st.integers(1, 8)) if lanes == "block_interleaved" else None
    n = 1 << bits
    perm = draw(st.permutations(list(range(-(n // 2), n - n // 2))))
    codes = list(perm)
    if n >= 4 and draw(st.booleans()):
        codes[draw(st.integers(0, n - 1))] = None  # an unused code
    pad = next(i for i, c in enumerate(codes) if c is not None)
    # a slot order inside each container (AutoAWQ's AWQ_ORDER is one) in a quarter of the examples
    order = tuple(draw(st.permutations(list(range(v))))) if v > 1 and draw(st.integers(0, 3)) == 0 else None
    return PackSpec(bits=bits, container=container, pack_axis=draw(st.sampled_from([0, 1])), lanes=lanes,
                    block=block, bit_order=draw(st.sampled_from(["lsb", "msb"])), codes=tuple(codes),
                    transposed=draw(st.booleans()), pad_code=pad, order=order)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), n=st.integers(1, 37), k=st.integers(1, 70), seed=st.integers(0, 2 ** 31))
def test_roundtrip_every_combination(spec, n, k, seed):
    vals = torch.tensor([c for c in spec.codes if c is not None])
    g = torch.Generator().manual_seed(seed)
    w = vals[torch.randint(len(vals), (n, k), generator=g)]
    p = pack(w, spec)
    assert tuple(p.shape) == spec.packed_shape((n, k))
    assert p.dtype == spec.torch_dtype
    assert torch.equal(unpack(p, spec, (n, k)).long(), w)
    # the spec survives JSON
    assert PackSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@settings(max_examples=100, deadline=None)
@given(spec=specs(), n=st.integers(1, 20), k=st.integers(1, 40), seed=st.integers(0, 2 ** 31))
def test_pack_of_unpack_is_identity_on_valid_packed(spec, n, k, seed):
    """Every bit pattern with pad slots holding pad_code survives unpack -> pack."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(1 << spec.bits, (n, k), generator=g)
    p = pack_codes(codes, spec)
    assert torch.equal(unpack_codes(p, spec, (n, k)), codes)
    assert torch.equal(pack_codes(unpack_codes(p, spec, (n, k)), spec), p)


@settings(max_examples=150, deadline=None)
@given(spec=specs(), n=st.integers(1, 20), k=st.integers(1, 40), seed=st.integers(0, 2 ** 31))
def test_byte_lut_unpack_matches_codes_path(spec, n, k, seed):
    """unpack of 8-bit containers goes through a byte -> slots table (reference.formats._unpack_bytes):
    on arbitrary bytes (pad slots and unused codes included) it must equal the code table applied to
    unpack_codes, and strict mode must fail exactly when a logical element holds an unused code."""
    g = torch.Generator().manual_seed(seed)
    want = spec.packed_shape((n, k))
    p = torch.randint(0, 256, want, generator=g, dtype=torch.int16).to(torch.uint8).view(spec.torch_dtype) \
        if spec.torch_dtype in (torch.uint8, torch.int8) else pack_codes(torch.randint(1 << spec.bits, (n, k),
                                                                                        generator=g), spec)
    codes = unpack_codes(p, spec, (n, k))
    table = torch.tensor([0 if c is None else c for c in spec.codes])
    assert torch.equal(unpack(p, spec, (n, k), strict=False).long(), table[codes])
    holds_unused = any(spec.codes[c] is None for c in codes.unique().tolist())
    if holds_unused:
        with pytest.raises(FormatError, match="declared unused"):
            unpack(p, spec, (n, k))
    else:
        assert torch.equal(unpack(p, spec, (n, k)).long(), table[codes])


@pytest.mark.parametrize("n,k", [(8, 5), (10, 7), (1, 1), (129, 3)])
def test_hf_bitnet_matches_transformers_pack_weights(n, k):
    from transformers.integrations.bitnet import pack_weights, unpack_weights

    w = torch.randint(-1, 2, (n, k), generator=torch.Generator().manual_seed(n * k))
    ours = pack(w, HF_BITNET)
    theirs = pack_weights(w.clone())
    assert torch.equal(ours, theirs)
    if n % 4 == 0:  # transformers' unpack only restores multiples of 4 rows
        assert torch.equal(unpack_weights(theirs, torch.float32)[:n].long(), w)


def test_seed_layout_is_the_seeds_unpacker():
    """The seed's unpack_ternary_packed: element 4j+i at bits 2i of byte j; 0->0, 1->+1, 2->-1."""
    packed = torch.tensor([[0b00_10_01_00, 0b01_01_10_10]], dtype=torch.uint8)
    assert unpack(packed, SEED, (1, 8)).tolist() == [[0, 1, -1, 0, -1, -1, 1, 1]]


def test_i2s_block_interleave():
    """bitnet.cpp I2_S: byte j of a 128-block holds j, 32+j, 64+j, 96+j at bits 7-6, 5-4, 3-2, 1-0."""
    spec = PackSpec(bits=2, container="uint8", pack_axis=1, lanes="block_interleaved", block=128,
                    bit_order="msb", codes=(-1, 0, 1, None))
    w = torch.zeros(1, 128, dtype=torch.long)
    w[0, 0], w[0, 32], w[0, 64], w[0, 96] = 1, -1, 1, 0  # codes 2, 0, 2, 1
    p = pack(w, spec)
    assert p[0, 0].item() == (2 << 6) | (0 << 4) | (2 << 2) | 1


def test_slot_order_places_each_element():
    """PackSpec.order: slot i of a container holds the lanes' element order[i] - AutoAWQ's gemm packing
    (awq/modules/linear/gemm.py WQLinear_GEMM.from_linear: qweight |= intweight[:, col * 8 + order_map[i]] << 4i,
    order_map = AWQ_ORDER); msb counts the slots from the top; the identity order is the default and is not
    written to JSON; anything but a permutation of the slots is refused."""
    from reference.formats import AWQ_ORDER

    spec = PackSpec(bits=4, container="int32", pack_axis=1, codes=tuple(range(16)), order=AWQ_ORDER)
    w = torch.arange(8).reshape(1, 8)
    word = int(pack(w, spec)[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 15 for i in range(8)] == list(AWQ_ORDER)
    word = int(pack(w, spec.replace(bit_order="msb"))[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * (7 - i))) & 15 for i in range(8)] == list(AWQ_ORDER)
    assert torch.equal(pack(w, spec.replace(order=tuple(range(8)))), pack(w, spec.replace(order=None)))
    assert "order" not in spec.replace(order=None).to_dict() and spec.to_dict()["order"] == list(AWQ_ORDER)
    for bad in ((0, 1, 2), (0, 0, 1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 7, 8)):
        with pytest.raises(FormatError, match="permutation"):
            spec.replace(order=bad)


def test_unused_code_is_reported_with_position():
    p = torch.tensor([[0b11]], dtype=torch.uint8)  # code 3 = unused in HF-BitNet
    with pytest.raises(FormatError, match=r"code 3 at logical index \(0, 0\).*unused"):
        unpack(p, HF_BITNET.replace(pack_axis=1, lanes="interleaved"), (1, 4), name="x")


def test_wrong_packed_shape_names_expectation():
    with pytest.raises(FormatError, match=r"needs \(2, 3\)"):
        unpack(torch.zeros(3, 3, dtype=torch.uint8), HF_BITNET, (8, 3))


def test_bad_specs_rejected():
    with pytest.raises(FormatError):
        PackSpec(bits=3, container="uint8")
    with pytest.raises(FormatError):
        PackSpec(codes=(0, 1))
    with pytest.raises(FormatError):
        PackSpec(lanes="block_interleaved", block=6)
    with pytest.raises(FormatError):
        PackSpec.from_dict({**HF_BITNET.to_dict(), "surprise": 1})


def test_scales():
    s = torch.tensor([2.0])
    assert expand_scale(s, ScaleSpec("s", "tensor", "divide"), (4, 4)).item() == 0.5
    ch = expand_scale(torch.arange(1.0, 5.0), ScaleSpec("s", "channel"), (4, 6), rows=(1, 3))
    assert ch.flatten().tolist() == [2.0, 3.0]
    grp = expand_scale(torch.tensor([[1.0, 2.0]]), ScaleSpec("s", "group", group_size=4), (1, 6))
    assert grp.tolist() == [[1, 1, 1, 1, 2, 2]]
    with pytest.raises(FormatError, match="NaN"):
        expand_scale(torch.tensor([float("nan")]), ScaleSpec("s"), (1, 1))
    with pytest.raises(FormatError, match="zero"):
        expand_scale(torch.tensor([0.0]), ScaleSpec("s", op="divide"), (1, 1))
    with pytest.raises(FormatError, match=r"too small to divide by .*1 / scale = inf"):  # subnormal: 1/s overflows
        expand_scale(torch.tensor([1e-40]), ScaleSpec("s", op="divide"), (1, 1))
    assert expand_scale(torch.tensor([1e-40]), ScaleSpec("s"), (1, 1)).item() > 0  # multiplied: fine
    with pytest.raises(FormatError, match="must have 4 elements"):
        expand_scale(torch.ones(3), ScaleSpec("s", "channel"), (4, 1))


@settings(max_examples=150, deadline=None)
@given(spec=specs(), n=st.integers(1, 30), k=st.integers(1, 60), seed=st.integers(0, 2 ** 31))
def test_bf16_targets_lut_decoder_agrees(spec, n, k, seed):
    """The bf16 target's independent byte-LUT decoder == reference.formats.unpack (uint8 only)."""
    from parity.targets.reference import lut_decode

    spec = spec.replace(container="uint8", bits=2, codes=(-1, 0, 1, None), pad_code=0, order=None,
                        block=(spec.block and 4 * max(1, spec.block // spec.values_per_container)))
    w = torch.randint(-1, 2, (n, k), generator=torch.Generator().manual_seed(seed))
    p = pack(w, spec)
    assert torch.equal(lut_decode(p, spec, (n, k)).long(), w)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), k=st.integers(1, 700), seed=st.integers(0, 2 ** 31))
def test_bf16_targets_lut_decoder_reads_tq2_0_records(n, k, seed):
    """The independent byte-LUT decoder skips the in-block scale bytes of llama.cpp TQ2_0 records
    (their fp16 d are random bytes here, as in a real file) and agrees with unpack."""
    from parity.targets.reference import lut_decode
    from reference.formats import TQ2_0, tq2_0_scale, write_record_scales

    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (n, k), generator=g)
    d = torch.rand(n, -(-k // 256), generator=g) * 100
    p = write_record_scales(pack(w, TQ2_0), d, tq2_0_scale("w"), (n, k))
    assert torch.equal(lut_decode(p, TQ2_0, (n, k)).long(), w)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), groups=st.integers(1, 6), g=st.sampled_from([4, 8, 16, 64]), axis=st.sampled_from([0, 1]),
       seed=st.integers(0, 2 ** 31))
def test_bf16_targets_lut_decoder_reads_group_views(n, groups, g, axis, seed):
    """HQQ's group views (W packed as its [N*K/G, G] (axis=1) or [G, N*K/G] (axis=0) row-major view, blocked
    lanes along axis 0, msb first): the independent byte-LUT decoder agrees with unpack."""
    from parity.targets.reference import lut_decode

    spec = PackSpec(bits=2, container="uint8", pack_axis=0, lanes="blocked", bit_order="msb",
                    codes=(-1, 0, 1, None), pad_code=0, group_view=g, group_axis=axis)
    k = groups * g
    w = torch.randint(-1, 2, (n, k), generator=torch.Generator().manual_seed(seed))
    p = pack(w, spec)
    assert torch.equal(unpack(p, spec, (n, k)).long(), w)
    assert torch.equal(lut_decode(p, spec, (n, k)).long(), w)


@pytest.mark.parametrize("base", [HF_BITNET, HF_BITNET.replace(container="int32"), HF_BITNET.replace(transposed=True),
                                  PackSpec(pack_axis=1, lanes="blocked", container="int64", transposed=True)])
def test_segments_pack_each_part_on_its_own(base):
    """PackSpec.segments: every segment of the pack axis packed on its own, the packed pieces concatenated."""
    g = torch.Generator().manual_seed(0)
    segs = (13, 7, 8)
    w = torch.randint(-1, 2, (28, 10) if base.pack_axis == 0 else (10, 28), generator=g)
    spec = base.replace(segments=segs)
    packed = pack(w, spec)
    dim = (1 - base.pack_axis) if base.transposed else base.pack_axis
    assert torch.equal(packed, torch.cat([pack(p, base) for p in w.split(list(segs), dim=base.pack_axis)], dim=dim))
    assert tuple(packed.shape) == spec.packed_shape(tuple(w.shape))
    assert torch.equal(unpack(packed, spec, tuple(w.shape)).long(), w)
    assert PackSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert "segments" not in base.to_dict()
    with pytest.raises(FormatError, match="segments"):
        spec.packed_shape((w.shape[0] + 1, w.shape[1]) if base.pack_axis == 0 else (w.shape[0], w.shape[1] + 1))


def test_scale_spec_padded_groups():
    """ScaleSpec.padded_groups (AutoAWQ gemv's zero-padded scales / qzeros): only on a group scale of consecutive
    inputs, omitted from JSON when unset; expand_scale takes exactly [N, P] (or [P, N] transposed), drops zero
    padding and names a nonzero pad or too few columns."""
    import torch

    from reference.formats import FormatError, ScaleSpec, expand_scale

    for bad in (dict(granularity="channel", padded_groups=8), dict(granularity="group", group_size=4, padded_groups=0),
                dict(granularity="group", group_size=4, group_axis=0, padded_groups=8)):
        with pytest.raises(FormatError, match="padded_groups must be a positive integer"):
            ScaleSpec("s", **bad)
    assert "padded_groups" not in ScaleSpec("s", "group", group_size=4).to_dict()
    sp = ScaleSpec("s", "group", group_size=4, padded_groups=8)
    s = torch.zeros(2, 8)
    s[:, :3] = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = expand_scale(s, sp, (2, 12))
    assert torch.equal(m, s[:, :3].repeat_interleave(4, dim=1))
    assert torch.equal(expand_scale(s.t().contiguous(), ScaleSpec("s", "group", group_size=4, padded_groups=8,
                                                                  transposed=True), (2, 12)), m)
    s[1, 5] = 2.0
    with pytest.raises(FormatError, match=r"'s' holds 2.0 at output 1, padding column 5 \(1 nonzero padding values\); "
                                          r"columns 3..7 past the 3 groups of K = 12 must be 0"):
        expand_scale(s, sp, (2, 12))
    with pytest.raises(FormatError, match=r"must have shape \(2, 8\) \(3 groups of 4 inputs padded to 8\), has \(2, 3\)"):
        expand_scale(s[:, :3], sp, (2, 12))
    with pytest.raises(FormatError, match=r"padded_groups 8 < the 9 groups"):
        expand_scale(torch.ones(2, 8), sp, (2, 36))
