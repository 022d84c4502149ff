"""Compare two golden sets (e.g. freshly dumped vs committed).

    python -m parity.golden_diff NEW OLD [--rtol 1e-6] [--cross-column fp32-a8]

Identical hashes are the expected case (the reference is deterministic); a difference within
``rtol`` of a tensor's max|value| is reported (another BLAS or torch build) but passes. Sets
computed on different hardware (manifest ``compute``: another CPU ISA, a GPU; or a set made
before the field existed) are compared within the ``--cross-column`` tiers instead: there the
last ulps differ, and with int8 activation quantisation that moves whole int8 steps
(parity.golden.bit_faithful_here)."""
from __future__ import annotations

import argparse
import math
import sys

import torch

from .golden import GoldenError, GoldenSet, computed_alike
from .tolerances import TABLE, resolve


def diff(new: GoldenSet, old: GoldenSet, rtol: float, cross_column: str = "fp32-a8") -> list[str]:
    problems = []
    made_new, made_old = new.manifest.get("compute"), old.manifest.get("compute")
    tiers = None
    if not computed_alike(made_new, made_old):
        tiers = resolve(cross_column)
        print(f"computed on {made_new or 'unrecorded hardware'} vs {made_old or 'unrecorded hardware'}: "
              f"compared within the {cross_column} tiers, not to {rtol:g}")
    if new.order != old.order:
        problems.append(f"canonical names differ: {set(new.order) ^ set(old.order)}")
    if not torch.equal(new.input_ids, old.input_ids):
        problems.append("the parity inputs differ")
    for name in new.order:
        if name not in old.tensors:
            continue
        a, b = new.tensors[name], old.tensors[name]
        if new.manifest["tensors"][name]["sha256"] == old.manifest["tensors"][name]["sha256"]:
            continue
        if a.shape != b.shape:
            problems.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
            continue
        err, ref = float((a - b).abs().max()), float(b.abs().max())
        rel = err / max(ref, 1e-30)
        line = f"{name}: not bit-identical, max_rel {rel:.2e}"
        if tiers is None:
            bad = rel > rtol
        else:
            tier = old.manifest["tensors"][name]["tier"]
            limit = tiers[tier].limit(ref)
            line += f" (max_abs {err:.2e}, {cross_column} {tier} limit {limit:.2e})"
            bad = err > limit
        print(line)
        if bad:
            problems.append(line)
    return problems


def _rtol(s: str) -> float:
    """--rtol: a finite number >= 0 (nan passed every difference: `rel > nan` is False; a negative one failed equal
    tensors)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {s!r}")
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.golden_diff", description=__doc__.split("\n")[0])
    ap.add_argument("new", help="golden set directory to check (e.g. freshly dumped)")
    ap.add_argument("old", help="golden set directory to check it against (e.g. the committed one)")
    ap.add_argument("--rtol", type=_rtol, default=1e-6,
                    help="a difference within rtol of a tensor's max|value| is reported but passes (same hardware)")
    ap.add_argument("--cross-column", default="fp32-a8", choices=sorted(TABLE),
                    help="tolerance column (parity.tolerances) for sets computed on different hardware")
    a = ap.parse_args(argv)
    try:
        new, old = GoldenSet.load(a.new), GoldenSet.load(a.old)
        problems = diff(new, old, a.rtol, a.cross_column)
    except GoldenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if problems:
        print("golden sets differ:\n  " + "\n  ".join(problems))
        return 1
    same = computed_alike(new.manifest.get("compute"), old.manifest.get("compute"))
    print(f"golden sets agree: {a.new} == {a.old}" + ("" if same else f" (within the {a.cross_column} tiers)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
