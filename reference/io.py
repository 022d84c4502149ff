"""Atomic file writes: a reader never sees a half-written golden, spec or report."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def umask_mode(path) -> None:
    """Give a file we wrote the mode any file the user writes gets (0666 less the umask): mkstemp and safetensors'
    save_file make 0600, which another user of a shared golden set or export cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask_mode(tmp)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def aside_path(path: Path) -> Path:
    """Where an existing file or directory goes instead of being overwritten: PATH.prev-<timestamp>, or
    PATH.prev-<timestamp>-n when that is taken (several replacements within one second)."""
    path = Path(path)
    base = f"{path.name}.prev-{time.strftime('%Y%m%d-%H%M%S')}"
    dest, n = path.with_name(base), 0
    while dest.exists():
        n += 1
        dest = path.with_name(f"{base}-{n}")
    return dest
