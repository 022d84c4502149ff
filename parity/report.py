"""Reports: a pandas per-layer table, CSV + Markdown + an error-vs-depth plot, and failure
snapshots, in a run directory that is never overwritten (one new directory per run)."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pandas as pd
import torch

from reference.io import atomic_write_bytes, atomic_write_text

from .compare import Comparison

COLUMNS = ["name", "tier", "status", "max_abs", "limit", "limit_src", "max_rel", "mean_abs", "sqnr_db", "cosine", "jump", "hint"]


def table(cmp: Comparison) -> pd.DataFrame:
    rows = []
    for r in cmp.results:
        rows.append({
            "name": r.name, "tier": r.tier, "status": r.status if r.passed else r.status.upper(),
            "max_abs": r.max_abs, "limit": r.limit, "limit_src": r.limit_source, "max_rel": r.max_rel,
            "mean_abs": r.mean_abs,
            "sqnr_db": r.sqnr_db, "cosine": r.cosine,
            "jump": f"x{r.jump:.0f}" if r.jump else "",
            "hint": (r.hints[0] if r.hints else r.detail)[:160],
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def format_table(df: pd.DataFrame, *, only_layers=None) -> str:
    d = df.copy()
    for c in ("max_abs", "limit", "max_rel", "mean_abs"):
        d[c] = d[c].map(lambda v: f"{v:.2e}" if v == v else "-")
    d["sqnr_db"] = d["sqnr_db"].map(lambda v: "inf" if v == math.inf else (f"{v:.1f}" if v == v else "-"))
    d["cosine"] = d["cosine"].map(lambda v: f"{v:.6f}" if v == v else "-")
    with pd.option_context("display.max_rows", None, "display.max_colwidth", 70, "display.width", 250):
        return d.to_string(index=False)


def check_runs_root(root: Path) -> None:
    """Before a run computes anything: ``root`` (``--runs``) can hold run directories - it is one, or does not exist
    yet under a directory. A file there (or above it) failed only after the whole capture, as a bare
    'FileExistsError: [Errno 17] File exists'."""
    root = Path(root)
    for p in (root, *root.parents):
        if p.exists():
            if not p.is_dir():
                raise NotADirectoryError(f"--runs {root}: {p} is a file, not a directory; the run's report directory "
                                         f"goes under --runs (pass a directory, or a path that does not exist yet)")
            return


def new_run_dir(root: Path, target: str) -> Path:
    """A fresh directory per run: never reuses or overwrites an earlier run's snapshots."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        p = root / f"{stamp}-{target}-{os.getpid()}{'' if n == 0 else f'-{n}'}"
        try:
            p.mkdir()
            return p
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a fresh run directory under {root}")


def plot(cmp: Comparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from . import names as N

    fig, ax = plt.subplots(figsize=(10, 4.5))
    by_op: dict[str, list] = {}
    for r in cmp.results:
        layer, op = N.split(r.name)
        if layer is None or r.max_rel != r.max_rel:
            continue
        by_op.setdefault(op, []).append((layer, max(r.max_rel, 1e-12)))
    for op, pts in sorted(by_op.items()):
        xs, ys = zip(*pts)
        ax.semilogy(xs, ys, marker="o", label=op, linewidth=1)
    for tier, tol in cmp.tol.items():
        ax.axhline(tol.rtol, linestyle="--", linewidth=0.8, color="grey")
    fd = cmp.first_divergence
    if fd is not None and fd.layer is not None:
        ax.axvline(fd.layer, color="red", linewidth=1.5, label=f"first divergence: {fd.name}")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("max_abs / max|golden|")
    ax.set_title(f"parity error vs depth — target {cmp.target} ({cmp.dtype} tiers; dashed: rtol per tier)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def write_report(cmp: Comparison, run_dir: Path, *, golden: dict, target: dict, meta: dict) -> dict:
    """CSV, Markdown, PNG, summary.json, and failure snapshots (failing tensors + golden)."""
    from safetensors.torch import save

    df = table(cmp)
    atomic_write_text(run_dir / "report.csv", df.to_csv(index=False))
    md = [f"# Parity report: target `{cmp.target}`", "", f"- {cmp.summary()}", ""]
    if cmp.overrides:  # a loosened (or tightened) run says so wherever its verdict is read
        md += [f"- tolerance overrides (--tol): {', '.join(f'{k}={v:g}' for k, v in sorted(cmp.overrides.items()))}"]
    md += [f"- {k}: {v}" for k, v in meta.items()]
    md += ["", df.to_markdown(index=False) if _has_tabulate() else "```\n" + format_table(df) + "\n```", ""]
    fails = [r for r in cmp.results if not r.passed]
    if fails:
        md += ["## Failures", ""]
        for r in fails:
            md += [f"- `{r.name}`: {r.line()}"] + [f"  - hint: {h}" for h in r.hints]
    atomic_write_text(run_dir / "report.md", "\n".join(md) + "\n")
    try:
        plot(cmp, run_dir / "errors.png")
    except Exception as e:  # a missing plotting backend must not lose the report
        atomic_write_text(run_dir / "errors.png.txt", f"plot failed: {e!r}\n")
    snap = {}
    for r in fails:
        if r.name in target and r.name in golden:
            snap[f"target/{r.name}"] = target[r.name].contiguous()
            snap[f"golden/{r.name}"] = golden[r.name].contiguous()
    if snap:
        atomic_write_bytes(run_dir / "failures.safetensors", save(snap))
    summary = {
        "summary": cmp.summary(), "passed": cmp.passed, "target": cmp.target, "dtype": cmp.dtype,
        "first_divergence": cmp.first_divergence.name if cmp.first_divergence else None,
        "first_divergence_hints": cmp.first_divergence.hints if cmp.first_divergence else [],
        "jumps": [r.name for r in cmp.jumps],
        "topk": vars(cmp.topk) if cmp.topk else None,
        "tol_overrides": dict(cmp.overrides), "tolerances": {k: vars(v) for k, v in cmp.tol.items()}, **meta,
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1, default=str))
    return summary


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False
