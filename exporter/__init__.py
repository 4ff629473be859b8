"""Publishes which W&B run is on which host and GPU, as Prometheus join metrics."""
