"""The runtime wheel where it is installed (issue 25 item 6): built from this checkout, installed
with only its runtime dependencies into a clean virtualenv, every ``wandb_infra`` module
imports, except the dashboard generator, which says in one line which extra it needs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
# Modules that need an optional extra, and the extra (checked against pyproject.toml).
NEEDS_EXTRA = {"wandb_infra.dashboards.generate": "generate"}
IMPORT_ALL = """
import importlib, json, pkgutil, wandb_infra
out = {}
for m in pkgutil.walk_packages(wandb_infra.__path__, "wandb_infra."):
    try:
        importlib.import_module(m.name)
        out[m.name] = ""
    except Exception as exc:
        out[m.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          check=False, **kw)  # type: ignore[call-overload]


def test_the_built_wheel_imports_in_a_clean_venv(tmp_path):
    built = _run(sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "-q", "-w",
                 tmp_path / "dist")
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("wandb_infra_issues-*.whl")
    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    installed = _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)
    assert installed.returncode == 0, installed.stderr
    found = json.loads(_run(venv / "bin" / "python", "-c", IMPORT_ALL, cwd=tmp_path).stdout)
    assert "wandb_infra.bridge.diagnosis.verdict" in found
    assert "wandb_infra.exporter.client" in found
    broken = {m: e for m, e in found.items() if e and m not in NEEDS_EXTRA}
    assert broken == {}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for module, extra in NEEDS_EXTRA.items():
        assert extra in extras, extra
        assert f"pip install 'wandb-infra-issues[{extra}]'" in found[module], found[module]
    # no dev-only package came with the runtime install
    frozen = {line.split("==")[0].split(" @ ")[0].lower() for line in _run(
        venv / "bin" / "python", "-m", "pip", "freeze").stdout.splitlines()}
    assert not frozen & {"pytest", "hypothesis", "grafana-foundation-sdk", "ruff", "mypy",
                         "wandb"}, frozen
