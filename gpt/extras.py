"""The optional extras (pyproject.toml's [project.optional-dependencies]): how to install
one, in the words the README uses (an editable install from the checkout), and whether a
package is there, found without importing it (an import of torchao, lm-eval or
matplotlib takes seconds), so that a command can name a missing extra before it loads
torch or a model."""

from __future__ import annotations

import importlib.util


def install(extra: str) -> str:
    """The command that installs `extra` (plot, eval, hf, tensorboard, wandb, fp8, kernels,
    toml), run from the repository's root as the README's section 1 does."""
    return f'pip install -e ".[{extra}]"'


def have(module: str) -> bool:
    """Whether the top-level package `module` can be imported (only found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False
