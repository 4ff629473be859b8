// Rule groups of alert_rules/wandb-infra.rules.yml (rules.json is the same output of
// alert_rules/generate.py as JSON, with <<key>> in place of each _config.thresholds value and of
// hostKeyRegex, and <<selectors.key>> where each exporter's _config.selectors matchers go).
// Groups whose rules are all recording rules are prometheusRules; the alert families (their fault
// records first, then the alerts that read them in the same evaluation) stay whole in
// prometheusAlerts.
local generated = import 'rules.json';
local isAlertGroup(group) = std.length([r for r in group.rules if std.objectHas(r, 'alert')]) > 0;

{
  local config = self._config,
  // A misspelt key would otherwise change nothing, silently.
  local unknown(field) = std.setDiff(std.set(std.objectFields(config[field])),
                                     std.set(std.objectFields(generated.defaults[field]))),
  assert std.length(unknown('thresholds')) == 0 :
         'unknown _config.thresholds keys: ' + std.join(', ', unknown('thresholds')),
  assert std.length(unknown('selectors')) == 0 :
         'unknown _config.selectors keys: ' + std.join(', ', unknown('selectors')),
  // Numbers as the generator prints them: whole ones as integers, others shortest (%g).
  local number(v) =
    if std.isString(v) then v else if v == std.floor(v) then std.toString(v) else std.format('%g', v),
  // An exporter's matchers; an empty selector takes its token's braces or comma with it.
  local select(text, key) =
    local token = '<<selectors.' + key + '>>';
    local matchers = std.stripChars(config.selectors[key], ' \t\n');
    if matchers == '' then
      std.strReplace(std.strReplace(text, '{' + token + '}', ''), token + ',', '')
    else std.strReplace(text, token, matchers),
  local fill(expr) = std.foldl(
    function(text, key) std.strReplace(text, '<<' + key + '>>', number(config.thresholds[key])),
    std.objectFields(config.thresholds),
    std.foldl(select, std.objectFields(config.selectors),
              std.strReplace(expr, '<<hostKeyRegex>>', config.hostKeyRegex)),
  ),
  local withConfig(rule) =
    if std.objectHas(rule, 'alert') then rule {
      expr: fill(super.expr),
      labels+: config.alertLabels,
      annotations+: {
        runbook_url: std.strReplace(super.runbook_url, config.generatedRunbookURLBase,
                                    config.runbookURLBase),
      },
    } else rule { expr: fill(super.expr) },

  prometheusRules+:: {
    groups+: [g { rules: [withConfig(r) for r in g.rules] } for g in generated.groups if !isAlertGroup(g)],
  },
  prometheusAlerts+:: {
    groups+: [
      g { rules: [withConfig(r) for r in g.rules] }
      for g in generated.groups
      if isAlertGroup(g)
    ],
  },
}
