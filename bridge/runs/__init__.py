"""The run service: one typed view of a run (facts confirmed by Prometheus, diagnosis, restart
decisions with the quarantine's, measured impacts, verdict) that every surface renders."""
