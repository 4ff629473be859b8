{
  _config+:: {
    // The runbook_url prefix the rules were generated with (alert_rules/generate.py
    // --runbook-base: the bridge's in-cluster Service, which serves /runbook); set
    // runbookURLBase to the bridge's URL as your on-call engineers reach it.
    generatedRunbookURLBase: 'http://wandb-infra-bridge.monitoring.svc:9461',
    runbookURLBase: self.generatedRunbookURLBase,
    // Extra labels on every alert (e.g. a team label your Alertmanager routes on).
    alertLabels: {},
  },
}
