"""The optional packages (pyproject.toml's extras): how to install one, in the words the
README uses (an editable install from the checkout); importing one as the run will, and
the one line that says what to do when it is missing or broken.

A package can be on disk and still fail to import: a build for another torch or CUDA,
an ABI mismatch, a dependency missing or of the wrong version, a half-finished install.
So a check that a run can use one imports the very modules the run imports; looking for
the package's files (importlib.util.find_spec) would promise a start the run then
refuses. The first import also costs what it costs the run, once: the module stays
imported. Only a command that must name a missing extra before it loads torch (an import
of torchao, lm-eval or matplotlib takes seconds) may first look for the package's files
(have): that can refuse early, never promise.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from types import ModuleType

from gpt.core.errors import UserError


class MissingExtra(UserError):
    """An optional package that a flag or command needs is not installed, or does not
    import; the message names the flag, the package and the command that installs it."""


def install(extra: str) -> str:
    """The command that installs `extra` (plot, eval, hf, tensorboard, wandb, fp8, kernels,
    toml), run from the repository's root as the README's section 1 does."""
    return f'pip install -e ".[{extra}]"'


def install_hint(extra: str, package: str) -> str:
    """How to install an extra: from the checkout (the README's way), or the package alone."""
    return f"{install(extra)} in the checkout, or pip install {package}"


def have(module: str) -> bool:
    """Whether the top-level package `module` is there (found, not imported: see the
    module's docstring for the one use this has)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False


def require(modules: str | tuple[str, ...], what: str, extra: str, package: str,
            error: type[UserError] = MissingExtra, quiet: tuple[str, ...] = (),
            called: str | None = None) -> ModuleType:
    """Import `modules` (the first is returned), as the run will, or raise `error` in one
    line: `what` (the flag or command that needs it) needs `package`, which is not
    installed, or is installed but fails to import (with the import's own reason: the
    two need different fixes). `quiet`: loggers silenced during the import (a package that
    logs warnings about parts this package does not use). `called`: how the message names
    the package, where its pip name says too little (default: `package`)."""
    wanted = (modules,) if isinstance(modules, str) else modules
    called = called or package
    top = wanted[0].split(".")[0]
    names = dict.fromkeys((top, *wanted))  # the package itself first: missing, or broken
    loggers = [logging.getLogger(name) for name in quiet]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        imported = {name: importlib.import_module(name) for name in names}
        return imported[wanted[0]]
    except ImportError as e:
        if e.name == top:
            raise error(f"{what} needs {called}, which is not installed: "
                        f"{install_hint(extra, package)}") from None
        broken: BaseException = e
    except Exception as e:  # noqa: BLE001 - an import can fail in any way
        broken = e
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
    reason = " ".join(str(broken).split())[:200]
    raise error(f"{what} needs {called}, which is installed but fails to import "
                f"({type(broken).__name__}: {reason}): a package it needs is missing or of "
                f"another version; reinstall it: {install_hint(extra, package)}")
