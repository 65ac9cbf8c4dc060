"""What the GPU acceptance's stages need from the user, checked before anything runs:
build-nanogpt's train_gpt2.py (`--nanogpt PATH`), a corpus of token shards (`--corpus
DIR`), and the optional packages some cells import (Liger Kernel, Cut Cross-Entropy,
torchao: a cell's `needs` and `uses`). Only the packages the chosen cells use are looked
at. One that is not importable is installed from the user's wheels (`--wheels DIR`, for a
machine without internet) into a scratch folder that only the cells see (on their
PYTHONPATH), never into the user's environment, and checked to import from there. A
package that cannot be had (no wheel, a wheel pip cannot install, one that installs but
does not import) is said in one line, and the cells that need it are skipped; the others
run.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.bench.gpu import nanogpt
from gpt.bench.gpu.stages import STAGES, Cell
from gpt.core.errors import UserError
from gpt.data.shards import DataError, find_shards

# import name -> the name pip knows it by (a wheel's file name starts with the import name)
PACKAGES = {"liger_kernel": "liger-kernel", "cut_cross_entropy": "cut-cross-entropy",
            "torchao": "torchao"}


class StageError(UserError):
    """A stage cannot run here (an input or a package is missing); nothing was run."""


@dataclass
class Packages:
    """The optional packages the chosen stages use: how each is available, the cells'
    extra environment (PYTHONPATH with the scratch folder where wheels were installed), and
    why those that are not available are not."""

    status: dict[str, str] = field(default_factory=dict)  # module -> "importable" | "installed from ..."
    missing: dict[str, str] = field(default_factory=dict)  # module -> why it cannot be imported
    env: dict[str, str] = field(default_factory=dict)


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def wheel_for(module: str, wheels: Path | None) -> Path | None:
    """The newest-named wheel of `module` in `wheels` (its file name starts with the import
    name: liger_kernel-0.8.5-py3-none-any.whl)."""
    if wheels is None:
        return None
    found = sorted(wheels.glob(f"{module}-*.whl"))
    return found[-1] if found else None


def why_missing(module: str, wheels: Path | None) -> str:
    where = f"there is no {module}-*.whl in {wheels}" if wheels else "no --wheels DIR was given"
    return (f"{module} is not importable and {where}: pip install {PACKAGES[module]}, or pass "
            f"--wheels DIR holding its wheel")


def check(stages: dict[str, list[Cell]], args: Any) -> None:
    """Raises StageError, naming the flag, when a chosen stage lacks an input it cannot run
    without: build-nanogpt's script, the corpus (--smoke needs neither: it skips
    build-nanogpt and trains on random tokens). A missing package is no such input: it
    skips the cells that need it (prepare)."""
    if args.smoke:
        return
    for name, cells in stages.items():
        if any(c.kind == "nanogpt" for c in cells):
            if args.nanogpt is None:
                raise StageError(f"stage {name} runs build-nanogpt beside ours: pass --nanogpt PATH, "
                                 f"its train_gpt2.py (from https://github.com/karpathy/build-nanogpt); "
                                 f"nothing was run")
            try:
                nanogpt.check(Path(args.nanogpt))
            except (nanogpt.MissingBaseline, ValueError) as e:
                raise StageError(f"stage {name}: --nanogpt {args.nanogpt}: {e}; nothing was run") from None
        if "corpus" in STAGES[name].needs and cells:
            check_corpus(name, args.corpus)


def check_corpus(stage: str, corpus: str | None) -> None:
    hint = ("a folder of GPT-2 token shards (train_*.bin, val_*.bin) as fineweb.py writes; random "
            "tokens have no loss to compare")
    if corpus is None:
        raise StageError(f"stage {stage} needs --corpus DIR, {hint}; nothing was run")
    try:
        find_shards(corpus, "train")
        find_shards(corpus, "val")
    except DataError as e:
        raise StageError(f"stage {stage}: --corpus {e}; nothing was run") from None


def wheels_dir(args: Any) -> Path | None:
    return Path(args.wheels) if args.wheels else None


def prepare(cells: list[Cell], wheels: Path | None, site: Path) -> Packages:
    """Every package the cells need or use: importable as it is, or installed from its wheel
    into `site` (then checked to import from there, with the cells' PYTHONPATH), or missing
    with the reason, in one line: the cells that need it are skipped (cell_run.skip_reason)."""
    out = Packages()
    for module in dict.fromkeys(m for c in cells for m in (*c.needs, *c.uses)):
        if importable(module):
            out.status[module] = "importable"
        elif (wheel := wheel_for(module, wheels)) is None:
            out.missing[module] = why_missing(module, wheels)
        elif (why := install(wheel, module, site)) is not None:
            out.missing[module] = f"--wheels {wheels}: {why}"
        else:
            out.status[module] = f"installed from {wheel}"
    if any(how.startswith("installed") for how in out.status.values()):
        out.env = {"PYTHONPATH": cells_path(site)}
    return out


def cells_path(site: Path) -> str:
    """The cells' PYTHONPATH: the scratch folder first, then the user's own."""
    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)


def install(wheel: Path, module: str, site: Path) -> str | None:
    """`wheel` installed into `site` and `import module` tried in the cells' interpreter with
    their PYTHONPATH; why not, in one line, or None. A wheel at a time, so that a broken one
    costs only its own cells."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--no-compile", "--target", str(site), str(wheel)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return f"pip could not install {wheel.name}: {last[0]}"
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": cells_path(site)})
    if probe.returncode != 0:
        last = probe.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return f"{wheel.name} installed but `import {module}` fails: {last[0]}"
    return None
