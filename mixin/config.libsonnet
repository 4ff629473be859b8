{
  _config+:: {
    // The runbook_url prefix the rules were generated with (alert_rules/generate.py
    // --runbook-base); set runbookURLBase to point the alerts at your own copy of
    // docs/runbook.md.
    generatedRunbookURLBase: 'https://github.com/wandb-infra-issues/wandb-infra-issues/blob/main',
    runbookURLBase: self.generatedRunbookURLBase,
    // Extra labels on every alert (e.g. a team label your Alertmanager routes on).
    alertLabels: {},
  },
}
