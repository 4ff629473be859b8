"""The unit layer (``make test-fast``) starts no real binary: a test module that uses one of
the helpers starting binaries or subprocesses must mark itself integration, slurm or e2e."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Helpers and names that start a real binary or one of our services as a process.
STARTS_BINARIES = re.compile(
    r"PROMTOOL|AMTOOL|JSONNET|VMALERT|CHROMIUM|\bprometheus\(|\balertmanager\(|slurm_cluster|"
    r"cdp_browser|running_exporter|bridge_process|start_bridge|Popen|\bStack\(|\bsubprocess\b|"
    r"processes\.running")


def _marks(tree: ast.Module) -> str:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return ast.unparse(node.value)
    return ""


def test_modules_starting_binaries_are_not_in_the_unit_layer():
    unmarked = []
    for path in sorted(TESTS.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        if STARTS_BINARIES.search(text):
            marks = _marks(ast.parse(text))
            if not any(layer in marks for layer in ("integration", "slurm", "e2e")):
                unmarked.append(path.name)
    assert not unmarked, f"mark these pytestmark = pytest.mark.integration: {unmarked}"
