"""bench/ab_summary.py: the same-run A/B table of bench.chain records (ci/gpu_kernels.sh's ab stage)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import ab_summary

ROOT = Path(__file__).resolve().parent.parent


def write(d: Path, tree: str, rnd: int, recs: list[tuple[str, str, float]], noise: str = "") -> None:
    lines = [noise] if noise else []
    lines += [json.dumps({"tail": t, "m": 1, "variant": v, "us_per_tail": us, "floor_us": 3.57}) for t, v, us in recs]
    lines.append("| 2b | 1 | 22.4 | - |")  # the bench's own table: not a record
    (d / f"ab-{tree}-{rnd}.txt").write_text("\n".join(lines) + "\n")


def test_table_means_and_differences(tmp_path):
    for rnd, (o, n) in enumerate(((21.5, 22.5), (21.3, 22.3)), 1):
        write(tmp_path, "07242cf", rnd, [("2b", "chain", o), ("8b", "chain", 34.0 + rnd)])
        write(tmp_path, "new", rnd, [("2b", "chain", n), ("8b", "chain", 38.0 + rnd)], noise="{not json")
    out = ab_summary.table(ab_summary.load(tmp_path), ["07242cf", "new"])
    lines = out.splitlines()
    assert lines[0] == ("| tail | M | variant | 07242cf 1 | new 1 | 07242cf 2 | new 2 | 07242cf mean | new mean "
                        "| new - 07242cf |")
    assert lines[2] == "| 2b | 1 | chain | 21.50 | 22.50 | 21.30 | 22.30 | 21.40 | 22.40 | +1.00 |"
    assert lines[3] == "| 8b | 1 | chain | 35.00 | 39.00 | 36.00 | 40.00 | 35.50 | 39.50 | +4.00 |"
    assert "missing" not in out


def test_a_run_without_records_shows_as_missing(tmp_path):
    write(tmp_path, "old", 1, [("2b", "chain", 21.0)])
    (tmp_path / "ab-new-1.txt").write_text("Traceback (most recent call last):\n  ...\n")  # the bench died
    out = ab_summary.table(ab_summary.load(tmp_path), ["old", "new"])
    assert "| 2b | 1 | chain | 21.00 | - | 21.00 | - | - |" in out
    assert "missing (no bench.chain record): new 1" in out
    out = ab_summary.table(ab_summary.load(tmp_path), ["old", "gone", "new"])
    assert "gone (no output at all)" in out


def test_cli_runs_without_the_repository_on_the_path(tmp_path):
    write(tmp_path, "a", 1, [("2b", "chain", 21.0)])
    write(tmp_path, "new", 1, [("2b", "chain", 20.0)])
    r = subprocess.run([sys.executable, "-I", str(ROOT / "bench" / "ab_summary.py"), str(tmp_path), "--trees", "a,new"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| 2b | 1 | chain | 21.00 | 20.00 | 21.00 | 20.00 | -1.00 |" in r.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "ab_summary.py"), str(empty), "--trees", "new"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and f"no ab-TREE-ROUND.txt in {empty}" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "ab_summary.py"), str(tmp_path / "nope"), "--trees", "new"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "is not a directory" in r.stderr
