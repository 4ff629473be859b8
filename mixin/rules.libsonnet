// Rule groups of alert_rules/wandb-infra.rules.yml (rules.json is the same output of
// alert_rules/generate.py as JSON). Groups whose rules are all recording rules are
// prometheusRules; the alert families (their fault records first, then the alerts that read them
// in the same evaluation) stay whole in prometheusAlerts.
local generated = import 'rules.json';
local isAlertGroup(group) = std.length([r for r in group.rules if std.objectHas(r, 'alert')]) > 0;

{
  local config = self._config,
  local withConfig(rule) =
    if std.objectHas(rule, 'alert') then rule {
      labels+: config.alertLabels,
      annotations+: {
        runbook_url: std.strReplace(super.runbook_url, config.generatedRunbookURLBase,
                                    config.runbookURLBase),
      },
    } else rule,

  prometheusRules+:: {
    groups+: [g for g in generated.groups if !isAlertGroup(g)],
  },
  prometheusAlerts+:: {
    groups+: [
      g { rules: [withConfig(r) for r in g.rules] }
      for g in generated.groups
      if isAlertGroup(g)
    ],
  },
}
