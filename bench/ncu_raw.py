"""The metrics that explain a latency-bound kernel, per profiled kernel, from an ncu `--page raw --csv` export:
duration, achieved occupancy, the warp stall reasons (cycles per issued instruction, largest first), the L1 and
L2 traffic and hit rates, and the tensor pipe's share.

    ncu --set full --page raw --csv -k regex:a8_small_kernel -c 4 python driver.py > ncu-raw.csv
    python bench/ncu_raw.py ncu-raw.csv [--match REGEX ...] [--top 12]

ncu prints its own `==PROF==` lines into the same stream; they are skipped. Standard library only (runs on the
GPU machine without the repository on sys.path).
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

# metric-name patterns printed by default (full names; a pattern matching nothing prints nothing)
DEFAULT = [
    r"gpu__time_duration\.sum",
    r"sm__warps_active\.avg\.pct_of_peak_sustained_active",
    r"smsp__average_warp_latency_per_inst_issued\.ratio",
    r"smsp__issue_active\.avg\.pct_of_peak_sustained_active",
    r"smsp__inst_executed\.sum",
    r"l1tex__t_requests_pipe_lsu_mem_global_op_ld\.sum",
    r"l1tex__t_sectors_pipe_lsu_mem_global_op_ld\.sum",
    r"l1tex__t_sector_pipe_lsu_mem_global_op_ld_hit_rate\.pct",
    r"l1tex__t_output_wavefronts_pipe_lsu_mem_global_op_ld\.sum",
    r"l1tex__data_pipe_lsu_wavefronts\.avg\.pct_of_peak_sustained_elapsed",
    r"l1tex__throughput\.avg\.pct_of_peak_sustained_active",
    r"l1tex__m_xbar2l1tex_read_bytes\.sum",
    r"l1tex__m_xbar2l1tex_read_bytes\.sum\.per_second",  # L2 -> L1 bandwidth (x at M = 32: 8 bytes per weight byte)
    r"lts__t_sectors_srcunit_tex_op_read\.sum",
    r"lts__t_sector_hit_rate\.pct",
    r"lts__throughput\.avg\.pct_of_peak_sustained_elapsed",
    r"dram__bytes_read\.sum",
    r"dram__throughput\.avg\.pct_of_peak_sustained_elapsed",
    r"sm__pipe_tensor_op_imma_cycles_active\.avg\.pct_of_peak_sustained_active",
]
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def load(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """(names, units, rows) of a raw-page CSV. Raises ValueError naming the file when it holds no table."""
    names: list[str] | None = None
    units: list[str] = []
    rows: list[list[str]] = []
    with open(path, newline="", errors="replace") as f:
        for row in csv.reader(f):
            if not row or row[0].startswith("==") or row[0].startswith("WARNING"):
                continue
            if names is None:
                if row[0] == "ID" and "Kernel Name" in row:
                    names = row
                continue
            if not units and not row[0].strip().isdigit():
                units = row
                continue
            if len(row) == len(names):
                rows.append(row)
    if names is None:
        raise ValueError(f"{path}: no ncu raw table (expected a header row starting with \"ID\" and naming "
                         f"\"Kernel Name\"; was it made with `--page raw --csv`?)")
    if not rows:
        raise ValueError(f"{path}: the ncu raw table has a header but no kernel rows")
    return names, units or [""] * len(names), rows


def short_kernel(name: str) -> str:
    """`void ns::kern<args>(params)` -> `kern<args>`: the parameter list (the first "(" outside the template
    arguments) and the return type and namespaces before the name dropped"""
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    name = re.sub(r"^void\s+", "", name.strip())
    cut = name.rfind("::", 0, name.index("<") if "<" in name else len(name))
    return name[cut + 2:] if cut >= 0 else name


def num(v: str) -> float | None:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def summarize(path: Path, patterns: list[str], top: int = 12) -> str:
    names, units, rows = load(path)
    pats = [re.compile(p) for p in patterns]
    ki = names.index("Kernel Name")
    out = []
    for row in rows:
        head = short_kernel(row[ki])
        extra = [f"{k} {row[names.index(k)]}" for k in ("Grid Size", "Block Size") if k in names]
        out.append(f"== {row[0]}: {head}" + (f"  ({', '.join(extra)})" if extra else ""))
        stalls = []
        for i, n in enumerate(names):
            m = STALL.match(n)
            if m and not m.group(1).endswith("not_issued"):
                v = num(row[i])
                if v is not None and v > 0:
                    stalls.append((v, m.group(1)))
        if stalls:
            stalls.sort(reverse=True)
            tot = sum(v for v, _ in stalls)
            out.append("  stalls (cycles per issued instruction): " +
                       ", ".join(f"{s} {v:.2f}" for v, s in stalls[:top]) + f"  [sum {tot:.2f}]")
        for i, n in enumerate(names):
            if any(p.fullmatch(n) for p in pats):
                out.append(f"  {n} = {row[i]} {units[i]}".rstrip())
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--match", action="append", default=None,
                    help="metric-name regex (full match) to print; repeatable; replaces the default list")
    ap.add_argument("--top", type=int, default=12, help="stall reasons printed per kernel")
    a = ap.parse_args(argv)
    try:
        print(summarize(a.csv, a.match or DEFAULT, a.top))
    except (OSError, ValueError) as e:
        print(f"ncu_raw: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
