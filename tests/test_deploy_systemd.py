"""deploy/systemd/: the exporter, bridge and quarantine units pass the real ``systemd-analyze
verify`` (with ExecStart pointed at this checkout's virtualenv, so the commands must exist), score
at most 2.0 on ``systemd-analyze security --offline`` (1.4-1.5 when written), run as their
dedicated users from the sysusers file, restart on failure, and start commands the installed
scripts accept with the paths docs/deploy-slurm.md installs."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
GUIDE = ROOT / "docs" / "deploy-slurm.md"
SYSUSERS = UNITS / "wandb-infra.sysusers.conf"
INSTALLED_VENV = "/opt/wandb-infra/venv/bin/"
ANALYZE = shutil.which("systemd-analyze")
NAMES = ("wandb-infra-exporter", "wandb-infra-bridge", "wandb-infra-quarantine")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (Debian package systemd; "
                            "setup/system-deps.sh installs it)")


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((UNITS / f"{name}.service").read_text())
    return parser


def _here(name: str, tmp_path: Path) -> Path:
    """The unit with its ExecStart in this checkout's virtualenv (verify checks it exists)."""
    text = (UNITS / f"{name}.service").read_text()
    assert INSTALLED_VENV in text
    path = tmp_path / f"{name}.service"
    path.write_text(text.replace(INSTALLED_VENV, f"{Path(sys.executable).parent}/"))
    return path


@needs_analyze
@pytest.mark.parametrize("name", NAMES)
def test_unit_passes_systemd_analyze_verify_without_a_warning(name, tmp_path):
    out = subprocess.run([ANALYZE, "verify", _here(name, tmp_path)], capture_output=True,
                         text=True, check=False, timeout=60)
    assert (out.returncode, out.stderr) == (0, ""), out.stderr


@needs_analyze
def test_verify_would_see_a_mistyped_option(tmp_path):
    """The check above can fail: an unknown key is a warning on stderr."""
    path = _here("wandb-infra-bridge", tmp_path)
    path.write_text(path.read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHom=yes"))
    out = subprocess.run([ANALYZE, "verify", path], capture_output=True, text=True, check=False,
                         timeout=60)
    assert "Unknown key 'ProtectHom'" in out.stderr


@needs_analyze
@pytest.mark.parametrize("name", NAMES)
def test_unit_is_hardened(name, tmp_path):
    """``--threshold=20``: fails above an exposure of 2.0 of systemd's 10-point scale."""
    out = subprocess.run([ANALYZE, "security", "--offline=yes", "--threshold=20",
                          _here(name, tmp_path)], capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", NAMES)
def test_unit_runs_as_its_own_user_without_privileges_and_restarts(name):
    service = _unit(name)["Service"]
    assert service["User"] == name
    users = [line.split()[1] for line in SYSUSERS.read_text().splitlines()
             if line.startswith("u ")]
    assert service["User"] in users
    assert service["Restart"] == "on-failure"
    assert service["NoNewPrivileges"] == "yes" and service["CapabilityBoundingSet"] == ""
    assert service["ProtectSystem"] == "strict"


@pytest.mark.parametrize("name", NAMES)
def test_unit_command_is_accepted_by_the_installed_script(name):
    command = shlex.split(_unit(name)["Service"]["ExecStart"])
    script = Path(sys.executable).parent / Path(command[0]).name
    assert command[0].startswith(INSTALLED_VENV) and script.exists()
    out = subprocess.run([script, *command[1:], "--help"], capture_output=True, text=True,
                         check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    config = command[command.index("--config") + 1]
    assert config in GUIDE.read_text(), f"{config} is not where the Slurm guide puts it"


def test_the_bridge_store_and_the_quarantine_share_the_state_directory():
    store = Path(yaml.safe_load((ROOT / "deploy" / "bridge.example.yaml").read_text())[
        "store"]["path"])
    bridge = _unit("wandb-infra-bridge")["Service"]
    quarantine = _unit("wandb-infra-quarantine")["Service"]
    assert store.parent == Path("/var/lib") / bridge["StateDirectory"]
    assert quarantine["ReadWritePaths"] == str(store.parent)
    assert quarantine["SupplementaryGroups"] == bridge["Group"]
    # the quarantine is in the bridge's group, and the bridge writes group-writable files
    assert f"m {quarantine['User']} {bridge['Group']}" in SYSUSERS.read_text()
    assert bridge["UMask"] == "0007"


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None,
                    reason="systemd-sysusers is not installed (Debian package systemd)")
def test_sysusers_file_creates_the_three_users(tmp_path):
    out = subprocess.run(["systemd-sysusers", "--dry-run", f"--root={tmp_path}", SYSUSERS],
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in NAMES:
        assert f"Creating user '{name}'" in out.stdout + out.stderr
