"""Turns Alertmanager notifications into diagnosed issues on W&B runs."""
