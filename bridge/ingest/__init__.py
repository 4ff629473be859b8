"""Take alerts in: parse Alertmanager bodies, read the run, host and GPU from their labels, and
keep them durably in the store (the outbox every other part reads)."""
