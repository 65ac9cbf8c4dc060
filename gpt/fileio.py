"""Files that must never be half-written or shared: atomic writes, the one-run-per-folder
lock, and the clean-up of temporary files that killed writers left behind.

Shards, checkpoints, metadata.json and exported weights are written to a hidden temporary
file beside their final name (`.NAME.tmp-PID`), fsynced and renamed over it, so a crash or a
full disk leaves the earlier file and no partial one. The trainer's run folder and
fineweb.py's shard folder are each held by one process at a time (FolderLock).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Sequence

from gpt.errors import UserError

LOCK_NAME = ".lock"
TEMP_FILE = re.compile(r"^\..+\.tmp-(\d+)$")  # what temp_path() names

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class FolderInUse(UserError):
    """Another live process holds the folder; the message names it."""


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


def free_space(folder: Path) -> str:
    """How much room is left in `folder`, for the message of a write that failed."""
    try:
        return f"{shutil.disk_usage(folder).free / 2**30:.1f} GiB free there"
    except OSError:
        return "free space unknown"


def temp_path(path: Path) -> Path:
    """The hidden temporary name a write of `path` goes through (pid-tagged)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _create_exclusively(path: Path) -> None:
    """Create `path` as a new empty regular file, never through whatever was at that name
    (a planted symlink, a stale file of a dead process with the same pid): that entry is
    removed first, and O_EXCL | O_NOFOLLOW make the create fail rather than follow one."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for attempt in range(2):
        try:
            os.close(os.open(path, flags, 0o644))
            return
        except FileExistsError:
            if attempt:
                raise
            path.unlink()  # removes a symlink itself, never its target


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A new, empty temporary file beside `path` for the block to write; on success it is
    fsynced and renamed over `path`. A crash or a full disk part-way leaves any earlier
    file at `path` untouched and no partial file under the final name (the temporary file
    is removed on error)."""
    tmp = temp_path(path)
    _create_exclusively(tmp)
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


@contextlib.contextmanager
def atomic_files(folder: Path, names: Sequence[str]) -> Iterator[dict[str, Path]]:
    """Like atomic_path for several files of one folder that must agree (a model's
    weights, config and tokenizer): the block writes a temporary file for each name, and
    only once all are written and fsynced are they renamed over their final names. A
    failure part-way (a full disk) leaves every earlier file as it was and no temporary
    file; only a kill during the renames themselves could leave a mix."""
    temps = {name: temp_path(folder / name) for name in names}
    try:
        for tmp in temps.values():
            _create_exclusively(tmp)
        yield temps
        for tmp in temps.values():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for name, tmp in temps.items():
            os.replace(tmp, folder / name)
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(folder)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call write(fh) on a temporary file beside `path`, then rename it over `path`
    (see atomic_path)."""
    with atomic_path(path) as tmp:
        with open(tmp, "r+b") as fh:
            write(fh)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:  # pragma: no cover - e.g. an invalid pid
        return False
    return True


def remove_dead_temp_files(folder: Path) -> list[Path]:
    """Delete the temporary files in `folder` whose writing process is gone (a kill -9
    mid-write leaves one, up to a whole checkpoint in size); those of live processes stay.
    Call it while holding the folder's lock, so no other writer is at work there, and
    before this process writes any: one tagged with this very pid was left by a dead
    process that had it before (pids are reused, often so in containers)."""
    removed = []
    for entry in folder.iterdir():
        m = TEMP_FILE.match(entry.name)
        pid = int(m.group(1)) if m else 0
        if m and not entry.is_dir() and (pid == os.getpid() or not _pid_alive(pid)):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def lock_holder(folder: Path) -> str | None:
    """Who holds `folder`'s FolderLock now (what its holder wrote: pid, host, start time,
    command), or None when no live process does. Only reads: a folder without a lock file
    gets none. (Probing takes a shared lock for an instant.)"""
    if fcntl is None:  # pragma: no cover - no flock (Windows)
        return None
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return None
            return os.read(fd, 1000).decode("utf-8", errors="replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class FolderLock:
    """One process per folder: an exclusive flock on `<folder>/.lock` held for the life of
    the process (the OS drops it when the process dies, so a kill -9 leaves no stale lock).
    The file names the holder, for the refusal a second process gets."""

    def __init__(self, folder: Path, what: str) -> None:
        self.folder, self.what = folder, what
        self._fd: int | None = None
        self.created_folder = False  # acquire() made the folder

    def acquire(self) -> "FolderLock":
        if not self.folder.exists():
            self.folder.mkdir(parents=True)
            self.created_folder = True
        path = self.folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        if fcntl is None:  # pragma: no cover - no flock (Windows): say so, go on unguarded
            print(f"note: cannot lock {self.folder} on this OS; do not start two runs on it",
                  file=sys.stderr)
            self._fd = fd
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.read(fd, 1000).decode("utf-8", errors="replace").strip() or "another process"
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise FolderInUse(f"{self.folder} is in use by {holder}: one {self.what} per folder; "
                              f"wait for it to finish, stop it, or choose another folder") from None
        os.ftruncate(fd, 0)
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started} "
                     f"({' '.join(sys.argv)[:300]})\n".encode())
        self._fd = fd
        return self

    def release(self, remove_folder_if_unused: bool = False) -> None:
        """Drop the lock. With remove_folder_if_unused, a folder that acquire() created and
        that holds nothing but the lock file is removed again (a run that failed at start)."""
        if self._fd is None:
            return
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None
        if remove_folder_if_unused and self.created_folder:
            if [p.name for p in self.folder.iterdir()] == [LOCK_NAME]:
                (self.folder / LOCK_NAME).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    self.folder.rmdir()
