"""bench.targets: issue 4's verdicts from bench.kernels / bench.read_floor records (synthetic rows)."""
import json

import pytest

from bench import targets as T


def _rec(path, device, rows, commit="abc"):
    path.write_text(json.dumps({"meta": {"device": device, "date": "2026-12-05", "commit": commit}, "rows": rows}))
    return path


def _row(n, k, m, bf16, a8=None, lin=None, hum=None, **kw):
    r = {"N": n, "K": k, "M": m, "bf16_us": bf16, "packed_bytes": n * k // 4 + 4 * n}
    if a8:
        r["a8_us"] = a8
    if lin:
        r["linear_us"] = lin
    if hum:
        r["humming_us"] = hum
    return {**r, **kw}


def test_verdicts_bounds_and_humming(tmp_path):
    a = _rec(tmp_path / "a.json", "GPU X", [
        _row(4096, 4096, 1, 20.0, a8=4.0, lin=3.0, hum=6.0),       # 6.67x: met
        _row(14336, 4096, 1, 40.0, a8=10.0, lin=9.0, hum=8.0),     # 4.4x, bound 40/8 = 5 < 6: out of reach; hum 0.89
        _row(8192, 8192, 16, 50.0, a8=12.0, lin=20.0),             # 4.17x, bound 50/5 = 10: missed
        _row(28672, 8192, 1, 120.0, a8=20.0)])
    b = _rec(tmp_path / "b.json", "GPU X", [
        _row(4096, 4096, 4096, 100.0, a8=120.0, lin=130.0, hum=115.0, bf16_il_us=100.0, a8_il_us=105.0),
        _row(4096, 4096, 128, 10.0, a8=12.0, hum=10.0)])
    fl = tmp_path / "f.json"
    fl.write_text(json.dumps({"rows": [{"N": 14336, "K": 4096, "read_us": 8.0}, {"N": 8192, "K": 8192, "read_us": 5.0},
                                       {"N": 28672, "K": 8192, "read_us": 15.0}]}))
    rows, metas = T.load_rows([a, b])
    res = {t["id"]: t for t in T.check(rows, T.load_floor(fl))}
    c = {x["shape"]: x for x in res["m1_8b70b"]["cases"]}
    assert c["4096x4096"]["status"] == "met" and c["4096x4096"]["op"] == "linear"
    assert c["14336x4096"]["status"] == "above the one-launch bound" and c["14336x4096"]["bound"] == pytest.approx(5.0)
    assert res["m1_8b70b"]["out_of_reach"] == 1
    m16 = res["m16_70b"]["cases"][0]
    assert m16["status"] == "missed" and m16["value"] == pytest.approx(50 / 12)
    ceil = res["m1_ceil"]["cases"][0]
    assert ceil["value"] == pytest.approx((28672 * 8192 // 4 + 4 * 28672) / 20e-6 / T.COPY_BW)
    m4096 = res["m4096"]["cases"][0]
    assert m4096["met"] and m4096["value"] == pytest.approx(100 / 105)  # the alternated pair, not the row's 100/120
    hum = {(x["shape"], x["M"]): x for x in res["hum_le64"]["cases"]}
    assert hum[("14336x4096", 1)]["status"] == "missed" and hum[("4096x4096", 1)]["status"] == "met"
    assert hum[("8192x8192", 16)]["status"] == "humming not timed"
    gt = {x["M"]: x for x in res["hum_gt64"]["cases"]}
    assert gt[128]["status"] == "missed" and gt[4096]["status"] == "met"  # 12 > 1.1 x 10; 120 <= 1.1 x 115
    md = T.markdown({"device": "GPU X", "date": "d", "records": ["a", "b"], "commits": ["abc"], "command": "c"},
                    list(res.values()))
    assert "issue 4's targets name the H200; this run is on GPU X" in md
    assert "| 14336x4096 | 1 | 40.0 | 10.0 | 9.0 | 4.44x | 5.00x (8.0) | above the one-launch bound |" in md


def test_records_of_two_devices_are_refused(tmp_path):
    a = _rec(tmp_path / "a.json", "GPU X", [_row(4096, 4096, 1, 20.0, a8=4.0)])
    b = _rec(tmp_path / "b.json", "GPU Y", [_row(4096, 4096, 16, 20.0, a8=4.0)])
    with pytest.raises(SystemExit, match="different devices"):
        T.load_rows([a, b])
    (tmp_path / "c.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="not a bench.kernels record"):
        T.load_rows([tmp_path / "c.json"])


def test_main_writes_a_record(tmp_path, capsys):
    a = _rec(tmp_path / "a.json", "NVIDIA H200", [_row(4096, 4096, 1, 30.0, a8=4.0)])
    assert T.main([str(a), "--out", str(tmp_path / "out"), "--stem", "t"]) == 0
    d = json.loads((tmp_path / "out" / "t.json").read_text())
    assert d["meta"]["records"] == ["a.json"] and d["targets"][0]["met"] == 1
    assert "this run is on" not in (tmp_path / "out" / "t.md").read_text()
    assert T.main([str(a), "--out", str(tmp_path / "out"), "--stem", "t"]) == 0
    assert (tmp_path / "out" / "t-2.json").exists()  # never over an earlier record
