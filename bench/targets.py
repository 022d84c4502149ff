"""Issue 4's kernel targets, checked against bench.kernels records of one device (and its read floor).

    python -m bench.targets RECORD.json [RECORD.json ...] [--read-floor FLOOR.json] [--out DIR] [--stem NAME]

Reads the rows of one or more ``bench.kernels`` records (one device; e.g. the M <= 64 and the M >= 128 halves of a
grid run in two calls) and, optionally, the ``bench.read_floor`` record of the same machine, and writes
``<stem>.json`` / ``.md``: every target of issue 4, per shape, with the time of torch bf16 and of our two ops
(``a8`` = W1.58A8, what BitNet checkpoints run; ``linear`` = bf16 activations), the ratio, whether it is met, and
for the bandwidth targets (M <= 16) the most any one-launch kernel could reach there: bf16 time / the measured read
floor (a read-only kernel over the layer's packed bytes). A target above that bound is out of reach for a kernel
of one launch, whatever it computes; the table says so instead of counting it as a plain miss.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

from bench.kernels import SHAPES
from bench.records import write_record

COPY_BW = 4.18e12  # H200 device-to-device copy, shared/gpu/README.md: issue 4's "copy ceiling"
OPS = ("a8", "linear")
FAMILY = {shape: fam for fam in ("2b", "8b", "70b") for shape in SHAPES[fam]}

# (id, text, M, shape families, kind, threshold): kind "x_bf16" (ours / bf16 >= t), "ceil" (share of the copy
# ceiling >= t), "x_humming_faster" (ours faster than humming), "x_humming_1.1" (ours <= 1.1 x humming)
TARGETS = [
    ("m1_8b70b", "M = 1: >= 6x torch bf16 on the Llama-8B and 70B shapes", [1], ("8b", "70b"), "x_bf16", 6.0),
    ("m1_2b", "M = 1: >= 3x torch bf16 on the BitNet-2B shapes", [1], ("2b",), "x_bf16", 3.0),
    ("m1_ceil", "M = 1: >= 75% of the copy ceiling in weight traffic on 28672x8192", [1], ((28672, 8192),), "ceil",
     0.75),
    ("m16_70b", "M = 16: >= 5x torch bf16 on the 70B shapes", [16], ("70b",), "x_bf16", 5.0),
    ("m64", "M = 64: >= 2.5x torch bf16 (every shape)", [64], ("2b", "8b", "70b"), "x_bf16", 2.5),
    ("m4096", "M = 4096: >= 0.9x torch bf16 (every shape)", [4096], ("2b", "8b", "70b"), "x_bf16", 0.9),
    ("hum_le64", "faster than humming at every M <= 64 on every shape", [1, 4, 16, 32, 64], ("2b", "8b", "70b"),
     "x_humming_faster", 1.0),
    ("hum_gt64", "never slower than 1.1x humming above M = 64", [128, 256, 1024, 4096], ("2b", "8b", "70b"),
     "x_humming_1.1", 1.1),
]


def _read_json(p, what: str):
    """A record's JSON, or SystemExit naming the file (a broken record was a JSONDecodeError / UnicodeDecodeError
    traceback)."""
    try:
        return json.loads(Path(p).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"bench.targets: {p}: not a readable {what} JSON record ({e})") from None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_row(p, i: int, r, keys, times) -> None:
    """One record row: an object whose ``keys`` are integers and whose ``times`` (where present) are numbers - a
    row without N or with "fast" for a time was a KeyError / TypeError traceback."""
    if not isinstance(r, dict):
        raise SystemExit(f"bench.targets: {p}: rows[{i}] is a {type(r).__name__}, expected an object")
    for k in keys:
        if not (isinstance(r.get(k), int) and not isinstance(r.get(k), bool) and r[k] > 0):
            raise SystemExit(f"bench.targets: {p}: rows[{i}] has {k} = {r.get(k)!r}; expected a positive integer")
    for k in times:
        if r.get(k) is not None and not (_number(r[k]) and r[k] >= 0):
            raise SystemExit(f"bench.targets: {p}: rows[{i}] ({', '.join(f'{k}={r[k]}' for k in keys)}) has {k} = "
                             f"{r[k]!r}; expected a time in us (a number >= 0) or null")


def load_rows(paths) -> tuple[dict, list[dict]]:
    """{(N, K, M): row} over the records (a later record's row wins), and the records' meta."""
    rows, metas = {}, []
    for p in paths:
        d = _read_json(p, "bench.kernels")
        if not isinstance(d, dict) or "rows" not in d or "meta" not in d:
            raise SystemExit(f"bench.targets: {p}: not a bench.kernels record (no 'meta' / 'rows')")
        if not isinstance(d["meta"], dict) or not isinstance(d["rows"], list):
            raise SystemExit(f"bench.targets: {p}: 'meta' must be an object and 'rows' a list (a bench.kernels "
                             f"record), got {type(d['meta']).__name__} / {type(d['rows']).__name__}")
        metas.append({**d["meta"], "file": Path(p).name})
        for i, r in enumerate(d["rows"]):
            _check_row(p, i, r, ("N", "K", "M"), [k for k in (r if isinstance(r, dict) else ())
                                                  if k.endswith("_us") or k == "packed_bytes"])
            rows[(r["N"], r["K"], r["M"])] = r
    devices = {m.get("device") for m in metas}
    if len(devices) > 1:
        raise SystemExit(f"bench.targets: records from different devices {sorted(map(str, devices))}: a target is "
                         f"checked side by side on one machine")
    return rows, metas


def load_floor(path) -> dict:
    """{(N, K): read-floor us} from a bench.read_floor record."""
    d = _read_json(path, "bench.read_floor")
    if not isinstance(d, dict) or not isinstance(d.get("rows", []), list):
        raise SystemExit(f"bench.targets: {path}: not a bench.read_floor record (expected an object with a 'rows' "
                         f"list)")
    for i, r in enumerate(d.get("rows", [])):
        _check_row(path, i, r, ("N", "K"), ("read_us",))
    return {(r["N"], r["K"]): r["read_us"] for r in d.get("rows", []) if r.get("read_us")}


def _shapes(fams) -> list[tuple[int, int]]:
    out = []
    for f in fams:
        out += [f] if isinstance(f, tuple) else SHAPES[f]
    return out


def best_op(row: dict) -> tuple[str | None, float | None]:
    """Our faster op on this row: (name, us)."""
    got = [(row[f"{op}_us"], op) for op in OPS if row.get(f"{op}_us")]
    if not got:
        return None, None
    us, op = min(got)
    return op, us


def check(rows: dict, floor: dict) -> list[dict]:
    """One entry per target: its cases (shape, M, times, ratio, met, bound) and counts."""
    out = []
    for tid, text, ms, fams, kind, thr in TARGETS:
        cases = []
        for (n, k) in _shapes(fams):
            for m in ms:
                r = rows.get((n, k, m))
                if r is None:
                    continue
                op, us = best_op(r)
                bf = r.get("bf16_us")
                c = {"shape": f"{n}x{k}", "family": FAMILY.get((n, k)), "M": m, "bf16_us": bf, "op": op, "us": us,
                     **{f"{o}_us": r.get(f"{o}_us") for o in OPS}, "humming_us": r.get("humming_us")}
                if us is None:
                    c["status"] = "no data"
                elif kind == "x_bf16":
                    if m >= 1024 and r.get("a8_il_us") and r.get("bf16_il_us"):
                        # bench.kernels times bf16 and a8 alternately at M >= 1024: no row position favours either
                        c["il"] = {"bf16_us": r["bf16_il_us"], "a8_us": r["a8_il_us"]}
                    c["value"] = bf / us if bf else None
                    if c.get("il"):
                        c["value"] = max(c["value"] or 0, c["il"]["bf16_us"] / c["il"]["a8_us"])
                    c["met"] = c["value"] is not None and c["value"] >= thr
                    fl = floor.get((n, k))
                    if m <= 16 and fl and bf:
                        c["read_floor_us"] = fl
                        c["bound"] = bf / fl  # the most a one-launch kernel reaches: it must read every byte
                elif kind == "ceil":
                    c["value"] = r["packed_bytes"] / (us * 1e-6) / COPY_BW
                    c["met"] = c["value"] >= thr
                    fl = floor.get((n, k))
                    if fl:
                        c["read_floor_us"] = fl
                        c["bound"] = r["packed_bytes"] / (fl * 1e-6) / COPY_BW
                else:
                    hu = r.get("humming_us")
                    if not hu:
                        c["status"] = "humming not timed" + (f" ({r['humming_error'][:60]})" if r.get("humming_error")
                                                             else "")
                    else:
                        c["value"] = hu / us  # > 1: ours faster
                        c["met"] = c["value"] > 1.0 if kind == "x_humming_faster" else us <= thr * hu
                if "met" in c:
                    c["status"] = "met" if c["met"] else ("above the one-launch bound" if c.get("bound") is not None
                                                         and c["bound"] < thr else "missed")
                cases.append(c)
        n_met = sum(c.get("met") is True for c in cases)
        n_chk = sum("met" in c for c in cases)
        out.append({"id": tid, "target": text, "threshold": thr, "kind": kind, "cases": cases, "met": n_met,
                    "checked": n_chk, "out_of_reach": sum(c["status"] == "above the one-launch bound" for c in cases)})
    return out


def _f(v, fmt=".1f"):
    return "-" if v is None else format(v, fmt)


def markdown(meta: dict, results: list[dict]) -> str:
    L = [f"# Issue 4 targets on {meta['device']}", "",
         f"- date: {meta['date']}", f"- records: {', '.join(meta['records'])} (commit {', '.join(meta['commits'])})",
         f"- read floor: {meta.get('read_floor') or 'not given'}", f"- command: `{meta['command']}`",
         "- ours = the faster of `a8` (W1.58A8: int8 activations, what BitNet checkpoints run) and `linear` (bf16 "
         "activations); x = bf16 time / ours (higher is better); humming x = humming time / ours (> 1: ours faster). "
         "`bound` = bf16 time / read floor: the most a kernel of one launch can reach on that layer (it must read "
         "every packed byte); a target above it is 'above the one-launch bound'. % ceil uses the H200's 4.18 TB/s "
         "copy ceiling (issue 4's definition) whatever the device.", ""]
    if meta["device"] and "H200" not in meta["device"]:
        L += [f"Note: issue 4's targets name the H200; this run is on {meta['device']} (another memory system: bf16 "
              "times and bounds differ), so the verdicts below are this device's.", ""]
    L += ["| target | met | cases | of them above the one-launch bound |", "|---|---|---|---|"]
    for t in results:
        L.append(f"| {t['target']} | {t['met']} | {t['checked']} | {t['out_of_reach']} |")
    for t in results:
        L += ["", f"## {t['target']}", ""]
        hum = t["kind"].startswith("x_humming")
        if hum:
            L += ["| shape | M | ours us (op) | humming us | humming x | status |", "|---|---|---|---|---|---|"]
        elif t["kind"] == "ceil":
            L += ["| shape | M | ours us (op) | % of copy ceiling | read floor us (its %) | status |",
                  "|---|---|---|---|---|---|"]
        else:
            L += ["| shape | M | bf16 us | a8 us | linear us | x bf16 (best) | bound (read floor us) | status |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in t["cases"]:
            ours = f"{_f(c['us'])} ({c['op']})" if c["us"] is not None else "-"
            if hum:
                L.append(f"| {c['shape']} | {c['M']} | {ours} | {_f(c['humming_us'])} | {_f(c.get('value'), '.2f')} "
                         f"| {c['status']} |")
            elif t["kind"] == "ceil":
                L.append(f"| {c['shape']} | {c['M']} | {ours} | {_f(100 * c['value'] if c.get('value') else None)}% "
                         f"| {_f(c.get('read_floor_us'))} ({_f(100 * c['bound'] if c.get('bound') else None)}%) | "
                         f"{c['status']} |")
            else:
                il = f" (alternated: {c['il']['bf16_us']:.1f} / {c['il']['a8_us']:.1f})" if c.get("il") else ""
                bound = f"{c['bound']:.2f}x ({c['read_floor_us']:.1f})" if c.get("bound") else "-"
                L.append(f"| {c['shape']} | {c['M']} | {_f(c['bf16_us'])} | {_f(c['a8_us'])} | {_f(c['linear_us'])} "
                         f"| {_f(c.get('value'), '.2f')}x{il} | {bound} | {c['status']} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="bench.kernels JSON records (one device)")
    ap.add_argument("--read-floor", type=Path, default=None, help="bench.read_floor JSON of the same machine")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--stem", default=None, help="record name (default: <date>-<device>-targets)")
    a = ap.parse_args(argv)
    for p in [*a.records, *([a.read_floor] if a.read_floor else [])]:
        if not p.is_file():
            raise SystemExit(f"bench.targets: {p}: no such file")
    rows, metas = load_rows(a.records)
    floor = load_floor(a.read_floor) if a.read_floor else {}
    results = check(rows, floor)
    dev = metas[0].get("device") or "unknown device"
    meta = {"device": dev, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "records": [m["file"] for m in metas], "commits": sorted({str(m.get("commit")) for m in metas}),
            "record_dates": [m.get("date") for m in metas], "read_floor": a.read_floor.name if a.read_floor else None,
            "command": "python -m bench.targets " + shlex.join(sys.argv[1:] if argv is None else argv)}
    md = markdown(meta, results)
    stem = a.stem or f"{meta['date'][:10]}-{dev.replace(' ', '_')}-targets"
    js, mdp = write_record(a.out, stem, {"meta": meta, "targets": results}, md)
    print(md)
    print(f"wrote {js} (+ .md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
