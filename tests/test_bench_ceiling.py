"""bench.ceiling: the engine's ceiling (a tiny model's tok/s on the same machine) under an e2e record."""
from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import ceiling as C


def rec(shape, rows, device="NVIDIA H200"):
    return {"device": device, "commit": "abc", "settings": {"shape": shape},
            "rows": [{"label": lab, "throughput": {str(b): {"tok_s": v} for b, v in tp.items()}} for lab, tp in rows]}


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_ceiling_numbers():
    e2e = rec("2b", [("ours", {1: 550.0, 32: 10500.0}), ("bf16", {1: 400.0, 32: 10000.0})])
    floors = [rec("tiny", [("ours-bitnet", {1: 700.0, 8: 5000.0})]),
              rec("tiny", [("ours-bitnet", {1: 600.0, 32: 12000.0})])]
    res = C.ceiling(e2e, floors, "bf16", {1: 2.5, 32: 1.1})
    b1, b32 = res["rows"]
    assert b1["floor_tok_s"] == 700.0  # the best over the floor records
    assert b1["engine_step_ms"] == pytest.approx(1000 / 700, abs=1e-3)
    assert b1["ceiling_ratio"] == pytest.approx(1.75)
    assert b1["target_reachable"] is False
    assert b1["configs"] == [{"label": "ours", "tok_s": 550.0, "ratio": 1.375, "share_of_ceiling": pytest.approx(0.786, abs=1e-3)}]
    assert b32["engine_step_ms"] == pytest.approx(32 / 12000 * 1000, abs=1e-3)
    assert b32["ceiling_ratio"] == pytest.approx(1.2)
    assert b32["target_reachable"] is True
    # B = 8 is in a floor record but not in the e2e record: no row
    assert [r["batch"] for r in res["rows"]] == [1, 32]


def test_ceiling_rows_of_e2e_rounds_against_their_own_round():
    """bench.e2e --rounds: a config's row is rated against the baseline of its own round, labelled with it; its share
    of the ceiling stays tok/s over the floor."""
    e2e = rec("8b", [("ours", {32: 10000.0}), ("bf16", {32: 5000.0}), ("bf16", {32: 5500.0}), ("ours", {32: 9900.0})])
    for r, k in zip(e2e["rows"], (1, 1, 2, 2)):
        r["round"] = k
    res = C.ceiling(e2e, [rec("tiny", [("t", {32: 12500.0})])], "bf16")
    (row,) = res["rows"]
    assert row["baseline_tok_s"] == 5000.0 and row["ceiling_ratio"] == pytest.approx(2.5)
    assert [(c["label"], c["ratio"]) for c in row["configs"]] == [("ours (round 1)", 2.0), ("ours (round 2)", 1.8)]
    assert [c["share_of_ceiling"] for c in row["configs"]] == [pytest.approx(0.8), pytest.approx(0.792)]


@settings(max_examples=40, deadline=None)
@given(floor=st.floats(1.0, 1e5), base=st.floats(1.0, 1e5), ours=st.floats(1.0, 1e5))
def test_ceiling_share_is_ours_over_floor(floor, base, ours):
    # the share of the ceiling is ours / floor whatever the baseline: the baseline cancels
    e2e = rec("8b", [("ours", {1: ours}), ("bf16", {1: base})])
    res = C.ceiling(e2e, [rec("tiny", [("t", {1: floor})])], "bf16")
    c = res["rows"][0]["configs"][0]
    assert c["share_of_ceiling"] == pytest.approx(ours / floor, rel=2e-3, abs=1e-3)


def test_errors_name_the_problem(tmp_path):
    e2e = rec("2b", [("ours", {1: 5.0}), ("bf16", {1: 4.0})])
    with pytest.raises(C.RecordError, match="different devices"):
        C.ceiling(e2e, [rec("tiny", [("t", {1: 7.0})], device="NVIDIA H100")], "bf16")
    with pytest.raises(C.RecordError, match="baseline 'bf16-llama' is not a config"):
        C.ceiling(e2e, [rec("tiny", [("t", {1: 7.0})])], "bf16-llama")
    with pytest.raises(C.RecordError, match="no batch size in both"):
        C.ceiling(e2e, [rec("tiny", [("t", {8: 7.0})])], "bf16")
    # a floor that is not a tiny-model run, an e2e record that is one
    p = write(tmp_path, "f.json", rec("2b", [("t", {1: 7.0})]))
    with pytest.raises(C.RecordError, match=r"f\.json: a floor record must be bench.e2e --shape tiny"):
        C.load_record(p, want_tiny=True)
    p = write(tmp_path, "e.json", rec("tiny", [("t", {1: 7.0})]))
    with pytest.raises(C.RecordError, match=r"e\.json: this is a floor record"):
        C.load_record(p, want_tiny=False)
    # NaN / zero tok/s, named with the row and batch
    bad = rec("tiny", [("t", {1: 7.0, 8: 0.0})])
    with pytest.raises(C.RecordError, match=r"rows\[0\] \(t\) throughput at B = 8: tok_s must be a positive number"):
        C.load_record(write(tmp_path, "z.json", bad), want_tiny=True)
    p = tmp_path / "n.json"
    p.write_text('{"device": "x", "settings": {"shape": "tiny"}, "rows": [{"label": "t", "throughput": {"1": {"tok_s": NaN}}}]}')
    with pytest.raises(C.RecordError, match="tok_s must be a positive number, got nan"):
        C.load_record(p, want_tiny=True)
    # not JSON: a pickle, a truncated file, an object without rows
    p = tmp_path / "p.pkl"
    p.write_bytes(pickle.dumps({"rows": []}))
    with pytest.raises(C.RecordError, match=r"p\.pkl: expected a bench.e2e JSON record"):
        C.load_record(p)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(e2e)[:-20])
    with pytest.raises(C.RecordError, match=r"t\.json: not a readable JSON record"):
        C.load_record(p)
    p = write(tmp_path, "o.json", {"device": "x"})
    with pytest.raises(C.RecordError, match=r"o\.json: not a bench.e2e record"):
        C.load_record(p)


def test_main_writes_a_record_and_never_overwrites(tmp_path, capsys):
    e = write(tmp_path, "2026-12-02-x-e2e-2b.json", rec("2b", [("ours", {1: 550.0}), ("bf16-llama", {1: 400.0})]))
    f = write(tmp_path, "2026-12-02-x-e2e-tiny.json", rec("tiny", [("t", {1: 700.0})]))
    out = tmp_path / "out"
    for _ in range(2):
        assert C.main(["--e2e", str(e), "--floor", str(f), "--targets", "1=2.5", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["2026-12-02-x-e2e-2b-ceiling-2.json", "2026-12-02-x-e2e-2b-ceiling-2.md",
                                                      "2026-12-02-x-e2e-2b-ceiling.json", "2026-12-02-x-e2e-2b-ceiling.md"]
    md = (out / "2026-12-02-x-e2e-2b-ceiling.md").read_text()
    assert "| 1 | 700 | 1.429 | 400 | 1.75x | 2.5x (ABOVE the ceiling) | ours 550, 1.38x, 79% |" in md
    data = json.loads((out / "2026-12-02-x-e2e-2b-ceiling.json").read_text())
    assert data["floors"] == ["2026-12-02-x-e2e-tiny.json"] and data["rows"][0]["target_reachable"] is False
    # bad input: exit status 2 and the file named on stderr, nothing written
    assert C.main(["--e2e", str(f), "--floor", str(f), "--out", str(tmp_path / "none")]) == 2
    assert "this is a floor record" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_gpu_e2e_ceiling_helper(tmp_path):
    """ci/gpu_e2e.sh's ceiling step: this call's e2e record under the floor rows the floor stage left on the
    machine (FLOOR_STATE), a copy of them and the ceiling record into $OUT; nothing but a note without them."""
    import os
    import re
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (root / "ci" / "gpu_e2e.sh").read_text()
    helper = re.search(r"^ceiling\(\) \{.*?^\}", script, re.S | re.M).group(0)
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    state.mkdir()
    res = root / "bench" / "results"
    shutil.copy(res / "2026-12-02-nvidia-h200-e2e-2b-run14-b32.json", out / "2026-12-02-nvidia-h200-e2e-2b.json")
    env = {**os.environ, "OUT": str(out), "FLOOR_STATE": str(state), "PYTHONPATH": str(root)}

    def run():
        return subprocess.run(["bash", "-c", helper + "\nceiling 2b bf16-llama 1=2.5,32=1.8"], env=env, cwd=root,
                              capture_output=True, text=True, timeout=120)

    r = run()
    assert r.returncode == 0 and r.stdout.strip() == "ceiling: no floor rows on this machine (run the floor stage first)", r.stdout + r.stderr
    shutil.copy(res / "2026-12-02-nvidia-h200-e2e-tiny-floor-a.json", state / "partial-2026-12-02-nvidia-h200-e2e-tiny.json")
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| 32 | 12985.7 | 2.464 | 10066.3 | 1.29x | 1.8x (ABOVE the ceiling) |" in r.stdout
    assert (out / "2026-12-02-nvidia-h200-e2e-2b-ceiling.md").exists()
    assert (out / "floor-rows-2026-12-02-nvidia-h200-e2e-tiny.json").exists()


def test_record_date_from_file_name():
    assert C.record_date("/x/2026-12-03-nvidia-h200-e2e-8b.json") == "2026-12-03"
    assert C.record_date("/tmp/e2e-state-tiny/partial-2026-12-03-nvidia-h200-e2e-tiny.json") == "2026-12-03"
    assert C.record_date("floor.json") == "?"


def test_table_ratio_rounded_once(tmp_path):
    """Run 43's numbers: 9825.6 / 5798.3 = 1.6946 reads 1.69x, not 1.70x (rounded to 1.695 first, the table
    showed 1.70x)."""
    e2e = rec("8b", [("ours", {32: 9825.6}), ("bf16", {32: 5798.3})])
    res = C.ceiling(e2e, [rec("tiny", [("t", {32: 10688.1})])], "bf16", {32: 1.8})
    md = C.markdown(res, tmp_path / "2026-12-03-x.json", [tmp_path / "2026-12-03-t.json"], "cmd")
    assert "ours 9825.6, 1.69x, 92%" in md and "| 1.84x |" in md, md


def test_default_baseline_is_the_records_bf16_config(tmp_path, capsys):
    """Without --baseline: bf16-llama in a 2B record (the twin), bf16 in an 8B one (which has no bf16-llama), and a
    record with neither is refused naming its configs."""
    f = write(tmp_path, "2026-12-06-x-e2e-tiny.json", rec("tiny", [("t", {1: 770.0})]))
    e8 = write(tmp_path, "2026-12-06-x-e2e-8b.json", rec("8b", [("ours", {1: 400.0}), ("bf16", {1: 154.0}),
                                                                  ("humming", {1: 328.0})]))
    assert C.main(["--e2e", str(e8), "--floor", str(f)]) == 0
    assert "| 1 | 770 | 1.299 | 154 | 5.00x | - | ours 400, 2.60x, 52%; humming 328, 2.13x, 43% |" in capsys.readouterr().out
    e2 = write(tmp_path, "2026-12-06-x-e2e-2b.json", rec("2b", [("ours", {1: 500.0}), ("bf16", {1: 300.0}),
                                                                  ("bf16-llama", {1: 400.0})]))
    assert C.main(["--e2e", str(e2), "--floor", str(f)]) == 0
    assert "| 400 |" in capsys.readouterr().out
    none = write(tmp_path, "2026-12-06-y-e2e-8b.json", rec("8b", [("ours", {1: 400.0})]))
    assert C.main(["--e2e", str(none), "--floor", str(f)]) == 2
    assert "no bf16 config in the e2e record (it has ['ours'])" in capsys.readouterr().err
