"""Host time of a CUDA graph launch against the graph's kernel count: ``python -m bench.graph_launch``.

Why: at B = 1 the 2B-shaped model's decode step is host-bound in vLLM (H200 e2e runs 7-13: ~1.8 ms per
step for a ~1.5 ms forward), and run 13's profile showed cudaGraphLaunch taking 0.70 ms per step for the
default route's ~420-node graph against 0.38 ms for the chain route's ~245 - but under the profiler,
which instruments every node. This measures it without the profiler: graphs of N tiny kernels (one
``add_`` on a 1-element tensor each, so the GPU side is launch-bound too), each replayed R times with the
host time of the ``replay()`` call alone (the device synchronised before and after, outside the timed
span) and the GPU time of the replay (CUDA events). If the host time grows with N, fewer kernel nodes per
decode step (the chain, fused attention) also shorten a host-bound step; if it stays flat, they do not.

Writes ``<date>-<device>-graph-launch.{json,md}`` under --out (never over an earlier record).
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

import torch

from bench.records import commit_id, write_record


def measure(nodes: int, reps: int) -> dict:
    """Host us of one graph.replay() call (median / p10 / p90 over reps) and GPU us per replay."""
    x = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up outside the capture
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(nodes):
            x.add_(1.0)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    expect = float(3 + nodes * (5 + 2 * reps))
    if x.item() != expect:  # every node ran every time
        raise RuntimeError(f"graph of {nodes} nodes: counter {x.item()} after the replays, expected {expect}")
    host.sort()
    q = lambda f: host[min(len(host) - 1, int(f * len(host)))]
    return {"nodes": nodes, "reps": reps, "host_us_median": round(statistics.median(host), 2),
            "host_us_p10": round(q(0.1), 2), "host_us_p90": round(q(0.9), 2),
            "gpu_us_per_replay": round(e0.elapsed_time(e1) * 1e3 / reps, 2)}


def fit(rows: list[dict]) -> dict:
    """Least-squares line host_us_median = a + b * nodes: b is the host cost per kernel node."""
    xs = [r["nodes"] for r in rows]
    ys = [r["host_us_median"] for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"host_us_fixed": round(my - b * mx, 2), "host_us_per_node": round(b, 4)}


def markdown(meta: dict, rows: list[dict], line: dict) -> str:
    md = [f"# CUDA graph launch: host time vs kernel nodes, {meta['device']}", "",
          f"- date: {meta['date']}", f"- commit: {meta['commit']}", f"- command: {meta['command']}",
          f"- torch: {meta['torch']}, cuda: {meta['cuda']}",
          "- host us: the replay() call alone, device synchronised before and after (outside the span); "
          "GPU us: CUDA events around back-to-back replays", "",
          "| nodes | host us median | p10 | p90 | GPU us per replay |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['nodes']} | {r['host_us_median']} | {r['host_us_p10']} | {r['host_us_p90']} | "
                  f"{r['gpu_us_per_replay']} |")
    md += ["", f"Fit: host us = {line['host_us_fixed']} + {line['host_us_per_node']} x nodes "
               f"(a 420-node decode graph: {round(line['host_us_fixed'] + 420 * line['host_us_per_node'], 1)} us, "
               f"245 nodes: {round(line['host_us_fixed'] + 245 * line['host_us_per_node'], 1)} us)."]
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,50,100,250,420,800")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.graph_launch: no CUDA device (it measures CUDA graph launches)", file=sys.stderr)
        return 2
    try:
        nodes = [int(n) for n in a.nodes.split(",")]
    except ValueError:
        ap.error(f"--nodes {a.nodes!r}: expected a comma list of positive integers")
    if any(n < 1 for n in nodes) or a.reps < 10:
        ap.error("--nodes must be positive, --reps at least 10")
    rows = [measure(n, a.reps) for n in nodes]
    line = fit(rows)
    dev = torch.cuda.get_device_name(0)
    meta = {"device": dev, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit_id(),
            "command": "python -m bench.graph_launch " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "torch": torch.__version__, "cuda": torch.version.cuda}
    md = markdown(meta, rows, line)
    print(md)
    stem = f"{time.strftime('%Y-%m-%d', time.gmtime())}-{dev.replace(' ', '-').lower()}-graph-launch"
    write_record(a.out, stem, {**meta, "rows": rows, "fit": line}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
