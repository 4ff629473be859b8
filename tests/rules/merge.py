"""Run promtool cases side by side: cases that check the same alerts at the same times are
evaluated as one promtool test, each on its own hosts and runs.

promtool evaluates every loaded rule group at every step of every test, whatever the test's
series, so a suite's cost is its cases times their steps; a fault case and its healthy twin
(and the variants of one alert) cost one evaluation when they run together. The committed
suites keep one case per behaviour (what an operator reads); only the runner merges them.

Merging is exact: each member's hosts and runs get a prefix of their own (``m1n1``,
``m1runa``), in its series and in its expected labels and descriptions alike, and each check
expects the union of its members' alerts, so an alert a member did not expect (a twin that
fires, or a fault leaking onto another member's hosts or runs) fails the merged test as it
failed the case alone. Cases stay alone when members could meet through anything but their
hosts and runs: hosts not named ``n<k>``, Kubernetes pods (joined by name), PromQL sample
checks, alerts about the whole pipeline (one per cluster), or series that would collide."""

from __future__ import annotations

import copy
import re
from typing import Any

from wandb_infra.catalog.alerts import ALERTS

# The host and run names the case builders use (tests/rules/build.py: n1, n2, ...; RUN_A, RUN_B).
TOKEN = re.compile(r"\b(n[0-9]+|run[ab])\b")
_HOST_LABEL = re.compile(r'\b(?:hostname|Hostname|nodename|node)="([^"]*)"')
_HOST = re.compile(r"n[0-9]+")
_POD = re.compile(r'\b(?:exported_)?pod="')
# Members per merged test: enough to pay for the steps once, few enough to read a failure.
MAX_MEMBERS = 12


def _renamed(value: Any, tag: str) -> Any:
    if isinstance(value, str):
        return TOKEN.sub(lambda m: tag + m.group(1), value)
    if isinstance(value, list):
        return [_renamed(v, tag) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, tag) for k, v in value.items()}
    return value


def mergeable(case: dict) -> bool:
    """A case of per-entity alert checks whose hosts all carry the builders' ``n<k>`` names."""
    checks = case.get("alert_rule_test")
    if case.get("promql_expr_test") or not checks:
        return False
    if any(ALERTS[c["alertname"]].scope == "pipeline" for c in checks):
        return False
    series = [s["series"] for s in case["input_series"]]
    hosts = [h for s in series for h in _HOST_LABEL.findall(s)]
    return all(_HOST.fullmatch(h) for h in hosts) and not any(_POD.search(s) for s in series)


def _key(case: dict) -> tuple:
    return (case.get("interval"),
            tuple((c["alertname"], c["eval_time"]) for c in case["alert_rule_test"]))


def _join(members: list[dict]) -> dict | None:
    """The members as one test, or None when two of their series would collide."""
    if len(members) == 1:
        return members[0]
    series: dict[str, str] = {}
    for member in members:
        for s in member["input_series"]:
            if series.setdefault(s["series"], s["values"]) != s["values"]:
                return None
    checks = copy.deepcopy(members[0]["alert_rule_test"])
    for i, check in enumerate(checks):
        expected = [a for m in members for a in m["alert_rule_test"][i].get("exp_alerts", [])]
        check.pop("exp_alerts", None)
        if expected:
            check["exp_alerts"] = expected
    return {"name": " + ".join(m["name"] for m in members), "interval": members[0]["interval"],
            "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": checks}


def merged(cases: list[dict]) -> list[dict]:
    """``cases`` as promtool tests: mergeable cases with the same checks grouped, each member
    past the first renamed; the rest as they are. Order: first appearance."""
    out: list[dict] = []
    open_: dict[tuple, list[dict]] = {}
    slots: dict[tuple, int] = {}
    for case in cases:
        if not mergeable(case):
            out.append(case)
            continue
        key = _key(case)
        members = open_.get(key)
        if members is not None and len(members) < MAX_MEMBERS:
            candidate = _join([*members, _renamed(case, f"m{len(members)}")])
            if candidate is not None:
                members.append(_renamed(case, f"m{len(members)}"))
                out[slots[key]] = candidate
                continue
        open_[key] = [case]
        slots[key] = len(out)
        out.append(case)
    return out
