"""Benchmark records: which commit produced them, and how they are written.

Every bench writes a JSON + Markdown pair named ``<stem>.json`` / ``<stem>.md``. A record is never
silently replaced: when the stem is taken (two runs on one day), the next free ``<stem>-2``,
``<stem>-3``... is used, and both files are written atomically.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from reference.io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent


def commit_id() -> str:
    """TRIT_COMMIT when set (the GPU machine gets a copy of the tree, possibly without .git, and the
    caller knows what it sent), else ``git rev-parse HEAD`` with ``+dirty`` for uncommitted changes."""
    if os.environ.get("TRIT_COMMIT"):
        return os.environ["TRIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                             timeout=10).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT,
                               timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_partial(out: Path, stem: str, data) -> Path:
    """The rows so far of a running bench, atomically, as ``partial-<stem>.json`` (scratch, not a
    record: each call replaces it; the bench removes it once the record is written)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"partial-{stem}.json"
    atomic_write_text(p, json.dumps({**data, "partial": True}, indent=1, default=str))
    return p


def drop_partial(out: Path, stem: str) -> None:
    (Path(out) / f"partial-{stem}.json").unlink(missing_ok=True)


def write_record(out: Path, stem: str, data, markdown: str) -> tuple[Path, Path]:
    """Write <stem>.json and <stem>.md under ``out`` (a free stem: never over an earlier record)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name, n = stem, 1
    while (out / f"{name}.json").exists() or (out / f"{name}.md").exists():
        n += 1
        name = f"{stem}-{n}"
    js, md = out / f"{name}.json", out / f"{name}.md"
    atomic_write_text(js, json.dumps(data, indent=1, default=str))
    atomic_write_text(md, markdown if markdown.endswith("\n") else markdown + "\n")
    return js, md
