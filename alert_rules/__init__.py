"""Generates the Prometheus rules, the dcgm-exporter counters file and the runbook from the
catalog."""
