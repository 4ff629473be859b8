"""Publishes which W&B run is on which host and GPU, as Prometheus join metrics."""

from importlib.metadata import PackageNotFoundError, version

from wandb_infra.common.extras import run_cli
from wandb_infra.common.generated import PROJECT

try:
    __version__ = version(PROJECT)
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"


def main() -> int:
    """``wandb-infra-exporter``: the CLI, or one line naming the ``exporter`` extra when its
    dependencies are not installed (a bare install holds only the training client)."""
    return run_cli(f"{__name__}.cli", "wandb-infra-exporter", "exporter")
