"""The reachable floor of a weight-streaming kernel: ``python -m bench.read_floor``.

The issue's floor for a layer is its packed bytes / 4.18 TB/s (the H200's copy bandwidth, reached by copies
of GBs). A GEMV that streams 0.4-59 MB once per call also pays its launch, the ramp until enough loads are in
flight and the tail of its last wave. This times a kernel that only reads (csrc/read_probe.cu: 16-byte
streaming loads, XOR, nothing else) over the same byte counts as bench.kernels' packed weights, launched and
timed the same way (a CUDA graph of one call per copy, copies that L2 cannot hold), best of a sweep of grid
sizes / threads / loads in flight, and of a second reader that streams through the Hopper bulk-copy engine
(cp.async.bulk into a ring of shared-memory chunks; sm_90 and later) over grid sizes / chunk sizes / ring
depths. Per shape it reports the copy floor, the read floor and, with --kernels
RECORD (a bench.kernels JSON of the same machine, ideally the same call), our M = 1 ops against both:

    % of copy ceiling  = (bytes / 4.18 TB/s) / ours      (the issue's measure)
    % of read floor    = read floor / ours                (the share of what any kernel of this size reaches)

Each probe's result (the XOR of every 32-bit word) is checked against the host before it is timed.
Writes ``<date>-<device>-read-floor.{json,md}`` under --out (never over an earlier record).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from bench.records import commit_id, write_record

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "csrc" / "read_probe.cu"
UNROLLS = (2, 4, 8)
THREADS = (256, 512, 1024)
BLOCKS_PER_SM = (1, 2, 4, 8, 16)
# the bulk-copy reader: CTAs per SM x chunk bytes x ring depth, within 200 KiB of shared memory per SM
TMA_BLOCKS_PER_SM = (1, 2)
TMA_CHUNKS = (8192, 16384, 32768, 65536)
TMA_STAGES = (2, 3, 4, 6)
TMA_THREADS = 128
TMA_SMEM = 200 * 1024


def packed_bytes(N: int, K: int) -> int:
    """Bytes the a8 / fused GEMV reads per call: trit.ops.repack's int32 [ceil(N/16), ceil(K/128)*128]
    tiles plus the fp32 scale (bench.kernels' ``packed_bytes``)."""
    return math.ceil(N / 16) * math.ceil(K / 128) * 128 * 4 + N * 4


def build(build_dir: Path | None = None) -> ctypes.CDLL:
    """nvcc csrc/read_probe.cu -> a shared library (rebuilt when the source is newer), loaded by ctypes."""
    build_dir = Path(build_dir or os.environ.get("TRIT_BUILD_DIR") or Path.home() / ".cache" / "trit")
    build_dir.mkdir(parents=True, exist_ok=True)
    so = build_dir / "trit_read_probe.so"
    if not so.exists() or so.stat().st_mtime < SRC.stat().st_mtime:
        nvcc = os.environ.get("NVCC") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
        cc = torch.cuda.get_device_capability(0)
        arch = f"sm_{cc[0]}{cc[1]}" + ("a" if cc == (9, 0) else "")
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        cmd = [nvcc, "-std=c++17", "-O3", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-shared",
               "-Xcompiler", "-fPIC", str(SRC), "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{SRC}: nvcc failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
        os.replace(tmp, so)
    lib = ctypes.CDLL(str(so))
    lib.trit_read_probe.restype = ctypes.c_int
    lib.trit_read_probe.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int, ctypes.c_void_p]
    lib.trit_read_probe_tma.restype = ctypes.c_int
    lib.trit_read_probe_tma.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int,
                                        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib


def probe(lib, buf: torch.Tensor, out: torch.Tensor, *cfg) -> None:
    """One probe launch on torch's current stream (graph-capturable): out ^= XOR of buf's 32-bit words.
    cfg: (blocks, threads, unroll) runs the load loop, (blocks, threads, chunk bytes, stages) the bulk-copy reader."""
    fn = lib.trit_read_probe_tma if len(cfg) == 4 else lib.trit_read_probe
    nbytes = buf.numel() * buf.element_size()
    rc = fn(ctypes.c_void_p(buf.data_ptr()), nbytes, ctypes.c_void_p(out.data_ptr()), *cfg,
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"read probe {config_name(cfg)} (bytes={nbytes}) returned {rc}")


def xor_words(t: torch.Tensor) -> int:
    """The XOR of every 32-bit word of t (host reference of the probe)."""
    return int(np.bitwise_xor.reduce(t.detach().cpu().contiguous().view(torch.int32).numpy().view(np.uint32)))


def check(lib, nbytes: int, configs) -> None:
    """Every config's result equals the host XOR on a random buffer of nbytes (a grid-stride tail included)."""
    g = torch.Generator().manual_seed(nbytes)
    buf = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=g).cuda()
    want = xor_words(buf)
    for cfg in configs:
        out = torch.zeros(1, dtype=torch.int32, device="cuda")
        probe(lib, buf, out, *cfg)
        got = int(out.view(torch.int32).cpu().numpy().view(np.uint32)[0])
        if got != want:
            raise RuntimeError(f"read probe {config_name(cfg)} on {nbytes} bytes: XOR {got:#010x}, host {want:#010x}")


def configs_for(sm_count: int):
    """The load-loop reader's launch shapes: (blocks, threads, 16-byte loads in flight per thread)."""
    return [(sm_count * b, t, u) for b in BLOCKS_PER_SM for t in THREADS for u in UNROLLS if b * t <= 2048]


def tma_configs_for(sm_count: int):
    """The bulk-copy reader's: (blocks, threads, chunk bytes, ring depth), the ring within TMA_SMEM per SM."""
    return [(sm_count * b, TMA_THREADS, c, s) for b in TMA_BLOCKS_PER_SM for c in TMA_CHUNKS for s in TMA_STAGES
            if b * c * s <= TMA_SMEM]


def config_name(cfg) -> str:
    """'blocks x threads x unroll' for the load loop, 'tma:blocks x threads x chunk KiB x stages' for bulk copies."""
    if len(cfg) == 4:
        return f"tma:{cfg[0]}x{cfg[1]}x{cfg[2] // 1024}Kx{cfg[3]}"
    return "x".join(map(str, cfg))


def measure(lib, nbytes: int, configs) -> dict:
    """Best median us per call over configs (and every config's time) for buffers of nbytes."""
    from bench.kernels import n_copies, time_graph

    n16 = math.ceil(nbytes / 16) * 4  # int32 words, a 16-byte multiple
    nt = n_copies(n16 * 4)
    bufs = [torch.randint(-2**31, 2**31 - 1, (n16,), dtype=torch.int32, device="cuda") for _ in range(nt)]
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    times = {}
    for cfg in configs:
        calls = [(lambda b=b, cfg=cfg: probe(lib, b, out, *cfg)) for b in bufs]
        times[config_name(cfg)] = time_graph(calls, reps=7)
    best = min(times, key=times.get)
    del bufs
    torch.cuda.empty_cache()
    r = {"bytes": n16 * 4, "copies": nt, "read_us": times[best], "best_config": best, "configs_us": times}
    for fam, keep in (("ld", lambda k: not k.startswith("tma:")), ("tma", lambda k: k.startswith("tma:"))):
        sub = {k: v for k, v in times.items() if keep(k)}
        if sub:  # each reader's best, so the table shows whether the copy engine moves the floor
            b = min(sub, key=sub.get)
            r[f"read_{fam}_us"], r[f"best_{fam}_config"] = sub[b], b
    return r


def kernel_rows(path: Path | None) -> dict:
    """(N, K) -> the M = 1 row of a bench.kernels record."""
    if path is None:
        return {}
    rows = json.loads(Path(path).read_text())["rows"]
    return {(r["N"], r["K"]): r for r in rows if r.get("M") == 1}


def markdown(meta: dict, rows: list[dict]) -> str:
    from bench.kernels import COPY_BW

    out = [f"# Read floor vs the M = 1 GEMVs on {meta['device']}", "",
           f"- date: {meta['date']}", f"- git commit: {meta['commit']}", f"- command: `{meta['command']}`",
           f"- kernels record: {meta.get('kernels') or '-'}",
           f"- copy floor = packed bytes / {COPY_BW / 1e12:.2f} TB/s; read floor = the fastest of "
           f"{meta['n_configs']} launch shapes of csrc/read_probe.cu's two readers (load loop: grid x threads x loads "
           "in flight per thread; `tma:` bulk copies: grid x threads x chunk x ring depth; each reader's best in "
           "its own column) over the same bytes, graph-timed over copies L2 cannot hold (median per call); `a8` = ternary_mm_a8 "
           "(quantizer + GEMV), `a8 GEMV` = ternary_mm_a8q on a quantization made beforehand (what a layer "
           "behind the fused norm + quantizer runs), `fused` = ternary_mm (bf16 x); most x bf16 = bf16 us / read floor: "
           "the largest speed-up over bf16 that any kernel reading these bytes in one launch can show", "",
           "| N x K | MB | copy floor us | read floor us (config) | load loop us | bulk copy us | read GB/s | a8 us | "
           "a8 % copy / % read | a8 GEMV us | GEMV % copy / % read | fused us | fused % read | bf16 us | most x bf16 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, s=".1f": "-" if v is None else format(v, s)  # noqa: E731
    for r in rows:
        cf, rf = r["copy_floor_us"], r["read_us"]
        pct = lambda t: None if not t else (100 * cf / t, 100 * rf / t)  # noqa: E731
        a8, pre, fu = r.get("a8_us"), r.get("a8_pre_us"), r.get("fused_us")
        pa, pp = pct(a8), pct(pre)
        bf = r.get("bf16_us")  # bf16 / read floor: the most any kernel reading these bytes can beat bf16 by
        most = "-" if not bf else f"{bf / rf:.2f}x"
        out.append(f"| {r['N']}x{r['K']} | {r['bytes'] / 1e6:.1f} | {cf:.1f} | {rf:.1f} ({r['best_config']}) | "
                   f"{f(r.get('read_ld_us'))} | {f(r.get('read_tma_us'))} | {r['bytes'] / rf / 1e3:.0f} | {f(a8)} | {'-' if not pa else f'{pa[0]:.0f}% / {pa[1]:.0f}%'} | "
                   f"{f(pre)} | {'-' if not pp else f'{pp[0]:.0f}% / {pp[1]:.0f}%'} | {f(fu)} | "
                   f"{'-' if not fu else f'{100 * rf / fu:.0f}%'} | {f(bf)} | {most} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    from bench.kernels import COPY_BW, SHAPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="2b,8b,70b", help="comma list of bench.kernels shape groups")
    ap.add_argument("--kernels", type=Path, default=None, help="a bench.kernels JSON record (M = 1 rows) to compare")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    args = ap.parse_args(argv)
    unknown = [g for g in args.shapes.split(",") if g not in SHAPES]
    if unknown:
        sys.exit(f"bench.read_floor: unknown shape group(s) {unknown}; known: {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        sys.exit("bench.read_floor needs a CUDA GPU")
    lib = build()
    props = torch.cuda.get_device_properties(0)
    configs = configs_for(props.multi_processor_count)
    if props.major >= 9:  # cp.async.bulk: Hopper and later
        configs += tma_configs_for(props.multi_processor_count)
    check(lib, (1 << 20) + 48, configs)
    check(lib, 16, configs[:3] + configs[-2:])
    meta = {"device": props.name, "sm_count": props.multi_processor_count,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit_id(),
            "command": "python -m bench.read_floor " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
            "kernels": str(args.kernels) if args.kernels else None, "n_configs": len(configs),
            "checked": "every config's XOR equals the host's (1 MiB + 48 B buffer)"}
    kr = kernel_rows(args.kernels)
    rows = []
    for g in args.shapes.split(","):
        for N, K in SHAPES[g]:
            nb = packed_bytes(N, K)
            r = {"N": N, "K": K, **measure(lib, nb, configs), "copy_floor_us": nb / COPY_BW * 1e6}
            k = kr.get((N, K), {})
            if k and k.get("packed_bytes") not in (None, nb):
                raise RuntimeError(f"{args.kernels}: {N}x{K} packed_bytes {k['packed_bytes']}, expected {nb}")
            for key in ("a8_us", "a8_pre_us", "fused_us", "linear_us", "bf16_us"):
                if k.get(key) is not None:
                    r[key] = k[key]
            rows.append(r)
            print(f"{N}x{K}: {nb / 1e6:.1f} MB copy floor {r['copy_floor_us']:.1f} us, read {r['read_us']:.1f} us "
                  f"({r['best_config']}), a8 {r.get('a8_us')}, a8 GEMV {r.get('a8_pre_us')}", flush=True)
    stem = dt.date.today().isoformat() + "-" + ("h200" if "H200" in props.name else props.name.replace(" ", "_")) \
        + "-read-floor"
    md = markdown(meta, rows)
    js, _ = write_record(Path(args.out), stem, {"meta": meta, "rows": rows}, md)
    print(md)
    print(f"wrote {js} (+ .md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
