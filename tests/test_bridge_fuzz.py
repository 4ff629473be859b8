"""Hostile bodies at the webhook: never a 5xx, never a crash, never a row from a rejected body."""

from __future__ import annotations

import json

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bridge_payloads import TOKEN, alert, make_context, notification, serve

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
FIELDS = ["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint",
          "generatorURL"]
SUPPRESS = [HealthCheck.function_scoped_fixture]
TOP = ["alerts", "version", "receiver", "truncatedAlerts", "groupKey", "status"]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    ctx = make_context(tmp_path_factory.mktemp("fuzz"), max_body_bytes=256 * 1024)
    with serve(ctx) as running:
        yield running


def _post(bridge, data: bytes) -> requests.Response:
    return requests.post(bridge.url + "/alertmanager", data=data, timeout=10, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})


@given(mutation=st.tuples(st.sampled_from(FIELDS), JSON, st.sampled_from(TOP), JSON,
                          st.integers(0, 2)))
@settings(max_examples=250, deadline=None, suppress_health_check=SUPPRESS)
def test_mutated_notifications(bridge, mutation):
    field, value, top, top_value, which = mutation
    base = notification([alert("NodeDown", category="node", host="h", run="fuzz")])
    before = bridge.ctx.store.alert_count()
    if which == 0:
        base["alerts"][0][field] = value
    elif which == 1:
        base[top] = top_value
    else:
        base["alerts"][0]["labels"]["x"] = value
    resp = _post(bridge, json.dumps(base).encode())
    assert resp.status_code in (200, 400), resp.text
    if resp.status_code == 400:
        assert bridge.ctx.store.alert_count() == before


@given(st.binary(max_size=2048))
@settings(max_examples=200, deadline=None, suppress_health_check=SUPPRESS)
def test_random_bytes(bridge, data):
    before = bridge.ctx.store.alert_count()
    resp = _post(bridge, data)
    assert resp.status_code == 400
    assert bridge.ctx.store.alert_count() == before


def test_unpaired_surrogates_and_extreme_times(bridge):
    before = bridge.ctx.store.alert_count()
    for raw in (b'{"version":"4","alerts":[{"status":"firing","labels":{"a":"\\ud800"},'
                b'"startsAt":"2026-01-01T00:00:00Z","fingerprint":"ab"}]}',
                b'{"version":"4","alerts":[{"status":"firing","labels":{"a":"b"},'
                b'"startsAt":"0001-01-01T00:00:00+05:00","fingerprint":"ab"}]}',
                b'{"version":"4","alerts":[{"status":"firing","labels":{"a":"b"},'
                b'"startsAt":"9999-12-31T23:59:59-05:00","fingerprint":"ab"}]}'):
        assert _post(bridge, raw).status_code == 400
    assert bridge.ctx.store.alert_count() == before
