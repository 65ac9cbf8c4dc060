"""Files that must never be half-written or shared: atomic writes, the one-run-per-folder
lock, and the clean-up of temporary files that killed writers left behind.

Shards, checkpoints, metadata.json and exported weights are written to a hidden temporary
file beside their final name (`.NAME.tmp-PID`), fsynced and renamed over it, so a crash or a
full disk leaves the earlier file and no partial one; the file gets the mode open() would
give a new file (0666 less the umask), not a temporary file's. The trainer's run folder and
fineweb.py's shard folder are each held by one process at a time (FolderLock); the lock
file exists while its holder runs (and after a kill -9, when only a held lock counts).
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

from gpt.core.errors import UserError
from gpt.core.file_checks import LOCKED, entry_problem
from gpt.core.text import one_line


LOCK_NAME = ".lock"
TEMP_FILE = re.compile(r"^\..+\.tmp-(\d+)$")  # what temp_path() names

try:
    import fcntl
    import resource
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
    resource = None  # type: ignore[assignment]


class FolderInUse(UserError):
    """Another live process holds the folder; the message names it."""


class BadLockFile(UserError):
    """What stands at a folder's lock file is not one the lock can be taken on (a folder,
    a symlink, a FIFO, a file that cannot be opened for reading and writing)."""


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


def write_failure(error: OSError | None, folder: Path) -> str:
    """Why a write into `folder` failed, for its message: over the process's file-size
    limit (ulimit -f: the disk's free space would point away from it), else the OS's
    reason and the space left there."""
    if error is not None and error.errno == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if resource else -1
        said = f" ({limit:,} bytes)" if limit >= 0 and limit != resource.RLIM_INFINITY else ""
        return (f"{error.strerror or 'File too large'}: over this process's file-size "
                f"limit{said}, `ulimit -f`; raise the limit")
    why = f"{error.strerror or error}; " if error is not None else ""
    return why + free_space(folder)


def temp_path(path: Path) -> Path:
    """The hidden temporary name a write of `path` goes through (pid-tagged)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


NEW_FILE_MODE = 0o666  # what open() asks for; the umask takes away the rest


def _create_exclusively(path: Path) -> int:
    """Create `path` as a new empty regular file, never through whatever was at that name
    (a planted symlink, a stale file of a dead process with the same pid): that entry is
    removed first, and O_EXCL | O_NOFOLLOW make the create fail rather than follow one.
    Returns the permission bits it got: NEW_FILE_MODE less the umask, as open() gives
    (read back from the file rather than from os.umask(), which can only be read by
    setting it, a race with other threads)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, NEW_FILE_MODE)
    except FileExistsError:
        path.unlink()  # removes a symlink itself, never its target
        fd = os.open(path, flags, NEW_FILE_MODE)
    try:
        return os.fstat(fd).st_mode & 0o7777
    finally:
        os.close(fd)


def _finish(tmp: Path, mode: int) -> None:
    """fsync a written temporary file and give it `mode`: a writer that replaced the file
    instead of writing into it (safetensors writes a file of its own, mode 0600) would
    otherwise pass its mode on through the rename."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        if os.fstat(fd).st_mode & 0o7777 != mode:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A new, empty temporary file beside `path` for the block to write; on success it is
    fsynced and renamed over `path`. A crash or a full disk part-way leaves any earlier
    file at `path` untouched and no partial file under the final name (the temporary file
    is removed on error)."""
    tmp = temp_path(path)
    mode = _create_exclusively(tmp)
    try:
        yield tmp
        _finish(tmp, mode)
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
        modes = {name: _create_exclusively(tmp) for name, tmp in temps.items()}
        yield temps
        for name, tmp in temps.items():
            _finish(tmp, modes[name])
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


def _holder_text(fd: int) -> str:
    """What the lock file open at `fd` says of its holder, as one printable line: the
    file is anyone's to write, so its text may hold newlines or terminal escapes."""
    return one_line(os.read(fd, 1000).decode("utf-8", errors="replace")) or "another process"


def _in_use(folder: Path, what: str, holder: str) -> str:
    return (f"{folder} is in use by {holder}: one {what} per folder; wait for it to finish, "
            f"stop it, or choose another folder")


def _bad_lock(folder: Path, what: str, problem: str) -> str:
    return (f"{folder / LOCK_NAME}: cannot lock {folder} there (one {what} at a time): it "
            f"{problem}; remove it")


def lock_problem(folder: Path, what: str) -> UserError | None:
    """Why FolderLock(folder, what).acquire() would refuse now, in its words: the entry at
    its lock file's name is not one a lock can be taken on (BadLockFile), or a live process
    holds it (FolderInUse); None where it would take the lock. Writes nothing."""
    problem = entry_problem(folder / LOCK_NAME, LOCKED)
    if problem is not None:
        return BadLockFile(_bad_lock(folder, what, problem))
    holder = lock_holder(folder)
    return None if holder is None else FolderInUse(_in_use(folder, what, holder))


def lock_holder(folder: Path) -> str | None:
    """Who holds `folder`'s FolderLock now (what its holder wrote: pid, host, start time,
    command, as one printable line), or None when no live process does. Only reads: a
    folder without a lock file gets none. (Probing takes a shared lock for an instant.)"""
    if fcntl is None:  # pragma: no cover - no flock (Windows)
        return None
    try:  # never through a symlink, never waiting for a FIFO's writer
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return None
            return _holder_text(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class FolderLock:
    """One process per folder: an exclusive flock on `<folder>/.lock` held for the life of
    the run (the OS drops it when the process dies, so a kill -9 leaves no lock held). The
    file names the holder, for the refusal a second process gets, and is removed when the
    holder releases it; one that a killed process left behind names a dead process and
    means nothing (the next run takes it over). A process refused the lock only reads it."""

    ATTEMPTS = 5  # a lock file removed by a releasing holder under us: open the new one

    def __init__(self, folder: Path, what: str) -> None:
        self.folder, self.what = folder, what
        self._fd: int | None = None
        self.created_folder = False  # acquire() made the folder

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> "FolderLock":
        """Take the lock (making the folder if need be), or FolderInUse naming its live
        holder, or BadLockFile where the entry at the lock's name cannot be one."""
        problem = entry_problem(self.path, LOCKED)
        if problem is not None:
            raise BadLockFile(_bad_lock(self.folder, self.what, problem))
        if not self.folder.exists():
            self.folder.mkdir(parents=True)
            self.created_folder = True
        for _ in range(self.ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                         NEW_FILE_MODE)
            if fcntl is None:  # pragma: no cover - no flock (Windows): say so, go on unguarded
                print(f"note: cannot lock {self.folder} on this OS; do not start two runs on it",
                      file=sys.stderr)
                self._fd = fd
                return self
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _holder_text(fd)
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                raise FolderInUse(_in_use(self.folder, self.what, holder)) from None
            if self._names(fd):
                break
            os.close(fd)  # its holder removed that file as it let go: lock the new one
        else:  # pragma: no cover - the file replaced under us again and again
            raise FolderInUse(f"{self.path}: replaced while being locked, {self.ATTEMPTS} times; "
                              f"another process is starting and stopping there")
        os.ftruncate(fd, 0)
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started} "
                     f"({' '.join(sys.argv)[:300]})\n".encode())
        self._fd = fd
        return self

    def _names(self, fd: int) -> bool:
        """Whether the lock file's name still leads to the file `fd` has open."""
        try:
            there = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self, remove_folder_if_unused: bool = False) -> None:
        """Remove the lock file, then drop the lock (in that order: a process waiting on
        the old file sees it gone, and locks a new one). With remove_folder_if_unused, a
        folder that acquire() created and that holds nothing else is removed again (a
        run that failed at start)."""
        if self._fd is None:
            return
        try:
            if self._names(self._fd):
                self.path.unlink()
        except OSError:  # a folder gone read-only: the file stays, meaning nothing
            pass
        finally:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        if remove_folder_if_unused and self.created_folder:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only if empty
