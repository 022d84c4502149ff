"""Executed instructions and stall samples per CUDA source line of one kernel, for two or more builds side by side:
where one build issues more than another (H200 run 34 found the chain kernel's regression this way).

    ncu --section SourceCounters -k regex:chain_kernel -c 1 -o rep python driver.py     (per build; -lineinfo)
    ncu -i rep.ncu-rep --page source --csv --print-source cuda,sass > build.csv
    python bench/ncu_lines.py old.csv new.csv --names 07242cf,new [--top 16]

Lines are matched by their source text (line numbers move between builds). ncu attributes an inlined
instruction to every source line it came from (a lambda's body and its call site), so the per-line sums exceed
the kernel's executed-instruction count; compare lines, not sums. Standard library only (runs on the GPU machine
without the repository on sys.path).
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from pathlib import Path

INSTR = "Instructions Executed"
STALL = "Warp Stall Sampling (All Samples)"


def load(path: Path) -> tuple[Counter, Counter, str]:
    """(instructions per source text, stall samples per source text, kernel name) of one `--page source --csv
    --print-source cuda,sass` export. Raises ValueError naming the file when the export has no such columns."""
    instr: Counter = Counter()
    stall: Counter = Counter()
    kernel = ""
    idx = None
    with open(path, newline="", errors="replace") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Function Name" and len(row) > 1:
                kernel = kernel or row[1]
                continue
            if row[0] == "Line No":
                # "Line No", "Source", "Address", "Source", metric names...: the CUDA line's metrics share columns
                if INSTR not in row or STALL not in row:
                    raise ValueError(f"{path}: no '{INSTR}' / '{STALL}' column (export with --section SourceCounters)")
                idx = (row.index(INSTR), row.index(STALL))
                continue
            if idx is None or not row[0].strip().isdigit():
                continue  # file headers, SASS rows (empty line number)
            try:
                n_i, n_s = int(row[idx[0]]), int(row[idx[1]])
            except (ValueError, IndexError):
                continue  # a source line whose text broke the row (an unbalanced quote)
            text = " ".join(row[1].split())
            instr[text] += n_i
            stall[text] += n_s
    if idx is None:
        raise ValueError(f"{path}: not an ncu source-page CSV (no 'Line No' header)")
    return instr, stall, kernel


def table(builds: list[tuple[str, Counter, Counter]], top: int = 16, width: int = 80) -> str:
    """Markdown: the `top` source lines whose executed instructions differ most between the first and the last
    build (the first is the reference), with every build's instructions and stall samples."""
    ref, last = builds[0][1], builds[-1][1]
    keys = set().union(*(b[1].keys() for b in builds))
    order = sorted(keys, key=lambda k: (-abs(last[k] - ref[k]), k))[:top]
    head = ["source line"] + [f"{n} instr" for n, _, _ in builds] + [f"{builds[-1][0]} - {builds[0][0]}"]
    head += [f"{n} stall samples" for n, _, _ in builds]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for k in order:
        text = (k if len(k) <= width else k[: width - 3] + "...").replace("|", "\\|")
        row = [f"`{text}`"] + [f"{b[1][k]:,}" for b in builds] + [f"{last[k] - ref[k]:+,}"]
        row += [str(b[2][k]) for b in builds]
        out.append("| " + " | ".join(row) + " |")
    sums = ["per-line sums (inlined lines counted at each line)"] + [f"{sum(b[1].values()):,}" for b in builds]
    sums += [f"{sum(last.values()) - sum(ref.values()):+,}"] + [str(sum(b[2].values())) for b in builds]
    out.append("| " + " | ".join(sums) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", type=Path, help="one export per build; the first is the reference")
    ap.add_argument("--names", help="comma list, one per file (default: the file names)")
    ap.add_argument("--top", type=int, default=16)
    args = ap.parse_args(argv)
    names = args.names.split(",") if args.names else [p.stem for p in args.csv]
    if len(names) != len(args.csv):
        print(f"ncu_lines: {len(args.csv)} files but {len(names)} names", file=sys.stderr)
        return 2
    builds = []
    for n, p in zip(names, args.csv):
        try:
            instr, stall, kernel = load(p)
        except (OSError, ValueError) as e:
            print(f"ncu_lines: {e}", file=sys.stderr)
            return 1
        print(f"- {n}: {p} ({kernel or 'kernel name not found'})")
        builds.append((n, instr, stall))
    print()
    print(table(builds, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
