// wandb-infra monitoring mixin: the shipped rules and dashboards for jsonnet users
// (kube-prometheus, grafana-operator, mixtool). The generated files under alert_rules/ and
// dashboards/ stay the source of truth: this mixin imports them, it never restates them.
//
//   local wandbInfra = (import 'mixin.libsonnet') + { _config+:: { runbookURLBase: '...' } };
//   wandbInfra.prometheusRules    // normalisation recording groups
//   wandbInfra.prometheusAlerts   // alert families (each with the fault records it reads)
//   wandbInfra.grafanaDashboards  // { 'wandb-run-infra.json': {...}, ... }
(import 'config.libsonnet') +
(import 'rules.libsonnet') +
(import 'dashboards.libsonnet')
