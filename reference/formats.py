"""Packed low-bit tensor formats: one frozen, JSON-serialisable description + pack/unpack.

A *logical* weight is a 2-D integer matrix ``W[N, K]`` (N = out_features, K = in_features)
whose entries are the values of a small code table (ternary: -1, 0, +1).  A *packed* tensor
stores ``values_per_container = container_bits // bits`` codes per container element along
one axis (``pack_axis``) of the logical matrix.

Where a logical element lands is fixed by three things:

* ``lanes`` — which elements share a container.  Along the pack axis of length L, cut into
  blocks of ``B`` elements (``C = B // V`` containers per block, V = values per container):
  element ``j`` of a block goes to container ``j % C`` of that block, slot ``j // C``.

  - ``interleaved``: ``B = V``  -> V *consecutive* elements per container (the seed's layout:
    element k in slot k % 4 of byte k // 4).
  - ``blocked``: ``B = ceil(L / V) * V`` (one block = the whole axis) -> transformers'
    ``pack_weights``: with ``P = ceil(L/4)``, element r in byte ``r % P``, slot ``r // P``.
  - ``block_interleaved``: an explicit ``block`` (bitnet.cpp I2_S and llama.cpp TQ2_0 use
    128: byte j of a 128-block holds elements j, 32+j, 64+j, 96+j).

* ``bit_order`` — ``lsb``: slot s occupies bits ``[s*bits, (s+1)*bits)``; ``msb``: slot 0 sits
  in the most significant bits (slot s at ``(V-1-s)*bits``).

* ``fields`` — V when the codes do not tile the container: V fields of ``bits`` at the low end of
  each container, the bits above them unused (zero on pack, ignored on unpack).  mobiusml/hqq
  ``BitPack.pack_3bit_32``: ten 3-bit fields in an int32, bits 30-31 unused (with ``msb`` slot 0
  sits at bit 27).  ``None`` (the default, omitted from JSON) = ``container_bits // bits``.

* ``order`` — a permutation of the V slots of every container: slot ``i`` holds the lanes' element
  ``order[i]`` of that container (the lanes above say which V elements share it and ``order[i]`` is their
  rank).  AutoAWQ (``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.from_linear``: ``qweight[:, col] |=
  intweight[:, col * 8 + order_map[i]] << (i * 4)`` with ``order_map = [0, 2, 4, 6, 1, 3, 5, 7]``, the
  ``AWQ_ORDER`` of ``awq/utils/packing_utils.py``) packs eight consecutive outputs per int32 that way.
  ``None`` (the default, omitted from JSON) = the identity (slot i holds element i).

* ``codes`` — code -> value (``None`` = unused code; decoding one is an error).

* ``record`` — ``(E, R)``: along the pack axis every ``E`` logical elements are stored as one
  record of ``R`` bytes whose first ``E / V`` bytes hold the codes (the lanes above apply inside
  the record) and whose remaining bytes carry side data, e.g. the in-block fp16 scale of
  llama.cpp TQ2_0 (``block_tq2_0``: 256 values = ``qs[64]`` + fp16 ``d`` = 66 bytes; see
  ``ScaleSpec`` granularity ``block``).  ``pack`` zero-fills the side bytes
  (``write_record_scales`` fills in the scales); ``unpack`` skips them.  uint8, pack axis 1,
  not transposed; ``None`` (the default, omitted from JSON) = no records.

* ``codec`` — ``"tq1_0"``: the record's code bytes hold base-3 digits, not bit fields (llama.cpp
  TQ1_0, ``block_tq1_0``: 256 values = ``qs[48]`` (5 per byte) + ``qh[4]`` (4 per byte) + fp16 ``d``
  = 54 bytes; see ``TQ1_0``).  Needs ``record`` (256, 54) and 2-bit codes (code
  = trit = w + 1, 0..2: llama.cpp's table is (-1, 0, 1, None)); lanes and bit order do not apply.  ``None``
  (the default, omitted from JSON).
  ``"bitstream"``: the codes along the pack axis are one little-endian bit stream, code j at bits
  ``[j * bits, (j + 1) * bits)`` of the containers read in order (container c holds stream bits
  ``[c * cbits, (c + 1) * cbits)``), so a code may straddle two containers.  AutoGPTQ's 3-bit
  ``QuantLinear.pack`` (``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`` and its siblings: 32
  codes in three int32 - ten at bits 0-29, the eleventh across bits 30-31 of the first and bit 0 of
  the second, ...; qzeros the same along N).  The axis is padded with ``pad_code`` to whole periods
  of ``lcm(bits, cbits) / bits`` codes (AutoGPTQ's K / 32 * 3 rows).  Containers of <= 32 bits,
  ``lanes`` interleaved, ``bit_order`` lsb, no fields / order / record / group view / segments; for
  bits dividing the container it is the interleaved lsb layout itself.
  ``"base3"``: plain base-3 packing, five trits per byte (3^5 = 243 <= 256): a uint8 container holds the codes
  (trits 0..2, 2-bit code table with code 3 unused) of its V = 5 lane elements as the digits of one number,
  ``byte = sum_s t_s * 3^s`` where ``bit_order`` is the *digit* order: ``lsb``, slot s is digit s (slot 0 the
  least significant, as bit fields are); ``msb``, slot 0 the most significant digit (``t_0 * 81 + t_1 * 27 +
  ...``).  Lanes (interleaved: five consecutive elements a byte), pack axis, transposition, padding (``pad_code``
  trits past the axis, cropped on unpack), group view, segments and ``stored_as`` apply as for bit fields; no
  fields / order / record.  A byte >= 243 has no digits: unpacking one is a FormatError naming its position.
  The densest byte packing of trits (1.6 bits a trit); llama.cpp's TQ1_0 keeps the same five digits (msb first)
  in its ``qs`` bytes, scaled by 256/243 and inside 54-byte records: that is codec ``tq1_0``.
  ``"float_codes"``: the stored tensor is a float tensor (float16 / bfloat16 / float32) whose elements *are* the
  codes, one per element as exact small integers (ternary codes ``t = w + 1`` stored as 0.0 / 1.0 / 2.0 beside a
  scale): read as its ``container`` integer tensor (``float_codes_container``: finite, integral and within the
  code range, else a FormatError naming the first bad element), then decoded as one value per ``bits = 8``-bit
  container (interleaved, lsb, no fields / order / record / group view / segments / stored_as).
  ``"sign_masks"``: the weight is stored as *two* tensors of this one layout, a +1 mask (the linear's ``weight_key``)
  and a -1 mask (``LinearEntry.neg_key``), W = pos - neg; the PackSpec says how each mask holds its flags.  ``bits``
  8: one flag per element, a bool / uint8 / int8 [N, K] tensor (or its transpose) holding 0 / 1, code table
  ``SIGN_FLAGS_BYTE`` (every other byte unused: a FormatError names the tensor, position and value).  ``bits`` 1:
  eight flags per byte of a uint8 / int8 container, eight consecutive elements along the pack axis (interleaved
  lanes), ``bit_order`` lsb = element 0 in bit 0 (numpy ``packbits(..., bitorder="little")``, shift-and-or packers),
  msb = element 0 in bit 7 (``np.packbits``' default), the last byte of an axis that is no multiple of 8 padded
  with ``pad_code`` (flag 0) and cropped; code table ``SIGN_FLAGS_BIT``.  Pack axis, transposition and segments
  apply as for bit fields; no fields / order / record / group view / stored_as.  One tensor is half a weight:
  ``pack_codes`` / ``unpack_codes`` read and write one mask's flag codes, ``pack_sign_masks`` /
  ``unpack_sign_masks`` the pair (``pack`` / ``unpack`` refuse it); an element set in both masks is a FormatError
  naming both tensors and its position.

* ``group_view`` — ``G``: the packed matrix is not ``W[N, K]`` but a row-major view of it in
  which each group of G elements is one row or one column; everything above applies to the view.
  ``None`` (the default, omitted from JSON) = the matrix itself.  ``group_axis`` says which view
  (mobiusml/hqq ``hqq/core/quantize.py``, ``Quantizer.quantize``: ``W.reshape([-1, group_size])
  if axis == 1 else W.reshape([group_size, -1])``, then ``BitPack.pack_2bit_u8`` of that view):

  - ``1`` (the default, omitted from JSON): ``W.reshape(N * K / G, G)``, one row per group of G
    consecutive inputs (HQQ ``axis=1``).  Needs ``K % G == 0``.
  - ``0``: ``W.reshape(G, N * K / G)``, one group per *column*: group j holds the elements of the
    row-major flattened W at j, j + N*K/G, j + 2*N*K/G, ... (HQQ ``axis=0``).  Needs
    ``N * K % G == 0``.

* ``segments`` — ``(L1, L2, ...)``: the pack axis is cut into consecutive segments of these
  lengths, each packed *on its own* (its own lanes, blocks and padding) and the packed segments
  concatenated along the stored pack axis: a fused qkv / gate_up tensor whose parts were packed
  separately (transformers' ``pack_weights`` per projection) and then concatenated.  The lengths
  sum to the axis length.  ``None`` (the default, omitted from JSON) = one segment.

* ``stored_as`` — the float dtype (``float16`` / ``bfloat16`` / ``float32``) whose bytes hold the packed
  container tensor: the stored tensor is the container tensor's ``.view(dtype)`` (its last dim scaled by the
  byte ratio: uint8 [a, b] as float16 is [a, b/2], int32 [a, b] as float16 [a, 2b]), read back with
  ``.view(container)`` before unpacking, bit for bit.  mobiusml/hqq ``view_as_float=True``
  (``Quantizer.quantize``: ``W_q = W_q.view(compute_dtype)``; ``dequantize``: ``W_q.view(unpack_view_dtype)``).
  ``None`` (the default, omitted from JSON) = the container dtype itself.

``transposed`` means the stored tensor is the transpose of the packed matrix (GPTQ stores
``qweight`` as ``[K/16, N]``).  Padding (L not a multiple of the block) is filled with
``pad_code`` and cropped on unpack, so ``unpack(pack(W)) == W`` for any shape.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch

CONTAINERS: dict[str, tuple[torch.dtype, int]] = {
    "uint8": (torch.uint8, 8),
    "int8": (torch.int8, 8),
    "int16": (torch.int16, 16),
    "int32": (torch.int32, 32),
    "int64": (torch.int64, 64),
}

Lanes = Literal["interleaved", "blocked", "block_interleaved"]


class FormatError(ValueError):
    """A tensor does not match the format it is declared to have."""


#: PackSpec.stored_as: float dtypes whose bytes may carry a container tensor -> (torch dtype, bytes)
STORED_AS: dict[str, tuple[torch.dtype, int]] = {"float16": (torch.float16, 2), "bfloat16": (torch.bfloat16, 2),
                                                  "float32": (torch.float32, 4)}

#: in-block (record) scale dtypes: name -> (torch dtype, bytes)
RECORD_SCALE_DTYPES: dict[str, tuple[torch.dtype, int]] = {"float16": (torch.float16, 2)}


@dataclass(frozen=True)
class ScaleSpec:
    """How a scale tensor turns the integer matrix into effective weights.

    granularity: ``tensor`` (one value; with ``index`` set, element ``index`` of a vector of
    per-sub-matrix scales), ``channel`` (one per output row, shape [N] or [N, 1]),
    ``group`` (``[N, ceil(K / group_size)]``, groups of ``group_size`` consecutive inputs),
    ``block`` (one scale per record of the packed weight, stored *inside* it: ``key`` is the
    weight's own key, ``group_size`` the record's elements, ``record_bytes`` its size,
    ``byte_offset`` where the ``dtype`` (``float16``) scale starts; llama.cpp TQ2_0:
    256 / 66 / 64).
    op: ``multiply`` (W = T * s) or ``divide`` (W = T / s, transformers' ``bitlinear``).
    group_axis (granularity ``group`` only): ``1`` (the default, omitted from JSON) = the groups
    above; ``0`` = HQQ ``axis=0`` groups (mobiusml/hqq ``Quantizer.quantize``: W viewed as
    ``W.reshape(group_size, -1)``, one scale / zero per column, stored ``[1, N*K/group_size]``):
    element ``f`` of the row-major flattened W takes value ``f mod (N*K/group_size)``, i.e.
    ``s.reshape(1, M).expand(group_size, M).reshape(N, K)`` with ``M = N*K/group_size``.
    padded_groups (granularity ``group``, group_axis 1 only): the stored tensor holds this many group columns
    ([N, P], or [P, N] transposed), ``P >= ceil(K / group_size)``; the columns past ceil(K / group_size) are
    padding that must be zero (AutoAWQ ``version: "gemv"``: ``awq/modules/linear/gemv.py``
    ``calculate_zeros_width`` * 8 columns, zero-filled by ``WQLinear_GEMV.from_linear``; ``unpad_groups``).
    ``None`` (the default, omitted from JSON) = no padding.
    """

    key: str
    granularity: Literal["tensor", "channel", "group"] = "tensor"
    op: Literal["multiply", "divide"] = "multiply"
    group_size: Optional[int] = None
    index: Optional[int] = None
    transposed: bool = False  # stored as [groups, N] (GPTQ ``scales``)
    # granularity "block" only (None otherwise, and then omitted from JSON):
    record_bytes: Optional[int] = None
    byte_offset: Optional[int] = None
    dtype: Optional[str] = None
    group_axis: int = 1  # granularity "group": 1 = groups of consecutive inputs, 0 = HQQ axis=0 (see above)
    padded_groups: Optional[int] = None  # stored group columns incl. zero padding (AutoAWQ gemv); see above

    def __post_init__(self):
        if self.padded_groups is not None and (isinstance(self.padded_groups, bool)
                                               or not isinstance(self.padded_groups, int) or self.padded_groups < 1
                                               or self.granularity != "group" or self.group_axis != 1):
            raise FormatError(f"scale {self.key!r}: padded_groups must be a positive integer on a granularity "
                              f"'group' scale of consecutive inputs (group_axis 1), got {self.padded_groups!r} with "
                              f"granularity {self.granularity!r}")
        if self.group_axis not in (0, 1) or (self.group_axis == 0 and (
                self.granularity != "group" or self.transposed or self.index is not None)):
            raise FormatError(f"scale {self.key!r}: group_axis must be 1, or 0 on an untransposed, unindexed "
                              f"granularity 'group' scale (HQQ axis=0), got {self.group_axis!r} with granularity "
                              f"{self.granularity!r}")
        if self.granularity not in ("tensor", "channel", "group", "block"):
            raise FormatError(f"scale {self.key!r}: unknown granularity {self.granularity!r}")
        if self.op not in ("multiply", "divide"):
            raise FormatError(f"scale {self.key!r}: op must be 'multiply' or 'divide', got {self.op!r}")
        if self.granularity in ("group", "block") and (self.group_size is None or self.group_size < 1):
            raise FormatError(f"scale {self.key!r}: granularity {self.granularity!r} needs group_size >= 1")
        rec = (self.record_bytes, self.byte_offset, self.dtype)
        if self.granularity == "block":
            if self.dtype not in RECORD_SCALE_DTYPES:
                raise FormatError(f"scale {self.key!r}: in-block scale dtype must be one of "
                                  f"{sorted(RECORD_SCALE_DTYPES)}, got {self.dtype!r}")
            width = RECORD_SCALE_DTYPES[self.dtype][1]
            if self.record_bytes is None or self.byte_offset is None or self.byte_offset < 0 \
                    or self.byte_offset + width > self.record_bytes:
                raise FormatError(f"scale {self.key!r}: an in-block {self.dtype} scale needs record_bytes and a "
                                  f"byte_offset with byte_offset + {width} <= record_bytes, got {rec[:2]}")
            if self.transposed or self.index is not None:
                raise FormatError(f"scale {self.key!r}: an in-block scale is neither transposed nor indexed")
        elif any(v is not None for v in rec):
            raise FormatError(f"scale {self.key!r}: record_bytes / byte_offset / dtype belong to granularity "
                              f"'block', not {self.granularity!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON form; the 'block' fields are omitted when unset (older specs stay byte-identical)."""
        d = dataclasses.asdict(self)
        for f in ("record_bytes", "byte_offset", "dtype"):
            if d[f] is None:
                del d[f]
        if self.group_axis == 1:
            del d["group_axis"]  # absent: every scale but HQQ axis=0's unchanged
        if self.padded_groups is None:
            del d["padded_groups"]  # absent: every scale but AutoAWQ gemv's unchanged
        return d


@dataclass(frozen=True)
class PackSpec:
    """Layout of one packed integer tensor (see module docstring)."""

    bits: int = 2
    container: str = "uint8"
    pack_axis: int = 1
    lanes: Lanes = "interleaved"
    block: Optional[int] = None
    bit_order: Literal["lsb", "msb"] = "lsb"
    codes: tuple = (-1, 0, 1, None)
    transposed: bool = False
    pad_code: int = 0
    record: Optional[tuple] = None  # (elements, bytes) per record; see module docstring
    group_view: Optional[int] = None  # G: pack a group view of W (HQQ); see module docstring
    group_axis: int = 1  # 1: view W.reshape(N*K/G, G) (HQQ axis=1); 0: W.reshape(G, N*K/G) (HQQ axis=0)
    segments: Optional[tuple] = None  # lengths along the pack axis, each packed on its own; see module docstring
    fields: Optional[int] = None  # codes per container when they do not tile it (HQQ 3bit_32: 10); see docstring
    # "tq1_0", "bitstream" (AutoGPTQ 3-bit), "base3", "float_codes", "sign_masks" (a +1 / -1 mask pair); see docstring
    codec: Optional[str] = None
    order: Optional[tuple] = None  # slot i holds the container's element order[i] (AutoAWQ); see docstring
    stored_as: Optional[str] = None  # float dtype whose bytes hold the containers (HQQ view_as_float); see docstring

    def __post_init__(self):
        if self.container not in CONTAINERS:
            raise FormatError(f"unknown container {self.container!r}; known: {sorted(CONTAINERS)}")
        if self.stored_as is not None and self.stored_as not in STORED_AS:
            raise FormatError(f"unknown stored_as {self.stored_as!r}; known: {sorted(STORED_AS)}")
        cbits = CONTAINERS[self.container][1]
        if self.codec == "bitstream":
            if (not 1 <= self.bits <= 16 or cbits > 32 or self.lanes != "interleaved" or self.bit_order != "lsb"
                    or self.fields is not None or self.order is not None or self.record is not None
                    or self.group_view is not None or self.segments is not None):
                raise FormatError(f"codec 'bitstream' takes 1-16-bit codes in a container of <= 32 bits with "
                                  f"interleaved lanes, lsb bit order and no fields / order / record / group_view / "
                                  f"segments; got {self.bits}-bit {self.container}, lanes {self.lanes}, bit_order "
                                  f"{self.bit_order}, fields {self.fields}, order {self.order}, record "
                                  f"{self.record}, group_view {self.group_view}, segments {self.segments}")
        elif self.codec == "base3":
            if (self.bits != 2 or self.container != "uint8" or self.fields is not None or self.order is not None
                    or self.record is not None or self.pad_code > 2):
                raise FormatError(f"codec 'base3' packs five trits (2-bit code table, codes 0..2) per uint8 with no "
                                  f"fields / order / record and a pad trit 0..2; got {self.bits}-bit {self.container}, "
                                  f"fields {self.fields}, order {self.order}, record {self.record}, pad_code "
                                  f"{self.pad_code}")
        elif self.codec == "float_codes":
            if (self.bits != cbits or self.container != "uint8" or self.lanes != "interleaved"
                    or self.bit_order != "lsb" or self.fields is not None or self.order is not None
                    or self.record is not None or self.group_view is not None or self.segments is not None
                    or self.stored_as is not None):
                raise FormatError(f"codec 'float_codes' reads one code per element of a float tensor into an 8-bit "
                                  f"container (bits 8, uint8, interleaved, lsb, no fields / order / record / "
                                  f"group_view / segments / stored_as); got {self.bits}-bit {self.container}, lanes "
                                  f"{self.lanes}, bit_order {self.bit_order}, fields {self.fields}, order "
                                  f"{self.order}, record {self.record}, group_view {self.group_view}, segments "
                                  f"{self.segments}, stored_as {self.stored_as}")
        elif self.codec == "sign_masks":
            flags = {v for v in self.codes if v is not None}
            if (self.bits not in (1, 8) or self.container not in ("uint8", "int8") or self.lanes != "interleaved"
                    or (self.bits == 8 and self.bit_order != "lsb") or self.fields is not None
                    or self.order is not None or self.record is not None or self.group_view is not None
                    or self.stored_as is not None or flags != {0, 1} or len(self.codes) != 1 << self.bits
                    or not 0 <= self.pad_code < len(self.codes) or self.codes[self.pad_code] != 0):
                raise FormatError(f"codec 'sign_masks' stores each mask of a +1 / -1 pair as one flag per element "
                                  f"(bits 8, lsb) or eight per byte (bits 1), in a uint8 / int8 container with "
                                  f"interleaved lanes, a flag table of 0 / 1 (code table SIGN_FLAGS_BYTE / "
                                  f"SIGN_FLAGS_BIT), padding flag 0 and no fields / order / record / group_view / "
                                  f"stored_as; got {self.bits}-bit {self.container}, lanes {self.lanes}, bit_order "
                                  f"{self.bit_order}, codes {list(self.codes)[:4]}"
                                  f"{' ...' if len(self.codes) > 4 else ''}, pad_code {self.pad_code}, fields "
                                  f"{self.fields}, order {self.order}, record {self.record}, group_view "
                                  f"{self.group_view}, stored_as {self.stored_as}")
        elif self.fields is not None:
            if self.bits < 1 or not 1 <= self.fields * self.bits <= cbits:
                raise FormatError(f"{self.fields} fields of {self.bits} bits do not fit a {self.container} container")
        elif self.bits < 1 or cbits % self.bits:
            raise FormatError(f"{self.bits}-bit codes do not tile a {self.container} container (give 'fields' for "
                              f"containers with unused bits, e.g. 10 for 3-bit codes in int32)")
        if len(self.codes) != 1 << self.bits:
            raise FormatError(f"code table has {len(self.codes)} entries, {self.bits} bits need {1 << self.bits}")
        # JSON round trips give lists; keep the dataclass hashable.
        object.__setattr__(self, "codes", tuple(self.codes))
        if self.pack_axis not in (0, 1):
            raise FormatError(f"pack_axis must be 0 or 1, got {self.pack_axis}")
        if self.lanes not in ("interleaved", "blocked", "block_interleaved"):
            raise FormatError(f"unknown lanes {self.lanes!r}")
        if self.lanes == "block_interleaved":
            if not self.block or self.block % self.values_per_container:
                raise FormatError(
                    f"block_interleaved needs a block that is a multiple of {self.values_per_container}, got {self.block}")
        if self.bit_order not in ("lsb", "msb"):
            raise FormatError(f"bit_order must be 'lsb' or 'msb', got {self.bit_order!r}")
        if not 0 <= self.pad_code < len(self.codes):
            raise FormatError(f"pad_code {self.pad_code} is not a code")
        if self.group_view is not None and (self.group_view < 1 or self.record is not None):
            raise FormatError(f"group_view must be >= 1 and exclusive of record, got {self.group_view}")
        if self.group_axis not in (0, 1) or (self.group_axis == 0 and self.group_view is None):
            raise FormatError(f"group_axis must be 1, or 0 with a group_view (HQQ axis=0), got {self.group_axis!r} "
                              f"with group_view {self.group_view!r}")
        if self.segments is not None:
            object.__setattr__(self, "segments", tuple(int(x) for x in self.segments))
            if not self.segments or min(self.segments) < 1 or self.record is not None or self.group_view is not None:
                raise FormatError(f"segments must be lengths >= 1 and exclusive of record / group_view, got "
                                  f"{self.segments}")
        if self.order is not None:
            object.__setattr__(self, "order", tuple(int(x) for x in self.order))
            if sorted(self.order) != list(range(self.values_per_container)) or self.codec is not None:
                raise FormatError(f"order {list(self.order)} must be a permutation of the {self.values_per_container} "
                                  f"slots of a {self.container} container ({self.bits}-bit codes), without a codec")
        if self.codec is not None and self.codec not in CODECS:
            raise FormatError(f"unknown codec {self.codec!r}; known: {sorted(CODECS)}")
        if self.codec == "tq1_0":
            if (tuple(self.record or ()) != TQ1_0_RECORD or self.container != "uint8" or self.pack_axis != 1
                    or self.transposed or self.bits != 2):
                raise FormatError(f"codec {self.codec!r} is llama.cpp TQ1_0: record {TQ1_0_RECORD}, 2-bit codes "
                                  f"(trits) in uint8 along axis 1, not transposed; got record {self.record}, "
                                  f"{self.bits}-bit {self.container}, pack_axis {self.pack_axis}, transposed "
                                  f"{self.transposed}")
            object.__setattr__(self, "record", tuple(int(x) for x in self.record))
        elif self.record is not None:
            if len(self.record) != 2:
                raise FormatError(f"record must be (elements, bytes), got {self.record!r}")
            object.__setattr__(self, "record", tuple(int(x) for x in self.record))
            e, r = self.record
            if self.container != "uint8" or self.pack_axis != 1 or self.transposed:
                raise FormatError(f"record {self.record}: records are uint8 rows packed along axis 1, not "
                                  f"transposed (got {self.container}, pack_axis={self.pack_axis}, "
                                  f"transposed={self.transposed})")
            if self.lanes == "blocked":
                raise FormatError(f"record {self.record}: 'blocked' lanes span the whole axis, not a record")
            if e < 1 or e % self.block_len(e) or e // self.values_per_container >= r:
                raise FormatError(
                    f"record {self.record}: {e} elements must be a multiple of the lane block "
                    f"({self.block_len(e)}) and their {e // max(1, self.values_per_container)} code bytes must "
                    f"leave room in a {r}-byte record")

    # ---- derived sizes -------------------------------------------------------------
    @property
    def values_per_container(self) -> int:
        """Codes per container (a bit stream: whole codes per container, rounded down; see ``period``)."""
        if self.codec == "base3":
            return BASE3_DIGITS
        return self.fields if self.fields is not None else CONTAINERS[self.container][1] // self.bits

    @property
    def period(self) -> tuple[int, int]:
        """(codes, containers) of the shortest whole stretch of a bit stream (codec 'bitstream': lcm(bits,
        cbits) bits; 3-bit in int32: (32, 3)); (values_per_container, 1) for the bit-field layouts."""
        if self.codec != "bitstream":
            return self.values_per_container, 1
        import math

        cbits = CONTAINERS[self.container][1]
        bits = math.lcm(self.bits, cbits)
        return bits // self.bits, bits // cbits

    @property
    def torch_dtype(self) -> torch.dtype:
        return CONTAINERS[self.container][0]

    def block_len(self, axis_len: int) -> int:
        v = self.values_per_container
        if self.lanes == "interleaved":
            return v
        if self.lanes == "blocked":
            return max(1, -(-axis_len // v)) * v
        return int(self.block)

    @property
    def code_bytes(self) -> int:
        """Code containers per record (records only)."""
        if self.codec == "tq1_0":
            return TQ1_0_CODE_BYTES
        return self.record[0] // self.values_per_container

    def packed_len(self, axis_len: int) -> int:
        if self.segments is not None:
            if sum(self.segments) != axis_len:
                raise FormatError(f"segments {list(self.segments)} sum to {sum(self.segments)}, the pack axis has "
                                  f"{axis_len} elements")
            inner = self.replace(segments=None)
            return sum(inner.packed_len(n) for n in self.segments)
        if self.record is not None:
            return -(-axis_len // self.record[0]) * self.record[1]
        if self.codec == "bitstream":
            codes, conts = self.period
            return -(-axis_len // codes) * conts
        b = self.block_len(axis_len)
        return -(-axis_len // b) * (b // self.values_per_container)

    def view_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """The matrix that is packed: ``shape`` itself, its [N*K/G, G] group view (``group_axis`` 1)
        or its [G, N*K/G] group view (``group_axis`` 0)."""
        n, k = shape
        g = self.group_view
        if g is None:
            return (n, k)
        if self.group_axis == 0:
            if (n * k) % g:
                raise FormatError(f"group_view {g} with group_axis 0 needs N*K % {g} == 0, N*K = {n}*{k} = {n * k}")
            return (g, n * k // g)
        if k % g:
            raise FormatError(f"group_view {g} needs K % {g} == 0, K = {k}")
        return (n * k // g, g)

    def ungrouped(self) -> "PackSpec":
        """This layout applied to the matrix itself (what packs / unpacks the group view)."""
        return self.replace(group_view=None, group_axis=1)

    def packed_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """The stored tensor's shape for a logical ``shape`` (with ``stored_as``: its float view's)."""
        n, k = self.view_shape(shape)
        s = [n, k]
        s[self.pack_axis] = self.packed_len(s[self.pack_axis])
        out = (s[1], s[0]) if self.transposed else (s[0], s[1])
        if self.stored_as is not None:
            cb, fb = CONTAINERS[self.container][1] // 8, STORED_AS[self.stored_as][1]
            if (out[1] * cb) % fb:
                raise FormatError(f"a {self.container} {list(out)} container tensor has no {self.stored_as} view: "
                                  f"its last dim of {out[1]} * {cb} bytes is not a multiple of {fb}")
            out = (out[0], out[1] * cb // fb)
        return out

    def container_shape(self, stored_shape: tuple) -> tuple:
        """The container tensor's shape behind a stored tensor of ``stored_shape`` (``stored_as``: the last dim
        scaled by the byte ratio); the shape itself without ``stored_as``."""
        if self.stored_as is None or not len(stored_shape):
            return tuple(stored_shape)
        cb, fb = CONTAINERS[self.container][1] // 8, STORED_AS[self.stored_as][1]
        last = stored_shape[-1] * fb
        if last % cb:
            raise FormatError(f"a {self.stored_as} {list(stored_shape)} tensor has no {self.container} view: its last "
                              f"dim of {stored_shape[-1]} * {fb} bytes is not a multiple of {cb}")
        return (*stored_shape[:-1], last // cb)

    def logical_shapes(self, stored_shape: tuple[int, int]) -> list[tuple[int, int]]:
        """Logical shapes whose packed shape is ``stored_shape`` (for the inspector)."""
        if self.stored_as is not None:
            try:
                stored_shape = self.container_shape(tuple(stored_shape))
            except FormatError:
                return []
            return self.replace(stored_as=None).logical_shapes(stored_shape)
        a, b = stored_shape
        if self.transposed:
            a, b = b, a
        v = self.values_per_container
        out = []
        packed = (a, b)[self.pack_axis]
        if self.segments is not None:
            lengths = [sum(self.segments)] if self.packed_len(sum(self.segments)) == packed else []
        elif self.record is not None:
            if packed % self.record[1]:
                return []
            top = packed // self.record[1] * self.record[0]
            lengths = range(max(1, top - self.record[0] + 1), top + 1)
        elif self.codec == "bitstream":
            per, conts = self.period
            top = packed // conts * per
            lengths = range(max(1, top - per + 1), top + 1) if packed % conts == 0 else []
        else:
            lengths = range(max(1, (packed - 1) * v - 256), packed * v + 1)
        for length in lengths:
            if self.packed_len(length) == packed:
                s = [a, b]
                s[self.pack_axis] = length
                out.append((s[0], s[1]))
        return out

    def value_of(self, code: int):
        return self.codes[code]

    def code_of(self, value: int) -> int:
        for c, v in enumerate(self.codes):
            if v is not None and v == value:
                return c
        raise FormatError(f"value {value} has no code in table {self.codes}")

    # ---- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["codes"] = list(self.codes)
        if self.group_view is None:
            del d["group_view"]  # absent: JSON of the other formats unchanged
        if self.group_axis == 1:
            del d["group_axis"]  # absent: HQQ axis=1 and the other formats unchanged
        if self.fields is None:
            del d["fields"]  # absent: JSON of the tiling formats unchanged
        if self.codec is None:
            del d["codec"]  # absent: JSON of the bit-field formats unchanged
        if self.order is None:
            del d["order"]  # absent: JSON of the identity-order formats unchanged
        else:
            d["order"] = list(self.order)
        if self.segments is None:
            del d["segments"]  # absent: JSON of one-segment formats unchanged
        else:
            d["segments"] = list(self.segments)
        if self.record is None:
            del d["record"]  # absent: JSON of record-less formats unchanged
        else:
            d["record"] = list(self.record)
        if self.stored_as is None:
            del d["stored_as"]  # absent: JSON of formats stored in their container dtype unchanged
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PackSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - known
        if extra:
            raise FormatError(f"unknown PackSpec fields {sorted(extra)}; known: {sorted(known)}")
        return cls(**d)

    def replace(self, **kw) -> "PackSpec":
        return dataclasses.replace(self, **kw)


# ---------------------------------------------------------------------------------------
# lane arithmetic


def _slot_index(spec: PackSpec, axis_len: int) -> torch.Tensor:
    """elem[c, s] = logical index along the pack axis held by container c at lane rank s (-1 = pad); its slot
    in the container is s, or the i with ``order[i] == s`` (``_shifts``)."""
    v = spec.values_per_container
    blk = spec.block_len(axis_len)
    per_block = blk // v
    n_cont = spec.packed_len(axis_len)
    c = torch.arange(n_cont).unsqueeze(1)  # (C, 1)
    s = torch.arange(v).unsqueeze(0)  # (1, V)
    elem = (c // per_block) * blk + s * per_block + (c % per_block)  # (C, V)
    return torch.where(elem < axis_len, elem, torch.full_like(elem, -1))


def _shifts(spec: PackSpec) -> torch.Tensor:
    """Bit offset of the lanes' element j (j < V) in its container: the slot ``order`` puts it in (itself
    without one), counted from the low end (``lsb``) or the high end (``msb``)."""
    v = spec.values_per_container
    s = torch.arange(v, dtype=torch.int64)
    if spec.order is not None:  # element j sits in the slot i with order[i] == j
        s = torch.tensor([spec.order.index(j) for j in range(v)], dtype=torch.int64)
    if spec.bit_order == "msb":
        s = v - 1 - s
    return s * spec.bits


def _base3_powers(spec: PackSpec) -> torch.Tensor:
    """codec 'base3': the place value of the lanes' element j (j < 5) in its byte: 3^j (``lsb`` digit order) or
    3^(4 - j) (``msb``)."""
    s = torch.arange(BASE3_DIGITS, dtype=torch.int64)
    if spec.bit_order == "msb":
        s = BASE3_DIGITS - 1 - s
    return 3 ** s


def _base3_digits(words: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """codec 'base3': bytes (rows, C) int64, the pack axis last (``_oriented``) -> their five digits (rows, C, 5) in
    lane order.  A byte >= 243 holds no five base-3 digits: a FormatError names its position in the stored tensor
    and its value."""
    bad = words >= BASE3_BYTES
    if bool(bad.any()):
        r, c = (int(i) for i in bad.nonzero()[0])
        byte = int(words[r, c])
        if spec.pack_axis == 0:  # (rows, C) is the stored tensor with its pack axis moved last: back
            r, c = c, r
        if spec.transposed:
            r, c = c, r
        raise FormatError(f"byte {byte} at stored position [{r}, {c}] ({int(bad.sum())} of {words.numel()} bytes >= "
                          f"{BASE3_BYTES}): a base-3 byte holds five trits t as sum t_i * 3^i <= 242; expected every "
                          f"byte < {BASE3_BYTES} (corrupt, or not base-3 packing)")
    return (words.unsqueeze(-1) // _base3_powers(spec).to(words.device)) % 3


def float_codes_container(stored: torch.Tensor, spec: PackSpec, name: str = "tensor") -> torch.Tensor:
    """codec 'float_codes': the float tensor whose elements are the codes -> its ``spec.container`` tensor.  Every
    element must be finite, integral and a code (0 <= c < 2^bits), else a FormatError names the first other one
    with its position and count."""
    if not stored.is_floating_point():
        raise FormatError(f"{name}: dtype {stored.dtype}, format says codes stored as float values (codec "
                          f"'float_codes'); expected float16 / bfloat16 / float32")
    f = stored.detach().to(torch.float32)
    bad = ~torch.isfinite(f) | (f != f.round()) | (f < 0) | (f >= (1 << spec.bits))
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise FormatError(f"{name}: value {float(f[idx])} at {list(idx)} ({int(bad.sum())} such values) is no code: "
                          f"codes stored as floats are integers 0..{(1 << spec.bits) - 1} (e.g. trits t = w + 1 as "
                          f"0.0 / 1.0 / 2.0)")
    return f.to(spec.torch_dtype)


def _to_container(x: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """int64 holding an unsigned bit pattern -> container dtype (two's complement wrap)."""
    cbits = CONTAINERS[spec.container][1]
    if spec.container == "uint8":
        return x.to(torch.uint8)
    if cbits < 64:
        x = torch.where(x >= (1 << (cbits - 1)), x - (1 << cbits), x)
    return x.to(spec.torch_dtype)


#: unsigned tensors that carry a signed container's bits (safetensors U16 / U32 / U64): viewed as it, bit for bit
UNSIGNED_VIEWS = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _from_container(x: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """container dtype -> int64 unsigned bit pattern (an unsigned 16 / 32 / 64-bit tensor is read as its bits:
    ``UNSIGNED_VIEWS``; a conversion would wrap uint64 values >= 2^63)."""
    cbits = CONTAINERS[spec.container][1]
    if x.dtype in UNSIGNED_VIEWS:
        x = x.view(UNSIGNED_VIEWS[x.dtype])
    x = x.to(torch.int64)
    if spec.container != "uint8" and cbits < 64:
        x = x & ((1 << cbits) - 1)
    return x


def as_container(stored: torch.Tensor, spec: PackSpec, name: str = "tensor", shape: Optional[tuple] = None
                 ) -> torch.Tensor:
    """The container tensor whose bytes ``stored`` holds (``spec.stored_as``: ``.view(container)`` on the last dim,
    bit for bit); ``stored`` itself without ``stored_as``.  A dtype other than ``stored_as``, a last dim with no
    container view, or (given the logical ``shape``) a stored shape other than its ``packed_shape`` is a
    FormatError naming the expected dtype / shape."""
    if spec.stored_as is None:
        return stored
    want = STORED_AS[spec.stored_as][0]
    if stored.dtype != want:
        raise FormatError(f"{name}: stored as {stored.dtype}, format says {spec.container} containers stored as "
                          f"{spec.stored_as} (a {spec.stored_as} view of their bytes); expected dtype {want}")
    if stored.dim() == 0:
        raise FormatError(f"{name}: a 0-d {stored.dtype} tensor has no {spec.container} view; expected a 2-D tensor")
    try:
        if shape is not None:
            want = spec.packed_shape(tuple(shape))
            if tuple(stored.shape) != want:
                raise FormatError(f"stored {stored.dtype} tensor has shape {tuple(stored.shape)}, a logical "
                                  f"{shape[0]}x{shape[1]} matrix in this format needs {spec.stored_as} {want} (the "
                                  f"{spec.stored_as} view of {spec.container} {spec.replace(stored_as=None).packed_shape(tuple(shape))})")
        cshape = spec.container_shape(tuple(stored.shape))
    except FormatError as e:
        raise FormatError(f"{name}: {e}") from None
    return stored.contiguous().view(spec.torch_dtype).reshape(cshape)


def as_stored(packed: torch.Tensor, spec: PackSpec, name: str = "tensor") -> torch.Tensor:
    """The inverse of ``as_container``: the ``stored_as`` view of a container tensor (itself without)."""
    if spec.stored_as is None:
        return packed
    if packed.dtype != spec.torch_dtype:
        raise FormatError(f"{name}: dtype {packed.dtype}, format says {spec.container}")
    cb, fb = CONTAINERS[spec.container][1] // 8, STORED_AS[spec.stored_as][1]
    if packed.dim() == 0 or (packed.shape[-1] * cb) % fb:
        raise FormatError(f"{name}: a {spec.container} {list(packed.shape)} container tensor has no {spec.stored_as} "
                          f"view: its last dim * {cb} bytes is not a multiple of {fb}")
    return packed.contiguous().view(STORED_AS[spec.stored_as][0])


def _by_segment(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int], fn, name: str = "tensor"
                ) -> torch.Tensor:
    """``fn(piece, inner_spec, piece_shape)`` on every packed segment (``spec.segments``), the results
    concatenated along the logical pack axis.  Errors name the segment and its logical range."""
    inner, ax = spec.replace(segments=None), spec.pack_axis
    want = spec.packed_shape(shape)  # checks that the segments cover the axis
    if packed.dim() != 2 or tuple(packed.shape) != want:
        raise FormatError(f"{name}: packed tensor has shape {tuple(packed.shape)}, a logical {shape[0]}x{shape[1]} "
                          f"matrix in segments {list(spec.segments)} of this format needs {want}")
    lens = [inner.packed_len(n) for n in spec.segments]
    outs, start = [], 0
    for i, (piece, n) in enumerate(zip(packed.split(lens, dim=(1 - ax) if spec.transposed else ax), spec.segments)):
        sub = [shape[0], shape[1]]
        sub[ax] = n
        try:
            outs.append(fn(piece, inner, (sub[0], sub[1])))
        except FormatError as e:
            raise FormatError(f"{e} (in segment {i}: logical {'rows' if ax == 0 else 'columns'} "
                              f"[{start}, {start + n}))") from None
        start += n
    return torch.cat(outs, dim=ax)


def pack_codes(codes: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """codes int [N, K] (each in [0, 2**bits)) -> packed container tensor (``stored_as``: its float view)."""
    if codes.dim() != 2:
        raise FormatError(f"pack expects a 2-D code matrix, got shape {tuple(codes.shape)}")
    if spec.stored_as is not None:
        return as_stored(pack_codes(codes, spec.replace(stored_as=None)), spec)
    if spec.segments is not None:
        spec.packed_len(codes.shape[spec.pack_axis])  # the segments cover the axis
        inner = spec.replace(segments=None)
        parts = [pack_codes(c, inner) for c in codes.split(list(spec.segments), dim=spec.pack_axis)]
        return torch.cat(parts, dim=(1 - spec.pack_axis) if spec.transposed else spec.pack_axis).contiguous()
    if spec.group_view is not None:
        n, k = codes.shape
        return pack_codes(codes.reshape(spec.view_shape((n, k))), spec.ungrouped())
    if spec.codec == "bitstream":
        return _bitstream_pack(codes, spec)
    if spec.codec == "float_codes":  # the container tensor's values as floats (exact: codes < 256)
        return pack_codes(codes, spec.replace(codec=None)).to(torch.float32)
    if spec.codec == "tq1_0":
        return _tq1_0_pack(codes, spec)
    if spec.record is not None:
        return _pack_records(codes, spec)
    if spec.codec == "base3" and codes.numel() and int(codes.max()) > 2:
        raise FormatError(f"codec 'base3' holds base-3 digits: code {int(codes.max())} has no digit (codes 0, 1, 2)")
    # containers of <= 16 bits are assembled in int32 (exact: words < 2**16), wider ones in int64;
    # the narrow path keeps multi-GB checkpoints (8B shapes) to seconds per layer
    wide = spec.bits * spec.values_per_container > 16
    work = torch.int64 if wide else torch.int32
    codes = codes.to(work)
    if spec.pack_axis == 0:
        codes = codes.t()
    rows, length = codes.shape
    elem = _slot_index(spec, length)  # (C, V)
    padded = torch.cat([codes, torch.full((rows, 1), spec.pad_code, dtype=work)], dim=1)
    gathered = padded[:, elem.clamp(min=-1) % (length + 1)]  # -1 -> the pad column
    gathered = torch.where(elem.unsqueeze(0) >= 0, gathered, torch.full_like(gathered, spec.pad_code))
    if spec.bits * spec.values_per_container == 64:
        # int64 containers: avoid overflow of the top slot by packing through uint64 views
        word = torch.zeros(gathered.shape[:2], dtype=torch.int64)
        for s, sh in enumerate(_shifts(spec).tolist()):
            word |= gathered[:, :, s] << sh
    elif spec.codec == "base3":  # digits, not bit fields: slot s times its place value
        word = (gathered * _base3_powers(spec).to(work)).sum(-1, dtype=work)  # (rows, C), < 243
    else:
        word = (gathered << _shifts(spec).to(work)).sum(-1, dtype=work)  # (rows, C)
    packed = _to_container(word, spec)
    if spec.pack_axis == 0:
        packed = packed.t()
    if spec.transposed:
        packed = packed.t()
    return packed.contiguous()


def _pack_records(codes: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """Codes [N, K] -> uint8 [N, ceil(K/E) * R]: each record's code bytes, then zeroed side bytes."""
    e, r = spec.record
    n, k = codes.shape
    nrec = -(-k // e)
    full = torch.full((n, nrec * e), spec.pad_code, dtype=codes.dtype)
    full[:, :k] = codes
    inner = pack_codes(full, spec.replace(record=None)).view(n, nrec, spec.code_bytes)
    side = torch.zeros(n, nrec, r - spec.code_bytes, dtype=torch.uint8)
    return torch.cat([inner, side], dim=2).reshape(n, nrec * r).contiguous()


def _oriented(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int]) -> tuple[torch.Tensor, int]:
    """Validate ``packed`` against ``spec`` / ``shape``; return it as (rows, containers) with the
    pack axis last, and the logical length of that axis."""
    n, k = shape
    want = spec.packed_shape((n, k))
    if tuple(packed.shape) != tuple(want):
        rec = "" if spec.record is None else (
            f"; {spec.record[1]}-byte records of {spec.record[0]} values: width ceil({k}/{spec.record[0]}) * "
            f"{spec.record[1]} = {want[1]}" + ("" if len(packed.shape) != 2 or packed.shape[-1] % spec.record[1] == 0
                                              else f", and {packed.shape[-1]} is not a multiple of {spec.record[1]}"))
        raise FormatError(
            f"packed tensor has shape {tuple(packed.shape)}, a logical {n}x{k} matrix in this format "
            f"needs {want} (pack_axis={spec.pack_axis}, lanes={spec.lanes}, " + (
                f"{spec.period[0]} codes per {spec.period[1]} containers" if spec.codec == "bitstream"
                else f"{spec.values_per_container}/container") +
            f"{rec})")
    if UNSIGNED_VIEWS.get(packed.dtype) == spec.torch_dtype:  # safetensors U16 / U32 / U64: the same bits
        packed = packed.view(spec.torch_dtype)
    if packed.dtype != spec.torch_dtype:
        raise FormatError(f"packed tensor has dtype {packed.dtype}, format says {spec.container}")
    p = packed.t() if spec.transposed else packed
    if spec.pack_axis == 0:
        p = p.t()
    if spec.record is not None:  # keep each record's code bytes, drop its side data
        nrec = p.shape[1] // spec.record[1]
        p = p.reshape(p.shape[0], nrec, spec.record[1])[:, :, :spec.code_bytes].reshape(p.shape[0], -1)
    return p, (n, k)[spec.pack_axis]


def _place(fields: torch.Tensor, spec: PackSpec, length: int) -> torch.Tensor:
    """(rows, C, V) per-slot fields -> (rows, length) in logical order, pads cropped.

    With B the block and P = B // V containers per block, C = nb * P and container c = b * P + j
    holds, in slot s, element b * B + s * P + j (_slot_index): a view + permute, no scatter."""
    rows, c, v = fields.shape
    per_block = spec.block_len(length) // v
    nb = c // per_block
    return fields.view(rows, nb, per_block, v).permute(0, 1, 3, 2).reshape(rows, nb * per_block * v)[:, :length]


def unpack_codes(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int]) -> torch.Tensor:
    """packed container tensor -> codes int64 [N, K] for the logical ``shape``."""
    if spec.stored_as is not None:
        return unpack_codes(as_container(packed, spec, shape=shape), spec.replace(stored_as=None), shape)
    if spec.codec == "bitstream":
        return _bitstream_unpack(packed, spec, shape)
    if spec.codec == "float_codes":
        return unpack_codes(float_codes_container(packed, spec), spec.replace(codec=None), shape)
    if spec.codec == "tq1_0":
        return _tq1_0_unpack(packed, spec, shape)
    if spec.segments is not None:
        return _by_segment(packed, spec, shape, unpack_codes)
    if spec.group_view is not None:
        return unpack_codes(packed, spec.ungrouped(), spec.view_shape(shape)).reshape(shape)
    p, length = _oriented(packed, spec, shape)
    words = _from_container(p, spec)  # (rows, C)
    if spec.codec == "base3":
        fields = _base3_digits(words, spec)
    else:
        mask = (1 << spec.bits) - 1
        fields = (words.unsqueeze(-1) >> _shifts(spec).to(words.device)) & mask  # (rows, C, V)
    out = _place(fields, spec, length)
    if spec.pack_axis == 0:
        out = out.t()
    return out.contiguous()


def code_lut(spec: PackSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(value per code as int64 with unused -> 0, bool mask of unused codes)."""
    vals = torch.tensor([0 if v is None else int(v) for v in spec.codes], dtype=torch.int64)
    unused = torch.tensor([v is None for v in spec.codes])
    return vals, unused


def _unpack_bytes(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int], dtype: torch.dtype
                  ) -> tuple[torch.Tensor, bool]:
    """8-bit containers: one table lookup per byte (byte -> its V slot values) instead of shifts,
    masks and a code gather in int64: ~10x faster on CPU, and it runs on the tensor's device.
    Returns (values [N, K] of ``dtype``, whether any logical element holds an unused code)."""
    p, length = _oriented(packed, spec, shape)
    dev = p.device
    codes = (torch.arange(256).unsqueeze(1) >> _shifts(spec)) & ((1 << spec.bits) - 1)  # (256, V)
    vals, unused = code_lut(spec)
    b = p.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    v = spec.values_per_container
    fields = vals[codes].to(dtype).to(dev).index_select(0, b).view(p.shape[0], p.shape[1], v)
    bad = False
    if bool(unused.any()):
        flags = unused[codes].to(dev).index_select(0, b).view(p.shape[0], p.shape[1], v)
        bad = bool(_place(flags, spec, length).any())
    out = _place(fields, spec, length)
    if spec.pack_axis == 0:
        out = out.t()
    return out.contiguous(), bad


def _narrow(values: torch.Tensor) -> torch.Tensor:
    """Integer values as int8 when they all fit, else int16."""
    fits = not (values.numel() and bool(values.abs().max() > 127))
    return values.to(torch.int8 if fits else torch.int16)


def unpack(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int], *, name: str = "tensor",
           strict: bool = True) -> torch.Tensor:
    """packed -> logical integer values int8 [N, K] (int16 when a value does not fit int8), on
    the device of ``packed``.  An unused code is an error if ``strict``."""
    if spec.codec == "sign_masks":  # (its flags read as values would be a silently other weight: pos alone)
        raise FormatError(f"{name}: codec 'sign_masks' stores a weight as two masks (+1 and -1), and one tensor is "
                          f"half of it: decode the pair with unpack_sign_masks (the spec entry's neg_key names the "
                          f"-1 mask)")
    if spec.stored_as is not None:
        return unpack(as_container(packed, spec, name, shape), spec.replace(stored_as=None), shape, name=name,
                      strict=strict)
    if spec.group_view is not None:
        inner = spec.ungrouped()
        return unpack(packed, inner, spec.view_shape(shape), name=name, strict=strict).reshape(shape)
    if spec.segments is not None:
        return _narrow(_by_segment(packed, spec, shape, lambda p, s, sh: unpack(p, s, sh, name=name, strict=strict),
                                   name=name))
    if spec.codec == "float_codes":
        return unpack(float_codes_container(packed, spec, name), spec.replace(codec=None), shape, name=name,
                      strict=strict)
    vals, unused = code_lut(spec)
    if CONTAINERS[spec.container][1] == 8 and spec.codec is None:
        wide = bool((vals.abs() > 127).any())
        out, bad = _unpack_bytes(packed, spec, shape, torch.int16 if wide else torch.int8)
        if not (strict and bad):  # (an unused code under strict: the codes path below names it)
            return _narrow(out) if wide else out
    try:
        codes = unpack_codes(packed, spec, shape)  # wider containers, and the error report below
    except FormatError as e:  # (a base-3 byte with no digits: its position, in the tensor named here)
        if spec.codec != "base3" or name in str(e):
            raise
        raise FormatError(f"{name}: {e}") from None
    if strict and bool(unused.any()):
        bad = unused.to(codes.device)[codes]
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            raise FormatError(
                f"{name}: code {int(codes[idx])} at logical index {idx} is declared unused by the code table "
                f"{list(spec.codes)} ({int(bad.sum())} occurrences) — wrong code table, bit order or lane layout?")
    return _narrow(vals.to(codes.device)[codes])


def pack(values: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """logical integer values [N, K] -> packed container tensor (exact inverse of ``unpack``)."""
    if spec.codec == "sign_masks":
        raise FormatError("codec 'sign_masks' stores a weight as two masks (+1 and -1): pack the pair with "
                          "pack_sign_masks")
    if values.dim() != 2:
        raise FormatError(f"pack expects a 2-D matrix, got shape {tuple(values.shape)}")
    # value -> code through a table over the values' range (one gather, int32 work: a 2-bit
    # 58M-weight matrix packs in well under a second); the first code of a value wins
    v = values.to(torch.int32) if not values.is_floating_point() and values.element_size() <= 4 \
        else values.to(torch.int64)
    if v.numel() == 0:
        return pack_codes(v, spec)
    lo, hi = int(v.min()), int(v.max())
    known = {int(val): c for c, val in reversed(list(enumerate(spec.codes))) if val is not None}
    if hi - lo <= (1 << 16):
        lut = torch.full((hi - lo + 1,), -1, dtype=torch.int32, device=v.device)
        for val, c in known.items():
            if lo <= val <= hi:
                lut[val - lo] = c
        codes = lut[(v - lo).long() if v.dtype != torch.int64 else v - lo]
    else:  # a very wide value range: the compare-per-code path
        codes = torch.full_like(v, -1, dtype=torch.int32)
        for val, c in sorted(known.items(), key=lambda kv: kv[1], reverse=True):
            codes = torch.where(v == val, torch.full_like(codes, c), codes)
    if bool((codes < 0).any()):
        bad = sorted(set(v[codes < 0].tolist()))[:8]
        raise FormatError(f"values {bad} have no code in table {list(spec.codes)}")
    return pack_codes(codes, spec)


# ---------------------------------------------------------------------------------------
# sign-mask pairs (codec 'sign_masks')


def _check_sign_masks(spec: PackSpec) -> None:
    if spec.codec != "sign_masks":
        raise FormatError(f"a sign-mask pair needs a PackSpec of codec 'sign_masks', got codec {spec.codec!r}")


def pack_sign_masks(values: torch.Tensor, spec: PackSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Ternary values [N, K] -> (pos, neg): the +1 and the -1 mask, each stored in ``spec``'s layout (codec
    'sign_masks'; a one-flag-per-element mask as its container dtype, ``.bool()`` for a bool tensor)."""
    _check_sign_masks(spec)
    if values.dim() != 2:
        raise FormatError(f"pack_sign_masks expects a 2-D matrix, got shape {tuple(values.shape)}")
    v = values.to(torch.int64)
    bad = (v < -1) | (v > 1)
    if bool(bad.any()):
        raise FormatError(f"values {sorted(set(v[bad].tolist()))[:8]} are not ternary: a sign-mask pair holds -1 / 0 / "
                          f"+1 (W = pos - neg)")
    on, off = spec.code_of(1), spec.code_of(0)
    return tuple(pack_codes(torch.where(v == sign, on, off), spec) for sign in (1, -1))


def _mask_flags(t: torch.Tensor, spec: PackSpec, shape: tuple[int, int], name: str) -> torch.Tensor:
    """One mask of a sign-mask pair -> its flags, bool [N, K]: the dtype (bool for one flag per element, else uint8 /
    int8: the same bits), the shape and, one flag per element, every value 0 / 1 checked (a FormatError names the
    tensor, the stored position and the value)."""
    n, k = shape
    if t.dtype == torch.bool:
        if spec.bits != 8:
            raise FormatError(f"{name}: a bool tensor holds one flag per element, but the format packs eight flags "
                              f"per byte (bits 1); expected {spec.container}")
        stored = t.view(spec.torch_dtype)  # (False / True: bytes 0 / 1)
    elif t.dtype in (torch.uint8, torch.int8):
        stored = t.view(spec.torch_dtype)  # the same bits either way (flags 0 / 1, or bit fields)
    else:
        raise FormatError(f"{name}: dtype {t.dtype}; a sign mask is bool, uint8 or int8")
    want = spec.packed_shape(shape)
    if tuple(t.shape) != want:
        how = "one flag per element" if spec.bits == 8 else f"eight flags per byte along axis {spec.pack_axis}"
        raise FormatError(f"{name}: shape {list(t.shape)}, a logical {n}x{k} matrix as a sign mask ({how}"
                          f"{', stored transposed' if spec.transposed else ''}) needs {list(want)}")
    codes = unpack_codes(stored, spec, shape)
    vals, unused = code_lut(spec)
    if bool(unused.any()):
        bad = unused.to(codes.device)[codes]
        if bool(bad.any()):
            r, c = (int(i) for i in bad.nonzero()[0])
            sr, sc = (c, r) if spec.transposed else (r, c)  # one flag per element: the stored element itself
            raise FormatError(f"{name}: value {int(t[sr, sc])} at [{sr}, {sc}] ({int(bad.sum())} such values): a "
                              f"one-flag-per-element sign mask holds flags 0 / 1 (bool, or uint8 / int8 0 / 1); "
                              f"expected every value 0 or 1")
    return vals.to(codes.device)[codes].bool()


def unpack_sign_masks(pos: torch.Tensor, neg: torch.Tensor, spec: PackSpec, shape: tuple[int, int], *,
                      name: str = "pos", neg_name: str = "neg") -> torch.Tensor:
    """A +1 mask and a -1 mask (codec 'sign_masks', both in ``spec``'s layout) -> ternary values int8 [N, K] = pos -
    neg, on the masks' device.  ``name`` / ``neg_name`` name the two tensors (file and key) in errors: a wrong dtype
    or shape (with the shape expected), a flag other than 0 / 1, and an element set in both masks (its logical
    row and column, and how many)."""
    _check_sign_masks(spec)
    p = _mask_flags(pos, spec, shape, name)
    n = _mask_flags(neg.to(pos.device), spec, shape, neg_name)
    both = p & n
    if bool(both.any()):
        r, c = (int(i) for i in both.nonzero()[0])
        raise FormatError(f"{name}: element [{r}, {c}] (logical row {r}, column {c}) is set both in this +1 mask and "
                          f"in the -1 mask {neg_name} ({int(both.sum())} of {both.numel()} elements): a sign-mask "
                          f"pair holds at most one sign per weight (W = pos - neg); expected no element set in both "
                          f"(corrupt, or the two tensors are not a +1 / -1 pair)")
    return (p.to(torch.int8) - n.to(torch.int8)).contiguous()


# ---------------------------------------------------------------------------------------
# scales


def group_index(g_idx: torch.Tensor, k: int, group_size: int, *, key: str = "g_idx",
                name: str = "tensor") -> torch.Tensor:
    """An act-order group index (AutoGPTQ / GPTQModel ``g_idx`` with ``desc_act``, compressed-tensors
    ``weight_g_idx`` with ``actorder: group``) checked and returned as int64 [K]: input k belongs to group
    ``g_idx[k]``, whose scale / zero point column it takes (``expand_scale``).

    Both writers quantize the inputs in a permuted order and cut *that* order into groups of ``group_size``
    consecutive inputs (AutoGPTQ ``GPTQ.fasterquant``: ``g_idx = [i // group_size for i in range(K)]`` in the
    permuted order, then ``g_idx[invperm]``; llm-compressor's ``quantize_weight`` the same for actorder group), so
    the index is a permutation of ``arange(K) // group_size``: every group g holds exactly ``min(group_size,
    K - g * group_size)`` inputs.  That is required here, not only plausible: compressed-tensors' own
    ``_process_group`` sorts the inputs by g_idx and cuts the sorted order into groups of group_size (a group of
    another size would take its neighbour's scale there), as vLLM's exllama GPTQ kernel did with desc_act (rows
    sorted by g_idx, ``groupsize = size_k / groups``), while a reader indexing ``scales[g_idx]`` (AutoGPTQ's torch
    path) would give another weight.  A FormatError names the tensor and the first
    offending input or group: an integer dtype, shape [K], values in [0, G), and the group sizes."""
    g = -(-k // group_size)
    where = f"{name}: group index {key!r}"
    if g_idx.dtype.is_floating_point or g_idx.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise FormatError(f"{where} is {str(g_idx.dtype).replace('torch.', '')}, expected an integer tensor (int32 "
                          f"[{k}]: the group of each input)")
    if tuple(g_idx.shape) != (k,):
        raise FormatError(f"{where} has shape {list(g_idx.shape)}, expected [{k}] (one group per input, K = {k})")
    gi = g_idx.detach().to(torch.int64).cpu()
    bad = (gi < 0) | (gi >= g)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        hint = (" (-1 is compressed-tensors' unset index: GPTQ never filled it)" if int(gi[i]) == -1 else "")
        raise FormatError(f"{where}: input {i} is in group {int(gi[i])}, outside [0, {g}) ({g} groups of "
                          f"{group_size} for K = {k}; {int(bad.sum())} such inputs){hint}")
    have = torch.bincount(gi, minlength=g)
    want = torch.bincount(torch.arange(k) // group_size, minlength=g)
    if not torch.equal(have, want):
        j = int((have != want).nonzero()[0])
        raise FormatError(f"{where}: group {j} holds {int(have[j])} inputs, expected {int(want[j])}: an act-order "
                          f"index is a permutation of arange(K) // group_size (K = {k}, group_size {group_size}), "
                          f"each group {group_size} inputs (the last {int(want[-1])}), as AutoGPTQ / GPTQModel and "
                          f"llm-compressor write it and compressed-tensors reads it")
    return gi


def expand_scale(scale: torch.Tensor, spec: ScaleSpec, shape: tuple[int, int], *,
                 rows: Optional[tuple[int, int]] = None, name: str = "scale",
                 g_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Scale tensor -> float32 multiplier broadcastable to [N, K] (``divide`` inverted),
    for the row slice ``rows`` of a fused matrix.  Validates shape and finiteness.  ``g_idx``: a checked act-order
    group index (``group_index``, int64 [K]) for a granularity ``group`` (group_axis 1) scale: input k takes its
    group ``g_idx[k]``'s column, not that of k // group_size."""
    n, k = shape
    if g_idx is not None and (spec.granularity != "group" or spec.group_axis != 1 or tuple(g_idx.shape) != (k,)):
        raise FormatError(f"{name}: scale {spec.key!r}: an act-order group index applies to a granularity 'group' "
                          f"scale of consecutive-input groups (group_axis 1) with one entry per input (K = {k}); got "
                          f"granularity {spec.granularity!r}, group_axis {spec.group_axis}, index shape "
                          f"{list(g_idx.shape)}")
    if spec.granularity == "block":
        s = record_scales(scale, spec, shape, name=name)  # (N, ceil(K / E)), finite
    else:
        s = scale.detach().to(torch.float32)
    if not bool(torch.isfinite(s).all()):
        raise FormatError(f"{name}: scale {spec.key!r} has NaN/Inf values")
    if spec.granularity == "tensor":
        if spec.index is not None:
            s = s.reshape(-1)
            if spec.index >= s.numel():
                raise FormatError(f"{name}: scale {spec.key!r} has {s.numel()} values, index {spec.index} requested")
            s = s[spec.index]
        elif s.numel() != 1:
            raise FormatError(f"{name}: per-tensor scale {spec.key!r} must have 1 element, has shape {tuple(s.shape)}")
        m = s.reshape(1, 1)
    elif spec.granularity == "channel":
        if s.numel() != n:
            raise FormatError(f"{name}: per-channel scale {spec.key!r} must have {n} elements, has shape {tuple(s.shape)}")
        m = s.reshape(n, 1)
    elif spec.granularity == "block":
        m = s.repeat_interleave(spec.group_size, dim=1)[:, :k]
    elif spec.group_axis == 0:  # HQQ axis=0: one value per column of W's [G, N*K/G] row-major view
        g = spec.group_size
        cols = n * k // g
        if (n * k) % g:
            raise FormatError(f"{name}: axis-0 group scale {spec.key!r}: group_size {g} does not divide N*K = "
                              f"{n}*{k} = {n * k}")
        if tuple(s.shape) not in ((1, cols), (cols,)):
            raise FormatError(f"{name}: axis-0 group scale {spec.key!r} must have shape {(1, cols)} (one value per "
                              f"column of the [{g}, {cols}] group view, group_size {g}), has {tuple(scale.shape)}")
        m = s.reshape(1, cols).expand(g, cols).reshape(n, k)
    elif spec.padded_groups is not None:  # AutoAWQ gemv: [N, P] (transposed [P, N]) with zero padding columns
        s = unpad_groups(s.t() if spec.transposed and s.dim() == 2 else s, spec, shape, name=name)
        m = s.repeat_interleave(spec.group_size, dim=1)[:, :k]
    else:
        g = -(-k // spec.group_size)
        if spec.transposed:
            s = s.t() if s.dim() == 2 else s
        elif tuple(s.shape) in ((n * g,), (n * g, 1)) and n * g > 1:  # one per group, row-major (HQQ axis=1)
            s = s.reshape(n, g)
        if tuple(s.shape) != (n, g):
            raise FormatError(f"{name}: group scale {spec.key!r} must have shape {(n, g)} or {(n * g, 1)} "
                              f"(group_size {spec.group_size}), has {tuple(scale.shape)}")
        m = s[:, g_idx.to(s.device)] if g_idx is not None else s.repeat_interleave(spec.group_size, dim=1)[:, :k]
    if rows is not None and m.shape[0] > 1:
        m = m[rows[0]:rows[1]]
    if spec.op == "divide":
        if bool((m == 0).any()):
            raise FormatError(f"{name}: scale {spec.key!r} is zero but the format divides by it")
        m = 1.0 / m
        if not bool(torch.isfinite(m).all()):  # a subnormal scale (1e-40) is not zero, its reciprocal is inf
            bad = m[~torch.isfinite(m)]
            raise FormatError(f"{name}: scale {spec.key!r} is too small to divide by in float32 (1 / scale = "
                              f"{float(bad[0])} for {bad.numel()} value(s)); expected |scale| >= "
                              f"{1 / torch.finfo(torch.float32).max:.1e}")
    return m


def unpad_groups(s: torch.Tensor, spec: ScaleSpec, shape: tuple[int, int], *, name: str = "scale") -> torch.Tensor:
    """A group tensor stored with ``spec.padded_groups`` columns, [N, P] (already transposed back where the spec
    says so) -> its [N, ceil(K / G)] real groups.  The shape must be exactly [N, P] and every padding column zero
    (AutoAWQ gemv: ``WQLinear_GEMV.from_linear`` fills ``qscales[:, :groups]`` of a ``torch.zeros`` buffer and ORs
    only the real zero points into ``qzeros``); a FormatError names the tensor and the first nonzero pad."""
    n, k = shape
    g, p = -(-k // spec.group_size), spec.padded_groups
    if p < g:
        raise FormatError(f"{name}: {spec.key!r}: padded_groups {p} < the {g} groups of {spec.group_size} inputs "
                          f"that K = {k} needs")
    want = (p, n) if spec.transposed else (n, p)
    if s.dim() != 2 or tuple(s.shape) != (n, p):
        got = tuple(s.t().shape) if spec.transposed and s.dim() == 2 else tuple(s.shape)
        raise FormatError(f"{name}: group tensor {spec.key!r} must have shape {want} ({g} groups of "
                          f"{spec.group_size} inputs padded to {p}), has {got}")
    pad = s[:, g:]
    if pad.numel() and bool((pad != 0).any()):
        i, j = (int(x) for x in (pad != 0).nonzero()[0])
        raise FormatError(f"{name}: group tensor {spec.key!r} holds {float(pad[i, j])} at output {i}, padding "
                          f"column {g + j} ({int((pad != 0).sum())} nonzero padding values); columns {g}..{p - 1} "
                          f"past the {g} groups of K = {k} must be 0 (AutoAWQ gemv zero-fills them)")
    return s[:, :g]


def _record_view(packed: torch.Tensor, spec: ScaleSpec, shape: tuple[int, int], name: str) -> torch.Tensor:
    """uint8 [N, nrec * R] -> [N, nrec, R] after checking it holds ceil(K / E) records per row."""
    n, k = shape
    r, e = spec.record_bytes, spec.group_size
    nrec = -(-k // e)
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[0] != n or packed.shape[1] % r \
            or packed.shape[1] // r != nrec:
        raise FormatError(
            f"{name}: tensor {spec.key!r} must be uint8 [{n}, {nrec * r}] ({nrec} records of {e} values, {r} bytes "
            f"each, for a logical {n}x{k} matrix), got {packed.dtype} {list(packed.shape)}"
            + ("" if packed.dim() != 2 or packed.shape[1] % r == 0 else
               f": width {packed.shape[1]} is not a multiple of the {r}-byte record"))
    return packed.reshape(n, nrec, r)


def record_scales(packed: torch.Tensor, spec: ScaleSpec, shape: tuple[int, int], *,
                  name: str = "tensor") -> torch.Tensor:
    """The in-block scales of a record-packed weight (ScaleSpec granularity ``block``) as float32
    [N, ceil(K / E)]; NaN/Inf is an error naming the tensor, the first bad block and its bytes."""
    if spec.granularity != "block":
        raise FormatError(f"{name}: scale {spec.key!r} is {spec.granularity!r}, not an in-block scale")
    dt, width = RECORD_SCALE_DTYPES[spec.dtype]
    rec = _record_view(packed.detach(), spec, shape, name)
    # a fresh row-major copy: view() needs aligned strides, which a slice (even a contiguous one) lacks
    raw = rec[:, :, spec.byte_offset:spec.byte_offset + width].clone(memory_format=torch.contiguous_format)
    s = raw.view(dt).reshape(rec.shape[0], rec.shape[1]).to(torch.float32)
    bad = ~torch.isfinite(s)
    if bool(bad.any()):
        row, blk = (int(i) for i in bad.nonzero()[0])
        raise FormatError(
            f"{name}: in-block {spec.dtype} scale of tensor {spec.key!r} (bytes {spec.byte_offset}.."
            f"{spec.byte_offset + width - 1} of each {spec.record_bytes}-byte block) is {float(s[row, blk])} in "
            f"{int(bad.sum())} of {s.numel()} blocks, first at row {row} block {blk}; expected finite scales")
    return s


def write_record_scales(packed: torch.Tensor, scales: torch.Tensor, spec: ScaleSpec,
                        shape: tuple[int, int]) -> torch.Tensor:
    """Inverse of ``record_scales``: a copy of ``packed`` with [N, ceil(K / E)] ``scales`` stored
    (as ``spec.dtype``) in every record's scale bytes."""
    dt, width = RECORD_SCALE_DTYPES[spec.dtype]
    out = packed.clone()
    rec = _record_view(out, spec, shape, "write_record_scales")
    if tuple(scales.shape) != tuple(rec.shape[:2]):
        raise FormatError(f"write_record_scales: {tuple(rec.shape[:2])} scales needed, got {tuple(scales.shape)}")
    rec[:, :, spec.byte_offset:spec.byte_offset + width] = \
        scales.to(dt).reshape(-1).contiguous().view(torch.uint8).reshape(rec.shape[0], rec.shape[1], width)
    return out


# ---------------------------------------------------------------------------------------
# built-in conventions

#: transformers HF-BitNet ``pack_weights``: axis 0, blocked, 2-bit LSB-first, code = w + 1.
HF_BITNET = PackSpec(bits=2, container="uint8", pack_axis=0, lanes="blocked", bit_order="lsb",
                     codes=(-1, 0, 1, None))
#: The seed's layout: axis 1, 4 consecutive elements per byte LSB-first, 0->0, 1->+1, 2->-1.
SEED = PackSpec(bits=2, container="uint8", pack_axis=1, lanes="interleaved", bit_order="lsb",
                codes=(0, 1, -1, None))

#: llama.cpp TQ2_0 (ggml-quants.c ``block_tq2_0``, QK_K = 256): 66-byte blocks of 256 inputs,
#: ``qs[64]`` then fp16 ``d``; byte m of half h (bytes 32h..32h+31) holds elements 128h + m + 32n
#: at bits 2n (block_interleaved 128, lsb); code q = w + 1; W = (q - 1) * d.
TQ2_0 = PackSpec(bits=2, container="uint8", pack_axis=1, lanes="block_interleaved", block=128, bit_order="lsb",
                 codes=(-1, 0, 1, None), pad_code=1, record=(256, 66))


#: llama.cpp TQ1_0 (ggml-quants.c ``block_tq1_0``, QK_K = 256): 54-byte blocks of 256 inputs, ``qs[48]`` (5 base-3
#: digits per byte), ``qh[4]`` (4 per byte), then fp16 ``d``; trit t = w + 1, W = (t - 1) * d.  A byte holds
#: ceil(sum(t_n * 3^(4-n)) * 256 / 243) (``quantize_row_tq1_0_ref``; qh's four digits are shifted up one place
#: first) and digit n is ((byte * 3^n) mod 256) * 3 >> 8 (``dequantize_row_tq1_0``).  Element order in a block:
#: qs[m] digit n = element 32n + m (m < 32), qs[32 + m] digit n = 160 + 16n + m (m < 16), qh[j] digit n =
#: 240 + 4n + j.
TQ1_0_RECORD = (256, 54)
TQ1_0_CODE_BYTES = 52
CODECS = ("tq1_0", "bitstream", "base3", "float_codes", "sign_masks")
#: codec 'base3': trits per byte (3^5 = 243 <= 256) and the bytes that hold five trits
BASE3_DIGITS = 5
BASE3_BYTES = 243
TQ1_0 = PackSpec(bits=2, container="uint8", pack_axis=1, lanes="interleaved", bit_order="lsb",
                 codes=(-1, 0, 1, None), pad_code=1, record=TQ1_0_RECORD, codec="tq1_0")
_POW3 = (1, 3, 9, 27, 81, 243)
#: (byte range within the block's code bytes, digits per byte): qs[0:32], qs[32:48], qh[0:4]
_TQ1_0_PARTS = ((0, 32, 5), (32, 48, 5), (48, 52, 4))


def _bitstream_offsets(spec: PackSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per code j of one period: its first container (within the period) and its bit offset there."""
    codes, _ = spec.period
    cbits = CONTAINERS[spec.container][1]
    off = torch.arange(codes, dtype=torch.int64) * spec.bits
    return off // cbits, off % cbits


def _bitstream_pack(codes: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """codes [N, K] -> containers: each period's codes OR-ed into its containers (a code straddling two
    containers puts its low bits at the top of the first and the rest at the bottom of the next)."""
    per, conts = spec.period
    cbits = CONTAINERS[spec.container][1]
    c = codes.to(torch.int64)
    if spec.pack_axis == 0:
        c = c.t()
    rows, length = c.shape
    n_per = -(-length // per)
    full = torch.full((rows, n_per * per), spec.pad_code, dtype=torch.int64)
    full[:, :length] = c
    full = full.view(rows, n_per, per)
    first, sh = _bitstream_offsets(spec)
    mask = (1 << cbits) - 1
    words = torch.zeros(rows, n_per, conts + 1, dtype=torch.int64)  # one spare container for the last spill
    words.index_add_(2, first, (full << sh) & mask)  # disjoint bit ranges: adding is OR-ing
    words.index_add_(2, first + 1, full >> (cbits - sh))  # the spill (zero where the code fits)
    packed = _to_container(words[:, :, :conts].reshape(rows, n_per * conts), spec)
    if spec.pack_axis == 0:
        packed = packed.t()
    if spec.transposed:
        packed = packed.t()
    return packed.contiguous()


def _bitstream_unpack(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int]) -> torch.Tensor:
    p, length = _oriented(packed, spec, shape)
    per, conts = spec.period
    cbits = CONTAINERS[spec.container][1]
    words = _from_container(p, spec)
    rows = words.shape[0]
    words = torch.cat([words.view(rows, -1, conts), torch.zeros(rows, words.shape[1] // conts, 1,
                                                                   dtype=torch.int64, device=words.device)], dim=2)
    first, sh = (t.to(words.device) for t in _bitstream_offsets(spec))
    lo = words.index_select(2, first) >> sh
    hi = words.index_select(2, first + 1) << (cbits - sh)  # bits past the code's width are masked off
    out = ((lo | hi) & ((1 << spec.bits) - 1)).reshape(rows, -1)[:, :length]
    if spec.pack_axis == 0:
        out = out.t()
    return out.contiguous()


def _tq1_0_digits(b: torch.Tensor, ndig: int) -> torch.Tensor:
    """bytes (int64) -> their ``ndig`` base-3 digits as dequantize_row_tq1_0 reads them: (..., ndig, bytes)."""
    return torch.stack([(((b * _POW3[n]) & 0xFF) * 3) >> 8 for n in range(ndig)], dim=-2)


def _tq1_0_unpack(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int]) -> torch.Tensor:
    """uint8 [N, ceil(K/256) * 54] TQ1_0 blocks -> codes (trits 0..2) int64 [N, K]."""
    n, k = shape
    p, _ = _oriented(packed, spec, shape)  # checked, each record's 52 code bytes: (N, nrec * 52)
    b = p.to(torch.int64).reshape(n, -1, TQ1_0_CODE_BYTES)
    parts = [_tq1_0_digits(b[:, :, lo:hi], nd).reshape(n, b.shape[1], -1) for lo, hi, nd in _TQ1_0_PARTS]
    return torch.cat(parts, dim=2).reshape(n, -1)[:, :k].contiguous()


def _tq1_0_pack(codes: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """codes (trits 0..2) [N, K] -> uint8 [N, ceil(K/256) * 54] as quantize_row_tq1_0_ref packs them (the fp16 d
    bytes zero: ``write_record_scales`` fills them)."""
    n, k = codes.shape
    if codes.numel() and int(codes.max()) > 2:
        raise FormatError(f"TQ1_0 holds base-3 digits: code {int(codes.max())} has no digit (codes 0, 1, 2)")
    nrec = -(-k // 256)
    full = torch.full((n, nrec * 256), spec.pad_code, dtype=torch.int64)
    full[:, :k] = codes
    blk = full.reshape(n, nrec, 256)
    out, start = [], 0
    for lo, hi, nd in _TQ1_0_PARTS:
        w = hi - lo
        t = blk[:, :, start:start + nd * w].reshape(n, nrec, nd, w)  # element start + n*w + m -> digit n of byte m
        q = torch.zeros(n, nrec, w, dtype=torch.int64)
        for d in range(nd):
            q = q * 3 + t[:, :, d]
        if nd == 4:
            q = q * 3  # qh: the first value to the most significant trit
        out.append((q * 256 + 242) // 243)  # ceiling division (243 == 3^5)
        start += nd * w
    side = torch.zeros(n, nrec, TQ1_0_RECORD[1] - TQ1_0_CODE_BYTES, dtype=torch.int64)
    return torch.cat(out + [side], dim=2).reshape(n, nrec * TQ1_0_RECORD[1]).to(torch.uint8).contiguous()


def tq1_0_scale(key: str) -> ScaleSpec:
    """The in-block fp16 ``d`` of a TQ1_0 weight ``key`` (multiplied)."""
    return ScaleSpec(key=key, granularity="block", op="multiply", group_size=256, record_bytes=54, byte_offset=52,
                     dtype="float16")


def tq2_0_scale(key: str) -> ScaleSpec:
    """The in-block fp16 ``d`` of a TQ2_0 weight ``key`` (multiplied)."""
    return ScaleSpec(key=key, granularity="block", op="multiply", group_size=256, record_bytes=66, byte_offset=64,
                     dtype="float16")


#: AutoAWQ's slot order (``awq/utils/packing_utils.py`` ``AWQ_ORDER``; ``WQLinear_GEMM.from_linear``'s ``order_map``
#: for w_bit 4): slot i of an int32 holds output ``col * 8 + AWQ_ORDER[i]``; its inverse is ``AWQ_REVERSE_ORDER``
#: [0, 4, 1, 5, 2, 6, 3, 7], with which ``dequantize_gemm`` (and vLLM's ``_REVERSE_AWQ_PACK_ORDER``) unpack.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: AutoAWQ ``version: "gemm"`` ``qweight``: int32 [K, N/8], 4-bit codes q of eight consecutive outputs per word in
#: AWQ_ORDER, low bits first (the transpose of W's [N/8, K] packed along its axis 0); identity codes, W = (q - z) * s
AWQ_GEMM = PackSpec(bits=4, container="int32", pack_axis=0, lanes="interleaved", bit_order="lsb",
                    codes=tuple(range(16)), transposed=True, pad_code=0, order=AWQ_ORDER)
#: its ``qzeros``: int32 [K/G, N/8], the zero points z of the [K/G, N] group matrix packed along N as qweight is
#: (``LinearEntry.zero_pack``; stored as z itself, no GPTQ v1 - 1)
AWQ_GEMM_ZEROS = PackSpec(bits=4, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb",
                          codes=tuple(range(16)), pad_code=0, order=AWQ_ORDER)

#: AutoAWQ ``version: "gemv"`` ``qweight`` (``awq/modules/linear/gemv.py`` ``WQLinear_GEMV.from_linear``:
#: ``qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)`` with ``order_map = [0, 1, ..., 7]``):
#: int32 [N, K/8], the 4-bit codes q of eight consecutive *inputs* per word in natural order, low bits first;
#: identity codes, W = (q - z) * s
AWQ_GEMV = PackSpec(bits=4, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb",
                    codes=tuple(range(16)), pad_code=0)
#: its ``qzeros``: int32 [N, calculate_zeros_width(K, G)], the zero points z of the [N, groups] matrix packed along
#: the groups the same way (z itself), the columns past ``groups`` zero (``LinearEntry.zero_pack`` on the zero's
#: padded [N, 8 * width] matrix: ``ScaleSpec.padded_groups``)
AWQ_GEMV_ZEROS = AWQ_GEMV


def awq_gemv_zeros_width(in_features: int, group_size: int, pack_num: int = 8) -> int:
    """``calculate_zeros_width`` of ``awq/modules/linear/gemv.py`` (AutoAWQ 0.2.9), line for line: the int32 columns
    of a gemv ``qzeros`` (``scales`` has 8 times as many): ceil(groups / 8) rounded up to a multiple of 1 (group
    >= 128), 2 (64) or 4 (32).  Other group sizes raise there (``NotImplementedError``); here a FormatError."""
    if group_size >= 128:
        size_multiplier = 1
    elif group_size == 64:
        size_multiplier = 2
    elif group_size == 32:
        size_multiplier = 4
    else:
        raise FormatError(f"AutoAWQ gemv takes group_size >= 128, 64 or 32 (awq/modules/linear/gemv.py "
                          f"calculate_zeros_width raises NotImplementedError for {group_size})")

    def make_divisible(c, divisor):  # gemv.py's make_divisible: a ceiling division, despite its name
        return (c + divisor - 1) // divisor

    base_width = make_divisible(in_features // group_size, pack_num)
    base_width = make_divisible(base_width, size_multiplier) * size_multiplier
    return base_width


BUILTIN: dict[str, PackSpec] = {"hf-bitnet": HF_BITNET, "seed": SEED, "tq2_0": TQ2_0, "tq1_0": TQ1_0,
                                "awq-gemm": AWQ_GEMM, "awq-gemv": AWQ_GEMV}


# ---------------------------------------------------------------------------------------
# code-table builders (wide tables: 4-bit = 16 entries, one value per byte = 256 entries)


def code_table(bits: int, values: dict) -> tuple:
    """``2**bits`` entries from ``{code: value}``; every other code is unused (``None``).
    E.g. int8 storing {-1, 0, +1} directly: ``code_table(8, {255: -1, 0: 0, 1: 1})``."""
    t = [None] * (1 << bits)
    for c, v in values.items():
        if not 0 <= int(c) < len(t):
            raise FormatError(f"code {c} does not fit {bits} bits")
        t[int(c)] = int(v)
    return tuple(t)


def offset_table(bits: int, offset: int) -> tuple:
    """Every code decodes to ``code - offset`` (symmetric int-b as stored by compressed-tensors /
    GPTQ: v + 2**(bits-1))."""
    return tuple(c - offset for c in range(1 << bits))


def twos_complement_table(bits: int) -> tuple:
    """Every code decodes to its two's-complement value in ``bits`` bits."""
    return tuple(c - (1 << bits) if c >= 1 << (bits - 1) else c for c in range(1 << bits))


#: codec 'sign_masks' flag tables (code -> flag): eight flags per byte (bits 1), and one flag per element (bits 8:
#: bytes 0 / 1, every other byte unused - a bool mask viewed as uint8 holds only these)
SIGN_FLAGS_BIT = (0, 1)
SIGN_FLAGS_BYTE = code_table(8, {0: 0, 1: 1})


def sign_mask_spec(packed: bool, bit_order: str = "lsb", pack_axis: int = 1, transposed: bool = False,
                   container: str = "uint8", segments: Optional[tuple] = None) -> PackSpec:
    """The layout of both masks of a sign-mask pair (codec 'sign_masks'): eight flags per byte along ``pack_axis``
    in ``bit_order`` (``packed``; the last byte padded with flag 0), or one flag per element (``bit_order`` and
    ``pack_axis`` then do not apply)."""
    return PackSpec(bits=1 if packed else 8, container=container, pack_axis=pack_axis if packed else 1,
                    lanes="interleaved", bit_order=bit_order if packed else "lsb",
                    codes=SIGN_FLAGS_BIT if packed else SIGN_FLAGS_BYTE, transposed=transposed, pad_code=0,
                    codec="sign_masks", segments=segments)


def dumps(spec: PackSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


# ---------------------------------------------------------------------------------------
# compressed-tensors pack-quantized (read from compressed-tensors 0.17.0, not guessed)

#: strategies whose asymmetric zero points compressed-tensors packs (``compressors/pack_quantized/base.py``
#: ``PACK_ZP_STRATS``; 0.9.4 - 0.12.x: the same list in ``quantized_compressors/pack_quantized.py``); a
#: ``tensor`` strategy zero point stays the int8 [1] the quantizer made
CT_PACK_ZP_STRATEGIES = ("group", "channel")


def ct_pack_spec(bits: int) -> PackSpec:
    """compressed-tensors ``weight_packed``: int32 [N, ceil(K / (32/b))], ``pack_to_int32(q, b)`` (``compressors/
    pack_quantized/helpers.py``): the signed code q in [-2^(b-1), 2^(b-1) - 1] stored as q + 2^(b-1), 32 // b
    consecutive inputs per word, input i at bits b*i (low bits first), the last word padded with stored 0 (after the
    offset, so the pad reads back as -2^(b-1) and is cropped).  Code c -> c - 2^(b-1) (``unpack_from_int32``).
    Widths that do not tile 32 bits (3, 5, 6, 7) leave the high bits unused (``fields`` = 32 // b)."""
    half = 1 << (bits - 1)
    return PackSpec(bits=bits, container="int32", pack_axis=1, lanes="interleaved", bit_order="lsb",
                    codes=offset_table(bits, half), pad_code=0, fields=32 // bits if 32 % bits else None)


def ct_zero_pack_spec(bits: int) -> PackSpec:
    """compressed-tensors >= 0.9.4 asymmetric ``weight_zero_point`` of a group / channel strategy:
    ``pack_to_int32(zero_point, b, packed_dim=0)`` of the int8 [N, G] zero points (G = 1 per channel), i.e. int32
    [ceil(N / (32/b)), G], 32 // b consecutive *outputs* per word at bits b*i, each stored as z + 2^(b-1) like the
    weight codes (so W = (q - z) * s = (stored q - stored z) * s, what vLLM's ``CompressedTensorsWNA16`` kernels
    take as uint-b weights with uint-b zero points); the last word's unused fields stored 0.  Read with
    ``LinearEntry.zero_pack`` on the zero point's [N, G] matrix; code c -> z = c - 2^(b-1)."""
    return dataclasses.replace(ct_pack_spec(bits), pack_axis=0)
