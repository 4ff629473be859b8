"""Every generated file is what its generator produces now, checked in one place.

The generators run in dry mode, chained in memory the way ``make generate`` chains them on disk
(the Kubernetes copies are rendered from the rule and dashboard generators' output, not from the
committed files), so one failure lists every stale file: the rule file, PrometheusRule, counters
CSV, runbook and mixin JSON (``alert_rules/generate.py``), the dashboards, the Kubernetes manifests
(``deploy/kubernetes/render.py``), the promtool cases (``tests/rules/build.py``) and the tables of
docs/restart.md and docs/figures.md (``tests/readme_tables.py``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests import readme_tables
from tests.rules import build
from wandb_infra.alert_rules import generate as rules
from wandb_infra.common import generated
from wandb_infra.dashboards import generate as dashboards

ROOT = Path(__file__).resolve().parent.parent


def _render_script() -> ModuleType:
    """``deploy/kubernetes/render.py``, a script beside the manifests it renders (no package)."""
    spec = importlib.util.spec_from_file_location(
        "k8s_render", ROOT / "deploy" / "kubernetes" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected() -> dict[Path, str]:
    """Every generated file (absolute path) and the text its generator produces now."""
    cfg = rules.options(rules.parse_args([]))
    out = {ROOT / rel: text for rel, text in rules.outputs(cfg).items()}
    boards = dashboards.render()
    out.update(boards)
    manifest = out[ROOT / "alert_rules" / rules.MANIFEST_FILE]
    out.update(_render_script().render({p.name: t for p, t in boards.items()}, manifest))
    out.update({build.HERE / name: text for name, text in build.files(build.default_cfg()).items()})
    out.update(readme_tables.files())
    return out


def stale(texts: dict[Path, str] | None = None) -> list[str]:
    """The generated files (relative paths) whose committed text differs from ``texts``
    (default: ``expected()`` now)."""
    return sorted(str(path.relative_to(ROOT))
                  for path in generated.stale(expected() if texts is None else texts))


@pytest.fixture(scope="module")
def generated_now() -> dict[Path, str]:
    """``expected()`` once for the tests that only read it (every generator runs: seconds)."""
    return expected()


@pytest.mark.integration
def test_every_generated_file_is_current(generated_now):
    out_of_date = stale(generated_now)
    assert not out_of_date, "out of date (run: make generate):\n  " + "\n  ".join(out_of_date)


@pytest.mark.integration
def test_a_stale_input_names_each_file_built_from_it(monkeypatch):
    """A changed rule manifest is stale in alert_rules/ and in its Kubernetes copy, both named."""
    real = rules.manifest_text
    monkeypatch.setattr(rules, "manifest_text", lambda cfg: real(cfg) + "# changed\n")
    assert stale() == ["alert_rules/wandb-infra.prometheusrule.yaml",
                       "deploy/kubernetes/generated/prometheusrule.yaml"]


@pytest.mark.integration
def test_the_check_covers_every_kind_of_generated_file(generated_now):
    covered = {str(p.relative_to(ROOT)) for p in generated_now}
    for rel in ("alert_rules/wandb-infra.rules.yml", "alert_rules/wandb-infra.prometheusrule.yaml",
                "alert_rules/dcgm-counters.csv", "docs/runbook.md", "mixin/rules.json",
                "deploy/kubernetes/generated/prometheusrule.yaml",
                "deploy/kubernetes/generated/dashboards.configmap.yaml",
                "tests/rules/node_alerts.test.yml", "docs/restart.md", "docs/figures.md"):
        assert rel in covered, rel
    assert {p.name for p in (ROOT / "dashboards").glob("*.json")} <= {Path(p).name for p in covered}
    assert {p.name for p in (ROOT / "tests" / "rules").glob("*.test.yml")} <= {
        Path(p).name for p in covered}


@pytest.mark.integration
def test_generation_is_deterministic(generated_now):
    assert expected() == generated_now


@pytest.mark.parametrize("main", [rules.main, dashboards.main, build.main,
                                  _render_script().main], ids=["rules", "dashboards",
                                                               "promtool-cases", "kubernetes"])
def test_each_generator_check_mode_writes_nothing_and_passes(main, capsys):
    assert main(["--check"]) == 0, capsys.readouterr().err


@pytest.mark.integration
def test_the_figures_table_follows_bench_results(tmp_path):
    """The figures table is bench/results.json as rendered now: a changed result makes the
    committed docs/figures.md stale, and the table holds every row with its value."""
    rows = json.loads(readme_tables.RESULTS.read_text())
    assert readme_tables.figures() in readme_tables.FIGURES.read_text(encoding="utf-8")
    changed = tmp_path / "results.json"
    changed.write_text(json.dumps([{**rows[0], "value": 123.5, "met": False}, *rows[1:]]))
    table = readme_tables.figures(changed)
    assert f"| {rows[0]['name']} | 123.5 | {rows[0]['unit']} |" in table
    assert table.count("\n| ") == len(rows) + 1  # the header and one line per result
    committed = readme_tables.FIGURES.read_text(encoding="utf-8")
    assert readme_tables.figures_page(committed, changed) != committed
