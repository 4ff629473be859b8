"""Console scripts whose dependencies are an optional extra: the bare wheel carries only what the
training client needs (``wandb_infra.exporter.client``, standard library only), so the exporter and
the bridge say in one line which extra to install instead of failing with a traceback."""

from __future__ import annotations

import importlib
import sys

from wandb_infra.common.generated import PROJECT


def run_cli(module: str, program: str, extra: str) -> int:
    """Import ``module`` and return its ``main()``; a third-party module it needs that is missing
    prints ``program: ... pip install 'wandb-infra-issues[extra]'`` and returns 2. A missing
    module of our own is a broken install, not a missing extra: it raises as usual."""
    try:
        cli = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.partition(".")[0] == "wandb_infra":
            raise
        print(f"{program}: needs the '{extra}' extra (no module named {exc.name!r}): "
              f"pip install '{PROJECT}[{extra}]'", file=sys.stderr)
        return 2
    return int(cli.main())
