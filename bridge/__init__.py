"""Turns Alertmanager notifications into diagnosed issues on W&B runs."""

from wandb_infra.common.extras import run_cli


def main() -> int:
    """``wandb-infra-bridge``: the CLI, or one line naming the ``bridge`` extra when its
    dependencies are not installed (a bare install holds only the training client)."""
    return run_cli(f"{__name__}.cli", "wandb-infra-bridge", "bridge")
