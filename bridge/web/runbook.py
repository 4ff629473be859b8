"""The runbook page the bridge serves at ``/runbook``, so every alert's ``runbook_url`` resolves
where the rules run (no public documentation site needed).

Built once from the catalog (``catalog.runbook``, the same entries and anchors as
``docs/runbook.md``) and served without login: it documents alerts, not runs.
"""

from __future__ import annotations

import re
from functools import cache
from html import escape

from aiohttp import web

from wandb_infra.catalog import runbook

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem 2rem;"
    "color:#1d2430}code,pre{font:13px ui-monospace,monospace;background:#f3f4f6;"
    "border-radius:4px}code{padding:0 .25em}pre{padding:.6em;overflow-x:auto}"
    "table{border-collapse:collapse}td,th{border:1px solid #d8dce3;padding:.2em .5em;"
    "text-align:left}section{border-top:1px solid #d8dce3;margin-top:1.5rem}"
    "section:target{background:#fff8db}"
)


def _inline(text: str) -> str:
    """Escaped text with the Markdown the catalog uses (`code`, **bold**) as HTML, templates
    as placeholders."""
    html = escape(runbook.placeholders(text), quote=False)
    return _BOLD.sub(r"<strong>\1</strong>", _CODE.sub(r"<code>\1</code>", html))


def _section(e: runbook.Entry) -> str:
    a = e.alert
    items = [("Meaning", _inline(a.description)),
             ("Impact on training", _inline(a.impact)),
             ("How to confirm", _inline(e.confirm)),
             ("What to do", _inline(a.remediation)),
             ("Before the node takes a job again", _inline(e.needs))]
    return (f"<section id='{escape(e.anchor, quote=True)}'><h2>{escape(e.name)}</h2>"
            f"<p><strong>{_inline(a.summary)}</strong> {_inline(e.raised)}</p><ul>"
            + "".join(f"<li><strong>{k}:</strong> {v}</li>" for k, v in items)
            + f"</ul><pre>{escape(a.expr)}</pre></section>")


@cache
def page() -> str:
    """The whole runbook as one HTML document (the catalog does not change while running)."""
    entries = runbook.entries()
    index = "".join(
        f"<tr><td><a href='#{escape(e.anchor, quote=True)}'>{escape(e.name)}</a></td>"
        f"<td>{escape(e.alert.severity)}</td><td>{escape(e.alert.category)}</td>"
        f"<td>{escape(e.alert.scope)}</td></tr>" for e in entries)
    xids = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                   for row in runbook.xid_rows())
    actions = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                      for row in runbook.action_rows())
    body = (
        "<h1>Runbook: infrastructure alerts on W&amp;B runs</h1>"
        "<p>Every alert this project's rules raise has a section here; its "
        "<code>runbook_url</code> annotation points at the section. The recording rules each "
        "expression reads are listed in <code>docs/runbook.md</code> of the release.</p>"
        "<table><tr><th>Alert</th><th>Severity</th><th>Category</th><th>Scope</th></tr>"
        f"{index}</table>" + "".join(_section(e) for e in entries)
        + "<section id='safe-to-restart'><h2>Is it safe to restart?</h2>"
        f"<p>{_inline(runbook.SAFE_TO_RESTART)}</p><table><tr><th>Action</th><th>Needs</th>"
        "<th>Node leaves the pool</th><th>Seen done when</th></tr>"
        f"{actions}</table></section>"
        "<section id='xid-catalog'><h2>XID catalog</h2><table><tr><th>XID</th>"
        "<th>Meaning</th><th>NVIDIA's immediate action</th><th>Needs</th><th>Alert</th></tr>"
        f"{xids}</table></section>")
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Runbook</title><style>{_STYLE}</style></head><body><main>{body}"
            "</main></body></html>")


async def handle(_request: web.Request) -> web.Response:
    """GET /runbook."""
    return web.Response(text=page(), content_type="text/html",
                        headers={"Cache-Control": "public, max-age=300"})
