"""The W&B stand-in behaves like the real API where our code and the real SDK depend on it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from harness.wandb_standin import WandbStandin, key_format_ok

RUN_QUERY = """
query Run($project: String!, $entity: String!, $name: String!) {
  project(name: $project, entityName: $entity) {
    run(name: $name) { id name displayName state tags notes config summaryMetrics projectId
      historyLineCount createdAt heartbeatAt user { name username } historyKeys }
  }
}"""


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"api:{key}".encode()).decode()}


def _gql(wb: WandbStandin, query: str, variables: dict | None = None, key: str | None = None,
         op: str | None = None) -> requests.Response:
    body = {"query": query, "variables": variables or {}}
    if op:
        body["operationName"] = op
    return requests.post(wb.url + "/graphql", json=body, headers=_auth(key or wb.api_key),
                         timeout=10)


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "abc123", tags=["mine"], notes="user notes",
                       config={"lr": {"value": 0.1}}, summary={"loss": 1.5})
        yield server


def test_key_format_rules():
    assert key_format_ok("a" * 40)
    assert key_format_ok("local-" + "b" * 40)
    assert key_format_ok("x.y.z")
    assert not key_format_ok("short")
    assert not key_format_ok("a" * 39)
    assert not key_format_ok("a" * 20 + " " + "a" * 20)


def test_auth_is_required(wb):
    query = "{ viewer { id } }"
    assert requests.post(wb.url + "/graphql", json={"query": query}, timeout=10).status_code == 401
    assert _gql(wb, query, key="z" * 40).status_code == 401
    assert _gql(wb, query, key="short").status_code == 401
    bad_user = {"Authorization": "Basic " + base64.b64encode(f"x:{wb.api_key}".encode()).decode()}
    assert requests.post(wb.url + "/graphql", json={"query": query}, headers=bad_user,
                         timeout=10).status_code == 401
    ok = _gql(wb, query)
    assert ok.status_code == 200 and ok.json()["data"]["viewer"]["id"]
    assert len(wb.rejected) == 4 and len(wb.requests) == 1
    wb.revoke()
    assert _gql(wb, query).status_code == 401


def test_unknown_fields_and_args_are_graphql_errors(wb):
    resp = _gql(wb, "{ viewer { id nonsense } }")
    assert resp.status_code == 200
    assert "nonsense" in resp.json()["errors"][0]["message"]
    resp = _gql(wb, '{ project(name: "proj", entityName: "team", bogus: 1) { id } }')
    assert resp.status_code == 200 and resp.json()["errors"]


def test_run_query_shape(wb):
    resp = _gql(wb, RUN_QUERY, {"project": "proj", "entity": "team", "name": "abc123"}, op="Run")
    run = resp.json()["data"]["project"]["run"]
    assert run["name"] == "abc123" and run["state"] == "running" and run["tags"] == ["mine"]
    assert json.loads(run["config"]) == {"lr": {"value": 0.1}}
    assert json.loads(run["summaryMetrics"]) == {"loss": 1.5}
    assert wb.requests[-1].operation_name == "Run"
    missing = _gql(wb, RUN_QUERY, {"project": "proj", "entity": "team", "name": "nope"})
    assert missing.json()["data"]["project"]["run"] is None


def test_runs_filters_and_pagination(wb):
    for i in range(5):
        wb.add_run("team", "proj", f"r{i}", state="finished" if i % 2 else "running")
    query = """query Runs($f: JSONString, $after: String) { project(name: "proj",
      entityName: "team") { runs(filters: $f, first: 2, after: $after, order: "+created_at") {
      edges { node { name state } cursor } pageInfo { endCursor hasNextPage } } } }"""
    names, after = [], None
    while True:
        data = _gql(wb, query, {"f": json.dumps({"state": "running"}), "after": after}).json()
        runs = data["data"]["project"]["runs"]
        names += [e["node"]["name"] for e in runs["edges"]]
        if not runs["pageInfo"]["hasNextPage"]:
            break
        after = runs["pageInfo"]["endCursor"]
    assert names == ["abc123", "r0", "r2", "r4"]
    both = json.dumps({"$or": [{"name": {"$in": ["r1", "r3"]}}, {"tags": "mine"}]})
    data = _gql(wb, query, {"f": both}).json()["data"]["project"]["runs"]
    assert [e["node"]["name"] for e in data["edges"]] == ["abc123", "r1"]


def test_minimal_upsert_bucket_changes_only_given_fields(wb):
    storage_id = wb.run("team", "proj", "abc123").storage_id
    mutation = """mutation UpsertBucket($id: String, $tags: [String!]) {
      upsertBucket(input: {id: $id, tags: $tags}) { bucket { id name } inserted } }"""
    resp = _gql(wb, mutation, {"id": storage_id, "tags": ["mine", "infra:GpuXidError"]})
    assert resp.json()["data"]["upsertBucket"] == {
        "bucket": {"id": storage_id, "name": "abc123"}, "inserted": False}
    run = wb.run("team", "proj", "abc123")
    assert run.tags == ["mine", "infra:GpuXidError"] and run.notes == "user notes"
    assert run.summary == {"loss": 1.5}
    unknown = _gql(wb, mutation, {"id": "nope", "tags": []}).json()
    assert unknown["errors"] and unknown["data"]["upsertBucket"] is None


def test_notify_scriptable_run_alert(wb):
    mutation = """mutation NotifyScriptableRunAlert($e: String!, $p: String!, $r: String!,
      $t: String!, $x: String!, $s: AlertSeverity = INFO) { notifyScriptableRunAlert(input:
      {entityName: $e, projectName: $p, runName: $r, title: $t, text: $x, severity: $s})
      { success } }"""
    resp = _gql(wb, mutation, {"e": "team", "p": "proj", "r": "abc123", "t": "XID 94",
                               "x": "GPU 3 on n1", "s": "ERROR"})
    assert resp.json()["data"]["notifyScriptableRunAlert"]["success"] is True
    assert wb.alerts[0]["severity"] == "ERROR"
    bad = _gql(wb, mutation, {"e": "team", "p": "proj", "r": "abc123", "t": "x", "x": "y",
                              "s": "LOUD"}).json()
    assert bad["errors"] and len(wb.alerts) == 1


def test_fault_injection(wb):
    wb.fail(503, times=2)
    wb.fail(429, times=1, retry_after=3)
    statuses = [_gql(wb, "{ viewer { id } }") for _ in range(4)]
    assert [r.status_code for r in statuses] == [503, 503, 429, 200]
    assert statuses[2].headers["Retry-After"] == "3"
    wb.fail(403, times=None, operation="UpsertBucket")
    assert _gql(wb, "{ viewer { id } }").status_code == 200
    up = "mutation UpsertBucket { upsertBucket(input: {id: \"x\"}) { inserted } }"
    assert _gql(wb, up, op="UpsertBucket").status_code == 403
    assert _gql(wb, up, op="UpsertBucket").status_code == 403
    wb.clear_faults()
    assert _gql(wb, up, op="UpsertBucket").status_code == 200
    wb.slow(0.3)
    assert _gql(wb, "{ viewer { id } }").elapsed.total_seconds() >= 0.3
    assert wb.rate(60) > 0
    assert requests.post(wb.url + "/sdk/otel/v1/metrics", data=b"x", headers=_auth(wb.api_key),
                         timeout=10).status_code == 404


WRITER = textwrap.dedent("""
    import sys, wandb
    run = wandb.init(id=sys.argv[1], project="proj", entity="team", settings=wandb.Settings(
        mode="shared", x_primary=False, x_label="infra-bridge", x_update_finish_state=False,
        x_disable_stats=True, console="off", save_code=False, x_disable_meta=True))
    run.log({"infra/issue": 1})
    run.log({"infra/issue": 0})
    run.finish()
""")


@pytest.mark.integration
def test_real_wandb_sdk_shared_mode_writer(wb, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env.update(HOME=str(tmp_path), WANDB_BASE_URL=wb.url, WANDB_API_KEY=wb.api_key,
               WANDB_DIR=str(tmp_path), WANDB_SILENT="true", WANDB__GRAPHQL_RETRY_MAX="1",
               WANDB_DISABLE_GIT="true")
    (tmp_path / "writer.py").write_text(WRITER)
    proc = subprocess.run([sys.executable, str(tmp_path / "writer.py"), "abc123"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = wb.run("team", "proj", "abc123")
    assert [row["infra/issue"] for row in run.history] == [1, 0]
    assert all("_timestamp" in row for row in run.history)
    assert run.state == "running", "a non-primary writer must not finish the user's run"
    assert run.tags == ["mine"] and run.notes == "user notes"
    assert run.config["lr"] == {"value": 0.1}
    assert wb.calls(operation="UpsertBucket")
    assert wb.calls(path_prefix="/files/team/proj/abc123/file_stream")


PUBLIC_API = textwrap.dedent("""
    import json, wandb
    api = wandb.Api(timeout=10)
    run = api.run("team/proj/abc123")
    runs = [r.id for r in api.runs("team/proj", filters={"state": "running"})]
    print(json.dumps({"state": run.state, "tags": run.tags, "config": run.config,
                      "summary": dict(run.summary), "notes": run.notes, "runs": runs}))
""")


@pytest.mark.integration
def test_real_wandb_public_api_reads(wb, tmp_path: Path):
    wb.add_run("team", "proj", "done1", state="finished")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env.update(HOME=str(tmp_path), WANDB_BASE_URL=wb.url, WANDB_API_KEY=wb.api_key,
               WANDB_SILENT="true", WANDB__GRAPHQL_RETRY_MAX="1")
    (tmp_path / "reader.py").write_text(PUBLIC_API)
    proc = subprocess.run([sys.executable, str(tmp_path / "reader.py")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"state": "running", "tags": ["mine"], "config": {"lr": 0.1},
                   "summary": {"loss": 1.5}, "notes": "user notes", "runs": ["abc123"]}
    assert not [r for r in wb.requests if r.status != 200]
