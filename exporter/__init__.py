"""Publishes which W&B run is on which host and GPU, as Prometheus join metrics."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wandb-infra-issues")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"
