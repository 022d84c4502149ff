"""Compare two golden sets (e.g. freshly dumped vs committed).

    python -m parity.golden_diff NEW OLD [--rtol 1e-6]

Identical hashes are the expected case (the reference is deterministic); a difference within
``rtol`` of a tensor's max|value| is reported (another BLAS or torch build) but passes."""
from __future__ import annotations

import argparse
import sys

import torch

from .golden import GoldenError, GoldenSet


def diff(new: GoldenSet, old: GoldenSet, rtol: float) -> list[str]:
    problems = []
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
        rel = float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
        line = f"{name}: not bit-identical, max_rel {rel:.2e}"
        print(line)
        if rel > rtol:
            problems.append(line)
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.golden_diff")
    ap.add_argument("new")
    ap.add_argument("old")
    ap.add_argument("--rtol", type=float, default=1e-6)
    a = ap.parse_args(argv)
    try:
        problems = diff(GoldenSet.load(a.new), GoldenSet.load(a.old), a.rtol)
    except GoldenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if problems:
        print("golden sets differ:\n  " + "\n  ".join(problems))
        return 1
    print(f"golden sets agree: {a.new} == {a.old}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
