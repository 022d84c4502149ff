"""Offline repack export: write a ternary checkpoint already in the trit kernel layout.

    python -m trit.export DIR --out OUTDIR [--force] [--invert-scales] [--max-shard-gb 4]

Reads any checkpoint the spec machinery understands (``reference.spec.spec_for(DIR)``: the
directory's ``ternary_spec.json`` or config.json's ``quantization_config``), decodes every ternary
linear once and writes OUTDIR with

* ``<module>.weight``: int32 ``[ceil(N/16), ceil(K/128)*128]`` = ``trit.ops.repack`` of the
  module's {-1, 0, +1} matrix (the ``tile16x128`` layout the kernels consume);
* ``<module>.weight_scale``: float32 ``[N]``, one scale per output channel (a per-tensor scale
  is broadcast), with the source's op: a multiplier, or for transformers' ``bitlinear`` the
  divisor s, so the reference model reproduces the source's logits bit for bit (the vLLM
  plugin inverts it at load: N fp32 reciprocals, the values its decode route computes).
  ``--invert-scales`` stores the multiplier 1/s instead; absent when the module has no scale;
* ``<module>.bias`` when the module has one; every float tensor (embeddings, norms, float
  linears) unchanged, under its Hugging Face name;
* ``ternary_spec.json`` whose entries carry ``"layout": "trit-tile16x128"`` (see
  ``reference.spec.LAYOUTS``), so the reference model, ``parity.dump`` and the vLLM plugin read
  the export like any other checkpoint;
* ``config.json`` with ``quantization_config = {"quant_method": "ternary", ...}`` (the source's
  ``quant_method: bitnet`` would make transformers expect its own packing), plus the tokenizer
  and generation files copied as they are.

Fused tensors on disk (spec entries with ``rows``) are written as separate modules.  Float-stored
ternary weights without a scale (TriLM's {-s, 0, +s}) with one magnitude per output row export as
sign(W) with s as the row's multiplier (_row_magnitudes).  Group
(block) scales cannot be expressed as one multiplier per output channel: the export refuses
them, naming the module.  The vLLM plugin then loads the int32 tiles straight into the layers
(no decode, no staging, no repack at start-up; see ``trit.vllm.quant``).  A vLLM layer whose
fused shards (q|k|v, gate|up) or tensor-parallel partitions are not multiples of 16 output rows
(or, row-parallel, of 128 inputs) cannot take the tiles as stored and loads through the plugin's
decode route instead: same weights, a repack for those layers only (tiny-bitnet: gate|up of
344 rows each).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from reference.checkpoint import Checkpoint, CheckpointError, gguf_model, gguf_source, load_config
from reference.config import ModelConfig
from reference.formats import ScaleSpec
from reference.io import umask_mode
from reference.spec import (SPEC_FILENAME, CheckpointSpec, LinearEntry, decode_linear, module_bias, spec_for,
                            tied_lm_head_key)

LAYOUT = "trit-tile16x128"
#: files copied verbatim from the source directory (tokenizer, generation defaults, chat template)
COPY_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "generation_config.json",
                 "vocab*", "merges.txt", "chat_template*", "*.tiktoken", "preprocessor_config.json")
INDEX_NAME = "model.safetensors.index.json"


class ExportError(ValueError):
    """The checkpoint cannot be written in the kernel layout (names the module and the reason)."""


def check_exportable(spec: CheckpointSpec) -> None:
    """Refuse, before any decoding, what the kernel layout cannot express."""
    for mod, e in spec.linears.items():
        if e.scale is not None and e.scale.granularity in ("group", "block"):
            what = "group-wise" if e.scale.granularity == "group" else "in-block (TQ2_0-style) group"
            raise ExportError(
                f"{mod}: {what} scale {e.scale.key!r} (group_size {e.scale.group_size}) cannot be expressed as "
                f"the per-output-channel multiplier the trit kernels take; this checkpoint cannot be exported to "
                f"the {LAYOUT} layout")


def _row_magnitudes(w: torch.Tensor) -> Optional[torch.Tensor]:
    """fp32 [N]: each row's one nonzero magnitude s_i where every weight of row i is -s_i, 0 or +s_i (TriLM's
    float-stored ternary, per tensor or per row), 1 for an all-zero row; None where a row holds two magnitudes."""
    a = w.abs().to(torch.float32)
    s = a.amax(dim=1)
    if not bool(((a == 0) | (a == s[:, None])).all()):
        return None
    return torch.where(s > 0, s, torch.ones_like(s)).contiguous()


def export_linear(ckpt: Checkpoint, entry: LinearEntry, mod: str, *, invert_scales: bool = False):
    """One module -> (packed int32 tiles, fp32 [N] scale or None, bias or None, new entry).

    The scale keeps the source's op by default: a ``divide`` scale s is stored as the divisor s
    (broadcast to [N], fp32), so the reference model's BitLinear arithmetic (``/ (xs * s)``) is
    reproduced bit for bit, and the vLLM plugin inverts it at load (N reciprocals in fp32, the
    very values its decode route computes).  ``invert_scales`` stores the multiplier 1/s instead
    (nothing at all to compute at load; the reference then multiplies, which under int8
    activations differs from the source's arithmetic by ulps that compound: fp32-a8 tier)."""
    from trit.ops import repack, unpack

    d = decode_linear(ckpt, entry, mod)
    vals = d.values
    folded = None  # float weights {-s_i, 0, +s_i} (TriLM): the per-row magnitudes s_i, moved into the scale
    if vals.is_floating_point():  # stored unpacked: exactly ternary, or one magnitude per row without a scale
        if not bool(((vals == -1) | (vals == 0) | (vals == 1)).all()):
            folded = _row_magnitudes(vals) if entry.scale is None and entry.online is None else None
            if folded is None:
                raise ExportError(f"{mod}: tensor {entry.weight_key!r} is stored unpacked but is not ternary "
                                  f"(values outside {{-1, 0, +1}}" + ("" if entry.scale is not None else
                                  ", and not one magnitude per output row {-s, 0, +s}") + "): the trit kernels take "
                                  f"ternary values times one multiplier per output channel")
            vals = torch.sign(vals)
        vals = vals.to(torch.int8)
    elif vals.dtype != torch.int8 or (vals.numel() and int(vals.abs().max()) > 1):
        raise ExportError(f"{mod}: code table of {entry.weight_key!r} decodes to values outside {{-1, 0, +1}}; "
                          f"the trit kernels are ternary only")
    n, k = vals.shape
    packed = repack(vals.contiguous())
    if not torch.equal(unpack(packed, n, k), vals):  # cheap, and the file is never wrong silently
        raise ExportError(f"{mod}: repack round trip failed (bug in trit.ops.repack)")
    scale, op = None, "multiply"
    if folded is not None:  # W = sign(W) * s_i exactly: the fp32 multiplier reproduces every stored value
        scale = folded
    elif entry.scale is not None or entry.online is not None:  # online: the multiplier came from the weight
        keep_div = (entry.scale is None or entry.scale.op == "divide") and not invert_scales
        m = (d.div if keep_div else d.mult).to(torch.float32)  # (1, 1) or (n, 1); d.mult = 1/s for 'divide'
        if m.shape[-1] != 1:
            raise ExportError(f"{mod}: scale {entry.scale.key if entry.scale else '(online)'!r} varies along the "
                              f"input axis; the kernel layout "
                              f"takes one multiplier per output channel")
        scale = m.reshape(-1).expand(n).contiguous().clone()
        op = "divide" if keep_div else "multiply"
    bias = module_bias(ckpt, entry)  # (its rows of a fused tensor's bias)
    norm = None
    if entry.input_norm is not None:  # use_rms_norm: the module's input RMSNorm weight, carried as stored
        norm = dataclasses.replace(entry.input_norm, key=f"{mod}.rms_norm.weight")
    new = LinearEntry(weight_key=f"{mod}.weight", shape=(n, k), layout=LAYOUT,
                      scale=ScaleSpec(key=f"{mod}.weight_scale", granularity="channel", op=op)
                      if scale is not None else None,
                      bias_key=f"{mod}.bias" if bias is not None else None, input_norm=norm)
    return packed, scale, bias, new


class _ShardWriter:
    """Accumulates tensors and writes safetensors shards of at most ``max_bytes`` each."""

    def __init__(self, out: Path, max_bytes: int, metadata: dict):
        self.out, self.max_bytes, self.metadata = out, max_bytes, metadata
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[tuple[Path, list[str]]] = []

    def add(self, key: str, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if self.pending and self.pending_bytes + nbytes > self.max_bytes:
            self.flush()
        if key in self.pending or any(key in keys for _, keys in self.written):
            raise ExportError(f"two tensors would be written under the key {key!r}")
        self.pending[key] = t.contiguous()
        self.pending_bytes += nbytes

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        path = self.out / f"shard-{len(self.written):05d}.safetensors"
        save_file(self.pending, str(path), metadata=self.metadata)
        umask_mode(path)  # safetensors makes 0600
        self.written.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> list[Path]:
        self.flush()
        if len(self.written) == 1:
            final = [self.out / "model.safetensors"]
        else:
            n = len(self.written)
            final = [self.out / f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for (tmp, _), dst in zip(self.written, final):
            tmp.rename(dst)
        if len(final) > 1:
            wm = {k: dst.name for (_, keys), dst in zip(self.written, final) for k in keys}
            total = sum(f.stat().st_size for f in final)
            (self.out / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total},
                                                            "weight_map": wm}, indent=1, sort_keys=True))
        return final


def _is_export(d: Path) -> bool:
    """Whether directory d holds what export() writes (so that --force may replace it)."""
    try:
        qc = json.loads((d / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return (d / SPEC_FILENAME).is_file() and isinstance(qc, dict) and qc.get("quant_method") == "ternary"


def _drop_stale_tmp(out: Path) -> None:
    """Remove what an interrupted export into ``out`` left beside it (``.NAME.tmp-PID`` / ``.NAME.old-PID`` of a
    process that no longer runs): each would otherwise stay, a hidden copy the size of the model."""
    for p in out.parent.glob(f".{glob.escape(out.name)}.*-*"):  # escaped: `--out 'm?'` must not take .mz.old-PID
        kind, _, pid = p.name[len(out.name) + 2:].partition("-")
        if kind not in ("tmp", "old") or not pid.isdigit() or not p.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # a running export's
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's live process
        if kind == "old" and not out.exists():
            p.rename(out)  # killed between its two renames: the old export is the only complete one
        else:
            shutil.rmtree(p, ignore_errors=True)


def export(model_dir, out_dir, *, spec_path=None, force: bool = False, invert_scales: bool = False,
           max_shard_bytes: int = 4 << 30, log=None) -> CheckpointSpec:
    """Write ``out_dir`` (see module docstring); returns the exported spec."""
    src, out = Path(model_dir).resolve(), Path(out_dir).expanduser().resolve()  # `--out .` / `..`: real names
    log = log or (lambda msg: print(msg, file=sys.stderr))
    if out == src:
        raise ExportError(f"--out {out} is the source directory; export writes a new directory")
    for what, inner in (("the source directory", src), ("the current directory", Path.cwd().resolve())):
        if inner.is_relative_to(out):  # replacing out would delete it (with --force: the source itself)
            raise ExportError(f"--out {out} contains {what} {inner}; export writes a new directory, pick one outside it")
    _drop_stale_tmp(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory; export writes a directory, pick another --out")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise FileExistsError(f"{out} exists and is not empty; pass --force to replace it")
        if not _is_export(out):
            raise ExportError(f"{out} exists and is not a trit export (no {SPEC_FILENAME} and config.json with "
                              f"quantization_config.quant_method 'ternary'); refusing to replace it, even with --force: "
                              f"pick another --out")
    t0 = time.perf_counter()
    cfg = ModelConfig.load(src)
    spec = spec_for(src, cfg, spec_path)
    if any(e.layout is not None for e in spec.linears.values()):
        raise ExportError(f"{src}: spec {spec.name!r} is already in a kernel layout; nothing to export")
    if not spec.linears:  # a float checkpoint: the "export" would be the same float model labelled ternary
        raise ExportError(f"{src}: spec {spec.name!r} has no ternary linear, nothing to export (a float checkpoint; "
                          f"if its weights are ternary values stored as floats, e.g. TriLM, run `python -m "
                          f"reference.inspect {src}` first, which writes the {SPEC_FILENAME} to export through)")
    check_exportable(spec)
    ckpt = Checkpoint(src)
    spec.validate(cfg, ckpt)

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    old_out = None
    try:
        writer = _ShardWriter(tmp, max_shard_bytes, {"format": "pt", "trit_layout": LAYOUT})
        linears: dict[str, LinearEntry] = {}
        for mod, e in spec.linears.items():
            packed, mult, bias, new = export_linear(ckpt, e, mod, invert_scales=invert_scales)
            writer.add(new.weight_key, packed)
            if mult is not None:
                writer.add(new.scale.key, mult)
            if bias is not None:
                writer.add(new.bias_key, bias)
            if new.input_norm is not None:
                writer.add(new.input_norm.key, ckpt.get(e.input_norm.key))
            linears[mod] = new
        tensors: dict[str, str] = {}
        first_of_key: dict[str, str] = {}
        for hf, key in spec.tensors.items():
            if key in first_of_key:  # one stored tensor serving two parameters: keep it shared
                tensors[hf] = first_of_key[key]
                continue
            writer.add(hf, ckpt.get(key))
            tensors[hf] = first_of_key[key] = hf
        head = tied_lm_head_key(cfg, spec, ckpt)
        if head is not None and "lm_head.weight" not in tensors:
            # tied in config.json, yet an lm_head is stored (not a spec tensor: the readers find it by name): the
            # reference and vLLM use it untied where it differs from the embedding, so it must travel too
            writer.add("lm_head.weight", ckpt.get(head))
            tensors["lm_head.weight"] = "lm_head.weight"
        files = writer.finish()
        new_spec = CheckpointSpec(name=f"{spec.name}+{LAYOUT}", linears=linears, tensors=tensors,
                                  activation_quant=spec.activation_quant)
        new_spec.save(tmp / SPEC_FILENAME)
        raw_cfg = load_config(src)  # a GGUF-only directory (which the reference reads): config.json from its metadata
        raw_cfg["quantization_config"] = {
            "quant_method": "ternary", "trit_layout": LAYOUT, "trit_scales": "inverted" if invert_scales else "kept",
            "source_spec": spec.name,
            "source_spec_sha256": spec.digest(),
            "source_quantization_config": raw_cfg.get("quantization_config")}
        (tmp / "config.json").write_text(json.dumps(raw_cfg, indent=1))
        for pat in COPY_PATTERNS:
            for f in sorted(src.glob(pat)):
                if f.is_file():
                    shutil.copy2(f, tmp / f.name)
        gguf = gguf_source(src)
        if gguf is not None and not (tmp / "tokenizer.json").exists():  # as reference.gguf.convert writes it
            try:
                (tmp / "tokenizer.json").write_text(gguf_model(gguf).tokenizer().to_str())
            except CheckpointError as e:
                log(f"trit.export: note: no tokenizer.json written: {e}")
        new_spec.validate(ModelConfig.load(tmp), Checkpoint(tmp))  # headers + keys: the export is complete
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.iterdir():  # safetensors / atomic writes create 0600 files
            os.chmod(f, 0o666 & ~umask)
        if out.exists():  # the old export goes aside first: an interruption leaves one of the two complete
            old_out = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old_out)
        tmp.rename(out)
        if old_out is not None:
            shutil.rmtree(old_out, ignore_errors=True)
    except BaseException:
        if old_out is not None and old_out.exists() and not out.exists():
            old_out.rename(out)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    log(f"trit.export: {len(linears)} ternary linears -> {LAYOUT}, {len(tensors)} float tensors, "
        f"{len(files)} file(s), {size / 2**20:.1f} MiB, {time.perf_counter() - t0:.1f} s -> {out}")
    return new_spec


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trit.export", description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", help="source checkpoint directory (any format reference.spec understands)")
    ap.add_argument("--out", required=True, help="output directory (must not exist unless --force)")
    ap.add_argument("--spec", default=None, help="explicit spec JSON for the source (default: spec_for(DIR))")
    ap.add_argument("--force", action="store_true", help="replace an existing output directory")
    ap.add_argument("--invert-scales", action="store_true",
                    help="store 'divide' scales as fp32 multipliers 1/s (default: keep the divisor, so the reference "
                         "model reproduces the source bit for bit; vLLM computes the same 1/s at load either way)")
    ap.add_argument("--max-shard-gb", type=float, default=4.0, help="safetensors shard size limit (GiB)")
    a = ap.parse_args(argv)
    if not (a.max_shard_gb > 0 and a.max_shard_gb != float("inf")):  # nan / inf / <= 0: no shard size at all
        ap.error(f"--max-shard-gb {a.max_shard_gb}: expected a positive number of GiB")
    try:
        export(a.model_dir, a.out, spec_path=a.spec, force=a.force, invert_scales=a.invert_scales,
               max_shard_bytes=int(a.max_shard_gb * 2**30))
    except (ValueError, OSError) as e:  # ExportError, CheckpointError, FormatError, FileExistsError
        print(f"trit.export: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
