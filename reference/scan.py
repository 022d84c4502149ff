"""Checkpoint scanner: per-tensor statistics and a first classification (for ``reference.inspect``).

One tensor at a time through the memory-mapped ``Checkpoint`` reader, in bounded chunks, so a
multi-GB model is never held in memory.  For every tensor: dtype, shape, bytes, unique values
(capped), NaN/Inf count, zero ratio, magnitude statistics; for integer containers the histogram
of 2-bit fields per slot (``slot_hist[s][c]`` = how often code ``c`` sits in bits
``[2s, 2s+2)``) and of all 4- and 8-bit fields (``field_hist[bits]``); for 2-D floats the
distinct non-zero magnitudes (capped), which reveal unpacked ternary weights ``{-s, 0, +s}``
(TriLM) per tensor, shard or row.

Kinds: ``packed`` (integer container of low-bit codes), ``ternary_float``, ``scale``,
``zero_point``, ``index`` (GPTQ g_idx), ``shape`` (compressed-tensors weight_shape), ``float``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .checkpoint import Checkpoint, CheckpointError

INT_DTYPES = {"U8": 8, "I8": 8, "I16": 16, "U16": 16, "I32": 32, "U32": 32, "I64": 64, "U64": 64}
#: a packed weight's safetensors dtype -> the PackSpec container that reads it; U16 / U32 / U64 hold the bit patterns
#: of I16 / I32 / I64 (numpy writers pack 2-bit codes into uint32 as readily as into int32): read bit for bit as
#: the signed container (reference.formats._from_container views them first)
CONTAINER_OF = {"U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
                "U16": "int16", "U32": "int32", "U64": "int64"}
UNIQUE_CAP = 16
CHUNK = 1 << 20  # elements per chunk
FIELD_BITS = (2, 4, 8)  # code widths the inspector considers (field_hist)


@dataclass
class TensorStats:
    name: str
    file: str
    dtype: str  # safetensors dtype string
    shape: tuple
    nbytes: int
    kind: str = "float"
    unique: list = field(default_factory=list)  # sorted, at most UNIQUE_CAP values
    n_unique: int = 0  # UNIQUE_CAP + 1 means "more than the cap"
    n_nonfinite: int = 0
    n_zero: int = 0
    absmax: float = 0.0
    absmean: float = 0.0
    slot_hist: Optional[list] = None  # [V][4] 2-bit field counts (integer containers)
    field_hist: dict = field(default_factory=dict)  # bits (2, 4, 8) -> counts of every bits-wide field
    magnitudes: Optional[list] = None  # distinct non-zero |values| of a 2-D float, if <= UNIQUE_CAP
    row_constant: bool = False  # every row of a 2-D float has a single non-zero magnitude
    zero_ratio_decoded: Optional[float] = None  # filled by the inspector after decoding

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def zero_ratio(self) -> float:
        if self.zero_ratio_decoded is not None:
            return self.zero_ratio_decoded
        return self.n_zero / max(1, self.numel)

    @property
    def leaf(self) -> str:
        return self.name.rsplit(".", 1)[-1].lower()

    @property
    def code_hist(self) -> Optional[list]:
        if self.slot_hist is None:
            return None
        return [sum(s[c] for s in self.slot_hist) for c in range(4)]

    def hist(self, bits: int) -> Optional[list]:
        """Counts of every ``bits``-wide field value over all slots (integer containers)."""
        if bits == 2:
            return self.code_hist
        return self.field_hist.get(bits)

    def unique_str(self) -> str:
        if not self.unique:
            return "-"
        vals = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in self.unique[:6])
        more = " ..." if self.n_unique > 6 else ""
        n = f">{UNIQUE_CAP}" if self.n_unique > UNIQUE_CAP else str(self.n_unique)
        return f"{n}: {vals}{more}"


def _chunks(flat: torch.Tensor):
    for i in range(0, flat.numel(), CHUNK):
        yield flat[i:i + CHUNK]


def _unsigned(x: torch.Tensor, bits: int) -> torch.Tensor:
    x = x.to(torch.int64)
    return x & ((1 << bits) - 1) if bits < 64 else x


def scan_tensor(ckpt: Checkpoint, name: str) -> TensorStats:
    info = ckpt.info(name)
    return tensor_stats(ckpt.get(name), name, str(info.file), info.dtype, info.nbytes)


def tensor_stats(t: torch.Tensor, name: str, file: str, dtype: str, nbytes: int) -> TensorStats:
    """The statistics of ``t`` read as the safetensors ``dtype`` (``scan_tensor`` of a stored tensor; the inspector
    also scans the integer view of an HQQ view_as_float W_q through it)."""
    st = TensorStats(name, file, dtype, tuple(t.shape), nbytes)
    info = st
    flat = t.reshape(-1)
    uniq: set = set()
    is_int = info.dtype in INT_DTYPES
    if is_int:
        bits = INT_DTYPES[info.dtype]
        v = bits // 2
        hist = torch.zeros(v, 4, dtype=torch.int64)
        for c in _chunks(flat):
            u = _unsigned(c, bits)
            for s in range(v):
                hist[s] += torch.bincount(((u >> (2 * s)) & 3).reshape(-1), minlength=4)
            if len(uniq) <= UNIQUE_CAP:
                uniq.update(torch.unique(c.to(torch.int64)).tolist())
            st.n_zero += int((c == 0).sum())
            st.absmax = max(st.absmax, float(c.to(torch.int64).abs().max()) if c.numel() else 0.0)
        st.slot_hist = hist.tolist()
        st.field_hist[2] = [int(x) for x in hist.sum(0).tolist()]
        for b in FIELD_BITS:
            if bits % b == 0 and b != 2:
                h = torch.zeros(1 << b, dtype=torch.int64)
                for c in _chunks(flat):
                    u = _unsigned(c, bits)
                    for s in range(bits // b):
                        h += torch.bincount(((u >> (b * s)) & ((1 << b) - 1)).reshape(-1), minlength=1 << b)
                st.field_hist[b] = h.tolist()
    else:
        total = 0.0
        for c in _chunks(flat):
            cf = c.to(torch.float32)
            fin = torch.isfinite(cf)
            st.n_nonfinite += int((~fin).sum())
            cf = torch.where(fin, cf, torch.zeros_like(cf))
            st.n_zero += int((c == 0).sum())
            if cf.numel():
                st.absmax = max(st.absmax, float(cf.abs().max()))
            total += float(cf.abs().sum(dtype=torch.float64))
            if len(uniq) <= UNIQUE_CAP:
                uniq.update(torch.unique(cf).tolist())
        st.absmean = total / max(1, flat.numel())
        if t.dim() == 2 and t.numel():
            _float_structure(t, st)
    st.n_unique = min(len(uniq), UNIQUE_CAP + 1)
    st.unique = sorted(uniq)[:UNIQUE_CAP]
    st.kind = classify(st)
    return st


def bool_as_u8_stats(st: TensorStats) -> TensorStats:
    """The statistics ``tensor_stats`` takes of a BOOL tensor's bytes read as U8 (``t.view(torch.uint8)``), derived
    from its BOOL scan without reading it again: every byte is 0 or 1, so the zero count decides every field
    histogram (an inspector reading a sign-bitmask pair of bool masks as one flag per byte)."""
    if st.dtype != "BOOL":
        raise ValueError(f"{st.file}: tensor {st.name!r}: dtype {st.dtype}, expected BOOL")
    n = st.numel
    zero, one = st.n_zero, n - st.n_zero
    out = TensorStats(st.name, st.file, "U8", st.shape, st.nbytes)
    out.unique = [int(v) for v in st.unique]
    out.n_unique, out.n_zero = st.n_unique, zero
    out.absmax = 1.0 if one else 0.0
    out.slot_hist = [[zero, one, 0, 0]] + [[n, 0, 0, 0] for _ in range(3)]
    out.field_hist[2] = [zero + 3 * n, one, 0, 0]
    out.field_hist[4] = [zero + n, one] + [0] * 14
    out.field_hist[8] = [zero, one] + [0] * 254
    out.kind = classify(out)
    return out


def _float_structure(t: torch.Tensor, st: TensorStats) -> None:
    """Distinct non-zero magnitudes (capped) and whether each row has a single one."""
    head = t[: min(4, t.shape[0])].to(torch.float32).abs()
    if torch.unique(head[head > 0]).numel() > 4 * UNIQUE_CAP:
        return  # dense float weights: skip the full pass
    mags: set = set()
    row_const = True
    for i in range(0, t.shape[0], max(1, CHUNK // max(1, t.shape[1]))):
        a = t[i:i + max(1, CHUNK // max(1, t.shape[1]))].to(torch.float32).abs()  # (rows, K)
        big = torch.where(a > 0, a, torch.full_like(a, float("inf")))
        lo = big.min(dim=1).values
        hi = a.max(dim=1).values
        has = hi > 0
        if bool((lo[has] != hi[has]).any()):
            row_const = False
        if len(mags) <= UNIQUE_CAP:
            mags.update(torch.unique(a[a > 0]).tolist())
        if not row_const and len(mags) > UNIQUE_CAP:
            return
    st.row_constant = row_const
    if len(mags) <= UNIQUE_CAP:
        st.magnitudes = sorted(mags)


def classify(st: TensorStats) -> str:
    leaf = st.leaf
    if st.dtype in INT_DTYPES:
        if "shape" in leaf and len(st.shape) == 1 and st.numel <= 4:
            return "shape"
        if "g_idx" in leaf or leaf in ("perm", "group_idx"):
            return "index"
        if "zero" in leaf:
            return "zero_point"
        if len(st.shape) == 2:
            return "packed"
        return "other_int"
    if "g_idx" in leaf:  # a group index stored as floats: named by its key, refused by formats.group_index
        return "index"
    if "scale" in leaf or leaf in ("scales", "alpha", "s", "weight_s"):
        return "scale"
    if "zero" in leaf:
        return "zero_point"
    if len(st.shape) == 2 and (st.row_constant or (st.magnitudes is not None and len(st.magnitudes) <= 8)) \
            and st.n_zero > 0 and min(st.shape) > 1:
        return "ternary_float"
    return "float"


def scan(ckpt: Checkpoint) -> dict[str, TensorStats]:
    """Scan every tensor (one at a time).  Read failures name file and tensor."""
    out = {}
    for name in ckpt.keys():
        try:
            out[name] = scan_tensor(ckpt, name)
        except CheckpointError:
            raise
        except (RuntimeError, ValueError, OverflowError) as e:
            raise CheckpointError(f"{ckpt.info(name).file}: tensor {name!r}: cannot scan ({e})") from e
    return out
