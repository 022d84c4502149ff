"""Strict reader of llama.cpp GGUF files (v2 / v3, little-endian), presented as a safetensors checkpoint.

    python -m reference.gguf MODEL.gguf OUTDIR     # writes OUTDIR/model.safetensors + config.json

Everything in the header is validated before any tensor data is read: the magic, the version (v1, big-endian and
unknown versions are refused by name), every count and string length against the bytes left in the file, the 13
metadata value types (nested arrays included), duplicate keys and tensor names, each tensor's dims, its ggml type
(unknown ids are named with the tensor) and its byte size from the type's block size and type size, the alignment
(``general.alignment``, default 32), each tensor's offset and end inside the aligned data section (a truncated file
names the tensor, the bytes it needs and the bytes there are) and overlaps.  Errors are ``CheckpointError``s naming
the file and the tensor (or key).

Presentation (``GGUFModel``), so that the inspector / synth conventions (GGUF tensor names, ``NAME_SCHEMES['gguf']``)
apply unchanged:
  * F32 / F16 / BF16 / F64 / I8..I64: torch tensors of that dtype, dims in HF order (GGUF lists ne[0], the innermost
    dim, first: reversed).
  * TQ2_0 (type 35) / TQ1_0 (34): the raw blocks as uint8 [N, K/256 * 66] / [N, K/256 * 54] per row, exactly the
    tensor reference.synth's ``w_tq2_0`` / ``w_tq1_0`` write (records with the fp16 ``d`` inside).
  * I2_S (bitnet.cpp, type 36; see ``I2S_TYPE``): uint8 [N, K/4] packed codes under the weight's name plus its
    per-tensor float32 scale as ``<base>.scale`` [1], as ``synth.w_i2s`` presents I2_S.
  * every other quantized type llama.cpp writes (Q8_0, Q4_K, Q6_K, ... e.g. on token_embd / output of TQ files):
    dequantized to float32 with gguf-py (``gguf.quants.dequantize``, imported only when such a tensor is read).
  * llama.cpp's converters permute the rows of q_proj / k_proj of some architectures for its rotary layout; that is
    undone (``ROPE_PERMUTED``), so every tensor holds the HF checkpoint's rows.
The HF config.json is synthesised from the metadata (``config_from_metadata``).  A llama.cpp split set
(``NAME-0000i-of-0000N.gguf``) is one model: ``split_parts`` finds every part, ``GGUFModel`` reads each part's tensors
(the metadata from part 1) and checks the numbering.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .checkpoint import CheckpointError, TensorInfo, lfs_pointer_error

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 16  # nested metadata arrays (a guard against a recursion bomb; llama.cpp writes depth 1)

# gguf_type (ggml/include/gguf.h): the 13 metadata value types: struct format, size
VALUE_TYPES = {0: ("UINT8", "B", 1), 1: ("INT8", "b", 1), 2: ("UINT16", "H", 2), 3: ("INT16", "h", 2),
               4: ("UINT32", "I", 4), 5: ("INT32", "i", 4), 6: ("FLOAT32", "f", 4), 7: ("BOOL", "B", 1),
               8: ("STRING", None, 8), 9: ("ARRAY", None, 12), 10: ("UINT64", "Q", 8), 11: ("INT64", "q", 8),
               12: ("FLOAT64", "d", 8)}
T_STRING, T_ARRAY = 8, 9

#: ggml types (ggml/include/ggml.h enum ggml_type, as gguf-py 0.19's GGML_QUANT_SIZES): id -> (name, block size,
#: bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
#: bitnet.cpp's I2_S (its llama.cpp fork, ggml/include/ggml.h: GGML_TYPE_I2_S = 36; ggml.c type_traits: blck_size 1,
#: type_size 1, and ggml_nbytes special-cases it to ne/4 + 32).  Layout (utils/convert-hf-to-gguf-bitnet.py and
#: utils/convert-bitnet-embedding-to-gguf.py ``quantize_to_i2_s``; src/ggml-bitnet-mad.cpp ``quantize_i2_s`` on x86
#: with ACT_PARALLEL, which include/gemm-config.h defines): the whole tensor flattened in blocks of 128 values, byte
#: j of a block's 32 = values j, 32+j, 64+j, 96+j at bits 7-6, 5-4, 3-2, 1-0, code 0 = -1, 1 = 0, 2 = +1; then a
#: 32-byte tail whose first 4 bytes are the float32 per-tensor scale (W = code value * scale).
I2S_TYPE = 36
I2S_BLOCK = 128
I2S_TAIL = 32
#: ids we know and refuse, by name (why in the message)
REFUSED_TYPES = {
    4: ("Q4_2", "removed from ggml in 2023; no current reader decodes it"),
    5: ("Q4_3", "removed from ggml in 2023; no current reader decodes it"),
    31: ("Q4_0_4_4", "an online-repacked ARM layout removed from ggml (requantize the model to Q4_0)"),
    32: ("Q4_0_4_8", "an online-repacked ARM layout removed from ggml (requantize the model to Q4_0)"),
    33: ("Q4_0_8_8", "an online-repacked ARM layout removed from ggml (requantize the model to Q4_0)"),
    37: ("I8_S", "bitnet.cpp's activation type, not a weight format"),
    38: ("TL1", "bitnet.cpp's lookup-table layout, tiled for one kernel preset (utils/codegen_tl1.py); convert the "
               "model to I2_S or TQ2_0"),
}
#: id 39 is MXFP4 upstream but TL2 in bitnet.cpp's fork (ggml.h GGML_TYPE_TL2 = 39): in a bitnet.cpp architecture it is
#: refused as TL2
TL2_NOTE = ("bitnet.cpp's TL2 lookup-table layout (type 39 in its fork; MXFP4 upstream), tiled for one kernel preset "
            "(utils/codegen_tl2.py); convert the model to I2_S or TQ2_0")
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
                "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}
RECORD_TYPES = ("TQ1_0", "TQ2_0")  # presented as their raw uint8 records

#: general.architecture -> (HF model_type, HF class, default hidden_act, q/k rows permuted by the converter)
#: Provenance of the permutation flags:
#:  * llama: convert_hf_to_gguf.py ``LlamaModel.modify_tensors`` permutes q_proj (n_head, n_head) and k_proj (n_head,
#:    n_head_kv) with ``LlamaModel.permute`` (ggml-org/llama.cpp; the same in microsoft/BitNet's
#:    utils/convert-hf-to-gguf-bitnet.py ``LlamaModel`` used for Llama3-8B-1.58); llama.cpp runs it with
#:    LLAMA_ROPE_TYPE_NORM (adjacent pairs).
#:  * bitnet: upstream ``BitnetModel.modify_tensors`` (convert_hf_to_gguf.py, conversion/bitnet.py) only ternarises
#:    and renames; llama_model_rope_type gives LLM_ARCH_BITNET LLAMA_ROPE_TYPE_NEOX (HF's rotate_half order), also in
#:    bitnet.cpp's fork.  FFN activation: SiLU unless ``bitnet.hidden_activation`` says otherwise (llama.cpp
#:    src/models/bitnet.cpp load_arch_hparams; bitnet.cpp's build_bitnet uses SiLU).
#:  * bitnet-b1.58 / bitnet-25 (bitnet.cpp's fork only, src/llama-arch.cpp names LLM_ARCH_BITNET_B158 / _25):
#:    utils/convert-hf-to-gguf-bitnet.py ``BitnetModel`` (MODEL_ARCH.BITNET_B158) does not permute, and
#:    utils/convert-ms-to-gguf-bitnet.py (MODEL_ARCH.BITNET_25) has its permute calls commented out; both run
#:    build_bitnet_158, whose FFN is LLM_FFN_RELU_SQR (relu2).
ARCHS: dict[str, tuple[str, str, str, bool]] = {
    "llama": ("llama", "LlamaForCausalLM", "silu", True),
    "bitnet": ("bitnet", "BitNetForCausalLM", "silu", False),
    "bitnet-b1.58": ("bitnet", "BitNetForCausalLM", "relu2", False),
    "bitnet-25": ("bitnet", "BitNetForCausalLM", "relu2", False),
}
BITNET_CPP_ARCHS = ("bitnet-b1.58", "bitnet-25")
SPLIT_RE = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")
ACTS = {"silu": "silu", "swiglu": "silu", "relu2": "relu2", "relu_sqr": "relu2", "relu_squared": "relu2",
        "gelu": "gelu", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] innermost
    type_id: int
    type_name: str
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.ne)

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, int]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_start: int


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int, what: str) -> None:
        left = len(self.buf) - self.pos
        if n > left:
            raise CheckpointError(f"{self.path}: {what} needs {n} bytes at offset {self.pos}, but the file has only "
                                  f"{left} left (truncated or corrupt GGUF)")

    def unpack(self, fmt: str, size: int, what: str):
        self.need(size, what)
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str) -> str:
        n = self.unpack("Q", 8, f"{what} length")
        self.need(n, f"{what} ({n}-byte string)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.path}: {what} is not valid UTF-8 ({e})") from None


def _value(c: _Cursor, vtype: int, what: str, depth: int = 0):
    if vtype not in VALUE_TYPES:
        raise CheckpointError(f"{c.path}: {what} has unknown value type {vtype} (GGUF defines 0..12)")
    name, fmt, size = VALUE_TYPES[vtype]
    if vtype == T_STRING:
        return c.string(what)
    if vtype == T_ARRAY:
        if depth >= MAX_NESTING:
            raise CheckpointError(f"{c.path}: {what}: arrays nested deeper than {MAX_NESTING}")
        etype = c.unpack("I", 4, f"{what} element type")
        n = c.unpack("Q", 8, f"{what} element count")
        if etype not in VALUE_TYPES:
            raise CheckpointError(f"{c.path}: {what} is an array of unknown value type {etype} (GGUF defines 0..12)")
        _, efmt, esize = VALUE_TYPES[etype]
        c.need(n * esize, f"{what} (array of {n} {VALUE_TYPES[etype][0]}, at least {esize} bytes each)")
        if efmt is not None:  # fixed-size elements: one unpack
            vals = list(struct.unpack_from(f"<{n}{efmt}", c.buf, c.pos))
            c.pos += n * esize
            if etype == 7:
                if any(v > 1 for v in vals):
                    raise CheckpointError(f"{c.path}: {what}: a BOOL array element is not 0 or 1")
                vals = [bool(v) for v in vals]
            return vals
        return [_value(c, etype, f"{what}[{i}]", depth + 1) for i in range(n)]
    v = c.unpack(fmt, size, what)
    if vtype == 7:
        if v > 1:
            raise CheckpointError(f"{c.path}: {what}: BOOL value {v} is not 0 or 1")
        return bool(v)
    return v


def _type_of(tid: int, name: str, path: Path, arch: Optional[str]) -> tuple[str, int, int]:
    if tid == I2S_TYPE:
        return "I2_S", 1, 1
    if tid == 39 and arch in BITNET_CPP_ARCHS:
        raise CheckpointError(f"{path}: tensor {name!r}: ggml type 39 in a {arch} (bitnet.cpp) model is {TL2_NOTE}")
    if tid in REFUSED_TYPES:
        tname, why = REFUSED_TYPES[tid]
        raise CheckpointError(f"{path}: tensor {name!r}: ggml type {tid} ({tname}) is not read: {why}")
    if tid not in GGML_TYPES:
        raise CheckpointError(f"{path}: tensor {name!r}: unknown ggml type id {tid} (known: "
                              f"{', '.join(f'{k} {v[0]}' for k, v in sorted(GGML_TYPES.items()))}, {I2S_TYPE} I2_S)")
    return GGML_TYPES[tid]


def read_gguf(path) -> GGUFFile:
    """Parse and validate a GGUF file's header, metadata and tensor infos (no tensor data is read)."""
    path = Path(path)
    size = path.stat().st_size
    lfs = lfs_pointer_error(path, "GGUF file")
    if lfs is not None:
        raise lfs
    if size < 24:
        raise CheckpointError(f"{path}: {size} bytes, too short for a GGUF file (magic, version, two counts)")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buf, path, size)
    finally:
        buf.close()


def _parse(buf, path: Path, size: int) -> GGUFFile:
    c = _Cursor(buf, path)
    magic = bytes(buf[:4])
    if magic != MAGIC:
        raise CheckpointError(f"{path}: bad magic {magic!r}, expected {MAGIC!r}: not a GGUF file")
    c.pos = 4
    version = c.unpack("I", 4, "version")
    if version not in VERSIONS:
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in (1, 2, 3):
            raise CheckpointError(f"{path}: big-endian GGUF (version field reads {version:#x}, version {swapped} "
                                  f"byte-swapped): only little-endian files are read; convert it back (gguf-py's "
                                  f"gguf_convert_endian.py)")
        if version == 1:
            raise CheckpointError(f"{path}: GGUF version 1 (32-bit counts, before August 2023) is not read; "
                                  f"only versions 2 and 3")
        raise CheckpointError(f"{path}: unknown GGUF version {version}; only versions 2 and 3 are read")
    n_tensors = c.unpack("Q", 8, "tensor count")
    n_kv = c.unpack("Q", 8, "metadata count")
    # each key-value needs >= 12 bytes (key length + type), each tensor info >= 24 (name length, n_dims, type,
    # offset): a count the file cannot hold is corruption, not a reason to loop for ever
    if n_kv * 12 > size - c.pos:
        raise CheckpointError(f"{path}: metadata count {n_kv} cannot fit in the {size - c.pos} bytes left")
    if n_tensors * 24 > size - c.pos:
        raise CheckpointError(f"{path}: tensor count {n_tensors} cannot fit in the {size - c.pos} bytes left")
    meta: dict[str, Any] = {}
    vtypes: dict[str, int] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key #{i}")
        vtype = c.unpack("I", 4, f"metadata {key!r} value type")
        if key in meta:
            raise CheckpointError(f"{path}: metadata key {key!r} appears twice")
        meta[key] = _value(c, vtype, f"metadata {key!r}")
        vtypes[key] = vtype
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    raw = []
    for i in range(n_tensors):
        name = c.string(f"tensor info #{i} name")
        n_dims = c.unpack("I", 4, f"tensor {name!r} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise CheckpointError(f"{path}: tensor {name!r}: {n_dims} dimensions (ggml allows 1..{MAX_DIMS})")
        ne = tuple(c.unpack("Q", 8, f"tensor {name!r} dim {j}") for j in range(n_dims))
        if any(d >= 1 << 63 for d in ne) or math.prod(ne) >= 1 << 62:
            raise CheckpointError(f"{path}: tensor {name!r}: dims {list(ne)} overflow ggml's int64 element count")
        tid = c.unpack("I", 4, f"tensor {name!r} type")
        off = c.unpack("Q", 8, f"tensor {name!r} offset")
        raw.append((name, ne, tid, off))
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in meta and vtypes["general.alignment"] != 4:
        raise CheckpointError(f"{path}: general.alignment has value type {VALUE_TYPES[vtypes['general.alignment']][0]}"
                              f", expected UINT32")
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise CheckpointError(f"{path}: general.alignment {alignment!r} is not a positive power of two")
    data_start = -(-c.pos // alignment) * alignment
    if data_start > size and n_tensors:
        raise CheckpointError(f"{path}: the data section would start at byte {data_start}, past the end of the "
                              f"{size}-byte file (truncated)")
    tensors: dict[str, GGUFTensor] = {}
    for name, ne, tid, off in raw:
        if name in tensors:
            raise CheckpointError(f"{path}: tensor {name!r} appears twice in the tensor infos")
        tname, block, tsize = _type_of(tid, name, path, arch)
        numel = math.prod(ne)
        if tid == I2S_TYPE:
            if numel % 4:
                raise CheckpointError(f"{path}: tensor {name!r}: I2_S with {numel} values (not a multiple of 4)")
            nbytes = numel // 4 + I2S_TAIL
        else:
            if ne[0] % block:
                raise CheckpointError(f"{path}: tensor {name!r}: {tname} packs blocks of {block} values, but ne[0] = "
                                      f"{ne[0]} is not a multiple of {block}")
            nbytes = numel // block * tsize
        if off % alignment:
            raise CheckpointError(f"{path}: tensor {name!r}: data offset {off} is not a multiple of the alignment "
                                  f"{alignment}")
        start = data_start + off
        if start + nbytes > size:
            have = max(0, size - start)
            raise CheckpointError(f"{path}: tensor {name!r} ({tname} {list(ne)}): expected {nbytes} bytes at file "
                                  f"offset {start}, but only {have} are available (truncated file?)")
        tensors[name] = GGUFTensor(name, ne, tid, tname, start, nbytes)
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"{path}: tensors {n0!r} (bytes {b0}..{e0}) and {n1!r} (bytes {b1}..{e1}) overlap "
                                  f"in the data section")
    return GGUFFile(path, version, meta, vtypes, tensors, alignment, data_start)


# ---------------------------------------------------------------------------------------
# presentation


def permute_rows(rows: int, n_head: int) -> torch.Tensor:
    """Row order of llama.cpp's ``LlamaModel.permute(W, n_head, ...)`` (convert_hf_to_gguf.py): row r of the
    converted tensor is row ``perm[r]`` of the HF one.  ``W.reshape(n_head, 2, rows // n_head // 2, ...)
    .swapaxes(1, 2)`` puts the two rotary halves of each head side by side (adjacent pairs)."""
    return torch.arange(rows).reshape(n_head, 2, rows // n_head // 2).transpose(1, 2).reshape(-1)


def unpermute_rows(rows: int, n_head: int) -> torch.Tensor:
    """The inverse: ``hf = gguf[unpermute_rows(...)]``."""
    return torch.argsort(permute_rows(rows, n_head))


class GGUFModel:
    """One GGUF model file presented as safetensors-style tensors (``infos``: {name: TensorInfo}, ``get``)."""

    def __init__(self, path):
        self.path = Path(path)
        self.parts = split_parts(self.path)  # [path] for one file; every part of a llama.cpp split set, in order
        self.file = read_gguf(self.parts[0])
        self._file_of: dict[str, Path] = {t: self.parts[0] for t in self.file.tensors}
        if len(self.parts) > 1:
            self._read_split()
        meta = self.file.metadata
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(f"{self.path}: no general.architecture string in the metadata")
        if arch not in ARCHS:
            raise CheckpointError(f"{self.path}: general.architecture {arch!r} is not supported (read: "
                                  f"{', '.join(ARCHS)})")
        self.arch = arch
        self.infos: dict[str, TensorInfo] = {}
        self._src: dict[str, tuple[str, GGUFTensor]] = {}
        self._perm: dict[str, int] = {}  # presented name -> head count whose rope permutation is undone
        for t in self.file.tensors.values():
            self._present(t)
        self._tok = None  # tokenizer(): the built tokenizer or the CheckpointError saying why there is none
        self._rope = None  # rope_parameters recovered from rope_freqs.weight (llama3), consumed, not presented
        if "rope_freqs.weight" in self.infos:
            self._rope = self._llama3_rope()
            del self.infos["rope_freqs.weight"], self._src["rope_freqs.weight"]
        for name, (kind, t) in self._src.items():
            if kind == "records" and name.endswith(".weight") and name[:-7] + ".scale" in self._src:
                raise CheckpointError(f"{self.path}: tensor {name!r} ({t.type_name}) has a separate per-tensor scale "
                                      f"{name[:-7] + '.scale'!r} on top of its in-block d: not presented")
        if ARCHS[arch][3]:
            self._rope_rows()

    def _read_split(self) -> None:
        """The tensors of every part of a split set (llama.cpp's gguf-split / gguf-py ``split_max_*``: part i has
        ``split.no`` i - 1 and ``split.count`` N; the model's metadata lives in the first part), checked: counts,
        numbering, no tensor in two parts, the total against ``split.tensors.count``."""
        n = len(self.parts)
        tensors = dict(self.file.tensors)
        for i, part in enumerate(self.parts):
            f = self.file if i == 0 else read_gguf(part)
            no, count = f.metadata.get("split.no"), f.metadata.get("split.count")
            if no != i or count != n:
                raise CheckpointError(f"{part}: split.no {no!r} / split.count {count!r}, but it is part {i + 1} of the "
                                      f"{n} files named {self.parts[0].name} .. {self.parts[-1].name} (expected "
                                      f"split.no {i}, split.count {n})")
            if i == 0:
                continue
            for name, t in f.tensors.items():
                if name in tensors:
                    raise CheckpointError(f"{part}: tensor {name!r} is also in {self._file_of[name]}")
                tensors[name] = t
                self._file_of[name] = part
        total = self.file.metadata.get("split.tensors.count")
        if total is not None and total != len(tensors):
            raise CheckpointError(f"{self.parts[0]}: split.tensors.count {total}, but the {n} parts hold "
                                  f"{len(tensors)} tensors")
        self.file = dataclasses.replace(self.file, tensors=tensors)

    def _add(self, name: str, kind: str, t: GGUFTensor, dtype: str, shape: tuple[int, ...], nbytes: int) -> None:
        if name in self.infos:
            raise CheckpointError(f"{self.path}: tensor {name!r} is both stored in the file and the scale of the "
                                  f"I2_S weight {name[:-len('.scale')] + '.weight'!r} (presented under that name)")
        self.infos[name] = TensorInfo(name, dtype, shape, self._file_of[t.name], nbytes)
        self._src[name] = (kind, t)

    def _present(self, t: GGUFTensor) -> None:
        shape = t.hf_shape
        if t.type_name in FLOAT_DTYPES:
            self._add(t.name, "raw", t, t.type_name, shape, t.nbytes)
        elif t.type_name in RECORD_TYPES:
            _, block, tsize = GGML_TYPES[t.type_id]
            pshape = shape[:-1] + (shape[-1] // block * tsize,)
            self._add(t.name, "records", t, "U8", pshape, t.nbytes)
        elif t.type_name == "I2_S":
            if len(shape) != 2 or shape[1] % I2S_BLOCK:
                raise CheckpointError(
                    f"{self.path}: tensor {t.name!r}: I2_S {list(shape)} is read only as a matrix whose rows are whole "
                    f"{I2S_BLOCK}-value blocks (K % {I2S_BLOCK} == 0); bitnet.cpp's blocks run over the flattened "
                    f"tensor, so other shapes straddle rows")
            if not t.name.endswith(".weight"):
                raise CheckpointError(f"{self.path}: tensor {t.name!r}: an I2_S tensor not named '<module>.weight'")
            self._add(t.name, "i2s", t, "U8", (shape[0], shape[1] // 4), t.numel // 4)
            self._add(t.name[:-len(".weight")] + ".scale", "i2s_scale", t, "F32", (1,), 4)
        else:
            self._add(t.name, "dequant", t, "F32", shape, t.numel * 4)

    def _rope_rows(self) -> None:
        meta = self.file.metadata
        heads = meta.get(f"{self.arch}.attention.head_count")
        kv = meta.get(f"{self.arch}.attention.head_count_kv", heads)
        if isinstance(heads, list) or isinstance(kv, list):
            raise CheckpointError(f"{self.path}: per-layer head counts ({self.arch}.attention.head_count as an "
                                  f"array) are not read")
        for name in self.infos:
            m = re.match(r"blk\.\d+\.attn_([qk])\.(weight|bias)$", name)
            if not m:
                continue
            n_head = heads if m.group(1) == "q" else kv
            if not isinstance(n_head, int) or n_head < 1:
                raise CheckpointError(f"{self.path}: tensor {name!r}: {self.arch}.attention.head_count"
                                      f"{'' if m.group(1) == 'q' else '_kv'} is {n_head!r}; needed to undo llama.cpp's "
                                      f"rotary row permutation")
            rows = self.infos[name].shape[0]
            if rows % (2 * n_head):
                raise CheckpointError(f"{self.path}: tensor {name!r}: {rows} rows do not split into {n_head} heads of "
                                      f"an even size (llama.cpp's rotary permutation)")
            self._perm[name] = n_head

    def _bytes(self, t: GGUFTensor, offset: int = 0, n: Optional[int] = None) -> bytearray:
        n = t.nbytes - offset if n is None else n
        path = self._file_of[t.name]
        with open(path, "rb") as f:
            f.seek(t.offset + offset)
            data = bytearray(f.read(n))
        if len(data) != n:
            raise CheckpointError(f"{path}: tensor {t.name!r}: read {len(data)} of {n} bytes (file changed?)")
        return data

    def kind(self, name: str) -> str:
        """How tensor ``name`` is presented: "raw" (a float tensor), "records" (TQ2_0 / TQ1_0 blocks), "i2s" (the
        packed codes of an I2_S weight), "i2s_scale" (its per-tensor scale), ... (see ``_present``)."""
        if name not in self._src:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        return self._src[name][0]

    def get(self, name: str) -> torch.Tensor:
        if name not in self._src:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        kind, t = self._src[name]
        info = self.infos[name]
        if kind == "raw":
            out = torch.frombuffer(self._bytes(t), dtype=FLOAT_DTYPES[t.type_name]).reshape(info.shape)
        elif kind in ("records", "i2s"):
            out = torch.frombuffer(self._bytes(t, 0, info.nbytes), dtype=torch.uint8).reshape(info.shape)
        elif kind == "i2s_scale":
            out = torch.frombuffer(self._bytes(t, t.numel // 4, 4), dtype=torch.float32).reshape(1)
        else:
            out = self._dequantize(t).reshape(info.shape)
        if name in self._perm:
            out = out[unpermute_rows(out.shape[0], self._perm[name])]
        return out.contiguous()

    def _dequantize(self, t: GGUFTensor) -> torch.Tensor:
        try:
            import numpy as np
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import dequantize
        except ImportError as e:
            raise CheckpointError(f"{self.path}: tensor {t.name!r} is {t.type_name}: dequantizing it needs the "
                                  f"'gguf' package (llama.cpp's gguf-py; pip install gguf): {e}") from None
        _, block, tsize = GGML_TYPES[t.type_id]
        data = np.frombuffer(self._bytes(t), dtype=np.uint8).reshape(-1, t.ne[0] // block * tsize)
        try:
            out = dequantize(data, GGMLQuantizationType(t.type_id))
        except (NotImplementedError, ValueError) as e:
            raise CheckpointError(f"{self.path}: tensor {t.name!r}: cannot dequantize {t.type_name} ({e})") from None
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    def config(self) -> dict:
        return config_from_metadata(self.file.metadata, self.infos, self.path, rope=self._rope)

    def _llama3_rope(self) -> dict:
        """rope_parameters of the llama3 scaling whose frequency factors ``rope_freqs.weight`` holds, bit for bit:
        llama.cpp's converter (convert_hf_to_gguf.py ``LlamaModel.generate_extra_tensors``, Llama 3.1 / 3.2) writes
        them from the HF config's factor, low / high_freq_factor and original_max_position_embeddings, and the
        metadata keeps none of those.  ``llama3_rope_factors`` transcribes the converter; the factor is the largest
        stored value and the other three are searched over the values Llama 3.x use and their neighbours (they enter
        only as the wavelength thresholds old / low and old / high, so the first exact match is the scaling itself,
        whichever spelling of it); a tensor no candidate reproduces exactly is refused by name."""
        meta, arch = self.file.metadata, self.arch
        rf = self.get("rope_freqs.weight").float().reshape(-1)
        theta = meta.get(f"{arch}.rope.freq_base", 10000.0)
        heads = meta.get(f"{arch}.attention.head_count")
        dim = meta.get(f"{arch}.rope.dimension_count") or meta.get(f"{arch}.attention.key_length") or (
            meta.get(f"{arch}.embedding_length", 0) // heads if isinstance(heads, int) and heads else 0)
        where = f"{self.path}: tensor 'rope_freqs.weight'"
        if not isinstance(dim, int) or dim < 2 or rf.numel() != dim // 2:
            raise CheckpointError(f"{where}: {rf.numel()} frequency factors, expected head_dim / 2 = {dim // 2}")
        factor = float(rf.max())
        for old in (8192, 4096, 16384, 2048, 32768, 131072):
            for low in (1.0, 2.0, 0.5, 4.0):
                for high in (4.0, 8.0, 2.0, 1.0, 16.0):
                    if high <= low:
                        continue
                    if torch.equal(llama3_rope_factors(theta, dim, factor, low, high, old), rf):
                        return {"rope_type": "llama3", "rope_theta": _f32_decimal(theta), "factor": _f32_decimal(factor),
                                "low_freq_factor": low, "high_freq_factor": high,
                                "original_max_position_embeddings": old}
        raise CheckpointError(f"{where}: frequency factors (max {factor:g}) that no llama3 rope scaling reproduces "
                              f"(factor = the max, low_freq_factor 0.5-4, high_freq_factor 1-16, "
                              f"original_max_position_embeddings 2048-131072 tried); not read")

    def tokenizer(self):
        """The tokenizer the metadata describes (``tokenizer.ggml.*``: llama.cpp's vocabulary, merges, token types and
        pre-tokenizer name) as a ``tokenizers.Tokenizer``, built by transformers' own GGUF tokenizer converter
        (transformers' GGUF loading path; 'gpt2' byte-level BPE, 'llama' sentencepiece, ...).  A CheckpointError says
        why there is none (no ``tokenizer.ggml.model``, a type transformers does not build, an old transformers).
        Built once per model (the inspector asks whether there is one, then encodes with it): the answer, tokenizer or
        error, is kept."""
        if self._tok is None:
            try:
                self._tok = self._build_tokenizer()
            except CheckpointError as e:
                self._tok = e
        if isinstance(self._tok, CheckpointError):
            raise self._tok
        return self._tok

    def _build_tokenizer(self):
        meta = self.file.metadata
        model = meta.get("tokenizer.ggml.model")
        if not isinstance(model, str) or not isinstance(meta.get("tokenizer.ggml.tokens"), list):
            raise CheckpointError(f"{self.path}: no tokenizer in the metadata (tokenizer.ggml.model "
                                  f"{'missing' if model is None else repr(model)}, tokenizer.ggml.tokens "
                                  f"{'present' if 'tokenizer.ggml.tokens' in meta else 'missing'})")
        try:
            try:  # transformers >= 5.x
                from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                                    convert_gguf_tokenizer)
            except ImportError:  # transformers 4.x
                from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
            keys = GGUF_TOKENIZER_MAPPING["tokenizer"]
            tdict = {name: meta[f"tokenizer.{key}"] for key, name in keys.items() if f"tokenizer.{key}" in meta}
            tok, _ = convert_gguf_tokenizer(self.arch, tdict)
        except Exception as e:  # noqa: BLE001 - any converter failure is the same answer: no tokenizer from this file
            raise CheckpointError(f"{self.path}: transformers could not build the tokenizer of this GGUF "
                                  f"(tokenizer.ggml.model {model!r}; {type(e).__name__}: {e})") from e
        return tok


def _f32_decimal(x) -> float:
    """A FLOAT32 metadata value as the shortest decimal that rounds to it (1e-06, not 9.999999974752427e-07): the
    value the HF config.json held before conversion."""
    import numpy as np
    return float(str(np.float32(x)))


def llama3_rope_factors(theta: float, dim: int, factor: float, low: float, high: float, old: int) -> torch.Tensor:
    """llama.cpp's rope_freqs.weight for a llama3 rope scaling, transcribed from convert_hf_to_gguf.py
    ``LlamaModel.generate_extra_tensors`` (torch float32 frequencies, Python float arithmetic per frequency, the
    list stored as float32)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def config_from_metadata(meta: dict, infos: dict[str, TensorInfo], where, rope: Optional[dict] = None) -> dict:
    """HF config.json (transformers' Llama / BitNet fields) from llama.cpp metadata and the presented tensors;
    ``rope``: rope_parameters recovered from a rope_freqs tensor (``GGUFModel._llama3_rope``)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise CheckpointError(f"{where}: general.architecture {arch!r} is not supported (read: {', '.join(ARCHS)})")
    model_type, cls, act, _ = ARCHS[arch]

    def need(key: str, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise CheckpointError(f"{where}: metadata {arch}.{key} is missing; needed for config.json")
        if isinstance(v, list):
            raise CheckpointError(f"{where}: metadata {arch}.{key} is an array (per-layer values) and is not read")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CheckpointError(f"{where}: metadata {arch}.{key} is {v!r}, expected a number")
        return v

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rot = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rot != head_dim:
        raise CheckpointError(f"{where}: {arch}.rope.dimension_count {rot} != head dim {head_dim} (partial RoPE is "
                              f"not read)")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = meta.get(f"{arch}.rope.scaling.factor", 1.0)
    recovered, rope = rope, {"rope_type": "default", "rope_theta": _f32_decimal(need("rope.freq_base", 10000.0))}
    if recovered is not None:
        if scaling not in ("none",) and not (scaling == "linear" and factor == 1.0):
            raise CheckpointError(f"{where}: rope_freqs.weight (llama3 factors) and {arch}.rope.scaling.type "
                                  f"{scaling!r} both scale RoPE; expected one")
        rope = dict(recovered)
    elif scaling not in ("none", "linear") or (scaling == "linear" and factor != 1.0):
        if scaling == "linear":
            rope.update(rope_type="linear", factor=_f32_decimal(factor))
        else:
            raise CheckpointError(f"{where}: {arch}.rope.scaling.type {scaling!r} is not read (none, linear)")
    key_act = meta.get(f"{arch}.hidden_activation")
    if key_act is not None:
        if key_act not in ACTS:
            raise CheckpointError(f"{where}: {arch}.hidden_activation {key_act!r} is not read ({', '.join(ACTS)})")
        act = ACTS[key_act]
    if "token_embd.weight" in infos:
        vocab = infos["token_embd.weight"].shape[0]
    elif isinstance(meta.get("tokenizer.ggml.tokens"), list):
        vocab = len(meta["tokenizer.ggml.tokens"])
    else:
        raise CheckpointError(f"{where}: no token_embd.weight and no tokenizer.ggml.tokens: vocabulary size unknown")
    cfg = {
        "architectures": [cls], "model_type": model_type,
        "vocab_size": int(vocab), "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(need("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": act,
        "max_position_embeddings": int(need("context_length", 2048)),
        "rms_norm_eps": _f32_decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_parameters": rope,
        "tie_word_embeddings": "output.weight" not in infos,
        "attention_bias": "blk.0.attn_q.bias" in infos,
        "torch_dtype": "float32",
    }
    if model_type == "llama":
        cfg["mlp_bias"] = "blk.0.ffn_up.bias" in infos
    for key, hf in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                    ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        if isinstance(meta.get(key), int):
            cfg[hf] = meta[key]
    return cfg


def file_version(path: Path) -> tuple:
    """(resolved path, mtime_ns, size) of every file of GGUF model ``path`` (each part of a split set): the key that
    the parsed-model cache (checkpoint.gguf_model) and the conversion cache (``converted``) are kept under."""
    out = []
    for p in split_parts(Path(path)):
        st = p.stat()
        out.append((str(p.resolve()), st.st_mtime_ns, st.st_size))
    return tuple(out)


def split_parts(path: Path) -> list[Path]:
    """[path] for a single GGUF file; for a part of a llama.cpp split set (``NAME-0000i-of-0000N.gguf``), all N parts
    in order, each of which must exist."""
    m = SPLIT_RE.match(path.name)
    if m is None:
        return [path]
    stem, n = m.group(1), int(m.group(3))
    if n < 1 or not 1 <= int(m.group(2)) <= n:
        raise CheckpointError(f"{path}: split file name says part {int(m.group(2))} of {n}")
    parts = [path.with_name(f"{stem}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise CheckpointError(f"{path}: part of a {n}-file split GGUF set, but {', '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} missing")
    return parts


def find_gguf(model_dir: Path) -> Optional[Path]:
    """The one GGUF model of a directory (a file, or the first part of one llama.cpp split set), None if it has none;
    several models are refused."""
    files = sorted(p for p in Path(model_dir).glob("*.gguf") if p.is_file())
    if not files:
        return None
    models = {}  # model -> its first file
    for f in files:
        m = SPLIT_RE.match(f.name)
        key = (m.group(1), m.group(3)) if m else (f.name, None)
        models.setdefault(key, f)
    if len(models) > 1:
        names = [f.name if k[1] is None else f"{k[0]}-*-of-{k[1]}.gguf" for k, f in models.items()]
        raise CheckpointError(f"{model_dir}: {len(models)} GGUF models ({', '.join(names)}); expected one: pass the "
                              f"file itself")
    (key, first), = models.items()
    return first if key[1] is None else split_parts(first)[0]


# ---------------------------------------------------------------------------------------
# converter


def convert(src, out) -> Path:
    """GGUF -> a safetensors directory (model.safetensors with the tensors as presented + config.json, and
    tokenizer.json where the metadata describes a tokenizer transformers builds)."""
    from safetensors.torch import save

    from .io import atomic_write_bytes, atomic_write_text

    src, out = Path(src), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out}: exists and is not an empty directory; refusing to overwrite it")
    from .checkpoint import gguf_model

    model = gguf_model(src)  # parsed once per file version: the inspector or the reference may have read it already
    cfg = model.config()
    tensors = {name: model.get(name) for name in model.infos}
    try:
        tok = model.tokenizer().to_str()
    except CheckpointError as e:
        tok = None
        print(f"note: no tokenizer.json written: {e}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "model.safetensors", save(tensors, metadata={"format": "pt", "source": src.name}))
    atomic_write_text(out / "config.json", json.dumps(cfg, indent=1))
    if tok is not None:
        atomic_write_text(out / "tokenizer.json", tok)
    return out


def converted(src) -> Path:
    """A safetensors directory of GGUF model ``src`` for readers of safetensors only (vLLM): ``convert``'s output,
    made once per version of the file(s) under ``$TRIT_GGUF_CACHE`` (default ``<tmp>/trit-gguf``) and reused;
    written into a fresh directory and renamed into place whole, so a half-written conversion is never reused."""
    import hashlib
    import shutil
    import tempfile

    src = Path(src)
    parts = split_parts(src)
    h = hashlib.sha256(repr(file_version(src)).encode())
    root = Path(os.environ.get("TRIT_GGUF_CACHE") or Path(tempfile.gettempdir()) / "trit-gguf")
    m = SPLIT_RE.match(parts[0].name)
    stem = m.group(1) if m else parts[0].name.removesuffix(".gguf")
    out = root / f"{stem}-{h.hexdigest()[:16]}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=root))
    try:
        convert(src, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process renamed its conversion first: use that one
            if not (out / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference.gguf",
                                 description="convert a llama.cpp GGUF model to a safetensors directory")
    ap.add_argument("file", help="the .gguf model file")
    ap.add_argument("outdir", help="output directory (must not exist or be empty)")
    a = ap.parse_args(argv)
    try:
        out = convert(a.file, a.outdir)
    except (CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(out / f) for f in ('model.safetensors', 'config.json', 'tokenizer.json') if (out / f).exists())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
