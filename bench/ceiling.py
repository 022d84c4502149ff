"""The engine's ceiling under an end-to-end record: the tok/s vLLM itself allows on that machine.

    python -m bench.ceiling --e2e E2E.json --floor TINY.json [--floor TINY2.json] [--baseline CONFIG]
                            [--targets 1=2.5,32=1.8] [--out DIR]

A floor record is ``bench.e2e --shape tiny`` (``ci/gpu_e2e.sh floor``) run on the same machine: the bundled
tiny model, whose forward takes ~0.15 ms, so its tok/s at batch B is about the most the engine itself
(scheduler, input preparation, sampler, output processing: the host work of one decode step) delivers at B on
that host - an upper bound on any model's tok/s at B there. Per batch size present in both records: the
floor's tok/s (the best over the floor records given), the engine's step floor (B / tok/s), the baseline's
tok/s, the ceiling ratio (floor tok/s / baseline tok/s: the largest "x faster than the baseline" any model can
show there), and per config its tok/s, its ratio to the baseline and the share of the ceiling ratio it reaches.
A target ratio above the ceiling cannot be met under that engine on that host, whatever the kernels do.

tok/s are the records' ``tok_s`` (best of the runs at every B since 2026-12-04; one run above B = 8 before; as the e2e tables print them).
The records must come from the same device (by name); their dates (from the file names) are printed, as two
sessions on "the same" device may be different hosts.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from pathlib import Path

from bench.records import write_record


class RecordError(ValueError):
    """A record that cannot serve: names the file and what is wrong."""


def load_record(path: Path, want_tiny: bool | None = None) -> dict:
    """An e2e record (``rows`` with label / throughput, ``device``, ``settings.shape``); want_tiny: True for a
    floor record (shape tiny), False for the record it bounds (any other shape)."""
    path = Path(path)
    if path.suffix != ".json":
        raise RecordError(f"{path}: expected a bench.e2e JSON record (.json), got {path.suffix or 'no suffix'}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not a readable JSON record ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "device" not in data:
        raise RecordError(f"{path}: not a bench.e2e record (expected an object with 'device' and a 'rows' list)")
    for i, r in enumerate(data["rows"]):
        if not isinstance(r, dict) or "label" not in r or not isinstance(r.get("throughput"), dict):
            raise RecordError(f"{path}: rows[{i}] has no 'label' / 'throughput' object")
        for b, t in r["throughput"].items():
            v = t.get("tok_s") if isinstance(t, dict) else None
            if not isinstance(v, (int, float)) or not v > 0:
                raise RecordError(f"{path}: rows[{i}] ({r['label']}) throughput at B = {b}: tok_s must be a "
                                  f"positive number, got {v!r}")
    shape = (data.get("settings") or {}).get("shape")
    if want_tiny is True and shape != "tiny":
        raise RecordError(f"{path}: a floor record must be bench.e2e --shape tiny, this one is shape {shape!r}")
    if want_tiny is False and shape == "tiny":
        raise RecordError(f"{path}: this is a floor record (shape tiny); --e2e takes the record it bounds")
    return data


def record_date(path: Path) -> str:
    """The record's date from its file name (bench.e2e names them DATE-device-e2e-SHAPE; a run cut short
    leaves partial-DATE-...)."""
    m = re.match(r"(?:partial-)?(\d{4}-\d{2}-\d{2})", Path(path).name)
    return m.group(1) if m else "?"


def default_baseline(e2e: dict) -> str:
    """The record's bf16 baseline: bf16-llama (2B records: the twin the Llama-shaped configs compare with) where it
    is a config, else bf16 (8B records), else the error that names the configs."""
    labels = [r.get("label") for r in e2e.get("rows", [])]
    for want in ("bf16-llama", "bf16"):
        if want in labels:
            return want
    raise RecordError(f"no bf16 config in the e2e record (it has {labels}): pass --baseline")


def ceiling(e2e: dict, floors: list[dict], baseline: str, targets: dict[int, float] | None = None) -> dict:
    """The table as data: per batch size the floor, the baseline and each config's share of the ceiling."""
    devices = {e2e["device"], *(f["device"] for f in floors)}
    if len(devices) != 1:
        raise RecordError(f"records from different devices: {sorted(devices)}")
    labels = [r["label"] for r in e2e["rows"]]
    if baseline not in labels:
        raise RecordError(f"baseline {baseline!r} is not a config of the e2e record (it has {labels})")
    base = next(r for r in e2e["rows"] if r["label"] == baseline)
    rounds = {r.get("round", 1) for r in e2e["rows"]}  # bench.e2e --rounds: more than one
    floor_tok: dict[int, float] = {}
    for f in floors:
        for r in f["rows"]:
            for b, t in r["throughput"].items():
                floor_tok[int(b)] = max(floor_tok.get(int(b), 0.0), float(t["tok_s"]))
    out = []
    for b in sorted(int(x) for x in base["throughput"]):
        if b not in floor_tok:
            continue
        ft, bt = floor_tok[b], float(base["throughput"][str(b)]["tok_s"])
        cap = ft / bt
        row = {"batch": b, "floor_tok_s": round(ft, 1), "engine_step_ms": round(b / ft * 1000, 3),
               "baseline_tok_s": round(bt, 1), "ceiling_ratio": round(cap, 6), "configs": []}
        if targets and b in targets:
            row["target_ratio"] = targets[b]
            row["target_reachable"] = targets[b] <= cap
        for r in e2e["rows"]:
            t = r["throughput"].get(str(b))
            if r["label"] == baseline or t is None:
                continue
            # bench.e2e --rounds: each row against the baseline of its own round where that round has one
            rb = next((q for q in e2e["rows"] if q["label"] == baseline and q.get("round", 1) == r.get("round", 1)
                       and str(b) in q["throughput"]), base)
            rbt = float(rb["throughput"][str(b)]["tok_s"])
            ratio = float(t["tok_s"]) / rbt
            label = r["label"] + (f" (round {r.get('round', 1)})" if len(rounds) > 1 else "")
            row["configs"].append({"label": label, "tok_s": round(float(t["tok_s"]), 1),
                                   # 6 digits: the table's 2-digit ratio is not rounded twice (1.69457 -> 1.695 -> "1.70")
                                   "ratio": round(ratio, 6), "share_of_ceiling": round(ratio / (ft / rbt), 6)})
        out.append(row)
    if not out:
        raise RecordError(f"no batch size in both the e2e record ({sorted(base['throughput'])}) and the floor "
                          f"record(s) ({sorted(floor_tok)})")
    return {"device": e2e["device"], "baseline": baseline, "rows": out}


def markdown(res: dict, e2e_path: Path, floor_paths: list[Path], command: str) -> str:
    lines = [f"# Engine ceiling under an e2e record, {res['device']}", "",
             f"- e2e record: {Path(e2e_path).name} ({record_date(e2e_path)})",
             "- floor record(s) (bench.e2e --shape tiny, same device): "
             + ", ".join(f"{Path(p).name} ({record_date(p)})" for p in floor_paths),
             f"- command: {command}",
             f"- baseline: {res['baseline']}; ceiling ratio = floor tok/s / baseline tok/s: the most any model can "
             "show against the baseline under this engine on this host", "",
             "| B | floor tok/s | engine step floor ms | baseline tok/s | ceiling ratio | target | config: tok/s, "
             "ratio, share of ceiling |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        tgt = "-"
        if "target_ratio" in r:
            tgt = f"{r['target_ratio']}x ({'within' if r['target_reachable'] else 'ABOVE'} the ceiling)"
        cfg = "; ".join(f"{c['label']} {c['tok_s']:g}, {c['ratio']:.2f}x, {100 * c['share_of_ceiling']:.0f}%"
                        for c in r["configs"]) or "-"
        lines.append(f"| {r['batch']} | {r['floor_tok_s']:g} | {r['engine_step_ms']} | {r['baseline_tok_s']:g} | "
                     f"{r['ceiling_ratio']:.2f}x | {tgt} | {cfg} |")
    return "\n".join(lines) + "\n"


def parse_targets(s: str | None) -> dict[int, float]:
    if not s:
        return {}
    out = {}
    for part in s.split(","):
        b, _, v = part.partition("=")
        try:
            batch, ratio = int(b), float(v)
        except ValueError:
            raise SystemExit(f"--targets: expected B=RATIO[,B=RATIO...], got {part!r}") from None
        if not (batch > 0 and math.isfinite(ratio) and ratio > 0):
            # (1=nan was taken: every check against it read 'not met' with no word about the argument)
            raise SystemExit(f"--targets: {part!r}: expected a batch size >= 1 and a finite ratio > 0")
        out[batch] = ratio
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--e2e", required=True, type=Path, help="a bench.e2e JSON record (2b, 8b...)")
    ap.add_argument("--floor", required=True, type=Path, action="append",
                    help="a bench.e2e --shape tiny JSON record of the same machine (repeatable: best tok/s per B)")
    ap.add_argument("--baseline", default=None,
                    help="the config the ratios are taken against (default: the record's bf16 config, bf16-llama in 2B "
                         "records, bf16 in 8B ones)")
    ap.add_argument("--targets", help="target ratios to check against the ceiling, e.g. 1=2.5,32=1.8")
    ap.add_argument("--out", type=Path, help="write <e2e stem>-ceiling.json / .md here")
    a = ap.parse_args(argv)
    try:
        e2e = load_record(a.e2e, want_tiny=False)
        floors = [load_record(p, want_tiny=True) for p in a.floor]
        res = ceiling(e2e, floors, a.baseline or default_baseline(e2e), parse_targets(a.targets))
    except RecordError as e:
        print(f"bench.ceiling: {e}", file=sys.stderr)
        return 2
    command = "python -m bench.ceiling " + shlex.join(argv if argv is not None else sys.argv[1:])
    md = markdown(res, a.e2e, a.floor, command)
    print(md)
    if a.out:
        data = {**res, "e2e": a.e2e.name, "floors": [p.name for p in a.floor], "command": command}
        js, mdp = write_record(a.out, a.e2e.stem + "-ceiling", data, md)
        print(f"wrote {js} (+ .md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
