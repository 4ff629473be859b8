"""deploy/slurm/wandb-sbatch against a REAL single-node Slurm 22.05 (tests/slurm_cluster.py), as
docs/deploy-slurm.md tells a site to run it: the shipped prolog/epilog take the exporter's URL and
token file from the node's defaults file (the guide's own lines) and register with an exporter
that requires that token, a central exporter reads ``squeue --json``, and inside the job the real
``wandb`` SDK (offline) and ``wandb_infra.exporter.client`` see the run the wrapper chose. Every
path must agree on entity, project, run id, host and GPU."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
import requests
import yaml

from harness import processes
from harness.exporter_process import metric_samples, running_exporter
from harness.processes import PROMTOOL, free_port, wait_for
from tests.slurm_cluster import SHIPPED_HOOKS, SlurmCluster, slurm_cluster, unavailable_reason
from wandb_infra.common import labels
from wandb_infra.common.nodestate import STATE

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "slurm"
WRAPPER = DEPLOY / "wandb-sbatch"

JOB = textwrap.dedent("""\
    #!/bin/bash
    #SBATCH --comment="nightly eval"
    #SBATCH --gres=gpu:1
    {python} - > {out}.tmp <<'EOF'
    import json, os
    import wandb
    from wandb_infra.exporter.client import build_payload
    run = wandb.init(mode="offline", dir=os.environ["JOB_DIR"], settings=wandb.Settings(
        x_disable_stats=True, console="off", save_code=False))
    print(json.dumps({{"run": [run.project, run.id],
                      "env": {{k: v for k, v in os.environ.items() if k.startswith("WANDB_")}},
                      "client": build_payload(run)}}))
    run.finish()
    EOF
    mv {out}.tmp {out}
    sleep 300
    """)


GUIDE = ROOT / "docs" / "deploy-slurm.md"


class Site(NamedTuple):
    """The running site: Slurm, the registration exporter, the central (squeue) exporter, the
    nodes' defaults file and the token file it names."""

    slurm: SlurmCluster
    reg_url: str
    central_url: str
    defaults: Path
    token: Path


def guide_defaults(url: str, token_file: Path) -> str:
    """The guide's /etc/default/wandb-infra-exporter lines, with this site's exporter URL and
    token file in place of its example values (so a renamed setting fails here)."""
    block = re.search(r"```sh\n(WANDB_INFRA_EXPORTER_URL=.*?)```", GUIDE.read_text(), re.S)
    assert block, "the defaults file is missing from docs/deploy-slurm.md"
    values = {"WANDB_INFRA_EXPORTER_URL": url, "WANDB_INFRA_EXPORTER_TOKEN_FILE": str(token_file)}
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    keys = [line.split("=", 1)[0] for line in lines if line]
    assert keys == list(values), keys
    return "".join(f"{key}={shlex.quote(values[key])}\n" for key in keys)


def guide_exporter_config() -> dict:
    """The central exporter's configuration as the guide writes it (listen is the test's)."""
    block = re.search(r"```yaml\n# /etc/wandb-infra-exporter/exporter.yaml[^\n]*\n(.*?)```",
                      GUIDE.read_text(), re.S)
    assert block, "the exporter's configuration is missing from docs/deploy-slurm.md"
    return yaml.safe_load(block.group(1))


def hook_reading(path: Path, script: str, defaults: Path) -> str:
    """The shipped prolog/epilog (``script``) as slurm.conf runs it, reading its settings from
    ``defaults`` (the test cannot write the real /etc/default/wandb-infra-exporter); returns
    the wrapper's path."""
    path.write_text("#!/bin/bash\n"
                    f"export WANDB_INFRA_EXPORTER_ENV_FILE={shlex.quote(str(defaults))}\n"
                    f"exec {SHIPPED_HOOKS / script}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Slurm with the shipped prolog/epilog configured through the node's defaults file, the
    exporter they register with (``auth.token_file``: refuses any request without the token),
    and a central exporter with the squeue source (the two placements the guide describes)."""
    reason = unavailable_reason()
    assert reason is None, reason  # setup/system-deps.sh installs Slurm and munge
    base = tmp_path_factory.mktemp("slurm-deploy")
    reg_port = free_port()
    token = base / "token"
    token.write_text(secrets.token_urlsafe(24) + "\n")
    token.chmod(0o600)
    defaults = base / "default-wandb-infra-exporter"
    defaults.write_text(guide_defaults(f"http://127.0.0.1:{reg_port}", token))
    prolog = hook_reading(base / "prolog", "prolog.sh", defaults)
    epilog = hook_reading(base / "epilog", "epilog.sh", defaults)
    with running_exporter({"auth": {"token_file": str(token)}}, base / "registrations",
                          port=reg_port) as reg_url, \
            slurm_cluster(base / "cluster", gpus=2, prolog=prolog, epilog=epilog) as slurm:
        central = guide_exporter_config()
        central["sources"]["slurm"]["interval_seconds"] = 0.5
        central["node_state"]["slurm"]["interval_seconds"] = 0.5
        with running_exporter(central, base / "central", env=slurm.env()) as central_url:
            yield Site(slurm, reg_url, central_url, defaults, token)


def wandb_sbatch(slurm, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in slurm.env().items() if not k.startswith("WANDB_")}
    return subprocess.run([str(WRAPPER), *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


def _runs(url: str, name: str) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for sample in metric_samples(url, name):
        out.setdefault(sample[labels.RUN_ID], []).append(sample)
    return out


def test_wrapper_run_reaches_prolog_squeue_sdk_and_client_alike(site, tmp_path):
    slurm, reg_url, central_url = site.slurm, site.reg_url, site.central_url
    out = tmp_path / "job.json"
    script = tmp_path / "train.sh"
    script.write_text(JOB.format(python=sys.executable, out=out))
    script.chmod(0o755)
    env = {"JOB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    sub = wandb_sbatch(slurm, "--entity", "acme", "--project", "llm-pretrain", "--parsable",
                       "--chdir", str(tmp_path), "-o", str(tmp_path / "slurm.out"),
                       str(script), env=env)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    assert job.isdigit(), sub.stdout  # sbatch's --parsable output passed through
    run_id = sub.stderr.strip().rsplit("/", 1)[1]
    assert len(run_id) == 8 and run_id.isalnum() and run_id.islower(), sub.stderr
    try:
        slurm.wait_state(job, {"RUNNING"})
        # The job's comment: the script's own, with the tag appended.
        comment = slurm.run("squeue", "-h", "-j", job, "-o", "%k").strip()
        assert comment == f"nightly eval wandb:acme/llm-pretrain/{run_id}"

        seen = json.loads(wait_for(lambda: out.exists() and out.read_text(), timeout=120))
        assert seen["run"] == ["llm-pretrain", run_id], "wandb.init() took the wrapper's run"
        assert {k: seen["env"][k] for k in ("WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID",
                                             "WANDB_RESUME")} == \
            {"WANDB_ENTITY": "acme", "WANDB_PROJECT": "llm-pretrain", "WANDB_RUN_ID": run_id,
             "WANDB_RESUME": "allow"}
        client = seen["client"]
        assert (client["entity"], client["project"], client["run_id"]) == \
            ("acme", "llm-pretrain", run_id)
        assert client["hostname"] == slurm.node and client["slurm_job_id"] == job

        # Central exporter (squeue) and per-node prolog registration: the same run, host, GPU.
        central = wait_for(lambda: _runs(central_url, labels.GPU_INFO).get(run_id))
        registered = wait_for(lambda: _runs(reg_url, labels.GPU_INFO).get(run_id))
        assert [(s["wandb_entity"], s["wandb_project"], s["hostname"], s["gpu"])
                for s in central] == \
            [(s["wandb_entity"], s["wandb_project"], s["hostname"], s["gpu"])
             for s in registered]
        assert central[0]["wandb_entity"] == "acme" and central[0]["hostname"] == slurm.node
        assert [str(g) for g in client["gpus"]] == [central[0]["gpu"]]
    finally:
        slurm.run("scancel", job)
    wait_for(lambda: run_id not in _runs(reg_url, labels.NODE_INFO))  # the epilog ran
    wait_for(lambda: run_id not in _runs(central_url, labels.NODE_INFO))


def test_the_guides_exporter_publishes_each_nodes_scheduler_state(site):
    """node_state in the guide's configuration: the restart verdict's input (without it every
    verdict is "unknown"), read from the real slurmctld."""
    slurm = site.slurm
    state = wait_for(lambda: metric_samples(site.central_url, STATE))
    assert [(s["hostname"], s["scheduler"]) for s in state] == [(slurm.node, "slurm")]
    slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=DRAIN",
              "Reason=guide check")
    try:
        drained = wait_for(lambda: [s for s in metric_samples(site.central_url, STATE)
                                    if "DRAIN" in s["state"]])
        assert drained[0]["reason"] == "guide check"
    finally:
        slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")


def test_exporter_requires_the_token_the_defaults_file_names(site, tmp_path):
    """The guide's token setup end to end: the registration API refuses a request without the
    token (or with another) and takes the token file's; a node whose defaults file names no
    readable token file registers nothing when its job starts, and the same job registers once
    the file names it again (the prolog reads the file at every job)."""
    slurm, reg_url = site.slurm, site.reg_url
    token = site.token.read_text().strip()
    body = {"entity": "acme", "project": "auth", "run_id": "direct1", "hostname": slurm.node,
            "gpus": ["0"]}
    for headers in ({}, {"Authorization": "Bearer not-" + token}):
        refused = requests.post(f"{reg_url}/v1/runs", json=body, headers=headers, timeout=10)
        assert refused.status_code == 401, refused.text
    accepted = requests.post(f"{reg_url}/v1/runs", json=body, timeout=10,
                             headers={"Authorization": f"Bearer {token}"})
    assert accepted.status_code == 201, accepted.text
    assert "direct1" in _runs(reg_url, labels.NODE_INFO)
    gone = requests.delete(f"{reg_url}/v1/runs/acme/auth/direct1", timeout=10,
                           headers={"Authorization": f"Bearer {token}"})
    assert gone.status_code == 200, gone.text

    def job(run_id: str) -> str:
        """A job naming ``run_id`` whose batch script (started after the prolog) says so."""
        started = tmp_path / f"{run_id}.started"
        job_id = slurm.submit("--comment", f"wandb:acme/auth/{run_id}", "--gres=gpu:1",
                              "--chdir", str(tmp_path), "-o", "/dev/null",
                              "--wrap", f"touch {started}; sleep 300")
        wait_for(started.exists, timeout=60)
        return job_id

    configured = site.defaults.read_text()
    site.defaults.write_text(configured.replace(str(site.token), str(tmp_path / "no-token")))
    try:
        refused_job = job("notoken1")
    finally:
        site.defaults.write_text(configured)
    try:
        assert "notoken1" not in _runs(reg_url, labels.NODE_INFO)
    finally:
        slurm.run("scancel", refused_job)
    slurm.wait_state(refused_job, {""})  # its epilog is over: it cannot delete the next one
    accepted_job = job("notoken1")
    try:
        [gpu] = wait_for(lambda: _runs(reg_url, labels.GPU_INFO).get("notoken1"))
        assert (gpu["hostname"], gpu["wandb_project"]) == (slurm.node, "auth")
    finally:
        slurm.run("scancel", accepted_job)
    wait_for(lambda: "notoken1" not in _runs(reg_url, labels.NODE_INFO))  # the epilog's token


def test_wrapper_keeps_a_chosen_run_id_and_the_users_comment(site, tmp_path):
    """A resubmission of the same run (WANDB_RUN_ID already set) and --comment on the command
    line: the id is kept, the comment merged."""
    slurm, central_url = site.slurm, site.central_url
    sub = wandb_sbatch(slurm, "--project", "llm", "--parsable", "--comment", "ablation 3",
                       "--chdir", str(tmp_path), "-o", "/dev/null", "--wrap", "sleep 300",
                       env={"WANDB_RUN_ID": "resume-42", "WANDB_ENTITY": "acme"})
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    try:
        slurm.wait_state(job, {"RUNNING"})
        assert slurm.run("squeue", "-h", "-j", job, "-o", "%k").strip() == \
            "ablation 3 wandb:acme/llm/resume-42"
        node = wait_for(lambda: _runs(central_url, labels.NODE_INFO).get("resume-42"))
        assert node[0]["slurm_job_id"] == job
    finally:
        slurm.run("scancel", job)


@pytest.mark.parametrize(("args", "message"), [
    (["--entity", "acme/x", "--project", "p"], "entity"),
    (["--entity", "acme", "--project", "p", "--run-id", "a b"], "run id"),
    (["--project", "p"], "no W&B entity"),
])
def test_wrapper_refuses_names_the_prolog_cannot_carry_without_submitting(site, tmp_path, args,
                                                                           message):
    slurm = site.slurm
    before = slurm.run("squeue", "-h", "-o", "%i").split()
    sub = wandb_sbatch(slurm, *args, "--chdir", str(tmp_path), "--wrap", "true")
    assert sub.returncode == 2 and message in sub.stderr, sub.stderr
    # nothing new was submitted (an earlier test's job may leave the queue meanwhile)
    assert set(slurm.run("squeue", "-h", "-o", "%i").split()) <= set(before)


def test_wrapper_help_is_its_header():
    out = subprocess.run([str(WRAPPER), "--help"], capture_output=True, text=True, check=False,
                         env={"PATH": os.environ["PATH"]}, timeout=30)
    assert out.returncode == 0 and "--comment \"wandb:<entity>/<project>/<run_id>\"" in out.stdout


def test_site_rules_as_the_guide_generates_them(tmp_path):
    """The guide's generator command (runbook base for a non-Kubernetes site, DCGM < 4.1 unit),
    into a directory of its own; promtool accepts the result."""
    guide = (ROOT / "docs" / "deploy-slurm.md").read_text()
    command = re.search(r"python -m wandb_infra\.alert_rules\.generate (.*?)\n# ->", guide, re.S)
    assert command, "the generator command is missing from docs/deploy-slurm.md"
    words = shlex.split(re.sub(r"#[^\n]*", "", command.group(1)).replace("\\\n", " "))
    words[words.index("--out-dir") + 1] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "wandb_infra.alert_rules.generate", *words],
                         capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rules = tmp_path / "alert_rules" / "wandb-infra.rules.yml"
    base = words[words.index("--runbook-base") + 1]
    urls = re.findall(r"runbook_url: (\S+)", rules.read_text())
    assert urls and all(u.startswith(base + "/runbook#") for u in urls)
    assert "svc" not in base
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                           text=True, timeout=300, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert (ROOT / "alert_rules" / "wandb-infra.rules.yml").read_text() != rules.read_text()


def _unit_command(name: str, config: Path) -> list[str]:
    """A deploy/systemd unit's ExecStart, with this checkout's virtualenv and ``config``."""
    unit = (ROOT / "deploy" / "systemd" / f"{name}.service").read_text()
    command = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))
    command[0] = str(Path(sys.executable).parent / Path(command[0]).name)
    command[command.index("--config") + 1] = str(config)
    return command


def test_the_guides_units_give_restart_verdicts_from_the_nodes_state(site, tmp_path):
    """The guide followed where systemd cannot run: the bridge and the quarantine started with
    their units' commands and the example configuration as the guide edits it, a Prometheus
    scraping the guide's exporter; a run's GPU fault gets a restart verdict that reads the
    node's Slurm state, not "unknown"."""
    slurm = site.slurm
    token = tmp_path / "webhook-token"
    token.write_text(secrets.token_hex(24))
    port = free_port()
    prom_config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                   "scrape_configs": [{"job_name": "wandb-infra-exporter", "static_configs": [
                       {"targets": [site.central_url.removeprefix("http://")]}]}]}
    with processes.prometheus(yaml.safe_dump(prom_config), tmp_path / "prometheus") as prom:
        config = yaml.safe_load((ROOT / "deploy" / "bridge.example.yaml").read_text())
        config["listen"]["port"] = port
        config["auth"]["bearer_token_file"] = str(token)
        config["store"]["path"] = str(tmp_path / "state" / "bridge.sqlite")
        config["wandb"].pop("api_key_file")
        # no GPU here, so no rule raises the alert: the test posts it, and the bridge is told
        # not to look for it in Prometheus' ALERTS
        config["prometheus"].update(url=prom.url, node_state_refresh_seconds=1,
                                    verify_run_placement=False)
        config["quarantine"].update(enabled=True, dry_run=True)
        (tmp_path / "state").mkdir()
        (tmp_path / "bridge.yaml").write_text(yaml.safe_dump(config))
        bridge_command = _unit_command("wandb-infra-bridge", tmp_path / "bridge.yaml")
        with processes.running(bridge_command, tmp_path / "state", "bridge", port, "/healthz"):
            quarantine = subprocess.Popen(
                _unit_command("wandb-infra-quarantine", tmp_path / "bridge.yaml"),
                cwd=tmp_path / "state", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            sub = wandb_sbatch(slurm, "--entity", "acme", "--project", "llm", "--run-id",
                               "verdict-1", "--gres=gpu:1", "--parsable", "--chdir",
                               str(tmp_path), "-o", "/dev/null", "--wrap", "sleep 300")
            assert sub.returncode == 0, sub.stderr
            job = sub.stdout.strip()
            try:
                wait_for(lambda: processes.prom_query(
                    prom.url, 'wandb_run_node_info{wandb_run_id="verdict-1"}'), 30)
                wait_for(lambda: processes.prom_query(prom.url, STATE), 30)
                # firing for four days: older than the bridge's recent window, still refreshed
                began = datetime.now(UTC) - timedelta(days=4)
                alert = {"status": "firing", "startsAt": began.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "0123456789abcdef",
                         "annotations": {"summary": "x"}, "labels": {
                             "alertname": "GpuUncontainedEccError", "severity": "critical",
                             "category": "gpu_hardware", "hostname": slurm.node, "gpu": "0",
                             "xid": "95", "wandb_entity": "acme", "wandb_project": "llm",
                             "wandb_run_id": "verdict-1"}}
                body = {"version": "4", "status": "firing", "receiver": "wandb.bridge",
                        "groupKey": "g", "truncatedAlerts": 0, "groupLabels": {},
                        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
                        "alerts": [alert]}
                auth = {"Authorization": f"Bearer {token.read_text()}"}
                url = f"http://127.0.0.1:{port}"
                requests.post(url + "/alertmanager", json=body, headers=auth,
                              timeout=10).raise_for_status()

                def verdict() -> dict | None:
                    view = requests.get(url + "/runs/acme/llm/verdict-1", timeout=10,
                                        headers={**auth, "Accept": "application/json"}).json()
                    rem = view.get("remediation") or {}
                    return rem if rem.get("verdict") not in (None, "unknown") else None

                rem = wait_for(verdict, 60, "a restart verdict with the node's state")
                assert rem["verdict"] == "unsafe", rem
                assert f"{slurm.node} is schedulable" in rem["detail"], rem
                assert quarantine.poll() is None, quarantine.stderr.read().decode()[-2000:] \
                    if quarantine.stderr else ""
            finally:
                slurm.run("scancel", job)
                quarantine.terminate()
                quarantine.wait(10)
