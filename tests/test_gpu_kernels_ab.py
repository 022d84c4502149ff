"""ci/gpu_kernels.sh's ab stage (a bisect of chain-kernel trees in one GPU call), run with a stand-in Python
that records where and how each bench ran: the order of the rounds, each old tree in its own directory and
build directory, missing or repeated archives refused."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_PY = """#!/usr/bin/env bash
# stands in for python3: the extension import prints where it built, a bench prints one table row
if [ "$1" = "-c" ]; then echo "built in $PWD with $TRIT_BUILD_DIR"; exit 0; fi
echo "| 2b | 1 | $(basename $PWD) | $TRIT_BUILD_DIR |"
echo "$(basename $PWD) $*" >> "$OUT/calls.txt"
"""


def archive(path: Path, marker: str) -> Path:
    with tarfile.open(path, "w:gz") as t:
        data = marker.encode()
        info = tarfile.TarInfo("csrc/marker.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def tree(tmp_path):
    """A copy of the script in a scratch repository (no .whl there), a stand-in python, two archives."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy(ROOT / "ci" / "gpu_kernels.sh", repo / "ci" / "gpu_kernels.sh")
    py = tmp_path / "fakepy"
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    ab = repo / ".ab"
    ab.mkdir()
    archive(ab / "t1.tar.gz", "one")
    archive(ab / "t2.tar.gz", "two")
    return repo, py


def run(repo: Path, py: Path, out: Path, ab_tar: str, **env):
    e = {**os.environ, "OUT": str(out), "PYTHON": str(py), "STAGES": "ab", "AB_TAR": ab_tar,
         "PATH": os.environ.get("PATH", ""), **env}
    e.pop("TRIT_BUILD_DIR", None)
    return subprocess.run(["bash", "ci/gpu_kernels.sh"], cwd=repo, env=e, capture_output=True, text=True,
                          timeout=120)


def test_ab_stage_bisects_several_trees(tree, tmp_path):
    repo, py = tree
    out = tmp_path / "out"
    r = run(repo, py, out, ".ab/t1.tar.gz,.ab/t2.tar.gz", AB_REPS="2", AB_ARGS="--tails 2b --variants chain")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = (out / "calls.txt").read_text().split("\n")
    # rounds of every old tree in the order given, this tree last; each old tree in its own directory
    dirs = [c.split(" ")[0] for c in calls if c]
    assert dirs == ["ab-tree-t1", "ab-tree-t2", "repo"] * 2
    assert all("-m bench.chain --tails 2b --variants chain --out" in c for c in calls if c)
    for n in ("t1", "t2"):
        assert (Path(f"/tmp/ab-tree-{n}/csrc/marker.txt")).read_text() == {"t1": "one", "t2": "two"}[n]
        assert f"with /tmp/trit-build-ab-{n}" in (out / f"ab-build-{n}.txt").read_text()
        assert f"| ab-tree-{n} | /tmp/trit-build-ab-{n} |" in (out / f"ab-{n}-2.txt").read_text()
    assert (out / "ab-new-1.txt").exists() and (out / "ab-new-2.txt").exists()
    # the summary lines name tree and round
    assert "t2 2 | 2b | 1 | ab-tree-t2" in r.stdout and "new 1 | 2b | 1 | repo" in r.stdout


def test_ab_stage_refuses_missing_and_repeated_archives(tree, tmp_path):
    repo, py = tree
    r = run(repo, py, tmp_path / "o1", ".ab/t1.tar.gz .ab/nope.tar.gz")
    assert r.returncode == 1 and "AB_TAR not set or missing: .ab/nope.tar.gz" in r.stdout
    assert not (tmp_path / "o1" / "calls.txt").exists()  # nothing benched
    r = run(repo, py, tmp_path / "o2", "")
    assert r.returncode == 1 and "AB_TAR not set or missing: (empty)" in r.stdout
    shutil.copy(repo / ".ab" / "t1.tar.gz", tmp_path / "t1.tar.gz")
    r = run(repo, py, tmp_path / "o3", f".ab/t1.tar.gz {tmp_path / 't1.tar.gz'}", AB_REPS="1")
    assert r.returncode == 1 and "AB_TAR names t1 twice" in r.stdout
