"""The runtime wheel where it is installed: built once from this checkout and
installed into clean virtualenvs. Bare, it is the training client alone (standard library only:
none of the services' dependencies come with it), and each console script names the extra it
needs in one line. With the exporter's extra the exporter's side imports; with the bridge's too,
every ``wandb_infra`` module imports except the dashboard generator, which names its own extra.
Installed generators write only where told, never into site-packages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from wandb_infra.alert_rules import generate as rules
from wandb_infra.common.generated import checkout_root
from wandb_infra.dashboards import generate as dashboards

ROOT = Path(__file__).resolve().parent.parent
# Modules that need an optional extra, and the extra (checked against pyproject.toml).
NEEDS_EXTRA = {"wandb_infra.dashboards.generate": "generate"}
# The services' dependencies, which a training environment must not be made to install.
SERVICE_PACKAGES = {"aiohttp", "requests", "prometheus-client", "orjson"}
DEV_PACKAGES = {"pytest", "hypothesis", "grafana-foundation-sdk", "ruff", "mypy", "wandb"}
# The parts of the product the exporter's extra alone must be enough for.
EXPORTER_SIDE = ("common", "catalog", "exporter", "alert_rules")
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
DISTRIBUTIONS = ("import importlib.metadata as m; "
                 "print(*(d.metadata['Name'] for d in m.distributions()))")


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          check=False, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel and the sdist, built once for every test here by ``make dist`` as the Slurm
    guide runs it."""
    out = tmp_path_factory.mktemp("dist")
    made = _run("make", "-s", "dist", f"DIST={out}", cwd=ROOT)
    assert made.returncode == 0, made.stdout + made.stderr
    (wheel,) = out.glob("wandb_infra_issues-*.whl")
    (sdist,) = out.glob("wandb_infra_issues-*.tar.gz")
    return wheel, sdist


@pytest.fixture(scope="module")
def wheel(dist: tuple[Path, Path]) -> Path:
    return dist[0]


def _install(python: Path, *requirements: str | Path) -> None:
    """This interpreter's pip installs into the clean venv, which then needs no pip of its own
    (seeding one costs more than the install)."""
    done = _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", *requirements)
    assert done.returncode == 0, done.stderr


def _venv(path: Path, *requirements: str | Path) -> Path:
    """A clean virtualenv with ``requirements`` installed; its python."""
    assert _run(sys.executable, "-m", "venv", "--without-pip", path).returncode == 0
    python = path / "bin" / "python"
    _install(python, *requirements)
    return python


def _installed(python: Path) -> set[str]:
    """Normalised names of the distributions installed in that venv."""
    names = _run(python, "-c", DISTRIBUTIONS).stdout.split()
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names}


def _imports(python: Path, cwd: Path) -> dict[str, str]:
    """Every wandb_infra module of that venv -> its import error ('' when it imports)."""
    return json.loads(_run(python, "-c", IMPORT_ALL, cwd=cwd).stdout)


def _asks_for_extra(script: Path, extra: str) -> None:
    out = _run(script, "--help")
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1, out.stderr
    assert f"pip install 'wandb-infra-issues[{extra}]'" in out.stderr, out.stderr


def _files(folder: Path) -> set[Path]:
    """The files below ``folder``, bytecode caches aside."""
    return {p for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.integration
def test_the_bare_wheel_is_the_training_client_alone(wheel, tmp_path):
    python = _venv(tmp_path / "venv", wheel)
    installed = _installed(python)
    assert "wandb-infra-issues" in installed
    assert not installed & (SERVICE_PACKAGES | DEV_PACKAGES), installed
    client = _run(python, "-c", "from wandb_infra.exporter.client import keep_registered, register,"
                  " visible_gpus; print(visible_gpus({'CUDA_VISIBLE_DEVICES': '0,3'}))",
                  cwd=tmp_path)
    assert client.stdout.strip() == "[0, 3]", client.stderr
    _asks_for_extra(tmp_path / "venv" / "bin" / "wandb-infra-exporter", "exporter")
    _asks_for_extra(tmp_path / "venv" / "bin" / "wandb-infra-bridge", "bridge")

    # The rule generator (PyYAML only) refuses a default output where it is installed ...
    package = Path(_run(python, "-c", "import wandb_infra.alert_rules as p; print(p.__file__)"
                        ).stdout.strip()).parent.parent
    before = _files(package.parent)
    refused = _run(python, "-m", "wandb_infra.alert_rules.generate", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--out-dir" in refused.stderr
    assert _files(package.parent) == before and list(tmp_path.glob("alert_rules")) == []
    # ... and writes where told.
    out = tmp_path / "rules"
    told = _run(python, "-m", "wandb_infra.alert_rules.generate", "--out-dir", out, cwd=tmp_path)
    assert told.returncode == 0, told.stderr
    assert "groups:" in (out / "alert_rules" / rules.RULES_FILE).read_text()
    assert _files(package.parent) == before
    # The dashboard generator (its extra is not installed here) finds no checkout either.
    found = _run(python, "-c", "import wandb_infra.dashboards as d; from wandb_infra.common."
                 "generated import checkout_root; print(checkout_root(d.__file__))", cwd=tmp_path)
    assert found.stdout.strip() == "None", found.stderr


@pytest.mark.integration
def test_with_the_extras_every_module_imports(wheel, tmp_path):
    python = _venv(tmp_path / "venv", f"{wheel}[exporter]")
    found = _imports(python, tmp_path)
    assert "wandb_infra.exporter.cli" in found
    broken = {m: e for m, e in found.items() if e and m.split(".")[1] in EXPORTER_SIDE}
    assert broken == {}
    assert _run(tmp_path / "venv" / "bin" / "wandb-infra-exporter", "--help").returncode == 0
    _asks_for_extra(tmp_path / "venv" / "bin" / "wandb-infra-bridge", "bridge")

    _install(python, f"{wheel}[bridge]")
    found = _imports(python, tmp_path)
    assert "wandb_infra.bridge.diagnosis.verdict" in found
    broken = {m: e for m, e in found.items() if e and m not in NEEDS_EXTRA}
    assert broken == {}
    assert _run(tmp_path / "venv" / "bin" / "wandb-infra-bridge", "--help").returncode == 0
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for module, extra in NEEDS_EXTRA.items():
        assert extra in extras, extra
        assert f"pip install 'wandb-infra-issues[{extra}]'" in found[module], found[module]
    # no dev-only package came with the runtime install
    assert not _installed(python) & DEV_PACKAGES


def test_generators_default_to_the_checkout_they_run_from():
    assert rules.CHECKOUT == dashboards.CHECKOUT == ROOT
    assert dashboards.OUT_DIR == ROOT / "dashboards"


def test_a_project_file_of_another_project_is_no_checkout(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert checkout_root(tmp_path / "pkg" / "generate.py") is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "wandb-infra-issues"\n')
    assert checkout_root(tmp_path / "pkg" / "generate.py") == tmp_path


@pytest.mark.parametrize(("generator", "written"), [(rules, "alert_rules/" + rules.RULES_FILE),
                                                     (dashboards, "wandb-run-infra.json")],
                         ids=["rules", "dashboards"])
def test_outside_a_checkout_a_generator_writes_only_where_told(generator, written, tmp_path,
                                                               monkeypatch, capsys):
    monkeypatch.setattr(generator, "CHECKOUT", None)
    monkeypatch.chdir(tmp_path)
    assert generator.main([]) == 2
    assert generator.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.count("pass --out-dir DIR") == 2, err
    assert list(tmp_path.iterdir()) == []
    assert generator.main(["--out-dir", str(tmp_path / "out")]) == 0
    assert generator.main(["--out-dir", str(tmp_path / "out"), "--check"]) == 0
    assert (tmp_path / "out" / written).is_file()


@pytest.mark.integration
def test_make_dist_builds_an_sdist_that_builds_the_same_wheel(dist, tmp_path):
    """The sdist ``make dist`` writes builds the same wheel (the same files) as the one the
    tests above install with both services' extras."""
    wheel, sdist = dist
    rebuilt = tmp_path / "from-sdist"
    built = _run(sys.executable, "-m", "pip", "wheel", sdist, "--no-deps", "-q", "-w", rebuilt)
    assert built.returncode == 0, built.stderr
    (again,) = rebuilt.glob("wandb_infra_issues-*.whl")
    assert _zip_names(again) == _zip_names(wheel)


def _zip_names(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}
