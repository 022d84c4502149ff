"""TRIT_PREBUILT: a build copied from another machine stands in for this tree's only where its manifest matches
(trit.ops.build_manifest / prebuilt_mismatch; the loading itself needs a GPU and runs in ci/gpu_kernels.sh)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trit import ops


def _csrc(tmp_path: Path) -> Path:
    d = tmp_path / "csrc"
    d.mkdir()
    (d / "a.cu").write_text("__global__ void k() {}\n")
    (d / "b.h").write_text("#pragma once\n")
    return d


def _prebuilt(tmp_path: Path, manifest: dict) -> Path:
    d = tmp_path / "pre"
    d.mkdir()
    (d / "trit_C.so").write_bytes(b"\x7fELF")
    (d / ops.PREBUILT_MANIFEST).write_text(json.dumps(manifest))
    return d


def test_manifest_follows_every_csrc_byte_and_name(tmp_path):
    d = _csrc(tmp_path)
    m0 = ops.build_manifest(d, "9.0a")
    assert m0 == ops.build_manifest(d, "9.0a")
    (d / "b.h").write_text("#pragma once \n")
    m1 = ops.build_manifest(d, "9.0a")
    assert m1["csrc_sha256"] != m0["csrc_sha256"]
    (d / "b.h").rename(d / "c.h")
    assert ops.build_manifest(d, "9.0a")["csrc_sha256"] != m1["csrc_sha256"]
    assert ops.build_manifest(d, "9.0")["arch_list"] == "9.0"
    assert m0["torch"] == ops.torch.__version__


def test_matching_prebuilt_is_accepted(tmp_path):
    want = ops.build_manifest(_csrc(tmp_path), "9.0a")
    assert ops.prebuilt_mismatch(_prebuilt(tmp_path, want), want) is None


@pytest.mark.parametrize("key", ["csrc_sha256", "torch", "cuda", "arch_list"])
def test_a_differing_entry_is_named_with_both_values(tmp_path, key):
    want = ops.build_manifest(_csrc(tmp_path), "9.0a")
    pre = _prebuilt(tmp_path, {**want, key: "other"})
    why = ops.prebuilt_mismatch(pre, want)
    assert why is not None and key in why and "'other'" in why and repr(want[key]) in why
    assert str(pre / ops.PREBUILT_MANIFEST) in why


def test_missing_or_broken_files_are_named(tmp_path):
    want = ops.build_manifest(_csrc(tmp_path), "9.0a")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "trit_C.so does not exist" in ops.prebuilt_mismatch(empty, want)
    (empty / "trit_C.so").write_bytes(b"")
    assert "trit_C.json does not exist" in ops.prebuilt_mismatch(empty, want)
    (empty / ops.PREBUILT_MANIFEST).write_text("{not json")
    assert "not a JSON manifest" in ops.prebuilt_mismatch(empty, want)
    (empty / ops.PREBUILT_MANIFEST).write_text("[1]")
    assert "expected a JSON object, found list" in ops.prebuilt_mismatch(empty, want)


def test_manifest_is_written_whole(tmp_path):
    m = ops.build_manifest(_csrc(tmp_path), "9.0a")
    ops._write_manifest(tmp_path, m)
    path = tmp_path / ops.PREBUILT_MANIFEST
    assert json.loads(path.read_text()) == m
    assert not list(tmp_path.glob(".*.tmp"))
    before = path.stat().st_mtime_ns
    ops._write_manifest(tmp_path, m)  # the same manifest: not rewritten
    assert path.stat().st_mtime_ns == before
    ops._write_manifest(tmp_path, {**m, "torch": "other"})
    assert json.loads(path.read_text())["torch"] == "other"
