"""Generates the Grafana dashboards from the catalog's panel ids."""
