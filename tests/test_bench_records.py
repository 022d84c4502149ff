"""Benchmark records: never written over an earlier record; the commit field says what ran."""
import json

from bench.records import commit_id, write_record


def test_records_never_overwrite(tmp_path):
    a = write_record(tmp_path, "2026-11-30-h200", {"run": 1}, "# one")
    b = write_record(tmp_path, "2026-11-30-h200", {"run": 2}, "# two\n")
    assert a[0].name == "2026-11-30-h200.json" and b[0].name == "2026-11-30-h200-2.json"
    assert json.loads(a[0].read_text()) == {"run": 1} and a[1].read_text() == "# one\n"
    assert json.loads(b[0].read_text()) == {"run": 2} and b[1].read_text() == "# two\n"
    (tmp_path / "x-2.md").write_text("taken")  # either file of a pair reserves the stem
    write_record(tmp_path, "x", {}, "")
    c = write_record(tmp_path, "x", {}, "")
    assert c[0].name == "x-3.json" and (tmp_path / "x-2.md").read_text() == "taken"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_commit_id(monkeypatch):
    monkeypatch.setenv("TRIT_COMMIT", "abc123+wip")
    assert commit_id() == "abc123+wip"
    monkeypatch.delenv("TRIT_COMMIT")
    c = commit_id()
    assert c == "unknown" or len(c.split("+")[0]) == 40
