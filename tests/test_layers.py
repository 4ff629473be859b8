"""The unit layer (``make test-fast``, ``pytest -m unit``) is in-process: a test that starts a
real binary, a subprocess or the wandb SDK must carry an integration, slurm or e2e mark, on
itself, its class or its module. Marks are per test so a file's in-process tests stay in the
unit layer when one of its tests spawns a process.

Which tests start processes is found by following each test's code: its body, the fixtures it
takes (and the module's autouse fixtures), and every helper it calls that is defined in the
test module or imported from ``tests`` or ``harness``, down to a process starter."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
LAYERS = ("integration", "slurm", "e2e")
# Helper packages followed into (the product is not: its process starters are injected in tests).
FOLLOWED = ("tests", "harness", "demo")
# Product folders whose command runners default to ``subprocess.run``: calling one of those
# without a ``runner=`` runs a real command.
PRODUCT = ("exporter", "bridge", "common")
# Names that start a process wherever they are referenced; ``SdkMarkerWriter`` starts the real
# wandb SDK, whose ``wandb.init`` spawns the SDK's service process.
STARTER_NAMES = frozenset({"subprocess", "Popen", "create_subprocess_exec",
                           "create_subprocess_shell", "multiprocessing", "SdkMarkerWriter"})
# Tests the static reading over-approximates, each with why no process starts.
IN_PROCESS = {
    "test_exporter_parsing.py::test_slurm_source_config_errors":
        "each config is refused in the constructor, before any command runs",
}
STARTER_MODULES = frozenset({"subprocess", "multiprocessing", "wandb"})
STARTER_ATTRS = frozenset({"Popen", "create_subprocess_exec", "create_subprocess_shell", "fork",
                           "system", "spawnv", "execv"})


def default_runners() -> frozenset[str]:
    """Product classes and functions taking ``runner`` with ``subprocess.run`` as its default."""
    found = set()
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            for cls in ast.walk(ast.parse(path.read_text())):
                if not isinstance(cls, (ast.Module, ast.ClassDef)):
                    continue
                for fn in cls.body:
                    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    args = fn.args.args + fn.args.kwonlyargs
                    defaults = [*fn.args.defaults, *[d for d in fn.args.kw_defaults if d]]
                    if "runner" in {a.arg for a in args} and "subprocess.run" in {
                            ast.unparse(d) for d in defaults}:
                        found.add(cls.name if isinstance(cls, ast.ClassDef)
                                  and fn.name == "__init__" else fn.name)
    return frozenset(found)


RUNS_COMMANDS = default_runners()


class Module:
    """One parsed Python file: its top-level definitions and where its imported names live."""

    _cache: dict[Path, Module] = {}

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name -> (module, name)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = node
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0], None)

    @classmethod
    def load(cls, dotted: str) -> Module | None:
        """The module ``dotted`` if it is one of the followed helper packages, else None."""
        if dotted.split(".", maxsplit=1)[0] not in FOLLOWED:
            return None
        base = ROOT.joinpath(*dotted.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                if path not in cls._cache:
                    cls._cache[path] = cls(path)
                return cls._cache[path]
        return None

    def resolve(self, name: str) -> tuple[Module, ast.AST] | Module | None:
        """Where ``name`` used in this module is defined, if that is followed code."""
        if name in self.defs:
            return self, self.defs[name]
        if name in self.imports:
            module, attr = self.imports[name]
            if attr is None:
                return Module.load(module)
            target = Module.load(module)
            if target is not None and attr in target.defs:
                return target, target.defs[attr]
            return Module.load(f"{module}.{attr}")
        return None


def _is_fixture(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        "fixture" in ast.unparse(d) for d in node.decorator_list)


def _autouse(module: Module) -> list[ast.AST]:
    return [n for n in module.defs.values()
            if _is_fixture(n) and any("autouse=True" in ast.unparse(d)
                                      for d in n.decorator_list)]  # type: ignore[attr-defined]


def starts_process(module: Module, roots: list[ast.AST]) -> str | None:
    """The first process starter reached from ``roots`` (code in ``module``), or None."""
    seen: set[int] = set()
    todo = [(module, root) for root in roots]
    classes: list[tuple[Module, ast.ClassDef]] = []
    attrs: set[str] = set()  # attribute names used: the methods of reached classes it may call
    while todo:
        mod, node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ast.ClassDef):
            classes.append((mod, node))
        for sub in _own_code(node):
            names: list[str] = []
            if isinstance(sub, ast.Call) and not any(k.arg == "runner" for k in sub.keywords):
                func = ast.unparse(sub.func).rsplit(".", 1)[-1]
                if func in RUNS_COMMANDS:
                    return f"{mod.path.name}: {func} with its default runner"
            if isinstance(sub, ast.Name):
                if sub.id in STARTER_NAMES:
                    return f"{mod.path.name}: {sub.id}"
                names.append(sub.id)
            elif isinstance(sub, ast.Attribute):
                if sub.attr in STARTER_ATTRS or sub.attr in STARTER_NAMES:
                    return f"{mod.path.name}: .{sub.attr}"
                if isinstance(sub.value, ast.Name) and sub.value.id == "wandb" and \
                        sub.attr == "init":
                    return f"{mod.path.name}: wandb.init"
                if isinstance(sub.value, ast.Name):
                    target = mod.resolve(sub.value.id)
                    if isinstance(target, Module) and sub.attr in target.defs:
                        todo.append((target, target.defs[sub.attr]))
            elif isinstance(sub, ast.arg):
                names.append(sub.arg)  # a fixture it takes
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                names.append(sub.value)  # usefixtures("name")
            for name in names:
                if mod.imports.get(name, ("",))[0].split(".")[0] in STARTER_MODULES:
                    return f"{mod.path.name}: {name}"
                found = mod.resolve(name)
                if isinstance(found, tuple):
                    todo.append(found)
            if isinstance(sub, ast.Attribute):
                attrs.add(sub.attr)
        if not todo:
            todo = [(cmod, meth) for cmod, cls in classes for meth in cls.body
                    if isinstance(meth, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and meth.name in attrs and id(meth) not in seen]
    return None


def _own_code(node: ast.AST) -> list[ast.AST]:
    """The nodes of ``node`` that run when it is used: a class's body and special methods, not
    its other methods (those are followed only when called by attribute name)."""
    if not isinstance(node, ast.ClassDef):
        return list(ast.walk(node))
    parts = [n for n in node.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             or n.name.startswith("__")]
    return [sub for part in [*node.bases, *node.decorator_list, *parts]
            for sub in ast.walk(part)]


def _layered(marks: list[ast.expr]) -> bool:
    """Whether these decorators or ``pytestmark`` values hold ``pytest.mark.<layer>``."""
    return any(isinstance(sub, ast.Attribute) and sub.attr in LAYERS
               and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
               for mark in marks for sub in ast.walk(mark))


def _class_marks(cls: ast.ClassDef) -> bool:
    body = [n.value for n in cls.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)]
    return _layered(cls.decorator_list) or _layered(body)


def collected_tests(module: Module) -> list[tuple[str, ast.AST, bool]]:
    """Each test function: its name, its node and whether it carries a layer mark."""
    module_marked = _layered([n.value for n in module.tree.body if isinstance(n, ast.Assign)
                              and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                      for t in n.targets)])
    found: list[tuple[str, ast.AST, bool]] = []
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test"):
            found.append((node.name, node, module_marked or _layered(node.decorator_list)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            marked = module_marked or _class_marks(node)
            for meth in node.body:
                if isinstance(meth, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        meth.name.startswith("test"):
                    found.append((f"{node.name}.{meth.name}", meth,
                                  marked or _layered(meth.decorator_list)))
    return found


def unmarked_process_tests(path: Path) -> list[str]:
    """Tests in ``path`` that start a process but would run in the unit layer."""
    module = Module(path)
    autouse = _autouse(module)
    bad = []
    for name, node, marked in collected_tests(module):
        if not marked:
            starter = starts_process(module, [node, *autouse])
            if starter and f"{path.name}::{name}" not in IN_PROCESS:
                bad.append(f"{path.name}::{name} ({starter})")
    return bad


def test_tests_starting_processes_are_not_in_the_unit_layer():
    unmarked = [bad for path in sorted(TESTS.glob("test_*.py")) if path != Path(__file__)
                for bad in unmarked_process_tests(path)]
    assert not unmarked, "mark these @pytest.mark.integration:\n" + "\n".join(unmarked)


@pytest.mark.parametrize("source, leaks", [
    # directly, through a helper, through a fixture, through a harness starter, the SDK
    ("import subprocess\ndef test_a():\n    subprocess.run(['true'])\n", True),
    ("import subprocess\ndef go():\n    subprocess.run(['true'])\ndef test_a():\n    go()\n",
     True),
    ("import pytest, subprocess\n@pytest.fixture\ndef svc():\n    yield subprocess.Popen(['x'])\n"
     "def test_a(svc):\n    pass\n", True),
    ("from harness.processes import prometheus\ndef test_a(tmp_path):\n"
     "    prometheus('', tmp_path)\n", True),
    ("from wandb_infra.bridge.projection.markers import SdkMarkerWriter\ndef test_a():\n"
     "    SdkMarkerWriter('u', 'k', 'd')\n", True),
    # marked on the test or its module, or in-process: in order
    ("import pytest, subprocess\n@pytest.mark.integration\ndef test_a():\n"
     "    subprocess.run(['true'])\n", False),
    ("import pytest, subprocess\npytestmark = pytest.mark.slurm\ndef test_a():\n"
     "    subprocess.run(['true'])\n", False),
    ("import subprocess\ndef test_a():\n    assert 1\ndef helper():\n    subprocess.run([])\n",
     False),
])
def test_the_check_finds_unmarked_process_starters(tmp_path: Path, source: str, leaks: bool):
    path = tmp_path / "test_probe.py"
    path.write_text(textwrap.dedent(source))
    assert bool(unmarked_process_tests(path)) is leaks
