"""Write W&B (an edge): plan a run's tags, summary, notes and plot markers from its issues, and
deliver them through the outbox worker, coalesced per run."""
