"""The webhook: auth, 4xx cases that change nothing, durable idempotent ingest, resolve, pages."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bridge_payloads import T0, TOKEN, alert, make_context, notification, serve
from tests.budget import examples
from wandb_infra.bridge.config import load
from wandb_infra.bridge.ingest import identity
from wandb_infra.bridge.ingest.payload import (
    PayloadError,
    _alert,
    _bulk,
    _Invalid,
    parse_notification,
)
from wandb_infra.bridge.ingest.store import INSERT_ROWS, Store
from wandb_infra.bridge.web.webhook import Credentials
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey

BRIDGE_CLI = (sys.executable, "-m", "wandb_infra.bridge.cli")

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def bridge(tmp_path):
    ctx = make_context(tmp_path, max_body_bytes=64 * 1024)
    with serve(ctx) as running:
        yield running


def post(bridge, body, headers=None, raw: bytes | None = None) -> requests.Response:
    hdrs = {"Content-Type": "application/json", **AUTH, **(headers or {})}
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(bridge.url + "/alertmanager", data=data, headers=hdrs, timeout=10)


def sample(run: str = "r1", **kw) -> list[dict]:
    return [alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run=run, **kw),
            alert("TrainingStalled", category="workload", host="h2", run=run,
                  start=T0 + timedelta(seconds=30), severity="warning")]


@pytest.mark.parametrize("case", ["no_auth", "wrong_bearer", "wrong_basic", "media_type",
                                  "too_large", "not_json", "not_utf8", "not_object",
                                  "alerts_not_list", "bad_status", "bad_time", "bad_labels",
                                  "bad_fingerprint", "deep", "version"])
def test_bad_requests_get_4xx_and_change_nothing(bridge, case):
    good = notification(sample())
    expected, kwargs = {
        "no_auth": (401, {"headers": {"Authorization": ""}}),
        "wrong_bearer": (401, {"headers": {"Authorization": f"Bearer {TOKEN}x"}}),
        "wrong_basic": (401, {"headers": {"Authorization": "Basic " + base64.b64encode(
            f"x:{TOKEN}".encode()).decode()}}),
        "media_type": (415, {"headers": {"Content-Type": "text/plain"}}),
        "too_large": (413, {"raw": b"{" + b" " * (64 * 1024 + 10) + b"}"}),
        "not_json": (400, {"raw": b"{not json"}),
        "not_utf8": (400, {"raw": b"\xff\xfe{}"}),
        "not_object": (400, {"raw": b"[1,2]"}),
        "alerts_not_list": (400, {"body": {**good, "alerts": {"a": 1}}}),
        "bad_status": (400, {"body": {**good, "alerts": [{**good["alerts"][0],
                                                           "status": "weird"}]}}),
        "bad_time": (400, {"body": {**good, "alerts": [{**good["alerts"][0],
                                                         "startsAt": "yesterday"}]}}),
        "bad_labels": (400, {"body": {**good, "alerts": [{**good["alerts"][0],
                                                           "labels": {"a": 1}}]}}),
        "bad_fingerprint": (400, {"body": {**good, "alerts": [{**good["alerts"][0],
                                                                "fingerprint": 12}]}}),
        "deep": (400, {"raw": b"[" * 30000 + b"]" * 30000}),
        "version": (400, {"body": {**good, "version": "3"}}),
    }[case]
    body = kwargs.pop("body", good)
    resp = post(bridge, body, **kwargs)
    assert resp.status_code == expected, resp.text
    assert resp.json()["status"] == "error" and resp.json()["error"]
    assert bridge.ctx.store.alert_count() == 0


def test_chunked_oversized_body_is_413(bridge):
    def chunks():
        for _ in range(200):
            yield b" " * 1024
    resp = requests.post(bridge.url + "/alertmanager", data=chunks(),
                         headers={"Content-Type": "application/json", **AUTH}, timeout=10)
    assert resp.status_code == 413
    assert bridge.ctx.store.alert_count() == 0


def test_unknown_fields_are_ignored_and_ingest_is_idempotent(bridge):
    body = notification(sample())
    body["notification_reason"] = "new"
    body["alerts"][0]["someFutureField"] = {"x": 1}
    first = post(bridge, body).json()
    assert first == {"status": "ok", "received": 2, "new": 2, "resolved": 0, "duplicates": 0}
    # Alertmanager repeat and an HA peer sending the same thing: nothing changes.
    for _ in range(3):
        again = post(bridge, body).json()
        assert again["new"] == 0 and again["duplicates"] == 2
    assert bridge.ctx.store.alert_count() == 2
    outbox = bridge.ctx.store.outbox(RunKey("team", "proj", "r1"))
    assert outbox is not None and outbox.dirty_seq == 1


def test_resolve_closes_the_issue_once(bridge):
    post(bridge, notification(sample()))
    resolved = [alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r1",
                      end=T0 + timedelta(minutes=7))]
    assert post(bridge, notification(resolved)).json()["resolved"] == 1
    assert post(bridge, notification(resolved)).json()["duplicates"] == 1
    facts = {f.alertname: f for f in bridge.ctx.store.facts(RunKey("team", "proj", "r1"))}
    assert facts["GpuXidError"].ends_at == T0 + timedelta(minutes=7)
    assert facts["TrainingStalled"].ends_at is None
    # Alertmanager sending it firing again after the resolve (its next re-send from Prometheus
    # replaced a resolved alert) reopens it: Alertmanager's word on its state is the last one.
    post(bridge, notification(sample()))
    facts = {f.alertname: f for f in bridge.ctx.store.facts(RunKey("team", "proj", "r1"))}
    assert facts["GpuXidError"].ends_at is None


def test_identity_comes_from_each_alert_not_common_labels(bridge):
    body = notification([alert("NodeDown", category="node", host="a", run="ra"),
                         alert("NodeDown", category="node", host="b", run="rb"),
                         alert("NodeDown", category="node", host="c")], truncated=5)
    body["commonLabels"] = {"wandb_entity": "team", "wandb_project": "proj",
                            "wandb_run_id": "ra"}
    assert post(bridge, body).status_code == 200
    runs = {run.run_id: n for run, n, _, _ in bridge.ctx.store.runs()}
    assert runs == {"ra": 1, "rb": 1, "": 1}


def test_pages_json_html_and_escaping(bridge):
    evil = {"summary": "<script>alert(1)</script>", "description": "<img src=x onerror=1>",
            "impact": "\"'><b>", "remediation": "x"}
    alerts = [alert("GpuXidError", category="gpu_hardware", host="<h1>", gpu="0", run="r1",
                    annotations=evil),
              alert("TrainingStalled", category="workload", host="h2", run="r1",
                    start=T0 + timedelta(seconds=30))]
    post(bridge, notification(alerts))
    listing = requests.get(bridge.url + "/runs?format=json", headers=AUTH, timeout=10).json()
    row = listing["runs"][0]
    assert (row["run_id"], row["issues"], row["open_issues"]) == ("r1", 1, 1)
    assert row["root_cause"]["alertname"] == "GpuXidError"
    detail = requests.get(bridge.url + "/runs/team/proj/r1",
                          headers={**AUTH, "Accept": "application/json"}, timeout=10).json()
    issue = detail["issues"][0]
    assert issue["root_cause"]["alertname"] == "GpuXidError"
    assert issue["consequences"][0]["alertname"] == "TrainingStalled"
    assert issue["root_cause"]["grafana"].startswith("http://grafana.invalid/d/")
    for path in ("/runs", "/runs/team/proj/r1"):
        html = requests.get(bridge.url + path, headers=AUTH, timeout=10).text
        assert "<script>" not in html and "<img" not in html and "<h1>" not in html.split(
            "</h1>", 1)[1]
        assert "&lt;" in html
    assert requests.get(bridge.url + "/runs", timeout=10).status_code == 401
    assert requests.get(bridge.url + "/runs/team/proj/nope", headers=AUTH,
                        timeout=10).status_code == 404


def test_health_ready_metrics(bridge):
    assert requests.get(bridge.url + "/healthz", timeout=10).status_code == 200
    assert requests.get(bridge.url + "/readyz", timeout=10).status_code == 200
    post(bridge, notification(sample()))
    post(bridge, notification(sample()))
    post(bridge, notification(sample()), headers={"Authorization": "Bearer nope"})
    text = requests.get(bridge.url + "/metrics", timeout=10).text
    assert 'wandb_infra_bridge_notifications_total{outcome="stored"} 2.0' in text
    assert 'wandb_infra_bridge_notifications_total{outcome="unauthorised"} 1.0' in text
    assert "wandb_infra_bridge_alerts_duplicate_total 2.0" in text
    assert TOKEN not in text


def test_full_store_answers_503_readiness_false_then_recovers(tmp_path):
    ctx = make_context(tmp_path)

    def limit_pages(extra: int | None) -> None:
        conn = ctx.store._conn()  # the write thread's own connection
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages + extra if extra is not None else 1 << 30}")

    with serve(ctx) as running:
        assert post(running, notification(sample("r0"))).status_code == 200
        ctx.write_pool.submit(limit_pages, 0).result()
        big = notification([alert("NodeDown", category="node", host=f"h{i}", run="r9",
                                  annotations={"description": "x" * 2000}) for i in range(50)])
        resp = post(running, big)
        assert resp.status_code == 503 and resp.headers["Retry-After"]
        assert requests.get(running.url + "/readyz", timeout=10).status_code == 503
        assert ctx.store.alert_count() == 2
        assert "wandb_infra_bridge_store_writable 0.0" in requests.get(
            running.url + "/metrics", timeout=10).text
        ctx.write_pool.submit(limit_pages, None).result()
        assert requests.get(running.url + "/readyz", timeout=10).status_code == 200
        assert post(running, big).json()["new"] == 50


def test_readiness_needs_free_space(tmp_path):
    ctx = make_context(tmp_path, store=Store(tmp_path / "s.sqlite", min_free_bytes=1 << 62))
    with serve(ctx) as running:
        resp = requests.get(running.url + "/readyz", timeout=10)
        # ready or not and nothing else (the reason, with the path, is in the log)
        assert resp.status_code == 503 and resp.json() == {"status": "not ready"}


def test_basic_auth_and_constant_time_credentials():
    creds = Credentials(basic_username="am", basic_password="s3cret-pass")
    good = "Basic " + base64.b64encode(b"am:s3cret-pass").decode()
    assert creds.check(good)
    assert not creds.check(good + "x") and not creds.check(None) and not creds.check("")
    assert "s3cret" not in repr(creds)


def test_refuses_to_start_without_auth(tmp_path):
    with pytest.raises(ConfigError, match="refusing to start"):
        load(None, environ={})
    cfg = load(None, environ={}, insecure_no_auth=True)
    assert not cfg.auth_enabled
    token_file = tmp_path / "token"
    token_file.write_text("tok-from-file\n")
    cfg = load(None, environ={"WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE": str(token_file),
                              "WANDB_INFRA_BRIDGE__LISTEN__PORT": "9999"})
    assert cfg.secrets.bearer_token == "tok-from-file" and cfg.port == 9999
    assert "tok-from-file" not in repr(cfg)
    with pytest.raises(ConfigError, match=r"wandb\.bogus: unknown key"):
        load(None, environ={"WANDB_INFRA_BRIDGE__WANDB__BOGUS": "1",
                            "WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN": "x"})


def test_identity_is_read_from_each_alerts_own_contract_labels():
    labels = {"wandb_entity": "t", "wandb_project": "p", "wandb_run_id": "abc",
              "hostname": "h", "gpu": "3"}
    assert identity.read(labels) == (RunKey("t", "p", "abc"), "h", "3")
    # Any run part missing: unattributed (the join metrics may still place it), host kept.
    partial = {k: v for k, v in labels.items() if k != "wandb_project"}
    assert identity.read(partial) == (identity.UNATTRIBUTED, "h", "3")
    # A notification: one RunKey object per run, in alert order.
    other = {**labels, "wandb_run_id": "xyz", "gpu": "0"}
    read = identity.read_all([labels, other, labels, {}])
    assert [r.run.run_id for r in read] == ["abc", "xyz", "abc", ""]
    assert read[0].run is read[2].run


def test_a_config_with_the_removed_identity_section_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"identity"):
        load(None, environ={"WANDB_INFRA_BRIDGE__IDENTITY__RUN_ID": "$.labels.job",
                            "WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN": "x"})


def test_example_config_is_valid(tmp_path):
    for name in ("token", "key"):
        (tmp_path / name).write_text("secret-value-" + name)
    root = Path(__file__).resolve().parent.parent
    cfg = load(str(root / "deploy" / "bridge.example.yaml"), environ={
        "WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE": str(tmp_path / "token"),
        "WANDB_INFRA_BRIDGE__WANDB__API_KEY_FILE": str(tmp_path / "key")})
    assert cfg.auth_enabled and cfg.secrets.wandb_api_key == "secret-value-key"
    assert cfg.webhook_path == "/alertmanager" and cfg.policy.flush_interval == 10


@pytest.mark.integration
def test_cli_help_and_refusal(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_INFRA_BRIDGE")}
    helped = subprocess.run([*BRIDGE_CLI, "serve", "--help"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0
    for key in ("--insecure-local-demo", "wandb.api_key", "webhook.max_body_bytes",
                "WANDB_INFRA_BRIDGE__"):
        assert key in helped.stdout
    refused = subprocess.run([*BRIDGE_CLI, "serve", "--port", "0"],
                             env=env, capture_output=True, text=True, timeout=60, check=False,
                             cwd=tmp_path)
    assert refused.returncode == 2 and "refusing to start" in refused.stderr


def test_large_notification_over_several_runs_is_stored_exactly(tmp_path):
    """Alerts are written in chunks of INSERT_ROWS per statement and grouped by run: counts,
    duplicates and same-body resolutions come out exact across chunk and run boundaries."""
    store = Store(tmp_path / "s.sqlite")
    alerts = [alert("GpuXidError", category="gpu_hardware", host=f"h{i}", gpu=str(i % 8),
                    run=f"r{i % 3}" if i % 10 else None) for i in range(2 * INSERT_ROWS + 55)]
    ended = [alert("GpuXidError", category="gpu_hardware", host=f"h{i}", gpu=str(i % 8),
                   run=f"r{i % 3}", end=T0 + timedelta(minutes=1)) for i in range(1, 40, 2)]
    body = json.dumps(notification(alerts + ended)).encode()
    first = store.ingest(parse_notification(body))
    assert (first.received, first.new, first.resolved) == (len(alerts) + 20, len(alerts), 20)
    assert first.runs == (RunKey(), *(RunKey("team", "proj", f"r{k}") for k in range(3)))
    again = store.ingest(parse_notification(body))
    assert (again.new, again.resolved, again.duplicates) == (0, 0, len(alerts) + 20)
    per_run = {run.run_id: (n, firing) for run, n, firing, _ in store.runs()}
    unattributed = sum(1 for i in range(len(alerts)) if i % 10 == 0)
    assert per_run[""] == (unattributed, unattributed)
    assert sum(n for n, _ in per_run.values()) == len(alerts)
    assert sum(n - firing for n, firing in per_run.values()) == 20


def test_label_size_cap_is_exact_past_the_bulk_bound():
    """The bulk check bounds every map by entries x (longest key + longest value); past that
    bound each map is measured, so only a map over MAX_LABEL_BYTES is refused."""
    wide = alert("NodeDown", category="node", host="h1", run="r1",
                 extra={f"k{i}": "v" for i in range(30)})
    long = alert("NodeDown", category="node", host="h2", run="r1", extra={"x": "y" * 40_000})
    parsed = parse_notification(json.dumps(notification([wide, long])).encode())
    assert [len(a.labels) for a in parsed.alerts] == [len(wide["labels"]), len(long["labels"])]
    over = alert("NodeDown", category="node", host="h3", run="r1",
                 extra={"x": "y" * 33_000, "z": "y" * 33_000})
    with pytest.raises(PayloadError, match=r"alerts\[1\]\.labels is larger than"):
        parse_notification(json.dumps(notification([wide, over])).encode())


_TEXT = st.one_of(st.sampled_from(["firing", "resolved", "", "1", "ab12", "AB12", "x\n"]),
                  st.text(max_size=5))
_VALUE = st.one_of(_TEXT, st.none(), st.integers(), st.lists(st.integers(), max_size=1),
                   st.dictionaries(st.sampled_from(["a", "panel_id"]), _TEXT, max_size=2))
_TIME = st.sampled_from(["2026-11-29T12:00:00Z", "2026-11-29T11:00:00.5+01:00",
                         "0001-01-01T00:00:00Z", "2026-11-29T11:59:00Z", "0999-01-01T00:00:00Z",
                         "yesterday"])


_FIELD_NAMES = ["status", "fingerprint", "labels", "annotations", "startsAt", "endsAt",
                "generatorURL"]


@st.composite
def _alert_objects(draw) -> dict:
    """A real alert with up to two fields replaced, removed or retyped."""
    item = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r1",
                 end=draw(st.sampled_from([None, T0 + timedelta(minutes=1)])),
                 annotations=draw(st.sampled_from([None, {"panel_id": "12"}])))
    for name in draw(st.lists(st.sampled_from(_FIELD_NAMES), max_size=2)):
        if draw(st.booleans()):
            item.pop(name, None)
        else:
            item[name] = draw(st.one_of(_VALUE, _TIME))
    return item


@given(st.lists(_alert_objects(), min_size=1, max_size=4))
@settings(max_examples=examples(400), deadline=None)
def test_bulk_validation_accepts_exactly_what_the_per_alert_check_accepts(items):
    fast = _bulk(items)
    try:
        slow = [_alert(item) for item in items]
    except _Invalid:
        assert fast is None
    else:
        assert fast is None or fast == slow
