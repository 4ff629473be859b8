"""Bridge configuration: one schema (defaults, ``--help`` listing, one-line errors), one YAML
file, ``WANDB_INFRA_BRIDGE__*`` overrides, secrets, and the checks that span keys.

Secrets (webhook bearer token, basic-auth password, page token, W&B API key) come from
``*_file`` keys (preferred) or a literal / ``env:NAME`` value, and never appear in ``repr`` or
logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb_infra.bridge.diagnosis.need import DEFAULT_SETTLE, Policy
from wandb_infra.bridge.joblog import sources as joblog
from wandb_infra.bridge.projection.delivery import DeliveryPolicy
from wandb_infra.bridge.projection.markers import MARKER_SETTLE
from wandb_infra.bridge.projection.wandb_client import RUN_METRICS, STEP_METRICS
from wandb_infra.bridge.prometheus.endings import EndingsPolicy
from wandb_infra.bridge.quarantine import actuator as quarantine
from wandb_infra.common.configfile import ConfigError, read_config, read_secret
from wandb_infra.common.labels import NAME_CHARS
from wandb_infra.common.nodestate import DEFAULT_TOLERATED
from wandb_infra.common.schema import Key, Section

ENV_PREFIX = "WANDB_INFRA_BRIDGE"
ACTIONS = "none, restart_app, reset_gpu, drain_p2p, reboot_node, restore_link, service, replace"


def _secret(what: str) -> Key:
    return Key("str", None, f'{what}; "env:NAME" reads a variable', optional=True, secret=True)


def _file(what: str) -> Key:
    return Key("str", None, f"file holding {what}", optional=True)


def _webhook_path(path: str) -> bool:
    return path.startswith("/") and not path.startswith("/runs")


def _run_metric_keys(keys: list[str]) -> bool:
    return all(k and k.strip() == k and not k.startswith("_") for k in keys)


SCHEMA = Section({
    "listen": Section({
        "host": Key("str", "127.0.0.1", "address to bind (0.0.0.0 only behind a network "
                    "policy)"),
        "port": Key("int", 9461, "TCP port of the webhook, /runs, /metrics, /healthz, /readyz",
                    minimum=0, maximum=65535),
        "idle_timeout_seconds": Key("number", 15.0, "a connection that sends no complete "
                                    "request (new or kept alive) for this long is closed",
                                    minimum=0.1),
        "max_connections": Key("int", 512, "at most this many connections (and half the nofile "
                               "limit): a new one evicts the oldest idle one, or is closed if "
                               "all are busy", minimum=1),
    }),
    "log_level": Key("str", "info", "JSON lines on stderr; secrets are redacted",
                     choices=("debug", "info", "warning", "error")),
    "auth": Section({
        "bearer_token": _secret("token Alertmanager sends as 'Authorization: Bearer'"),
        "bearer_token_file": _file("the bearer token"),
        "basic_username": Key("str", None, "user name of Alertmanager's basic_auth",
                              optional=True),
        "basic_password": _secret("password of Alertmanager's basic_auth"),
        "basic_password_file": _file("the basic_auth password"),
        "public_pages": Key("bool", False, "serve /runs without credentials (read-only pages)"),
        "pages_token": _secret("read token for the pages (/runs, run pages): typed into the "
                               "/login form it sets an HttpOnly, SameSite=Strict cookie; API "
                               "clients send it as 'Authorization: Bearer' (at least 16 "
                               "characters, not the webhook token)"),
        "pages_token_file": _file("the page token"),
        "pages_accept_webhook_credentials": Key(
            "bool", None, "whether the webhook's credentials also open the pages (unset: only "
            "while no page token is set)", optional=True),
        "secure_cookie": Key("bool", None, "the page session cookie's Secure flag (unset: set "
                             "when the request came over TLS or with X-Forwarded-Proto: https); "
                             "sessions last 12 h, POST /logout ends one, failed logins are "
                             "throttled", optional=True),
    }, help="webhook credentials (one of bearer or basic is required) and page access"),
    "webhook": Section({
        "path": Key("str", "/alertmanager", "path Alertmanager's webhook_configs url points at",
                    check=_webhook_path, expect="a path starting with '/', not under /runs"),
        "max_body_bytes": Key("int", 8 * 1024 * 1024, "larger notifications get 413",
                              minimum=1024),
        "body_timeout_seconds": Key("number", 30.0, "a body not received within this time gets "
                                    "408", minimum=0.1),
        "max_inflight_bytes": Key("int", 32 * 1024 * 1024, "bodies being received or stored at "
                                  "once (by Content-Length); beyond it 503 with Retry-After (one "
                                  "always fits)", minimum=1024),
    }),
    "store": Section({
        "path": Key("str", "bridge-state/bridge.sqlite", "SQLite file (WAL) holding alerts and "
                    "the W&B outbox"),
        "retention_days": Key("number", 30, "resolved, delivered alerts older than this are "
                              "deleted", minimum=0),
        "min_free_bytes": Key("int", 16 * 1024 * 1024, "/readyz fails when the store's "
                              "filesystem has less free space", minimum=0),
    }),
    "prometheus": Section({
        "url": Key("str", "", "if set, unattributed alerts are attributed via the join metrics, "
                   "and each issue shows its faulty hosts' scheduler state and a restart "
                   "verdict"),
        "timeout_seconds": Key("number", 5.0, "timeout of one query", above=0),
        "node_state_refresh_seconds": Key("number", 60.0, "how often the faulty hosts' state is "
                                          "re-read; a change (drained, back in service) "
                                          "re-writes the run's issues (0: node state off)",
                                          minimum=0),
        "tolerated_taints": Key("list[str]", list(DEFAULT_TOLERATED), "NoSchedule/NoExecute "
                                "taint keys the runs' pods tolerate: a node with only these is "
                                "still in the pool for a restart (kube-state-metrics path; "
                                "match the exporter's tolerated_taints)", check=all,
                                expect="a list of taint keys"),
        "verify_run_placement": Key("bool", True, "write a run only with alerts the join "
                                    "metrics place on their host when they began (alert labels "
                                    "can be forged through Alertmanager's open API); others are "
                                    "left out and a run with none is parked"),
    }),
    "wandb": Section({
        "base_url": Key("str", "https://api.wandb.ai", "W&B API base URL (self-managed "
                        "servers: their URL)"),
        "api_key": _secret("W&B API key; without it issues stay in the bridge (/runs)"),
        "api_key_file": _file("the W&B API key"),
        "timeout_seconds": Key("number", 30.0, "timeout of one W&B call", above=0),
        "markers": Key("bool", True, "write infra/issue history markers with the wandb SDK "
                       "(shared mode)"),
        "notify_critical": Key("bool", False, "send NotifyScriptableRunAlert for critical root "
                               "causes"),
        "flush_interval_seconds": Key("number", 10.0, "at most one W&B projection per run per "
                                      "interval", minimum=0),
        "backoff_base_seconds": Key("number", 2.0, "first retry delay (Retry-After always "
                                    "honoured)", minimum=0.001),
        "backoff_max_seconds": Key("number", 300.0, "longest retry delay", minimum=0.001),
        "state_check_interval_seconds": Key("number", 300.0, "how often a live run is "
                                            "re-checked so summary keys are written once it "
                                            "finished", minimum=1),
        "marker_settle_seconds": Key("number", MARKER_SETTLE, "a marker row is written once the "
                                     "issue's root cause has not changed for this long "
                                     "(history is append-only; default: Alertmanager "
                                     "group_interval 1 m + 15 s)", minimum=0),
        "step_metrics": Key("list[str]", list(STEP_METRICS), "history keys of the run's own "
                            "step counter, first logged one wins: each marker row carries its "
                            "value at the row's time, so charts drawn against it place the "
                            "marker where the run was ([]: wall time only)",
                            check=_run_metric_keys,
                            expect="a list of history keys (not '_step' or other keys starting "
                                   "with '_')"),
        "run_metrics": Key("list[str]", list(RUN_METRICS), "history keys of the run's own "
                           "throughput or MFU (higher is better), first logged one wins: where "
                           "it fell around an issue's onset the impact line names it instead of "
                           "the GPU signals ([]: GPU signals only)", check=_run_metric_keys,
                           expect="a list of history keys (not '_step' or other keys starting "
                                  "with '_')"),
    }),
    "grafana": Section({
        "base_url": Key("str", "", "Grafana URL for deep links (empty: no links)"),
        "org_id": Key("int", 1, "the links' Grafana organisation", minimum=1),
        "window_before_minutes": Key("number", 30, "link time window before an issue",
                                     minimum=0),
        "window_after_minutes": Key("number", 30, "link time window after an issue", minimum=0),
    }),
    "diagnosis": Section({
        "incident_gap_minutes": Key("number", 10, "alerts further apart than this are separate "
                                    "issues", minimum=0),
    }),
    "endings": Section({
        "enabled": Key("bool", True, "with prometheus.url: every run the exporter published "
                       "gets a verdict when it ends (infrastructure, clear or incomplete, with "
                       "its telemetry coverage) in W&B and on its page"),
        "grace_seconds": Key("number", 300.0, "a run whose join series are absent this long has "
                             "ended (longer than the exporter's scrape interval and restarts; "
                             "at least step_seconds)", minimum=1),
        "interval_seconds": Key("number", 60.0, "how often Prometheus is asked which runs "
                                "ended", minimum=1),
        "lookback_hours": Key("number", 24.0, "on start, runs that ended this long ago are "
                              "still judged (runs that ended while the bridge was down)",
                              minimum=0),
        "max_run_hours": Key("number", 168.0, "how far before its end a run's start is looked "
                             "for", minimum=0.01),
        "step_seconds": Key("number", 30.0, "finest coverage resolution: the exporters' scrape "
                            "interval", minimum=1),
        "max_runs_per_pass": Key("int", 100, "ended runs judged per pass at most; the rest "
                                 "wait", minimum=1, maximum=10_000),
    }),
    "quarantine": quarantine.SCHEMA,
    "joblog": joblog.SCHEMA,
    "restart_policy": Section({
        "xid": Key("mapping", {}, f"override NVIDIA's recovery action per XID code (94: "
                   f"reset_gpu); actions: {ACTIONS}; the issue states the choice"),
        "bucket": Key("mapping", {}, "the same per NVIDIA bucket (RESTART_APP: ...)"),
        "alert": Key("mapping", {}, "the same per alert name"),
        "settle_seconds": Key("number", DEFAULT_SETTLE, "a link or thermal fault counts as "
                              "fixed once clear this long", minimum=0),
        "scheduler": Key("str", "", "slurm or kubernetes: the exclusion's syntax when no host's "
                         "state says (empty: the quarantine's scheduler if enabled)",
                         choices=("", "slurm", "kubernetes")),
    }),
})

DEFAULTS: dict[str, Any] = SCHEMA.defaults()


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


def _check_pages_auth(secrets: Secrets) -> None:
    """The page token is typed into a form, so it must not be guessable, and it must not be the
    webhook's token (a page reader could then post alerts)."""
    token = secrets.pages_token
    if token is not None and len(token) < 16:
        raise ConfigError("auth.pages_token must be at least 16 characters")
    if token is not None and token in (secrets.bearer_token, secrets.basic_password):
        raise ConfigError("auth.pages_token must differ from the webhook's credentials")


def _endings(section: Mapping[str, Any]) -> EndingsPolicy:
    """The ``endings`` section; its grace must cover a scrape step."""
    if section["grace_seconds"] < section["step_seconds"]:
        raise ConfigError("endings.grace_seconds must be at least endings.step_seconds (a run "
                          "would end between two scrapes)")
    return EndingsPolicy(
        enabled=section["enabled"], grace=float(section["grace_seconds"]),
        interval=float(section["interval_seconds"]),
        lookback=section["lookback_hours"] * 3600, max_run=section["max_run_hours"] * 3600,
        step=float(section["step_seconds"]), per_pass=section["max_runs_per_pass"])


def _scheduler(raw: Mapping[str, Any]) -> str:
    """The exclusion's syntax: restart_policy.scheduler, else the enabled quarantine's."""
    value = str(raw["restart_policy"]["scheduler"])
    if not value and raw["quarantine"]["enabled"]:
        return str(raw["quarantine"]["scheduler"])
    return value


def build_config(raw: dict[str, Any], environ: Mapping[str, str] | None = None,
                 insecure_no_auth: bool = False, serves: bool = True) -> BridgeConfig:
    """Check ``raw`` against the schema (completing it with the defaults), then the rules that
    span keys, and read the secrets it points at. ``serves=False`` (a command that serves
    nothing: ``view``, ``selftest``) reads the W&B key only, not the webhook's or pages'
    credentials, which such a command's user may not be able to read."""
    raw = SCHEMA.resolve(raw)
    auth, wb = raw["auth"], raw["wandb"]
    secrets = Secrets(
        wandb_api_key=read_secret(wb["api_key"], wb["api_key_file"], "wandb.api_key", environ))
    if serves:
        secrets = Secrets(
            bearer_token=read_secret(auth["bearer_token"], auth["bearer_token_file"],
                                     "auth.bearer_token", environ),
            basic_username=auth["basic_username"],
            basic_password=read_secret(auth["basic_password"], auth["basic_password_file"],
                                       "auth.basic_password", environ),
            wandb_api_key=secrets.wandb_api_key,
            pages_token=read_secret(auth["pages_token"], auth["pages_token_file"],
                                    "auth.pages_token", environ),
        )
        if bool(secrets.basic_username) != bool(secrets.basic_password):
            raise ConfigError("auth.basic_username and auth.basic_password go together")
        _check_pages_auth(secrets)
    policy = DeliveryPolicy(
        flush_interval=float(wb["flush_interval_seconds"]),
        backoff_base=float(wb["backoff_base_seconds"]),
        backoff_max=float(wb["backoff_max_seconds"]),
        state_check_interval=float(wb["state_check_interval_seconds"]),
        retention=raw["store"]["retention_days"] * 86400,
        notify_critical=wb["notify_critical"],
        incident_gap=raw["diagnosis"]["incident_gap_minutes"] * 60,
        marker_settle=float(wb["marker_settle_seconds"]),
        node_state_refresh=float(raw["prometheus"]["node_state_refresh_seconds"]),
        quarantine=quarantine.check(raw["quarantine"]),
        restart_policy=Policy.from_config({k: v for k, v in raw["restart_policy"].items()
                                           if k != "scheduler"}),
        tolerated_taints=tuple(raw["prometheus"]["tolerated_taints"]),
        confirm_alerts=raw["prometheus"]["verify_run_placement"],
        scheduler=_scheduler(raw),
        endings=_endings(raw["endings"]),
        run_metrics=tuple(dict.fromkeys(wb["run_metrics"])),
        joblog=joblog.Settings.from_config(raw["joblog"]),
    )
    listen, webhook = raw["listen"], raw["webhook"]
    cfg = BridgeConfig(
        raw=raw, secrets=secrets, host=listen["host"], port=listen["port"],
        webhook_path=webhook["path"], max_body_bytes=webhook["max_body_bytes"],
        store_path=Path(raw["store"]["path"]), policy=policy,
        idle_timeout=float(listen["idle_timeout_seconds"]),
        max_connections=listen["max_connections"],
        body_timeout=float(webhook["body_timeout_seconds"]),
        max_inflight_bytes=webhook["max_inflight_bytes"],
        insecure_no_auth=insecure_no_auth,
    )
    if not cfg.auth_enabled and not insecure_no_auth:
        raise ConfigError("no webhook credentials configured (auth.bearer_token[_file] or "
                          "auth.basic_username + basic_password[_file]); refusing to start. "
                          "Use --insecure-local-demo only for a local demo.")
    return cfg


def load(path: str | None, environ: Mapping[str, str] | None = None,
         insecure_no_auth: bool = False, serves: bool = True) -> BridgeConfig:
    """YAML file + environment overrides over the defaults, validated (see ``build_config``)."""
    return build_config(read_config(path, ENV_PREFIX, environ), environ, insecure_no_auth,
                        serves)


def load_with_key(path: str | None) -> tuple[BridgeConfig, str]:
    """A command that writes to W&B and serves nothing: its configuration and W&B key."""
    cfg = load(path, insecure_no_auth=True, serves=False)
    if not cfg.secrets.wandb_api_key:
        raise ConfigError("no W&B key configured (wandb.api_key_file or wandb.api_key)")
    return cfg, cfg.secrets.wandb_api_key


def project_arg(text: str) -> tuple[str, str]:
    """ENTITY/PROJECT given on the command line."""
    parts = text.split("/")
    if len(parts) != 2 or not all(NAME_CHARS.fullmatch(p) for p in parts):
        raise ConfigError(f"expected ENTITY/PROJECT, got {text!r}")
    return parts[0], parts[1]
