"""Restart verdicts from node-state history (a canned Prometheus), in notes and the run's data."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import requests

from harness.bridge_payloads import TOKEN, alert, make_context, notification, serve
from harness.processes import Reply, http_stub
from harness.wandb_standin import WandbStandin
from tests.views import remediation_data, view_of
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker, run_service
from wandb_infra.bridge.projection.notes import render_section
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.remediation import (
    NodeStateHistory,
    exclusion,
    signature,
)
from wandb_infra.bridge.runs.service import RECENT, RunService, recent_runs
from wandb_infra.bridge.runs.view import when
from wandb_infra.bridge.web.pages import run_html
from wandb_infra.common.runkey import RunKey

# These alerts name runs the canned Prometheus holds no join metrics for; confirmation by Prometheus
# is tested in test_bridge_confirm.py, so the workers here run with confirm_alerts off.

NOW = datetime.now(UTC).replace(microsecond=0)
START = NOW - timedelta(minutes=5)
# Series: (labels, predicate on the sample time); value "1" while the predicate holds (or the
# string it returns).
Series = list[tuple[dict[str, str], Callable[[float], bool | str]]]


def _value(alive: bool | str) -> str:
    return alive if isinstance(alive, str) else "1"


@contextmanager
def fake_prometheus(series_for: Callable[[str], Series]) -> Iterator[str]:
    """Answers /api/v1/query and /api/v1/query_range like Prometheus from canned series
    (matched by query)."""
    def answer(path: str, _headers: object) -> Reply:
        q = {k: v[0] for k, v in parse_qs(urlparse(path).query).items()}
        result: list[dict[str, Any]] = []
        if "start" not in q:  # an instant query
            at = float(q["time"])
            result = [{"metric": m, "value": [at, _value(alive(at))]}
                      for m, alive in series_for(q["query"]) if alive(at)]
            data = {"resultType": "vector", "result": result}
        else:
            start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
            times = [start + i * step for i in range(int((end - start) / step) + 1)]
            for metric, alive in series_for(q["query"]):
                values = [[t, _value(alive(t))] for t in times if alive(t)]
                if values:
                    result.append({"metric": metric, "values": values})
            data = {"resultType": "matrix", "result": result}
        return 200, "application/json", json.dumps({"status": "success", "data": data}).encode()

    with http_stub(answer) as address:
        yield f"http://{address}"


def state(host: str, scheduler: str, st: str, reason: str = "",
          alive: Callable[[float], bool] = lambda t: True) -> tuple[dict[str, str], Any]:
    return ({"__name__": "wandb_infra_node_state", "hostname": host, "scheduler": scheduler,
             "state": st, "reason": reason}, alive)


def facts(*alerts: dict[str, Any], tmp_path) -> Any:
    store = Store(tmp_path / "b.sqlite")
    store.ingest(parse_notification(json.dumps(notification(list(alerts))).encode()))
    return store, store.facts(RunKey("team", "proj", "r1"))


def xid(host: str = "gpu-07", start: datetime = START, **kw: Any) -> dict[str, Any]:
    """XID 95 on GPU 3: it needs a GPU reset, so the host's state decides the verdict."""
    return alert("GpuUncontainedEccError", category="gpu_hardware", host=host, gpu="3",
                 run="r1", start=start, extra={"xid": "95"}, **kw)


def remediation(url: str, alerts: list[dict[str, Any]], tmp_path) -> dict[str, Any]:
    _, fs = facts(*alerts, tmp_path=tmp_path)
    return remediation_data(NodeStateHistory(PrometheusClient(url)), fs)


def test_k8s_node_still_ready_is_unsafe_with_affinity_snippet(tmp_path):
    with fake_prometheus(lambda q: [state("gpu-07", "kubernetes", "Ready")]
                         if "wandb_infra_node_state" in q else []) as url:
        got = remediation(url, [xid()], tmp_path)["remediation"]
    assert got["verdict"] == "unsafe"
    assert "XID 95 needs a GPU reset: a restart may land on gpu-07" in got["detail"]
    assert "gpu-07 is schedulable (Ready)" in got["detail"]
    assert "operator: NotIn" in got["exclusion"] and 'values: ["gpu-07"]' in got["exclusion"]
    assert got["hosts"][0]["hostname"] == "gpu-07" and got["hosts"][0]["state"] == "Ready"


def test_drained_mid_issue_is_safe_with_history(tmp_path):
    cut = NOW.timestamp() - 120
    with fake_prometheus(lambda q: [
            state("gpu-07", "slurm", "ALLOCATED", alive=lambda t: t < cut),
            state("gpu-07", "slurm", "ALLOCATED+DRAIN", "XID 94", alive=lambda t: t >= cut)]
            if "wandb_infra_node_state" in q else []) as url:
        _, fs = facts(xid(), tmp_path=tmp_path)
        diagnosis = diagnose(fs, timedelta(minutes=10))
        rems = NodeStateHistory(PrometheusClient(url)).for_diagnosis(diagnosis)
    (rem,) = rems.values()
    assert rem.verdict == "safe" and rem.exclusion == ""
    (line,) = rem.history_lines()
    assert line.startswith("gpu-07: in service (ALLOCATED) as of ")
    assert "; out of the pool (ALLOCATED+DRAIN) from " in line and line.endswith("reason 'XID 94'")
    section = render_section(view_of(diagnosis, rems), lambda *a: "")
    assert ("- Safe to restart? **safe**: XID 95 needs a GPU reset; gpu-07 is out of the "
            "pool") in section
    assert "- Node state: gpu-07: in service" in section


def test_no_scheduler_data_is_unknown(tmp_path):
    with fake_prometheus(lambda q: []) as url:
        got = remediation(url, [xid()], tmp_path)["remediation"]
    assert got["verdict"] == "unknown" and "no scheduler state for gpu-07" in got["detail"]
    assert "node_state" in got["detail"] and got["exclusion"] == ""
    assert got["hosts"] == [{"hostname": "gpu-07", "state": "unknown", "reason": "",
                             "since": ""}]


def test_kube_state_metrics_accepted_as_input(tmp_path):
    def series(q: str) -> Series:
        if q.startswith("kube_node_spec_unschedulable"):
            return [({"node": "gpu-07.cluster.local"}, lambda t: True)]
        if q.startswith("kube_node_spec_taint"):
            return [({"node": "gpu-07.cluster.local", "key": "nvsentinel/quarantine",
                      "value": "xid", "effect": "NoSchedule"}, lambda t: True)]
        return []
    with fake_prometheus(series) as url:
        got = remediation(url, [xid()], tmp_path)["remediation"]
    assert got["verdict"] == "safe"
    assert got["hosts"][0]["state"] == "Ready,SchedulingDisabled,Tainted"
    assert got["hosts"][0]["reason"] == "taint nvsentinel/quarantine=xid:NoSchedule"


def test_symptom_only_issue_blames_no_node(tmp_path):
    stall = alert("TrainingStalled", category="workload", host="gpu-07", run="r1",
                  start=START, severity="warning")
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "IDLE")]) as url:
        got = remediation(url, [stall], tmp_path)["remediation"]
    assert got["verdict"] == "unknown" and got["exclusion"] == ""
    assert "TrainingStalled is a symptom" in got["detail"]
    assert remediation_data(None, []) == {}


def test_hostile_reason_escaped_and_odd_hostnames_not_in_exclusion(tmp_path):
    reason = "[click](http://evil) <b>x</b> `rm -rf`"
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "IDLE", reason)]
                         if "wandb_infra_node_state" in q else []) as url:
        _, fs = facts(xid(), tmp_path=tmp_path)
        diagnosis = diagnose(fs, timedelta(minutes=10))
        section = render_section(view_of(
            diagnosis, NodeStateHistory(PrometheusClient(url)).for_diagnosis(diagnosis)),
            lambda *a: "")
    assert "<b>" not in section and not re.search(r"(?<!\\)\]\(http", section)
    assert "  sbatch --exclude=gpu-07" in section
    assert exclusion(["ok-1", "bad`host", "x y"], "slurm") == "sbatch --exclude=ok-1"


def test_run_page_json_carries_remediation(tmp_path):
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "MIXED")]
                         if "wandb_infra_node_state" in q else []) as prom:
        store = Store(tmp_path / "bridge.sqlite")
        policy = DeliveryPolicy(confirm_alerts=False)
        # the pages show the hosts' state the worker read and stored, never ask Prometheus
        worker = run_service(store, PrometheusClient(prom), policy, None, wandb_enabled=False,
                             records=True)
        ctx = make_context(tmp_path, store=store, runs=run_service(
            store, PrometheusClient(prom), policy, None, wandb_enabled=False, reads=False))
        ctx.store.ingest(parse_notification(json.dumps(notification([xid()])).encode()))
        worker.view(RunKey("team", "proj", "r1"))
        with serve(ctx) as bridge:
            resp = requests.get(bridge.url + "/runs/team/proj/r1", timeout=10,
                                headers={"Authorization": f"Bearer {TOKEN}",
                                         "Accept": "application/json"})
    data = resp.json()["remediation"]
    assert set(data) == {"verdict", "detail", "exclusion", "advice", "needs", "hosts"}
    assert data["needs"] == "a GPU reset" and data["advice"].startswith("Reset GPU 3 of gpu-07")
    assert data["verdict"] == "unsafe" and data["exclusion"] == "sbatch --exclude=gpu-07"
    assert set(data["hosts"][0]) == {"hostname", "state", "reason", "since"}


def test_signature_stable_between_refreshes_of_a_long_issue(tmp_path):
    """Hours-long history: the sample grid (hence the change times shown and the signature that
    triggers a re-write) does not move from one refresh to the next."""
    now = [NOW.timestamp()]
    old = NOW - timedelta(hours=5)
    cut = NOW.timestamp() - 3600
    with fake_prometheus(lambda q: [
            state("gpu-07", "slurm", "MIXED", alive=lambda t: t < cut),
            state("gpu-07", "slurm", "MIXED+DRAIN", "XID 79", alive=lambda t: t >= cut)]
            if "wandb_infra_node_state" in q else []) as url:
        _, fs = facts(alert("GpuFallenOffBus", category="gpu_hardware", host="gpu-07",
                            gpu="1", run="r1", start=old), tmp_path=tmp_path)
        diagnosis = diagnose(fs, timedelta(minutes=10))
        history = NodeStateHistory(PrometheusClient(url), clock=lambda: now[0])
        first = history.for_diagnosis(diagnosis)
        now[0] += 300
        second = history.for_diagnosis(diagnosis)
    assert signature(first) == signature(second)
    assert next(iter(first.values())).verdict == "safe"


def test_a_change_seen_only_now_moves_in_time_but_not_the_signature(tmp_path):
    """A drain after the grid's last point is dated at each read (never in the future), so its
    time moves from one refresh to the next; the signature, what a re-write of the run hangs
    on, stays put, and moves when the state does."""
    now = [NOW.timestamp() // 3600 * 3600 + 3500]  # 200 s past the last point of a 300 s grid
    cut = [now[0] - 60]
    with fake_prometheus(lambda q: [
            state("gpu-07", "slurm", "ALLOCATED", alive=lambda t: t < cut[0]),
            state("gpu-07", "slurm", "ALLOCATED+DRAIN", "XID 95", alive=lambda t: t >= cut[0])]
            if "wandb_infra_node_state" in q else []) as url:
        _, fs = facts(xid(start=datetime.fromtimestamp(now[0], UTC) - timedelta(days=4)),
                      tmp_path=tmp_path)
        diagnosis = diagnose(fs, timedelta(minutes=10))
        history = NodeStateHistory(PrometheusClient(url), clock=lambda: now[0])
        first = history.for_diagnosis(diagnosis)
        now[0] += 60
        second = history.for_diagnosis(diagnosis)
        cut[0] = now[0] + 1e9  # never drained: the state changed
        third = history.for_diagnosis(diagnosis)
    assert first != second and signature(first) == signature(second)
    assert signature(third) != signature(second)


def test_a_drain_since_the_last_grid_point_of_a_days_old_issue_is_read(tmp_path):
    """A days-old issue's history is read on a 5-minute grid whose last point is minutes old;
    the state now is read too, so a node drained since that point is out of the pool now."""
    now = NOW.timestamp() // 3600 * 3600 + 3500  # 200 s past the last point of a 300 s grid
    cut = now - 60
    with fake_prometheus(lambda q: [
            state("gpu-07", "slurm", "ALLOCATED", alive=lambda t: t < cut),
            state("gpu-07", "slurm", "ALLOCATED+DRAIN", "XID 95", alive=lambda t: t >= cut)]
            if "wandb_infra_node_state" in q else []) as url:
        _, fs = facts(xid(start=datetime.fromtimestamp(now, UTC) - timedelta(days=4)),
                      tmp_path=tmp_path)
        diagnosis = diagnose(fs, timedelta(minutes=10))
        (rem,) = NodeStateHistory(PrometheusClient(url), clock=lambda: now
                                  ).for_diagnosis(diagnosis).values()
    assert rem.verdict == "safe", rem.detail
    (line,) = rem.history_lines()
    # dated when it was read, never at the grid's next point (100 s in the future)
    clock = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"; out of the pool (ALLOCATED+DRAIN) from {clock}" in line, line


def test_prometheus_down_keeps_what_is_shown(tmp_path):
    """While Prometheus fails, the worker's run service shows the hosts' state it stored when
    Prometheus last answered (the reader returns None, and is not asked again for DOWN_BACKOFF
    seconds, so a pass over many runs does not wait for a timeout on each); with nothing
    stored, the verdict says Prometheus is not answering."""
    now = [NOW.timestamp()]
    store, fs = facts(xid(), tmp_path=tmp_path)
    run = RunKey("team", "proj", "r1")
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "IDLE+DRAIN", "XID 94")]
                         if "wandb_infra_node_state" in q else []) as url:
        history = NodeStateHistory(PrometheusClient(url, timeout=1), clock=lambda: now[0])
        service = RunService(store, history=history, records=True, clock=lambda: now[0])
        good = service.view(run)
    assert good is not None and good.node_state_read and good.state_read_at == now[0]
    assert good.remediations and next(iter(good.remediations.values())).verdict == "safe"
    now[0] += 1
    kept = service.view(run)  # Prometheus gone: what was stored, said to be unread now
    assert kept is not None and kept.remediations == good.remediations
    assert not kept.node_state_read and kept.state_read_at == now[0] - 1
    assert history.for_diagnosis(diagnose(fs)) is None and history._down_until > now[0]
    cold = NodeStateHistory(PrometheusClient(url, timeout=1), clock=lambda: now[0])
    shown = remediation_data(cold, fs)["remediation"]
    assert shown["verdict"] == "unknown" and "Prometheus is not answering" in shown["detail"]


def test_a_run_past_the_refresh_window_shows_the_state_last_read(tmp_path):
    """The worker's passes look only at recently active runs (``recent_runs``: an alert firing,
    or one started within the window); a run past that window keeps, on its page (HTML and
    JSON), the hosts' state the worker last read, with when it was read, rather than nothing."""
    firing, _fs = facts(xid(), tmp_path=tmp_path / "firing")
    later = NOW.timestamp() + RECENT + 3600
    assert recent_runs(firing, later) == [RunKey("team", "proj", "r1")]  # still firing: read
    store, _fs = facts(xid(end=START + timedelta(minutes=30)), tmp_path=tmp_path)
    run, read_at = RunKey("team", "proj", "r1"), NOW.timestamp()
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "IDLE+DRAIN", "XID 95")]
                         if "wandb_infra_node_state" in q else []) as url:
        history = NodeStateHistory(PrometheusClient(url, timeout=5), clock=lambda: read_at)
        worker = RunService(store, history=history, records=True, clock=lambda: read_at)
        read = worker.view(run)
    assert run in recent_runs(store, read_at) and run not in recent_runs(store, later)
    pages = RunService(store, clock=lambda: later)  # as the pages build it: no readers
    shown = pages.view(run)
    assert read is not None and shown is not None and shown.state_read_at == read_at
    assert shown.remediations == read.remediations
    page = shown.as_dict(lambda *_: "")
    assert page["hosts_state_read_at"] == read_at and page["remediation"]["verdict"] == "safe"
    assert page["remediation"]["hosts"][0]["state"] == "IDLE+DRAIN"
    assert f"Hosts' state last read at {when(read_at)}." in run_html(shown, "r1", lambda *_: "")


def test_crashed_run_summary_gets_the_verdict(tmp_path):
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "ALLOCATED")]
                         if "wandb_infra_node_state" in q else []) as prom, \
            WandbStandin() as wb:
        wb.add_run("team", "proj", "r1", state="crashed", summary={"loss": 1.0})
        store = Store(tmp_path / "bridge.sqlite")
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                policy=DeliveryPolicy(confirm_alerts=False, flush_interval=0),
                                prometheus=PrometheusClient(prom))
        store.ingest(parse_notification(json.dumps(notification([xid()])).encode()))
        assert worker.run_once() == 1
        summary = wb.run("team", "proj", "r1").summary
    assert summary["infra/restart_verdict"] == "unsafe" and summary["loss"] == 1.0


def test_resolved_fault_on_a_node_never_drained_is_still_unsafe(tmp_path):
    with fake_prometheus(lambda q: [state("gpu-07", "slurm", "IDLE")]
                         if "wandb_infra_node_state" in q else []) as url:
        got = remediation(url, [xid(end=NOW - timedelta(minutes=1))], tmp_path)["remediation"]
    assert got["verdict"] == "unsafe" and "gpu-07 is schedulable (IDLE)" in got["detail"]
    assert got["exclusion"] == "sbatch --exclude=gpu-07"


def _ksm(nodes: dict[str, bool], taints: dict[str, list[tuple[str, str]]]) -> Callable[[str],
                                                                                      Series]:
    """kube-state-metrics series: node -> cordoned, node -> [(taint key, effect)]. The taint
    query's ``key!~`` matcher is applied like Prometheus would."""
    def series(q: str) -> Series:
        if q.startswith("kube_node_spec_unschedulable"):
            return [({"node": n}, (lambda t, c=cordoned: "1" if c else "0"))
                    for n, cordoned in nodes.items()]
        if q.startswith("kube_node_spec_taint"):
            ignored = q.split('key!~"', 1)[1].split('"', 1)[0].replace("\\\\", "\\")
            return [({"node": n, "key": k, "value": "", "effect": e}, lambda t: True)
                    for n, ts in taints.items() for k, e in ts if not re.fullmatch(ignored, k)]
        return []
    return series


def test_a_taint_the_runs_pods_tolerate_keeps_the_node_in_the_pool(tmp_path):
    ksm = _ksm({"gpu-07": False}, {"gpu-07": [("team.example/dedicated", "NoSchedule")]})
    _, fs = facts(xid(), tmp_path=tmp_path)
    diagnosis = diagnose(fs, timedelta(minutes=10))
    with fake_prometheus(ksm) as url:
        strict = NodeStateHistory(PrometheusClient(url)).for_diagnosis(diagnosis)
        tolerant = NodeStateHistory(PrometheusClient(url), tolerated_taints=(
            "nvidia.com/gpu", "team.example/dedicated")).for_diagnosis(diagnosis)
    assert next(iter(strict.values())).verdict == "safe"  # an untolerated taint: out
    got = next(iter(tolerant.values()))
    assert got.verdict == "unsafe" and got.timelines[0].current.state == "Ready"


def test_two_nodes_sharing_a_first_label_are_never_merged(tmp_path):
    """gpu-07.rack-a is cordoned, gpu-07.rack-b (the faulty one, say) is not: the short name
    'gpu-07' is ambiguous, so no state is read for it (unknown), never 'out of the pool'."""
    ksm = _ksm({"gpu-07.rack-a": True, "gpu-07.rack-b": False}, {})
    _, fs = facts(xid(), tmp_path=tmp_path)
    diagnosis = diagnose(fs, timedelta(minutes=10))
    with fake_prometheus(ksm) as url:
        history = NodeStateHistory(PrometheusClient(url))
        got = next(iter(history.for_diagnosis(diagnosis).values()))
    assert got.verdict == "unknown" and "no scheduler state for gpu-07" in got.detail
    exact = _ksm({"gpu-07": False, "gpu-07.rack-a": True}, {})
    with fake_prometheus(exact) as url:
        history = NodeStateHistory(PrometheusClient(url))
        got = next(iter(history.for_diagnosis(diagnosis).values()))
    assert got.verdict == "unsafe"  # the node named exactly gpu-07 is schedulable


class _Unanswering:
    """NodeStateHistory while its Prometheus has never answered: None, "nothing read"."""

    def for_diagnosis(self, *_args: Any, **_kw: Any) -> None:
        return None


def test_first_write_while_prometheus_is_not_answering_says_unknown(tmp_path):
    """Prometheus configured but down at a run's first write: the notes and the crashed run's
    summary say "unknown" and why, instead of carrying no verdict."""
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1", state="crashed", summary={"loss": 1.0})
        store = Store(tmp_path / "bridge.sqlite")
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                policy=DeliveryPolicy(confirm_alerts=False, flush_interval=0,
                                                      scheduler="slurm"),
                                prometheus=None)
        worker.runs.history = _Unanswering()
        store.ingest(parse_notification(json.dumps(notification([xid()])).encode()))
        assert worker.run_once() == 1
        run = wb.run("team", "proj", "r1")
    notes = run.notes.replace("\\", "")
    assert "**unknown**" in notes and "Prometheus is not answering" in notes
    assert "sbatch --exclude=gpu-07" in notes
    assert run.summary["infra/restart_verdict"] == "unknown"
