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

* ``codes`` — code -> value (``None`` = unused code; decoding one is an error).

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


@dataclass(frozen=True)
class ScaleSpec:
    """How a scale tensor turns the integer matrix into effective weights.

    granularity: ``tensor`` (one value; with ``index`` set, element ``index`` of a vector of
    per-sub-matrix scales), ``channel`` (one per output row, shape [N] or [N, 1]),
    ``group`` (``[N, ceil(K / group_size)]``, groups of ``group_size`` consecutive inputs).
    op: ``multiply`` (W = T * s) or ``divide`` (W = T / s, transformers' ``bitlinear``).
    """

    key: str
    granularity: Literal["tensor", "channel", "group"] = "tensor"
    op: Literal["multiply", "divide"] = "multiply"
    group_size: Optional[int] = None
    index: Optional[int] = None
    transposed: bool = False  # stored as [groups, N] (GPTQ ``scales``)

    def __post_init__(self):
        if self.granularity not in ("tensor", "channel", "group"):
            raise FormatError(f"scale {self.key!r}: unknown granularity {self.granularity!r}")
        if self.op not in ("multiply", "divide"):
            raise FormatError(f"scale {self.key!r}: op must be 'multiply' or 'divide', got {self.op!r}")
        if self.granularity == "group" and (self.group_size is None or self.group_size < 1):
            raise FormatError(f"scale {self.key!r}: granularity 'group' needs group_size >= 1")


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

    def __post_init__(self):
        if self.container not in CONTAINERS:
            raise FormatError(f"unknown container {self.container!r}; known: {sorted(CONTAINERS)}")
        cbits = CONTAINERS[self.container][1]
        if self.bits < 1 or cbits % self.bits:
            raise FormatError(f"{self.bits}-bit codes do not tile a {self.container} container")
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

    # ---- derived sizes -------------------------------------------------------------
    @property
    def values_per_container(self) -> int:
        return CONTAINERS[self.container][1] // self.bits

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

    def packed_len(self, axis_len: int) -> int:
        b = self.block_len(axis_len)
        return -(-axis_len // b) * (b // self.values_per_container)

    def packed_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        n, k = shape
        s = [n, k]
        s[self.pack_axis] = self.packed_len(s[self.pack_axis])
        return (s[1], s[0]) if self.transposed else (s[0], s[1])

    def logical_shapes(self, stored_shape: tuple[int, int]) -> list[tuple[int, int]]:
        """Logical shapes whose packed shape is ``stored_shape`` (for the inspector)."""
        a, b = stored_shape
        if self.transposed:
            a, b = b, a
        v = self.values_per_container
        out = []
        packed = (a, b)[self.pack_axis]
        for length in range(max(1, (packed - 1) * v - 256), packed * v + 1):
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
    """elem[c, s] = logical index along the pack axis held by container c, slot s (-1 = pad)."""
    v = spec.values_per_container
    blk = spec.block_len(axis_len)
    per_block = blk // v
    n_cont = spec.packed_len(axis_len)
    c = torch.arange(n_cont).unsqueeze(1)  # (C, 1)
    s = torch.arange(v).unsqueeze(0)  # (1, V)
    elem = (c // per_block) * blk + s * per_block + (c % per_block)  # (C, V)
    return torch.where(elem < axis_len, elem, torch.full_like(elem, -1))


def _shifts(spec: PackSpec) -> torch.Tensor:
    v = spec.values_per_container
    s = torch.arange(v, dtype=torch.int64)
    if spec.bit_order == "msb":
        s = v - 1 - s
    return s * spec.bits


def _to_container(x: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """int64 holding an unsigned bit pattern -> container dtype (two's complement wrap)."""
    cbits = CONTAINERS[spec.container][1]
    if spec.container == "uint8":
        return x.to(torch.uint8)
    if cbits < 64:
        x = torch.where(x >= (1 << (cbits - 1)), x - (1 << cbits), x)
    return x.to(spec.torch_dtype)


def _from_container(x: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """container dtype -> int64 unsigned bit pattern."""
    cbits = CONTAINERS[spec.container][1]
    x = x.to(torch.int64)
    if spec.container != "uint8" and cbits < 64:
        x = x & ((1 << cbits) - 1)
    return x


def pack_codes(codes: torch.Tensor, spec: PackSpec) -> torch.Tensor:
    """codes int [N, K] (each in [0, 2**bits)) -> packed container tensor."""
    if codes.dim() != 2:
        raise FormatError(f"pack expects a 2-D code matrix, got shape {tuple(codes.shape)}")
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
    else:
        word = (gathered << _shifts(spec).to(work)).sum(-1, dtype=work)  # (rows, C)
    packed = _to_container(word, spec)
    if spec.pack_axis == 0:
        packed = packed.t()
    if spec.transposed:
        packed = packed.t()
    return packed.contiguous()


def _oriented(packed: torch.Tensor, spec: PackSpec, shape: tuple[int, int]) -> tuple[torch.Tensor, int]:
    """Validate ``packed`` against ``spec`` / ``shape``; return it as (rows, containers) with the
    pack axis last, and the logical length of that axis."""
    n, k = shape
    want = spec.packed_shape((n, k))
    if tuple(packed.shape) != tuple(want):
        raise FormatError(
            f"packed tensor has shape {tuple(packed.shape)}, a logical {n}x{k} matrix in this format "
            f"needs {want} (pack_axis={spec.pack_axis}, lanes={spec.lanes}, {spec.values_per_container}/container)")
    if packed.dtype != spec.torch_dtype:
        raise FormatError(f"packed tensor has dtype {packed.dtype}, format says {spec.container}")
    p = packed.t() if spec.transposed else packed
    if spec.pack_axis == 0:
        p = p.t()
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
    p, length = _oriented(packed, spec, shape)
    words = _from_container(p, spec)  # (rows, C)
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
    vals, unused = code_lut(spec)
    if CONTAINERS[spec.container][1] == 8:
        wide = bool((vals.abs() > 127).any())
        out, bad = _unpack_bytes(packed, spec, shape, torch.int16 if wide else torch.int8)
        if not (strict and bad):  # (an unused code under strict: the codes path below names it)
            return _narrow(out) if wide else out
    codes = unpack_codes(packed, spec, shape)  # wider containers, and the error report below
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
# scales


def expand_scale(scale: torch.Tensor, spec: ScaleSpec, shape: tuple[int, int], *,
                 rows: Optional[tuple[int, int]] = None, name: str = "scale") -> torch.Tensor:
    """Scale tensor -> float32 multiplier broadcastable to [N, K] (``divide`` inverted),
    for the row slice ``rows`` of a fused matrix.  Validates shape and finiteness."""
    n, k = shape
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
    else:
        g = -(-k // spec.group_size)
        if spec.transposed:
            s = s.t() if s.dim() == 2 else s
        if tuple(s.shape) != (n, g):
            raise FormatError(f"{name}: group scale {spec.key!r} must have shape {(n, g)} "
                              f"(group_size {spec.group_size}), has {tuple(scale.shape)}")
        m = s.repeat_interleave(spec.group_size, dim=1)[:, :k]
    if rows is not None and m.shape[0] > 1:
        m = m[rows[0]:rows[1]]
    if spec.op == "divide":
        if bool((m == 0).any()):
            raise FormatError(f"{name}: scale {spec.key!r} is zero but the format divides by it")
        m = 1.0 / m
    return m


# ---------------------------------------------------------------------------------------
# built-in conventions

#: transformers HF-BitNet ``pack_weights``: axis 0, blocked, 2-bit LSB-first, code = w + 1.
HF_BITNET = PackSpec(bits=2, container="uint8", pack_axis=0, lanes="blocked", bit_order="lsb",
                     codes=(-1, 0, 1, None))
#: The seed's layout: axis 1, 4 consecutive elements per byte LSB-first, 0->0, 1->+1, 2->-1.
SEED = PackSpec(bits=2, container="uint8", pack_axis=1, lanes="interleaved", bit_order="lsb",
                codes=(0, 1, -1, None))

BUILTIN: dict[str, PackSpec] = {"hf-bitnet": HF_BITNET, "seed": SEED}


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


def dumps(spec: PackSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)
