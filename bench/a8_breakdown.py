"""Where does the a8 op's time go at 16 < M <= 256 (the GEMM-kernel route)?

    python -m bench.a8_breakdown [--cases 128:2560x2560,...] [--ks 1,2,4,8] [--env K=V[,K=V]]... [--out DIR]

At M = 96 - 192 the op takes ~16 us even on 640x2560 (0.1 us of weights at the read floor), where torch's bf16
GEMM takes ~6.5 us and humming-kernels ~13.5 us at 2560x2560 (H100 runs 70b / 71). This splits the op into its two
kernels - the quantizer (quant_rows_perm_kernel, which also zeroes the split-K tile counters) and a8_gemm_kernel -
by CUPTI durations (median over launches on rotated weights, PDL off so no duration includes a wait on the kernel
before), and times the whole op under CUDA-graph replay with PDL on (bench.kernels' `a8` timing); rest = op - the
kernels (launch gaps and what PDL does not hide). Each case runs with the default launch and with the split-K
count forced (TRIT_A8_GEMM_KS) to each --ks value, the main loop as the default picks it (csrc/a8_route.h), and
with each --env set of launch knobs (e.g. `--env TRIT_A8_GEMM_QCL=8 --env TRIT_A8_GEMM=1,TRIT_A8_GEMM_QCL=8`: the
cluster quantizer in front of the GEMM kernel, on its default route and on the GEMM route forced).

Prints a table, writes DIR/a8-breakdown.json / .md when --out is given (bench.records.write_record: the next free
stem beside an earlier record, never over it). Runs on any CUDA GPU with the trit extension.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys

from bench.kernels import cupti_kernel_events, parse_mnk_cases, rotated_a8_problem, time_graph, with_env
from bench.records import commit_id, write_record

DEFAULT_CASES = ("128:640x2560,128:2560x2560,128:6912x2560,128:2560x6912,128:4096x4096,128:4096x14336,"
                 "96:4096x4096,192:4096x4096,64:2560x6912,64:14336x4096,64:8192x8192")
QUANT, GEMM = "quant_rows", ("a8_gemm_kernel", "a8_small_kernel", "a8_kernel")  # the GEMM kernel, the GEMV (M <= 64)
# or the v4 a8 kernel (the default route of some M = 65 - 256 shapes)


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    return parse_mnk_cases(text, "bench.a8_breakdown", 17, 256, "the GEMM-kernel route", "128:2560x2560")


def parse_env(items: list[str]) -> list[dict]:
    """--env values: each 'KEY=VALUE[,KEY=VALUE]' one launch variant; keys are trit's TRIT_* knobs."""
    out = []
    for item in items:
        env = {}
        for kv in item.split(","):
            key, eq, val = kv.strip().partition("=")
            if not eq or not key.startswith("TRIT_") or not val:
                raise SystemExit(f"bench.a8_breakdown: --env {item!r}: expected TRIT_KNOB=VALUE[,TRIT_KNOB=VALUE]")
            env[key] = val
        out.append(env)
    return out


def kernel_split(events: list[dict]) -> dict:
    """Median CUPTI duration (us) per kernel kind (quantizer, GEMM, other) and the GEMM's grid / block."""
    by: dict[str, list[float]] = {"quant": [], "gemm": [], "other": []}
    grid = block = None
    mains, others = set(), set()
    for e in events:
        name = e.get("name", "")
        kind = "quant" if QUANT in name else "gemm" if any(g in name for g in GEMM) else "other"
        by[kind].append(float(e["dur"]))
        if kind == "gemm":
            mains.add(next(g for g in GEMM if g in name))
            if grid is None:
                grid, block = e.get("args", {}).get("grid"), e.get("args", {}).get("block")
        if kind == "other":
            others.add(name[:80])
    if not by["gemm"]:
        raise RuntimeError(f"bench.a8_breakdown: none of {GEMM} in the profile (a route this bench does not know); "
                           f"kernels seen: {sorted({e.get('name', '')[:60] for e in events})}")
    med = {k: (round(statistics.median(v), 3) if v else None) for k, v in by.items()}
    n_ops = len(by["gemm"])
    return {"quant_us": med["quant"], "gemm_us": med["gemm"], "other_us": med["other"],
            "other_per_op": round(len(by["other"]) / n_ops, 2), "other_kernels": sorted(others),
            "grid": grid, "block": block, "kernel": "+".join(sorted(mains))}  # (two: the median spans both)


def measure(M: int, N: int, K: int, env: dict, n_calls: int = 24, min_bytes: int = 160 << 20) -> dict:
    import torch

    packs, _, _, op = rotated_a8_problem(M, N, K, N * 31 + K + M, min_bytes)
    nt, per = len(packs), N * K // 4
    knobs = {k: str(v) for k, v in env.items()}
    ref = op(0)  # the default launch's output: every forced split-K must give the same bits
    same = bool(torch.equal(with_env(knobs, op)(0), ref))
    split = kernel_split(cupti_kernel_events(with_env({**knobs, "TRIT_PDL": "0"}, op), n_calls))
    op_us = time_graph([lambda i=i: with_env(knobs, op)(i) for i in range(4 * nt)])
    packs.clear()
    torch.cuda.empty_cache()
    kern = split["gemm_us"] + (split["quant_us"] or 0.0) + (split["other_us"] or 0.0) * split["other_per_op"]
    return {"M": M, "N": N, "K": K, "env": env, **split, "op_us": round(op_us, 3),
            "rest_us": round(op_us - kern, 3), "equal_default": same,
            "weight_gbps": round(per / (split["gemm_us"] * 1e-6) / 1e9, 1)}


def fmt(r: dict) -> str:
    env = ",".join(f"{k}={v}" for k, v in r["env"].items()) or "default"
    return (f"M={r['M']:3d} {r['N']:6d}x{r['K']:<6d} {env:18s} {r['kernel']} grid={r['grid']} block={r['block']}: quant "
            f"{r['quant_us']} gemm {r['gemm_us']:.2f} other {r['other_us']} x{r['other_per_op']} | op "
            f"{r['op_us']:.2f} rest {r['rest_us']:.2f} | equal {r['equal_default']}")


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# The a8 op at 16 < M <= 256: quantizer, GEMM kernel, the rest ({meta.get('device')}, "
             f"{meta.get('date')}, commit {meta.get('commit')})", "",
             f"Command: `{meta.get('command')}`", "",
             "quantizer / GEMM: CUPTI kernel durations (median, PDL off, rotated weights); op: CUDA graph of calls "
             "(PDL on), bench.kernels' `a8` timing; rest = op - kernels. `ks`: TRIT_A8_GEMM_KS forced (default: "
             "gemm_shape's rule), the grid's z extent. equal: bit-identical to the default launch.", "",
             "| M | N x K | launch | kernel | grid | quantizer us | GEMM us | other us (per op) | op us | rest us | equal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        env = ", ".join(f"{k}={v}" for k, v in r["env"].items()) or "default"
        lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {env} | {r['kernel']} | {r['grid']} | {r['quant_us']} | {r['gemm_us']:.2f} | "
                     f"{r['other_us']} ({r['other_per_op']}) | {r['op_us']:.2f} | {r['rest_us']:.2f} | "
                     f"{r['equal_default']} |")
    others = sorted({k for r in rows for k in r["other_kernels"]})
    if others:
        lines += ["", "Other kernels seen: " + "; ".join(f"`{o}`" for o in others)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma list of M:NxK (M 17-256)")
    ap.add_argument("--ks", default="1,2,4,8", help="split-K counts to force beside the default ('' : none)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V[,K=V]",
                    help="one more launch variant per case with these knobs set (repeatable)")
    ap.add_argument("--out", default="", help="directory for a8-breakdown.json / .md")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases)
    envs = parse_env(args.env)
    try:
        ks_list = [int(k) for k in args.ks.split(",") if k.strip()]
    except ValueError:
        raise SystemExit(f"bench.a8_breakdown: --ks {args.ks!r}: expected a comma list of integers") from None
    if any(k < 1 for k in ks_list):
        raise SystemExit(f"bench.a8_breakdown: --ks {args.ks!r}: split-K counts are >= 1")
    import datetime

    import torch

    if not torch.cuda.is_available():
        print("bench.a8_breakdown: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for M, N, K in cases:
        forced = [] if M <= 64 else [{"TRIT_A8_GEMM_KS": k} for k in ks_list]  # the GEMV ignores it
        for env in [{}] + forced + envs:
            r = measure(M, N, K, env)
            rows.append(r)
            print(fmt(r), flush=True)
    meta = {"device": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
            "commit": commit_id(), "command": "python -m bench.a8_breakdown " +
            shlex.join(argv if argv is not None else sys.argv[1:])}
    md = markdown(meta, rows)
    print(md)
    if args.out:
        write_record(args.out, "a8-breakdown", {"meta": meta, "rows": rows}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
