#!/usr/bin/env bash
# Installs the Debian packages the demo, tests and benchmarks run for real: Prometheus + promtool,
# Alertmanager + amtool, Slurm 22.05 with munge, VictoriaMetrics + vmalert, jsonnet, Chromium
# (headless page tests), kubectl (kustomize), systemd-analyze (the deploy/systemd/ units).
# Idempotent: does nothing when all are present.
set -euo pipefail

need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
command -v munged >/dev/null || [ -x /usr/sbin/munged ] || need+=(munge)
command -v victoria-metrics >/dev/null || need+=(victoria-metrics)
command -v vmalert >/dev/null || need+=(victoria-metrics)
command -v jsonnet >/dev/null || need+=(jsonnet)
command -v chromium >/dev/null || need+=(chromium)
# kubectl kustomize (kustomize >= 4, for components) builds the Kubernetes manifests in the tests.
# The machine images ship kubectl 1.3x; Debian's kubernetes-client (1.20, kustomize 2) is only a
# fallback, and tests/test_deploy_kubernetes.py says so when its kustomize is too old.
command -v kubectl >/dev/null || need+=(kubernetes-client)
# systemd-analyze verifies deploy/systemd/ (tests/test_deploy_systemd.py); nothing is started.
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root or sudo to install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "installing Debian packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Debian's postinst scripts try to start the services; policy-rc.d keeps them stopped, tests start
# their own instances on loopback.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
