#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/path/to/epilog.sh): removes this job's W&B run on this node
# from wandb-infra-exporter (DELETE /v1/runs/<entity>/<project>/<run_id>?hostname=<node>).
# It never fails the job: every error is logged and the script exits 0. See common.sh for settings.
. "$(dirname "$(readlink -f "$0")")/common.sh" || exit 0

if ! out=$(curl -sS --max-time "$timeout" -X DELETE "${curl_auth[@]}" -w ' HTTP %{http_code}' \
      "$url/v1/runs/$entity/$project/$run_id?hostname=$host" 2>&1) \
   || [[ ! "$out" =~ HTTP\ 200$ ]]; then
  log "deregister $entity/$project/$run_id on $host failed: $out"
fi
exit 0
