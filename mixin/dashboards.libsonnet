// Dashboards from dashboards/*.json (generated from catalog/; panel ids are stable and the
// bridge links to them, so edit the catalog, not the JSON).
{
  grafanaDashboards+:: {
    'wandb-run-infra.json': import '../dashboards/wandb-run-infra.json',
    'wandb-node-gpu-health.json': import '../dashboards/wandb-node-gpu-health.json',
    'wandb-infra-pipeline.json': import '../dashboards/wandb-infra-pipeline.json',
  },
}
