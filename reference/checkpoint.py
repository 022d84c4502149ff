"""Safe, strict access to safetensors checkpoints (single file or sharded with an index), and to llama.cpp GGUF
model files (one ``.gguf`` file, or a directory holding one and no safetensors: reference.gguf presents its tensors
under their GGUF names as the safetensors conventions store them, and ``load_config`` synthesises config.json from
its metadata when the directory has none).

Never unpickles.  The header of every file is validated before any tensor is read (offsets
inside the file, no overlaps, sizes that match dtype x shape), so a truncated or corrupted
file fails with a message naming the file and tensor instead of a bare traceback.
Tensors are read one at a time through memory maps.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME: a one-file checkpoint

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "F16": torch.float16,
    "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32, "I64": torch.int64,
    "F64": torch.float64, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


class CheckpointError(ValueError):
    """A checkpoint file or directory is unusable; the message names file and tensor."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype string, e.g. "U8"
    shape: tuple[int, ...]
    file: Path
    nbytes: int


def _header_int(x) -> int:
    """A JSON integer from a header (bools, floats and strings are malformed, not coerced)."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an integer, got {x!r}")
    return x


#: the first line of a Git LFS pointer file (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md), which a
#: repository cloned without git-lfs holds in place of each large file; the spec caps a pointer at 1024 bytes
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"
LFS_POINTER_MAX = 1024


def lfs_pointer_error(path: Path, what: str):
    """A CheckpointError for a Git LFS pointer file stored where ``what`` belongs (else None): it names the object's
    size and how to fetch it, instead of reading the pointer's text as a header."""
    path = Path(path)
    size = path.stat().st_size
    if size > LFS_POINTER_MAX:
        return None
    with open(path, "rb") as f:
        text = f.read(size)
    if not text.startswith(LFS_POINTER_PREFIX):
        return None
    obj = next((ln.split(b" ", 1)[1].decode("ascii", "replace") for ln in text.splitlines()
                if ln.startswith(b"size ")), "?")
    return CheckpointError(f"{path}: a Git LFS pointer ({size} bytes of text naming a {obj}-byte object), not the "
                           f"{what} itself: the repository was cloned without its LFS files; fetch them (`git lfs "
                           f"pull` in the clone, or download the file) and run again")


def read_header(path: Path) -> dict:
    """Parse and validate one safetensors header.  Returns {name: TensorInfo}."""
    path = Path(path)
    size = path.stat().st_size
    lfs = lfs_pointer_error(path, "safetensors file")
    if lfs is not None:
        raise lfs
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file (needs an 8-byte header length)")
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > size - 8 or hlen > 100 * 1024 * 1024:
            raise CheckpointError(
                f"{path}: header claims {hlen} bytes but the file has {size - 8} after the length field "
                f"(truncated or not a safetensors file)")
        raw = f.read(hlen)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e}); the file is corrupted or not safetensors")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data_len = size - 8 - hlen
    out: dict[str, TensorInfo] = {}
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            # safetensors' reader takes only string values here (a list, or a number among them, failed at the first
            # read in its own words)
            if meta is not None and (not isinstance(meta, dict) or
                                     not all(isinstance(v, str) for v in meta.values())):
                raise CheckpointError(f"{path}: __metadata__ is {json.dumps(meta)[:80]}; expected an object of "
                                      f"string values (e.g. {{\"format\": \"pt\"}})")
            continue
        if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= set(meta):
            raise CheckpointError(f"{path}: tensor {name!r}: header entry lacks dtype/shape/data_offsets")
        dt = meta["dtype"]
        if not isinstance(dt, str) or dt not in DTYPE_BYTES:
            raise CheckpointError(f"{path}: tensor {name!r}: unknown dtype {dt!r}")
        try:  # a corrupted header may hold anything here: never let a TypeError escape
            shape = tuple(_header_int(s) for s in meta["shape"])
            begin, end = (_header_int(x) for x in meta["data_offsets"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: tensor {name!r}: malformed shape {meta['shape']!r} or data_offsets "
                                  f"{meta['data_offsets']!r} in the header ({e})") from None
        if any(s < 0 for s in shape):
            raise CheckpointError(f"{path}: tensor {name!r}: negative dimension in shape {shape}")
        numel = 1
        for s in shape:
            numel *= s
        want = numel * DTYPE_BYTES[dt]
        if end - begin != want or begin < 0:
            raise CheckpointError(
                f"{path}: tensor {name!r}: offsets [{begin}, {end}) hold {end - begin} bytes, "
                f"dtype {dt} x shape {list(shape)} needs {want}")
        if end > data_len:
            raise CheckpointError(
                f"{path}: tensor {name!r}: data ends at byte {end} but the file has only {data_len} data bytes "
                f"(truncated file?)")
        spans.append((begin, end, name))
        out[name] = TensorInfo(name, dt, shape, path, want)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"{path}: tensors {n0!r} and {n1!r} overlap in the data section (header lies)")
    # safetensors stores the tensors back to back from byte 0 of the data section to the end of the file, and its
    # reader refuses anything else - but only when a tensor is first read, in its own words (a gap was named after
    # the tensor behind it, mid-scan): said here, with the header, naming both sides and the expected offset
    pos, prev = 0, None
    for b, e, n in spans:
        if b != pos:
            after = f"after tensor {prev!r}, which ends at byte {pos}" if prev else "at the start of the data section"
            raise CheckpointError(f"{path}: tensor {n!r} starts at data byte {b}, expected {pos}: {b - pos} unused "
                                  f"bytes {after} (safetensors stores tensors back to back; the header lies or the "
                                  f"file was spliced)")
        pos, prev = e, n
    if pos != data_len:
        raise CheckpointError(f"{path}: the tensors end at data byte {pos} but the file has {data_len} data bytes: "
                              f"{data_len - pos} bytes past the last tensor{f' ({prev!r})' if prev else ''} "
                              f"(safetensors refuses a file its header does not cover; appended to or spliced?)")
    return out


class Checkpoint:
    """All tensors of a model directory (or one .safetensors file), validated, read lazily."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.infos: dict[str, TensorInfo] = {}
        self._handles: dict[Path, object] = {}
        self._gguf = None
        src = gguf_source(self.path)
        if src is not None:
            self._gguf = gguf_model(src)
            self.infos = dict(self._gguf.infos)
            return
        files = self._files()
        for f in files:
            for name, info in read_header(f).items():
                if name in self.infos:
                    raise CheckpointError(f"tensor {name!r} appears in both {self.infos[name].file} and {f}")
                self.infos[name] = info
        self._check_index()

    def _files(self) -> list[Path]:
        p = self.path
        if p.is_file():
            if is_pickle(p):
                raise refuse_pickle(p)
            return [p]
        if not p.is_dir():
            raise CheckpointError(f"{p}: no such checkpoint file or directory")
        listed = self._index_files()
        if listed is not None:
            # with an index, the checkpoint is the files it lists (as vLLM reads it): a stray *.safetensors beside
            # them (a consolidated copy, an adapter) is not part of it - but for a file named model.safetensors,
            # which transformers loads *before* looking for the index (modeling_utils: SAFE_WEIGHTS_NAME first)
            single = p / SINGLE_NAME
            if single.is_file() and single not in listed:
                raise CheckpointError(
                    f"{p}: holds both {SINGLE_NAME} and {INDEX_NAME} (shards {', '.join(f.name for f in listed[:3])}"
                    f"{', ...' if len(listed) > 3 else ''}): transformers loads {SINGLE_NAME} and ignores the index, "
                    f"vLLM and this harness load the index's shards, so the targets would run different weights; "
                    f"expected one checkpoint: remove the stale one (or list {SINGLE_NAME} in the index)")
            return listed
        files = sorted(p.glob("*.safetensors"))
        if not files:
            pickles = [f for f in sorted(p.iterdir()) if is_pickle(f)]
            if pickles:
                raise refuse_pickle(pickles[0])
            raise CheckpointError(f"{p}: no *.safetensors files in the directory")
        return files

    def _index(self):
        """(index path, weight_map) of a sharded directory, else None."""
        idx = self.path / INDEX_NAME if self.path.is_dir() else None
        if idx is None or not idx.exists():
            return None
        try:
            wm = json.loads(idx.read_text(encoding="utf-8"))["weight_map"]
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{idx}: not a valid safetensors index ({e})")
        except UnicodeDecodeError as e:  # (a ValueError: printed without the file's name)
            raise CheckpointError(f"{idx}: not a valid safetensors index (not UTF-8 text: {e.reason} at byte "
                                  f"{e.start}); expected a JSON object with a 'weight_map'") from None
        except OSError as e:  # a directory of that name, unreadable
            raise CheckpointError(f"{idx}: cannot read the safetensors index ({e.strerror or e})") from None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise CheckpointError(f"{idx}: weight_map must map tensor names to shard file names")
        return idx, wm

    def _index_files(self):
        """The shard files the index lists (each must exist), or None without an index."""
        got = self._index()
        if got is None:
            return None
        idx, wm = got
        out = []
        for fname in sorted(set(wm.values())):
            if Path(fname).name != fname:
                raise CheckpointError(f"{idx}: shard {fname!r} is not a file name in {self.path}")
            f = self.path / fname
            if not f.is_file():
                names = [k for k, v in wm.items() if v == fname]
                raise CheckpointError(f"{f}: shard listed in {idx.name} is missing ({len(names)} tensors mapped to "
                                      f"it, e.g. {names[0]!r}); download or restore that file")
            if is_pickle(f):
                raise refuse_pickle(f)
            out.append(f)
        if not out:
            raise CheckpointError(f"{idx}: weight_map is empty")
        return out

    def _check_index(self):
        got = self._index()
        if got is None:
            return
        idx, wm = got
        for name, fname in wm.items():
            info = self.infos.get(name)
            if info is None:
                raise CheckpointError(f"{idx}: maps {name!r} to {fname}, but no shard holds that tensor")
            if info.file.name != fname:
                raise CheckpointError(f"{idx}: maps {name!r} to {fname}, but it is in {info.file.name}")

    def keys(self) -> list[str]:
        return list(self.infos)

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def info(self, name: str) -> TensorInfo:
        if name not in self.infos:
            near = [k for k in self.infos if k.split(".")[-1] == name.split(".")[-1]][:3]
            raise CheckpointError(f"{self.path}: no tensor {name!r}" + (f" (similar: {near})" if near else ""))
        return self.infos[name]

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        info = self.info(name)
        if self._gguf is not None:
            try:
                return self._gguf.get(name)
            except CheckpointError:
                raise
            except (OSError, RuntimeError, ValueError) as e:
                raise CheckpointError(f"{info.file}: tensor {name!r}: cannot read ({e})") from e
        h = self._handles.get(info.file)
        if h is None:
            try:
                h = safe_open(str(info.file), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{info.file}: cannot open ({e})") from e
            self._handles[info.file] = h
        try:
            return h.get_tensor(name)
        except Exception as e:
            raise CheckpointError(f"{info.file}: tensor {name!r}: cannot read ({e})") from e

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.infos:
            yield name, self.get(name)


def is_pickle(path: Path) -> bool:
    """A file named as a pickle checkpoint (pytorch_model.bin, consolidated.00.PTH, ...): never opened."""
    return Path(path).suffix.lower() in PICKLE_SUFFIXES


def refuse_pickle(path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path}: refusing to load a pickle checkpoint — unpickling runs arbitrary code. Convert it once, in a "
        f"sandbox you trust, to safetensors (e.g. `transformers` save_pretrained(..., safe_serialization=True) "
        f"or safetensors.torch.save_file(torch.load(path, weights_only=True), 'model.safetensors')).")


def gguf_source(path: Path):
    """The GGUF file a checkpoint path names: the path itself (``*.gguf``), or the one GGUF model of a directory
    without safetensors files or index (reference.gguf.find_gguf refuses split sets and several models); else None."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / INDEX_NAME).exists() or any(path.glob("*.safetensors")):
        return None
    from .gguf import find_gguf
    return find_gguf(path)


_GGUF_CACHE: dict = {}


def gguf_model(path: Path):
    """reference.gguf.GGUFModel of ``path``, parsed once per version of its file(s) (config and tensors read the same
    header; a split set's every part counts)."""
    from .gguf import GGUFModel, file_version

    key = file_version(Path(path))
    if key not in _GGUF_CACHE:
        if len(_GGUF_CACHE) >= 4:
            _GGUF_CACHE.pop(next(iter(_GGUF_CACHE)))
        _GGUF_CACHE[key] = GGUFModel(path)
    return _GGUF_CACHE[key]


def load_config(model_dir: str | os.PathLike) -> dict:
    p = Path(model_dir) / "config.json"
    if not p.exists():
        src = gguf_source(Path(model_dir))
        if src is not None:  # a GGUF model: config.json from its metadata
            return gguf_model(src).config()
        if Path(model_dir).is_file():  # a weights file: its config.json is beside it, in the model directory
            raise CheckpointError(f"{model_dir}: a file, not a model directory: pass the directory that holds "
                                  f"config.json and the weights ({Path(model_dir).parent}; a .gguf file is read by "
                                  f"itself)")
        raise CheckpointError(f"{model_dir}: no config.json")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{p}: invalid JSON ({e})")
    except UnicodeDecodeError as e:  # (a ValueError: the CLIs printed it without the file's name)
        raise CheckpointError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); config.json is UTF-8 "
                              f"JSON") from None
    check_config_values(d, p)
    return d


def _non_finite(x, where: str = ""):
    """The key path of the first NaN / Infinity in a parsed JSON value (Python's json reads both), else None."""
    if isinstance(x, float) and not math.isfinite(x):
        return where or "(top level)", x
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        got = _non_finite(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else str(k))
        if got is not None:
            return got
    return None


def check_config_values(d, p) -> None:
    """What no config.json holds, whatever its model: a NaN / Infinity (json reads them as floats: an Infinity
    num_hidden_layers raised OverflowError, a NaN rms_norm_eps made every golden NaN) and a quantization_config that
    is not an object (its readers call .get on it). Named by file, key and the expected value."""
    if not isinstance(d, dict):
        return  # ModelConfig.from_dict names a config that is not an object
    got = _non_finite(d)
    if got is not None:
        raise CheckpointError(f"{p}: {got[0]} is {json.dumps(got[1])}; expected a finite number (a model config "
                              f"holds no NaN / Infinity)")
    q = d.get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise CheckpointError(f"{p}: quantization_config is a {type(q).__name__} ({q!r}); expected a JSON object "
                              f"(e.g. {{\"quant_method\": \"bitnet\", ...}}) or null")
