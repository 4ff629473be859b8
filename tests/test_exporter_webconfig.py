"""``--web.config.file`` (exporter-toolkit format): TLS and bcrypt basic auth, checked with
requests and with Prometheus itself scraping over TLS with basic auth."""

from __future__ import annotations

import asyncio
import base64
import http.client
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from harness.processes import free_port, prom_query, prometheus, wait_for
from wandb_infra.common import labels

EXPORTER = str(Path(sys.executable).parent / "wandb-infra-exporter")
TOKEN = "t" * 32


def _cert(tmp_path: Path) -> tuple[Path, Path]:
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True,
                   timeout=60)
    return crt, key


def _start(tmp_path: Path, web: dict) -> tuple[subprocess.Popen, str]:
    (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
    port = free_port()
    proc = subprocess.Popen(
        [EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
         f"--web.config.file={tmp_path / 'web.yml'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "WANDB_INFRA_EXPORTER__AUTH__TOKEN": TOKEN,
             "WANDB_INFRA_EXPORTER__REGISTRATIONS__STATE_FILE": str(tmp_path / "reg.json")})
    return proc, f"https://127.0.0.1:{port}"


@pytest.mark.integration
def test_tls_and_basic_auth_guard_the_read_endpoints(tmp_path):
    crt, key = _cert(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    proc, url = _start(tmp_path, {"tls_server_config": {"cert_file": crt.name,
                                                        "key_file": key.name},
                                  "basic_auth_users": {"prometheus": hashed}})
    try:
        def up() -> bool:
            try:
                return requests.get(url + "/healthz", verify=str(crt), timeout=2).status_code \
                    == 401
            except requests.ConnectionError:
                return False
        wait_for(up, 30, "the exporter over TLS")
        assert requests.get(url + "/metrics", verify=str(crt), timeout=5,
                            auth=("prometheus", "wrong")).status_code == 401
        ok = requests.get(url + "/metrics", verify=str(crt), timeout=5,
                          auth=("prometheus", "s3cret"))
        assert ok.status_code == 200 and "wandb_infra_exporter_build_info" in ok.text
        # the registration API keeps its bearer token, over the same TLS listener
        reg = requests.post(url + "/v1/runs", verify=str(crt), timeout=5,
                            headers={"Authorization": f"Bearer {TOKEN}"},
                            json={"entity": "acme", "project": "llm", "run_id": "r1",
                                  "hostname": "gpu-node-001", "gpus": ["0"]})
        assert reg.status_code == 201, reg.text
        with pytest.raises(requests.ConnectionError):
            requests.get(url.replace("https", "http") + "/metrics", timeout=5)

        target = url.removeprefix("https://")
        config = yaml.safe_dump({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "x", "scheme": "https",
                                "tls_config": {"ca_file": str(crt)},
                                "basic_auth": {"username": "prometheus", "password": "s3cret"},
                                "static_configs": [{"targets": [target]}]}]})
        with prometheus(config, tmp_path / "prom") as prom:
            rows = wait_for(lambda: prom_query(prom.url, f"count({labels.GPU_INFO})"), 30,
                            "the join metrics scraped over TLS with basic auth")
            assert rows[0]["value"][1] == "1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.integration
@pytest.mark.parametrize(("web", "message"), [
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}},
     "cannot load TLS files"),
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "bcrypt hashes"),
    ({"tls_server_confg": {}}, "unknown key tls_server_confg"),
])
def test_bad_web_config_is_one_line(tmp_path, web, message):
    (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
    proc = subprocess.run([EXPORTER, "--web.listen-address=127.0.0.1:9842",
                           f"--web.config.file={tmp_path / 'web.yml'}", "--check-config"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert message in line


def test_a_verified_password_is_not_hashed_again(monkeypatch):
    from wandb_infra.exporter.webconfig import WebConfig  # noqa: PLC0415 - the unit under test

    config = WebConfig(users={"p": bcrypt.hashpw(b"ok", bcrypt.gensalt(rounds=4))})
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda *a: calls.append(1) or real(*a))
    good = "Basic " + base64.b64encode(b"p:ok").decode()
    bad = "Basic " + base64.b64encode(b"p:no").decode()
    allows = lambda header: asyncio.run(config.allows(header))  # noqa: E731
    assert allows(good) and allows(good)
    assert not allows(bad) and not allows(bad)
    assert len(calls) == 2  # once each: a refused header is remembered too


def test_a_client_that_never_failed_is_checked_before_guessers():
    """16 guessing clients, each with a failed check behind it, queue a check each while one
    runs; then a scraper whose header is not verified yet (a restarted exporter) asks. It is
    checked next, not after the 16 (arrival order, before: 17th of 17)."""
    from wandb_infra.exporter.webconfig import WebConfig  # noqa: PLC0415 - the unit under test

    config = WebConfig(users={"scraper": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=8))})
    basic = lambda password: "Basic " + base64.b64encode(  # noqa: E731
        f"scraper:{password}".encode()).decode()
    guessers = [f"10.0.0.{n}" for n in range(16)]
    order: list[str] = []

    async def ask(client: str, password: str) -> None:
        assert await config.allows(basic(password), client) is (password == "s3cret")
        order.append(client)

    async def scenario() -> None:
        await asyncio.gather(*(ask(client, "first-guess-" + client) for client in guessers))
        await asyncio.gather(*(ask(client, "guess-" + client) for client in guessers),
                             ask("10.0.9.9", "s3cret"))

    asyncio.run(scenario())
    assert order[16:].index("10.0.9.9") <= 1, order[16:]


@pytest.mark.integration
def test_password_guessers_do_not_keep_a_restarted_exporter_s_scraper_out(tmp_path):
    """16 clients guessing passwords (each from its own address, each a new password every
    time) against a freshly started exporter, whose scraper's header is not verified yet.
    Before: they filled the one shared queue of 8 checks and the scraper got 503 on 20 of 20
    scrapes. Now each client has one check waiting at most."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    proc, url = _start(tmp_path, {"basic_auth_users": {"prometheus": hashed}})
    url = url.replace("https://", "http://")
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()

    def get(source: str, password: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                          source_address=(source, 0))
        token = base64.b64encode(f"prometheus:{password}".encode()).decode()
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
            return conn.getresponse().status
        except OSError:
            return 0
        finally:
            conn.close()

    def guess(n: int) -> None:
        tries = 0
        while not stop.is_set():
            tries += 1
            get(f"127.0.0.{n + 2}", f"guess-{n}-{tries}")

    try:  # a fresh process, as after a restart: nothing verified yet
        wait_for(lambda: get("127.0.0.200", "wrong") == 401 or None, 30, "the exporter")
        guessers = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(16)]
        for thread in guessers:
            thread.start()
        time.sleep(2)  # the guessers' checks are queued
        scrapes = [get("127.0.0.100", "s3cret") for _ in range(20)]
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=10)
    assert scrapes.count(200) == 20, scrapes
