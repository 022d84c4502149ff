"""Diagnose a GEMM-kernel variant of the a8 op whose results differ from the default: which input
each lane really read, which output channel and row each result landed in.

    python -m bench.gemm_probe [--env TRIT_A8_GEMM_WG=1] [--out DIR]

Made for the first GPU run of a new main loop (TRIT_A8_GEMM_WG=1, the wgmma loop), where a wrong
byte order, swizzle or accumulator mapping shows up in the bit-identity tests only as "not equal".
Three probes on one CTA-sized problem per M tile (N = 128 channels, K = 128 inputs = one k-block,
split-K off), each against ternary_mm_a8 with the variant off:

1. inputs: row m of x is one-hot at input k = m % K. With exact integer sums, output row m of a
   correct kernel is column k of W times row and channel factors; the probe finds, for every row,
   the input whose W column the variant's row matches (`input_map`), so a permutation of the
   x byte order reads as a table of (expected k, used k).
2. channels: random x and W; every output column of the variant is matched against the default's
   columns (`channel_map`).
3. rows: the same outputs, rows matched against the default's rows (`row_map`).

Prints one JSON object (also written to DIR/gemm-probe.json when --out is given) and exits 1 when
the variant differs from the default anywhere. Runs on any CUDA GPU where the variant exists.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch


def match_columns(got: torch.Tensor, ref: torch.Tensor) -> list[int]:
    """For each column j of got, the index of the column of ref equal to it (-1: none).
    Exact comparison: the a8 op is bit-reproducible, so a correct mapping matches exactly."""
    out = []
    for j in range(got.shape[1]):
        eq = (ref == got[:, j:j + 1]).all(dim=0).nonzero().flatten().tolist()
        out.append(j if j in eq else (eq[0] if eq else -1))
    return out


def summarize(mapping: list[int]) -> dict:
    """Identity, or the positions where the mapping differs from it (first 32)."""
    wrong = [(i, m) for i, m in enumerate(mapping) if m != i]
    return {"identity": not wrong, "n_wrong": len(wrong), "first_wrong": wrong[:32]}


def probe(env: dict, M: int = 64, N: int = 128, K: int = 128, seed: int = 0) -> dict:
    from trit import ops
    dev = "cuda"
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (N, K), generator=gen, dtype=torch.int8)
    p = ops.repack(w).to(dev)
    s = torch.ones(N, device=dev)
    base = {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_KS": "1", "TRIT_A8_DENSE_MIN_M": str(1 << 30)}

    def run(x, extra):
        old = {k: os.environ.get(k) for k in {**base, **env}}
        os.environ.update({**base, **extra})
        try:
            y = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
            torch.cuda.synchronize()
            return y.float().cpu()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    off = {k: "0" for k in env}
    res = {"env": env, "M": M, "N": N, "K": K}
    # 1. one-hot rows: row m reads input m % K
    x1 = torch.zeros(M, K, dtype=torch.bfloat16)
    x1[torch.arange(M), torch.arange(M) % K] = 1.0
    x1 = x1.to(dev)
    y_var, y_def = run(x1, env), run(x1, off)
    # the default's outputs for one-hot rows at every input: columns of W in the op's output form
    xk = torch.eye(K, dtype=torch.bfloat16, device=dev)
    y_all = run(xk, off)  # [K, N]: row k = the output of a row one-hot at k
    used = match_columns(y_var.t().contiguous(), y_all.t().contiguous())  # row m -> the k it matches
    expect = [m % K for m in range(M)]
    res["input_map"] = {"identity": used == expect, "n_wrong": sum(u != e for u, e in zip(used, expect)),
                        "first_wrong": [(m, e, u) for m, (e, u) in enumerate(zip(expect, used)) if u != e][:32],
                        "default_matches": bool(torch.equal(y_def, y_all[torch.tensor(expect)]))}
    # 2./3. random rows: channel and row mappings
    x2 = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(dev)
    y_var, y_def = run(x2, env), run(x2, off)
    res["channel_map"] = summarize(match_columns(y_var, y_def))
    res["row_map"] = summarize(match_columns(y_var.t().contiguous(), y_def.t().contiguous()))
    res["equal"] = bool(torch.equal(y_var, y_def))
    res["max_abs_diff"] = float((y_var - y_def).abs().max())
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE of the variant (default TRIT_A8_GEMM_WG=1)")
    ap.add_argument("--ms", default="64,128,17", help="M values (one or more M tiles)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gemm_probe: needs a CUDA device", file=sys.stderr)
        return 2
    env = dict(kv.split("=", 1) for kv in (args.env or ["TRIT_A8_GEMM_WG=1"]))
    from trit import ops
    if "TRIT_A8_GEMM_WG" in env and not ops.WGMMA:  # the knob would be ignored: nothing to probe
        print(f"gemm_probe: the wgmma loops need compute capability 9.0 and an sm_90a build "
              f"(device {torch.cuda.get_device_name()}, TORCH_CUDA_ARCH_LIST="
              f"{os.environ.get('TORCH_CUDA_ARCH_LIST')!r}, extension: {ops.EXTENSION_ERROR or 'loaded'})",
              file=sys.stderr)
        return 2
    results = [probe(env, M=int(m)) for m in args.ms.split(",") if m]
    text = json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gemm-probe.json").write_text(text + "\n")
    return 0 if all(r["equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
