"""Llama's SiLU-mul inside down_proj's activation quantizer (TRIT_ACT_QUANT) against the kernels it replaces.

    python -m bench.act_quant [--cases 32:4096x14336,1:2560x6912] [--variant TRIT_ACT_QUANT_VECS=2] [--out DIR]
                              [--watchdog SECONDS]

In a Llama decoder layer the input of down_proj is silu(gate) * up: under vLLM's compiler one Inductor (Triton)
kernel computes it, then ternary_mm_a8 runs its activation quantizer and its GEMV - three kernels. With
TRIT_ACT_QUANT=1, trit::ternary_mm_a8_prologue(x = [gate | up], act = silu) has the cluster quantizer read [gate |
up] and quantize silu(gate) * up itself (csrc trit_mm_a8_act): two kernels, and the product never goes through
memory. Per case (M tokens, down_proj N x K, bf16), on rotated weights so L2 cannot hold them:

- op times, CUDA graph of calls (PDL as configured, bench.kernels.time_graph):
  ``plain_us``  torch.compile'd silu(gate) * up (Inductor's kernel, as vLLM runs it) + ternary_mm_a8;
  ``pro_us``    the prologue op without TRIT_ACT_QUANT (its act as torch ops above M = 1; the M = 1 prologue GEMV);
  ``actq_us``   the prologue op with TRIT_ACT_QUANT=1;
- kernel times, CUPTI durations with PDL off (median): the Inductor kernel (``act_k_us``), the plain quantizer
  (``quant_us``), the act quantizer (``actq_quant_us``) and the GEMV behind each (``gemv_us``, ``actq_gemv_us``);
- ``--variant``: the act-quant route again under each given environment (op time, its quantizer by CUPTI, exact);
- ``exact``: the TRIT_ACT_QUANT op's output equals ternary_mm_a8 of torch's eager silu(gate) * up bit for bit
  (the route's contract; Inductor's one-rounding product is timed, not compared).

Prints one line per case as it is measured (flushed), then a Markdown table; --out writes act-quant.json / .md
(bench.records.write_record: the next free stem, never over an earlier record). --watchdog: every case runs under
faulthandler.dump_traceback_later, so a hang prints every thread's stack and exits instead of eating the call's
time silently (H200 run 61). Runs on any CUDA GPU with compute capability 9.0 (thread-block clusters)."""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import shlex
import statistics
import sys

from bench.kernels import _f, cupti_kernel_events, parse_mnk_cases, time_graph, with_env
from bench.records import commit_id, write_record

DEFAULT_CASES = ("1:4096x14336,16:4096x14336,32:4096x14336,64:4096x14336,"
                 "1:2560x6912,16:2560x6912,32:2560x6912,64:2560x6912,32:8192x28672")
SILU = 2  # trit.ops.PROLOGUE_ACTS["silu"]


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    """'M:NxK,...' -> [(M, N, K)] (N x K: down_proj's weight, K the intermediate size); a clear error otherwise."""
    return parse_mnk_cases(text, "bench.act_quant", 1, 64, "the GEMV routes", "32:4096x14336")


def kernel_medians(fn, n_calls: int, groups: dict) -> dict:
    """{group: median CUPTI duration (us) of the kernels whose name contains any of groups[group]'s substrings}
    over n_calls calls of fn(i) (None: no such kernel ran)."""
    events = cupti_kernel_events(fn, n_calls)
    out = {}
    for g, subs in groups.items():
        ds = [float(e["dur"]) for e in events if any(s in e.get("name", "") for s in subs)]
        out[g] = statistics.median(ds) if ds else None
    return out


def parse_variants(texts: list[str]) -> list[dict]:
    """['KEY=VAL[,KEY=VAL]', ...] -> [{KEY: VAL}]: environments the act-quant route is also timed under (e.g.
    TRIT_ACT_QUANT_VECS=2, the plain quantizer's CTAs per row); a clear error for anything else."""
    out = []
    for t in texts:
        env = {}
        for item in t.split(","):
            k, sep, v = (part.strip() for part in item.partition("="))
            if not sep or not k.startswith("TRIT_") or k == "TRIT_" or not v:
                raise SystemExit(f"bench.act_quant: --variant {t!r}: expected TRIT_NAME=VALUE[,TRIT_NAME=VALUE], "
                                 "e.g. TRIT_ACT_QUANT_VECS=2")
            env[k] = v
        out.append(env)
    return out


def variant_label(env: dict) -> str:
    return ",".join(f"{k.removeprefix('TRIT_')}={v}" for k, v in env.items())


def measure(M: int, N: int, K: int, n_calls: int = 30, min_bytes: int = 160 << 20, variants=()) -> dict:
    import torch
    import torch.nn.functional as F

    from trit import ops

    g = torch.Generator(device="cuda").manual_seed(N * 131 + K + M)
    per = N * K // 4
    nt = max(2, min(16, -(-min_bytes // per)))
    packs = [ops.repack(torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda", generator=g)) for _ in range(nt)]
    scale = torch.rand(N, device="cuda", generator=g) + 0.5
    x = (torch.randn(M, 2 * K, device="cuda", generator=g) * 2).to(torch.bfloat16)
    # a fresh compile per case: one function compiled for the default's 9 shapes passes dynamo's recompile_limit
    # (8) and runs the 9th eagerly (found by a CPU dry run with the aot_eager backend)
    torch._dynamo.reset()

    @torch.compile(dynamic=False)
    def silu_mul(t):  # vLLM's SiluAndMul.forward_native under Inductor
        d = t.shape[-1] // 2
        return F.silu(t[..., :d]) * t[..., d:]

    plain = lambda i: torch.ops.trit.ternary_mm_a8(silu_mul(x), packs[i % nt], scale, N, K, None)  # noqa: E731
    def pro(i):
        return torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, SILU, packs[i % nt], scale, N, K, None)[0]
    on, off = {"TRIT_ACT_QUANT": "1"}, {"TRIT_ACT_QUANT": "0"}
    eager_h = F.silu(x[:, :K]) * x[:, K:]  # torch's two roundings: what the route reproduces
    want = torch.ops.trit.ternary_mm_a8(eager_h, packs[0], scale, N, K, None)  # every route's contract, computed once
    exact = bool(torch.equal(with_env(on, pro)(0), want))
    r = {"M": M, "N": N, "K": K, "exact": exact}
    calls = 4 * nt
    r["plain_us"] = time_graph([lambda i=i: plain(i) for i in range(calls)])
    r["pro_us"] = time_graph([lambda i=i: with_env(off, pro)(i) for i in range(calls)])
    r["actq_us"] = time_graph([lambda i=i: with_env(on, pro)(i) for i in range(calls)])
    quant, gemv = ("quant_rows",), ("a8_small_kernel", "a8_gemm_kernel")
    k0 = kernel_medians(with_env({"TRIT_PDL": "0"}, plain), n_calls,
                        {"act": ("triton", "silu", "mul"), "quant": quant, "gemv": gemv})
    k1 = kernel_medians(with_env({**on, "TRIT_PDL": "0"}, pro), n_calls, {"quant": quant, "gemv": gemv})
    r.update(act_k_us=k0["act"], quant_us=k0["quant"], gemv_us=k0["gemv"], actq_quant_us=k1["quant"],
             actq_gemv_us=k1["gemv"])
    r["variants"] = []
    for env in variants:  # the act-quant route under other settings: op time, its quantizer kernel, exactness
        venv = {**on, **env}
        kv = kernel_medians(with_env({**venv, "TRIT_PDL": "0"}, pro), n_calls, {"quant": quant})
        r["variants"].append({"env": variant_label(env),
                              "actq_us": time_graph([lambda i=i: with_env(venv, pro)(i) for i in range(calls)]),
                              "actq_quant_us": kv["quant"],
                              "exact": bool(torch.equal(with_env(venv, pro)(0), want))})
    packs.clear()
    torch.cuda.empty_cache()
    rnd = lambda d: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}  # noqa: E731
    r["variants"] = [rnd(v) for v in r["variants"]]
    return rnd(r)


def fmt(r: dict) -> str:
    return (f"M={r['M']:3d} {r['N']:6d}x{r['K']:<6d} exact={r['exact']}  op us: plain {r['plain_us']:.2f}  prologue "
            f"{r['pro_us']:.2f}  actq {r['actq_us']:.2f} ({r['plain_us'] / r['actq_us']:.2f}x)  kernels us: act "
            f"{_f(r['act_k_us'], '.2f')} + quant {_f(r['quant_us'], '.2f')} + gemv {_f(r['gemv_us'], '.2f')} | "
            f"act-quant {_f(r['actq_quant_us'], '.2f')} + gemv {_f(r['actq_gemv_us'], '.2f')}"
            + "".join(f" | [{v['env']}] actq {v['actq_us']:.2f} act-quant {_f(v['actq_quant_us'], '.2f')}"
                      f" exact={v['exact']}" for v in r.get("variants", [])))


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# SiLU-mul inside down_proj's quantizer (TRIT_ACT_QUANT) ({meta.get('device')}, {meta.get('date')}, "
             f"commit {meta.get('commit')})", "",
             "Op us: CUDA graph of calls on rotated weights (PDL on): plain = torch.compile'd silu(gate) * up + "
             "ternary_mm_a8; prologue = trit::ternary_mm_a8_prologue without TRIT_ACT_QUANT; actq = with it. "
             "Kernel us: CUPTI medians with PDL off. exact: actq equals ternary_mm_a8 of torch's eager product bit for bit.", "",
             "| M | N x K | plain us | prologue us | actq us | plain / actq | act + quant + GEMV us (plain) | "
             "act-quant + GEMV us | exact |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {r['plain_us']:.2f} | {r['pro_us']:.2f} | {r['actq_us']:.2f} | "
                     f"{r['plain_us'] / r['actq_us']:.2f}x | {_f(r['act_k_us'], '.2f')} + {_f(r['quant_us'], '.2f')} + "
                     f"{_f(r['gemv_us'], '.2f')} | {_f(r['actq_quant_us'], '.2f')} + {_f(r['actq_gemv_us'], '.2f')} | "
                     f"{r['exact']} |")
    vrows = [(r, v) for r in rows for v in r.get("variants", [])]
    if vrows:
        lines += ["", "The act-quant route under other settings (op us as actq above; its quantizer kernel by CUPTI):",
                  "", "| M | N x K | setting | actq us | plain / actq | act-quant kernel us | exact |",
                  "|---|---|---|---|---|---|---|"]
        for r, v in vrows:
            lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {v['env']} | {v['actq_us']:.2f} | "
                         f"{r['plain_us'] / v['actq_us']:.2f}x | {_f(v['actq_quant_us'], '.2f')} | {v['exact']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma list of M:NxK (down_proj N x K, M 1-64)")
    ap.add_argument("--out", default="", help="directory for act-quant.json / .md")
    ap.add_argument("--watchdog", type=float, default=120.0,
                    help="seconds a case may take before every thread's stack is printed and the process exits "
                    "(0: off)")
    ap.add_argument("--variant", action="append", default=[], metavar="TRIT_NAME=VALUE[,...]",
                    help="also time the act-quant route under this environment (repeatable), e.g. "
                    "TRIT_ACT_QUANT_VECS=2: the plain quantizer's CTAs per row")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases)
    variants = parse_variants(args.variant)
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("bench.act_quant: needs a CUDA GPU of compute capability 9.0+ (thread-block clusters)", file=sys.stderr)
        return 2
    rows = []
    for M, N, K in cases:
        if args.watchdog > 0:
            faulthandler.dump_traceback_later(args.watchdog, exit=True)
        r = measure(M, N, K, variants=variants)
        faulthandler.cancel_dump_traceback_later()
        rows.append(r)
        print(fmt(r), flush=True)
    meta = {"device": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(), "commit": commit_id(),
            "command": "python -m bench.act_quant " + shlex.join(argv if argv is not None else sys.argv[1:])}
    md = markdown(meta, rows)
    print(md)
    if args.out:
        write_record(args.out, "act-quant", {"meta": meta, "rows": rows}, md)
    return 0 if all(r["exact"] and all(v["exact"] for v in r["variants"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
