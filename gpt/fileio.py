"""Atomic file writes shared by shards and checkpoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


def fsync_dir(folder: Path) -> None:
    """Persist a rename in `folder`; best effort, since not every OS can open folders."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call write(fh) on a temporary file beside `path`, fsync it, then rename it over `path`.

    A crash or a full disk part-way leaves any earlier file at `path` untouched and no
    partial file under the final name (the hidden temporary file is removed on error).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
