"""Act on the scheduler (an edge, opt-in): the circuit breaker, the audit log and the drain or
cordon itself. Only the quarantine process (``wandb-infra-bridge quarantine``) runs it."""
