"""The user's words are sacred.

The bridge read a run's notes and tags, waited on Prometheus (up to about 15 s), then wrote them
back, erasing the user's edits made meanwhile; and it removed the user's own tags starting with
``infra:`` (``infra:needs more``). Now everything slow happens before the read, the write is
verified by reading back (merged again if the user changed the run in between), and only tags the
bridge itself wrote are ever removed. The user edits concurrently through the W&B stand-in.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.bridge_payloads import alert, notification
from harness.wandb_standin import WandbStandin
from tests.views import user_part
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.notes import BEGIN
from wandb_infra.bridge.projection.wandb_client import WandbClient


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "r1", tags=["mine", "infra:needs more"],
                       notes="my notes\n")
        yield server


def worker(wb: WandbStandin, tmp_path) -> tuple[DeliveryWorker, Store]:
    store = Store(tmp_path / "bridge.sqlite")
    w = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5), markers=None,
                       links=GrafanaLinks(""), metrics=BridgeMetrics(),
                       policy=DeliveryPolicy(flush_interval=0))
    return w, store


def ingest(store: Store, *names: str) -> None:
    store.ingest(parse_notification(json.dumps(notification([
        alert(name, category="gpu_hardware", host="h1", gpu="0", run="r1")
        for name in names])).encode()))


def test_an_edit_while_the_bridge_waits_on_prometheus_survives(wb, tmp_path):
    """The user edits while the bridge measures the run (Prometheus, the run's history)."""
    w, store = worker(wb, tmp_path)
    slow = w.projector.measure

    def measured_meanwhile(view: Any) -> Any:
        wb.user_edit("team", "proj", "r1", notes=lambda n: n + "edited during the lookup\n",
                     tags=lambda t: [*t, "late-tag"])
        return slow(view)

    w.projector.measure = measured_meanwhile  # type: ignore[method-assign]
    ingest(store, "GpuXidError")
    assert w.run_once() == 1
    run = wb.run("team", "proj", "r1")
    assert "edited during the lookup" in user_part(run.notes)
    assert run.notes.startswith("my notes\n")
    assert {"mine", "late-tag", "infra:needs more", "infra:GpuXidError"} <= set(run.tags)


def test_an_edit_right_after_the_write_is_merged_again(wb, tmp_path):
    """The user rewrites the notes (dropping the bridge's section) and the tags just after the
    bridge's write: the read-back sees it and merges the section back into the user's text."""
    w, store = worker(wb, tmp_path)
    assert w.client is not None
    real = w.client.upsert
    edits = [0]

    def upsert_then_user(storage_id: str, **kw: Any) -> None:
        real(storage_id, **kw)
        if not edits[0]:
            edits[0] += 1
            wb.user_edit("team", "proj", "r1", notes=lambda _n: "rewritten by me\n",
                         tags=lambda t: [x for x in t if x != "mine"] + ["after"])

    w.client.upsert = upsert_then_user  # type: ignore[method-assign]
    ingest(store, "GpuXidError")
    assert w.run_once() == 1
    run = wb.run("team", "proj", "r1")
    assert run.notes.startswith("rewritten by me\n") and BEGIN in run.notes
    assert "mine" not in run.tags and "after" in run.tags  # the user's removal stands
    assert "infra:GpuXidError" in run.tags and "infra:needs more" in run.tags


def test_only_tags_the_bridge_wrote_are_removed(wb, tmp_path):
    """Today the user's ``infra:needs more`` was dropped as if it were the bridge's count."""
    w, store = worker(wb, tmp_path)
    ingest(store, *[f"Alert{i:02d}" for i in range(30)])  # more names than MAX_INFRA_TAGS
    assert w.run_once() == 1
    tags = wb.run("team", "proj", "r1").tags
    assert tags[:2] == ["mine", "infra:needs more"]
    count = [t for t in tags if t.endswith(" more") and t != "infra:needs more"]
    assert len(count) == 1 and count[0].startswith("infra:+")
    # the user adds their own infra: tags; the bridge re-projects after new alerts
    wb.user_edit("team", "proj", "r1", tags=lambda t: [*t, "infra:+5 more", "infra:check me"])
    ingest(store, "Alert99")
    w.run_once()
    tags = wb.run("team", "proj", "r1").tags
    assert {"mine", "infra:needs more", "infra:check me"} <= set(tags)
    assert "infra:+5 more" in tags  # the user's, not a count the bridge wrote: kept
    assert count[0] not in tags  # the count the bridge wrote before is replaced
