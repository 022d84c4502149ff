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
         "AB_DIR": str(out.parent / (out.name + "-scratch")), "PATH": os.environ.get("PATH", ""), **env}
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
    scratch = tmp_path / "out-scratch"
    summary = (out / "ab.txt").read_text()
    for n in ("t1", "t2"):
        assert (Path(f"/tmp/ab-tree-{n}/csrc/marker.txt")).read_text() == {"t1": "one", "t2": "two"}[n]
        assert f"with /tmp/trit-build-ab-{n}" in (scratch / f"build-{n}.txt").read_text()
        assert f"with /tmp/trit-build-ab-{n}" in summary  # the builds' last lines reach the summary
        assert f"| ab-tree-{n} | /tmp/trit-build-ab-{n} |" in (scratch / f"ab-{n}-2.txt").read_text()
    assert (scratch / "ab-new-1.txt").exists() and (scratch / "ab-new-2.txt").exists()
    # $OUT holds the stand-in's call log and one summary file, nothing per bench (the device returns <= 8 files)
    assert sorted(p.name for p in out.iterdir()) == ["ab.txt", "calls.txt"]
    # the summary lines name tree and round, on stdout and in ab.txt
    for line in ("t2 2 | 2b | 1 | ab-tree-t2", "new 1 | 2b | 1 | repo"):
        assert line in r.stdout and line in summary


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


SLOW_PY = """#!/usr/bin/env bash
# this tree's extension import takes 2 s and notes when it ended; an old tree's notes when it started
if [ "$1" = "-c" ] && [ "$(basename $PWD)" = repo ]; then sleep 2; date +%s.%N > "$OUT/new-built"; exit 0; fi
if [ "$1" = "-c" ]; then date +%s.%N > "$OUT/$(basename $PWD)-started"; echo "built in $PWD"; exit 0; fi
echo "| 2b | 1 | $(basename $PWD) | $TRIT_BUILD_DIR |"
"""

FAILING_PY = FAKE_PY.replace('echo "| 2b | 1 |',
                             '[ "$(basename $PWD)" = ab-tree-t1 ] && { echo boom; exit 3; }\necho "| 2b | 1 |', 1)


def stand_in(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    p.chmod(0o755)
    return p


def test_ab_stage_builds_old_trees_while_this_one_builds(tree, tmp_path):
    """With the build stage, the old trees' builds start before this tree's build and are waited for."""
    repo, _ = tree
    py = stand_in(tmp_path, "slowpy", SLOW_PY)
    out = tmp_path / "out"
    r = run(repo, py, out, ".ab/t1.tar.gz", STAGES="build,ab", AB_REPS="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert float((out / "ab-tree-t1-started").read_text()) < float((out / "new-built").read_text())
    assert "new 1 | 2b | 1 | repo" in r.stdout and "t1 1 | 2b | 1 | ab-tree-t1" in r.stdout


def test_ab_stage_reports_a_failing_bench_and_goes_on(tree, tmp_path):
    repo, _ = tree
    py = stand_in(tmp_path, "failpy", FAILING_PY)
    out = tmp_path / "out"
    r = run(repo, py, out, ".ab/t1.tar.gz", AB_REPS="1")
    assert r.returncode == 1
    assert "t1 bench 1 failed (rc 3): boom" in (out / "ab.txt").read_text()
    assert "new 1 | 2b | 1 | repo" in r.stdout  # this tree still ran


FAKE_NCU = """#!/usr/bin/env bash
# stands in for ncu: a profile notes where it ran and which python path it had; -i prints totals or the CSV
if [ "$1" = "-i" ]; then
  tree=$(cat "$2")
  if [ "$3" = "--page" ]; then
    echo '"File Path","/src/ternary_gemm.cu"'
    echo '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","# Samples","Instructions Executed"'
    n=100; [ "$tree" = repo ] && n=150
    echo "\\"7\\",\\"w = ld(p);\\",\\"-\\",\\"-\\",\\"3\\",\\"0\\",\\"3\\",\\"$n\\""
  else
    echo "  void chain_kernel<bf16>() ($tree)"; echo "    Executed Instructions   inst   42"
  fi
  exit 0
fi
while [ $# -gt 0 ] && [ "$1" != "-o" ]; do shift; done
rep=$2; shift 2
echo "$(basename $PWD) ${PYTHONPATH%%:*} $NCU_TAIL" >> "$OUT/ncu-calls.txt"
basename $PWD > "$rep.ncu-rep"
"""


def test_ncuchain_stage_profiles_each_tree_in_its_own_directory(tree, tmp_path):
    repo, py = tree
    (repo / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "ncu_lines.py", repo / "bench" / "ncu_lines.py")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ncu = bindir / "ncu"
    ncu.write_text(FAKE_NCU)
    ncu.chmod(0o755)
    out = tmp_path / "out"
    r = run(repo, py, out, ".ab/t1.tar.gz", STAGES="ab,ncuchain", AB_REPS="1", NCU_TAIL="2b",
            PATH=f"{bindir}:{os.environ.get('PATH', '')}")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = (out / "ncu-calls.txt").read_text().splitlines()
    assert calls == ["ab-tree-t1 /tmp/ab-tree-t1 2b", f"repo {repo} 2b"]  # old tree first, each on its own path
    report = (out / "ncu-chain.txt").read_text()
    assert "## t1" in report and "(ab-tree-t1)" in report and "## new" in report and "(repo)" in report
    assert "| `w = ld(p);` | 100 | 150 | +50 | 3 | 3 |" in report


def test_chain_stage_runs_this_tree_rounds_into_one_file(tree, tmp_path):
    """STAGES=chain: CHAIN_REPS rounds of bench.chain in this tree with CHAIN_ARGS (default: the e2e routes with
    Inductor's glue), every round's table rows in $OUT/chain.txt, the raw outputs in the scratch directory."""
    repo, py = tree
    out = tmp_path / "out"
    r = run(repo, py, out, "", STAGES="chain", CHAIN_REPS="3")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [c for c in (out / "calls.txt").read_text().split("\n") if c]
    assert len(calls) == 3 and all(c.startswith("repo -m bench.chain --tails 8b-llama,2b --ms 16,32 --variants "
                                                "a8-inductor,fnorm-inductor,fnorm-tiled-inductor --out ") for c in calls)
    text = (out / "chain.txt").read_text()
    assert text.count("| 2b | 1 | repo |") == 3 and "round 3: python -m bench.chain" in text
    assert sorted(p.name for p in out.iterdir()) == ["calls.txt", "chain.txt"]
    r = run(repo, py, tmp_path / "out2", "", STAGES="chain", CHAIN_REPS="1", CHAIN_ARGS="--tails 2b --variants a8")
    assert "repo -m bench.chain --tails 2b --variants a8 --out" in (tmp_path / "out2" / "calls.txt").read_text()


SHARD_PY = """#!/usr/bin/env bash
# stands in for python3 running pytest: --collect-only lists 10 node ids (as pytest -q does, then a count),
# a run records its arguments
if [[ " $* " == *" --collect-only "* ]]; then
  for i in $(seq 0 9); do echo "tests/test_ops_cuda.py::test_k[case $i]"; done
  echo; echo "10 tests collected in 0.01s"; exit 0
fi
printf '%s\\n' "$@" > "$OUT/run-args.txt"
"""


@pytest.mark.parametrize("shard,want", [("1/3", [0, 1, 2]), ("2/3", [3, 4, 5]), ("3/3", [6, 7, 8, 9]),
                                        ("1/1", list(range(10)))])
def test_test_stage_runs_one_shard_of_the_collected_tests(tree, tmp_path, shard, want):
    """TEST_SHARD=i/n runs the i-th contiguous slice of the collected node ids (ids with spaces kept whole); the n
    slices cover every test once."""
    repo, _ = tree
    py = stand_in(tmp_path, "shardpy", SHARD_PY)
    out = tmp_path / "out"
    r = run(repo, py, out, "", STAGES="test", TEST_SHARD=shard)
    assert r.returncode == 0, r.stdout + r.stderr
    args = (out / "run-args.txt").read_text().splitlines()
    assert [a for a in args if "::" in a] == [f"tests/test_ops_cuda.py::test_k[case {i}]" for i in want]
    assert f"--junitxml={out}/junit-{shard.replace('/', '-of-')}.xml" in args
    assert f"shard {shard}: tests {want[0] + 1}-{want[-1] + 1} of 10" in r.stdout


@pytest.mark.parametrize("shard", ["0/2", "3/2", "2", "a/b", "1/0"])
def test_test_stage_refuses_a_malformed_shard(tree, tmp_path, shard):
    repo, _ = tree
    py = stand_in(tmp_path, "shardpy", SHARD_PY)
    out = tmp_path / "out"
    r = run(repo, py, out, "", STAGES="test", TEST_SHARD=shard)
    assert r.returncode == 1 and f"TEST_SHARD={shard}: expected i/n with 1 <= i <= n" in r.stdout
    assert not (out / "run-args.txt").exists()
