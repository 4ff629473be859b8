"""Contract 1: the join metrics' names and labels, shared by exporter, rules, dashboards, bridge."""

import re

NODE_INFO = "wandb_run_node_info"
GPU_INFO = "wandb_run_gpu_info"
# One series per Kubernetes pod of a run, so the rules can join dcgm-exporter's pod labels (which
# pod holds which GPU) to runs; node info names one pod per (run, host) at most.
POD_INFO = "wandb_run_pod_info"

ENTITY = "wandb_entity"
PROJECT = "wandb_project"
RUN_ID = "wandb_run_id"
RUN_NAME = "wandb_run_name"
RUN_GROUP = "wandb_run_group"
HOSTNAME = "hostname"
GPU = "gpu"
GPU_UUID = "gpu_uuid"
SOURCE = "source"
SLURM_JOB_ID = "slurm_job_id"
NAMESPACE = "namespace"
POD = "pod"

RUN_LABELS: tuple[str, ...] = (ENTITY, PROJECT, RUN_ID)
NODE_INFO_LABELS: tuple[str, ...] = (
    ENTITY, PROJECT, RUN_ID, RUN_NAME, RUN_GROUP, HOSTNAME, SOURCE, SLURM_JOB_ID, NAMESPACE, POD,
)
GPU_INFO_LABELS: tuple[str, ...] = (ENTITY, PROJECT, RUN_ID, HOSTNAME, GPU, GPU_UUID, SOURCE)
POD_INFO_LABELS: tuple[str, ...] = (ENTITY, PROJECT, RUN_ID, HOSTNAME, NAMESPACE, POD, SOURCE)

SELF_METRIC_PREFIX = "wandb_infra_exporter_"

# Acceptable values of the run labels: W&B run ids, and entity/project names that cannot break a
# URL path or a log line. Matched with fullmatch (a trailing newline is not accepted).
RUN_ID_CHARS = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
NAME_CHARS = re.compile(r"[^\s/\\#?%:\x00-\x1f\x7f]{1,128}")
