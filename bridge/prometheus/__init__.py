"""Read Prometheus (an edge): alert history for post-mortems, scheduler state and recovery
evidence for the verdict, which runs ended and what they were seen through, measured impact."""
