"""What an error pattern suggests: hints printed beside a failing tensor's numbers.

Two kinds of evidence:

* structure of (target - golden) alone: a sign flip, one constant factor, per-channel or
  per-token factors, permuted output channels, error concentrated on channels with a period
  along the hidden dim;
* for a linear operator, *re-decoding*: the operator is recomputed from the target's own
  captured input under plausible wrong decodes of its packed weight (±1 codes swapped,
  bit order reversed, other lane layouts, scale inverted or missing).  A variant that
  reproduces the target's output names the bug exactly.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import torch

from . import names as N

PERIODS = (2, 4, 8, 16, 32, 64, 128, 256)


def _fit(t: torch.Tensor, g: torch.Tensor, dim: Optional[int]):
    """Least-squares factor c with t ~ c*g (over everything, or per index along ``dim`` of the
    2-D views), and the worst residual relative to max|t|."""
    if dim is None:
        c = (t * g).sum() / (g * g).sum().clamp(min=1e-300)
        res = (t - c * g).abs().max() / t.abs().max().clamp(min=1e-300)
        return c, float(res)
    c = (t * g).sum(dim, keepdim=True) / (g * g).sum(dim, keepdim=True).clamp(min=1e-300)
    res = (t - c * g).abs().max() / t.abs().max().clamp(min=1e-300)
    return c.flatten(), float(res)


#: canonical operators that are an RMSNorm's output (per-channel factors there are the norm's weight, not a scale)
NORM_OPS = ("input_norm", "post_attn_norm", "attn.sub_norm", "mlp.sub_norm")


def structural_hints(t: torch.Tensor, g: torch.Tensor, name: Optional[str] = None, exact: bool = False) -> list[str]:
    """Hints from the structure of (t - g) alone. name: the canonical tensor (the wording follows its kind: a norm
    output, the attention output); exact: the target claims the reference's arithmetic bit for bit (its fp32 column),
    so no difference there is rounding noise."""
    op = N.split(name)[1] if name else None
    is_norm = op in NORM_OPS or name == "final_norm"
    F = t.shape[-1]
    t2 = t.reshape(-1, F).double()
    g2 = g.reshape(-1, F).double()
    hints: list[str] = []
    cos = float((t2.flatten() @ g2.flatten()) / (t2.norm() * g2.norm()).clamp(min=1e-300))
    c, res = _fit(t2, g2, None)
    cp, res_p = _fit(t2, g2, 1)  # one factor per token
    spread_p = float((cp.max() - cp.min()) / cp.abs().mean().clamp(min=1e-300))
    if cos < -0.95:
        hints.append(f"output negated (cosine {cos:.3f}): +1/-1 codes swapped (code table) or a negative scale")
    elif res_p < 1e-2 and spread_p > 1e-4 and float((cp - 1).abs().max()) > 1e-4:
        hints.append(f"each token is scaled by its own factor (range {float(cp.min()):.5g}..{float(cp.max()):.5g}): "
                     f"normalisation (RMSNorm eps or weight) or the activation-quantisation scale")
    elif res < 1e-2 and abs(float(c) - 1) > 1e-3:
        hints.append(f"every element is {float(c):.5g} x golden (1/x = {1 / float(c):.5g}): a scale missing, applied "
                     f"twice, or multiplied where it should divide (scale)")
    else:
        cc, res_c = _fit(t2, g2, 0)  # per output channel
        if res_c < 1e-2:
            off = (cc - 1).abs() > 1e-3
            neg = cc < -0.5
            if bool(neg.any()):
                hints.append(f"sign flipped on {int(neg.sum())}/{F} channels (e.g. {neg.nonzero().flatten()[:6].tolist()}): "
                             f"code table or lane layout")
            elif bool(off.any()):
                cause = ("the norm's weight missing (all ones) or another norm's weight" if is_norm else
                         "per-channel or per-block scale")
                hints.append(f"{int(off.sum())}/{F} output channels off by constant factors (e.g. channel "
                             f"{int(off.nonzero()[0])}: x{float(cc[off][0]):.4g}): {cause}")
    if not hints and t2.shape[0] >= 2:
        hints += _offset_hint(t2, g2)
    if not hints and t2.shape[0] >= 4 and F >= 4:
        hints += _permutation_hint(t2, g2, attention=op == "attn.attn_out")
    if not hints:
        hints += _periodic_hint(t2, g2)
    cf = float(c)
    if not hints and not exact and cos > 0.99 and abs(cf - 1) > 0.05 and res < 0.25 * abs(cf - 1):
        # the constant factor under a target's own rounding (bf16, an independent kernel): its residual is that noise,
        # far above the 1e-2 of the exact fit above, but small beside the factor's own size
        hints.append(f"every element is about {cf:.4g} x golden (1/x = {1 / cf:.4g}; the rest, max_rel {res:.1e} of "
                     f"max|target|, is this target's own rounding): a scale missing, applied twice, or multiplied where "
                     f"it should divide (scale)")
    if not hints:
        rel = float((t2 - g2).abs().max() / g2.abs().max().clamp(min=1e-300))
        spread = float((t2 - g2).pow(2).mean(0).sqrt().std() / (t2 - g2).pow(2).mean(0).sqrt().mean().clamp(min=1e-300))
        # cosine bands: a wrong weight or wiring falls far below 0.99; accumulated bf16 rounding over a deep model
        # (a correct bf16 target past its static tier) sits at 0.99-0.999
        if exact and cos > 0.99:
            # a bit-faithful target has no rounding noise of its own: a small unstructured error is an arithmetic
            # difference (the int8 activation quantiser's granularity or rounding, an eps, an operation order)
            what = ("small but real on a target that claims the reference's arithmetic bit for bit: a different "
                    "computation of this operator or its input (activation-quantisation granularity or rounding, an "
                    "eps, the order of operations) - compare the first tensor whose error is nonzero")
        else:
            what = ("noise-like: accumulation / dtype" if cos > 0.999 else
                    "close but drifted: accumulated rounding over depth or a small numeric difference (compute dtype, "
                    "eps); a wiring error falls far lower (deep bf16 models: a noise floor measured by ANOTHER "
                    "implementation of the same precision - `python -m parity.noise` (the bf16 target) for the "
                    "others, `--target reference --target-opt dtype=bfloat16` for the bf16 target itself: the "
                    "target that measured a floor is never judged by it)"
                    if cos > 0.99 else "a different computation: wrong weights or wiring")
        hints.append(f"unstructured error (max_rel {rel:.2e}, channel spread {spread:.2f}, cosine {cos:.4f}): {what}")
    return hints


def _offset_hint(t2: torch.Tensor, g2: torch.Tensor) -> list[str]:
    """The same per-channel difference at every token: an additive term (a bias added twice or missing)."""
    e = t2 - g2
    if not bool(torch.isfinite(e).all()):  # NaN compares False everywhere below: no offset to read
        return []
    em = e.mean(0)
    big = float(em.abs().max())
    if big == 0 or big < 1e-3 * float(g2.abs().max()):
        return []
    if float((e - em).abs().max()) > 1e-2 * big:
        return []
    nz = int((em.abs() > 1e-3 * big).sum())
    return [f"every token off by the same per-channel offset ({nz}/{t2.shape[1]} channels, largest {big:.3g}): an "
            f"additive per-channel term - a bias added twice, missing, or another layer's"]


def _permutation_hint(t2: torch.Tensor, g2: torch.Tensor, attention: bool = False) -> list[str]:
    F = t2.shape[1]
    if F > 4096:
        return []
    tz = (t2 - t2.mean(0)) / t2.std(0).clamp(min=1e-30)
    gz = (g2 - g2.mean(0)) / g2.std(0).clamp(min=1e-30)
    corr = (tz.t() @ gz) / (t2.shape[0] - 1)  # (F target, F golden)
    best = corr.abs().max(dim=1)
    matched = best.values > 0.99
    moved = matched & (best.indices != torch.arange(F))
    if int(matched.sum()) < 0.5 * F or int(moved.sum()) == 0:
        return []
    j = moved.nonzero().flatten()
    k = best.indices[j]
    disp = (k - j)
    common = torch.mode(disp).values.item()
    desc = f"e.g. channel {int(j[0])} holds golden channel {int(k[0])}"
    cause = ("the heads merged in another order or reshaped wrongly ([T, H, D] <-> [T, H * D], GQA head mapping)"
             if attention else "lane layout / bit order along the output axis, or a wrong qkv / gate_up split")
    return [f"output channels permuted: {int(moved.sum())}/{F} channels hold another golden channel ({desc}; most "
            f"common displacement {common:+d}): {cause}"]


def _periodic_hint(t2: torch.Tensor, g2: torch.Tensor) -> list[str]:
    F = t2.shape[1]
    e = (t2 - g2).pow(2).mean(0)  # error energy per channel
    if float(e.sum()) == 0:
        return []
    total = float(((e - e.mean()) ** 2).sum())
    if total == 0:
        return []
    for p in PERIODS:
        if F < 2 * p:
            break
        idx = torch.arange(F) % p
        means = torch.zeros(p, dtype=e.dtype).index_add_(0, idx, e) / torch.bincount(idx, minlength=p)
        explained = 1 - float(((e - means[idx]) ** 2).sum()) / total
        if explained > 0.8 and float(means.max()) > 10 * float(means.min()) + 1e-30:  # smallest period first
            hot = (means > means.mean()).nonzero().flatten().tolist()
            return [f"error concentrated on channels j % {p} in {hot[:8]}: periodic along the hidden dim with period "
                    f"{p} -> lane layout, bit order or block-scale size"]
    return []


def depth_hint(results) -> Optional[str]:
    """If layer outputs' errors grow steadily with depth (no single jump), say so (parity.run adds it only where the
    first divergence has no structural explanation of its own: an operator's clean factor also spreads downstream)."""
    outs = [r for r in results if r.name.endswith(".output") and r.max_abs == r.max_abs]
    errs = [r.max_rel for r in outs]
    if len(errs) < 3 or errs[0] <= 0:
        return None
    growth = [b / max(a, 1e-30) for a, b in zip(errs, errs[1:])]
    if all(1.05 < g < 10 for g in growth):
        return (f"error grows steadily with depth ({errs[0]:.2e} -> {errs[-1]:.2e} over {len(errs)} layers, no jump): "
                f"accumulation (norm eps, residual scaling, compute dtype) rather than one broken operator")
    return None


# ---------------------------------------------------------------------------------------
# re-decoding a linear operator under wrong-decode variants


def decode_variants(entry) -> dict:
    """Plausible wrong decodes of one LinearEntry: {description: LinearEntry}."""
    out = {}
    p = entry.pack
    if p is not None:
        codes = list(p.codes)
        if 1 in codes and -1 in codes:
            sw = [(-v if v in (1, -1) else v) for v in codes]
            out["+1/-1 codes swapped (code table)"] = dataclasses.replace(entry, pack=p.replace(codes=tuple(sw)))
        out["bit order reversed (code table read LSB<->MSB)"] = dataclasses.replace(
            entry, pack=p.replace(bit_order="msb" if p.bit_order == "lsb" else "lsb"))
        for lanes, block in (("interleaved", None), ("blocked", None), ("block_interleaved", 128)):
            if (lanes, block) != (p.lanes, p.block):
                try:
                    out[f"lane layout {lanes}{'/' + str(block) if block else ''} instead of {p.lanes}"] = \
                        dataclasses.replace(entry, pack=p.replace(lanes=lanes, block=block))
                except ValueError:
                    pass
    if entry.scale is not None:
        s = entry.scale
        out[f"scale {'multiplied' if s.op == 'divide' else 'divided'} instead of {s.op + 'd'} (scale)"] = \
            dataclasses.replace(entry, scale=dataclasses.replace(s, op="multiply" if s.op == "divide" else "divide"))
        out["scale not applied (scale)"] = dataclasses.replace(entry, scale=None)
    return out


class DecodeProbe:
    """Recomputes linear operators of a model from a target's captured inputs."""

    def __init__(self, model_dir: Path, spec_path: Optional[Path] = None):
        from reference.checkpoint import Checkpoint
        from reference.config import ModelConfig
        from reference.spec import spec_for

        self.cfg = ModelConfig.load(model_dir)
        self.spec = spec_for(model_dir, self.cfg, spec_path)
        self.ckpt = Checkpoint(model_dir)

    def _run(self, entry, mod: str, x: torch.Tensor) -> Optional[torch.Tensor]:
        from reference.model import Linear
        from reference.spec import decode_linear

        try:
            d = decode_linear(self.ckpt, entry, mod, strict=False)
        except Exception:
            return None
        return Linear(d, self.spec.activation_quant == "int8_per_token", torch.float32)(x.float())

    def spec_error(self, name: str, t: torch.Tensor, target: dict) -> Optional[tuple]:
        """(hf module, entry, input name, input, max_rel of ``t`` against the spec's decode run on the target's own
        captured input), or None where the operator cannot be recomputed: ~1e-7 for a right operator whatever drifted
        upstream (README: per operator, on identical inputs, the targets agree to ~1e-7).  ``hints`` takes it as is,
        so an operator is decoded once."""
        mod = N.hf_module(name)
        entry = self.spec.linears.get(mod) if mod else None
        x_name = N.linear_input(name, target)
        if entry is None or x_name is None:
            return None
        x = target[x_name]
        y = self._run(entry, mod, x)
        if y is None or y.shape != t.shape:
            return None
        return mod, entry, x_name, x, float((y - t).abs().max()) / (float(t.abs().max()) or 1.0)

    def hints(self, name: str, t: torch.Tensor, target: dict, spec_error: Optional[tuple] = None) -> list[str]:
        se = spec_error or self.spec_error(name, t, target)
        if se is None:
            return []
        mod, entry, x_name, x, err_spec = se
        scale = float(t.abs().max()) or 1.0
        best, best_err = None, err_spec
        for desc, e in decode_variants(entry).items():
            yv = self._run(e, mod, x)
            if yv is None or yv.shape != t.shape:
                continue
            err = float((yv - t).abs().max()) / scale
            if err < best_err:
                best, best_err = desc, err
        if best is not None and best_err < 1e-2 and best_err < 0.1 * err_spec:
            return [f"re-decoding {mod} with {best} reproduces the target's output (max_rel {best_err:.1e}, "
                    f"vs {err_spec:.1e} with the spec's decode)"]
        if err_spec < 1e-3:
            return [f"{mod} computed by the reference from the target's own input {x_name} matches the target "
                    f"(max_rel {err_spec:.1e}): the operator is right, its input drifted (look upstream)"]
        return []


def residual_hints(name: str, t: torch.Tensor, target: dict, probe: Optional["DecodeProbe"] = None) -> list[str]:
    """A residual add dropped or doubled up: ``layerL.output`` (= stream in + o_proj + down_proj) and
    ``layerL.post_attn_norm`` (= norm(stream in + o_proj)) recomputed from the target's own captured branches
    under the wrong wirings; one that reproduces the target's tensor names the bug."""
    layer, op = N.split(name)
    if layer is None or op not in ("output", "post_attn_norm"):
        return []
    prev = f"layer{layer - 1}.output" if layer > 0 else "embed"
    o, d = target.get(f"layer{layer}.attn.o_proj"), target.get(f"layer{layer}.mlp.down_proj")
    h = target.get(prev)
    if h is None or o is None or (op == "output" and d is None):
        return []
    h, o, t = h.double(), o.double(), t.double()
    if op == "output":
        d = d.double()
        right = h + o + d
        wrong = {"the MLP's residual add dropped (output = down_proj alone)": d,
                 "the MLP branch never added to the residual stream (output = the stream after attention)": h + o,
                 "the attention's residual add dropped (output = o_proj + down_proj)": o + d,
                 "the MLP branch added twice (output = stream + o_proj + 2 down_proj)": h + o + 2 * d,
                 "the attention branch added twice (output = stream + 2 o_proj + down_proj)": h + 2 * o + d,
                 "the residual stream added twice (output = 2 stream + o_proj + down_proj)": 2 * h + o + d}
    else:
        if probe is None:
            return []
        key = probe.spec.tensors.get(f"model.layers.{layer}.post_attention_layernorm.weight")
        if key is None:
            return []
        from reference.model import rms_norm

        w, eps = probe.ckpt.get(key).double(), probe.cfg.rms_norm_eps
        right = rms_norm(h + o, w, eps)
        wrong = {"the attention's residual add dropped (post-attention norm of o_proj alone)": rms_norm(o, w, eps),
                 "the attention branch never added (post-attention norm of the stream before attention)":
                     rms_norm(h, w, eps),
                 "the attention branch added twice (post-attention norm of stream + 2 o_proj)": rms_norm(h + 2 * o, w, eps),
                 "the residual stream added twice (post-attention norm of 2 stream + o_proj)": rms_norm(2 * h + o, w, eps)}
    scale = float(t.abs().max()) or 1.0
    err_right = float((right - t).abs().max()) / scale
    for desc, y in wrong.items():
        err = float((y - t).abs().max()) / scale
        if err < 1e-2 and err < 0.1 * err_right:
            return [f"recomputed from the target's own {prev}, attn.o_proj{', mlp.down_proj' if op == 'output' else ''}: "
                    f"{desc} reproduces it (max_rel {err:.1e}, vs {err_right:.1e} wired as the reference): residual "
                    f"connection"]
    return []


class Diagnoser:
    """Callable for parity.compare: structural hints + (optionally) re-decoding."""

    def __init__(self, probe: Optional[DecodeProbe] = None, max_tensors: int = 4, exact: bool = False,
                 fp32: bool = False):
        self.probe = probe
        self.fp32 = fp32  # the target computes in fp32: its linears agree with the probe's to ~1e-7 (_upstream_operator)
        self.left = max_tensors
        self.exact = exact  # the target claims the reference's arithmetic bit for bit (structural_hints)
        self.scanned = False  # the upstream wiring scan ran (it belongs to the first failing tensor only)

    def __call__(self, name, t, g, target) -> list[str]:
        if self.left <= 0:
            return []
        self.left -= 1
        hints = []
        first, self.scanned = not self.scanned, True
        if self.probe is not None and N.hf_module(name):
            hints += self.probe.hints(name, t, target)
        wiring = residual_hints(name, t, target, self.probe)
        if wiring:  # the structure of a dropped branch reads as "unstructured: wrong weights"; this says more
            return hints + wiring
        up = (self._upstream_wiring(name, target) or self._upstream_operator(name, target)) if first else []
        return hints + up + structural_hints(t, g, name, exact=self.exact)

    #: max_rel of a linear against its own recomputation above which it is wrong, not rounded (right: ~1e-7)
    OP_WRONG = 1e-3

    def _upstream_operator(self, name: str, target: dict) -> list[str]:
        """A linear that ran before the first failing tensor, in its layer or the one before, whose output is not what
        the spec's decode gives on the target's own input, though it stayed inside its tier: an independent fp32
        target of an int8-activation model is allowed 5% (fp32-a8), so a wrong bias or a few wrong weights in
        layer0.attn.k_proj first failed at layer0.attn.attn_out, and the hint there read as drift.  Once per run: the
        first failing tensor; at most two layers' linears are recomputed; fp32 targets only."""
        if self.probe is None or not self.fp32:  # (a bf16 / fp16 target's own rounding is ~1e-3 per operator)
            return []
        layer, op_here = N.split(name)
        if layer is None:
            return []
        rank = {o: i for i, (o, _) in enumerate(N.LAYER_OPS)}
        for L in (layer - 1, layer):
            for op, _ in N.LAYER_OPS:
                n = f"layer{L}.{op}"
                if L < 0 or n == name or n not in target or N.hf_module(n) is None or \
                        (L == layer and rank[op] >= rank.get(op_here, -1)):
                    continue
                se = self.probe.spec_error(n, target[n], target)
                if se is not None and se[-1] > self.OP_WRONG:
                    mod, _, x_name, _, err = se
                    more = self.probe.hints(n, target[n], target, se)
                    return [f"upstream, inside its tier: {n} differs from the spec's {mod} run on the "
                            f"target's own input {x_name} (max_rel {err:.1e}; a right operator "
                            f"agrees to ~1e-7): the error enters there - wrong weights, scale or bias in that "
                            f"operator, not drift" + (f"; {more[0]}" if more else "")]
        return []

    def _upstream_wiring(self, name: str, target: dict) -> list[str]:
        """A residual add dropped upstream whose own tensor stayed inside its tier: in layer 0 of a model with a small
        embedding (std 0.02) norm(o_proj) is close to norm(embed + o_proj), so the first tensor out of tolerance
        lies layers later and read as drift. The wiring check of every earlier layer's stream (the target's own
        captures, no golden needed) names it. Once per run: the first failing tensor."""
        layer, op_here = N.split(name)
        rank = {o: i for i, (o, _) in enumerate(N.LAYER_OPS)}
        if layer is not None:
            last = layer
        elif name == "embed":  # before every layer: nothing upstream
            last = -1
        else:  # final_norm / logits: after every layer
            last = max((N.split(n)[0] for n in target if N.split(n)[0] is not None), default=-1)
        for L in range(last + 1):
            for op in ("post_attn_norm", "output"):
                n = f"layer{L}.{op}"
                if n not in target or (L == layer and rank[op] >= rank.get(op_here, -1)):
                    continue  # only what ran before the failing tensor
                h = residual_hints(n, target[n], target, self.probe)
                if h:
                    return [f"upstream, inside its tier: {n}: {h[0]}"]
        return []
