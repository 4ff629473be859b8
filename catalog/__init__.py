"""The one source of truth shared by rules, dashboards and the bridge.

``panels`` declares dashboard uids and stable panel ids, ``xid`` the XID catalog, ``alerts`` every
alert (name, severity, category, cause class, texts, expression, linked panel). The generators in
``alert_rules/`` and ``dashboards/`` render files from these modules; the bridge reads them to rank
root causes and build Grafana links.
"""
