"""Compare a target's captured tensors with goldens: metrics, tiers, first divergence, jumps.

Metrics per tensor (target t vs golden g, both float32):
  max_abs   max |t - g|                      (primary: never only the mean)
  max_rel   max_abs / max |g|                (normalised; elementwise ratios blow up near 0)
  mean_abs  mean |t - g|
  sqnr_db   10 log10(sum g^2 / sum (t-g)^2)  (PyTorch Numeric Suite's SQNR)
  cosine    cos(t, g) over the flattened tensors
First divergence = the earliest tensor in execution order that breaches its tier.
A jump = a layer whose error exceeds JUMP_FACTOR x the same operator's error one layer
earlier (and JUMP_FLOOR x its limit), reported even inside tolerance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from . import names as N
from . import tolerances as T
from .noise import NOISE_FACTOR


@dataclass
class TensorResult:
    name: str
    order: int
    tier: str
    shape: tuple
    status: str  # pass | FAIL | missing | shape | nonfinite
    max_abs: float = math.nan
    max_rel: float = math.nan
    mean_abs: float = math.nan
    sqnr_db: float = math.nan
    cosine: float = math.nan
    ref_absmax: float = math.nan
    limit: float = math.nan
    worst_index: tuple = ()
    worst_target: float = math.nan
    worst_golden: float = math.nan
    limit_source: str = "tier"  # "noise": a measured noise floor widened the tier limit; "override": --tol set it
    jump: Optional[float] = None  # growth factor over the previous layer, when flagged
    hints: list = field(default_factory=list)
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def layer(self):
        return N.split(self.name)[0]

    def line(self) -> str:
        if self.status in ("missing", "shape", "nonfinite"):
            return f"{self.name}: {self.status.upper()} {self.detail}"
        src = {"noise": ", noise floor", "override": ", --tol override"}.get(self.limit_source, "")
        if self.status == "FAIL" and self.limit > 0 and math.isfinite(self.max_abs):
            ratio = self.max_abs / self.limit  # 1.155e-01 over a limit of 1.155e-01 reads like a pass
            src += f"; exceeded x{ratio:.6f}" if ratio < 1.01 else f"; exceeded x{ratio:.3g}"
        s = (f"{self.name} [{self.tier}] max_abs={self.max_abs:.3e} (limit {self.limit:.3e}{src}, "
             f"max|golden|={self.ref_absmax:.3g}) max_rel={self.max_rel:.2e} sqnr={self.sqnr_db:.1f}dB "
             f"cos={self.cosine:.6f} worst at {list(self.worst_index)}: target {self.worst_target:.6g} "
             f"vs golden {self.worst_golden:.6g}")
        if self.jump:
            s += f"  JUMP x{self.jump:.0f} over the previous layer"
        return s


@dataclass
class TopKResult:
    positions: int
    top1_agree: float  # fraction of positions with the same argmax
    overlap: float  # mean |top10(t) & top10(g)| / 10
    unexplained: int  # positions whose top-10 differ although the golden gap is clear
    worst: str = ""

    @property
    def passed(self) -> bool:
        return self.unexplained == 0


@dataclass
class Comparison:
    target: str
    dtype: str
    results: list  # TensorResult, execution order
    topk: Optional[TopKResult] = None
    tol: dict = field(default_factory=dict)
    noise_factor: Optional[float] = None  # set when limits may widen to a measured noise floor
    overrides: dict = field(default_factory=dict)  # --tol TIER[.atol|.rtol]=X given for this run (reported)
    notes: list = field(default_factory=list)  # said after the summary line's verdict (e.g. sub-tier differences)

    @property
    def first_divergence(self) -> Optional[TensorResult]:
        return next((r for r in self.results if not r.passed), None)

    @property
    def jumps(self) -> list:
        """Error jumps *inside* tolerance (a failing tensor reports its own jump in its line)."""
        return [r for r in self.results if r.jump and r.passed]

    @property
    def passed(self) -> bool:
        # nothing compared is no pass (a golden set or target that yielded no tensors)
        return bool(self.results) and all(r.passed for r in self.results) and (self.topk is None or self.topk.passed)

    def by_name(self) -> dict:
        return {r.name: r for r in self.results}

    def summary(self) -> str:
        fd = self.first_divergence
        n_fail = sum(not r.passed for r in self.results)
        tiers = f"{self.dtype} tiers"
        if self.noise_factor is not None:
            nw = sum(r.limit_source == "noise" for r in self.results)
            tiers += f" or {self.noise_factor:g}x the {self.dtype} noise floor ({nw} limits widened)"
        if self.overrides:
            tiers += " OVERRIDDEN " + ", ".join(f"{k}={v:g}" for k, v in sorted(self.overrides.items()))
        head = f"parity [{self.target}, {tiers}]: {len(self.results) - n_fail}/{len(self.results)} tensors pass"
        if self.topk is not None:
            head += (f"; top-1 agreement {self.topk.top1_agree:.1%}, top-10 overlap {self.topk.overlap:.1%}"
                     f"{'' if self.topk.passed else f' ({self.topk.unexplained} unexplained top-10 differences)'}")
        if not self.results:
            head += "; NOTHING COMPARED (no tensors): not a pass"
        elif fd is None and self.topk is not None and not self.topk.passed:
            head += f"; FIRST DIVERGENCE: top-10 (logits ranking; every tensor within its tier): {self.topk.worst}"
        elif fd is None:
            head += "; no divergence"
        else:
            layer, op = N.split(fd.name)
            where = f"layer {layer}, operator {op}" if layer is not None else fd.name
            head += f"; FIRST DIVERGENCE: {fd.name} ({where}): {fd.line()}"
            if fd.hints:
                head += " | hints: " + "; ".join(fd.hints)
        for n in self.notes:
            head += f"; NOTE: {n}"
        if self.jumps:
            j = self.jumps
            head += "; jumps inside tolerance: " + ", ".join(f"{r.name} (x{r.jump:.0f})" for r in j[:5]) + (
                f" and {len(j) - 5} more" if len(j) > 5 else "")
        return head


def tensor_metrics(t: torch.Tensor, g: torch.Tensor) -> dict:
    t = t.double()
    g = g.double()
    diff = (t - g).abs()
    flat = int(diff.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    ref_absmax = float(g.abs().max()) if g.numel() else 0.0
    max_abs = float(diff.max()) if diff.numel() else 0.0
    noise = float((diff ** 2).sum())
    sig = float((g ** 2).sum())
    tn, gn = float(t.norm()), float(g.norm())
    return dict(
        max_abs=max_abs,
        max_rel=max_abs / ref_absmax if ref_absmax > 0 else (0.0 if max_abs == 0 else math.inf),
        mean_abs=float(diff.mean()) if diff.numel() else 0.0,
        sqnr_db=math.inf if noise == 0 else 10 * math.log10(max(sig, 1e-300) / noise),
        cosine=float((t.flatten() @ g.flatten()) / (tn * gn)) if tn > 0 and gn > 0 else (1.0 if tn == gn else 0.0),
        ref_absmax=ref_absmax,
        worst_index=idx,
        worst_target=float(t.flatten()[flat]) if t.numel() else math.nan,
        worst_golden=float(g.flatten()[flat]) if g.numel() else math.nan,
    )


def topk_agreement(t_logits: torch.Tensor, g_logits: torch.Tensor, limit: float, k: int = T.TOPK) -> TopKResult:
    """Top-k of target vs golden logits per (prompt, position).  A position whose top-k sets
    differ is *explained* when the golden logits of the swapped ids lie within ``2 * limit`` of the
    golden k-th value: a near-tie the model tier cannot resolve (``limit`` is the logits' largest
    allowed error; two logits each within it can swap when their golden gap is up to twice it)."""
    k = min(k, t_logits.shape[-1])  # a vocabulary smaller than k: all of it
    return topk_ids_agreement(t_logits.double().topk(k, dim=-1).indices, g_logits, limit)


def topk_ids_agreement(t_ids: torch.Tensor, g_logits: torch.Tensor, limit: float) -> TopKResult:
    """Like ``topk_agreement`` when the target gives only its top-k ids (B, T, k) — e.g. vLLM
    with CUDA graphs, through prompt logprobs — not its logits."""
    k = t_ids.shape[-1]
    g = g_logits.reshape(-1, g_logits.shape[-1]).double()
    t = t_ids.reshape(-1, k)
    gk = g.topk(k, dim=-1)
    top1 = (gk.indices[:, 0] == t[:, 0]).double().mean().item()
    overlaps, unexplained, worst, worst_gap = [], 0, "", -1.0
    for p in range(g.shape[0]):
        gs, ts = set(gk.indices[p].tolist()), set(t[p].tolist())
        overlaps.append(len(gs & ts) / k)
        if gs == ts:
            continue
        kth = float(gk.values[p, -1])
        gap = max(kth - float(g[p, i]) for i in ts - gs)
        if gap > 2 * limit:  # each logit within +-limit: a gap up to 2 * limit can swap
            unexplained += 1
            if gap > worst_gap:
                worst_gap = gap
                worst = (f"position {p}: target top-{k} has ids {sorted(ts - gs)} whose golden logits sit {gap:.3g} "
                         f"below the golden {k}th value (limit 2 x {limit:.3g}: two logits each within the tier)")
    return TopKResult(positions=g.shape[0], top1_agree=top1, overlap=sum(overlaps) / len(overlaps),
                      unexplained=unexplained, worst=worst)


def compare(golden: dict, target: dict, *, order: list, dtype: str, target_name: str = "?",
            tol_overrides: Optional[dict] = None, diagnose=None, noise: Optional[dict] = None,
            noise_factor: Optional[float] = None) -> Comparison:
    """golden/target: {canonical name: tensor}; order: canonical names in execution order.
    diagnose(name, target_tensor, golden_tensor, target_dict) -> list[str] hints, for failures.
    noise: {name: max-abs error of an independent same-precision implementation} (parity.noise);
    a tensor's limit is then max(tier limit, noise_factor x floor): never tighter than the tier."""
    factor = NOISE_FACTOR if noise_factor is None else noise_factor
    tol = T.resolve(dtype, tol_overrides)
    overrides = {(k if "." in k else f"{k}.rtol"): float(v) for k, v in (tol_overrides or {}).items()}
    over_tiers = {k.partition(".")[0] for k in overrides}
    results = []
    for i, name in enumerate(order):
        g = golden[name]
        tier = N.tier(name)
        r = TensorResult(name=name, order=i, tier=tier, shape=tuple(g.shape), status="pass")
        t = target.get(name)
        if t is None:
            r.status, r.detail = "missing", "the target did not capture this tensor"
        elif tuple(t.shape) != tuple(g.shape):
            r.status, r.detail = "shape", f"target shape {tuple(t.shape)} != golden {tuple(g.shape)}"
        elif not bool(torch.isfinite(g).all()):  # GoldenSet.load refuses such sets; a golden dict from elsewhere
            r.status, r.detail = "nonfinite", f"{int((~torch.isfinite(g)).sum())} NaN/Inf values in the golden"
        elif not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            r.status, r.detail = "nonfinite", f"{bad} NaN/Inf values in the target"
        else:
            for k, v in tensor_metrics(t, g).items():
                setattr(r, k, v)
            r.limit = tol[tier].limit(r.ref_absmax)
            if tier in over_tiers:
                r.limit_source = "override"
            if noise is not None and name in noise and factor * noise[name] > r.limit:
                r.limit, r.limit_source = factor * noise[name], "noise"
            if not r.max_abs <= r.limit:  # a NaN error (a non-finite golden) fails too
                r.status = "FAIL"
        if r.status == "nonfinite" and "target" in r.detail:
            r.hints = ["the target's first NaN / Inf: an overflow (the fp16 / bf16 range), a division by zero (a zero "
                       "scale or norm) or a NaN read in this operator"]
        if r.status == "FAIL" and diagnose is not None and t is not None:  # (shape / missing: said by the line)
            try:
                r.hints = diagnose(name, t, g, target)
            except Exception as e:  # a diagnosis must never hide the failure itself
                r.hints = [f"(diagnosis failed: {e!r})"]
        results.append(r)
    _flag_jumps(results, tol)
    topk = None
    if "logits" in golden and "logits" in target and target["logits"].shape == golden["logits"].shape:
        topk = topk_agreement(target["logits"], golden["logits"], tol["model"].limit(0.0) + tol["model"].rtol *
                              float(golden["logits"].abs().max()))
    return Comparison(target=target_name, dtype=dtype, results=results, topk=topk, tol=tol,
                      noise_factor=factor if noise is not None else None, overrides=overrides)


def _flag_jumps(results: list, tol: dict) -> None:
    prev: dict[str, TensorResult] = {}
    for r in results:
        layer, op = N.split(r.name)
        if layer is None or math.isnan(r.max_abs):
            continue
        p = prev.get(op)
        prev[op] = r
        if p is None or math.isnan(p.max_abs):
            continue
        floor = T.JUMP_FLOOR * r.limit
        base = max(p.max_abs, 1.2e-7 * p.ref_absmax, 1e-30)  # an fp32 ulp: exact zeros are not a base
        if r.max_abs > floor and r.max_abs > T.JUMP_FACTOR * base:
            r.jump = r.max_abs / base
