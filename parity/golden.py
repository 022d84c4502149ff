"""Golden sets on disk: tensors.safetensors + manifest.json, written atomically.

    golden/NAME/
      manifest.json        canonical names (execution order), shapes, dtypes, sha256 per tensor,
                           tiers, the inputs, the model's and spec's digests, reference version
      tensors.safetensors  every canonical tensor (float32) + "input_ids" + "top10_ids"

A set is built in a temporary sibling directory and renamed into place.  An existing set is
never replaced silently: ``force=True`` moves it aside to ``NAME.prev-<timestamp>`` first.
A set whose manifest no longer matches the model/spec/inputs/reference is *stale*: that is
reported as such, never as a numeric failure.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from . import names as N

FORMAT = 1
TENSORS = "tensors.safetensors"
MANIFEST = "manifest.json"


class GoldenError(RuntimeError):
    pass


class StaleGolden(GoldenError):
    """The golden set was made from another model, spec, input set or reference version."""


def sha256_tensor(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().cpu().numpy().tobytes()).hexdigest()


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def model_identity(model_dir: Path, spec) -> dict:
    """What a golden set depends on: config, every weight file, the spec. A GGUF model (a .gguf file, or a directory
    holding one model's GGUF file(s)) is identified by its file(s) - each part of a split set - and the config the
    reference reads: config.json where the directory has one, else the one derived from the GGUF metadata."""
    from reference.checkpoint import gguf_source, load_config

    model_dir = Path(model_dir)
    src = gguf_source(model_dir)
    if src is None:
        files = {p.name: sha256_file(p) for p in sorted(model_dir.glob("*.safetensors"))}
        config = sha256_file(model_dir / "config.json")
    else:
        from reference.gguf import split_parts

        files = {p.name: sha256_file(p) for p in split_parts(Path(src))}
        cfg_file = model_dir / "config.json" if model_dir.is_dir() else None
        config = sha256_file(cfg_file) if cfg_file is not None and cfg_file.exists() else hashlib.sha256(
            json.dumps(load_config(model_dir), sort_keys=True).encode()).hexdigest()
    return {"config_sha256": config, "weights_sha256": files, "spec_name": spec.name, "spec_sha256": spec.digest()}


def regen_command(path, manifest=None, model=None) -> str:
    """The command that rebuilds the golden set at `path`, paths shell-quoted: its model is `model`, else the model
    dir its manifest records, else MODEL_DIR for the user to fill in (a bare `--ref --force` would rebuild the
    default set, not this one)."""
    if model is None and isinstance(manifest, dict) and isinstance(manifest.get("model"), dict):
        model = manifest["model"].get("dir") if isinstance(manifest["model"].get("dir"), str) else None
    m = shlex.quote(str(model)) if model else "MODEL_DIR"
    return f"`python -m parity.dump --ref --model {m} --out {shlex.quote(str(path))} --force`"


def _check_manifest(mf: Path, m: dict) -> None:
    """A manifest's structure, named by file and key: what load() and staleness() read, and an order that is the
    model's whole canonical list (a set with names dropped from 'order' would pass without checking them)."""
    need = {"order": list, "tensors": dict, "model": dict, "inputs": dict, "reference_version": str,
            "num_layers": int, "arch": str}
    for key, typ in need.items():
        if key not in m:
            raise GoldenError(f"{mf}: no {key!r} (a golden manifest records format, order, tensors, model, inputs, "
                              f"reference_version, num_layers, arch); regenerate with {regen_command(mf.parent, m)}")
        if not isinstance(m[key], typ) or (typ is int and isinstance(m[key], bool)):
            raise GoldenError(f"{mf}: {key!r} is a {type(m[key]).__name__}, expected a {typ.__name__}")
    for key in ("config_sha256", "weights_sha256", "spec_name", "spec_sha256"):
        if key not in m["model"]:
            raise GoldenError(f"{mf}: model has no {key!r} (what tells a stale set from a current one)")
    if "input_ids_sha256" not in m["inputs"]:
        raise GoldenError(f"{mf}: inputs has no 'input_ids_sha256'")
    from reference.config import MODEL_TYPES

    archs = sorted(set(MODEL_TYPES.values()))  # what ModelConfig.arch can be
    if m["arch"] not in archs or m["num_layers"] < 1:
        raise GoldenError(f"{mf}: arch {m['arch']!r} / num_layers {m['num_layers']}: expected one of {archs} "
                          f"and >= 1 layer")
    if m["num_layers"] > max(len(m["order"]), 1024):
        per_layer = len(N.canonical_names(1, m["arch"])) - len(N.canonical_names(0, m["arch"]))
        # every layer has names in 'order': listing those of 10**9 layers (to name the ones missing) never ended; a
        # smaller count is cheap to list, and the comparison below names what differs
        raise GoldenError(f"{mf}: num_layers {m['num_layers']} but 'order' holds {len(m['order'])} names; a "
                          f"{m['arch']} golden set lists {per_layer} per layer (+ 3), so num_layers is at most "
                          f"{max(0, (len(m['order']) - 3) // per_layer)} here; regenerate with "
                          f"{regen_command(mf.parent, m)}")
    shape = m["inputs"].get("shape")
    if shape is not None and not (isinstance(shape, list) and len(shape) == 2 and
                                  all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
        raise GoldenError(f"{mf}: inputs.shape is {shape!r}; expected [prompts, tokens] (two positive integers, "
                          f"the shape of the input_ids the goldens were computed on)")
    want = N.canonical_names(m["num_layers"], m["arch"])
    if m["order"] != want:
        gone = [n for n in want if n not in m["order"]]
        extra = [n for n in m["order"] if n not in want]
        what = (f"lacks {len(gone)} of them ({gone[:4]}{' ...' if len(gone) > 4 else ''})" if gone else
                f"has names that are not canonical ({extra[:4]})" if extra else "has them out of order or repeated")
        raise GoldenError(f"{mf}: 'order' is not the {len(want)} canonical names of a {m['num_layers']}-layer "
                          f"{m['arch']} model in execution order: it {what}; every golden set holds all of them "
                          f"(select tensors with `pytest parity/ -k ...`, not by editing the manifest)")


@dataclass
class GoldenSet:
    path: Path
    manifest: dict
    tensors: dict  # canonical name -> float32 tensor
    input_ids: torch.Tensor
    top10: Optional[torch.Tensor]

    @property
    def order(self) -> list:
        return self.manifest["order"]

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = True) -> "GoldenSet":
        from safetensors.torch import load_file

        path = Path(path)
        mf = path / MANIFEST
        if not mf.exists():
            raise GoldenError(f"{path}: no golden set here (no {MANIFEST}); make one with "
                              f"`python -m parity.dump --ref --out {shlex.quote(str(path))}`")
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise GoldenError(f"{mf}: invalid JSON ({e})")
        except OSError as e:  # a directory of that name, unreadable: golden_diff had a traceback
            raise GoldenError(f"{mf}: cannot read the golden manifest ({e.strerror or e})") from None
        except UnicodeDecodeError as e:  # (a ValueError: parity.run printed it without the file's name)
            raise GoldenError(f"{mf}: not UTF-8 text ({e.reason} at byte {e.start}): a golden manifest is UTF-8 JSON; "
                              f"regenerate the set with {regen_command(path)}") from None
        if not isinstance(manifest, dict):
            raise GoldenError(f"{mf}: expected a JSON object (format, order, tensors, model, inputs, ...), got a "
                              f"{type(manifest).__name__}; regenerate the set with {regen_command(path, manifest)}")
        fmt = manifest.get("format")
        if fmt != FORMAT or isinstance(fmt, bool):
            newer = isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT
            # (a string "1" read as 'golden format 1, this harness reads 1')
            raise StaleGolden(f"{mf}: golden format {fmt!r}, this harness reads format {FORMAT!r} only" +
                              (": the set was written by a newer harness; update this checkout, or regenerate it "
                               f"with {regen_command(path, manifest)}" if newer else
                               f"; regenerate it with {regen_command(path, manifest)}"))
        _check_manifest(mf, manifest)
        from reference.checkpoint import read_header

        if not (path / TENSORS).is_file():
            raise GoldenError(f"{path}: {MANIFEST} without {TENSORS}: an incomplete golden set; regenerate it with "
                              f"{regen_command(path, manifest)}")
        read_header(path / TENSORS)  # validates offsets: a truncated golden file says so
        data = load_file(str(path / TENSORS))
        tf = path / TENSORS
        tensors = {}
        for name in manifest["order"]:
            meta = manifest["tensors"].get(name)
            if meta is None:
                raise GoldenError(f"{mf}: 'order' lists {name!r} but 'tensors' has no entry for it (shape, dtype, "
                                  f"sha256); the manifest was edited by hand or cut short")
            lacks = [k for k in ("shape", "dtype", "sha256") if not isinstance(meta, dict) or k not in meta]
            if lacks:
                raise GoldenError(f"{mf}: tensors[{name!r}] has no {lacks} (each entry records shape, dtype, sha256)")
            if name not in data:
                raise GoldenError(f"{path}: {MANIFEST} lists {name!r} but {TENSORS} lacks it")
            t = data[name]
            if t.dtype != torch.float32 or meta.get("dtype") != "float32":
                raise GoldenError(f"{tf}: {name} is {t.dtype} (manifest: {meta.get('dtype')!r}); golden tensors are "
                                  f"float32")
            if list(t.shape) != meta["shape"]:
                raise GoldenError(f"{path}: {name} has shape {list(t.shape)}, manifest says {meta['shape']}")
            if verify and sha256_tensor(t) != meta["sha256"]:
                raise GoldenError(f"{path}: {name} does not match its sha256 in the manifest (file corrupted "
                                  f"or edited by hand); regenerate with {regen_command(path, manifest)}")
            if not bool(torch.isfinite(t).all()):  # write_golden never writes one: a NaN golden passes nothing
                bad = int((~torch.isfinite(t)).sum())
                raise GoldenError(f"{tf}: {name} holds {bad} NaN/Inf values; expected finite goldens (the set was "
                                  f"edited after it was written); regenerate with {regen_command(path, manifest)}")
            tensors[name] = t
        ids = data.get("input_ids")
        inputs = manifest["inputs"]
        if ids is None:
            raise GoldenError(f"{tf}: no 'input_ids' tensor (the tokens the goldens were computed on)")
        if ids.dtype != torch.int64 or ids.dim() != 2 or list(ids.shape) != list(inputs.get("shape", ids.shape)):
            raise GoldenError(f"{tf}: input_ids is {ids.dtype} {list(ids.shape)}; expected int64 "
                              f"{inputs.get('shape', '[prompts, tokens]')} as {MANIFEST} records")
        if verify and sha256_tensor(ids) != inputs["input_ids_sha256"]:
            raise GoldenError(f"{tf}: input_ids do not match inputs.input_ids_sha256 in {MANIFEST} (file corrupted or "
                              f"edited by hand); regenerate with {regen_command(path, manifest)}")
        if ids.numel() and int(ids.min()) < 0:
            raise GoldenError(f"{tf}: input_ids holds {int(ids.min())}; token ids are >= 0")
        top10 = data.get("top10_ids")
        if verify and top10 is not None and "top10_sha256" in manifest and \
                sha256_tensor(top10) != manifest["top10_sha256"]:
            raise GoldenError(f"{tf}: top10_ids do not match top10_sha256 in {MANIFEST} (file corrupted or edited by "
                              f"hand); regenerate with {regen_command(path, manifest)}")
        return cls(path, manifest, tensors, ids, top10)

    def staleness(self, model_dir: Path, spec, reference_version: str, cfg=None) -> list[str]:
        """Reasons this set no longer describes the model (empty when fresh); cfg: the model's ModelConfig where the
        caller has it (else read here)."""
        now = model_identity(model_dir, spec)
        then = self.manifest["model"]
        why = []
        if then["config_sha256"] != now["config_sha256"]:
            why.append("config.json changed")
        if then["weights_sha256"] != now["weights_sha256"]:
            why.append("weight files changed")
        if then["spec_sha256"] != now["spec_sha256"]:
            # same-named specs differ in content (the model's shapes are part of a config-derived spec)
            why.append(f"format spec changed ({then['spec_name']} -> {now['spec_name']})" if then["spec_name"] !=
                       now["spec_name"] else f"format spec {now['spec_name']!r} changed (its content, same name)")
        if why and then.get("dir") and Path(then["dir"]).resolve() != Path(model_dir).resolve():
            why.insert(0, f"made from {then['dir']}, not {model_dir}")  # (a copy elsewhere with the same files is fine)
        if self.manifest["reference_version"] != reference_version:
            why.append(f"reference version {self.manifest['reference_version']} -> {reference_version}")
        if cfg is None:
            from reference.config import ModelConfig

            cfg = ModelConfig.load(model_dir)
        if (self.manifest["num_layers"], self.manifest["arch"]) != (cfg.num_layers, cfg.arch):
            why.append(f"the set is for a {self.manifest['num_layers']}-layer {self.manifest['arch']} model, the config "
                       f"describes a {cfg.num_layers}-layer {cfg.arch} one")
        return why


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def compute_fingerprint(device: str = "cpu") -> str:
    """Where fp32 results were computed, as far as it decides their last bits: on a CPU the kernels'
    ISA (torch picks AVX2 / AVX512 / ... code paths, which sum in different orders and evaluate exp,
    sin or rsqrt to different ulps), the CPU model (BLAS libraries choose code paths by vendor), the
    intra-op thread count (how reductions are split) and the torch build; on a GPU its model and the
    torch / CUDA build."""
    if str(device).startswith("cuda"):
        return (f"cuda:{torch.cuda.get_device_name(torch.device(device))}|torch {torch.__version__}"
                f"|cuda {torch.version.cuda}")
    return (f"cpu:{torch.backends.cpu.get_cpu_capability()}|{_cpu_model()}|threads {torch.get_num_threads()}"
            f"|torch {torch.__version__}")


def computed_alike(made_a: Optional[str], made_b: Optional[str]) -> bool:
    """Two `compute` records (compute_fingerprint) of golden sets or hosts: the same kind of
    hardware, so fp32 results agree to the last bit; an unrecorded one counts as different."""
    return made_a is not None and made_a == made_b


def bit_faithful_here(golden_manifest: dict, device: str = "cpu") -> bool:
    """Whether a target that reproduces the reference's arithmetic (ReferenceTarget, its planted-fault
    copies, transformers in fp32) can match this golden set bit for bit here: only where the set was
    computed the same way (its manifest's ``compute`` equals this machine's). Across ISAs the fp32
    results differ in the last ulp, and in a model with int8 activation quantisation such a
    difference moves some x*127/absmax across a .5 boundary: one int8 step, compounding with depth
    (measured: the committed tiny-bitnet golden, which CI hosts reproduced, against the reference on an
    AVX2-only AMD host: 42 of 60 tensors past the fp32 tier). A set without the field (made before it
    existed) counts as computed elsewhere."""
    return computed_alike(golden_manifest.get("compute"), compute_fingerprint(device))


def target_bit_faithful(target, golden_manifest: dict, model_dir=None) -> bool:
    """A target's bit_faithful flag as it holds for this model (Target.faithful_for) against this golden set
    on this machine (bit_faithful_here on the target's device): what picks the tolerance column in
    parity.run and parity.noise."""
    return target.faithful_for(model_dir) and bit_faithful_here(golden_manifest, getattr(target, "device", "cpu"))


def write_golden(out: Path, tensors: dict, order: list, input_ids: torch.Tensor, *, model_dir: Path, spec,
                 inputs_desc: dict, reference_version: str, arch: str, num_layers: int,
                 force: bool = False, compute: Optional[str] = None) -> Path:
    from safetensors.torch import save_file

    from reference.io import aside_path, umask_mode

    out = Path(out)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # an empty directory (made by hand for the set) holds nothing to keep or refuse
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST).exists())):
        # not a golden set (a model directory, the golden/ root, ...): --force would move it aside and put a
        # golden set in its place
        raise GoldenError(f"{out} exists and is not a golden set (no {MANIFEST}); refusing to replace it, even with "
                          f"--force: pick another --out")
    if out.exists() and not force:
        raise GoldenError(f"{out} already holds a golden set; pass --force to replace it (the old set is "
                          f"kept as {out.name}.prev-<timestamp>)")
    missing = [n for n in order if n not in tensors]
    if missing:
        raise GoldenError(f"the reference did not capture {missing[:5]}")
    bad = [n for n in order if tensors[n].is_floating_point() and not bool(torch.isfinite(tensors[n]).all())]
    if bad:
        # a golden set of NaN would make every target "fail" on the reference's own fault (or pass vacuously)
        raise GoldenError(f"the reference's outputs for {model_dir} are not finite from {bad[0]!r} on ({len(bad)} of "
                          f"{len(order)} tensors: {bad[:4]}); expected finite values - nothing written to {out}")
    logits = tensors["logits"]
    top10 = logits.topk(min(10, logits.shape[-1]), dim=-1).indices
    data = {n: tensors[n].contiguous().float() for n in order}
    data["input_ids"] = input_ids.contiguous()
    data["top10_ids"] = top10.contiguous()
    manifest = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reference_version": reference_version,
        "torch_version": torch.__version__,
        "compute": compute or compute_fingerprint("cpu"),
        "arch": arch,
        "num_layers": num_layers,
        "model": {"dir": str(Path(model_dir).resolve()), **model_identity(model_dir, spec)},  # (from any cwd)
        "inputs": {**inputs_desc, "input_ids_sha256": sha256_tensor(input_ids)},
        "order": list(order),
        "tensors": {n: {"shape": list(data[n].shape), "dtype": "float32", "sha256": sha256_tensor(data[n]),
                        "tier": N.tier(n), "order": i} for i, n in enumerate(order)},
        "top10_sha256": sha256_tensor(top10),
    }
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{time.time_ns()}")
    tmp.mkdir(parents=True)
    aside = None
    try:
        save_file(data, str(tmp / TENSORS))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        for f in (tmp / TENSORS, tmp / MANIFEST):  # readable as any file the user writes (safetensors makes 0600)
            umask_mode(f)
        if out.exists() and not force:
            # another writer (a second dump into the same --out) finished while this one computed: its set is kept
            raise GoldenError(f"{out} now holds a golden set written while this dump ran (another process?); "
                              f"not replaced - pass --force to replace it (the old set is kept as "
                              f"{out.name}.prev-<timestamp>)")
        if out.exists():
            aside = aside_path(out)
            out.rename(aside)
        try:
            tmp.rename(out)  # onto a non-empty directory this fails: a set that appeared since the check stays
        except OSError as e:
            if aside is None and out.exists():
                raise GoldenError(f"{out} now holds a golden set written while this dump ran (another process?); "
                                  f"not replaced - pass --force to replace it") from e
            raise
    except BaseException:
        if aside is not None and aside.exists() and not out.exists():
            aside.rename(out)  # interrupted between the two renames: the old set goes back where it was
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
