"""Run views built straight from a diagnosis, for tests of the surfaces that render them."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from harness.processes import Reply, http_stub
from wandb_infra.bridge.diagnosis.impact import Impact
from wandb_infra.bridge.diagnosis.outcome import Outcome
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Diagnosis
from wandb_infra.bridge.ingest.outbox import OutboxRow
from wandb_infra.bridge.projection.delivery import DeliveryWorker
from wandb_infra.bridge.projection.notes import BEGIN, END
from wandb_infra.bridge.prometheus.confirm import Confirmation
from wandb_infra.bridge.prometheus.remediation import NodeStateHistory, Remediation
from wandb_infra.bridge.quarantine.actuator import build as build_quarantine
from wandb_infra.bridge.runs.service import RunService, offer_to_quarantine
from wandb_infra.bridge.runs.view import IssueView, RunView
from wandb_infra.common.runkey import RunKey

RUN = RunKey("team", "proj", "r")


def view_of(diagnosis: Diagnosis, remediations: Mapping[str, Remediation] | None = None,
            outcome: Outcome | None = None, impacts: Mapping[str, Impact] | None = None, *,
            run: RunKey = RUN, delivery: OutboxRow | None = None) -> RunView:
    """The view of a run with this diagnosis and what else is given."""
    rems = remediations or {}
    facts = tuple(f for i in diagnosis.issues for f in (i.root, *i.peers, *i.consequences))
    return RunView(run, facts, diagnosis, tuple(
        IssueView(i, rems.get(i.key), None if impacts is None else impacts.get(i.key), None)
        for i in diagnosis.issues), outcome=outcome,
        measured_at=None if impacts is None else 0.0, delivery=delivery)


def remediation_data(history: NodeStateHistory | None, facts: Sequence[AlertFact]
                     ) -> dict[str, Any]:
    """The run page's ``remediation`` and ``remediations`` for ``facts`` ({} when no issue
    names a host), as the run service decides them with ``history`` (None: no Prometheus)."""
    service = RunService(None, history=history, gap=timedelta(minutes=10))
    data = service.assemble(RUN, Confirmation.unchecked(facts)).as_dict(lambda *_: "")
    return {k: data[k] for k in ("remediation", "remediations") if k in data}


@contextmanager
def prometheus_raising(alerts: Sequence[Mapping[str, Any]],
                       asked: list[str] | None = None) -> Iterator[str]:
    """A Prometheus query API whose ``ALERTS`` holds a firing series for each of ``alerts``
    (Alertmanager-shaped: their ``labels``) and nothing else; yields its URL. Every request's
    path is appended to ``asked`` when given."""
    raised = [{**a["labels"], "alertstate": "firing", "__name__": "ALERTS"} for a in alerts]

    def answer(path: str, _headers: object) -> Reply:
        if asked is not None:
            asked.append(path)
        q = {k: v[0] for k, v in parse_qs(urlparse(path).query).items()}
        instant = "start" not in q
        result = [{"metric": m, "value": [float(q["time"]), "1"]} for m in raised] \
            if instant and "ALERTS" in q["query"] else []
        data = {"resultType": "vector" if instant else "matrix", "result": result}
        return 200, "application/json", json.dumps({"status": "success", "data": data}).encode()

    with http_stub(answer) as address:
        yield f"http://{address}"


def rules_raising(alerts: Sequence[Mapping[str, Any]]) -> str:
    """A Prometheus rule file (1 s evaluation) that raises each of ``alerts`` with exactly its
    labels, so a real Prometheus confirms them and nothing else."""
    def labels(alert: Mapping[str, Any]) -> str:
        return json.dumps({k: v for k, v in alert["labels"].items() if k != "alertname"})
    rules = "".join(f"      - alert: {a['labels']['alertname']}\n        expr: vector(1)\n"
                    f"        labels: {labels(a)}\n" for a in alerts)
    return f"groups:\n  - name: raised\n    interval: 1s\n    rules:\n{rules}"


def quarantine_pass(worker: DeliveryWorker) -> int:
    """One pass of the quarantine process (``wandb-infra-bridge quarantine``: its own acting
    quarantine on the worker's store and configuration); the worker's next refresh shows its
    decisions. Returns the decisions made."""
    acting = build_quarantine(worker.policy.quarantine, Path(worker.store.path).resolve().parent,
                              acting=True)
    assert acting is not None
    return offer_to_quarantine(worker.runs, acting, worker.clock())


def user_part(notes: str | None) -> str:
    """The notes without the bridge's section (what the user wrote)."""
    notes = notes or ""
    start = notes.rfind(BEGIN)
    end = notes.find(END, start) if start != -1 else -1
    if start == -1 or end == -1:
        return notes
    return notes[:start] + notes[end + len(END):]
