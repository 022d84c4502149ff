"""How much does x's footprint per SM cost the 8 < M <= 64 a8 GEMV?

    python -m bench.x_footprint [--cases 32:6144x4096,64:14336x4096] [--out DIR]

The GEMV (a8_small_kernel, MT = 4 / 8) reads x through the L1: every SM holds CTAs of every part of K, so each
SM pulls all of x (M x K int8: 128 KB at M = 32, K = 4096; 256 KB at M = 64) from L2, and ncu shows L1 hit rates
of 58-82% (H200 runs 51 / 58) - mostly the compulsory misses of that footprint. Run 58 showed the L1 size matters
(the least L1, carveout 100, ran up to 50% slower). This probe asks how much a GEMV whose CTAs on one SM share one
slice of K (split-K across SMs: x / ks per SM) could gain, before anyone writes one: it times the kernel on the
layer (N, K) with its default launch (ks split-K warps, nw tiles per CTA) against the same kernel on (f N, K / f)
forced to ks / f split-K warps and f nw tiles per CTA - the same grid, the same warps per CTA, the same k-blocks
per warp and the same weight bytes, but an x of K / f columns (a footprint f times smaller) and ks / f warps in
the in-CTA reduction. So the difference bounds what a K-slice-per-SM GEMV could win (it would pay a cross-CTA
reduction the (f N, K / f) problem does not have).

Kernel times come from the profiler (CUPTI durations, median over launches on rotated weights so L2 cannot hold
them), with programmatic dependent launch off (TRIT_PDL=0) so no duration includes a wait on the quantizer before.
Prints a table, writes DIR/x-footprint.json and .md when --out is given (bench.records.write_record: the next free
stem beside an earlier record, never over it). Runs on any CUDA GPU.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys

from bench.kernels import _f, cupti_kernel_events, parse_mnk_cases, rotated_a8_problem, time_graph, with_env
from bench.records import commit_id, write_record

DEFAULT_CASES = ("32:6144x4096,32:4096x4096,32:8192x8192,32:4096x14336,32:14336x4096,32:2560x6912,"
                 "64:14336x4096,64:6144x4096,64:8192x8192,64:4096x4096,64:2560x6912,64:13824x2560,64:4096x14336")
KBLOCK = 128  # the kernels' k-block (csrc/ternary.h kBlockK)
MAX_WARPS = 8  # warps per CTA of the v5 kernels (kV5Threads / 32)


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    """'M:NxK,...' -> [(M, N, K)]; a clear error for anything else."""
    return parse_mnk_cases(text, "bench.x_footprint", 9, 64, "the MT = 2 / 4 / 8 GEMV", "32:6144x4096")


def scaled_launches(N: int, K: int, ks: int, nw: int, factors=(2, 4, 8)) -> list[dict]:
    """The (f N, K / f) problems with the default launch's grid: ks / f split-K warps and f nw tiles per CTA, for
    each f that divides ks, keeps K / f a whole number of k-blocks and fits the CTA's warps."""
    out = []
    for f in factors:
        if ks % f or K % (f * KBLOCK) or nw * f * (ks // f) > MAX_WARPS:
            continue
        out.append({"f": f, "N": N * f, "K": K // f, "ks": ks // f, "nw": nw * f})
    return out


def _kernel_times(fn, n_calls: int, name: str = "a8_small_kernel", other: str = "quant_rows"
                  ) -> tuple[float, list, list, float | None]:
    """Median CUPTI duration (us) of the kernels whose name contains ``name`` over n_calls calls of fn(i), with
    the grid and block of the first, and the median of those whose name contains ``other`` (None: none ran)."""
    events = cupti_kernel_events(fn, n_calls)
    ks = [e for e in events if e.get("cat") == "kernel" and name in e.get("name", "")]
    if not ks:
        raise RuntimeError(f"bench.x_footprint: no {name} kernel in the profile (route not the GEMV?)")
    args = ks[0].get("args", {})
    qs = [float(e["dur"]) for e in events if e.get("cat") == "kernel" and other in e.get("name", "")]
    return (statistics.median(float(e["dur"]) for e in ks), args.get("grid"), args.get("block"),
            statistics.median(qs) if qs else None)


def measure(M: int, N: int, K: int, env: dict, n_calls: int = 30, min_bytes: int = 160 << 20,
            op_time: bool = False, norm: bool = False) -> dict:
    """The a8 op on (M, N, K) under ``env`` (TRIT_* knobs, read per call) with PDL off: the GEMV kernel's median
    duration, its grid and block, and the quantizer kernel's (quant_us); op_time: also the whole op per call under
    CUDA-graph replay with PDL as configured (op_us: bench.kernels' `a8` timing); norm: also the fused-norm route's
    two kernels with PDL off, trit::rms_norm_a8q (residual add + RMSNorm + quantizer, the tiled xq at M <= 32) and
    the GEMV on its quantization (ternary_mm_a8q), each by CUPTI (norm_q_us, gemv_pre_us)."""
    import torch

    packs, scale, x, op = rotated_a8_problem(M, N, K, N * 31 + K, min_bytes)
    nt = len(packs)
    g = torch.Generator(device="cuda").manual_seed(N * 31 + K + 1)  # (the norm route's inputs)
    knobs = {k: str(v) for k, v in env.items()}
    us, grid, block, q_us = _kernel_times(with_env({**knobs, "TRIT_PDL": "0"}, op), n_calls)
    if op_time:  # the op as configured (PDL as the caller has it), graph-replayed like bench.kernels' `a8`
        op_us = time_graph([lambda i=i: with_env(knobs, op)(i) for i in range(4 * nt)])
    if norm:  # the fused-norm route (TRIT_FUSED_NORM_QUANT, TRIT_FUSED_NORM_LAYOUT=1 at M <= 32), PDL off
        res = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        nw = (torch.rand(K, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
        lay = 1 if M <= 32 else 0
        nq = lambda i: torch.ops.trit.rms_norm_a8q(x, res, nw, 1e-5, lay)  # noqa: E731
        off = {**knobs, "TRIT_PDL": "0"}
        norm_q_us = _kernel_times(with_env(off, nq), n_calls, name="rms_norm_quant")[0]
        out, _, xq, xs, rs = nq(0)
        def pre(i):
            return torch.ops.trit.ternary_mm_a8q(out, xq, xs, rs, packs[i % nt], scale, N, K, None, lay)
        gemv_pre_us = _kernel_times(with_env(off, pre), n_calls)[0]
    packs.clear()  # the weights go before the next case allocates its own
    torch.cuda.empty_cache()
    r = {"M": M, "N": N, "K": K, "env": env, "us": round(us, 3), "grid": grid, "block": block,
         "weight_gbps": round(N * K / 4 / (us * 1e-6) / 1e9, 1), "quant_us": None if q_us is None else round(q_us, 3)}
    if op_time:
        r["op_us"] = round(op_us, 3)
    if norm:
        r["norm_q_us"], r["gemv_pre_us"] = round(norm_q_us, 3), round(gemv_pre_us, 3)
    return r


def run(cases, scale: bool = True, norm: bool = False, watchdog: float = 0.0) -> list[dict]:
    """Every case's rows (printed as measured); watchdog > 0: a case that takes longer prints every thread's stack
    and exits the process (faulthandler), so a hang shows where it is (H200 run 61 printed nothing)."""
    import faulthandler

    rows = []
    for M, N, K in cases:
        if watchdog > 0:
            faulthandler.dump_traceback_later(watchdog, exit=True)
        base = measure(M, N, K, {}, op_time=not scale, norm=norm)
        block = base["block"] or [32, 1, 1]
        ks, nw = max(1, int(block[0]) // 32), max(1, int(block[1]))
        base.update(f=1, ks=ks, nw=nw, x_kib=M * K / 1024)
        rows.append(base)
        print(fmt(base), flush=True)
        for s in (scaled_launches(N, K, ks, nw) if scale else []):
            r = measure(M, s["N"], s["K"], {"TRIT_KS": s["ks"], "TRIT_NW": s["nw"]})
            rb = r["block"] or [0, 0, 1]
            r.update(f=s["f"], ks=s["ks"], nw=s["nw"], x_kib=M * s["K"] / 1024, base_us=base["us"],
                     same_grid=r["grid"] == base["grid"] and int(rb[0]) * int(rb[1]) == int(block[0]) * int(block[1]))
            rows.append(r)
            print(fmt(r), flush=True)
        faulthandler.cancel_dump_traceback_later()
    return rows


def fmt(r: dict) -> str:
    rel = f"  {r['us'] / r['base_us']:.2f}x of base" if r.get("base_us") else ""
    if r.get("op_us") is not None:
        rel += f"  quantizer {_f(r.get('quant_us'), '.2f')} us, op (graph, PDL) {r['op_us']:.2f} us"
    if r.get("norm_q_us") is not None:
        rel += f"  rms_norm_a8q {r['norm_q_us']:.2f} us + its GEMV {r['gemv_pre_us']:.2f} us"
    return (f"M={r['M']:3d} {r['N']:6d}x{r['K']:<6d} f={r['f']} ks={r['ks']} nw={r['nw']} grid={r['grid']} "
            f"block={r['block']} x {r['x_kib']:.0f} KiB: {r['us']:7.2f} us ({r['weight_gbps']:.0f} GB/s weights){rel}")


def markdown(meta: dict, rows: list[dict]) -> str:
    if rows and all(r["f"] == 1 and "op_us" in r for r in rows):  # --no-scale: the op's parts
        lines = [f"# The a8 op at 8 < M <= 64: GEMV, quantizer and the rest ({meta.get('device')}, {meta.get('date')}, "
                 f"commit {meta.get('commit')})", "",
                 "GEMV and quantizer: CUPTI kernel durations (median, PDL off); op: bench.kernels' `a8` timing (CUDA "
                 "graph of calls on rotated weights, PDL on); rest = op - GEMV - quantizer (launch gaps, PDL waits).",
                 "", "| M | N x K | ks x nw | GEMV us | quantizer us | op us | rest us |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            rest = r["op_us"] - r["us"] - (r["quant_us"] or 0.0)
            lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {r['ks']} x {r['nw']} | {r['us']:.2f} | "
                         f"{_f(r['quant_us'], '.2f')} | {r['op_us']:.2f} | {rest:.2f} |")
        if any("norm_q_us" in r for r in rows):
            lines += ["", "The fused-norm route's kernels (CUPTI, PDL off): trit::rms_norm_a8q (residual add + "
                      "RMSNorm + quantizer; the tiled xq at M <= 32, row-major above) and the GEMV reading its "
                      "quantization (ternary_mm_a8q), beside the default's quantizer + GEMV (the norm kernel before "
                      "it not included).",
                      "", "| M | N x K | rms_norm_a8q us | its GEMV us | default quantizer + GEMV us |",
                      "|---|---|---|---|---|"]
            for r in rows:
                if "norm_q_us" in r:
                    lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {r['norm_q_us']:.2f} | {r['gemv_pre_us']:.2f} | "
                                 f"{(r['quant_us'] or 0.0) + r['us']:.2f} |")
        return "\n".join(lines) + "\n"
    lines = [f"# x footprint per SM in the 8 < M <= 64 a8 GEMV ({meta.get('device')}, {meta.get('date')}, "
             f"commit {meta.get('commit')})", "",
             "Kernel time (CUPTI, median, PDL off) of a8_small_kernel on the layer with its default launch (f = 1) and "
             "on (f N, K / f) with the same grid and warps per CTA (ks / f split-K warps, f x nw tiles per CTA): the "
             "same weight bytes and k-blocks per warp, x f times narrower.", "",
             "| M | N x K (layer) | f | problem | ks x nw | x per SM (KiB) | us | vs f = 1 | same grid |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = None
    for r in rows:
        if r["f"] == 1:
            base = r
        lines.append(f"| {r['M']} | {base['N']}x{base['K']} | {r['f']} | {r['N']}x{r['K']} | {r['ks']} x {r['nw']} | "
                     f"{r['x_kib']:.0f} | {r['us']:.2f} | "
                     f"{(r['us'] / base['us']) if r['f'] > 1 else 1.0:.2f}x | {r.get('same_grid', True)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma list of M:NxK (M 9-64)")
    ap.add_argument("--out", default="", help="directory for x-footprint.json / .md")
    ap.add_argument("--no-scale", action="store_true", help="no (f N, K / f) problems: each layer's GEMV, quantizer "
                    "and whole op (the op's parts)")
    ap.add_argument("--norm", action="store_true", help="with --no-scale: also the fused-norm route's kernels "
                    "(rms_norm_a8q and the GEMV on its quantization)")
    ap.add_argument("--watchdog", type=float, default=120.0, help="seconds a case may take before every thread's "
                    "stack is printed and the process exits (0: off)")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases)
    import datetime

    import torch

    if not torch.cuda.is_available():
        print("bench.x_footprint: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run(cases, scale=not args.no_scale, norm=args.norm and args.no_scale, watchdog=args.watchdog)
    meta = {"device": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
            "commit": commit_id(), "command": "python -m bench.x_footprint " +
            shlex.join(argv if argv is not None else sys.argv[1:])}
    md = markdown(meta, rows)
    print(md)
    if args.out:  # x-footprint.json / .md, or the next free stem (never over an earlier record)
        write_record(args.out, "x-footprint", {"meta": meta, "rows": rows}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
