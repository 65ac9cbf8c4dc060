"""A result file of any subcommand: what it records about the run that made it (the
command typed, the checkout's commit, the time) and how it is written (atomically, through
gpt.core.fileio, so a run killed while writing leaves the earlier file and never a truncated one).

Torch-free, like gpt.core.fileio: the standalone subcommands (tokens, memory, prepare's measured
children) import it before torch, or without it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

from gpt.core.errors import UserError
from gpt.core.fileio import atomic_path

REPO = Path(__file__).resolve().parents[2]
PROG = "python -m gpt.bench"


def git_commit() -> tuple[str | None, bool | None]:
    """(commit of the checkout this package runs from, whether it has local changes)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=REPO, capture_output=True, text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return head.stdout.strip() or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def now() -> str:
    """The time a result records: UTC, ISO 8601, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def command_line(argv: Sequence[str], prog: str = PROG) -> str:
    """The command as typed: ``prog`` and the subcommand's argv."""
    return " ".join([prog, *argv])


def header(argv: Sequence[str], prog: str = PROG) -> dict[str, Any]:
    """The fields a result file starts with: the command as typed, the commit and whether
    the checkout had local changes, the time."""
    commit, dirty = git_commit()
    return {"command": command_line(argv, prog), "commit": commit, "commit_dirty": dirty,
            "time": now()}


def check_out(path: Path, kind: str, holds: str) -> None:
    """--out where a subcommand will write `holds`: a folder or a file, checked by making
    its folder and a scratch file there before anything is measured, so that a long
    benchmark never ends in a traceback at its last line. One line naming --out where it
    cannot be used. The folders it made are removed again: a run that stops before its
    results leaves nothing behind."""
    folder = path if kind == "folder" else path.parent
    if kind == "file" and path.is_dir():
        raise UserError(f"--out {path} is a folder: name a file for {holds}")
    made = []  # the missing folders, deepest first
    for parent in (folder, *folder.parents):
        if parent.exists() or parent.is_symlink():
            break
        made.append(parent)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as e:
        if kind == "file":
            raise UserError(f"--out {path}: its folder cannot be written ({e.strerror or e}): "
                            f"name a file for {holds} in a folder you can write") from None
        what = ("is a file, not a folder" if path.is_file() else
                f"cannot be used as a folder ({e.strerror or e})")
        raise UserError(f"--out {path} {what}: name a folder for {holds}") from None
    finally:
        for made_folder in made:
            with contextlib.suppress(OSError):
                made_folder.rmdir()


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (its folder made if missing); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def write_json(path: Path, payload: Any, indent: int = 2) -> Path:
    return write_text(path, json.dumps(payload, indent=indent, default=_json_default) + "\n")


def write_outputs(out_dir: str | Path, name: str, payload: dict[str, Any],
                  markdown: str) -> tuple[Path, Path]:
    """``<out>/<name>.json`` and ``<out>/<name>.md``, each written atomically."""
    out = Path(out_dir)
    return write_json(out / f"{name}.json", payload), write_text(out / f"{name}.md", markdown)


def _json_default(obj: Any) -> Any:
    # torch's dtypes and devices print as their names; checked by type name so that this
    # module never imports torch
    if isinstance(obj, Path) or (type(obj).__module__ == "torch"
                                 and type(obj).__name__ in ("dtype", "device")):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
