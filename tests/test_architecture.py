"""The dependency picture of docs/architecture.md, enforced on the import statements."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("exporter", "bridge", "alert_rules", "dashboards", "demo", "bench", "tests")
PRODUCT = ("exporter", "bridge", "alert_rules", "dashboards")
# Known exceptions (docs/architecture.md): may only shrink.
BRIDGE_FROM_EXPORTER = {"exporter.configfile", "exporter.logsetup", "exporter.model",
                        "exporter.sources",
                        "exporter.sources.kubernetes", "exporter.sources.nodestate"}


def _layer(module: str) -> str:
    return "bridge.catalog" if module.startswith("bridge.catalog") else module.partition(".")[0]


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every absolute import of our packages."""
    out = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and node.level == 0 else
                         [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                out += [(module, n) for n in names if n.partition(".")[0] in PACKAGES]
    return out


def test_exporter_imports_nothing_else_of_ours():
    assert [(m, n) for m, n in _imports()
            if _layer(m) == "exporter" and _layer(n) != "exporter"] == []


def test_catalog_imports_only_the_label_contract():
    assert [(m, n) for m, n in _imports() if _layer(m) == "bridge.catalog"
            and _layer(n) != "bridge.catalog" and n not in ("exporter", "exporter.labels")] == []


def test_rules_and_dashboards_never_import_the_bridge_runtime():
    bad = [(m, n) for m, n in _imports() if _layer(m) in ("alert_rules", "dashboards")
           and _layer(n) in ("bridge", "demo", "bench", "tests")]
    assert bad == []


def test_bridge_runtime_imports_only_the_catalog_and_the_known_exporter_modules():
    bad = [(m, n) for m, n in _imports() if _layer(m) == "bridge"
           and _layer(n) not in ("bridge", "bridge.catalog")
           and n not in BRIDGE_FROM_EXPORTER | {"exporter", "exporter.labels"}]
    assert bad == []


def test_the_product_never_imports_demo_bench_or_tests():
    bad = [(m, n) for m, n in _imports() if _layer(m) in PRODUCT
           and _layer(n) in ("demo", "bench", "tests")]
    assert bad == []


def test_known_exceptions_are_still_needed():
    """An exception nobody uses any more must leave the list (it may only shrink)."""
    used = {n for m, n in _imports() if _layer(m) == "bridge" and n in BRIDGE_FROM_EXPORTER}
    assert used == BRIDGE_FROM_EXPORTER
