#!/usr/bin/env bash
# The Python that runs the trainer, for the launch scripts (they source this file); run it
# directly to see which one they would use.
#
# In order: $PYTHON if set; the active virtual environment's ($VIRTUAL_ENV/bin/python),
# because a shell, sudo or a batch system can put another python3 first on PATH; else
# python3 on PATH. It must import torch: if not, one line names the interpreter and how to
# choose another (PYTHON=/path/to/python). Sets and exports PYTHON to the resolved path,
# and says on stderr which one it is.

find_python() {
  local how found version
  if [ -n "${PYTHON:-}" ]; then
    how="PYTHON"
  elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    PYTHON="$VIRTUAL_ENV/bin/python" how="the active virtual environment"
  else
    PYTHON=python3 how="python3 on PATH"
  fi
  local hint="activate the environment that has torch, or set PYTHON=/path/to/python"
  # The repository's own environment (CI's, and a common place for one) as the example.
  local repo_venv
  repo_venv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python"
  if [ -x "$repo_venv" ] && [ "$PYTHON" != "$repo_venv" ]; then
    hint="$hint (e.g. PYTHON=$repo_venv)"
  fi
  if ! found="$(command -v "$PYTHON")"; then
    echo "error: $PYTHON ($how) not found: $hint" >&2
    exit 2
  fi
  if ! version="$("$found" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
    echo "error: $found ($how) cannot import torch: $hint" >&2
    exit 2
  fi
  PYTHON="$found"
  export PYTHON
  echo "python: $PYTHON (torch $version; $how)" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
  set -euo pipefail
  find_python
fi
