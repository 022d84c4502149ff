"""PackSpec codec 'bitstream' (AutoGPTQ's 3-bit packing: codes as one little-endian bit stream along the pack
axis, straddling containers): round trips on awkward shapes, the bit-field layout where the bits tile the
container, and AutoGPTQ's own loops (transcribed from auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py
QuantLinear.pack) bit for bit."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from reference.formats import FormatError, PackSpec, pack, pack_codes, unpack, unpack_codes


def stream(bits: int, container: str = "int32", axis: int = 0, transposed: bool = False) -> PackSpec:
    return PackSpec(bits=bits, container=container, pack_axis=axis, lanes="interleaved", bit_order="lsb",
                    codes=tuple(range(1 << bits)), transposed=transposed, codec="bitstream")


def autogptq_pack_rows(intweight: np.ndarray, bits: int) -> np.ndarray:
    """QuantLinear.pack's qweight loop (rows = K, packed into K / 32 * bits int32 rows)."""
    intweight = intweight.astype(np.uint32)
    qweight = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = 0
    row = 0
    while row < qweight.shape[0]:
        if bits in [2, 4, 8]:
            for j in range(i, i + (32 // bits)):
                qweight[row] |= intweight[j] << (bits * (j - i))
            i += 32 // bits
            row += 1
        elif bits == 3:
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i))
            i += 10
            qweight[row] |= intweight[i] << 30
            row += 1
            qweight[row] |= (intweight[i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 1)
            i += 10
            qweight[row] |= intweight[i] << 31
            row += 1
            qweight[row] |= (intweight[i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 2)
            i += 10
            row += 1
    return qweight.astype(np.int32)


def autogptq_pack_zeros(zeros: np.ndarray, bits: int) -> np.ndarray:
    """QuantLinear.pack's qzeros loop (columns = N, packed into N / 32 * bits int32 columns; zeros - 1 stored)."""
    zeros = zeros.astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * bits), dtype=np.uint32)
    i = 0
    col = 0
    while col < qzeros.shape[1]:
        if bits in [2, 4, 8]:
            for j in range(i, i + (32 // bits)):
                qzeros[:, col] |= zeros[:, j] << (bits * (j - i))
            i += 32 // bits
            col += 1
        elif bits == 3:
            for j in range(i, i + 10):
                qzeros[:, col] |= zeros[:, j] << (3 * (j - i))
            i += 10
            qzeros[:, col] |= zeros[:, i] << 30
            col += 1
            qzeros[:, col] |= (zeros[:, i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                qzeros[:, col] |= zeros[:, j] << (3 * (j - i) + 1)
            i += 10
            qzeros[:, col] |= zeros[:, i] << 31
            col += 1
            qzeros[:, col] |= (zeros[:, i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                qzeros[:, col] |= zeros[:, j] << (3 * (j - i) + 2)
            i += 10
            col += 1
    return qzeros.astype(np.int32)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("k,n", [(32, 1), (64, 7), (256, 40)])
def test_autogptq_qweight_bit_for_bit(bits, k, n):
    g = torch.Generator().manual_seed(bits * 1000 + k + n)
    q = torch.randint(0, 1 << bits, (n, k), generator=g)  # logical W[N, K] codes
    spec = stream(bits, axis=1, transposed=True)  # qweight [K / 32 * bits, N]: packed along K, stored transposed
    want = torch.from_numpy(autogptq_pack_rows(q.t().numpy(), bits))
    got = pack_codes(q, spec)
    assert got.shape == (k // 32 * bits, n) and torch.equal(got, want)
    assert torch.equal(unpack_codes(want, spec, (n, k)), q)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("groups,n", [(1, 32), (3, 64), (5, 96)])
def test_autogptq_qzeros_bit_for_bit(bits, groups, n):
    g = torch.Generator().manual_seed(bits * 7 + groups + n)
    z = torch.randint(0, 1 << bits, (groups, n), generator=g)  # stored z - 1 codes, [G, N]
    spec = stream(bits, axis=1)
    want = torch.from_numpy(autogptq_pack_zeros(z.numpy(), bits))
    assert torch.equal(pack_codes(z, spec), want)
    assert torch.equal(unpack_codes(want, spec, (groups, n)), z)


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 16), container=st.sampled_from(["uint8", "int8", "int16", "int32"]),
       axis=st.integers(0, 1), transposed=st.booleans(), n=st.integers(1, 9), k=st.integers(1, 75),
       seed=st.integers(0, 2 ** 16))
def test_roundtrip_any_width(bits, container, axis, transposed, n, k, seed):
    if bits > 8 and container in ("uint8", "int8"):
        bits = 8
    spec = stream(bits, container, axis, transposed)
    codes = torch.randint(0, 1 << bits, (n, k), generator=torch.Generator().manual_seed(seed))
    packed = pack_codes(codes, spec)
    assert tuple(packed.shape) == spec.packed_shape((n, k)) and packed.dtype == spec.torch_dtype
    assert torch.equal(unpack_codes(packed, spec, (n, k)), codes)
    assert (n, k) in spec.logical_shapes(tuple(packed.shape))
    if bits <= 15:  # unpack's values are int8 / int16: 16-bit codes above 32767 do not fit them
        values = unpack(packed, spec, (n, k))  # identity code table: the values are the codes
        assert torch.equal(values.long(), codes) and torch.equal(pack(values, spec), packed)


@pytest.mark.parametrize("bits,container", [(1, "uint8"), (2, "uint8"), (4, "int32"), (8, "int32"), (16, "int32"),
                                            (2, "int16")])
def test_bits_that_tile_the_container_are_the_interleaved_lsb_layout(bits, container):
    codes = torch.randint(0, 1 << bits, (5, 70), generator=torch.Generator().manual_seed(bits))
    plain = PackSpec(bits=bits, container=container, pack_axis=1, lanes="interleaved", bit_order="lsb",
                     codes=tuple(range(1 << bits)))
    assert torch.equal(pack_codes(codes, stream(bits, container, 1)), pack_codes(codes, plain))


def test_padding_and_sizes():
    spec = stream(3)
    assert spec.period == (32, 3) and spec.packed_len(1) == 3 and spec.packed_len(33) == 6
    assert stream(5, "uint8").period == (8, 5) and stream(2, "uint8").period == (4, 1)
    packed = pack_codes(torch.full((33, 1), 7), spec)  # rows past 33 padded with code 0
    assert torch.equal(unpack_codes(packed, spec.replace(), (64, 1))[33:], torch.zeros(31, 1, dtype=torch.int64))


def test_json_round_trip_and_errors():
    spec = stream(3, axis=1, transposed=True)
    assert PackSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    for bad in ({"bit_order": "msb"}, {"lanes": "blocked"}, {"container": "int64"}, {"fields": 10},
                {"order": tuple(range(10))}):
        with pytest.raises(FormatError, match="codec 'bitstream'"):
            PackSpec(**{**spec.to_dict(), **bad})
    with pytest.raises(FormatError, match=r"needs \(3, 4\) .*32 codes per 3 containers"):
        unpack_codes(torch.zeros(6, 4, dtype=torch.int32), spec, (4, 32))
