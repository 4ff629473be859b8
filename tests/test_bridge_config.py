"""Config values are taken literally from the environment and no error shows a secret, on the
real bridge process. Before: ``WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN='s3cret #rest'`` was read
as YAML, cut at the comment to ``s3cret``, and the cut token was accepted; a YAML error in the
config file echoed the offending line (the secret on it), and a scalar where a section belongs
echoed the scalar."""

from __future__ import annotations

import subprocess

import pytest
import requests

from harness.bridge_payloads import alert, notification
from harness.bridge_process import BRIDGE_CLI, ROOT, bridge_env, start_bridge

pytestmark = pytest.mark.integration

TOKEN = "s3cret #rest 'and' more: {x}"


def test_an_environment_token_is_taken_whole(tmp_path):
    env = bridge_env(tmp_path)
    del env["WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE"]
    env["WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN"] = TOKEN
    env["WANDB_INFRA_BRIDGE__LISTEN__IDLE_TIMEOUT_SECONDS"] = "20"  # typed keys still typed
    bridge = start_bridge(tmp_path, env)
    try:
        body = notification([alert("NodeDown", category="node", host="h1", run="r1")])
        for wrong in ("s3cret", "s3cret #rest"):
            assert bridge.post(body, headers={"Authorization": f"Bearer {wrong}",
                                              "Content-Type": "application/json"}
                               ).status_code == 401
        assert bridge.post(body, headers={"Authorization": f"Bearer {TOKEN}",
                                          "Content-Type": "application/json"}).status_code == 200
        assert TOKEN not in requests.get(bridge.url + "/metrics", timeout=10).text
    finally:
        bridge.stop()
    assert "s3cret" not in bridge.log.read_text()


@pytest.mark.parametrize(("config", "env", "said"), [
    ('auth:\n  bearer_token: "s3cret-in-yaml\nstore: {path: x}\n', {},
     "is not valid YAML at line"),
    ("auth:\n  bearer_token: s3cret-in-yaml\n  bearer_token: [s3cret-in-yaml\n", {},
     "is not valid YAML"),
    ("", {"WANDB_INFRA_BRIDGE__AUTH": "s3cret-in-env"}, "auth: must be a mapping, not a string"),
    ("", {"WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN": "s3cret-in-env",
          "WANDB_INFRA_BRIDGE__WANDB__API_KEY": "[s3cret-key"},
     "W&B API key is malformed"),
])
def test_config_errors_name_the_key_never_the_secret(tmp_path, config, env, said):
    path = tmp_path / "bridge.yaml"
    path.write_text(config)
    done = subprocess.run([*BRIDGE_CLI, "serve", "--config", str(path)], cwd=ROOT,
                          env={**bridge_env(tmp_path), **env}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0
    assert said in done.stderr
    assert "s3cret" not in done.stderr + done.stdout
