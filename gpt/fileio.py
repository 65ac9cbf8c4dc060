"""Atomic file writes shared by shards, checkpoints, metadata and exported weights."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


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


def temp_path(path: Path) -> Path:
    """The hidden temporary name a write of `path` goes through (pid-tagged)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write; on success it is fsynced and
    renamed over `path`. A crash or a full disk part-way leaves any earlier file at `path`
    untouched and no partial file under the final name (the temporary file is removed on
    error)."""
    tmp = temp_path(path)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call write(fh) on a temporary file beside `path`, then rename it over `path`
    (see atomic_path)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            write(fh)
