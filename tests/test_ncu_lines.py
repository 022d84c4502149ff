"""bench/ncu_lines.py: per-source-line executed instructions of one kernel in two builds (ncu's source-page CSV)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import ncu_lines

ROOT = Path(__file__).resolve().parent.parent
HEAD = ('"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)",'
        '"Warp Stall Sampling (Not-issued Samples)","# Samples","Instructions Executed","Thread Instructions Executed"')


def export(path: Path, lines: list[tuple[int, str, int, int]], kernel: str = "void k<float, (int)4>(A)") -> Path:
    """An ncu `--page source --csv --print-source cuda,sass` export: per file a header, per CUDA line its metrics,
    then its SASS rows (empty line number)."""
    rows = ['"File Path","/src/kernel.cu"', f'"Function Name","{kernel}"', HEAD]
    for no, text, stall, instr in lines:
        t = text.replace('"', '""')
        rows.append(f'"{no}","{t}","-","-","{stall}","0","{stall}","{instr}","{instr * 32}"')
        rows.append(f'"","","0x7f00","      IADD3 R1, R2, R3","0","0","0","{instr}","0"')
    path.write_text("\n".join(rows) + "\n")
    return path


def test_lines_matched_by_text_and_ranked_by_difference(tmp_path):
    old = export(tmp_path / "old.csv", [(10, "w = ld(base + u * 32);", 5, 800), (20, "acc += x;", 9, 1000),
                                        (30, 'printf("a, b");', 0, 7)])
    new = export(tmp_path / "new.csv", [(12, "w = ld(base + u * 32);", 6, 900), (22, "acc += x;", 9, 1000),
                                        (25, "auto waddr = [&](int u) { return u >= split ? dup : 0; };", 4, 1100),
                                        (31, 'printf("a, b");', 0, 7)])
    builds = [(n, *ncu_lines.load(p)[:2]) for n, p in (("old", old), ("new", new))]
    assert builds[0][1]["w = ld(base + u * 32);"] == 800  # SASS rows are not counted again
    assert builds[1][1]['printf("a, b");'] == 7  # quotes and commas inside the source survive
    out = ncu_lines.table(builds, top=3).splitlines()
    assert out[0] == "| source line | old instr | new instr | new - old | old stall samples | new stall samples |"
    assert out[2].startswith("| `auto waddr = [&](int u) { return u >= split ? dup : 0; };` | 0 | 1,100 | +1,100 |")
    assert out[3] == "| `w = ld(base + u * 32);` | 800 | 900 | +100 | 5 | 6 |"
    assert out[4] == "| `acc += x;` | 1,000 | 1,000 | +0 | 9 | 9 |"
    assert out[-1] == "| per-line sums (inlined lines counted at each line) | 1,807 | 3,007 | +1,200 | 14 | 19 |"


def test_wrong_inputs_are_refused_with_the_file_named(tmp_path):
    bad = tmp_path / "details.csv"
    bad.write_text('"ID","Kernel Name","Metric Name"\n"0","k","dram__bytes"\n')
    with pytest.raises(ValueError, match=f"{bad}: not an ncu source-page CSV"):
        ncu_lines.load(bad)
    nosc = tmp_path / "nosc.csv"
    nosc.write_text('"Line No","Source","Address","Source","# Samples"\n"1","x","-","-","3"\n')
    with pytest.raises(ValueError, match="no 'Instructions Executed'"):
        ncu_lines.load(nosc)
    good = export(tmp_path / "a.csv", [(1, "x;", 1, 2)])
    r = subprocess.run([sys.executable, "-I", str(ROOT / "bench" / "ncu_lines.py"), str(good), str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not an ncu source-page CSV" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "ncu_lines.py"), str(good), "--names", "a,b"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "1 files but 2 names" in r.stderr
    r = subprocess.run([sys.executable, "-I", str(ROOT / "bench" / "ncu_lines.py"), str(good), str(good),
                        "--names", "a,b"], capture_output=True, text=True)
    assert r.returncode == 0 and "void k<float, (int)4>(A)" in r.stdout and "| `x;` | 2 | 2 | +0 | 1 | 1 |" in r.stdout
