#!/usr/bin/env bash
# Creates the project's virtualenv (Python >= 3.11) and installs the project with its dev extras.
set -euo pipefail
python="${1:-python3}"
venv="${2:-.venv}"
"$python" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Python >= 3.11 is required, found {sys.version.split()[0]}")
PY
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e '.[dev]'
