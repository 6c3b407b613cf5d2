#!/usr/bin/env bash
# Create the project virtualenv: torch (CPU build 2.13.0 unless a torch is already
# importable by the system Python, e.g. on a GPU machine) plus oomsight with every extra.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
if "$PYTHON" -c 'import torch' 2>/dev/null; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
else
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check 'torch==2.13.0'
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev,sidecar,dashboards]'
