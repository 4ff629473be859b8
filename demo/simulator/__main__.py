"""``python -m demo.simulator``: serve a simulated cluster until interrupted.

Prints one JSON line with the URL once listening (the demo and tests read it), and optionally
writes file_sd target files and a prometheus.yml that scrapes the simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import threading
from pathlib import Path

from demo.simulator.cluster import Cluster
from demo.simulator.exposition import FLAVOURS
from demo.simulator.model import SimulatorError
from demo.simulator.scrape import interval_seconds, prometheus_config, scrape_configs
from demo.simulator.server import SimulatorServer
from wandb_infra.common.logsetup import log_fields, setup_logging

log = logging.getLogger("demo.simulator")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; every one is explained in --help."""
    parser = argparse.ArgumentParser(
        prog="python -m demo.simulator",
        description="Serve simulated dcgm-exporter and node_exporter targets for N hosts x GPUs on "
                    "127.0.0.1, with faults injected through POST /control/fault.")
    parser.add_argument("--hosts", type=int, default=64, help="number of hosts (default 64)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per host (default 8)")
    parser.add_argument("--ib-ports", type=int, default=8,
                        help="InfiniBand HCAs per host, one port each (default 8)")
    parser.add_argument("--prefix", default="gpu-node", help="host name prefix (default gpu-node)")
    parser.add_argument("--flavour", choices=FLAVOURS, default="hostname",
                        help="dcgm-exporter flavour: 'Hostname' label (<= 4.8.2), 'hostname' "
                             "label (newer), or '4.9' metric names and units (default hostname)")
    parser.add_argument("--xid-count", action="store_true",
                        help="also serve DCGM_EXP_XID_ERRORS_COUNT (off by default in "
                             "dcgm-exporter)")
    parser.add_argument("--xid-absent-until-first", action="store_true",
                        help="omit DCGM_FI_DEV_XID_ERRORS until a GPU's first XID (some 4.5-4.8)")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free)")
    parser.add_argument("--interval", default="15s", help="scrape interval written to configs")
    parser.add_argument("--file-sd-dir", type=Path,
                        help="write file_sd target files (dcgm.json, node.json) into this folder")
    parser.add_argument("--prometheus-config", type=Path,
                        help="write a prometheus.yml scraping the simulator to this path")
    parser.add_argument("--log-level", default="info", help="log level (default info)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; prints one JSON line with the URL once listening."""
    args = parse_args(argv)
    setup_logging(args.log_level)
    try:
        cluster = Cluster(hosts=args.hosts, gpus_per_host=args.gpus, flavour=args.flavour,
                          prefix=args.prefix, ib_ports=args.ib_ports, xid_count=args.xid_count,
                          xid_absent_until_first=args.xid_absent_until_first)
        interval_seconds(args.interval)
    except SimulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = SimulatorServer(cluster, port=args.port).start()
    try:
        if args.file_sd_dir is not None:
            scrape_configs(server.address, cluster.hosts, interval=args.interval,
                           file_sd_dir=args.file_sd_dir)
        if args.prometheus_config is not None:
            args.prometheus_config.write_text(prometheus_config(
                server.address, cluster.hosts, interval=args.interval,
                file_sd_dir=args.file_sd_dir, runs_job="wandb-runs-simulated"))
        print(json.dumps({"url": server.url, "hosts": len(cluster.hosts)}), flush=True)
        log.info("simulator listening", extra=log_fields(url=server.url, hosts=len(cluster.hosts),
                                                         flavour=args.flavour))
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
