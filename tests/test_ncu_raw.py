"""bench/ncu_raw.py: the per-kernel summary of an ncu `--page raw --csv` export (no GPU needed)."""
import csv
import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ncu_raw  # noqa: E402

NAMES = ["ID", "Process ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum",
         "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
         "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
         "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
         "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
         "smsp__average_warps_issue_stalled_long_scoreboard_not_issued_per_issue_active.ratio",
         "l1tex__t_sector_pipe_lsu_mem_global_op_ld_hit_rate.pct", "some__other.sum"]
UNITS = ["", "", "", "", "", "usecond", "", "", "", "", "", "%", ""]


def write(tmp_path, rows, prof=True):
    buf = io.StringIO()
    if prof:
        buf.write("==PROF== Connected to process 1\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(NAMES)
    w.writerow(UNITS)
    for r in rows:
        w.writerow(r)
    p = tmp_path / "raw.csv"
    p.write_text(buf.getvalue())
    return p


def row(i, name, dur, ls, mp, wait, ns, lsni, hit):
    return [str(i), "7", name, "(160, 1, 1)", "(256, 1, 1)", dur, ls, mp, wait, ns, lsni, hit, "1"]


def test_summary_orders_stalls_and_keeps_only_asked_metrics(tmp_path):
    k = "void <unnamed>::a8_small_kernel<__nv_bfloat16, 4, 1, 0, 0>(const signed char *, int)"
    p = write(tmp_path, [row(0, k, "15.5", "3.1", "0.4", "1.2", "0", "9.9", "88.5"),
                         row(1, "quant_rows_kernel", "2", "0.5", "2.5", "0", "0", "0", "10")])
    s = ncu_raw.summarize(p, [r"gpu__time_duration\.sum", r"l1tex__.*hit_rate\.pct"])
    lines = s.splitlines()
    assert lines[0] == "== 0: a8_small_kernel<__nv_bfloat16, 4, 1, 0, 0>  (Grid Size (160, 1, 1), Block Size (256, 1, 1))"
    # largest first, zero and *_not_issued reasons dropped, their sum shown
    assert lines[1] == ("  stalls (cycles per issued instruction): long_scoreboard 3.10, wait 1.20, "
                        "math_pipe_throttle 0.40  [sum 4.70]")
    assert "  gpu__time_duration.sum = 15.5 usecond" in lines
    assert "  l1tex__t_sector_pipe_lsu_mem_global_op_ld_hit_rate.pct = 88.5 %" in lines
    assert not any("some__other" in ln for ln in lines)
    second = s[s.index("== 1: quant_rows_kernel"):]
    assert "math_pipe_throttle 2.50, long_scoreboard 0.50  [sum 3.00]" in second


def test_top_limits_the_stall_list(tmp_path):
    p = write(tmp_path, [row(0, "k", "1", "3", "2", "1", "0.5", "0", "0")], prof=False)
    s = ncu_raw.summarize(p, [], top=2)
    assert "long_scoreboard 3.00, math_pipe_throttle 2.00  [sum 6.50]" in s


def test_not_a_raw_export_names_the_file(tmp_path, capsys):
    p = tmp_path / "details.txt"
    p.write_text("==PROF== Profiling \"k\"\n  Section: GPU Speed Of Light\n")
    with pytest.raises(ValueError, match=r"details\.txt: no ncu raw table.*--page raw --csv"):
        ncu_raw.load(p)
    assert ncu_raw.main([str(p)]) == 2
    assert "details.txt" in capsys.readouterr().err


def test_header_without_kernels_is_an_error(tmp_path):
    p = write(tmp_path, [])
    with pytest.raises(ValueError, match="header but no kernel rows"):
        ncu_raw.load(p)


def test_main_prints_the_default_metrics(tmp_path, capsys):
    p = write(tmp_path, [row(3, "k", "7.5", "1", "0", "0", "0", "0", "50")])
    assert ncu_raw.main([str(p)]) == 0
    out = capsys.readouterr().out
    assert "gpu__time_duration.sum = 7.5 usecond" in out and "hit_rate.pct = 50 %" in out
