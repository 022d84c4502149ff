"""One parity run: a target against a golden set, with table, report and snapshots.

    python -m parity.run [--target bf16] [--model DIR] [--golden DIR] [--tol operator=1e-2] [--runs DIR]

Exit status: 0 pass, 1 divergence (the table and the first divergent layer are printed),
2 no comparison: bad input, a stale or corrupt golden set, or any other error (named, with a traceback
for an unexpected one) - never 1, which a CI gate reads as a numeric divergence.  The pytest suite (``pytest parity/``) calls the same
functions; this is the one-command form the README and CI use.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from reference.checkpoint import CheckpointError
from reference.config import ModelConfig
from reference.model import REFERENCE_VERSION
from reference.spec import spec_for

from .compare import Comparison, compare
from .diagnose import DecodeProbe, Diagnoser, depth_hint
from .dump import DEFAULT_GOLDEN, DEFAULT_MODEL, ROOT
from .golden import GoldenError, GoldenSet, StaleGolden, compute_fingerprint, regen_command, target_bit_faithful
from .noise import load_noise
from .report import check_runs_root, format_table, new_run_dir, table, write_report
from .targets import Target, get_target, parse_options
from .tolerances import column as tolerance_column, parse_overrides


def _q(p) -> str:  # a path as the shell reads it (spaces, quotes)
    return shlex.quote(str(p))


DEFAULT_RUNS = ROOT / "parity_runs"


@dataclass
class RunResult:
    comparison: Comparison
    golden: GoldenSet
    captured: dict
    run_dir: Optional[Path]
    seconds: float


def load_fresh_golden(golden_dir: Path, model_dir: Path, spec_path=None) -> GoldenSet:
    """The golden set, or StaleGolden naming what changed since it was made."""
    if not (Path(golden_dir) / "manifest.json").exists():  # the command to make it names this model
        raise GoldenError(f"{golden_dir}: no golden set here (no manifest.json); make one with "
                          f"`python -m parity.dump --ref --model {_q(model_dir)} --out {_q(golden_dir)}`")
    gs = GoldenSet.load(golden_dir)
    cfg = ModelConfig.load(model_dir)
    spec = spec_for(model_dir, cfg, spec_path)
    why = gs.staleness(model_dir, spec, REFERENCE_VERSION, cfg)
    top = int(gs.input_ids.max()) if gs.input_ids.numel() else -1
    if not why and top >= cfg.vocab_size:  # (an IndexError traceback from the target's embedding)
        raise GoldenError(f"{Path(golden_dir) / 'tensors.safetensors'}: input_ids hold token {top}, but "
                          f"{model_dir}/config.json has vocab_size {cfg.vocab_size}: expected ids < {cfg.vocab_size}; "
                          f"the set was edited after it was written - regenerate it with "
                          f"{regen_command(golden_dir, model=model_dir)}")
    if why:
        own = _own_model(gs)
        if own is not None and own.resolve() != Path(model_dir).resolve():
            # a current set of another model (say a --golden without its --model): regenerating it for this model
            # would replace that model's goldens, so the advice is the other way round
            raise StaleGolden(f"golden set {golden_dir} is stale for {model_dir}: {'; '.join(why)}. It is current for "
                              f"{own}: pass `--model {_q(own)}` to check that model, or dump goldens for {model_dir} into "
                              f"another directory (`python -m parity.dump --ref --model {_q(model_dir)} --out DIR`)")
        raise StaleGolden(f"golden set {golden_dir} is stale for {model_dir}: {'; '.join(why)}. Regenerate it with "
                          f"{regen_command(golden_dir, model=model_dir)}")
    return gs


def _own_model(gs: GoldenSet) -> Optional[Path]:
    """The model directory a golden set was made from, where it still exists and the set is current for it."""
    d = gs.manifest.get("model", {}).get("dir")
    if not d or not (Path(d) / "config.json").exists():
        return None
    try:
        cfg = ModelConfig.load(Path(d))
        fresh = not gs.staleness(Path(d), spec_for(Path(d), cfg), REFERENCE_VERSION, cfg)
    except Exception:  # noqa: BLE001 - an unreadable model there is simply not this set's own
        return None
    return Path(d) if fresh else None


def run_parity(target: Target | str, *, target_options: Optional[dict] = None, model_dir: Path = DEFAULT_MODEL, golden_dir: Path = DEFAULT_GOLDEN,
               spec_path=None, tol_overrides=None, runs_dir: Optional[Path] = DEFAULT_RUNS,
               diagnose: bool = True, use_noise: bool = True) -> RunResult:
    """use_noise: when the golden set holds a noise file for the target's tolerance column
    (parity.noise), limits may widen to NOISE_FACTOR x that measured floor."""
    t0 = time.time()
    target = get_target(target, **(target_options or {})) if isinstance(target, str) else target
    gs = load_fresh_golden(golden_dir, model_dir, spec_path)
    spec = spec_for(model_dir, ModelConfig.load(model_dir), spec_path)
    if runs_dir is not None:
        check_runs_root(runs_dir)  # before the capture (minutes on a large model), not after it
    captured = target.capture(model_dir, gs.input_ids, spec_path=spec_path)
    # a bit-faithful target is so only where the golden set was computed the same way (golden.py)
    claimed = target.faithful_for(model_dir)
    faithful = target_bit_faithful(target, gs.manifest, model_dir)
    diag = Diagnoser(DecodeProbe(model_dir, spec_path), exact=faithful,
                     fp32=target.compute_dtype == "fp32") if diagnose else None
    col = tolerance_column(target.compute_dtype, spec.activation_quant, faithful)
    note = None
    if target.bit_faithful and not claimed:
        note = (f"{target.name} is judged as an independent fp32 implementation ({col} tiers) on this model, not bit "
                f"for bit (see {type(target).__name__}.faithful_for)")
        print(f"parity: {note}", file=sys.stderr)
    elif target.bit_faithful and not faithful:
        note = (f"golden computed on {gs.manifest.get('compute') or 'unrecorded hardware'}, here "
                f"{compute_fingerprint(getattr(target, 'device', 'cpu'))}: {target.name} is judged as an independent fp32 implementation "
                f"({col} tiers), not bit for bit")
        print(f"parity: {note}", file=sys.stderr)
    noise = load_noise(golden_dir, col, exclude_target=target.name) if use_noise else None
    cmp = compare(gs.tensors, captured, order=gs.order, dtype=col, target_name=target.name,
                  tol_overrides=tol_overrides, diagnose=diag, noise=noise)
    fd = cmp.first_divergence
    # any nonzero error of a bit-faithful target is real: the earliest one is where to look
    first = next((r for r in cmp.results if r.max_abs == r.max_abs and r.max_abs > 0), None) if faithful else None
    if fd is not None:
        h = depth_hint(cmp.results)
        # growth with depth is what one broken operator also shows downstream: only beside an unexplained error
        if h and all(x.startswith("unstructured error") for x in fd.hints):
            fd.hints.append(h)
        if first is not None and first.order < fd.order:
            fd.hints.insert(0, f"the first nonzero difference (this target claims the reference's arithmetic bit "
                               f"for bit) is at {first.name}, max_abs {first.max_abs:.3g} within its limit "
                               f"{first.limit:.3g}: the fault is there or between it and {fd.name}")
    elif first is not None:  # every tensor within its tier, yet a target that claims bit-for-bit arithmetic differs
        n = sum(r.max_abs == r.max_abs and r.max_abs > 0 for r in cmp.results)
        cmp.notes.append(f"{n} tensors differ from the goldens, each within its tier, although this target claims the "
                         f"reference's arithmetic bit for bit (golden set made on this kind of host); the first nonzero "
                         f"difference is {first.name}, max_abs {first.max_abs:.3g} (limit {first.limit:.3g}): a real "
                         f"difference too small for the fp32 tier (an eps, an operation order) starts there")
    run_dir = None
    if runs_dir is not None:
        run_dir = new_run_dir(runs_dir, target.name)
        write_report(cmp, run_dir, golden=gs.tensors, target=captured, meta={
            "model": str(model_dir), "golden": str(golden_dir), "target": target.describe(),
            **({"tolerance_note": note} if note else {}),
            "seconds": round(time.time() - t0, 2)})
    return RunResult(cmp, gs, captured, run_dir, time.time() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.run", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="bf16")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="option for the target's constructor, e.g. --target-opt dtype=bfloat16")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--golden", type=Path, default=None)
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--tol", action="append", default=[], metavar="TIER[.atol|.rtol]=X")
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="where run directories go")
    ap.add_argument("--all", action="store_true", help="print every row, not only layers around failures")
    ap.add_argument("--no-noise", action="store_true",
                    help="static tiers only, even when the golden set holds a measured noise floor (parity.noise)")
    a = ap.parse_args(argv)
    golden = a.golden or ROOT / "golden" / a.model.resolve().name
    try:
        res = run_parity(a.target, target_options=parse_options(a.target_opt), model_dir=a.model, golden_dir=golden, spec_path=a.spec,
                         tol_overrides=parse_overrides(a.tol), runs_dir=a.runs, use_noise=not a.no_noise)
    except StaleGolden as e:
        print(f"STALE GOLDEN: {e}", file=sys.stderr)
        return 2
    except (GoldenError, CheckpointError, KeyError, ValueError) as e:
        # (str() of a KeyError is its repr: the message came out in quotes)
        print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
    except (NotImplementedError, RuntimeError, AssertionError) as e:  # a target that cannot run this model (e.g.
        # the kernel target refusing group scales, vLLM an attention head size, torch without CUDA for device=cuda):
        # say why, not a traceback
        print(f"error: target {a.target!r} could not run {a.model}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be read or written (a missing --spec, a --runs under a file, ...)
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - 1 means a measured divergence: any other failure is 2, with its traceback
        import traceback

        traceback.print_exc()
        print(f"error: the run failed before a comparison: {type(e).__name__}: {e} (traceback above)", file=sys.stderr)
        return 2
    cmp = res.comparison
    df = table(cmp)
    fd = cmp.first_divergence
    if fd is not None and not a.all:  # the rows around the first divergence, as the pytest plugin prints them
        lo, hi = max(0, fd.order - 3), fd.order + 8
        print(format_table(df.iloc[lo:hi]))
        if len(df) > hi - lo:
            print(f"({len(df) - len(df.iloc[lo:hi])} more rows in the report; --all prints every row)")
    else:
        print(format_table(df))
    print()
    print(cmp.summary())
    if res.run_dir:
        print(f"report: {res.run_dir}/report.md (csv, errors.png, summary.json{', failures.safetensors' if not cmp.passed else ''})")
    return 0 if cmp.passed else 1


if __name__ == "__main__":
    sys.exit(main())
