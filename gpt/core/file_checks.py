"""What opening a file or a folder will meet, judged before it is opened and without
writing anything: a folder where a file goes, a symlink to nothing or in a loop, a FIFO,
a file that cannot be opened for reading and writing, a folder that cannot be made or
written, a full disk.

The code that opens an entry asks the same function first (gpt/core/fileio.py's
FolderLock, gpt/report/metrics.py's MetricsLog, the run folder as the trainer takes it:
gpt/checkpoint/run_folder.py), so a check made beforehand (the trainer's preflight and
its dry run, `python -m gpt.plot -o`) gives the opening's own verdict, in its words. Each
answer is the problem in words (to follow the entry's path), or None.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path


# How a file is opened, which decides what may stand at its name
READ = "read"  # opened for reading (a task file the harness reads)
REPLACED = "replaced"  # written beside it and renamed over it (fileio.atomic_write)
APPENDED = "appended"  # opened for reading and appending, made if missing, never through a symlink (a log)
LOCKED = "locked"  # opened for reading and writing, made if missing, never through a symlink
FOLDER = "folder"  # a folder, made if missing, never through a symlink (written into)


def _kind(mode: int) -> str:
    for test, words in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "a special file"


def _link_problem(path: Path) -> str | None:
    """What following the symlink at `path` meets, or None when it leads somewhere."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"is a symlink to {os.readlink(path)}, which does not exist"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symlink that leads back to itself (a loop)"
        return f"is a symlink that cannot be followed ({e.strerror})"
    return None


def entry_problem(path: Path, use: str) -> str | None:
    """What stands at `path` in the way of opening it as `use` says (READ, REPLACED,
    APPENDED, LOCKED, FOLDER), or None: nothing there (it is made when opened: whether it
    can be is its folder's question, folder_problem), or an entry that opens. Opens
    nothing for writing; a file to read, or to read and write, is opened so (not created,
    not written, never waiting on a FIFO) and closed again."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # its folder is missing, or a file
        return None
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        if use == REPLACED:
            return None  # the rename replaces the link itself, never its target
        if use == LOCKED:  # O_NOFOLLOW: a planted link must not move the lock elsewhere
            return f"is a symlink (to {os.readlink(path)}), and a lock is never taken through one"
        if use in (APPENDED, FOLDER):  # what is written through a link lands where it leads
            return (f"is a symlink (to {os.readlink(path)}), and a run writes only inside its "
                    f"folder, never through a link")
        problem = _link_problem(path)
        if problem is not None:
            return problem
        st = os.stat(path)
    if use == FOLDER:
        return None if stat.S_ISDIR(st.st_mode) else f"is {_kind(st.st_mode)}, not a folder"
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a file"
    if use in (READ, APPENDED, LOCKED):
        flags = (os.O_RDONLY if use == READ else os.O_RDWR) | getattr(os, "O_NONBLOCK", 0) | (
            getattr(os, "O_NOFOLLOW", 0) if use == LOCKED else 0)
        try:
            os.close(os.open(path, flags))
        except OSError as e:
            how = "for reading" if use == READ else "for reading and writing"
            return f"cannot be opened {how} ({e.strerror})"
    return None


def existing_parent(path: Path) -> Path:
    """`path` itself if it exists, else its nearest parent that does (where it would be
    made): a symlink to nothing counts as existing, so that folder_problem can name it."""
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    return probe


def folder_problem(folder: Path) -> tuple[Path, str] | None:
    """(the entry in the way, what is wrong) if files cannot be made in `folder`, making
    it where it is missing: it, or the nearest of its parents that exists, must be a
    folder this process can list, enter and write. Writes nothing."""
    try:
        os.lstat(folder)
    except (FileNotFoundError, NotADirectoryError):
        pass  # made when opened, or a file stands above it: told below
    except OSError as e:  # a name too long, a loop of links above it: nothing can be made
        return folder, f"cannot be looked at ({e.strerror})"
    probe = existing_parent(folder)
    if os.path.islink(probe):
        problem = _link_problem(probe)
        if problem is not None:
            return probe, problem
    try:
        mode = os.stat(probe).st_mode
    except OSError as e:
        return probe, f"cannot be looked at ({e.strerror})"
    if not stat.S_ISDIR(mode):
        return probe, f"is {_kind(mode)}, not a folder"
    access = os.R_OK | os.W_OK | os.X_OK if probe == folder else os.W_OK | os.X_OK
    if not os.access(probe, access):
        return probe, "permission denied"
    return None


def free_bytes(folder: Path) -> int | None:
    """The bytes free to this process where `folder` is, or would be made; None where
    that cannot be read."""
    try:
        return shutil.disk_usage(existing_parent(folder)).free
    except OSError:
        return None
