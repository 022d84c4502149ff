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


def test_a_matching_prebuilt_that_does_not_load_is_built_instead(tmp_path, monkeypatch):
    """A prebuilt whose manifest matches but whose library does not load on this machine (here: 4 bytes, not an ELF
    library; on a GPU machine e.g. a newer glibc than its own) is reported and the extension built, not left to the
    pure-torch fallback. The device query and the build are stood in for (no GPU here)."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setenv("TRIT_BUILD_DIR", str(tmp_path / "build"))
    pre = _prebuilt(tmp_path, ops.build_manifest(arch_list="9.0a"))  # this tree's manifest, a broken .so
    monkeypatch.setenv("TRIT_PREBUILT", str(pre))
    monkeypatch.setattr(ops.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    built = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: built.append(kw["build_directory"]))
    for name in ("EXTENSION_LOADED", "EXTENSION_SO", "WGMMA"):
        monkeypatch.setattr(ops, name, getattr(ops, name))
    with pytest.warns(UserWarning, match=r"TRIT_PREBUILT not used, building csrc/ instead: .*trit_C\.so does not "
                                         r"load here"):
        ops._load_extension()
    assert len(built) == 1 and ops.EXTENSION_SO == str(Path(built[0]) / "trit_C.so") and ops.EXTENSION_LOADED
    assert json.loads((Path(built[0]) / ops.PREBUILT_MANIFEST).read_text())["csrc_sha256"] == \
        ops.build_manifest()["csrc_sha256"]
