"""A simulated GPU cluster: dcgm-exporter and node_exporter for N hosts x 8 GPUs, faults on cue.

Why: rules, dashboards, the bridge and the demo need realistic telemetry from a cluster that is not
here. One module per concern, each importing only those above it in this list:

* ``model``: hosts, GPUs, ports and counters, and how readings follow state (no text, no I/O);
* ``exposition``: the exporters' text (flavours, metric names, labels), join metrics, scontrol;
* ``cluster``: ``Cluster``, which injects and clears faults, places runs and caches the text;
* ``scrape``: target groups, scrape configs and a prometheus.yml for the simulator;
* ``server``: the HTTP server (``serve``, ``SimulatorServer``) and its control API;
* ``__main__``: ``python -m demo.simulator`` (``--help`` lists the options).
"""
