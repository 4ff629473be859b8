#!/usr/bin/env bash
# Creates the project's virtualenv (Python >= 3.11) and installs the project with the exporter's and
# the bridge's extras (a bare install is the training client only) and the dev tools.
# The editable install is 'strict': build/__editable__.*/wandb_infra/ links each packaged file, so
# mypy and Python see the same wandb_infra.* namespace (a new module needs `make venv` again; the
# Makefile's stamp covers the list of packaged files, so make does that by itself).
# pip's output goes to $venv/install.log and is shown only when the install fails.
# --no-compile: pip would byte-compile every installed package up front (about half of the
# install's 56 s on 2 cores); Python writes the caches of the modules it imports on first use.
set -euo pipefail
python="${1:-python3}"
venv="${2:-.venv}"
"$python" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Python >= 3.11 is required, found {sys.version.split()[0]}")
PY
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
echo "installing the project and its test tools into $venv ..." >&2
if ! { "$venv/bin/python" -m pip install -q --upgrade pip \
       && "$venv/bin/python" -m pip install -q --no-compile -e '.[bridge,exporter,dev]' \
            --config-settings editable_mode=strict; } >"$venv/install.log" 2>&1; then
  cat "$venv/install.log" >&2
  exit 1
fi
