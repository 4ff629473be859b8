"""Which W&B run (and which host/GPU) an alert is about: the contract labels each alert carries.

Identity is read from each alert's own labels, never from ``commonLabels``, which Alertmanager
computes over the alerts it kept after ``max_alerts`` truncation. Rules that name the run, host
or GPU differently map their labels onto the contract's with Prometheus'
``alert_relabel_configs`` before the alerts leave Prometheus. The rules attribute alerts to runs
(the exporter's join metrics, in PromQL); an alert without run labels stays unattributed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from wandb_infra.bridge.ingest.payload import Alert
from wandb_infra.common import labels as L
from wandb_infra.common.runkey import RunKey

UNATTRIBUTED = RunKey()


class Identity(NamedTuple):
    """Where an alert happened and which run it hit (a tuple: built once per alert of a
    storm, and a frozen dataclass costs three times as much)."""

    run: RunKey
    hostname: str
    gpu: str


def read(labels: Mapping[str, str]) -> Identity:
    """The run (possibly unattributed), hostname and GPU named by an alert's labels."""
    return read_all([labels])[0]


def read_all(alerts: Iterable[Alert | Mapping[str, str]]) -> list[Identity]:
    """``read`` of every alert (or label set) of a notification, with one RunKey per run: a
    storm's notification names thousands of alerts of a few runs."""
    runs: dict[tuple[str, str, str], RunKey] = {}
    out = []
    for alert in alerts:
        labels = alert.labels if isinstance(alert, Alert) else alert
        key = (labels.get(L.ENTITY, ""), labels.get(L.PROJECT, ""), labels.get(L.RUN_ID, ""))
        run = runs.get(key)
        if run is None:
            run = runs[key] = RunKey(*key) if all(key) else UNATTRIBUTED
        out.append(Identity(run, labels.get(L.HOSTNAME, ""), labels.get(L.GPU, "")))
    return out
