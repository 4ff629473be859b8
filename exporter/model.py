"""Plain data shared by sources, the placement merger and collector: where a run executes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from wandb_infra.common.runkey import RunKey


class Gpu(NamedTuple):
    """One GPU as a source knows it: index ("" when unknown), UUID ("" when unknown)."""

    index: str = ""  # type: ignore[assignment]  # shadows tuple.index; a field is what we mean
    uuid: str = ""


@dataclass(frozen=True)
class RunPlacement:
    """One run on one host, with the GPUs it holds there (empty when the source cannot tell).

    ``extra`` holds optional contract-1 labels (slurm_job_id, namespace, pod, wandb_run_group).
    """

    run: RunKey
    host: str
    source: str
    gpus: tuple[Gpu, ...] = ()
    run_name: str = ""
    extra: tuple[tuple[str, str], ...] = ()


@dataclass
class SourceResult:
    """What one poll of a source found: placements plus problems that did not stop it."""

    placements: list[RunPlacement] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
