"""The dependency picture of docs/architecture.md, enforced on the import statements."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "wandb_infra"
# The installed packages (folder -> wandb_infra.<folder>) and what each may import, lowest first.
PRODUCT: dict[str, set[str]] = {
    "common": set(),
    "catalog": {"common"},
    "exporter": {"common"},
    "alert_rules": {"common", "catalog"},
    "dashboards": {"common", "catalog", "alert_rules"},
    "bridge": {"common", "catalog"},
}
# Run from a checkout, never installed; each may import the product and the tools listed.
TOOLS: dict[str, set[str]] = {
    "harness": set(),
    "demo": {"harness"},
    "bench": {"harness", "demo"},
    "tests": {"harness", "demo"},
}
FOLDERS = (*PRODUCT, *TOOLS)
# Inside the bridge, lowest first: each part imports only the parts before it (and itself). The
# entry points (cli, config, service and the *_cli commands) sit above all of them; ``metrics``
# (the bridge's own counters) is a leaf every part may count into.
BRIDGE_PARTS = ("metrics", "diagnosis", "joblog", "ingest", "prometheus", "quarantine", "runs",
                "projection", "web")
BRIDGE_ENTRY_POINTS = {"cli", "config", "service", "explain_cli", "quarantine_cli", "view_cli",
                       "selftest_cli"}


def _layer(module: str) -> str:
    """The folder a module lives in (``wandb_infra.bridge.x`` -> ``bridge``)."""
    head, _, rest = module.partition(".")
    return rest.partition(".")[0] if head == NAMESPACE else head


def _modules(folder: str) -> list[tuple[str, Path]]:
    return [(".".join(path.relative_to(ROOT).with_suffix("").parts), path)
            for path in sorted((ROOT / folder).rglob("*.py"))]


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every absolute import of ours."""
    out = []
    for folder in FOLDERS:
        for module, path in _modules(folder):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and node.level == 0 else
                         [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                out += [(module, n) for n in names
                        if n.partition(".")[0] in (NAMESPACE, *FOLDERS)]
    return out


IMPORTS = _imports()


@pytest.mark.parametrize("folder", PRODUCT)
def test_each_product_package_imports_only_the_layers_below_it(folder):
    allowed = PRODUCT[folder] | {folder}
    bad = [(m, n) for m, n in IMPORTS if _layer(m) == folder and _layer(n) not in allowed]
    assert bad == []


def _bridge_part(module: str) -> str:
    """The part of the bridge a module belongs to (``wandb_infra.bridge.web.pages`` -> ``web``);
    the entry points are ``run``."""
    parts = module.split(".")
    if parts[0] == NAMESPACE:
        parts = parts[1:]
    part = parts[1] if len(parts) > 1 else ""
    return "run" if part in BRIDGE_ENTRY_POINTS else part


def test_bridge_parts_import_one_way():
    """Lower parts never import higher ones, and nothing but the entry points imports them."""
    order = {part: i for i, part in enumerate(BRIDGE_PARTS)} | {"run": len(BRIDGE_PARTS)}
    edges = [(_bridge_part(m), _bridge_part(n)) for m, n in IMPORTS
             if _layer(m) == "bridge" and _layer(n) == "bridge"]
    assert {p for edge in edges for p in edge} <= set(order), edges
    bad = sorted({(a, b) for a, b in edges if order[b] > order[a]})
    assert bad == []


def test_pages_read_runs_only_through_the_run_service():
    """One assembly path: the web part renders run views (``bridge/runs``) and never imports
    the diagnosis or the W&B projection to build a run's story a second way, nor a reader of
    Prometheus, the job log or the quarantine (a page shows what the worker stored)."""
    bad = sorted({(m, n) for m, n in IMPORTS if _bridge_part(m) == "web"
                  and _bridge_part(n) in ("diagnosis", "projection", "prometheus", "joblog",
                                          "quarantine")})
    assert bad == []


def test_every_bridge_module_lives_in_a_part():
    """The bridge's top level holds only its entry points and the metrics leaf; each part is a
    subpackage whose docstring says its job."""
    top = {p.stem for p in (ROOT / "bridge").glob("*.py")} - {"__init__"}
    assert top == BRIDGE_ENTRY_POINTS | {"metrics"}
    for part in BRIDGE_PARTS[1:]:
        init = ROOT / "bridge" / part / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), part


@pytest.mark.parametrize("folder", TOOLS)
def test_each_tool_imports_the_product_and_only_the_tools_below_it(folder):
    allowed = TOOLS[folder] | {folder} | set(PRODUCT)
    bad = [(m, n) for m, n in IMPORTS if _layer(m) == folder and _layer(n) not in allowed]
    assert bad == []


def test_the_product_is_imported_through_its_namespace_only():
    """``import bridge`` would resolve to the checkout, not the install: never by that name."""
    bad = [(m, n) for m, n in IMPORTS if n.partition(".")[0] in PRODUCT]
    assert bad == []


def test_the_installed_packages_are_exactly_the_product_folders():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {f"{NAMESPACE}.{f}": f for f in PRODUCT}
    packages = {f"{NAMESPACE}.{'.'.join(p.parent.relative_to(ROOT).parts)}"
                for f in PRODUCT for p in (ROOT / f).rglob("__init__.py")}
    assert set(setuptools["packages"]) == packages
    assert all((ROOT / f / "py.typed").exists() for f in PRODUCT)


def test_nothing_edits_sys_path_or_imports_late():
    late = re.compile(r"sys\.path\.(insert|append)|noqa: E" + "402")
    bad = [str(path.relative_to(ROOT)) for folder in FOLDERS
           for _, path in _modules(folder) if late.search(path.read_text())]
    assert bad == []
