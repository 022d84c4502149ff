"""The fused RMSNorm + a8 quantizer (trit::rms_norm_a8q) against what it replaces, kernel by kernel.

    python -m bench.norm_quant [--cases 32:4096,16:8192] [--clusters 0,1,2,4,8] [--out DIR]

The fused-norm route (TRIT_FUSED_NORM_QUANT) runs one kernel, rms_norm_a8q, where the default route runs
Inductor's fused residual add + RMSNorm (a Triton kernel) and then the a8 op's own quantizer in front of the GEMV.
It pays only where one kernel is shorter than those two. H200 run 63 (CUPTI, PDL off) put the one-CTA kernel at
3.6-3.8 us for M = 32, K <= 4096 and 6.4 us at M = 16, K = 8192, against ~2.5 us for each of the two.
This bench times, per case (M rows, hidden size K), with programmatic dependent launch off so that no duration
includes a wait on the kernel before (CUPTI durations, median over calls):
  - rms_norm_a8q under every TRIT_RNQ_CLUSTER value asked for (0: the one-CTA kernel; n > 0: the row over a
    cluster of up to n CTAs, w loaded before the PDL wait - csrc rnq_cluster_size says which S a value gives);
  - torch.compile'd `rmsnorm(x + residual) * w` in bf16 (Inductor's kernel, the default route's norm);
  - the a8 op's quantizer (ternary_mm_a8's quant_rows* kernel, the default route's second kernel).
Every variant's outputs are checked against the one-CTA kernel's: the residual stream bit for bit, out within one
bf16 rounding step (the sum of squares is added in another order over a cluster), xq / xs / rowsum exactly
trit.ops.a8_quantize of the out it returned; a difference is printed and the exit status is 1.
Prints a table, writes DIR/norm-quant.json and .md when --out is given (bench.records.write_record: the next free
stem beside an earlier record, never over it). Runs on any CUDA GPU of compute capability 9.0 (clusters).
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys

from bench.kernels import _f, cupti_kernel_events, with_env
from bench.records import commit_id, write_record

DEFAULT_CASES = "1:4096,16:4096,32:2560,32:4096,64:4096,16:8192,32:8192,32:6912"
DEFAULT_CLUSTERS = "0,1,2,4,8"
MAX_K = 16384  # csrc kRnqMaxK


def parse_cases(text: str) -> list[tuple[int, int]]:
    """'M:K,...' -> [(M, K)]; a clear error (SystemExit naming the item) for anything else."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        try:
            m, k = item.split(":")
            M, K = int(m), int(k)
        except ValueError:
            raise SystemExit(f"bench.norm_quant: case {item!r}: expected M:K, e.g. 32:4096") from None
        if M < 1 or not (8 <= K <= MAX_K) or K % 8:
            raise SystemExit(f"bench.norm_quant: case {item!r}: need M >= 1 and K a multiple of 8 in 8..{MAX_K} "
                             f"(the cluster kernel's 16-byte rows; rms_norm_a8q's limit)")
        out.append((M, K))
    if not out:
        raise SystemExit("bench.norm_quant: no case given")
    return out


def parse_clusters(text: str) -> list[int]:
    try:
        vals = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"bench.norm_quant: --clusters {text!r}: expected a comma list of integers >= 0") from None
    if not vals or any(v < 0 for v in vals):
        raise SystemExit(f"bench.norm_quant: --clusters {text!r}: expected a comma list of integers >= 0")
    if 0 not in vals:
        vals = [0] + vals  # the one-CTA kernel: the reference every variant is checked against
    return list(dict.fromkeys(vals))


def _median_kernel(fn, n_calls: int, name: str) -> tuple[float, list | None]:
    """Per call, the summed CUPTI durations (us) of the kernels whose name contains ``name`` (Inductor may split
    a norm into more than one kernel), median over the calls, and the grid of the first such kernel."""
    events = [e for e in cupti_kernel_events(fn, n_calls) if e.get("cat") == "kernel"]
    ks = [e for e in events if name in e.get("name", "")]
    if not ks:
        names = sorted({e.get("name", "")[:60] for e in events})
        raise RuntimeError(f"bench.norm_quant: no kernel named like {name!r} in the profile (kernels: {names})")
    per = len(ks) // n_calls
    if per < 1 or len(ks) % n_calls:
        raise RuntimeError(f"bench.norm_quant: {len(ks)} kernels named like {name!r} in {n_calls} calls")
    durs = [sum(float(e["dur"]) for e in ks[i * per:(i + 1) * per]) for i in range(n_calls)]
    return statistics.median(durs), ks[0].get("args", {}).get("grid")


def check(ref: tuple, got: tuple, what: str, layout: int = 0) -> list[str]:
    """Differences of one variant's rms_norm_a8q outputs (written with xq layout ``layout``) from the one-CTA
    kernel's (empty: none)."""
    import torch

    from trit import ops

    bad = []
    out0, res0 = ref[0], ref[1]
    out, res, xq, xs, rs = got
    if not torch.equal(res, res0):
        bad.append(f"{what}: residual stream differs")
    step = 2 ** -7  # one bf16 rounding step, relative
    off = ((out.double() - out0.double()).abs() > step * out0.double().abs() + 1e-6).sum().item()
    if off:
        bad.append(f"{what}: {off} outputs off by more than one rounding step")
    want = ops.a8_quantize(out)
    if layout == 1:
        want = (ops.a8_tile(want[0], out.shape[0]), want[1], want[2])
    for g, w, name in zip((xq, xs, rs), want, ("xq", "xs", "rowsum")):
        if g.shape != w.shape or not torch.equal(g, w):
            bad.append(f"{what}: {name} is not a8_quantize of its out")
    return bad


def measure(M: int, K: int, clusters: list[int], n_calls: int = 50) -> tuple[dict, list[str]]:
    import torch

    from trit import ops

    g = torch.Generator(device="cuda").manual_seed(M * 100003 + K)
    x = (torch.randn(M, K, device="cuda", generator=g) * 3).to(torch.bfloat16)
    r = (torch.randn(M, K, device="cuda", generator=g) * 3).to(torch.bfloat16)
    w = (torch.rand(K, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    eps = 1e-5
    layout = 1 if 8 < M <= 32 else 0  # what the fused-norm route writes (TRIT_FUSED_NORM_LAYOUT=1)
    off = {"TRIT_PDL": "0"}
    row = {"M": M, "K": K, "layout": layout}
    problems: list[str] = []
    ref = None
    for n in clusters:
        env = {**off, "TRIT_RNQ_CLUSTER": str(n)}
        fn = with_env(env, lambda i: torch.ops.trit.rms_norm_a8q(x, r, w, eps, layout))
        us, grid = _median_kernel(fn, n_calls, "rms_norm_quant")
        row[f"rnq{n}_us"], row[f"rnq{n}_grid"] = round(us, 3), grid
        outs = fn(0)
        torch.cuda.synchronize()
        if ref is None:
            ref = outs
        else:
            problems += check(ref, outs, f"M={M} K={K} TRIT_RNQ_CLUSTER={n}", layout)

    def norm(a, b, wt):  # vLLM's RMSNorm with residual: h = a + b, then rmsnorm(h) * w (Inductor fuses both)
        h = a + b
        v = h.float().pow(2).mean(-1, keepdim=True)
        return (h.float() * torch.rsqrt(v + eps)).to(h.dtype) * wt, h

    cnorm = torch.compile(norm, dynamic=False)
    row["inductor_norm_us"] = round(_median_kernel(with_env(off, lambda i: cnorm(x, r, w)), n_calls, "triton")[0], 3)
    # the default route's quantizer: the a8 op's own (its kernel ahead of the GEMV), on a small layer
    N = 256
    packed = ops.repack(torch.randint(-1, 2, (N, K), device="cuda", dtype=torch.int8))
    scale = torch.ones(N, device="cuda")
    h = norm(x, r, w)[0]
    op = with_env(off, lambda i: torch.ops.trit.ternary_mm_a8(h, packed, scale, N, K, None))
    if M == 1:  # the a8 op quantizes a single row inside its GEMV (a8_small_kernel): no quantizer kernel to add
        _median_kernel(op, n_calls, "a8_small")  # (an error if that ever changes)
        row["quant_us"], row["quant_in_gemv"] = 0.0, True
    else:
        row["quant_us"] = round(_median_kernel(op, n_calls, "quant_rows")[0], 3)
    row["default_us"] = round(row["inductor_norm_us"] + row["quant_us"], 3)
    torch._dynamo.reset()
    return row, problems


def fmt(row: dict, clusters: list[int]) -> str:
    parts = " ".join(f"c{n} {_f(row.get(f'rnq{n}_us'), '5.2f')}" for n in clusters)
    return (f"M={row['M']:3d} K={row['K']:5d}  rms_norm_a8q: {parts}  |  Inductor norm {row['inductor_norm_us']:.2f} + "
            f"quantizer {row['quant_us']:.2f} = {row['default_us']:.2f} us")


def markdown(meta: dict, rows: list[dict], clusters: list[int], problems: list[str]) -> str:
    head = " | ".join(f"TRIT_RNQ_CLUSTER={n}" if n else "one-CTA kernel (0)" for n in clusters)
    lines = [f"# rms_norm_a8q vs Inductor's norm + the a8 quantizer ({meta.get('device')}, {meta.get('date')}, "
             f"commit {meta.get('commit')})", "",
             f"`{meta.get('command')}`", "",
             "CUPTI kernel durations (median, us), programmatic dependent launch off. rms_norm_a8q: residual add + "
             "RMSNorm + a8 quantizer in one kernel (tiled xq at 8 < M <= 32); the default route: Inductor's add + "
             "RMSNorm kernel, then the a8 op's quantizer (at M = 1 inside the GEMV, a8_small_kernel: quantizer 0 "
             "here, the GEMV's own share not counted). Grid in brackets (S CTAs per row x rows).", "",
             f"| M | K | {head} | Inductor norm | quantizer | default (sum) | best fused / default |",
             "|---|---|" + "---|" * len(clusters) + "---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{_f(r.get(f'rnq{n}_us'), '.2f')} {r.get(f'rnq{n}_grid') or ''}" for n in clusters)
        best = min(r[f"rnq{n}_us"] for n in clusters)
        lines.append(f"| {r['M']} | {r['K']} | {cells} | {r['inductor_norm_us']:.2f} | {r['quant_us']:.2f} | "
                     f"{r['default_us']:.2f} | {best / r['default_us']:.2f} |")
    lines += ["", "Checks against the one-CTA kernel: " + ("all passed." if not problems else "")]
    lines += [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma list of M:K (rows, hidden size)")
    ap.add_argument("--clusters", default=DEFAULT_CLUSTERS, help="comma list of TRIT_RNQ_CLUSTER values (0 added)")
    ap.add_argument("--out", default="", help="directory for norm-quant.json / .md")
    args = ap.parse_args(argv)
    cases, clusters = parse_cases(args.cases), parse_clusters(args.clusters)
    import datetime

    import torch

    if not torch.cuda.is_available():
        print("bench.norm_quant: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows, problems = [], []
    for M, K in cases:
        row, bad = measure(M, K, clusters)
        rows.append(row)
        problems += bad
        print(fmt(row, clusters), flush=True)
        for p in bad:
            print("  MISMATCH " + p, flush=True)
    meta = {"device": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
            "commit": commit_id(), "command": "python -m bench.norm_quant " +
            shlex.join(argv if argv is not None else sys.argv[1:])}
    md = markdown(meta, rows, clusters, problems)
    print(md)
    if args.out:
        write_record(args.out, "norm-quant", {"meta": meta, "rows": rows, "problems": problems}, md)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
