"""What the exporter, the bridge and the rule generators share: the label contract, a run's key,
config and secret loading, JSON logging, outside commands and the Kubernetes API connection,
scheduler node states. Imports nothing else of this repository."""
