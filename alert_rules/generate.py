"""Render the alert rules, their Kubernetes manifest, the dcgm-exporter counters file and the
runbook from the catalog (``catalog/``). Deterministic: same catalog and options, same bytes.

Usage: ``python -m wandb_infra.alert_rules.generate [--config FILE] [--violation-unit ns|us]
[--runbook-base URL] [--out-dir DIR] [--check]``. Options can also come from a YAML file and from
``WANDB_INFRA_RULES__<KEY>`` environment variables (see ``--help``). Without ``--out-dir`` it writes
into the source checkout it runs from; where the package is installed it refuses.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from wandb_infra.alert_rules import normalise, selectors, tiers
from wandb_infra.alert_rules.attribution import FAMILIES, attributed, join_records, stall_join
from wandb_infra.alert_rules.tiers import outlives_lookback, reading
from wandb_infra.catalog import panels, runbook
from wandb_infra.catalog import series as s
from wandb_infra.catalog.alerts import (
    ALERTS,
    TEMP_WARNING_C,
    TEMPLATE_VALUES,
    AlertDef,
    duration_seconds,
)
from wandb_infra.catalog.template import Value, fill, placeholders
from wandb_infra.common.configfile import ConfigError, read_config
from wandb_infra.common.generated import checkout_root, write_or_check
from wandb_infra.common.schema import Key, Section

# The default --out-dir: the source checkout this module runs from (None where it is installed).
CHECKOUT = checkout_root(__file__)

ENV_PREFIX = "WANDB_INFRA_RULES"
# Thresholds an operator may set (generator config ``thresholds:``, mixin ``_config.thresholds``),
# by the mixin's camelCase key, with the catalog name the alert conditions read. Only thresholds
# that no normalisation record cuts at (a record's own cut, such as the 85 C warning, bounds what
# an alert can see).
THRESHOLDS: dict[str, str] = {
    "tempCriticalC": "TEMP_CRITICAL_C",
    "thermalViolationRatio": "THERMAL_VIOLATION_RATIO",
    "powerViolationRatio": "POWER_VIOLATION_RATIO",
    "pcieReplaysPerMinute": "PCIE_REPLAYS_PER_MINUTE",
    "nvlinkCrcFailPerSecond": "NVLINK_CRC_FAIL_PER_SECOND",
    "retiredPagesLimit": "RETIRED_PAGES_LIMIT",
    "uncorrectableRowsLimit": "UNCORRECTABLE_ROWS_LIMIT",
    "sbeStormPerWindow": "SBE_STORM_PER_WINDOW",
    "ibPhysicalErrorsPerSecond": "IB_PHYSICAL_ERRORS_PER_SECOND",
    "ibFlapsMin": "IB_FLAPS_MIN",
    "carrierChangesMin": "CARRIER_CHANGES_MIN",
    "sourceStaleSeconds": "SOURCE_STALE_SECONDS",
    "deliveryBacklogSeconds": "DELIVERY_BACKLOG_SECONDS",
}


def _selector(exporter: str) -> Key:
    return Key("str", "", f"label matchers added to every {exporter} series the rules read, "
               'e.g. job="..." (default: none)',
               check=lambda v: not v.strip() or bool(selectors.SELECTOR.fullmatch(v)),
               expect='label matchers such as job="dcgm-exporter",namespace="gpu"')


def _nonempty(help_text: str, default: str) -> Key:
    return Key("str", default, help_text, check=bool, expect="a non-empty string")


# The generator's options, one schema for the config file, the environment and the defaults the
# command line falls back to (common/schema.py).
SCHEMA = Section({
    "violation_unit": Key("str", "ns", "unit of DCGM's *_VIOLATION counters: ns (DCGM >= 4.1) "
                          "or us (older DCGM)",
                          choices=tuple(sorted(normalise.VIOLATION_DIVISORS))),
    "strip_domain": Key("bool", True, "reduce exporters' FQDN host names to their first label, "
                        "as the exporter's hostnames.strip_domain does; turn off only if the "
                        "exporter keeps domains too"),
    "runbook_base": _nonempty("the bridge's URL as on-call engineers reach it; runbook_url is "
                              "<base>/runbook#<alert>, served by the bridge (default: its "
                              "Service in deploy/kubernetes/bridge.yaml)", runbook.DEFAULT_BASE),
    "group_prefix": _nonempty("prefix of the rule group names", "wandb-infra"),
    "manifest_name": _nonempty("metadata.name of the PrometheusRule", "wandb-infra-rules"),
    "manifest_namespace": _nonempty("metadata.namespace of the PrometheusRule", "monitoring"),
    "host_key_regex": Key("str", normalise.FQDN, "regex whose first group is the canonical host "
                          "key where it matches an exporter's host name (default: the first "
                          "label of an FQDN; '(.+)' keeps names whole); the mixin's "
                          "_config.hostKeyRegex", check=lambda v: "(" in v,
                          expect="a regex with a group (the host key)"),
    "thresholds": Section({key: Key("number", TEMPLATE_VALUES[name], f"the catalog's {name}")
                           for key, name in THRESHOLDS.items()},
                          help="alert thresholds by the mixin's _config.thresholds keys"),
    "selectors": Section({key: _selector(key) for key in selectors.EXPORTERS},
                         help="label matchers per exporter, the mixin's _config.selectors "
                              "(alert_rules/selectors.py)"),
})
DEFAULTS: dict[str, Any] = SCHEMA.defaults()

# mixin/rules.json carries these in place of the values; mixin/rules.libsonnet puts _config's in.
MIXIN_PLACEHOLDER = "<<{}>>"
# An exporter's selector; mixin/rules.libsonnet drops the token with its comma or braces when the
# selector is empty.
MIXIN_SELECTOR = "<<selectors.{}>>"
RULES_FILE = "wandb-infra.rules.yml"
MANIFEST_FILE = "wandb-infra.prometheusrule.yaml"
COUNTERS_FILE = "dcgm-counters.csv"
RUNBOOK = Path("docs") / "runbook.md"
# The same groups as JSON for mixin/rules.libsonnet (jsonnet 0.18 cannot parse YAML block scalars).
MIXIN_RULES = Path("mixin") / "rules.json"
MAX_GROUP_RULES = 20
HEADER = "# Generated by alert_rules/generate.py from catalog/; do not edit.\n"
# Above the rule files' groups: where attribution is decided.
SOURCE_OF_TRUTH = """\
# These rules are the one source of truth for which run a fault belongs to: the attribution group
# joins each fault family (GPU, host, link) with its runs once per cycle, and every alert takes
# its run labels from those rows. The bridge does not join again; it only confirms each alert it
# receives against Prometheus' own ALERTS (bridge/prometheus/confirm.py).
"""

# dcgm-exporter counters the rules read, as (DCGM field, Prometheus type, help).
DCGM_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is "
     "active."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal "
     "constraints (ns since DCGM 4.1; us before)."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints "
     "(ns since DCGM 4.1; us before)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "NVLink flow-control CRC "
     "errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "NVLink recovery errors."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Pages retired for single-bit errors."),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Pages retired for double-bit errors."),
    ("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Pages pending retirement."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for uncorrectable "
     "errors."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable "
     "errors."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed."),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap is pending (needs a GPU "
     "reset)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "gauge", "The driver's recovery action: 0 none; 1 GPU "
     "reset; 2 node reboot; 3 drain P2P; 4 drain and reset (legacy name "
     "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION)."),
    ("DCGM_EXP_XID_ERRORS_COUNT", "gauge", "Count of XID errors within the window set by "
     "--xid-count-window-size."),
    # NVLink fabric and NVSwitches
    ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "gauge", "Fabric Manager status: 1 not started; 2 in "
     "progress; 3 success; 4 failure."),
    ("DCGM_FI_DEV_SXID_FATAL_ERROR", "gauge", "Last fatal NVSwitch error (SXid; legacy name "
     "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS)."),
)
# dcgm-exporter counts XIDs over s.XID_COUNT_WINDOW (its flag takes milliseconds).
XID_COUNT_WINDOW_MS = round(duration_seconds(s.XID_COUNT_WINDOW) * 1000)
DCGM_FLAGS = ("dcgm-exporter --collectors /etc/dcgm-exporter/wandb-infra-counters.csv "
              f"--xid-count-window-size {XID_COUNT_WINDOW_MS}")
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line; every option may also come from the config file or environment."""
    parser = argparse.ArgumentParser(
        description="Generate alert_rules/ files and docs/runbook.md from catalog/.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Config file keys; those in lower case also from the environment, e.g. "
               f"{ENV_PREFIX}__GROUP_PREFIX=team-a:\n"
               + "\n".join(SCHEMA.help_lines()))
    parser.add_argument("--config", help="YAML file with any of the keys below (lower case)")
    for key, item in SCHEMA.keys.items():
        if isinstance(item, Key):
            flag = "--" + key.replace("_", "-")
            if item.kind == "bool":
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                    help=item.help)
            else:
                parser.add_argument(flag, choices=item.choices or None, help=item.help)
    parser.add_argument("--out-dir",
                        help="folder to write into, as a checkout's root: alert_rules/, docs/ and "
                             "mixin/ below it (default: the source checkout this runs from; "
                             "required where the package is installed)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if any committed file differs")
    return parser.parse_args(argv)


def options(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults < config file < environment < command line, validated by ``SCHEMA``."""
    raw = read_config(args.config, ENV_PREFIX)
    raw.update({key: getattr(args, key) for key in SCHEMA.keys
                if getattr(args, key, None) is not None})
    cfg = SCHEMA.resolve(raw)
    if cfg["thresholds"]["tempCriticalC"] < TEMP_WARNING_C:
        raise ConfigError(f"thresholds.tempCriticalC must be at least the {TEMP_WARNING_C} C "
                          "warning the temperature records start at")
    cfg["runbook_base"] = cfg["runbook_base"].rstrip("/")
    return cfg


def threshold_values(cfg: dict[str, Any]) -> dict[str, Value]:
    """The thresholds the alert conditions read: the catalog's, with the configured ones (or,
    for the mixin, its tokens) in place."""
    if cfg.get("mixin_tokens"):
        return {name: MIXIN_PLACEHOLDER.format(key) for key, name in THRESHOLDS.items()}
    return {THRESHOLDS[key]: value for key, value in cfg.get("thresholds", {}).items()}


def selector_values(cfg: dict[str, Any]) -> dict[str, str]:
    """Each exporter's label matchers (or, for the mixin, its tokens)."""
    if cfg.get("mixin_tokens"):
        return {key: MIXIN_SELECTOR.format(key) for key in selectors.EXPORTERS}
    return dict(cfg.get("selectors", {}))


def _host_key_regex(cfg: dict[str, Any]) -> str:
    if cfg.get("mixin_tokens"):
        return MIXIN_PLACEHOLDER.format("hostKeyRegex")
    return str(cfg.get("host_key_regex", normalise.FQDN))



def _recording(rule: normalise.Recording) -> dict[str, Any]:
    return {"record": rule.record, "expr": rule.expr}


FAULT_LEVEL = {"gpu": "gpu", "host": "hostname", "link": "link"}
# A condition longer than this (or on several lines) is recorded on its own, so the alert that
# reads it two or three times (``attribution.py``) stays a few lines.
INLINE_MAX = 120


def _needs_record(alert: AlertDef) -> bool:
    """Whether an attributed alert reads its condition from a fault record: decided on the
    catalog's default text, so the mixin's tokens cannot change which rules exist."""
    text = condition(alert, record_tiers())
    return "\n" in text or len(text) > INLINE_MAX


def fault_record(alert: AlertDef) -> str | None:
    """Name of the recording rule holding an attributed alert's condition, when it is too long
    to read inline (None: run or pipeline scope, or a short condition)."""
    level = FAULT_LEVEL.get(alert.scope)
    if level is None or not _needs_record(alert):
        return None
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", alert.name).lower()
    return f"{level}:alert_{snake}:fault"


# Alert families merged into one rule group each (within MAX_GROUP_RULES): fewer groups to
# schedule; the telemetry gaps go with storage (the node group is full).
SHARED_GROUPS: dict[str, str] = {
    "node-lifecycle": "node", "network": "node",
    "host-memory": "host", "fabric": "host", "host-power": "host",
    "telemetry": "storage",
}


def family(alert: AlertDef) -> str:
    """The rule group (family) an alert is evaluated in."""
    name = alert.group or alert.category
    return SHARED_GROUPS.get(name, name)


def _alert(alert: AlertDef, cfg: dict[str, Any], by_record: dict[str, str | None]
           ) -> dict[str, Any]:
    source = fault_record(alert) or condition(alert, by_record, threshold_values(cfg))
    out: dict[str, Any] = {
        "alert": alert.name,
        "expr": attributed(alert.scope, source, alert.copy_labels),
    }
    if alert.for_ not in ("", "0s"):
        out["for"] = alert.for_
    if alert.keep_firing_for:
        out["keep_firing_for"] = alert.keep_firing_for
    out["labels"] = {"severity": alert.severity, "category": alert.category,
                     **alert.extra_labels}
    out["annotations"] = {
        "summary": alert.summary,
        "description": alert.description,
        "impact": alert.impact,
        "remediation": alert.remediation,
        "runbook_url": runbook.url(cfg["runbook_base"], alert.name),
        **panels.link_annotations(alert.scope, alert.panel, alert.for_seconds),
    }
    return out


def _chunks(rules: list[Any], name: str) -> Iterable[tuple[str, list]]:
    for i in range(0, len(rules), MAX_GROUP_RULES):
        suffix = "" if i == 0 else f"-{i // MAX_GROUP_RULES + 1}"
        yield name + suffix, rules[i:i + MAX_GROUP_RULES]


# Recording groups: (name, tier, rules). Order within a group matters (later rules read earlier
# ones at the same timestamp); across groups, records are read at most one interval late.
def recording_groups(violation_unit: str, strip_domain: bool = True,
                     host_key_regex: str = normalise.FQDN
                     ) -> list[tuple[str, str | None, list]]:
    """The normalisation groups, each at the tier its alerts' latency allows (``tiers.py``)."""
    host = normalise.HostKey(strip_domain, host_key_regex)
    return [
        ("normalise-fast", tiers.FAST, normalise.target_rules() + normalise.xid_rules(host)),
        ("normalise-gpu", tiers.MEDIUM,
         normalise.dcgm_telemetry_rules(host) + normalise.link_down_rules()),
        ("normalise-stall", tiers.MEDIUM, normalise.stall_rules(host)),
        ("normalise-targets", tiers.SLOW, normalise.target_map_rules(host)),
        ("normalise-gpu-state", tiers.SLOW, normalise.dcgm_state_rules(violation_unit, host)),
        ("normalise-node", tiers.WEAR, normalise.node_history_rules()),
        # where each run is (pods, runs with unknown GPUs) in one group, so its records never
        # disagree, at the pace runs start and end; then what the workload alerts compare against
        ("normalise-workload", tiers.WEAR,
         normalise.pod_gpu_rules() + normalise.workload_history_rules(host)
         + normalise.straggler_rules(host)),
        ("normalise-gpu-wear", tiers.WEAR,
         normalise.dcgm_wear_rules(host) + normalise.gpu_vanished_rules()),
        ("normalise-link-wear", tiers.WEAR, normalise.link_wear_rules()),
        # the host around the GPUs (normalise.py, its section)
        ("normalise-host", tiers.MEDIUM, normalise.host_rules(host)),
        ("normalise-host-history", tiers.SLOW, normalise.host_history_rules()),
        # slow: GpuRepeatOffender's family runs at its input's pace and reads every GPU row of
        # every run (0.2 s per cycle at 1,000 hosts when every cycle)
        ("normalise-repeat-offenders", tiers.SLOW, normalise.repeat_rules()),
    ]


@functools.cache
def record_tiers(violation_unit: str = DEFAULTS["violation_unit"]) -> dict[str, str | None]:
    """Each recorded series the alerts read and the tier of the group recording it (the
    normalisation groups and the stall's join in the attribution group)."""
    return {**{r.record: tier for _, tier, rules in recording_groups(violation_unit)
               for r in rules}, stall_join().record: tiers.FAST}


def records_read(expr: str, records: Iterable[str]) -> list[str]:
    """The records ``expr`` reads (whole names, not prefixes of longer ones); the runbook lists
    them and the dashboards take their evaluation interval as the panels' step."""
    return [r for r in records if re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:])", expr)]


def condition(alert: AlertDef, by_record: dict[str, str | None],
              thresholds: dict[str, Value] | None = None) -> str:
    """An alert's condition template filled in for the rule files: thresholds as stated (or as
    configured, ``threshold_values``), each record through ``reading``. A record read that way
    cannot take a selector after its name."""
    values: dict[str, Value] = {**TEMPLATE_VALUES, **(thresholds or {})}
    for name in placeholders(alert.condition):
        if name in s.RECORDS:
            record = s.RECORDS[name]
            values[name] = reading(record, by_record[record])
            if values[name] != record and f"${{{name}}}{{" in alert.condition:
                raise ValueError(f"{alert.name}: {name} is read through last_over_time, so it "
                                 "cannot take a label selector in the template")
    return fill(alert.condition, values)


def _inputs(alert: AlertDef) -> list[str]:
    """The records an alert's condition names."""
    return [s.RECORDS[n] for n in placeholders(alert.condition) if n in s.RECORDS]


def family_tier(alerts: list[AlertDef], by_record: dict[str, str | None]) -> str | None:
    """A GPU family runs at the pace of its fastest input (its records change no faster), but no
    slower than ``SLOW``, which keeps its ``ALERTS`` series continuous; the host and link
    families, whose node-down and link-down inputs end jobs, run every cycle."""
    if all(a.scope == "pipeline" for a in alerts):
        # The services' own metrics are a handful of series; a check that reads dcgm telemetry
        # (every GPU's memory) runs on the slow tier.
        return tiers.SLOW if any("DCGM_" in a.expr for a in alerts) else tiers.FAST
    if not any(a.scope == "gpu" for a in alerts):
        return tiers.FAST
    inputs = [by_record[r] for a in alerts for r in _inputs(a)]
    fastest = min(inputs, key=tiers.tier_seconds, default=tiers.FAST)
    return min(fastest, tiers.SLOW, key=tiers.tier_seconds)


# A line holding only a set operator (and its matching): it starts the operand below instead.
_OPERATOR = re.compile(r"\s*(?:or|and|unless)(?: on \([^)]*\))?")


# A parenthesised block is folded onto its opening line when the result fits this width.
FOLD_MAX = 150


def _fold(lines: list[str]) -> list[str] | None:
    """The first block ``opener (`` / at most two lines / ``)...`` at the opener's indent folded
    onto one line when it fits ``FOLD_MAX``; None when no block folds."""
    for i, opener in enumerate(lines):
        if not opener.endswith("("):
            continue
        indent = len(opener) - len(opener.lstrip())
        for j in range(i + 1, min(i + 4, len(lines))):
            line = lines[j]
            if len(line) - len(line.lstrip()) <= indent:
                if j > i + 1 and line.lstrip().startswith(")"):
                    folded = opener + " ".join(x.strip() for x in lines[i + 1:j]) + line.strip()
                    if len(folded) <= FOLD_MAX:
                        return [*lines[:i], folded, *lines[j + 1:]]
                break
    return None


def tidy(expr: str) -> str:
    """``expr`` with each operator on a line of its own moved to the start of its right operand
    (``or max by (...)``), and short parenthesised blocks folded onto one line (``_fold``):
    whitespace only, so the PromQL is the same."""
    out: list[str] = []
    lines = expr.splitlines()
    for i, line in enumerate(lines):
        if out and _OPERATOR.fullmatch(out[-1]) and i > 0 and out[-1] == lines[i - 1]:
            out[-1] += " " + line.lstrip()
        else:
            out.append(line)
    while (folded := _fold(out)) is not None:
        out = folded
    return "\n".join(out)


def _group(name: str, tier: str | None, rules: list[dict[str, Any]]) -> dict[str, Any]:
    group: dict[str, Any] = {"name": name}
    if tier is not None:
        group["interval"] = tier
    group["rules"] = rules
    return group


def fault_recording(alert: AlertDef, by_record: dict[str, str | None],
                    thresholds: dict[str, Value] | None = None) -> normalise.Recording:
    """The recording rule of an alert's per-entity faults (``fault_record``)."""
    entity = {"gpu": "GPU", "host": "host", "link": "link"}[alert.scope]
    return normalise.Recording(
        str(fault_record(alert)), condition(alert, by_record, thresholds),
        f"The condition of {alert.name} (catalog), per {entity}: the alert below reads it.")


def recordings(cfg: dict[str, Any]) -> list[tuple[str, str | None, list[normalise.Recording]]]:
    """Every recording rule by group (name without prefix, tier): normalisation first, then each
    alert family's fault records and the join rows of its faulty hosts."""
    out = list(recording_groups(cfg["violation_unit"], cfg["strip_domain"],
                                _host_key_regex(cfg)))
    by_record = record_tiers(cfg["violation_unit"])
    out.append(("attribution", tiers.FAST,
                [*join_records({f: signal_inputs(f, by_record) for f in FAMILIES}, by_record),
                 stall_join()]))
    for name, alerts in families().items():
        out.append((name, family_tier(alerts, by_record),
                    [fault_recording(a, by_record, threshold_values(cfg))
                     for a in alerts if fault_record(a)]))
    return out


def signal_inputs(scope: str, by_record: dict[str, str | None]) -> list[str]:
    """The records the alerts of ``scope`` read, each as they read it (``reading``): any entity
    in one of them may have a fault, so the family's join looks up its runs."""
    found: list[str] = []
    for alert in ALERTS.values():
        if alert.scope == scope:
            found += [reading(r, by_record[r]) for r in _signals(alert)]
    return list(dict.fromkeys(found))


def _signals(alert: AlertDef) -> list[str]:
    """The records an alert's condition reads before any ``unless``: where its faults can be.
    What follows ``unless`` only excludes (links idle all hour, hosts under maintenance), and
    reading it would put every host with an unused port in the join."""
    head = alert.condition.split("unless", 1)[0]
    return [s.RECORDS[n] for n in placeholders(head) if n in s.RECORDS]


def families() -> dict[str, list[AlertDef]]:
    """The alerts of each family, in catalog order."""
    members: dict[str, list[AlertDef]] = {}
    for alert in ALERTS.values():
        members.setdefault(family(alert), []).append(alert)
    return members


def groups(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """All rule groups: normalisation first, then one group per alert family (its recording
    rules, then its alerts)."""
    prefix = cfg["group_prefix"]
    by_record = record_tiers(cfg["violation_unit"])
    alerts = families()
    out: list[dict[str, Any]] = []
    chosen = selector_values(cfg)
    for name, tier, records in recordings(cfg):
        rules = [_recording(r) for r in records]
        rules += [_alert(a, cfg, by_record) for a in alerts.get(name, [])]
        for rule in rules:
            rule["expr"] = tidy(selectors.apply(rule["expr"], chosen))
        for gname, chunk in _chunks(rules, f"{prefix}-{name}"):
            out.append(_group(gname, tier, chunk))
    return out


# What each normalisation group records (printed above the group).
NORMALISE_NOTES = {
    "normalise-fast": "Job-ending signals, read every cycle: telemetry targets down now and XID "
                      "events.",
    "normalise-gpu": "GPU telemetry past a threshold (temperatures, clock-event bits) and links "
                     "down now.",
    "normalise-stall": "GPUs that stopped computing while holding memory, and runs alone on such "
                       "hosts (TrainingStalled; attribution joins the other runs).",
    "normalise-targets": "Which host each telemetry target reports.",
    "normalise-gpu-state": "GPU presence (with the Kubernetes pod holding each GPU) and counts, "
                           "the thermal and power violation rates, and the run of each pod's "
                           "GPUs.",
    "normalise-node": "Links idle for the whole hour, which are no fault when down.",
    "normalise-workload": "What the workload alerts compare against: GPUs idle all hour, runs "
                          "with unknown GPUs, and the straggler search.",
    "normalise-gpu-wear": "Memory and interconnect error counters and health gauges: how worn a "
                          "GPU is (their job-ending forms arrive as XIDs on the fast path); GPUs "
                          "gone within the hour.",
    "normalise-link-wear": "InfiniBand flaps and physical errors, Ethernet carrier changes: a "
                           "link degrading (one going down shows on the fast path).",
    "normalise-host": "The host around the GPUs: OOM kills, memory pressure, the run filesystems "
                      "(read-only, full, not answering), reboots, maintenance, NVSwitch and "
                      "Fabric Manager, local disks and IPMI sensors.",
    "normalise-host-history": "Filesystems read-only all hour (no fault) and the DIMM error "
                              "counters.",
    "normalise-repeat-offenders": "Hardware-fault episodes per host and GPU, from ALERTS, for "
                                  "the repeat offenders.",
    "attribution": "The join of each fault family (GPU, host, link) with its runs, recorded "
                   "once per cycle: the only rules reading the join metrics for attribution. "
                   "Every GPU, host and link alert multiplies its fault by its family's rows "
                   "(alert_rules/attribution.py).",
}


def _tier_note(tier: str | None) -> str:
    if tier is None:
        return "Every evaluation_interval (30 s)."
    note = f"Every {tier} (tiers.py)."
    if outlives_lookback(tier):
        note += (" Its records can be older than the lookback "
                 f"({tiers.duration(tiers.LOOKBACK_SECONDS)}), so other groups read them as "
                 f"last_over_time(record[{tiers.duration(tiers.read_window(tier))}]).")
    return note


def describe_group(group: dict[str, Any], lead: str, tier: str | None) -> str:
    """A group's comment, built from the rules the group holds (so it cannot describe another
    group): an optional lead sentence, its alerts, how often it runs (each record has its own
    comment)."""
    alerts = [r["alert"] for r in group["rules"] if "alert" in r]
    parts = [lead] if lead else []
    if alerts:
        parts.append(f"Alerts {', '.join(alerts)}.")
    parts.append(_tier_note(tier))
    return " ".join(parts)


def group_comments(cfg: dict[str, Any]) -> dict[str, str]:
    """What each rule group holds and how often it runs, by group name (printed above it),
    described from the group's own rules (``describe_group``)."""
    out = {}
    for group in groups(cfg):
        tier = group.get("interval")
        base = group["name"].removeprefix(f"{cfg['group_prefix']}-")
        lead = next((note for name, note in NORMALISE_NOTES.items()
                     if base == name or re.fullmatch(rf"{re.escape(name)}-\d+", base)), "")
        out[group["name"]] = describe_group(group, lead, tier)
    return out


def comments(cfg: dict[str, Any]) -> dict[str, str]:
    """What each recorded series holds and why, by record name (printed above the rule)."""
    return {r.record: r.help for _, _, records in recordings(cfg) for r in records}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks so PromQL stays readable in the files."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


class _Flow(dict[str, str]):
    """A mapping written on one line (an alert's labels)."""


def _flow(dumper: yaml.SafeDumper, value: _Flow) -> yaml.MappingNode:
    return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=True)


_Dumper.add_representer(_Flow, _flow)


# Nothing is folded: a folded scalar breaks PromQL or a template ("{{ $value" across lines) where
# an operator reads it, so every single-line string stays on its line however long.
YAML_WIDTH = 1 << 30


def dump(data: object) -> str:
    """Deterministic YAML (insertion order); strings are never folded, multi-line ones are
    literal blocks."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=YAML_WIDTH, allow_unicode=True)


COMMENT_WIDTH = 120


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}"
            for line in textwrap.wrap(text, COMMENT_WIDTH - len(indent) - 2,
                                      break_on_hyphens=False, break_long_words=False)]


def groups_yaml(groups: list[dict[str, Any]], notes: dict[str, str],
                group_notes: dict[str, str], indent: str = "") -> str:
    """``groups:`` as YAML at ``indent``, a comment above each group (what it holds, how often it
    runs) and above each recording rule (what it holds and why), a blank line between groups.
    PyYAML writes no comments, so each group's header and each rule are dumped on their own and
    laid out here."""
    out = [f"{indent}groups:"]
    for i, group in enumerate(groups):
        if i:
            out.append("")
        out += _comment(group_notes[group["name"]], indent)
        head = {k: v for k, v in group.items() if k != "rules"}
        out += [indent + line for line in dump([head]).splitlines()]
        out.append(f"{indent}  rules:")
        for rule in group["rules"]:
            shown = rule
            if "record" in rule:
                out += _comment(notes[rule["record"]], indent + "  ")
            else:
                shown = {**rule, "labels": _Flow(rule["labels"])}
            out += [indent + "  " + line for line in dump([shown]).splitlines()]
    return "\n".join(out) + "\n"


def rules_text(cfg: dict[str, Any]) -> str:
    """The Prometheus rule file."""
    return HEADER + SOURCE_OF_TRUTH + groups_yaml(groups(cfg), comments(cfg), group_comments(cfg))


def manifest_text(cfg: dict[str, Any]) -> str:
    """The same groups as a prometheus-operator PrometheusRule."""
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": cfg["manifest_name"],
            "namespace": cfg["manifest_namespace"],
            "labels": {"app.kubernetes.io/name": "wandb-infra-issues",
                       "app.kubernetes.io/component": "alert-rules"},
        },
    }
    spec = groups_yaml(groups(cfg), comments(cfg), group_comments(cfg), "  ")
    return HEADER + SOURCE_OF_TRUTH + dump(manifest) + "spec:\n" + spec


def counters_text() -> str:
    """dcgm-exporter counters file with every field the rules read (many are off by default)."""
    lines = [
        "# dcgm-exporter counters needed by the wandb-infra alert rules.",
        "# Generated by alert_rules/generate.py; do not edit.",
        f"# Run: {DCGM_FLAGS}",
        "# (Helm chart: arguments [\"-f\", \"/etc/dcgm-exporter/wandb-infra-counters.csv\", "
        f"\"--xid-count-window-size\", \"{XID_COUNT_WINDOW_MS}\"] with this file mounted from a "
        "ConfigMap.)",
        "# Set NODE_NAME to the node name the run registry uses, so hostnames join.",
        "# Format: DCGM field, Prometheus metric type, help message",
    ]
    for field, kind, text in DCGM_COUNTERS:
        # dcgm-exporter reads the file with Go's encoding/csv and exits on any error: a comma adds
        # a field, a quote in an unquoted field is an error ("bare \" in non-quoted-field").
        if {",", '"', "\n"} & set(field + kind + text):
            raise ValueError(f"dcgm counter {field}: no commas, quotes or newlines allowed")
        lines.append(f"{field}, {kind}, {text}")
    return "\n".join(lines) + "\n"


def _record_anchor(record: str) -> str:
    """The id of a recorded input's entry in docs/runbook.md."""
    return "record-" + re.sub(r"[^a-z0-9]+", "-", record.lower()).strip("-")


def runbook_text(cfg: dict[str, Any]) -> str:
    """docs/runbook.md: one anchored section per alert (with the recording rules its expression
    reads), then the XID table."""
    records = [r for _, _, rules in recording_groups(cfg["violation_unit"], cfg["strip_domain"])
               for r in rules]
    out = [
        "<!-- Generated by alert_rules/generate.py from catalog/; do not edit. -->",
        "# Runbook: infrastructure alerts on W&B runs",
        "",
        "Every alert the rules in `alert_rules/` raise has a section here; the bridge serves "
        f"the same entries at `{runbook.PATH}`, where the alerts' `runbook_url` annotation "
        "points (`--runbook-base`). Labels: `severity`, `category`, the entity "
        "(`hostname`, `gpu`/`gpu_uuid`, `device`/`port`) and, when a run is on the entity, "
        "`wandb_entity`, `wandb_project`, `wandb_run_id`.",
        "",
        "Grafana link annotations: run-scoped alerts (`TrainingStalled`, `TrainingStraggler`) "
        f"carry the run dashboard (`{panels.RUN.uid}`), all others the node dashboard "
        f"(`{panels.NODE.uid}`); every linked panel has the same id on both dashboards when it "
        "exists on both, so the bridge may swap in the run dashboard for run-attributed alerts.",
        "",
        "Attribution: GPU faults go to the run holding that GPU (`wandb_run_gpu_info`); when a "
        "run's GPUs on the host are unknown, to that run by host (with the worst GPU's labels) "
        "but never to a run that holds a different GPU; with no run, the alert fires without "
        "run labels. Host and link faults go to every run on the host (with the worst port's "
        "labels). The rules decide this once (the `attribution` group joins each fault family "
        "with its runs every cycle) and are its source of truth: the bridge confirms each alert "
        "against Prometheus' `ALERTS` and never joins again. XID alerts last 10-15 minutes after "
        "the event (dcgm-exporter only keeps the last XID; `DCGM_EXP_XID_ERRORS_COUNT` is used "
        "when enabled).",
        "",
        f"dcgm-exporter: run with `alert_rules/{COUNTERS_FILE}` "
        f"(`{DCGM_FLAGS}`).",
        "",
        "| Alert | Severity | Category | Scope |",
        "|---|---|---|---|",
    ]
    entries = runbook.entries()
    out += [f"| [{e.name}](#{e.anchor}) | {e.alert.severity} | {e.alert.category} | "
            f"{e.alert.scope} |" for e in entries]
    for e in entries:
        a = e.alert
        out += [
            "",
            f'<a id="{e.anchor}"></a>',
            "",
            f"## {a.name}",
            "",
            f"**{a.summary}** {e.raised}",
            "",
            f"- **Meaning:** {runbook.placeholders(a.description)}",
            f"- **Impact on training:** {a.impact}",
            f"- **How to confirm:** {e.confirm}",
            f"- **What to do:** {a.remediation}",
            f"- **Before the node takes a job again:** {e.needs}",
            "",
            "```promql",
            a.expr,
            "```",
        ]
        read = records_read(a.expr, [r.record for r in records])
        inputs = [r for r in records if r.record in read]
        if inputs:
            out += ["", "Reads the recorded inputs " + ", ".join(
                f"[`{r.record}`](#{_record_anchor(r.record)})" for r in inputs) + "."]
    names = [r.record for r in records]
    used = {name for e in entries for name in records_read(e.alert.expr, names)}
    out += ["", '<a id="recorded-inputs"></a>', "", "## Recorded inputs", "",
            "The recording rules of `alert_rules/normalise.py` the alerts above read, each once: "
            "they give dcgm-exporter's, node_exporter's and the exporter's series one set of "
            "label names (`hostname`, `gpu`, `gpu_uuid`) whatever their versions emit."]
    for r in records:
        if r.record in used:
            out += ["", f'<a id="{_record_anchor(r.record)}"></a>', "", f"### `{r.record}`",
                    "", "```promql", r.expr, "```"]
    out += ["", '<a id="safe-to-restart"></a>', "", "## Is it safe to restart?", "",
            runbook.SAFE_TO_RESTART, "",
            "| Action | Needs | Node leaves the pool | Seen done when |", "|---|---|---|---|"]
    out += [f"| `{a}` | {n} | {leaves} | {seen} |" for a, n, leaves, seen in runbook.action_rows()]
    out += ["", '<a id="xid-catalog"></a>', "", "## XID catalog", "",
            "Every XID NVIDIA lists for A100, H100, B100 or GB200, with NVIDIA's immediate "
            "action bucket (catalog/xid.py).", "",
            "| XID | Meaning | NVIDIA's immediate action | Needs | Alert |",
            "|---|---|---|---|---|"]
    out += [f"| {' | '.join(row)} |" for row in runbook.xid_rows()]
    return "\n".join(out) + "\n"


def mixin_rules_text(cfg: dict[str, Any]) -> str:
    """mixin/rules.json: the same groups with the configurable thresholds and the host key as
    tokens (``MIXIN_PLACEHOLDER``), and their defaults; mixin/rules.libsonnet fills in _config's, so
    the mixin with a changed _config renders what the generator writes with the same options."""
    tokens = {**cfg, "mixin_tokens": True}
    defaults = {"thresholds": {key: TEMPLATE_VALUES[name] for key, name in THRESHOLDS.items()},
                "hostKeyRegex": normalise.FQDN,
                "selectors": {key: "" for key in selectors.EXPORTERS}}
    return json.dumps({"defaults": defaults, "groups": groups(tokens)}, indent=1) + "\n"


def outputs(cfg: dict[str, Any]) -> dict[Path, str]:
    """Every generated file, relative to the repository root."""
    return {
        Path("alert_rules") / RULES_FILE: rules_text(cfg),
        Path("alert_rules") / MANIFEST_FILE: manifest_text(cfg),
        Path("alert_rules") / COUNTERS_FILE: counters_text(),
        RUNBOOK: runbook_text(cfg),
        MIXIN_RULES: mixin_rules_text(cfg),
    }


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check compare) every generated file."""
    args = parse_args(argv)
    try:
        cfg = options(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = Path(args.out_dir) if args.out_dir is not None else CHECKOUT
    if root is None:
        print("error: not run from a source checkout of wandb-infra-issues: pass --out-dir DIR "
              "(the rules go to DIR/alert_rules/)", file=sys.stderr)
        return 2
    return write_or_check({root / rel: text for rel, text in outputs(cfg).items()}, args.check,
                          lambda path: str(path.relative_to(root)))


if __name__ == "__main__":
    sys.exit(main())
