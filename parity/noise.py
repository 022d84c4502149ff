"""Measured noise floors: how far an *independent* implementation in the same precision lands
from the fp32 goldens, tensor by tensor.

    python -m parity.noise --model DIR --golden DIR [--target bf16] [--target-opt device=cuda] [--force]

Why: the static bf16 tiers (parity.tolerances) were calibrated on a 4-layer model. In a deep
model, bf16 rounding and the int8 activation-quantisation boundary flips it causes compound
layer after layer (BitNet-2B shape, 30 layers: SQNR 43 dB after layer 0, 18 dB after layer 29,
smoothly, for vLLM on the H200), so a correct bf16 target leaves any fixed tier at some depth.
A noise file records, per canonical tensor, the max-abs error of an independent bf16
implementation (the ``bf16`` target: pure torch, its own byte-table decoder) against the same
golden set. ``compare`` then lets a tensor's limit grow to ``NOISE_FACTOR`` x that floor: a target
passes where it is no worse than twice a careful bf16 implementation. Limits only widen (the
static tier stays the minimum), every widened limit is marked in the table (``limit_src``), the
target under test can never supply its own floor, and a noise file whose noise implementation
disagrees with the goldens' top-10 is refused, so a broken floor cannot hide a broken target.

The file lives in the golden directory as ``noise-<column>.json`` and is bound to the golden set
by the sha256 of its manifest: regenerate both together.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from reference.io import atomic_write_text

from .golden import MANIFEST, GoldenError, sha256_file, target_bit_faithful

NOISE_FACTOR = 2.0
FORMAT = "trit-noise-v1"


def noise_path(golden_dir: Path, column: str) -> Path:
    return Path(golden_dir) / f"noise-{column}.json"


def load_noise(golden_dir: Path, column: str, *, exclude_target: Optional[str] = None) -> Optional[dict]:
    """{name: floor max_abs} for ``column``, or None when the golden set has no noise file for it
    (or the floor was measured by ``exclude_target`` itself). GoldenError when the file is stale or
    malformed."""
    p = noise_path(golden_dir, column)
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:  # (UnicodeDecodeError printed without the file)
        raise GoldenError(f"{p}: unreadable noise file ({e})") from None
    if not isinstance(d, dict):  # d.get raised AttributeError: a traceback from parity.run
        raise GoldenError(f"{p}: a {type(d).__name__}, not a noise file (a JSON object with format {FORMAT}, column, "
                          f"golden_manifest_sha256, max_abs); measure it again with `python -m parity.noise --golden "
                          f"{shlex.quote(str(golden_dir))} ... --force`")
    if d.get("format") != FORMAT or not isinstance(d.get("max_abs"), dict):
        raise GoldenError(f"{p}: not a {FORMAT} noise file (format {d.get('format')!r})")
    if d.get("column") != column:
        raise GoldenError(f"{p}: holds column {d.get('column')!r}, expected {column!r}")
    want = sha256_file(Path(golden_dir) / MANIFEST)
    if d.get("golden_manifest_sha256") != want:
        raise GoldenError(f"{p} was measured against another golden set (manifest sha256 "
                          f"{str(d.get('golden_manifest_sha256'))[:12]} != {want[:12]}); regenerate it with "
                          f"`python -m parity.noise --golden {shlex.quote(str(golden_dir))} ...`")
    if exclude_target is not None and d.get("target") == exclude_target:
        return None
    bad = [k for k, v in d["max_abs"].items()
           if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)]
    if bad:
        raise GoldenError(f"{p}: non-finite, negative or non-numeric floors for {bad[:5]}; expected numbers >= 0")
    return {k: float(v) for k, v in d["max_abs"].items()}


def measure_noise(model_dir: Path, golden_dir: Path, *, target: str = "bf16", target_options: Optional[dict] = None,
                  spec_path=None, force: bool = False) -> Path:
    from reference.config import ModelConfig
    from reference.spec import spec_for

    from .compare import topk_agreement
    from .run import load_fresh_golden
    from .targets import get_target
    from .tolerances import column as tolerance_column, resolve

    gs = load_fresh_golden(golden_dir, model_dir, spec_path)
    spec = spec_for(model_dir, ModelConfig.load(model_dir), spec_path)
    t = get_target(target, **(target_options or {}))
    # as parity.run: bit-faithful only against a golden computed on the same kind of hardware
    col = tolerance_column(t.compute_dtype, spec.activation_quant, target_bit_faithful(t, gs.manifest, model_dir))
    out = noise_path(golden_dir, col)
    if out.exists() and not force:
        raise GoldenError(f"{out} exists; pass --force to replace it")
    if not os.access(out.parent, os.W_OK):  # before the capture (minutes on a large model), not after it
        raise GoldenError(f"{out.parent} is not writable: the noise floor {out.name} goes there")
    captured = t.capture(model_dir, gs.input_ids, spec_path=spec_path)
    floors = {}
    for n in gs.order:
        g, c = gs.tensors[n], captured.get(n)
        if c is None or tuple(c.shape) != tuple(g.shape):
            raise GoldenError(f"noise target {target!r} did not produce {n} with shape {tuple(g.shape)}")
        if not bool(torch.isfinite(c).all()):
            raise GoldenError(f"noise target {target!r} produced non-finite values in {n}")
        floors[n] = float((c.float() - g).abs().max())
    tol = resolve(col)
    limit = tol["model"].rtol * float(gs.tensors["logits"].abs().max()) + tol["model"].atol
    tk = topk_agreement(captured["logits"], gs.tensors["logits"], limit)
    if not tk.passed:
        raise GoldenError(f"noise target {target!r} has {tk.unexplained} unexplained top-10 differences against "
                          f"{golden_dir}: it is not a trustworthy floor ({tk.worst})")
    rec = {"format": FORMAT, "column": col, "target": t.name, "implementation": t.describe(),
           "factor": NOISE_FACTOR, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "torch_version": torch.__version__, "model": str(model_dir),
           "golden_manifest_sha256": sha256_file(Path(golden_dir) / MANIFEST),
           "top10": {"top1_agree": tk.top1_agree, "overlap": tk.overlap, "unexplained": tk.unexplained},
           "max_abs": floors}
    atomic_write_text(out, json.dumps(rec, indent=1))
    return out


def main(argv=None) -> int:
    from reference.checkpoint import CheckpointError

    from .targets import parse_options

    ap = argparse.ArgumentParser(prog="python -m parity.noise", description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--golden", type=Path, required=True)
    ap.add_argument("--target", default="bf16", help="the independent implementation that measures the floor")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    try:
        p = measure_noise(a.model, a.golden, target=a.target, target_options=parse_options(a.target_opt),
                          spec_path=a.spec, force=a.force)
    except (GoldenError, CheckpointError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (NotImplementedError, RuntimeError, AssertionError) as e:  # a target that cannot run this model (torch
        # without CUDA for device=cuda, ...): say why, not a traceback (as parity.run)
        print(f"error: target {a.target!r} could not run {a.model}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be read or written (a missing --spec, ...)
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - any other failure: 2 with its traceback, never a bare crash
        import traceback

        traceback.print_exc()
        print(f"error: the noise measurement failed: {type(e).__name__}: {e} (traceback above)", file=sys.stderr)
        return 2
    d = json.loads(p.read_text())
    worst = max(d["max_abs"].items(), key=lambda kv: kv[1])
    print(f"wrote {p}: {len(d['max_abs'])} floors from {d['implementation']}, largest {worst[0]} {worst[1]:.3g}; "
          f"top-1 {d['top10']['top1_agree']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
