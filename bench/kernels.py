"""Per-layer kernel timings: trit ternary kernels vs torch bf16 matmul (and humming), one run.

    python -m bench.kernels [--shapes all|2b|8b|70b|2b-vllm|8b-vllm] [--ms 1,4,16,...] [--out DIR] [--quick]

Every variant is timed the same way: a CUDA graph of R back-to-back calls, each on a different
copy of the weights (R copies span >= ROTATE_BYTES, so the 60 MB L2 cannot serve them), replayed
and timed with CUDA events; the median per call is reported. This is the kernel-plus-launch time
that vLLM's CUDA-graph decode sees. bf16 and the production wrapper are also timed eagerly
(Python loop), which is how the numbers in shared/gpu/README.md were taken.

Writes <out>/<date>-<gpu>.json and .md with device, date, git commit and command.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from bench.records import commit_id, drop_partial, write_partial, write_record

COPY_BW = 4.18e12  # measured H200 device-to-device copy (bytes read + written), shared/gpu/README.md
ROTATE_BYTES = 200 << 20
SHAPES = {
    "2b": [(2560, 2560), (640, 2560), (6912, 2560), (2560, 6912)],
    "8b": [(4096, 4096), (14336, 4096), (4096, 14336)],
    "70b": [(8192, 8192), (28672, 8192), (8192, 28672)],
    # the merged layers vLLM runs (qkv = q + k + v, gate_up = gate + up): what the e2e step spends
    # its time in, and where the per-shape defaults switch
    "2b-vllm": [(3840, 2560), (13824, 2560)],
    "8b-vllm": [(6144, 4096), (28672, 4096)],
}
MS = [1, 4, 16, 32, 64, 256, 1024, 4096]
HUMMING_MS = (1, 16, 64, 128, 4096)  # humming JIT-compiles per shape and M bucket: keep it to these
# (128: the "never slower than 1.1x humming above M = 64" target needs a point past 64)


def n_copies(nbytes: int, cap: int = 256) -> int:
    return max(2, min(cap, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


def gpu_state() -> dict | None:
    """SM clock (MHz), power (W) and temperature (C) of GPU 0 from nvidia-smi, or None: recorded
    before and after each row, since the largest problems can run at power-limited clocks."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        sm, pw, tc = (v.strip() for v in out.strip().splitlines()[0].split(","))
        return {"sm_mhz": float(sm), "power_w": float(pw), "temp_c": float(tc)}
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def time_graph(calls, reps: int = 7) -> float:
    """Median microseconds per call of a CUDA graph that runs every callable once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in calls[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    del g
    return statistics.median(ts)


def time_eager(calls, reps: int = 5) -> float:
    for f in calls[:3]:
        f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        e0.record()
        for f in calls:
            f()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    return statistics.median(ts)


def parse_mnk_cases(text: str, prog: str, m_lo: int, m_hi: int, m_why: str, example: str) -> list[tuple[int, int, int]]:
    """'M:NxK,...' -> [(M, N, K)] with m_lo <= M <= m_hi; anything else exits naming the case (SystemExit)."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        try:
            m, nk = item.split(":")
            n, k = nk.lower().split("x")
            M, N, K = int(m), int(n), int(k)
        except ValueError:
            raise SystemExit(f"{prog}: case {item!r}: expected M:NxK, e.g. {example}") from None
        if not (m_lo <= M <= m_hi) or N < 1 or K < 1:
            raise SystemExit(f"{prog}: case {item!r}: M must be {m_lo}-{m_hi} ({m_why}), N, K >= 1")
        out.append((M, N, K))
    return out


def cupti_kernel_events(fn, n_calls: int) -> list[dict]:
    """The CUDA kernel events (chrome-trace dicts: name, dur in us, args grid / block) of n_calls calls of fn(i),
    after 3 warm-up calls, from torch's profiler (CUPTI durations)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n_calls):
            fn(i)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            return [e for e in json.load(fh).get("traceEvents", []) if e.get("cat") == "kernel"]


def rotated_a8_problem(M: int, N: int, K: int, seed: int, min_bytes: int = 160 << 20):
    """A random a8 problem on the GPU with enough weight copies (>= min_bytes of packed weights, 2 - 16 of them) that
    calls rotating over them read from HBM, not L2: (packs, scale, x bf16 [M, K], the op ``i -> ternary_mm_a8`` on
    copy i % len(packs))."""
    import torch
    from trit import ops

    g = torch.Generator(device="cuda").manual_seed(seed)
    nt = max(2, min(16, -(-min_bytes // (N * K // 4))))
    packs = [ops.repack(torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda", generator=g)) for _ in range(nt)]
    scale = torch.rand(N, device="cuda", generator=g) + 0.5
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    op = lambda i: torch.ops.trit.ternary_mm_a8(x, packs[i % nt], scale, N, K, None)  # noqa: E731
    return packs, scale, x, op


def with_env(env: dict, f):
    """f run with the given TRIT_* environment (read by the extension on every call, so also
    while a CUDA graph is captured: the graph keeps what was chosen then)."""
    def g(i):
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return f(i)
        finally:
            for k, v in old.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    return g


BP_MAX_M = 32  # csrc kA8BpMaxM: ternary_mm_a8_bp runs where the a8 GEMV has <= 4 row tiles
V5_MAX_M_FP, V5_MAX_M_A8 = 8, 64  # csrc/ternary_gemm.cu kV5MaxMFp / kV5MaxMA8 (a8: see a8_v5)
A8_DENSE_MIN_M = 256  # csrc/bindings.cpp a8_dense_min_m(): int8 decode + torch._int_mm from here on
# (TRIT_NW, TRIT_KS) pairs timed by --cfg-sweep at M > 8 (tiles per CTA x split-K warps <= 8)
CFG_SWEEP = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 4)]
# v5 variants beside the default (v5 kernels, PDL, L2 bulk prefetch): what each knob buys
SMALL_M_VARIANTS = {  # (--variants selects a subset)
    "v4": {"TRIT_KERNEL": "v4"},
    "nopdl": {"TRIT_KERNEL": "v5", "TRIT_PDL": "0"},
    "nopf": {"TRIT_KERNEL": "v5", "TRIT_L2PF": "0"},
    "pf": {"TRIT_KERNEL": "v5", "TRIT_L2PF": "2"},
}
KS_SWEEP = (1, 2, 4, 8)
# TRIT_NW (tiles per CTA) for the fused-quantizer a8 kernel, timed with --pf-head at M <= 8: every CTA quantizes
# the whole row of x, so nw tiles per CTA divide that redundant work by nw
FUSEQ_NW = (2, 4, 8)


def pack_hf_bitnet(w_int8: torch.Tensor) -> torch.Tensor:
    """transformers' BitNet pack_weights: uint8 [N/4, K], row r at bits 2*(r // (N/4)), code w+1."""
    N, K = w_int8.shape
    P = N // 4
    codes = (w_int8.to(torch.int32) + 1).view(4, P, K)
    out = torch.zeros(P, K, dtype=torch.int32, device=w_int8.device)
    for j in range(4):
        out |= codes[j] << (2 * j)
    return out.to(torch.uint8)


class Humming:
    """The humming-kernels BitNet GEMM (vLLM's `--quantization humming` path), if it runs here."""

    BUDGET_S = 150.0  # JIT compiles per shape: stop trying past this much wall time

    def __init__(self):
        self.error = None
        self.spent = 0.0
        try:
            from humming.layer import HummingLayer  # noqa: F401
            self.HummingLayer = HummingLayer
        except Exception as e:  # noqa: BLE001
            self.error = f"import failed: {type(e).__name__}: {e}"

    def make(self, w_int8: torch.Tensor, dtype=torch.bfloat16):
        N, K = w_int8.shape
        layer = self.HummingLayer(shape_n=N, shape_k=K, weight_config={"quant_method": "bitnet"},
                                  torch_dtype=dtype)
        layer.load_from_tensors({"weight": pack_hf_bitnet(w_int8).cpu(),
                                 "weight_scale": torch.ones(1, dtype=dtype)})
        layer = layer.cuda()
        layer.transform()
        return layer


# variants behind knobs that no GPU run has validated yet, as {name: at which M} (--no-experimental
# leaves them out, e.g. when the GPU tests of the same call failed: a kernel fault would end the
# whole bench). H200 run 12 validated the GEMM-shaped a8 kernel and two tiles per warp at
# M = 17-32, run 14 its other warp tiles; a new variant stays here until a GPU run has tested it.
# Run 17 validated the GEMM kernel's early weight stages (TRIT_A8_GEMM_EARLY, now the default) and
# measured the quantizer with several loads in flight (the ILP quantizer) slower, since removed.
# Run 19 validated the GEMM kernel's wgmma main loops (TRIT_A8_GEMM_WG=1 / 2, _OVERLAP; the 128-row
# overlapped loop the default on large problems since), runs 20 / 20c their deep rings (TRIT_A8_GEMM_WG_DEEP,
# the 64-row one the default where its tiles fit one wave: csrc/a8_route.h). Run 22 validated a8_pre
# (ternary_mm_a8q's direct GEMV: GPU tests, memcheck, racecheck), run 23 the cluster quantizer
# (TRIT_QUANT_CLUSTER; GPU tests, memcheck; the default on rows longer than 4096 since), run 24
# trit::rms_norm_a8q behind the norm + a8 / norm + a8q columns (GPU tests, memcheck, racecheck), run 25b
# trit::ternary_mm_a8_prologue behind the `norm in GEMV` column (GPU tests, memcheck; racecheck and
# synccheck on its own driver), run 32 a8_bp (ternary_mm_a8_bp, the bitplane layout: its GPU tests bit for bit
# against ternary_mm_a8 under every launch knob and graph replay, memcheck, racecheck; 0-37% slower than the code
# layout, 2026-12-02-h200-run32b-bitplane.md), H100 run 73 the GEMM kernel's cluster quantizer (TRIT_A8_GEMM_QCL,
# quant_rows_cluster_kernel kKbm: its GPU tests bit for bit against the loop kernel under every main loop, split-K and
# graph replay; the default on rows longer than 8192 since). None pending now.
EXPERIMENTAL: dict = {}  # name -> at_m(M): left out under --no-experimental (an earlier stage of the GPU job failed)
# TRIT_A8_GEMM_CFG values timed beside the default warp tile (csrc/ternary_gemm.cu gemm_cfg_id):
# 1 = 2 weight tiles x 8 row tiles per warp, 4 warps (128 channels x 64 rows per CTA); 2 = the same
# warp tile, 8 warps (256 channels); 3 = 4 weight tiles x 4 row tiles, 4 x 2 warps (256 channels);
# 4 = the same warp tile, 4 x 1 warps (256 channels x 32 rows).
GEMM_CFGS = (1, 2, 3, 4)
# split-K counts of the GEMM kernel forced beside its default (gemm_shape: up to one wave of CTAs)
GEMM_KS = (1, 2, 4, 8)


def bench_shape(N, K, ms, hum: Humming, out_rows, quick=False, ks_sweep=False, small_variants=None,
                cfg_sweep=(), experimental=True, pf_heads=(), pf_head_ms=(), only=None, humming_ms=HUMMING_MS):
    from trit import ops

    dev = "cuda"
    torch.manual_seed(N * 7 + K)
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device=dev)
    scale = torch.rand(N, device=dev) + 0.5
    packed = ops.repack(w)
    tern_bytes = packed.numel() * 4 + N * 4
    bf16_bytes = N * K * 2
    nt = n_copies(tern_bytes)
    nb = n_copies(bf16_bytes)
    packs = [packed.clone() for _ in range(nt)]
    # the bitplane (+1/-1 bitmask) layout of the same weights, for ternary_mm_a8_bp at M <= 32
    bps = [ops.repack_bitplane(packed)] if min(ms) <= BP_MAX_M else []
    bps += [bps[0].clone() for _ in range(nt - 1)] if bps else []
    wbf = [(w.to(torch.bfloat16) * scale[:, None].to(torch.bfloat16)) for _ in range(nb)]
    hum_layers, hum_err = [], hum.error
    if hum_err is None and hum.spent > hum.BUDGET_S:
        hum_err = f"skipped: humming setup/JIT time budget ({hum.BUDGET_S:.0f} s) used up"
    if hum_err is None:
        t0 = time.time()
        try:
            hum_layers = [hum.make(w) for _ in range(min(nt, 32))]
        except Exception as e:  # noqa: BLE001
            hum_err = f"setup failed: {type(e).__name__}: {e}"
            hum.error = hum_err  # do not retry on every shape
            traceback.print_exc()
        hum.spent += time.time() - t0

    for M in ms:
        x = torch.randn(M, K, device=dev).to(torch.bfloat16)
        row = {"N": N, "K": K, "M": M, "copies_ternary": nt, "copies_bf16": nb,
               "packed_bytes": tern_bytes, "bf16_bytes": bf16_bytes}
        # correctness spot check of each variant against the float64 reference (first copy)
        ref = ops.ternary_mm_ref(x, packed, scale, N, K).float()
        denom = ref.abs().max().item()
        big = M * N * K >= 4096 * 28672 * 8192 // 4
        variants = {
            "bf16": lambda i: x @ wbf[i % nb].t(),
            "fused": lambda i: torch.ops.trit.ternary_mm(x, packs[i % nt], scale, N, K, None),
            "dense": lambda i: x @ torch.ops.trit.ternary_decode(packs[i % nt], scale, N, K, x.dtype).t(),
            "linear": lambda i: ops.ternary_linear(x, packs[i % nt], scale, N, K),
            "a8": lambda i: torch.ops.trit.ternary_mm_a8(x, packs[i % nt], scale, N, K, None),
        }
        if M <= V5_MAX_M_A8:  # the default v5 path against v4 and with each launch knob off
            for tag, env in SMALL_M_VARIANTS.items():
                if small_variants is not None and tag not in small_variants:
                    continue
                if M <= V5_MAX_M_FP:
                    variants[f"fused_{tag}"] = with_env(env, variants["fused"])
                # the GEMV kernels' knobs: the GEMM-shaped kernel (a default at M > 32) stays off here
                variants[f"a8_{tag}"] = with_env({**env, "TRIT_A8_GEMM": "0"}, variants["a8"])
        if M == max(ms):  # the decode alone (M-independent): how much of `dense` is not cuBLAS
            variants["decode"] = lambda i: torch.ops.trit.ternary_decode(packs[i % nt], scale, N, K, x.dtype)
        if M <= 32:  # the default picks per shape (wn_auto, fuseq_auto): each choice forced
            variants["a8_plain"] = with_env({"TRIT_WN": "1", "TRIT_A8_FUSEQ": "0", "TRIT_A8_GEMM": "0"}, variants["a8"])
            variants["a8_wn2"] = with_env({"TRIT_WN": "2"}, variants["a8"])  # M 17-32: the MT = 4 kernel
        if 8 < M <= 32:  # the GEMV alone on a given quantization past M = 8 (TRIT_A8_PRE_MAXM=32: the MT = 2 / 4
            # kernels reading the row-major xq of rms_norm_a8q / a8_quantize): what a batch of decode tokens costs
            # behind the fused norm + quantizer
            xq_pre = ops.a8_quantize(x)
            variants["a8_pre"] = with_env({"TRIT_A8_PRE_MAXM": "32"}, lambda i, xq_pre=xq_pre:
                                          torch.ops.trit.ternary_mm_a8q(x, *xq_pre, packs[i % nt], scale, N, K, None))
        if 8 < M <= 32:  # the MT = 2 / 4 GEMV on the plain k-block-major xq (TRIT_A8_XI=0), the default before run 41's:
            # the default reads x interleaved for 512-byte warp loads
            variants["a8_noxi"] = with_env({"TRIT_A8_XI": "0"}, variants["a8"])
            # the interleaved xq's quantizer: the default takes the thread-block cluster kernel (up to 8 CTAs per row)
            # on rows longer than 4096, as at M <= 8 (H200 run 45); here the one-CTA loop kernel on every row
            # (TRIT_QUANT_CLUSTER_XI=0, the default before run 45) / the cluster kernel on every row (TRIT_QUANT_CLUSTER=8)
            variants["a8_xqloop"] = with_env({"TRIT_QUANT_CLUSTER_XI": "0"}, variants["a8"])
            variants["a8_xqcl8"] = with_env({"TRIT_QUANT_CLUSTER_XI": "1", "TRIT_QUANT_CLUSTER": "8"}, variants["a8"])
            # one CTA per row holding it in registers (TRIT_QUANT_CLUSTER=1: one pass where the loop kernel reads the
            # row twice; past K = 8192 the fewest CTAs that hold it: ceil(K / 8192))
            variants["a8_xqcl1"] = with_env({"TRIT_QUANT_CLUSTER_XI": "1", "TRIT_QUANT_CLUSTER": "1"}, variants["a8"])
        if 32 < M <= V5_MAX_M_A8:  # the MT = 8 GEMV (8 row tiles per warp): the default on layers of <= 64 Mi
            # weights (TRIT_A8_MT8_MAXW, Mi weights; 16 before H200 run 49), the GEMM kernel above. `a8_mt8` forces the GEMV on every layer;
            # `_noxi` on the plain k-block-major xq (TRIT_A8_XI=0: 8 rows x 4 quarter-used sectors per warp load
            # where the interleaved xq reads 256 contiguous bytes), `a8_xqloop` the one-CTA loop quantizer
            mt8 = {"TRIT_A8_MT8_MAXW": str(1 << 20), "TRIT_A8_GEMM": ""}
            variants["a8_mt8"] = with_env(mt8, variants["a8"])
            variants["a8_mt8_noxi"] = with_env({**mt8, "TRIT_A8_XI": "0"}, variants["a8"])
            variants["a8_mt8_xqloop"] = with_env({**mt8, "TRIT_QUANT_CLUSTER_XI": "0"}, variants["a8"])
            # the cluster quantizer on every row, one CTA per row where it fits (=1) / up to 8 (=8): the M = 64
            # layers behind humming in run 70 (2560x6912, 14336x4096, 8192x8192) are quantizer-bound
            variants["a8_mt8_xqcl1"] = with_env({**mt8, "TRIT_QUANT_CLUSTER": "1"}, variants["a8"])
            variants["a8_mt8_xqcl8"] = with_env({**mt8, "TRIT_QUANT_CLUSTER": "8"}, variants["a8"])
        if M <= BP_MAX_M and bps:  # the same route on the bitplane layout (bit-identical results)
            variants["a8_bp"] = lambda i: torch.ops.trit.ternary_mm_a8_bp(x, bps[i % nt], scale, N, K, None)
        if M <= 8:  # the quantizer fused into the GEMV
            variants["a8_fuseq"] = with_env({"TRIT_A8_FUSEQ": "1"}, variants["a8"])
            # the GEMV alone on a quantization made beforehand (ternary_mm_a8q: what a layer costs
            # when torch.compile has put the quantizer into the norm before it, TRIT_A8_PREQUANT)
            xq_pre = ops.a8_quantize(x)
            variants["a8_pre"] = lambda i, xq_pre=xq_pre: torch.ops.trit.ternary_mm_a8q(
                x, *xq_pre, packs[i % nt], scale, N, K, None)
            # the separate quantizer forced to the cluster kernel (TRIT_QUANT_CLUSTER=8: up to 8 CTAs per
            # row; the default on rows longer than 4096) / to the one-CTA loop kernel (=0)
            variants["a8_qcl"] = with_env({"TRIT_QUANT_CLUSTER": "8", "TRIT_A8_FUSEQ": "0"}, variants["a8"])
            variants["a8_qloop"] = with_env({"TRIT_QUANT_CLUSTER": "0", "TRIT_A8_FUSEQ": "0"}, variants["a8"])
            # the residual add and the norm inside the GEMV (trit::ternary_mm_a8_prologue, TRIT_A8_PROLOGUE):
            # one kernel at M = 1, the same arithmetic as the two columns above
            if K % 8 == 0:
                res_p = torch.randn(M, K, device=dev).to(torch.bfloat16)
                w_p = (torch.rand(K, device=dev) + 0.5).to(torch.bfloat16)
                variants["a8_pro"] = lambda i, res_p=res_p, w_p=w_p: torch.ops.trit.ternary_mm_a8_prologue(
                    x, res_p, w_p, 1e-6, 0, packs[i % nt], scale, N, K, None)[0]
        # a layer behind its RMSNorm (residual add included): trit::rms_norm_a8q then ternary_mm_a8 on its
        # output (the layer quantizes again: today's route, with this norm kernel standing in for
        # vLLM's) / then ternary_mm_a8q on the norm's quantization (TRIT_FUSED_NORM_QUANT)
        if M <= 32 and K <= ops.RMS_NORM_A8Q_MAX_K:  # M <= TRIT_A8_PRE_MAXM: the GEMV reads the norm's xq
            res_in = torch.randn(M, K, device=dev).to(torch.bfloat16)
            w_norm = (torch.rand(K, device=dev) + 0.5).to(torch.bfloat16)

            def a8_nq(i):
                h = torch.ops.trit.rms_norm_a8q(x, res_in, w_norm, 1e-6)[0]
                return torch.ops.trit.ternary_mm_a8(h, packs[i % nt], scale, N, K, None)

            def a8_fnorm(i):
                h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, res_in, w_norm, 1e-6)
                return torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, packs[i % nt], scale, N, K, None)

            variants["a8_nq"], variants["a8_fnorm"] = a8_nq, a8_fnorm
            if 8 < M <= 32:  # the norm writing the tiled xq (layout 1) the GEMV reads with its interleaved loads
                def a8_fnorm_t(i):
                    h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, res_in, w_norm, 1e-6, 1)
                    return torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, packs[i % nt], scale, N, K, None, 1)

                variants["a8_fnorm_t"] = a8_fnorm_t

        if M > 16:  # the GEMM kernel's quantizer on the default route (TRIT_A8_GEMM_QCL=n: 0 the loop kernel, n > 0
            # the cluster kernel of <= n CTAs per row, the row in registers, one pass; default: n = 1 at K > 8192);
            # where the default takes no GEMM kernel (v4, int8 cuBLAS) they time the same op
            for n in ("0", "1", "8"):
                variants[f"a8_gqcl{n}"] = with_env({"TRIT_A8_GEMM_QCL": n}, variants["a8"])
        if M > 16:  # the v4 route's (and int8 cuBLAS's) quantizer before session 47: one element per load, the v4
            # route without PDL (TRIT_A8_V4Q=0); where the default takes neither route it times the same op
            variants["a8_v4q0"] = with_env({"TRIT_A8_V4Q": "0"}, variants["a8"])
        if 64 < M <= 128:  # the MT = 8 GEMV over two row tiles of 64: TRIT_A8_MT8_ROWS2=1 on every layer it takes at
            # M = 64 (the default: <= 16 Mi weights), =0 never (the GEMM kernel / v4, before 94ef372)
            variants["a8_rows2"] = with_env({"TRIT_A8_MT8_ROWS2": "1"}, variants["a8"])
            variants["a8_rows2off"] = with_env({"TRIT_A8_MT8_ROWS2": "0"}, variants["a8"])
        if 16 < M <= 256:  # the three a8 routes, each forced (the default picks by shape: a8_gemm_on)
            # its mma.sync main loop (TRIT_A8_GEMM_WG=0; the wgmma loops below)
            gemm = {"TRIT_A8_GEMM": "1", "TRIT_A8_DENSE_MIN_M": str(1 << 30), "TRIT_A8_GEMM_WG": "0"}
            variants["a8_gemm"] = with_env(gemm, variants["a8"])
            for c in GEMM_CFGS:  # its other warp tiles (TRIT_A8_GEMM_CFG)
                variants[f"a8_gemm_c{c}"] = with_env({**gemm, "TRIT_A8_GEMM_CFG": str(c)}, variants["a8"])
            variants["a8_gemm_late"] = with_env({**gemm, "TRIT_A8_GEMM_EARLY": "0"}, variants["a8"])
            for k in GEMM_KS:  # its split-K count forced (TRIT_A8_GEMM_KS)
                variants[f"a8_gemm_ks{k}"] = with_env({**gemm, "TRIT_A8_GEMM_KS": str(k)}, variants["a8"])
            # the GEMM route forced with its default main loop (a8_route.h) and each quantizer (TRIT_A8_GEMM_QCL=n:
            # 0 the loop kernel, n the cluster kernel of <= n CTAs per row) - M = 128's small layers, which take v4 by
            # default (run 72)
            for n in ("0", "1", "8"):
                variants[f"a8_gemmq{n}"] = with_env({"TRIT_A8_GEMM": "1", "TRIT_A8_DENSE_MIN_M": str(1 << 30),
                                                     "TRIT_A8_GEMM_QCL": n}, variants["a8"])
            # the fused v4 kernel falls far behind above M = 256 (run 2)
            variants["a8_kernel"] = with_env({"TRIT_A8_GEMM": "0", "TRIT_A8_DENSE_MIN_M": str(1 << 30)}, variants["a8"])
        if V5_MAX_M_A8 < M <= 256:  # the op on 64-row slices of x (per-token quantization: each row's result is
            # the same): the MT = 8 GEMV per slice, a small layer's weights from L2 after the first; + the cat
            def a8_split64(i):
                return torch.cat([torch.ops.trit.ternary_mm_a8(x[j:j + V5_MAX_M_A8], packs[i % nt], scale, N, K, None)
                                  for j in range(0, M, V5_MAX_M_A8)])
            variants["a8_split64"] = a8_split64
        if M > V5_MAX_M_A8:
            variants["a8_int8"] = with_env({"TRIT_A8_GEMM": "0", "TRIT_A8_DENSE_MIN_M": "17"}, variants["a8"])
        if M > 16 and ops.WGMMA:  # the GEMM kernel's wgmma loops (compute capability 9.0, sm_90a build):
            # 64 rows per CTA up to M = 256, 128 rows above M = 64 (the only GEMM-kernel route past 256)
            for tag, wg, ov, deep in (("wg", "1", "0", "0"), ("wgov", "1", "1", "0"), ("wgdeep", "1", "1", "1"),
                                      ("wg2", "2", "0", "0"), ("wg2ov", "2", "1", "0"), ("wg2deep", "2", "1", "1")):
                if (M <= 256) if wg == "1" else (M > 64):
                    variants[f"a8_gemm_{tag}"] = with_env({"TRIT_A8_GEMM": "1", "TRIT_A8_DENSE_MIN_M": str(1 << 30),
                                                           "TRIT_A8_GEMM_WG": wg, "TRIT_A8_GEMM_WG_OVERLAP": ov,
                                                           "TRIT_A8_GEMM_WG_DEEP": deep},
                                                          variants["a8"])
        if M <= V5_MAX_M_A8:
            if M > 8 and M in cfg_sweep:
                for nw, ks in CFG_SWEEP:
                    variants[f"a8_nw{nw}ks{ks}"] = with_env({"TRIT_NW": str(nw), "TRIT_KS": str(ks)}, variants["a8"])
            if M in pf_head_ms and M <= V5_MAX_M_FP:  # the fused quantizer with nw tiles per CTA (TRIT_NW)
                for nw in FUSEQ_NW:
                    variants[f"a8_fqnw{nw}"] = with_env({"TRIT_A8_FUSEQ": "1", "TRIT_NW": str(nw)}, variants["a8"])
            if M in pf_head_ms:  # TRIT_L2PF=3: only the head of each warp's weights prefetched into L2
                for h in pf_heads:
                    variants[f"a8_pfh{h}"] = with_env({"TRIT_L2PF": "3", "TRIT_L2PF_HEAD": str(h)}, variants["a8"])
                    if M <= V5_MAX_M_FP:
                        variants[f"fused_pfh{h}"] = with_env({"TRIT_L2PF": "3", "TRIT_L2PF_HEAD": str(h)},
                                                             variants["fused"])
            if ks_sweep and M == 1:
                for ks in KS_SWEEP:
                    variants[f"a8_ks{ks}"] = with_env({"TRIT_KS": str(ks)}, variants["a8"])
                    variants[f"fused_ks{ks}"] = with_env({"TRIT_KS": str(ks)}, variants["fused"])
        if only is not None:  # --only: these columns (and bf16, the baseline) and no others
            variants = {k: v for k, v in variants.items()
                        if k == "bf16" or k in only or any(o.endswith("*") and k.startswith(o[:-1]) for o in only)}
        if not experimental:
            for name, at_m in EXPERIMENTAL.items():
                if at_m(M):
                    variants.pop(name, None)
        if hum_layers and M in humming_ms:
            variants["humming"] = lambda i: hum_layers[i % len(hum_layers)](x)
        if M >= 1024:  # the default once more, last: run 20 timed `a8` 7-25% slower at M = 4096 than
            variants["a8_last"] = variants["a8"]  # the same kernel later in the row (order / clocks?)
        def n_calls(name):  # graph length: one call per weight copy (fewer at the largest problems)
            n = nb if name == "bf16" else (len(hum_layers) if name == "humming" else nt)
            return max(2, min(n, 8)) if big else n

        row["gpu_before"] = gpu_state()
        for name, f in variants.items():
            if quick and name.startswith("a8") and big:
                continue
            if name == "fused" and M > 256:
                continue  # not a dispatch path there (run 2 measured it 3-10x slower than dense)
            t_start = time.time()
            try:
                y0 = f(0)
                y = y0.float()
                if name in ("a8_bp", "a8_noxi", "a8_xqloop", "a8_xqcl8", "a8_xqcl1", "a8_mt8", "a8_mt8_noxi",
                            "a8_mt8_xqloop", "a8_mt8_xqcl1", "a8_mt8_xqcl8", "a8_split64", "a8_gqcl0", "a8_gqcl1",
                            "a8_gqcl8", "a8_gemmq0", "a8_gemmq1", "a8_gemmq8", "a8_v4q0", "a8_rows2",
                            "a8_rows2off") \
                        and "a8" in variants:  # the default's result bit for bit (same sums)
                    row[f"{name}_equal"] = bool(torch.equal(y0, variants["a8"](0)))
                if name == "a8_fnorm_t" and "a8_fnorm" in variants:  # the row-major route's, bit for bit
                    row[f"{name}_equal"] = bool(torch.equal(y0, variants["a8_fnorm"](0)))
                if name == "decode":  # [N, K] W * scale, not an output
                    wref = w.float() * scale[:, None]
                    row["decode_relerr"] = (y - wref).abs().max().item() / wref.abs().max().item()
                elif not name.startswith("a8"):
                    row[f"{name}_relerr"] = (y - ref).abs().max().item() / denom
                calls = [(lambda i=i: f(i)) for i in range(n_calls(name))]
                row[f"{name}_us"] = time_graph(calls, reps=5 if big else 7)
                if name in ("bf16", "linear") and M <= 64:
                    row[f"{name}_eager_us"] = time_eager(calls)
            except Exception as e:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.synchronize()
            if name == "humming":
                hum.spent += time.time() - t_start
        if M >= 1024 and row.get("a8_us") and row.get("bf16_us"):
            # bf16 and the default a8 alternated, three rounds each, medians (`bf16_il`, `a8_il`): a side by
            # side that no position in the row favours (run 21: `a8` vs `a8_last` up to 17% apart)
            il = {"bf16": [], "a8": []}
            for _ in range(3):
                for name in il:
                    il[name].append(time_graph([(lambda i=i, f=variants[name]: f(i)) for i in range(n_calls(name))],
                                               reps=5 if big else 7))
            for name, ts in il.items():
                row[f"{name}_il_us"] = statistics.median(ts)
            row["a8_il_x_bf16"] = row["bf16_il_us"] / row["a8_il_us"]
        row["gpu_after"] = gpu_state()
        if hum_err:
            row["humming_error"] = hum_err[:300]
        b = row.get("bf16_us")
        for name in list(variants):
            t = row.get(f"{name}_us")
            if t and b and name != "decode":
                row[f"{name}_x_bf16"] = b / t
        t = row.get("linear_us")
        if t:
            row["linear_weight_GBps"] = tern_bytes / (t * 1e-6) / 1e9
            row["linear_pct_copy_ceiling"] = 100 * tern_bytes / (t * 1e-6) / COPY_BW
        for name in ("linear", "a8"):  # humming's time over ours: the bf16-activation path and W1.58A8
            if row.get("humming_us") and row.get(f"{name}_us"):
                row[f"{name}_x_humming"] = row["humming_us"] / row[f"{name}_us"]
        if row.get("fused_us"):
            row["fused_pct_copy_ceiling"] = 100 * tern_bytes / (row["fused_us"] * 1e-6) / COPY_BW
        row["floor_us"] = tern_bytes / COPY_BW * 1e6
        out_rows.append(row)
        print(fmt_row(row), flush=True)
    del packs, bps, wbf, hum_layers
    torch.cuda.empty_cache()


def _f(v, spec):
    return "-" if v is None else format(v, spec)


def fmt_row(r) -> str:
    return (f"{r['N']:>5}x{r['K']:<5} M={r['M']:<4} bf16 {_f(r.get('bf16_us'), '8.1f')}  "
            f"linear {_f(r.get('linear_us'), '8.1f')} ({_f(r.get('linear_x_bf16'), '5.2f')}x, "
            f"{_f(r.get('linear_pct_copy_ceiling'), '4.0f')}% ceil)  fused {_f(r.get('fused_us'), '8.1f')}  "
            f"(v4 {_f(r.get('fused_v4_us'), '6.1f')} nopdl {_f(r.get('fused_nopdl_us'), '6.1f')} "
            f"nopf {_f(r.get('fused_nopf_us'), '6.1f')} pf {_f(r.get('fused_pf_us'), '6.1f')})  dense {_f(r.get('dense_us'), '8.1f')}  "
            f"a8 {_f(r.get('a8_us'), '8.1f')} (v4 {_f(r.get('a8_v4_us'), '6.1f')} kernel {_f(r.get('a8_kernel_us'), '6.1f')} int8 {_f(r.get('a8_int8_us'), '6.1f')} gemm {_f(r.get('a8_gemm_us'), '6.1f')} cfg1-4 {'/'.join(_f(r.get(f'a8_gemm_c{c}_us'), '.1f') for c in GEMM_CFGS)} ks{'/'.join(map(str, GEMM_KS))} {'/'.join(_f(r.get(f'a8_gemm_ks{k}_us'), '.1f') for k in GEMM_KS)} late {_f(r.get('a8_gemm_late_us'), '.1f')} wgmma {'/'.join(_f(r.get(f'a8_gemm_{v}_us'), '.1f') for v in ('wg', 'wgov', 'wgdeep', 'wg2', 'wg2ov', 'wg2deep'))} plain {_f(r.get('a8_plain_us'), '6.1f')} wn2 {_f(r.get('a8_wn2_us'), '6.1f')} fuseq {_f(r.get('a8_fuseq_us'), '6.1f')} pre {_f(r.get('a8_pre_us'), '6.1f')} noxi {_f(r.get('a8_noxi_us'), '.1f')} qcl {_f(r.get('a8_qcl_us'), '.1f')} qloop {_f(r.get('a8_qloop_us'), '.1f')} norm+a8 {_f(r.get('a8_nq_us'), '.1f')} fnorm {_f(r.get('a8_fnorm_us'), '.1f')} fnorm_t {_f(r.get('a8_fnorm_t_us'), '.1f')} xqloop {_f(r.get('a8_xqloop_us'), '.1f')} xqcl8 {_f(r.get('a8_xqcl8_us'), '.1f')} mt8 {_f(r.get('a8_mt8_us'), '.1f')}/{_f(r.get('a8_mt8_noxi_us'), '.1f')}/{_f(r.get('a8_mt8_xqloop_us'), '.1f')} pro {_f(r.get('a8_pro_us'), '.1f')} nopdl "
            f"{_f(r.get('a8_nopdl_us'), '6.1f')} nopf {_f(r.get('a8_nopf_us'), '6.1f')} pf {_f(r.get('a8_pf_us'), '6.1f')})  "
            + "".join(f"ks{k} {_f(r.get(f'a8_ks{k}_us'), '.1f')}/{_f(r.get(f'fused_ks{k}_us'), '.1f')} "
                      for k in KS_SWEEP if r.get(f"a8_ks{k}_us")) +
            "".join(f"nw{nw}ks{ks} {_f(r.get(f'a8_nw{nw}ks{ks}_us'), '.1f')} "
                    for nw, ks in CFG_SWEEP if r.get(f"a8_nw{nw}ks{ks}_us")) +
            "".join(f"pfh{h} {_f(r.get(f'a8_pfh{h}_us'), '.1f')}/{_f(r.get(f'fused_pfh{h}_us'), '.1f')} "
                    for h in pf_head_keys(r)) +
            "".join(f"fqnw{n} {_f(r.get(f'a8_fqnw{n}_us'), '.1f')} " for n in FUSEQ_NW if r.get(f"a8_fqnw{n}_us")) +
            f"humming {_f(r.get('humming_us'), '8.1f')}  floor {r['floor_us']:.1f}"
            + (f"  alternated bf16 / a8 {r['bf16_il_us']:.1f} / {r['a8_il_us']:.1f} ({r['a8_il_x_bf16']:.2f}x)"
               if r.get("a8_il_us") else ""))


def pf_head_keys(r) -> list:
    """the TRIT_L2PF_HEAD values timed in row r (a8_pfh<h>_us keys), ascending"""
    return sorted(int(k[len("a8_pfh"):-3]) for k in r if k.startswith("a8_pfh") and k.endswith("_us"))


def markdown(meta, rows) -> str:
    lines = [f"# trit kernels vs torch bf16 on {meta['device']}", "",
             f"- date: {meta['date']}", f"- git commit: {meta['commit']}", f"- command: `{meta['command']}`",
             f"- torch {meta['torch']}, CUDA {meta['cuda']}; copy ceiling {COPY_BW / 1e12:.2f} TB/s",
             f"- humming: {meta.get('humming', '-')}",
             *([f"- INCOMPLETE: {meta['incomplete']}"] if meta.get("incomplete") else []),
             "- timing: CUDA graph of R calls over R weight copies (L2 cannot serve them), median "
             "per call; `eager` = Python loop. `linear` = trit.ops.ternary_linear (fused kernel for "
             f"M <= {meta['fused_max_m']}, else dense decode + cuBLAS); `fused` = torch.ops.trit.ternary_mm "
             "at every M; `dense` = ternary_decode + cuBLAS; `a8` = ternary_mm_a8 (W1.58A8). "
             "x = ratio of bf16 time to ours (higher is better); % ceil = packed-weight bytes / time "
             "against the copy ceiling; floor = packed bytes / 4.18 TB/s. M <= 8 (fused) and M <= 32-64 (a8) run the v5 kernels "
             "with programmatic dependent launch (and an L2 bulk prefetch of each warp's weights); the "
             "`v4` / `no PDL` / `L2 pf off / on` columns rerun the same op with TRIT_KERNEL=v4 / TRIT_PDL=0 / "
             "TRIT_L2PF=0 / TRIT_L2PF=2 (the default prefetches only for a8 on layers <= 4 MiB packed). a8 at "
             f"M >= {A8_DENSE_MIN_M} runs int8 decode + torch._int_mm + epilogue (below: the fused v4 a8 kernel); "
             "`a8 fused kernel / int8 cuBLAS / gemm kernel` force one route (TRIT_A8_DENSE_MIN_M=2^30 / 17 / "
             "TRIT_A8_GEMM=1 + TRIT_A8_GEMM_WG=0, the GEMM-shaped kernel's mma.sync loop for 16 < M <= 256, by default at M > 32 on large layers); "
             "`gemm cfg 1 / 2 / 3 / 4` rerun it with TRIT_A8_GEMM_CFG=1 / 2 / 3 / 4 (other warp tiles), "
             "`gemm ks 1 / 2 / 4 / 8` with its split-K count forced (TRIT_A8_GEMM_KS), `gemm late` the "
             "GEMM kernel with TRIT_A8_GEMM_EARLY=0 (weights only after the PDL wait, split-K slices one by one; the default "
             "requests its first weight stages before the wait), `wgmma 64 / 128 / 64 ov / 128 ov / 64 deep / 128 deep` the GEMM kernel with "
             "TRIT_A8_GEMM_WG=1 / 2 (its wgmma main loop with 64 / 128 rows per CTA, compute capability 9.0; 128 at M > 64, "
             "the only GEMM-kernel route above M = 256), `ov` with TRIT_A8_GEMM_WG_OVERLAP=1 (the next k-block fetched "
             "under the running wgmma), `deep` the overlapped loop with its deeper ring (TRIT_A8_GEMM_WG_DEEP=1: 6 / 3 k-blocks ahead); the default `a8` takes `64 deep`, `128 ov` or `64 ov` by shape at 32 < M <= 256 and `128 ov` above "
             "(csrc/a8_route.h picks the loop per shape). At M <= 32 "
             "the a8 default picks per shape; `WN=1 no fused q` / `WN=2` / `fused quantizer` force each "
             "choice (TRIT_WN=1 + TRIT_A8_FUSEQ=0 / TRIT_WN=2 / TRIT_A8_FUSEQ=1); at M <= 8 `pre-quantized` is "
             "the GEMV alone on a quantization made beforehand (ternary_mm_a8q) and `cluster q / loop q` the "
             "separate quantizer forced to the thread-block cluster kernel / the one-CTA loop kernel (TRIT_QUANT_CLUSTER=8 / 0, "
             "TRIT_A8_FUSEQ=0; the default takes the cluster kernel on rows longer than 4096); `norm + a8` / `norm + a8q (fused)` the layer behind its RMSNorm with residual add (trit::rms_norm_a8q), then ternary_mm_a8 quantizing again / ternary_mm_a8q on the norm's quantization (TRIT_FUSED_NORM_QUANT); `norm in GEMV` the same layer as trit::ternary_mm_a8_prologue (TRIT_A8_PROLOGUE: residual add and norm inside the GEMV, one kernel at M = 1); at 8 < M <= 32 `plain xq` the a8 op with the quantizer's plain k-block-major layout (TRIT_A8_XI=0; the default interleaves each 8-row tile for 512-byte warp loads); `norm + a8q tiled` the norm + a8q column with the norm writing that interleaved layout (layout 1, trit.ops.a8_tile; TRIT_FUSED_NORM_LAYOUT=1); `xq loop q / xq cluster q all rows` the a8 op with the interleaved xq's quantizer as the one-CTA loop kernel on every row (TRIT_QUANT_CLUSTER_XI=0; the default takes the thread-block cluster kernel on rows longer than 4096) / as the cluster kernel on every row (TRIT_QUANT_CLUSTER=8); both checked equal to the default.", "",
             "| N x K | M | bf16 us | linear us | x bf16 | % ceil | fused us | fused v4 | fused no PDL "
             "| fused L2 pf off / on | dense us | a8 us (x bf16) | a8 v4 | a8 WN=1 no fused q / WN=2 / fused quantizer / pre-quantized (GEMV alone) / cluster q / loop q / norm + a8 / norm + a8q (fused) / norm in GEMV / plain xq / norm + a8q tiled / xq loop q / xq cluster q all rows | a8 fused kernel / int8 cuBLAS / gemm kernel | gemm cfg 1 / 2 / 3 / 4 | gemm ks 1 / 2 / 4 / 8 | gemm late / wgmma 64 / 128 / 64 ov / 128 ov / 64 deep / 128 deep | a8 no PDL | a8 L2 pf off / on "
             "| humming us | x humming (linear / a8) | floor us | bf16 eager | linear eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a8 = r.get("a8_us")
        a8s = "-" if a8 is None else f"{a8:.1f} ({r.get('a8_x_bf16', 0):.2f}x)"
        lines.append(
            f"| {r['N']}x{r['K']} | {r['M']} | {_f(r.get('bf16_us'), '.1f')} | {_f(r.get('linear_us'), '.1f')} "
            f"| {_f(r.get('linear_x_bf16'), '.2f')} | {_f(r.get('linear_pct_copy_ceiling'), '.0f')} "
            f"| {_f(r.get('fused_us'), '.1f')} | {_f(r.get('fused_v4_us'), '.1f')} "
            f"| {_f(r.get('fused_nopdl_us'), '.1f')} | {_f(r.get('fused_nopf_us'), '.1f')} / {_f(r.get('fused_pf_us'), '.1f')} | {_f(r.get('dense_us'), '.1f')}{' (decode ' + _f(r.get('decode_us'), '.1f') + ')' if r.get('decode_us') else ''} "
            f"| {a8s} | {_f(r.get('a8_v4_us'), '.1f')} | {_f(r.get('a8_plain_us'), '.1f')} / {_f(r.get('a8_wn2_us'), '.1f')} / {_f(r.get('a8_fuseq_us'), '.1f')} / {_f(r.get('a8_pre_us'), '.1f')} / {_f(r.get('a8_qcl_us'), '.1f')} / {_f(r.get('a8_qloop_us'), '.1f')} / {_f(r.get('a8_nq_us'), '.1f')} / {_f(r.get('a8_fnorm_us'), '.1f')} / {_f(r.get('a8_pro_us'), '.1f')} / {_f(r.get('a8_noxi_us'), '.1f')} / {_f(r.get('a8_fnorm_t_us'), '.1f')} / {_f(r.get('a8_xqloop_us'), '.1f')} / {_f(r.get('a8_xqcl8_us'), '.1f')} | {_f(r.get('a8_kernel_us'), '.1f')} / {_f(r.get('a8_int8_us'), '.1f')} / {_f(r.get('a8_gemm_us'), '.1f')} "
            f"| {' / '.join(_f(r.get(f'a8_gemm_c{c}_us'), '.1f') for c in GEMM_CFGS)} "
            f"| {' / '.join(_f(r.get(f'a8_gemm_ks{k}_us'), '.1f') for k in GEMM_KS)} "
            f"| {' / '.join(_f(r.get(f'a8_gemm_{v}_us'), '.1f') for v in ('late', 'wg', 'wg2', 'wgov', 'wg2ov', 'wgdeep', 'wg2deep'))} "
            f"| {_f(r.get('a8_nopdl_us'), '.1f')} "
            f"| {_f(r.get('a8_nopf_us'), '.1f')} / {_f(r.get('a8_pf_us'), '.1f')} "
            f"| {_f(r.get('humming_us'), '.1f')} | {_f(r.get('linear_x_humming'), '.2f')} / {_f(r.get('a8_x_humming'), '.2f')} "
            f"| {r['floor_us']:.1f} | {_f(r.get('bf16_eager_us'), '.1f')} | {_f(r.get('linear_eager_us'), '.1f')} |")
    sweep = [r for r in rows if r.get("a8_ks1_us")]
    if sweep:
        lines += ["", "Split-K sweep at M = 1 (TRIT_KS: warps per 16-row tile; us, a8 / fused; "
                  "`default` = choose_cfg's choice):", "",
                  "| N x K | default a8 / fused | " + " | ".join(f"ks={k}" for k in KS_SWEEP) + " |",
                  "|---|---|" + "---|" * len(KS_SWEEP)]
        for r in sweep:
            lines.append(f"| {r['N']}x{r['K']} | {_f(r.get('a8_us'), '.1f')} / {_f(r.get('fused_us'), '.1f')} | "
                         + " | ".join(f"{_f(r.get(f'a8_ks{k}_us'), '.1f')} / {_f(r.get(f'fused_ks{k}_us'), '.1f')}"
                                      for k in KS_SWEEP) + " |")
    csweep = [r for r in rows if any(r.get(f"a8_nw{nw}ks{ks}_us") for nw, ks in CFG_SWEEP)]
    if csweep:
        lines += ["", "a8 launch-shape sweep at M > 8 (TRIT_NW tiles per CTA, TRIT_KS split-K warps; us; "
                  "`default` = small_cfg's choice):", "",
                  "| N x K | M | default | " + " | ".join(f"nw={nw} ks={ks}" for nw, ks in CFG_SWEEP) + " |",
                  "|---|---|---|" + "---|" * len(CFG_SWEEP)]
        for r in csweep:
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(r.get('a8_us'), '.1f')} | "
                         + " | ".join(_f(r.get(f"a8_nw{nw}ks{ks}_us"), ".1f") for nw, ks in CFG_SWEEP) + " |")
    hsweep = [r for r in rows if pf_head_keys(r)]
    if hsweep:
        heads = sorted({h for r in hsweep for h in pf_head_keys(r)})
        lines += ["", "L2 head prefetch (TRIT_L2PF=3: each warp bulk-prefetches only its first TRIT_L2PF_HEAD k-blocks, "
                  "512 B each, into L2 before the PDL wait, while the quantizer before the GEMV runs; the default "
                  "prefetches the whole range on layers <= 4 MiB packed and nothing above). us, a8 / fused "
                  "(fused: M <= 8); `pre-quantized` is the a8 GEMV without a quantizer in front:", "",
                  "| N x K | M | default a8 / fused | pre-quantized | L2 pf off / whole range (a8) | "
                  + " | ".join(f"head {h}" for h in heads) + " | fused quantizer nw = 1 / "
                  + " / ".join(map(str, FUSEQ_NW)) + " |",
                  "|---|---|---|---|---|" + "---|" * (len(heads) + 1)]
        for r in hsweep:
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(r.get('a8_us'), '.1f')} / {_f(r.get('fused_us'), '.1f')} "
                         f"| {_f(r.get('a8_pre_us'), '.1f')} | {_f(r.get('a8_nopf_us'), '.1f')} / {_f(r.get('a8_pf_us'), '.1f')} | "
                         + " | ".join(f"{_f(r.get(f'a8_pfh{h}_us'), '.1f')} / {_f(r.get(f'fused_pfh{h}_us'), '.1f')}"
                                      for h in heads) + " | " + _f(r.get("a8_fuseq_us"), ".1f") + " / "
                         + " / ".join(_f(r.get(f"a8_fqnw{n}_us"), ".1f") for n in FUSEQ_NW) + " |")
    mt8 = [r for r in rows if r.get("a8_mt8_us") or r.get("a8_mt8_error")]
    if mt8:
        lines += ["", "W1.58A8 at 32 < M <= 64 (us): the default (the MT = 8 GEMV on layers of <= TRIT_A8_MT8_MAXW Mi weights, else the "
                  "GEMM kernel), the MT = 8 GEMV forced on every layer (TRIT_A8_MT8_MAXW) on the interleaved xq (8-byte "
                  "pieces: 256 contiguous bytes per warp load), on the plain k-block-major xq (TRIT_A8_XI=0) and with "
                  "the one-CTA loop quantizer (TRIT_QUANT_CLUSTER_XI=0); `equal`: each bit for bit the default's.", "",
                  "| N x K | M | bf16 | default a8 (x bf16) | MT = 8 GEMV | plain xq | loop quantizer | humming | "
                  "humming / best | equal |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in mt8:
            best = min((t for t in (r.get("a8_us"), r.get("a8_mt8_us")) if t), default=None)
            h = r.get("humming_us")
            eq = all(r.get(f"{k}_equal", True) for k in ("a8_mt8", "a8_mt8_noxi", "a8_mt8_xqloop"))
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(r.get('bf16_us'), '.1f')} | {_f(r.get('a8_us'), '.1f')} "
                         f"({_f(r.get('a8_x_bf16'), '.2f')}x) | {_f(r.get('a8_mt8_us'), '.1f')} | "
                         f"{_f(r.get('a8_mt8_noxi_us'), '.1f')} | {_f(r.get('a8_mt8_xqloop_us'), '.1f')} | {_f(h, '.1f')} | "
                         f"{_f(h / best if h and best else None, '.2f')}x | {eq} |")
    qk = ("a8_xqcl1", "a8_mt8_xqcl1", "a8_mt8_xqcl8", "a8_gqcl0", "a8_gqcl1", "a8_gqcl8", "a8_gemmq0", "a8_gemmq1",
          "a8_gemmq8")
    qrows = [r for r in rows if any(r.get(f"{k}_us") or r.get(f"{k}_error") for k in qk)]
    if qrows:
        lines += ["", "The a8 quantizer in front of the GEMV / GEMM kernel (us): the default; the cluster kernel on every "
                  "row (TRIT_QUANT_CLUSTER=1 / 8: the row in registers, one pass, <= 1 / 8 CTAs per row) behind the "
                  "M <= 32 GEMV and the MT = 8 GEMV forced (`mt8`); in front of the GEMM kernel "
                  "(TRIT_A8_GEMM_QCL=0 / 1 / 8; 0 = the loop kernel; default: 1 at K > 8192, else 0) on the default "
                  "route (`gqcl`) and on the GEMM route forced with its default main loop (`gemmq`, 0 = the "
                  "loop quantizer; v4's layers at M = 128 by default). "
                  "`equal`: each bit for bit the default's.", "",
                  "| N x K | M | default a8 | xqcl1 | mt8 / xqcl1 / xqcl8 | gqcl0 / gqcl1 / gqcl8 | "
                  "gemmq0 / gemmq1 / gemmq8 | humming | equal |", "|---|---|---|---|---|---|---|---|---|"]
        for r in qrows:
            eq = all(r.get(f"{k}_equal", True) for k in qk)
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(r.get('a8_us'), '.1f')} | {_f(r.get('a8_xqcl1_us'), '.1f')} | "
                         f"{' / '.join(_f(r.get(f'a8_mt8{k}_us'), '.1f') for k in ('', '_xqcl1', '_xqcl8'))} | "
                         f"{' / '.join(_f(r.get(f'a8_gqcl{n}_us'), '.1f') for n in ('0', '1', '8'))} | "
                         f"{' / '.join(_f(r.get(f'a8_gemmq{n}_us'), '.1f') for n in ('0', '1', '8'))} | "
                         f"{_f(r.get('humming_us'), '.1f')} | {eq} |")
    r2 = [r for r in rows if r.get("a8_rows2_us") or r.get("a8_rows2_error")]
    if r2:
        lines += ["", "64 < M <= 128: the MT = 8 GEMV over two row tiles of 64 (one quantizer, one GEMV launch with two "
                  "CTA rows) forced on every layer it takes at M = 64 (TRIT_A8_MT8_ROWS2=1: <= 64 Mi weights, "
                  "elsewhere the same op) against the GEMM kernel / v4 (=0); the default (`a8`) takes it on layers of "
                  "<= 16 Mi weights since H100 run 84 (a record before it: `a8` = the GEMM kernel / v4, no `=0` "
                  "column). `equal`: bit for bit.", "",
                  "| N x K | M | bf16 us | a8 us | rows2 = 1 us | rows2 = 0 us | rows2 / GEMM-v4 | humming us | equal |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in r2:
            a, o = r.get("a8_us"), r.get("a8_rows2_us")
            off = r.get("a8_rows2off_us", a)  # run 84's record has no =0 column: its `a8` was that route
            eq = all(r.get(f"{k}_equal", True) for k in ("a8_rows2", "a8_rows2off"))
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(r.get('bf16_us'), '.1f')} | {_f(a, '.1f')} | "
                         f"{_f(o, '.1f')} | {_f(r.get('a8_rows2off_us'), '.1f')} | "
                         f"{_f(o / off if off and o else None, '.2f')} | {_f(r.get('humming_us'), '.1f')} | {eq} |")
    v4 = [r for r in rows if r.get("a8_v4q0_us") or r.get("a8_v4q0_error")]
    if v4:
        lines += ["", "The v4 a8 route's quantizer (M > 64 where neither the GEMM kernel nor the MT = 8 GEMV runs; a8_dense's too): the "
                  "default (TRIT_A8_V4Q=1: 16-byte loads, the quantizer and a8_kernel under PDL) against "
                  "TRIT_A8_V4Q=0 (one element per load, plain launches); where the default takes neither route both "
                  "time the same op. `equal`: bit for bit.", "",
                  "| N x K | M | a8 us | a8 TRIT_A8_V4Q=0 us | gain us | linear us | humming us | equal |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in v4:
            a, o = r.get("a8_us"), r.get("a8_v4q0_us")
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(a, '.1f')} | {_f(o, '.1f')} | "
                         f"{_f(o - a if a and o else None, '+.1f')} | {_f(r.get('linear_us'), '.1f')} | "
                         f"{_f(r.get('humming_us'), '.1f')} | {r.get('a8_v4q0_equal', '-')} |")
    bp = [r for r in rows if r.get("a8_bp_us") or r.get("a8_bp_error")]
    if bp:
        lines += ["", "Weight layout at M <= 32: the bitplane (+1/-1 bitmask) form, `ternary_mm_a8_bp` (one bit plane "
                  "for +1, one for -1; csrc/ternary.h), against the 2-bit codes, `ternary_mm_a8`: the same route and "
                  "bytes, only the decode differs (codes: a shift and an AND per four weights; bitplanes: two shifts, "
                  "two ANDs and an add). `equal`: results bit for bit.", "",
                  "| N x K | M | codes (a8) us | bitplanes us | bitplanes / codes | equal |", "|---|---|---|---|---|---|"]
        for r in bp:
            a, b_ = r.get("a8_us"), r.get("a8_bp_us")
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {_f(a, '.1f')} | {_f(b_, '.1f')} | "
                         f"{_f(b_ / a if a and b_ else None, '.2f')} | {r.get('a8_bp_equal', '-')} |")
    alt = [r for r in rows if r.get("a8_il_us")]
    if alt:
        lines += ["", "Large M, bf16 and the default a8 timed alternately (3 rounds each, medians; us) beside the "
                  "row-order columns:", "",
                  "| N x K | M | bf16 alternated | a8 alternated | x bf16 | a8 (row order) | a8 last in row |",
                  "|---|---|---|---|---|---|---|"]
        for r in alt:
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {r['bf16_il_us']:.1f} | {r['a8_il_us']:.1f} | "
                         f"{r['a8_il_x_bf16']:.2f} | {_f(r.get('a8_us'), '.1f')} | {_f(r.get('a8_last_us'), '.1f')} |")
    errs = sorted({f"{k}: {v}" for r in rows for k, v in r.items() if k.endswith("_error")})
    if errs:
        lines += ["", "Errors:", *[f"- {e}" for e in errs]]
    return "\n".join(lines) + "\n"


def _interrupt(*_):
    raise KeyboardInterrupt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="all", help="all | comma list of " + ",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--quick", action="store_true", help="skip a8 at the largest problems")
    ap.add_argument("--no-humming", action="store_true")
    ap.add_argument("--humming-budget", type=float, default=Humming.BUDGET_S,
                    help="seconds of humming setup / JIT before it is skipped for the remaining shapes "
                         "(run 21: 150 s ended before 6144x4096 and 28672x4096)")
    ap.add_argument("--humming-ms", default=",".join(map(str, HUMMING_MS)),
                    help="comma list of M at which humming is timed (each M bucket is a JIT compile per shape; "
                         "default %(default)s)")
    ap.add_argument("--ks-sweep", action="store_true", help="M=1: time every split-K choice (TRIT_KS)")
    ap.add_argument("--no-experimental", action="store_true",
                    help="leave out the variants not yet validated on a GPU: " + (", ".join(EXPERIMENTAL) or "none now"))
    ap.add_argument("--cfg-sweep", default="", help="comma list of M > 8: time the a8 kernel at every "
                    "(TRIT_NW, TRIT_KS) in CFG_SWEEP there")
    ap.add_argument("--pf-head", default="", help="comma list of k-block counts: time a8 (and fused at M <= 8) "
                    "with TRIT_L2PF=3 and each TRIT_L2PF_HEAD, at the M of --pf-head-ms")
    ap.add_argument("--pf-head-ms", default="1", help="comma list of M <= 64 for --pf-head (default 1)")
    ap.add_argument("--variants", default=None, help="v5 (M <= 64) variants to time beside the default, comma list of "
                    + ",".join(SMALL_M_VARIANTS) + " (default: all)")
    ap.add_argument("--only", default="", help="comma list of variant columns to time (bf16 always; NAME* = every "
                    "column starting with NAME): a short run of the columns a question needs, e.g. a8,a8_noxi,a8_gemm*")
    args = ap.parse_args(argv)
    groups = list(SHAPES) if args.shapes == "all" else args.shapes.split(",")
    unknown = [g for g in groups if g not in SHAPES]
    if unknown:
        sys.exit(f"bench.kernels: --shapes {args.shapes}: unknown group(s) {', '.join(unknown)}; "
                 f"known: all, {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        sys.exit("bench.kernels needs a CUDA GPU")
    from trit import ops

    ms = [int(m) for m in args.ms.split(",")]
    hum = Humming()
    hum.BUDGET_S = args.humming_budget
    if args.no_humming:
        hum.error = "disabled (--no-humming)"
    props = torch.cuda.get_device_properties(0)
    meta = {
        "device": props.name, "sm_count": props.multi_processor_count,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit_id(), "command": "python -m bench.kernels " + shlex.join(argv or sys.argv[1:]),
        "torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
        "fused_max_m": ops.FUSED_MAX_M, "extension_loaded": ops.EXTENSION_LOADED,
        "humming": hum.error or "humming-kernels BitnetWeightSchema, bf16",
    }
    print(json.dumps(meta), flush=True)
    rows = []
    t0 = time.time()
    stem = dt.date.today().isoformat() + "-" + ("h200" if "H200" in props.name else props.name.replace(" ", "_"))
    # a time limit (SIGTERM from `timeout`) ends the loop, not the record: the rows so far are
    # written as a record marked incomplete, and a partial file after every shape survives a kill
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for gname in groups:
            for N, K in SHAPES[gname]:
                bench_shape(N, K, ms, hum, rows, quick=args.quick, ks_sweep=args.ks_sweep,
                            small_variants=args.variants.split(",") if args.variants else None,
                            cfg_sweep={int(m) for m in args.cfg_sweep.split(",") if m},
                            experimental=not args.no_experimental,
                            pf_heads=[int(h) for h in args.pf_head.split(",") if h],
                            pf_head_ms={int(m) for m in args.pf_head_ms.split(",") if m},
                            only=set(args.only.split(",")) if args.only else None,
                            humming_ms={int(m) for m in args.humming_ms.split(",") if m})
                write_partial(Path(args.out), stem, {"meta": meta, "rows": rows})
    except KeyboardInterrupt:
        meta["incomplete"] = f"interrupted after {len(rows)} rows (time limit or Ctrl-C)"
        print(f"bench.kernels: {meta['incomplete']}", file=sys.stderr, flush=True)
    meta["bench_seconds"] = round(time.time() - t0, 1)
    md = markdown(meta, rows)
    js, _ = write_record(Path(args.out), stem, {"meta": meta, "rows": rows}, md)
    drop_partial(Path(args.out), stem)
    print(md)
    print(f"wrote {js} (+ .md)")
    return 1 if meta.get("incomplete") else 0


if __name__ == "__main__":
    sys.exit(main())
