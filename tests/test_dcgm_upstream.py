"""The shipped counters file and every dcgm field the rules and dashboards read, checked against
what upstream dcgm-exporter and go-dcgm accept (vendored under tests/data/dcgm, see its README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.gocsv import CsvError, dcgm_counters, read_all
from wandb_infra.alert_rules import generate

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "dcgm"
COUNTERS = ROOT / "alert_rules" / generate.COUNTERS_FILE
# Prometheus types dcgm-exporter accepts (internal/pkg/counters/variables.go, promMetricType).
PROM_TYPES = {"gauge", "counter", "histogram", "summary", "label"}
# Fields dcgm-exporter computes itself (internal/pkg/counters/const.go).
EXPORTER_FIELDS = {"DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_XID_ERRORS_COUNT",
                   "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS"}
DCGM_NAME = re.compile(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+")


def _go_dcgm() -> dict[str, tuple[int, str]]:
    """name -> (field id, "current" or "legacy") as go-dcgm's GetFieldID resolves it."""
    out = {}
    for line in (DATA / "go-dcgm-field-names.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, field_id, which = line.split()
            out[name] = (int(field_id), which)
    return out


FIELDS = _go_dcgm()


def _read_by_us() -> set[str]:
    """Every dcgm metric name the shipped rules and dashboards query."""
    texts = [(ROOT / "alert_rules" / generate.RULES_FILE).read_text()]
    texts += [p.read_text() for p in (ROOT / "dashboards").glob("*.json")]
    return {name for text in texts for name in DCGM_NAME.findall(text)}


@pytest.mark.parametrize("name", ["default-counters.csv", "dcp-metrics-included.csv"])
def test_reader_accepts_upstream_counters_files(name):
    records = dcgm_counters((DATA / name).read_text())
    assert len(records) > 10
    assert all(kind in PROM_TYPES for _, kind, _ in records)


@pytest.mark.parametrize(("text", "error"), [
    ("A, gauge, ok\nB, counter, Throttling (ns since DCGM 4.1, us before).\n",
     "record on line 2: wrong number of fields"),
    ('A, gauge, "quoted after a space"\n', 'bare " in non-quoted-field'),
    ('A, gauge, 5" display\n', 'bare " in non-quoted-field'),
    ('A, gauge,"closed" early\n', 'extraneous or missing " in quoted-field'),
])
def test_reader_rejects_what_go_rejects(text, error):
    with pytest.raises(CsvError, match=re.escape(error)):
        read_all(text)


def test_reader_quoting_and_comments():
    text = '# comment, with comma\n\nA,gauge,"help, with ""quotes"""\r\nB, counter, plain\n'
    assert read_all(text) == [["A", "gauge", 'help, with "quotes"'], ["B", " counter", " plain"]]


def test_shipped_counters_file_loads_in_dcgm_exporter():
    records = dcgm_counters(COUNTERS.read_text())
    assert records, "no counters"
    for field, kind, help_text in records:
        assert kind in PROM_TYPES, field
        assert field in FIELDS or field in EXPORTER_FIELDS, f"{field} unknown to go-dcgm"
        assert help_text
    assert "--xid-count-window-size" in COUNTERS.read_text()


def test_generator_refuses_help_text_go_cannot_read(monkeypatch):
    monkeypatch.setattr(generate, "DCGM_COUNTERS",
                        (("DCGM_FI_DEV_GPU_TEMP", "gauge", "in C, or F"),))
    with pytest.raises(ValueError, match="no commas"):
        generate.counters_text()


def test_every_field_we_read_exists_upstream():
    unknown = {n for n in _read_by_us() if n not in FIELDS and n not in EXPORTER_FIELDS}
    assert not unknown


def test_old_and_new_names_both_read():
    """For every legacy name we read, go-dcgm's current name for that field is read too, so
    the rules work whichever name the exporter's counters file uses."""
    read = _read_by_us()
    current = {}
    for name, (field_id, which) in FIELDS.items():
        if which == "current":
            current.setdefault(field_id, set()).add(name)
    missing = {name: sorted(current.get(FIELDS[name][0], set()) - read)
               for name in read if name in FIELDS and FIELDS[name][1] == "legacy"}
    assert not {k: v for k, v in missing.items() if v}


def test_every_field_we_read_is_exported_by_our_counters_file():
    """Each field the rules read is in the shipped counters file, under its own name or an
    alias with the same field id (dcgm-exporter exports the name the file gives)."""
    shipped = {FIELDS[f][0] for f, _, _ in dcgm_counters(COUNTERS.read_text()) if f in FIELDS}
    shipped_exp = {f for f, _, _ in dcgm_counters(COUNTERS.read_text())}
    missing = {n for n in _read_by_us()
               if (n in FIELDS and FIELDS[n][0] not in shipped)
               or (n in EXPORTER_FIELDS and n not in shipped_exp)}
    assert not missing
