"""vLLM parity record on a GPU: the parity run through vLLM + the trit plugin + our CUDA ops,
then the model-level checks with CUDA graphs on.

    python -m bench.vllm_parity [--model models/tiny-bitnet] [--out bench/results]

1. eager capture (forward hooks need eager execution): every canonical tensor against the
   fp32 goldens, bf16 tiers; the per-layer table goes into the record;
2. CUDA graphs on (``enforce_eager=False``): top-10 next-token ids at every prompt position
   (prompt logprobs) against the golden top-10 — the check that runs through the graphs;
3. greedy 32-token generations from the 4 prompts, graphs on, against the fp32 reference, once
   as one batch and once each prompt alone (one-token decode steps: the M = 1 routes); every
   differing position must be a near-tie of the reference (top-2 logit gap below the model
   tier's limit); then what one such one-token step runs (step_counts: kernels / trit ops per step,
   informative).
Writes <date>-<device>-vllm-parity.{json,md} with device, date, commit, command and numbers.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from bench.records import commit_id, write_record


def generation_check(ref_model, ids, new_ids_target, limit: float, ref_new=None) -> dict:
    """Greedy continuations: position-by-position agreement; a difference is explained when
    the reference's top-2 logit gap at the first differing step is below ``limit``. ``ref_new``: the
    reference's own continuations of ``ids`` where already computed (else generated here)."""
    if ref_new is None:
        ref_new = ref_model.generate(ids, new_ids_target.shape[1])
    rows = []
    for b in range(ids.shape[0]):
        same = bool(torch.equal(ref_new[b], new_ids_target[b]))
        row = {"prompt": b, "identical": same}
        if not same:
            first = int((ref_new[b] != new_ids_target[b]).nonzero()[0])
            ctx = torch.cat([ids[b], ref_new[b, :first]]).unsqueeze(0)
            logits = ref_model.forward(ctx)[0, -1]
            top2 = logits.topk(2).values
            gap = float(top2[0] - top2[1])
            row.update(first_difference=first, ref_top2_gap=gap, explained=gap < limit)
        rows.append(row)
    return {"rows": rows, "passed": all(r["identical"] or r["explained"] for r in rows)}


def step_counts(graphs, model_dir, ids: torch.Tensor, tokens: int = 4) -> dict:
    """What one decode step of one prompt alone runs: {name: launches per step} of every CUDA kernel (on a GPU;
    CUPTI sees the kernels inside CUDA graph replays) and every trit:: op the profiler records (on the CPU, where
    the ops run as such), from two profiled generations of ``ids`` (one prompt) - 1 token (the prefill) and
    1 + tokens - differenced and divided by ``tokens``, after a discarded warm-up capture. The record's evidence
    of which route a one-token step took (e.g. TRIT_FUSED_NORM_QUANT=one: rms_norm_quant kernels per step)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def counts(n: int) -> dict:
        with profile(activities=acts) as prof:
            graphs.generate(model_dir, ids, n)
        out: dict = {}
        for ev in prof.key_averages():
            dev = getattr(getattr(ev, "device_type", None), "name", "CPU")
            if dev == "CUDA" or ev.key.startswith("trit::"):
                out[ev.key] = out.get(ev.key, 0) + ev.count
        return out

    counts(1)
    pre, full = counts(1), counts(1 + tokens)
    per = {k: round((v - pre.get(k, 0)) / tokens, 2) for k, v in full.items()}
    out = dict(sorted(((k, v) for k, v in per.items() if v > 0), key=lambda kv: (-kv[1], kv[0])))
    if not out:  # nothing seen: the steps ran out of this profiler's sight
        return {"error": "no CUDA kernel or trit op seen in the decode steps (is vLLM's engine core in another "
                         "process? VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps it in this one)"}
    return out


def main(argv=None) -> int:
    from parity.compare import topk_ids_agreement
    from parity.dump import ROOT
    from parity.report import format_table, table
    from parity.run import load_fresh_golden, run_parity
    from parity.targets.vllm import VllmTarget
    from parity.tolerances import resolve
    from reference.model import ReferenceModel

    ap = argparse.ArgumentParser(prog="python -m bench.vllm_parity")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-bitnet")
    ap.add_argument("--golden", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor_parallel_size; > 1 skips the eager capture (hooks cannot reach TP shards): "
                         "model-level checks only, against the same goldens and tolerances")
    a = ap.parse_args(argv)
    golden = a.golden or ROOT / "golden" / a.model.name
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    import vllm

    rec = {"device": dev, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": commit_id(),
           "command": "python -m bench.vllm_parity " + shlex.join(argv or sys.argv[1:]),
           "vllm": vllm.__version__, "torch": torch.__version__, "model": str(a.model), "dtype": a.dtype,
           "tensor_parallel_size": a.tp, "kernel_env": {k: v for k, v in os.environ.items() if k.startswith("TRIT_")}}
    t0 = time.time()
    cmp = None
    if a.tp == 1:
        eager = VllmTarget(a.dtype)
        res = run_parity(eager, model_dir=a.model, golden_dir=golden, runs_dir=ROOT / "parity_runs")
        cmp = res.comparison
        rec["eager"] = {"summary": cmp.summary(), "passed": cmp.passed, "seconds": round(time.time() - t0, 1),
                        "worst": max(((r.max_rel, r.name) for r in cmp.results), default=None)}
        print(format_table(table(cmp)))
        print(cmp.summary(), flush=True)
        eager.close()
        del eager
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    gs = load_fresh_golden(golden, a.model)
    graphs = VllmTarget(a.dtype, cuda_graphs=torch.cuda.is_available(), tensor_parallel_size=a.tp)
    t1 = time.time()
    ids = graphs.topk_ids(a.model, gs.input_ids, 10)
    from reference.spec import spec_for
    from parity.tolerances import column
    col = column(a.dtype, spec_for(a.model).activation_quant, bit_faithful=False)
    rec["tolerance_column"] = col
    tol = resolve(col)["model"]
    limit = tol.limit(float(gs.tensors["logits"].abs().max()))
    tk = topk_ids_agreement(ids, gs.tensors["logits"], limit)
    per_prompt = []
    B, T = gs.input_ids.shape
    for b in range(B):
        sub = topk_ids_agreement(ids[b:b + 1], gs.tensors["logits"][b:b + 1], limit)
        per_prompt.append({"prompt": b, "top1": sub.top1_agree, "overlap": sub.overlap, "unexplained": sub.unexplained})
    rec["graphs_topk"] = {"cuda_graphs": graphs.cuda_graphs, "top1_agree": tk.top1_agree, "overlap": tk.overlap,
                          "unexplained": tk.unexplained, "worst": tk.worst, "per_prompt": per_prompt,
                          "limit": limit, "passed": tk.passed}
    new = graphs.generate(a.model, gs.input_ids, a.new_tokens)
    # the same prompts one at a time: decode steps of one token, the M = 1 routes (the fused-quantizer GEMV, the
    # one-token routings TRIT_CHAIN=1 / TRIT_FUSED_NORM_QUANT=one) that a batch of B prompts never runs
    new1 = torch.cat([graphs.generate(a.model, gs.input_ids[b:b + 1], a.new_tokens) for b in range(B)])
    if a.tp > 1:  # the TP workers run in their own processes, out of this profiler's sight
        rec["b1_step_counts"] = {"error": f"tensor_parallel_size={a.tp}: the workers run in other processes"}
    else:
        try:  # evidence of the route a one-token step takes (informative: not part of `passed`)
            rec["b1_step_counts"] = step_counts(graphs, a.model, gs.input_ids[:1])
        except Exception as e:  # a profiler that cannot run here leaves the parity checks as they are
            rec["b1_step_counts"] = {"error": f"{type(e).__name__}: {e}"}
    graphs.close()
    del graphs
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    ref = ReferenceModel.from_dir(a.model, device="cuda" if torch.cuda.is_available() else "cpu")
    ref_new = ref.generate(gs.input_ids, a.new_tokens)
    rec["graphs_generation"] = generation_check(ref, gs.input_ids, new, limit, ref_new)
    rec["graphs_generation_b1"] = generation_check(ref, gs.input_ids, new1, limit, ref_new)
    rec["graphs_seconds"] = round(time.time() - t1, 1)
    rec["passed"] = bool((cmp is None or cmp.passed) and tk.passed and rec["graphs_generation"]["passed"]
                         and rec["graphs_generation_b1"]["passed"])

    stem = (f"{time.strftime('%Y-%m-%d')}-{dev.replace(' ', '-').lower()}-vllm-parity-{a.model.name}"
            + (f"-tp{a.tp}" if a.tp > 1 else ""))
    md = [f"# vLLM parity on {dev}", "", *(f"- {k}: {rec[k]}" for k in ("date", "commit", "command", "vllm", "torch",
                                                                       "model", "dtype", "tensor_parallel_size",
                                                                       "kernel_env", "passed"))]
    if cmp is not None:
        md += ["", "## Eager capture, every canonical tensor (bf16 tiers)", "", f"{rec['eager']['summary']}", "",
               "```", format_table(table(cmp)), "```"]
    else:
        md += ["", f"## Tensor parallel {a.tp}: no per-tensor capture (forward hooks cannot reach the TP shards); "
               "the model-level checks below use the same goldens and tolerances as TP=1"]
    md += ["",
          "## CUDA graphs on: top-10 next-token ids at every prompt position", "",
          f"top-1 agreement {tk.top1_agree:.1%}, top-10 overlap {tk.overlap:.1%}, unexplained {tk.unexplained} "
          f"(limit {limit:.3g})", "", "| prompt | top-1 | top-10 overlap | unexplained |", "|---|---|---|---|",
          *(f"| {p['prompt']} | {p['top1']:.1%} | {p['overlap']:.1%} | {p['unexplained']} |" for p in per_prompt),
          "", f"## CUDA graphs on: greedy {a.new_tokens}-token generations vs the fp32 reference", "",
          f"The {B} prompts as one batch (decode steps of {B} tokens):", "",
          *(f"- prompt {r['prompt']}: {'identical' if r['identical'] else r}" for r in rec["graphs_generation"]["rows"]),
          "", "Each prompt alone (decode steps of one token):", "",
          *(f"- prompt {r['prompt']}: {'identical' if r['identical'] else r}"
            for r in rec["graphs_generation_b1"]["rows"]),
          "", "## What one decode step of one prompt alone runs (profiled; CUDA kernels / trit ops, launches per step)",
          "", *(["| kernel or op | per step |", "|---|---|",
                 *(f"| `{k[:100]}` | {v} |" for k, v in list(rec["b1_step_counts"].items())[:40])]
                if "error" not in rec["b1_step_counts"] else [f"not profiled: {rec['b1_step_counts']['error']}"])]
    write_record(a.out, stem, rec, "\n".join(md))
    print("\n".join(md))
    return 0 if rec["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
