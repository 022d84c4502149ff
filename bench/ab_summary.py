"""The table of a same-run A/B of bench.chain (ci/gpu_kernels.sh's ab stage): one row per (tail, M, variant), one
column per tree and round, the mean of each tree and `new - TREE` for every older tree.

    python bench/ab_summary.py DIR --trees 07242cf,51e21c0,new

DIR holds the raw outputs `ab-<tree>-<round>.txt` of `python -m bench.chain` (its JSON lines: tail, m, variant,
us_per_tail). A tree or round without any JSON line (a bench that failed or timed out) is listed as missing and
its cells are `-`, so a broken run shows as broken instead of vanishing from the table. Standard library only:
the script runs wherever the GPU job does, without the repository on sys.path.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_NAME = re.compile(r"^ab-(?P<tree>.+)-(?P<round>\d+)\.txt$")


def load(directory: Path) -> dict[tuple[str, int], list[dict]]:
    """{(tree, round): [bench.chain JSON records]} of every ab-TREE-ROUND.txt in directory."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for p in sorted(directory.iterdir()):
        m = _NAME.match(p.name)
        if not m or not p.is_file():
            continue
        recs = []
        for line in p.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if {"tail", "variant", "us_per_tail"} <= r.keys():
                    recs.append(r)
        runs[(m["tree"], int(m["round"]))] = recs
    return runs


def table(runs: dict[tuple[str, int], list[dict]], trees: list[str]) -> str:
    """Markdown: rows (tail, M, variant) in first-seen order, columns TREE ROUND in round-major order."""
    rounds = sorted({r for _, r in runs})
    cols = [(t, r) for r in rounds for t in trees if (t, r) in runs]
    cells: dict[tuple, dict[tuple[str, int], float]] = {}
    for c in cols:
        for rec in runs[c]:
            cells.setdefault((rec["tail"], rec.get("m", 1), rec["variant"]), {})[c] = float(rec["us_per_tail"])
    missing = [f"{t} {r}" for (t, r) in cols if not runs[(t, r)]]
    missing += [f"{t} (no output at all)" for t in trees if not any((t, r) in runs for r in rounds)]
    olds = [t for t in trees if t != "new"]
    head = ["tail", "M", "variant"] + [f"{t} {r}" for t, r in cols] + [f"{t} mean" for t in trees]
    head += [f"new - {t}" for t in olds] if "new" in trees else []
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for key, got in cells.items():
        means = {}
        for t in trees:
            v = [got[c] for c in cols if c[0] == t and c in got]
            means[t] = sum(v) / len(v) if v else None
        row = list(map(str, key)) + [f"{got[c]:.2f}" if c in got else "-" for c in cols]
        row += [f"{means[t]:.2f}" if means[t] is not None else "-" for t in trees]
        if "new" in trees:
            row += [f"{means['new'] - means[t]:+.2f}" if means["new"] is not None and means[t] is not None else "-"
                    for t in olds]
        out.append("| " + " | ".join(row) + " |")
    if missing:
        out.append("")
        out.append("missing (no bench.chain record): " + ", ".join(missing))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--trees", required=True, help="comma list in column order, e.g. 07242cf,51e21c0,new")
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        print(f"ab_summary: {args.dir} is not a directory", file=sys.stderr)
        return 2
    trees = [t for t in args.trees.split(",") if t]
    runs = load(args.dir)
    if not runs:
        print(f"ab_summary: no ab-TREE-ROUND.txt in {args.dir}", file=sys.stderr)
        return 1
    print(table(runs, trees))
    return 0


if __name__ == "__main__":
    sys.exit(main())
