"""Markdown report of a ``reference.inspect`` run: what was found, and the evidence for it.

Sections: summary, inferences (decision / evidence / confidence), candidate losses, per-tensor
table, zero ratios per tensor and per layer (dense vs sparse kernels), unpacked-ternary scale
structure (TriLM shards), and the key-mapping table checkpoint key -> vLLM parameter.
"""
from __future__ import annotations

import math

import torch

from .checkpoint import Checkpoint
from .inspect_search import HQQ_CHECKED, codes_str

SPARSE_AT = 0.5  # zero ratio above which skipping zeros can pay (seed: 20-30% -> dense)

VLLM_MERGED = {"self_attn.q_proj": ("self_attn.qkv_proj", "q"), "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
               "self_attn.v_proj": ("self_attn.qkv_proj", "v"), "mlp.gate_proj": ("mlp.gate_up_proj", "0"),
               "mlp.up_proj": ("mlp.gate_up_proj", "1")}


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def vllm_param(hf_module: str) -> tuple[str, str]:
    """HF module -> (vLLM parameter prefix, shard id or '')."""
    if hf_module == "lm_head":
        return "lm_head", ""
    head, _, tail = hf_module.partition(".self_attn.") if ".self_attn." in hf_module else hf_module.partition(".mlp.")
    sub = ("self_attn." if ".self_attn." in hf_module else "mlp.") + tail
    if sub in VLLM_MERGED:
        p, shard = VLLM_MERGED[sub]
        return f"{head}.{p}", shard
    return hf_module, ""


def mapping_rows(res) -> list[str]:
    rows = ["| checkpoint key | vLLM parameter | operation |", "|---|---|---|"]
    for m in res.modules:
        for hf, (r0, r1) in m.parts:
            p, shard = vllm_param(hf)
            ops = []
            if len(m.parts) > 1:
                ops.append(f"split rows [{r0}, {r1}) of fused {m.role}")
            if shard:
                ops.append(f"merge as shard {shard!r}")
            if m.transposed:
                ops.append("stored transposed")
            e = res.spec.linears.get(hf)  # None: a float linear kept as a plain tensor
            pk = e.pack if e is not None else None
            ops.append("unpack " + (f"{pk.container} axis{pk.pack_axis}" if pk else "none (float)")
                       + (f" - its -1 mask `{e.neg_key}` too (W = pos - neg) -> `{p}.weight_neg`, paired on load"
                          if e is not None and e.neg_key is not None else ""))
            if e is not None and e.scale is not None and e.scale.granularity == "block":
                ops.append(f"in-block {e.scale.dtype} scale per {e.scale.group_size} values -> "
                           f"`{p}.weight_scale` (dense fallback in vLLM)")
            rows.append(f"| `{m.weight.name}` | `{p}.weight` | {'; '.join(ops)} |")
            if m.scale is not None:
                sc = res.spec.linears[hf].scale
                what = sc.granularity + (f" [element {sc.index}]" if sc.index is not None else "") + \
                    (f" group_size {sc.group_size}" if sc.group_size else "") + (" stored [G, N]" if sc.transposed else "") \
                    + (" (HQQ axis=0: one per column of the [G, N*K/G] view)" if sc.group_axis == 0 else "")
                rows.append(f"| `{m.scale.name}` | `{p}.weight_scale` | {what}, {sc.op}"
                            f"{'; shard ' + repr(shard) if shard else ''} |")
            e = res.spec.linears.get(hf)
            if m.in_norm is not None and e is not None and e.input_norm is not None:
                rows.append(f"| `{m.in_norm.name}` | `{p}.weight_in_norm` | input RMSNorm (eps {e.input_norm.eps}) "
                            f"before the activation quantization{'; shard ' + repr(shard) if shard else ''} |")
        zero_what = ("per-group zero points: values = q - zero (HQQ), vLLM `weight_zero` (dense fallback)"
                     if m.zero_kw else "folded into code table (constant)")
        gidx_what = ("act-order g_idx, groups permuted: input k takes the scale / zero point of group g_idx[k]"
                     if m.act_order else "checked trivial, dropped")
        for extra, what in ((m.zeros, zero_what), (m.g_idx, gidx_what),
                            (m.shape_t, "checked against config, dropped")):
            if extra is not None:
                rows.append(f"| `{extra.name}` | - | {what} |")
        for leaf, st in sorted(m.hqq_meta.items()):
            rows.append(f"| `{st.name}` | - | HQQ meta {leaf} = {m.hqq_values.get(leaf)!r}, "
                        f"{'checked' if leaf in HQQ_CHECKED else 'read'}, dropped |")
    for hf, key in sorted(res.floats.items()):
        rows.append(f"| `{key}` | `{hf}` | copy{'' if key == hf else ' (rename)'} |")
    return rows


def shard_structure(ckpt: Checkpoint, name: str) -> str:
    """How the magnitudes of an unpacked ternary float tensor are laid out (per tensor/row/shard)."""
    a = ckpt.get(name).to(torch.float32).abs()  # (N, K)
    nz = a > 0
    if not bool(nz.any()):
        return "all zero"

    def runs(vec):
        v = vec.tolist()
        return 1 + sum(1 for x, y in zip(v, v[1:]) if x != y)

    big = torch.where(nz, a, torch.full_like(a, float("inf")))
    row_lo, row_hi = big.min(1).values, a.max(1).values
    has = row_hi > 0
    if bool((row_lo[has] == row_hi[has]).all()):
        r = runs(row_hi[has])
        if r == 1:
            return f"per tensor (s={float(row_hi[has][0]):.4g})"
        return f"{r} row shards" if r <= 8 else f"per row ({r} distinct runs)"
    col_lo, col_hi = big.min(0).values, a.max(0).values
    hc = col_hi > 0
    if bool((col_lo[hc] == col_hi[hc]).all()):
        r = runs(col_hi[hc])
        return f"{r} column shards" if r <= 8 else f"per column ({r} runs)"
    return "mixed magnitudes (not a simple ternary layout)"


def render(res) -> str:
    ckpt = Checkpoint(res.dir)
    s = res.spec
    L = [f"# Format report: `{res.dir}`", ""]
    L.append(f"- architecture: {res.cfg.arch}, {res.cfg.num_layers} layers, hidden {res.cfg.hidden_size}, "
             f"intermediate {res.cfg.intermediate_size}, heads {res.cfg.num_heads}/{res.cfg.num_kv_heads}")
    L.append(f"- spec: `{s.name}`, activation_quant `{s.activation_quant}`, digest `{s.digest()[:16]}`")
    if res.loss is not None:
        L.append(f"- reference loss of the chosen decode on the text sample: **{res.loss:.4f} nats**")
    first = next(iter(s.linears.values()), None)
    if first is None:
        L.append("- linears: plain float tensors (no packing, no scales): an unquantised checkpoint")
    elif first.pack:
        p = first.pack
        L.append(f"- packing: {p.bits}-bit in {p.container} ({p.values_per_container}/container), axis "
                 f"{p.pack_axis}{' (stored transposed)' if p.transposed else ''}, lanes {p.lanes}"
                 f"{f' block {p.block}' if p.block else ''}, bit order {p.bit_order}, codes {codes_str(p.codes)}"
                 + (f", records of {p.record[0]} values in {p.record[1]} bytes" if p.record else "")
                 + ((f", packed as the [N*K/{p.group_view}, {p.group_view}] group view (HQQ axis=1)" if p.group_axis == 1
                     else f", packed as the [{p.group_view}, N*K/{p.group_view}] group view (HQQ axis=0)")
                    if p.group_view else "")
                 + (f"; a codec {p.codec!r} pair: +1 mask `{first.weight_key}`, -1 mask `{first.neg_key}`, "
                    f"W = pos - neg" if first.neg_key is not None else ""))
    widths: dict[int, list] = {}
    for e in s.linears.values():
        if e.pack is not None:
            widths.setdefault(e.pack.bits, []).append(e.pack)
    if len(widths) > 1:  # mixed code widths: the line above is the first module's; one line per width
        for b, packs in sorted(widths.items()):
            p = packs[0]
            L.append(f"- {b}-bit modules: {len(packs)}, in {sorted({q.container for q in packs})} "
                     f"({sorted({q.values_per_container for q in packs})}/container), codes {codes_str(p.codes)}")
    if first is not None and first.scale:
        sc = first.scale
        L.append(f"- scale: {sc.granularity}{f' group_size {sc.group_size}' if sc.group_size else ''}"
                 f"{' (HQQ axis=0 groups)' if sc.group_axis == 0 else ''}, {sc.op}"
                 + (f", {sc.dtype} at byte {sc.byte_offset} of each {sc.record_bytes}-byte block of the weight"
                    if sc.granularity == "block" else ""))
    if first is not None and first.zero:
        L.append(f"- zero points: per group of {first.zero.group_size}, values = code - zero")
    L += ["", "## Inferences", "", "| what | decision | evidence | confidence |", "|---|---|---|---|"]
    for f in res.findings:
        L.append(f"| {f.what} | {f.decision} | {f.evidence} | {f.confidence} |")
    if len(res.scored) > 1:
        valid = [sc for sc in res.scored if math.isfinite(sc.loss)]
        if res.loss is not None:
            valid.sort(key=lambda sc: sc.loss)  # the search's order is not the loss order
            L += ["", "## Candidate decodes scored by loss (best first)", "", "| # | candidate | loss (nats) | note |",
                  "|---|---|---|---|"]
        else:  # --no-loss: nothing was evaluated; the a-priori order, the chosen decode first
            L += ["", "## Candidate decodes (not scored: no loss evaluation; a-priori order, the chosen one first)",
                  "", "| # | candidate | loss (nats) | note |", "|---|---|---|---|"]
        for i, sc in enumerate(valid[:32]):
            L.append(f"| {i} | {sc.cand.label()} | {f'{sc.loss:.4f}' if res.loss is not None else '-'} | {sc.note} |")
        if len(valid) > 32:
            L.append(f"| ... | {len(valid) - 32} more | | |")
        bad = [sc for sc in res.scored if not math.isfinite(sc.loss)]
        if bad:
            L += ["", f"{len(bad)} candidates were rejected without a forward pass (they do not fit the stored "
                      f"shapes, or decode an unused code or one-block padding of more than one code), e.g. "
                      f"{bad[0].cand.label()}: {bad[0].note}"]
    L += ["", "## Tensors", "", "| tensor | file | dtype | shape | bytes | kind | unique | 2-bit code counts | zero ratio |",
          "|---|---|---|---|---|---|---|---|---|"]
    for name, st in res.stats.items():
        hist = st.code_hist
        L.append(f"| `{name}` | {st.file.rsplit('/', 1)[-1]} | {st.dtype} | {list(st.shape)} | {_fmt_bytes(st.nbytes)} "
                 f"| {st.kind} | {st.unique_str()} | {hist if hist else '-'} | {st.zero_ratio:.3f} |")
    L += ["", "## Zero ratio (decoded)", "", "| layer | module | zero ratio |", "|---|---|---|"]
    per_layer: dict = {}
    for hf, z in res.zero_ratio.items():
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else "-"
        n, k = s.linears[hf].out_shape
        acc = per_layer.setdefault(layer, [0.0, 0])
        acc[0] += z * n * k
        acc[1] += n * k
        L.append(f"| {layer} | {hf.split('.', 3)[-1]} | {z:.3f} |")
    L += ["", "| layer | zero ratio | kernel |", "|---|---|---|"]
    for layer, (zs, n) in per_layer.items():
        zr = zs / max(1, n)
        L.append(f"| {layer} | {zr:.3f} | {'sparse (skip zeros) may pay' if zr > SPARSE_AT else 'dense'} |")
    tern = [m for m in res.modules if m.weight.kind == "ternary_float"]
    if tern:
        L += ["", "## Unpacked ternary floats: scale structure", "", "| tensor | scales |", "|---|---|"]
        for m in tern:
            L.append(f"| `{m.weight.name}` | {shard_structure(ckpt, m.weight.name)} |")
    L += ["", "## Key mapping: checkpoint -> vLLM", ""] + mapping_rows(res) + [""]
    return "\n".join(L)
