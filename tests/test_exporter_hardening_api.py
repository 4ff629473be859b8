"""The registration API and basic auth against forged, greedy and timing clients.

In-process: the exporter's aiohttp app on a loopback port, clients through ``requests``."""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import pytest
import requests

from harness.bridge_payloads import serve_app
from harness.processes import free_port, wait_for
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.placements import PlacementMerger
from wandb_infra.exporter.pushed import RegistrationStore
from wandb_infra.exporter.server import HostToken, build_app
from wandb_infra.exporter.webconfig import WebConfig

REG = {"entity": "ent", "project": "proj", "run_id": "run1", "hostname": "gpu01"}
ADMIN = "admin-token-0123456789abcdef"
RACK_B = "rack-b-token-0123456789abcdef"


@contextlib.contextmanager
def _serve(store: RegistrationStore, **kwargs: object) -> Iterator[str]:
    merger = PlacementMerger(HostnameMapper(), grace_seconds=300,
                             live_sources=[("registrations", store.active)],
                             live_version=store.version)
    with serve_app(build_app(merger, store, **kwargs), free_port()) as url:  # type: ignore[arg-type]
        yield url


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- host binding on the canonical key ---------------------------------------------------------

@pytest.fixture
def racks() -> Iterator[tuple[str, RegistrationStore]]:
    store = RegistrationStore()
    bound = [HostToken(RACK_B, ("*.rack-b.example.com", "gpu-b*"))]
    with _serve(store, token=ADMIN, host_tokens=bound) as url:
        yield url, store


def test_a_domain_pattern_does_not_reach_another_racks_host(racks):
    """``gpu-a01.rack-b.example.com`` matched ``*.rack-b.example.com`` and was stored as rack
    A's ``gpu-a01`` once the domain was stripped; now the canonical key is what is checked."""
    url, store = racks
    admin = requests.post(url + "/v1/runs", json={**REG, "hostname": "gpu-a01"},
                          headers=_bearer(ADMIN), timeout=5)
    assert admin.status_code == 201
    forged = requests.post(url + "/v1/runs", headers=_bearer(RACK_B), timeout=5,
                           json={**REG, "run_id": "fake", "hostname": "gpu-a01.rack-b.example.com"})
    assert forged.status_code == 403, forged.text
    assert "gpu-a01" in forged.json()["error"]
    deleted = requests.delete(url + "/v1/runs/ent/proj/run1?hostname=gpu-a01.rack-b.example.com",
                              headers=_bearer(RACK_B), timeout=5)
    assert deleted.status_code == 403, deleted.text
    assert [(p.run.run_id, p.host) for p in store.active()] == [("run1", "gpu-a01")]
    own = requests.post(url + "/v1/runs", json={**REG, "hostname": "GPU-B07.rack-b.example.com"},
                        headers=_bearer(RACK_B), timeout=5)
    assert own.status_code == 201  # its own host, however it is spelt, still works
    assert requests.delete(url + "/v1/runs/ent/proj/run1?hostname=gpu-b07", timeout=5,
                           headers=_bearer(RACK_B)).json() == {"deleted": 1}


# -- browser-forgeable requests ----------------------------------------------------------------

@pytest.fixture(scope="module")
def open_loopback() -> Iterator[tuple[str, RegistrationStore]]:
    """What a loopback exporter without a token looks like (allowed to start)."""
    store = RegistrationStore()
    with _serve(store) as url:
        yield url, store


BODY = b'{"entity": "ent", "project": "proj", "run_id": "forged", "hostname": "gpu01"}'


@pytest.mark.parametrize(("headers", "status"), [
    # what <form enctype=text/plain> or fetch(..., {mode: "no-cors"}) sends from any page
    ({"Content-Type": "text/plain;charset=UTF-8", "Origin": "https://evil.example",
      "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, 403),
    ({"Content-Type": "text/plain"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ({}, 415),
    # JSON, but from a page: cross-site, or "same-origin" after DNS rebinding
    ({"Content-Type": "application/json", "Origin": "https://evil.example"}, 403),
    ({"Content-Type": "application/json", "Origin": "null"}, 403),
    ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:9842"}, 403),
    ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-origin"}, 403),
    ({"Content-Type": "application/json", "Sec-Fetch-Mode": "cors"}, 403),
])
def test_browser_forgeable_posts_are_refused_on_loopback(open_loopback, headers, status):
    url, store = open_loopback
    resp = requests.post(url + "/v1/runs", data=BODY, headers=headers, timeout=5)
    assert resp.status_code == status, resp.text
    assert not [p for p in store.active() if p.run.run_id == "forged"]


def test_programs_still_register_and_delete_on_loopback(open_loopback):
    url, store = open_loopback
    for content_type in ("application/json", "application/json; charset=utf-8"):
        resp = requests.post(url + "/v1/runs", data=BODY, headers={"Content-Type": content_type},
                             timeout=5)
        assert resp.status_code in (200, 201), resp.text
    # the Slurm epilog's curl -X DELETE sends no body and no Content-Type
    assert requests.delete(url + "/v1/runs/ent/proj/forged?hostname=gpu01", timeout=5
                           ).json() == {"deleted": 1}
    assert not store.active()


@pytest.mark.parametrize(("headers", "status"), [
    ({"Origin": "http://127.0.0.1:9842"}, 403), ({"Sec-Fetch-Site": "same-origin"}, 403),
    ({"Content-Type": "text/plain"}, 415),
])
def test_browser_forgeable_deletes_are_refused_on_loopback(open_loopback, headers, status):
    url, store = open_loopback
    assert requests.post(url + "/v1/runs", data=BODY, timeout=5, headers={
        "Content-Type": "application/json"}).status_code in (200, 201)
    resp = requests.delete(url + "/v1/runs/ent/proj/forged", headers=headers, timeout=5)
    assert resp.status_code == status, resp.text
    assert [p.run.run_id for p in store.active()] == ["forged"]
    store.delete(next(iter(store.active())).run)


# -- per-token quotas --------------------------------------------------------------------------

def test_one_nodes_token_cannot_fill_the_store():
    """Node A's token registering runs on its host until refused leaves room for node B."""
    store = RegistrationStore(max_series=3000)  # the default per-token quota: 1000 series
    tokens = [HostToken(f"node-{n}-token-0123456789", (f"gpu0{n}",)) for n in (1, 2)]
    with _serve(store, token=ADMIN, host_tokens=tokens) as url:
        def post(token: str, host: str, run: str, gpus: int = 8) -> requests.Response:
            return requests.post(url + "/v1/runs", headers=_bearer(token), timeout=5, json={
                **REG, "hostname": host, "run_id": run, "gpus": list(range(gpus))})
        statuses = [post(tokens[0].token, "gpu01", f"flood{i}").status_code for i in range(120)]
        accepted = statuses.count(201)
        assert accepted == 1000 // 9 and set(statuses[accepted:]) == {503}, statuses
        refused = post(tokens[0].token, "gpu01", "one-more")
        assert "max_series_per_token" in refused.json()["error"]
        assert post(tokens[0].token, "gpu01", "flood0").status_code == 200  # heartbeat fits
        assert post(tokens[1].token, "gpu02", "real").status_code == 201
        assert post(ADMIN, "gpu03", "admin", 64).status_code == 201  # auth.token: no quota
        assert requests.delete(url + "/v1/runs/ent/proj/flood1?hostname=gpu01", timeout=5,
                               headers=_bearer(tokens[0].token)).json() == {"deleted": 1}
        assert post(tokens[0].token, "gpu01", "one-more").status_code == 201  # room given back


def test_quota_is_given_back_on_expiry_and_moves_with_the_writer():
    now = [1000.0]
    store = RegistrationStore(max_series_per_owner=4, clock=lambda: now[0])
    placement = PlacementMerger().canonical
    from wandb_infra.exporter.pushed import parse_registration  # noqa: PLC0415 - local helper

    def reg(run: str, gpus: int) -> object:
        return placement(parse_registration({**REG, "run_id": run, "gpus": list(range(gpus))},
                                            "registrations", 60, 60)[0])
    assert store.put(reg("a", 3), 10, owner="node1")  # 4 series
    with pytest.raises(OverflowError, match="max_series_per_token"):
        store.put(reg("b", 0), 10, owner="node1")
    assert store.put(reg("b", 0), 10, owner="node2")
    assert not store.put(reg("b", 0), 10, owner=None)  # refreshed by the admin token: not node2's
    assert store.put(reg("c", 3), 10, owner="node2")
    now[0] += 11
    assert store.put(reg("d", 3), 10, owner="node1")  # "a" expired: its quota is free again


# -- basic auth off the event loop, without a timing oracle ------------------------------------

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10))


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    store = RegistrationStore()
    merger = PlacementMerger(HostnameMapper(), live_sources=[("registrations", store.active)],
                             live_version=store.version)
    app = build_app(merger, store, token=ADMIN)
    app.middlewares.append(WebConfig(users={"prometheus": HASH}).middleware())
    with serve_app(app, free_port()) as url:
        yield url


def test_unauthenticated_clients_do_not_stall_metrics(guarded, monkeypatch):
    """40 clients sending wrong passwords while Prometheus, verified once, scrapes, and every
    password check is held until the scrapes are done: all 10 scrapes are answered, so none
    waits for a check (with bcrypt on the event loop the held check stopped every scrape; the
    old timed form of this test saw 9 s)."""
    url = guarded
    scraper = requests.Session()
    assert scraper.get(url + "/metrics", headers=_basic("prometheus", "s3cret"),
                       timeout=10).status_code == 200
    held, stop = threading.Event(), threading.Event()
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda *a: held.wait(30) and real(*a))
    statuses: list[int] = []

    def attack(i: int) -> None:
        with requests.Session() as session:
            while not stop.is_set():
                user = "prometheus" if i % 2 else f"user{i}"  # known and unknown users
                statuses.append(session.get(url + "/metrics", timeout=60,
                                            headers=_basic(user, f"guess{i}")).status_code)
    with ThreadPoolExecutor(40) as pool:
        for i in range(40):
            pool.submit(attack, i)
        try:
            wait_for(lambda: 503 in statuses, 10, what="the checks queue full")
            answers = [scraper.get(url + "/metrics", headers=_basic("prometheus", "s3cret"),
                                   timeout=10).status_code for _ in range(10)]
        finally:
            stop.set()
            held.set()
    assert answers == [200] * 10
    assert set(statuses) <= {401, 503} and 401 in statuses and 503 in statuses


def test_unknown_users_cost_as_much_as_known_ones(guarded, monkeypatch):
    """An unknown user's password is checked against a hash of the configured cost (10), as a
    known user's is, so the time taken tells nothing (a cost-4 dummy answered in 3 % of the
    time). Read from the hashes bcrypt is given, not from timings."""
    costs: list[tuple[str, int]] = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, hashed: costs.append(
        (password.decode(), int(hashed.split(b"$")[2]))) or real(password, hashed))
    for user in ("prometheus", "nobody"):
        assert requests.get(guarded + "/metrics", headers=_basic(user, f"wrong-{user}"),
                            timeout=10).status_code == 401
    assert costs == [("wrong-prometheus", 10), ("wrong-nobody", 10)]
