"""Real services for tests (Prometheus, Alertmanager); implemented once in demo/processes."""

from demo.processes import (
    ALERTMANAGER,
    AMTOOL,
    PROMETHEUS,
    PROMTOOL,
    Service,
    alertmanager,
    env_without_proxies,
    free_port,
    prom_query,
    prometheus,
    wait_http,
)

__all__ = [
    "ALERTMANAGER", "AMTOOL", "PROMETHEUS", "PROMTOOL", "Service", "alertmanager",
    "env_without_proxies", "free_port", "prom_query", "prometheus", "wait_http",
]
