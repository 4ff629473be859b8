#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/path/to/prolog.sh): registers this job's W&B run on this node,
# with the GPUs Slurm gave it (SLURM_JOB_GPUS), at wandb-infra-exporter's POST /v1/runs.
# It never fails the job: every error is logged and the script exits 0. See common.sh for settings.
. "$(dirname "$(readlink -f "$0")")/common.sh" || exit 0

gpus=""
if [[ "${SLURM_JOB_GPUS:-}" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  gpus="\"${SLURM_JOB_GPUS//,/\",\"}\""
fi
job=""
if [[ "${SLURM_JOB_ID:-}" =~ ^[0-9_]+$ ]]; then
  job=",\"slurm_job_id\":\"$SLURM_JOB_ID\""
fi
[[ "$ttl" =~ ^[0-9]+$ ]] || ttl=604800
body="{\"entity\":\"$entity\",\"project\":\"$project\",\"run_id\":\"$run_id\",\"hostname\":\"$host\",\"gpus\":[${gpus}],\"ttl_seconds\":$ttl$job}"

if ! out=$(curl -sS --max-time "$timeout" -X POST -H 'Content-Type: application/json' \
      "${curl_auth[@]}" --data "$body" -w ' HTTP %{http_code}' "$url/v1/runs" 2>&1) \
   || [[ ! "$out" =~ HTTP\ 20[01]$ ]]; then
  log "register $entity/$project/$run_id on $host failed: $out"
fi
exit 0
