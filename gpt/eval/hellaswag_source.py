"""Where a HellaSwag set comes from: the official validation set, known by its content;
downloads, each kept once in a cache folder under a name of its own.

The official file is the one every published score was taken on (10,042 examples). Its
size and sha256 are known, so a cached copy of another file (a mirror's, an edited one, a
download from another address that happens to bear the same file name) is never scored
as it: the official set's address gives the official file or an error, and a set of the
user's own is scored under its own name (set_name). Reading and scoring a set is
gpt/eval/hellaswag.py's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import torch.distributed as dist

from gpt.core import network
from gpt.core.errors import UserError
from gpt.core.fileio import atomic_write


VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
# The official validation file, as rowanz/hellaswag publishes it (the size and sha256 that
# TensorFlow Datasets' url_checksums/hellaswag.txt records for VAL_URL).
VAL_BYTES = 12_246_618
VAL_SHA256 = "0aa3b88843990f3f10a97b9575c94d7b71fb2205240ba04ae4884d9e9c992588"
VAL_NAME = "val"  # the official set's name in every result (the flags' word for it)


class HellaSwagError(UserError, ValueError):
    """An unusable HellaSwag file or source; the message names it (and the line)."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/gpt2-trainer/hellaswag (~/.cache/... when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpt2-trainer" / "hellaswag"


def _download(url: str, dest: Path, timeout_s: float = 60.0) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            atomic_write(dest, lambda fh: shutil.copyfileobj(response, fh))
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise HellaSwagError(f"could not download {url} ({reason}); offline, copy the file "
                             f"to {dest} (where it is kept once downloaded), or pass a local "
                             f"copy: --hellaswag FILE to python -m gpt.evaluate, "
                             f"--hellaswag-file FILE to the trainer") from None


_identified: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime) -> is the official set


def is_official(path: str | os.PathLike) -> bool:
    """Whether `path` holds HellaSwag's official validation set, byte for byte (its size,
    then its sha256: a few tens of milliseconds, once per file and process)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _identified:
        same = st.st_size == VAL_BYTES
        if same:
            digest = hashlib.sha256()
            try:
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
            except OSError:
                return False
            same = digest.hexdigest() == VAL_SHA256
        _identified[key] = same
    return _identified[key]


def address(source: str | os.PathLike | None) -> str:
    """Where a set is read from: the official set's address for none given or "val" (where
    no file of that name is here), else the file or address given."""
    if source is None or (str(source) == "val" and not Path("val").exists()):
        return VAL_URL
    return str(source)


def cached_path(url: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `url`'s copy is kept once downloaded: the official set under its own file
    name, any other address under a name of its own (a hash of the address before the
    file's name), so that no download can stand in for another."""
    folder = Path(cache_dir or default_cache_dir())
    name = Path(urllib.parse.urlparse(url).path).name or "hellaswag.jsonl"
    if url == VAL_URL:
        return folder / name
    return folder / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}"


def _cached(url: str, cache_dir: str | os.PathLike | None) -> Path | None:
    """`url`'s cached copy if it can be used as that: for the official set, only the
    official file."""
    dest = cached_path(url, cache_dir)
    if not dest.is_file() or (url == VAL_URL and not is_official(dest)):
        return None
    return dest


def set_name(source: str | os.PathLike | None, path: str | os.PathLike) -> str:
    """The name a set's scores go under: VAL_NAME for the official validation set (known
    by its content, wherever it came from), else the file or address the user gave."""
    return VAL_NAME if is_official(path) else str(source)


def check_reachable(source: str | None, cache_dir: str | os.PathLike | None = None,
                    flag: str = "--hellaswag-file") -> None:
    """A HellaSwag source that must be downloaded (None or "val" for the validation set,
    or an http(s) address) and is not cached can be: its host answers. Else one line at
    once, not a download's timeout at the run's first evaluation; an address that cannot
    be parsed, one naming `flag`."""
    text = address(source)
    if not text.startswith(("http://", "https://")):
        return
    network.split_address(text, flag.split()[0])  # a bad port, a broken IPv6 host: said here
    if _cached(text, cache_dir):
        return
    dest = cached_path(text, cache_dir)
    held = (f"the copy at {dest} is not HellaSwag's validation set (its content differs "
            f"from the official file's)" if dest.is_file() else f"it is not cached at {dest}")
    why = network.unreachable(text, flag.split()[0])
    if why is not None:
        raise HellaSwagError(f"HellaSwag: {text}: {held}, and it cannot be downloaded ({why}): "
                             f"pass a local copy with {flag} FILE, or go online")


def fetch(url: str, cache_dir: str | os.PathLike | None = None, rank: int = 0,
          flag: str = "--hellaswag") -> Path:
    """The cached copy of `url`, downloaded once: by rank 0 while the other ranks wait.

    Under torch.distributed, rank 0's outcome is broadcast so all ranks fail together.
    A rank that still lacks the file afterwards (another node, no shared disk) fetches
    its own copy; writes are atomic, so racing copies are harmless. The official set's
    address gives the official file or an error, never another file.
    """
    network.split_address(url, flag)  # before its cache's name is made from it
    dest = cached_path(url, cache_dir)
    error: str | None = None
    if rank == 0 and _cached(url, cache_dir) is None:
        try:
            check_reachable(url, cache_dir, "--hellaswag FILE to python -m gpt.evaluate, "
                                            "--hellaswag-file")
            _download(url, dest)
            _check_official(url, dest)
        except HellaSwagError as e:
            error = str(e)
    if dist.is_available() and dist.is_initialized():
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise HellaSwagError(error)
    if _cached(url, cache_dir) is None:
        _download(url, dest)
        _check_official(url, dest)
    return dest


def _check_official(url: str, dest: Path) -> None:
    if url == VAL_URL and not is_official(dest):
        raise HellaSwagError(f"HellaSwag: what {url} sent ({dest.stat().st_size:,} bytes, kept "
                             f"at {dest}) is not the official validation set ({VAL_BYTES:,} "
                             f"bytes, sha256 {VAL_SHA256[:12]}...): it is not scored as it; "
                             f"pass a copy of the official file with --hellaswag FILE "
                             f"(python -m gpt.evaluate) or --hellaswag-file FILE (the trainer)")
