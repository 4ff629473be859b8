"""Bridge configuration: defaults, one YAML file, ``WANDB_INFRA_BRIDGE__*`` overrides, secrets.

Secrets (webhook bearer token, basic-auth password, page token, W&B API key) come from
``*_file`` keys (preferred) or a literal / ``env:NAME`` value, and never appear in ``repr`` or
logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb_infra.bridge.diagnosis.verdict import DEFAULT_SETTLE, Policy
from wandb_infra.bridge.ingest.identity import DEFAULT_PATHS
from wandb_infra.bridge.projection.delivery import DeliveryPolicy
from wandb_infra.bridge.projection.markers import MARKER_SETTLE
from wandb_infra.bridge.projection.wandb_client import RUN_METRICS
from wandb_infra.bridge.prometheus.endings import EndingsPolicy
from wandb_infra.bridge.quarantine import actuator as quarantine
from wandb_infra.common.configfile import ConfigError, load_config, read_secret
from wandb_infra.common.nodestate import DEFAULT_TOLERATED

ENV_PREFIX = "WANDB_INFRA_BRIDGE"

DEFAULTS: dict[str, Any] = {
    "listen": {"host": "127.0.0.1", "port": 9461, "idle_timeout_seconds": 15.0,
               "max_connections": 512},
    "log_level": "info",
    "auth": {
        "bearer_token": None, "bearer_token_file": None,
        "basic_username": None, "basic_password": None, "basic_password_file": None,
        "public_pages": False,
        "pages_token": None, "pages_token_file": None, "pages_accept_webhook_credentials": None,
        "secure_cookie": None,
    },
    "webhook": {"path": "/alertmanager", "max_body_bytes": 8 * 1024 * 1024,
                "body_timeout_seconds": 30.0, "max_inflight_bytes": 32 * 1024 * 1024},
    "store": {"path": "bridge-state/bridge.sqlite", "retention_days": 30,
              "min_free_bytes": 16 * 1024 * 1024},
    "identity": dict(DEFAULT_PATHS),
    "prometheus": {"url": "", "timeout_seconds": 5.0, "node_state_refresh_seconds": 60.0,
                   "tolerated_taints": list(DEFAULT_TOLERATED), "verify_run_placement": True},
    "wandb": {
        "base_url": "https://api.wandb.ai", "api_key": None, "api_key_file": None,
        "timeout_seconds": 30.0, "markers": True, "notify_critical": False,
        "flush_interval_seconds": 10.0, "backoff_base_seconds": 2.0,
        "backoff_max_seconds": 300.0, "state_check_interval_seconds": 300.0,
        "marker_settle_seconds": MARKER_SETTLE, "run_metrics": list(RUN_METRICS),
    },
    "grafana": {"base_url": "", "org_id": 1, "window_before_minutes": 30,
                "window_after_minutes": 30},
    "diagnosis": {"incident_gap_minutes": 10},
    "endings": {"enabled": True, "grace_seconds": 300.0, "interval_seconds": 60.0,
                "lookback_hours": 24.0, "max_run_hours": 168.0, "step_seconds": 30.0,
                "max_runs_per_pass": 100},
    "quarantine": dict(quarantine.DEFAULTS),
    "restart_policy": {"xid": {}, "bucket": {}, "alert": {}, "settle_seconds": DEFAULT_SETTLE,
                       "scheduler": ""},
}

HELP: dict[str, str] = {
    "listen.host": "address to bind (127.0.0.1; use 0.0.0.0 behind a network policy)",
    "listen.port": "TCP port of the webhook, /runs, /metrics, /healthz, /readyz",
    "listen.idle_timeout_seconds": "a connection that sends no complete request (new or kept "
                                   "alive) for this long is closed",
    "listen.max_connections": "at most this many connections (and half the nofile limit): a "
                              "new one evicts the oldest idle one, or is closed if all are busy",
    "log_level": "debug, info, warning or error (JSON lines on stderr)",
    "auth.bearer_token[_file]": "token Alertmanager sends as 'Authorization: Bearer'",
    "auth.basic_username / basic_password[_file]": "credentials for Alertmanager basic_auth",
    "auth.public_pages": "serve /runs without credentials (read-only pages)",
    "auth.pages_token[_file]": "read token for the pages (/runs, run pages): typed into the /login "
                               "form it sets an HttpOnly, SameSite=Strict cookie; API clients "
                               "send it as 'Authorization: Bearer' (at least 16 characters, "
                               "not the webhook token)",
    "auth.pages_accept_webhook_credentials": "whether the webhook's credentials also open the "
                                             "pages (default: only while no page token is set)",
    "auth.secure_cookie": "the page session cookie's Secure flag: true, false, or unset (set when "
                          "the request came over TLS or with X-Forwarded-Proto: https); sessions "
                          "last 12 h, POST /logout ends one, failed logins are throttled",
    "webhook.path": "path Alertmanager's webhook_configs url points at",
    "webhook.max_body_bytes": "larger notifications get 413",
    "webhook.body_timeout_seconds": "a body not received within this time gets 408",
    "webhook.max_inflight_bytes": "bodies being received or stored at once (by Content-Length); "
                                  "beyond it 503 with Retry-After (one always fits)",
    "store.path": "SQLite file (WAL) holding alerts and the W&B outbox",
    "store.retention_days": "resolved, delivered alerts older than this are deleted",
    "store.min_free_bytes": "/readyz fails when the store's filesystem has less free space",
    "identity.{entity,project,run_id,hostname,gpu}": "JSONPath into each alert (default: "
                                                     "contract-2 labels)",
    "prometheus.url": "if set, unattributed alerts are attributed via the join metrics, and each "
                      "issue shows its faulty hosts' scheduler state and a restart verdict",
    "prometheus.node_state_refresh_seconds": "how often the faulty hosts' state is re-read; a "
                                             "change (drained, back in service) re-writes the "
                                             "run's issues (0: node state off)",
    "prometheus.verify_run_placement": "write a run only with alerts the join metrics place on "
                                       "their host when they began (alert labels can be forged "
                                       "through Alertmanager's open API); others are left out "
                                       "and a run with none is parked (default true)",
    "prometheus.tolerated_taints": "NoSchedule/NoExecute taint keys the runs' pods tolerate: a "
                                   "node with only these is still in the pool for a restart "
                                   "(kube-state-metrics path; match the exporter's "
                                   "tolerated_taints)",
    "restart_policy.xid / bucket / alert": "override NVIDIA's recovery action per XID code "
                                           "(94: reset_gpu), NVIDIA bucket (RESTART_APP: ...) or "
                                           "alert name; values: none, restart_app, reset_gpu, "
                                           "drain_p2p, reboot_node, restore_link, service, "
                                           "replace; the issue states the choice",
    "restart_policy.settle_seconds": "a link or thermal fault counts as fixed once clear this "
                                     "long (600)",
    "restart_policy.scheduler": "slurm or kubernetes: the exclusion's syntax when no host's "
                                "state says (default: the quarantine's scheduler if enabled)",
    "wandb.base_url": "W&B API base URL (self-managed servers: their URL)",
    "wandb.api_key[_file]": "W&B API key; without it issues stay in the bridge (/runs)",
    "wandb.markers": "write infra/issue history markers with the wandb SDK (shared mode)",
    "wandb.marker_settle_seconds": "a marker row is written once the issue's root cause has not "
                                   "changed for this long (history is append-only; default: "
                                   "Alertmanager group_interval 1 m + 15 s)",
    "wandb.run_metrics": "history keys of the run's own throughput or MFU (higher is better), "
                         "first logged one wins: where it fell around an issue's onset the "
                         "impact line names it instead of the GPU signals ([]: GPU signals only)",
    "wandb.notify_critical": "send NotifyScriptableRunAlert for critical root causes",
    "wandb.flush_interval_seconds": "at most one W&B projection per run per interval",
    "wandb.backoff_{base,max}_seconds": "retry backoff bounds (Retry-After always honoured)",
    "wandb.state_check_interval_seconds": "how often a live run is re-checked so summary keys "
                                          "are written once it finished",
    "grafana.base_url": "Grafana URL for deep links (empty: no links)",
    "grafana.org_id / window_*_minutes": "link org and time window around an issue",
    "diagnosis.incident_gap_minutes": "alerts further apart than this are separate issues",
    "endings.enabled": "with prometheus.url: every run the exporter published gets a verdict "
                       "when it ends (infrastructure, clear or incomplete, with its telemetry "
                       "coverage) in W&B and on its page (default true)",
    "endings.grace_seconds": "a run whose join series are absent this long has ended (300; "
                             "longer than the exporter's scrape interval and restarts)",
    "endings.interval_seconds": "how often Prometheus is asked which runs ended (60)",
    "endings.lookback_hours": "on start, runs that ended this long ago are still judged (runs "
                              "that ended while the bridge was down; 24)",
    "endings.max_run_hours": "how far before its end a run's start is looked for (168)",
    "endings.step_seconds": "finest coverage resolution: the exporters' scrape interval (30)",
    "endings.max_runs_per_pass": "ended runs judged per pass at most; the rest wait (100)",
    "quarantine.enabled": "take the faulty node of an open critical issue out of the pool "
                          "where its fault needs the node out of service (a GPU reset, a "
                          "reboot, a replacement; never for XID 94 or application faults); "
                          "default false: read-only",
    "quarantine.dry_run": "only record and show what it would do (default true)",
    "quarantine.scheduler": "slurm (scontrol update State=DRAIN; needs an operator) or "
                            "kubernetes (cordon + NoSchedule taint; needs patch on nodes)",
    "quarantine.max_nodes / max_fraction / window_seconds": "circuit breaker: at most this many "
                                                           "nodes and this share of the fleet "
                                                           "per window (2, 0.05, 3600)",
    "quarantine.audit_log": "JSON-lines file of every decision (default: next to the store)",
    "quarantine.taint_key / slurm_command / kubernetes": "taint key and annotation; the "
                                                         "scontrol command; Kubernetes "
                                                         "connection keys as in the exporter",
}


@dataclass(frozen=True)
class Secrets:
    """Secrets read at start-up; ``repr`` never shows them."""

    bearer_token: str | None = field(default=None, repr=False)
    basic_username: str | None = None
    basic_password: str | None = field(default=None, repr=False)
    wandb_api_key: str | None = field(default=None, repr=False)
    pages_token: str | None = field(default=None, repr=False)

    def all(self) -> list[str]:
        """Every secret value, for log redaction."""
        return [s for s in (self.bearer_token, self.basic_password, self.wandb_api_key,
                            self.pages_token) if s]


@dataclass(frozen=True)
class BridgeConfig:
    """Validated configuration."""

    raw: dict[str, Any]
    secrets: Secrets
    host: str
    port: int
    webhook_path: str
    max_body_bytes: int
    store_path: Path
    idle_timeout: float
    max_connections: int
    body_timeout: float
    max_inflight_bytes: int
    policy: DeliveryPolicy
    insecure_no_auth: bool = False

    @property
    def auth_enabled(self) -> bool:
        """True when at least one credential is configured."""
        return bool(self.secrets.bearer_token or self.secrets.basic_password)


def _number(raw: Mapping[str, Any], section: str, key: str, minimum: float = 0.0) -> float:
    value = raw[section][key]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{section}.{key} must be a number >= {minimum}")
    return float(value)


def _check_pages_auth(auth: Mapping[str, Any], secrets: Secrets) -> None:
    """The page token is typed into a form, so it must not be guessable, and it must not be the
    webhook's token (a page reader could then post alerts)."""
    token = secrets.pages_token
    if token is not None and len(token) < 16:
        raise ConfigError("auth.pages_token must be at least 16 characters")
    if token is not None and token in (secrets.bearer_token, secrets.basic_password):
        raise ConfigError("auth.pages_token must differ from the webhook's credentials")
    for key in ("pages_accept_webhook_credentials", "secure_cookie"):
        if auth[key] is not None and not isinstance(auth[key], bool):
            raise ConfigError(f"auth.{key} must be true, false or unset")


def _flag(raw: Mapping[str, Any], section: str, key: str) -> bool:
    value = raw[section][key]
    if not isinstance(value, bool):
        raise ConfigError(f"{section}.{key} must be true or false")
    return value


def _endings(raw: Mapping[str, Any]) -> EndingsPolicy:
    """The ``endings`` section, every value checked (a typo must not silently turn it off)."""
    section = raw["endings"]
    enabled = section["enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError("endings.enabled must be true or false")
    per_pass = section["max_runs_per_pass"]
    if isinstance(per_pass, bool) or not isinstance(per_pass, int) or not 1 <= per_pass <= 10_000:
        raise ConfigError("endings.max_runs_per_pass must be an integer 1-10000")
    step = _number(raw, "endings", "step_seconds", 1)
    grace = _number(raw, "endings", "grace_seconds", 1)
    if grace < step:
        raise ConfigError("endings.grace_seconds must be at least endings.step_seconds (a run "
                          "would end between two scrapes)")
    return EndingsPolicy(
        enabled=enabled, grace=grace, interval=_number(raw, "endings", "interval_seconds", 1),
        lookback=_number(raw, "endings", "lookback_hours", 0) * 3600,
        max_run=_number(raw, "endings", "max_run_hours", 0.01) * 3600, step=step,
        per_pass=per_pass)


def _taints(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ConfigError("prometheus.tolerated_taints must be a list of taint keys")
    return tuple(value)


def _run_metrics(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(k, str) and k.strip() == k and k
                                              and not k.startswith("_") for k in value):
        raise ConfigError("wandb.run_metrics must be a list of history keys (not '_step' or "
                          "other keys starting with '_')")
    return tuple(dict.fromkeys(value))


def _scheduler(raw: Mapping[str, Any]) -> str:
    """The exclusion's syntax: restart_policy.scheduler, else the enabled quarantine's."""
    value = raw["restart_policy"]["scheduler"]
    if value not in ("", "slurm", "kubernetes"):
        raise ConfigError("restart_policy.scheduler must be 'slurm', 'kubernetes' or empty")
    if not value and raw["quarantine"].get("enabled"):
        return str(raw["quarantine"].get("scheduler", ""))
    return str(value)


def build_config(raw: dict[str, Any], environ: Mapping[str, str] | None = None,
                 insecure_no_auth: bool = False) -> BridgeConfig:
    """Validate a merged raw configuration and read the secrets it points at."""
    for section, value in raw.items():
        if isinstance(DEFAULTS.get(section), dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{section} must be a mapping")
            unknown = sorted(set(value) - set(DEFAULTS[section]))
            if unknown:
                raise ConfigError(f"unknown keys in {section}: {', '.join(unknown)}")
    auth, wb = raw["auth"], raw["wandb"]
    secrets = Secrets(
        bearer_token=read_secret(auth["bearer_token"], auth["bearer_token_file"],
                                 "auth.bearer_token", environ),
        basic_username=auth["basic_username"],
        basic_password=read_secret(auth["basic_password"], auth["basic_password_file"],
                                   "auth.basic_password", environ),
        wandb_api_key=read_secret(wb["api_key"], wb["api_key_file"], "wandb.api_key", environ),
        pages_token=read_secret(auth["pages_token"], auth["pages_token_file"],
                                "auth.pages_token", environ),
    )
    if bool(secrets.basic_username) != bool(secrets.basic_password):
        raise ConfigError("auth.basic_username and auth.basic_password go together")
    _check_pages_auth(auth, secrets)
    path = raw["webhook"]["path"]
    if not isinstance(path, str) or not path.startswith("/") or path.startswith("/runs"):
        raise ConfigError("webhook.path must start with '/' and not be under /runs")
    port = raw["listen"]["port"]
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError("listen.port must be an integer 0-65535")
    policy = DeliveryPolicy(
        flush_interval=_number(raw, "wandb", "flush_interval_seconds"),
        backoff_base=_number(raw, "wandb", "backoff_base_seconds", 0.001),
        backoff_max=_number(raw, "wandb", "backoff_max_seconds", 0.001),
        state_check_interval=_number(raw, "wandb", "state_check_interval_seconds", 1),
        retention=_number(raw, "store", "retention_days", 0) * 86400,
        notify_critical=bool(wb["notify_critical"]),
        incident_gap=_number(raw, "diagnosis", "incident_gap_minutes", 0) * 60,
        marker_settle=_number(raw, "wandb", "marker_settle_seconds"),
        node_state_refresh=_number(raw, "prometheus", "node_state_refresh_seconds"),
        quarantine=quarantine.check(raw["quarantine"]),
        quarantine_acts=False,  # the serve process never acts: wandb-infra-bridge quarantine
        restart_policy=Policy.from_config({k: v for k, v in raw["restart_policy"].items()
                                           if k != "scheduler"}),
        tolerated_taints=_taints(raw["prometheus"]["tolerated_taints"]),
        verify_placement=_flag(raw, "prometheus", "verify_run_placement"),
        scheduler=_scheduler(raw),
        endings=_endings(raw),
        run_metrics=_run_metrics(wb["run_metrics"]),
    )
    cfg = BridgeConfig(
        raw=raw, secrets=secrets, host=str(raw["listen"]["host"]), port=port,
        webhook_path=path, max_body_bytes=int(_number(raw, "webhook", "max_body_bytes", 1024)),
        store_path=Path(str(raw["store"]["path"])), policy=policy,
        idle_timeout=_number(raw, "listen", "idle_timeout_seconds", 0.1),
        max_connections=int(_number(raw, "listen", "max_connections", 1)),
        body_timeout=_number(raw, "webhook", "body_timeout_seconds", 0.1),
        max_inflight_bytes=int(_number(raw, "webhook", "max_inflight_bytes", 1024)),
        insecure_no_auth=insecure_no_auth,
    )
    if not cfg.auth_enabled and not insecure_no_auth:
        raise ConfigError("no webhook credentials configured (auth.bearer_token[_file] or "
                          "auth.basic_username + basic_password[_file]); refusing to start. "
                          "Use --insecure-local-demo only for a local demo.")
    return cfg


def load(path: str | None, environ: Mapping[str, str] | None = None,
         insecure_no_auth: bool = False) -> BridgeConfig:
    """Defaults + YAML file + environment overrides, validated."""
    return build_config(load_config(path, DEFAULTS, ENV_PREFIX, environ), environ,
                        insecure_no_auth)
