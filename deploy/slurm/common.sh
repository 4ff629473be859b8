# Sourced by prolog.sh and epilog.sh: reads the job's W&B run from SLURM_JOB_COMMENT
# (convention: "wandb:<entity>/<project>/<run_id>" anywhere in the comment) and the exporter settings.
#
# Settings (environment, or the file WANDB_INFRA_EXPORTER_ENV_FILE, default
# /etc/default/wandb-infra-exporter, sourced when it exists):
#   WANDB_INFRA_EXPORTER_URL         registration API base URL (default http://127.0.0.1:9842)
#   WANDB_INFRA_EXPORTER_TOKEN_FILE  file holding the bearer token (default
#                                    /etc/wandb-infra-exporter/token; the exporter requires it
#                                    unless it listens on loopback only; with the exporter's
#                                    auth.host_tokens each node can hold its own token, good
#                                    only for its own host)
#   WANDB_INFRA_EXPORTER_TTL         seconds a registration lives without the epilog (default 7 days)
#   WANDB_INFRA_EXPORTER_TIMEOUT     curl timeout in seconds (default 5)

env_file="${WANDB_INFRA_EXPORTER_ENV_FILE:-/etc/default/wandb-infra-exporter}"
# shellcheck disable=SC1090
[ -r "$env_file" ] && . "$env_file"

url="${WANDB_INFRA_EXPORTER_URL:-http://127.0.0.1:9842}"
ttl="${WANDB_INFRA_EXPORTER_TTL:-604800}"
timeout="${WANDB_INFRA_EXPORTER_TIMEOUT:-5}"
host="${SLURMD_NODENAME:-$(hostname -s)}"

# Names restricted to characters that need no JSON or URL escaping.
name_re='wandb:([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)'
if [[ "${SLURM_JOB_COMMENT:-}" =~ $name_re ]]; then
  entity="${BASH_REMATCH[1]}"; project="${BASH_REMATCH[2]}"; run_id="${BASH_REMATCH[3]}"
else
  exit 0  # this job names no W&B run: nothing to do
fi

log() { logger -t wandb-infra-exporter "$*" 2>/dev/null || echo "wandb-infra-exporter: $*" >&2; }

token_file="${WANDB_INFRA_EXPORTER_TOKEN_FILE:-/etc/wandb-infra-exporter/token}"
curl_auth=()
if [ -r "$token_file" ]; then
  curl_auth=(-H "Authorization: Bearer $(tr -d '\r\n' < "$token_file")")
elif [[ ! "$url" =~ ^https?://(127\.[0-9.]+|localhost|\[::1\])(:|/|$) ]]; then
  log "no readable token file $token_file: $url will refuse the request (401)"
fi
