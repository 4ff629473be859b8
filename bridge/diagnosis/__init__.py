"""Decide, from plain data only: the root cause and its consequences, what the fault needs and
whether a restart is safe, an ended run's verdict, the measured impact, Grafana links and the
text a person reads. Nothing here does I/O."""
