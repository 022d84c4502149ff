"""Layer-tail benchmark at M = 1 (and --ms rows): trit::ternary_chain (one persistent kernel for a decoder
layer's tail) against the same tail as separate kernels, on the H200 or any CUDA GPU.

A tail is what a decoder layer runs from the attention output to the MLP output (BitNet: attn_sub_norm ->
o_proj, + residual -> post_attention_layernorm -> gate_up_proj, relu^2(gate) * up -> ffn_sub_norm ->
down_proj; Llama: o_proj, + residual -> post_attention_layernorm -> gate_up_proj, silu(gate) * up ->
down_proj). L tails with their own random weights run back to back in one CUDA graph (the weights of L
tails exceed L2, as a model's layers do) and the replay is timed per tail. Variants:

  chain  trit::ternary_chain, its kernel at M = 1 (gate and up paired in gate_up's epilogue; above M = 1 the
         composed ops, as pro)
  pro    the same op with TRIT_CHAIN_KERNEL=0: one ternary_mm_a8_prologue kernel per layer (norm inside) at
         M = 1, its composed ops above
  fnorm  per layer rms_norm_a8q (+ the activation as torch ops) then ternary_mm_a8q: norm kernel + GEMV
  fnorm-tiled  the same with the norm writing the tiled xq (layout 1, trit.ops.a8_tile) for the 8 < M <= 32 GEMV
  a8     per layer torch's RMSNorm / activation ops then ternary_mm_a8 (its quantizer fused at M = 1)
  a8-inductor, fnorm-inductor, fnorm-tiled-inductor  a8 / fnorm / fnorm-tiled with the torch ops between the layers
         (activation, residual add, RMSNorm where the route has no norm kernel) compiled by torch.compile, as
         vLLM's compiled graph runs them (Triton kernels, e.g. one fused add + RMSNorm): a8-inductor is the e2e
         `ours` route kernel for kernel, fnorm-tiled-inductor `ours-fnorm32-tiled`'s (H200 run 44: fnorm-tiled
         beat fnorm by 10 us a tail at M = 32 here, yet ours-fnorm32-tiled did not beat ours end to end;
         the eager a8 glue is no stand-in for Inductor's)
  bf16   the three layers as bf16 matmuls alone (no norms): a lower bound for the dense tail

Prints and writes <date>-<device>-chain.json / .md (device, date, commit, command) under --out, with the
weight floor: the tail's packed weight bytes at the 4.18 TB/s copy bandwidth measured on the H200.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from bench.kernels import time_graph, with_env
from bench.records import commit_id, write_record

COPY_TBPS = 4.18  # H200 device-to-device copy, ../shared/gpu/README.md
# family: (hidden, attention width, intermediate, act, sub-norms)
TAILS = {
    "2b": (2560, 2560, 6912, "relu2", True),
    "8b": (4096, 4096, 14336, "relu2", True),
    "8b-llama": (4096, 4096, 14336, "silu", False),
}
VARIANTS = ("chain", "pro", "fnorm", "a8", "bf16", "chain-nopf", "chain-cu8", "chain-tma", "chain-nopair", "chain-late",
            "chain-profcode", "fnorm-tiled", "a8-inductor", "fnorm-inductor", "fnorm-tiled-inductor")
# the chain op under knobs: no L2 bulk prefetch of the weights, 8 k-blocks per register chunk, input rows by
# one bulk copy per CTA instead of every thread's loads (M = 1), gate and up not paired (the down stage
# computing the activation of the whole gate_up row; the default before H200 run 27), each stage's norm weight
# and scales requested at its own stage's top instead of all at the kernel start (run 26b's timing)
VARIANT_ENV = {"pro": {"TRIT_CHAIN_KERNEL": "0"}, "chain-nopf": {"TRIT_CHAIN_L2PF": "0"}, "chain-cu8": {"TRIT_CHAIN_CU": "8"},
               "chain-tma": {"TRIT_CHAIN_TMA": "1"}, "chain-nopair": {"TRIT_CHAIN_PAIR": "0"},
               "chain-late": {"TRIT_CHAIN_EARLY": "0"},
               # the kernel with the phase-stamp code compiled in (a runtime test per stamp point), stamping nothing:
               # the default kernel before the stamps became a template flag
               "chain-profcode": {"TRIT_CHAIN_PROF": "0"}}


def make_tails(name: str, layers: int, dtype=torch.bfloat16, seed: int = 0, device: str = "cuda"):
    from trit import ops

    D, A, I, act, subnorm = TAILS[name]
    g = torch.Generator().manual_seed(seed)

    def lin(n, k):
        w = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
        return ops.repack(w).to(device), (torch.rand(n, generator=g) * 0.02 + 0.005).to(device)

    def nw(k):
        return (torch.rand(k, generator=g) + 0.5).to(dtype).to(device)

    tails = []
    for _ in range(layers):
        (po, so), (pg, sg), (pd, sd) = lin(D, A), lin(2 * I, D), lin(D, I)
        tails.append({"packed": [po, pg, pd], "scales": [so, sg, sd],
                      "nw": [nw(A) if subnorm else None, nw(D), nw(I) if subnorm else None],
                      "acts": [0, 0, ops.PROLOGUE_ACTS[act]], "Ns": [D, 2 * I, D], "Ks": [A, D, I]})
    return tails


def tail_bytes(name: str) -> int:
    """The tail's packed weight bytes (int32 words of trit.ops.packed_shape, padding included)."""
    from trit.ops import packed_shape

    D, A, I, _, _ = TAILS[name]
    return sum(4 * r * c for r, c in (packed_shape(D, A), packed_shape(2 * I, D), packed_shape(D, I)))


def glue(h, r, w, act: int, K: int, eps: float):
    """The torch ops in front of one layer: act(gate) * up (act 1 relu^2, 2 silu; h = [gate | up]), then the
    residual add (r not None: also returned, the new residual stream), then RMSNorm with weight w (w not None).
    Returns (h, residual_out or None)."""
    r_out = None
    if act:
        gate, up = h[:, :K], h[:, K:]
        h = (torch.relu(gate).square() if act == 1 else torch.nn.functional.silu(gate)) * up
    if r is not None:
        h = h + r
        r_out = h
    if w is not None:
        hf = h.float()
        h = (hf * torch.rsqrt(hf.square().mean(-1, keepdim=True) + eps) * w.float()).to(h.dtype)
    return h, r_out


_COMPILED_GLUE = []


def compiled_glue():
    """glue under torch.compile (Inductor; fullgraph, static shapes): one compiled entry per tail stage and M,
    so the recompile limit is raised past what a bench run needs (else dynamo falls back to eager unnoticed)."""
    if not _COMPILED_GLUE:
        import torch._dynamo
        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 256))
        _COMPILED_GLUE.append(torch.compile(glue, dynamic=False, fullgraph=True))
    return _COMPILED_GLUE[0]


def run_variant(v: str, t: dict, x, res, eps=1e-6):
    """One tail of variant v: (y, residual_out)."""
    ops = torch.ops.trit
    if v.startswith("chain") or v == "pro":
        return ops.ternary_chain(x, res, 1, t["nw"], t["acts"], t["packed"], t["scales"], t["Ns"], t["Ks"], eps)
    if v == "bf16":
        h = x
        for w in t["dense"]:
            h = torch.nn.functional.linear(h, w)
            if h.shape[1] == 2 * t["Ks"][2]:
                h = h[:, : t["Ks"][2]]
        return h, res
    base = v.removesuffix("-inductor")
    prep = compiled_glue() if v.endswith("-inductor") else glue
    h, r_out = x, None
    for s in range(3):
        K, N, act, w = t["Ks"][s], t["Ns"][s], t["acts"][s], t["nw"][s]
        r = res if s == 1 else None
        if base in ("fnorm", "fnorm-tiled") and w is not None:  # the norm (+ residual add) is the op's
            layout = 1 if base == "fnorm-tiled" else 0
            if act:
                h, _ = prep(h, None, None, act, K, eps)
            hn, r2, xq, xs, rs = ops.rms_norm_a8q(h.contiguous(), r, w, eps, layout)
            if s == 1:
                r_out = r2
            h = ops.ternary_mm_a8q(hn, xq, xs, rs, t["packed"][s], t["scales"][s], N, K, None, layout)
            continue
        if act or r is not None or w is not None:
            h, r2 = prep(h, r, w, act, K, eps)
            if s == 1:
                r_out = r2
        h = ops.ternary_mm_a8(h.contiguous(), t["packed"][s], t["scales"][s], N, K, None)
    return h, r_out


def bench(name: str, layers: int, variants, m: int = 1) -> list[dict]:
    tails = make_tails(name, layers)
    D = TAILS[name][0]
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(m, TAILS[name][1], generator=g)).to(torch.bfloat16).cuda()
    res = (torch.randn(m, D, generator=g)).to(torch.bfloat16).cuda()
    if "bf16" in variants:
        from trit import ops as o
        for t in tails:
            t["dense"] = [o.ternary_decode_ref(p, s, n, k, torch.bfloat16).cuda()
                          for p, s, n, k in zip(t["packed"], t["scales"], t["Ns"], t["Ks"])]
    # correctness first: the chain kernel against the composed op on the same inputs
    y_chain, _ = run_variant("chain", tails[0], x, res)
    y_pro, _ = with_env({"TRIT_CHAIN_KERNEL": "0"}, lambda _: run_variant("pro", tails[0], x, res))(0)
    torch.cuda.synchronize()
    diff = ((y_chain.float() - y_pro.float()).abs().max() / y_pro.float().abs().max().clamp_min(1e-30)).item()
    rows = []
    floor_us = tail_bytes(name) / (COPY_TBPS * 1e12) * 1e6
    for v in variants:
        env = VARIANT_ENV.get(v, {})

        def call(i, v=v):
            return run_variant(v, tails[i % layers], x, res)

        calls = [(lambda i=i, c=with_env(env, call): c(i)) for i in range(layers)]
        try:
            us = time_graph(calls)
        except Exception as e:  # noqa: BLE001 - a variant that fails is reported, not fatal
            rows.append({"tail": name, "m": m, "variant": v, "error": f"{type(e).__name__}: {e}"})
            print(f"{name} {v}: {e}", file=sys.stderr, flush=True)
            continue
        rows.append({"tail": name, "m": m, "variant": v, "us_per_tail": round(us, 2), "floor_us": round(floor_us, 2),
                     "pct_of_ceiling": round(100 * floor_us / us, 1), "layers": layers,
                     "chain_vs_pro_rel_diff": diff})
        print(json.dumps(rows[-1]), flush=True)
    return rows


POINTS = ("barrier", "load+sum", "norm+max", "quant+rowsum", "gemv", "epilogue")  # between the 7 stamps


def profile(name: str, layers: int, env: dict | None = None) -> dict:
    """Where the chain kernel's time goes, per stage: thread 0 of every CTA stamps globaltimer (ns) and
    clock64 at the start of each stage, after its barrier, after the row's pass 1 + the norm's sum, after
    pass 2 + the max, after pass 3 + the row sum, after the GEMV and after the epilogue (TRIT_CHAIN_PROF). The last of `layers` tails run eagerly is stamped (its weights are not
    in L2). Returns, per stage and phase, the median and max over CTAs in ns, and the kernel's span."""
    tails = make_tails(name, layers, seed=2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, TAILS[name][1], generator=g).to(torch.bfloat16).cuda()
    res = torch.randn(1, TAILS[name][0], generator=g).to(torch.bfloat16).cuda()
    G = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(G * 4 * (len(POINTS) + 1) * 2, dtype=torch.int64, device="cuda")
    for t in tails[:-1]:
        with_env(env or {}, lambda _, t=t: run_variant("chain", t, x, res))(0)
    with_env({**(env or {}), "TRIT_CHAIN_PROF": hex(buf.data_ptr())}, lambda _: run_variant("chain", tails[-1], x, res))(0)
    torch.cuda.synchronize()
    ts = buf.view(G, 4, len(POINTS) + 1, 2).cpu().double()
    S = 3
    out = {"tail": name, "env": env or {}, "stages": []}
    t_start, t_end = ts[:, 0, 0, 0].min().item(), ts[:, S - 1, len(POINTS), 0].max().item()
    out["span_us"] = round((t_end - t_start) / 1e3, 2)
    for s in range(S):
        st = {}
        for i, pname in enumerate(POINTS):
            d = ts[:, s, i + 1, 0] - ts[:, s, i, 0]
            st[pname] = {"median_us": round(d.median().item() / 1e3, 2), "max_us": round(d.max().item() / 1e3, 2)}
        # when the stage's slowest CTA finished vs its fastest (the next barrier waits for the slowest)
        fin = ts[:, s, len(POINTS), 0]
        st["finish_skew_us"] = round((fin.max() - fin.min()).item() / 1e3, 2)
        out["stages"].append(st)
    return out


def markdown(meta, rows) -> str:
    out = [f"# Layer-tail chain, {meta['device']}", ""]
    out += [f"- {k}: {meta[k]}" for k in ("date", "commit", "command", "torch", "cuda")]
    out += ["- per tail: L tails with their own weights in one CUDA graph, replay time / L (median of 7)",
            "- floor: the tail's packed ternary weight bytes / 4.18 TB/s", ""]
    keys = sorted({(r["tail"], r.get("m", 1)) for r in rows}, key=lambda k: (list(TAILS).index(k[0]), k[1]))
    out += ["| tail | M | " + " | ".join(f"{v} us" for v in VARIANTS) + " | floor us | chain % of ceiling | "
            "chain vs pro (rel. max diff) |", "|---" * (len(VARIANTS) + 5) + "|"]
    for t, m in keys:
        by = {r["variant"]: r for r in rows if r["tail"] == t and r.get("m", 1) == m}
        cells = [f"{by[v]['us_per_tail']:.1f}" if v in by and "us_per_tail" in by[v] else
                 ("error" if v in by else "-") for v in VARIANTS]
        any_row = next((r for r in by.values() if "floor_us" in r), {})
        ch = by.get("chain", {})
        out.append(f"| {t} | {m} | " + " | ".join(cells) + f" | {any_row.get('floor_us', '-')} | "
                   f"{ch.get('pct_of_ceiling', '-')} | {any_row.get('chain_vs_pro_rel_diff', float('nan')):.2e} |")
    profs = meta.get("profiles") or []
    if profs:
        out += ["", "Chain kernel phases (TRIT_CHAIN_PROF; one eager call, its weights not in L2), median / max over "
                "CTAs, us:", "", "| tail | knobs | span | stage | " + " | ".join(POINTS) + " | finish skew |",
                "|---" * (len(POINTS) + 5) + "|"]
        for p in profs:
            for s, st in enumerate(p["stages"]):
                out.append(f"| {p['tail']} | {p['env'] or '-'} | {p['span_us']} | {s} | " + " | ".join(
                    f"{st[k]['median_us']} / {st[k]['max_us']}" for k in POINTS) + f" | {st['finish_skew_us']} |")
    errs = [r for r in rows if "error" in r]
    if errs:
        out += [""] + [f"- {r['tail']} M={r.get('m', 1)} {r['variant']}: {r['error']}" for r in errs]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tails", default="2b,8b", help="comma list of " + ",".join(TAILS))
    ap.add_argument("--layers", type=int, default=8, help="tails per CUDA graph, each with its own weights")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--ms", default="1", help="comma list of rows (tokens) per tail, e.g. 1,8")
    ap.add_argument("--prof", action="store_true", help="also stamp the chain kernel's phases at M = 1 (TRIT_CHAIN_PROF)")
    args = ap.parse_args(argv)
    names = args.tails.split(",")
    bad = [n for n in names if n not in TAILS] + [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        sys.exit(f"bench.chain: unknown tail(s) / variant(s) {bad}; tails {list(TAILS)}, variants {list(VARIANTS)}")
    if not torch.cuda.is_available():
        sys.exit("bench.chain needs a CUDA GPU")
    from trit import ops

    props = torch.cuda.get_device_properties(0)
    meta = {"device": props.name, "sm_count": props.multi_processor_count,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit_id(),
            "command": "python -m bench.chain " + shlex.join(argv or sys.argv[1:]), "torch": torch.__version__,
            "cuda": torch.version.cuda, "host": platform.node(), "extension_loaded": ops.EXTENSION_LOADED}
    rows = []
    ms = [int(m) for m in args.ms.split(",")]
    if any(m < 1 for m in ms):
        sys.exit(f"bench.chain: --ms must be positive row counts, got {args.ms}")
    for n in names:
        for m in ms:
            rows += bench(n, args.layers, args.variants.split(","), m)
        if args.prof:
            for env in ({}, {"TRIT_CHAIN_PAIR": "0"}):
                meta.setdefault("profiles", []).append(profile(n, args.layers, env))
                print(json.dumps(meta["profiles"][-1]), flush=True)
    md = markdown(meta, rows)
    stem = dt.date.today().isoformat() + "-" + ("h200" if "H200" in props.name else props.name.replace(" ", "_")) + "-chain"
    js, _ = write_record(Path(args.out), stem, {"meta": meta, "rows": rows}, md)
    print(md)
    print(f"wrote {js} (+ .md)")


if __name__ == "__main__":
    sys.exit(main())
