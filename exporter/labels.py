"""Contract 1: the join metrics' names and labels, shared by exporter, rules, dashboards, bridge."""

NODE_INFO = "wandb_run_node_info"
GPU_INFO = "wandb_run_gpu_info"

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

SELF_METRIC_PREFIX = "wandb_infra_exporter_"
