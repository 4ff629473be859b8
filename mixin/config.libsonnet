local generated = import 'rules.json';
{
  _config+:: {
    // The runbook_url prefix the rules were generated with (alert_rules/generate.py
    // --runbook-base: the bridge's in-cluster Service, which serves /runbook); set
    // runbookURLBase to the bridge's URL as your on-call engineers reach it.
    generatedRunbookURLBase: 'http://wandb-infra-bridge.monitoring.svc:9461',
    runbookURLBase: self.generatedRunbookURLBase,
    // Extra labels on every alert (e.g. a team label your Alertmanager routes on).
    alertLabels: {},
    // Alert thresholds, the catalog's by default (catalog/alerts.py); the generator takes the
    // same keys in its config file (thresholds: {tempCriticalC: 92}), so both render the same.
    thresholds: generated.defaults.thresholds,
    // The canonical host key: the first group of this regex where it matches an exporter's
    // host name (default: the first label of an FQDN; '(.+)' keeps names whole). Must match the
    // exporter's hostnames.strip_domain. The generator's --host-key-regex / host_key_regex.
    hostKeyRegex: generated.defaults.hostKeyRegex,
    // Label matchers added to every series the rules read from each exporter, e.g.
    // selectors+: { dcgmExporter: 'job="dcgm-exporter"' } where two deployments share a
    // Prometheus (keys: alert_rules/selectors.py EXPORTERS; default none). `up` and the rules'
    // own records take none: they are joined on the targets these select. The generator's
    // selectors: section takes the same keys.
    selectors: generated.defaults.selectors,
  },
}
