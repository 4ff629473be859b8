"""``make demo``: a GPU fault travels from a simulated dcgm-exporter through a real Prometheus and
Alertmanager to issues on W&B runs, with root cause, impact, remediation and Grafana links.

Runs scenario 1 (XID 94 on one GPU of a 64-host x 8-GPU run, then the NCCL stall cascade: safe
to restart without draining), scenario 2 (thermal slowdown on one host) and scenario 5 (XID 95:
unsafe until the GPU is reset, then safe), prints each run's issues, and stops everything it
started unless ``--keep-running``. With ``WANDB_API_KEY`` set, the runs are created in and the
issues written to real W&B (``WANDB_BASE_URL`` for a self-managed server; ``WANDB_ENTITY`` picks
the entity); without it, runs are offline and the bridge shows the issues at its own pages.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

from demo import scenarios
from demo.stack import ROOT, Stack, StackConfig
from harness import sweep

# What --scenario accepts: the demo's three motivating scenarios (demo/scenarios.py numbers them).
SCENARIOS = ("1", "2", "5")
# Set to a new value by each demo run before it starts anything (see main).
DEMO_MARK = "WANDB_INFRA_DEMO_RUN"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options, each explained in --help."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=ROOT / ".state" / "demo",
                        help="where configs, logs, the bridge store, W&B offline runs and "
                             "scenario 1's run as printed (scenario1.view.txt) go (wiped at start; "
                             "default .state/demo)")
    parser.add_argument("--flavour", choices=("Hostname", "hostname", "4.9"), default="hostname",
                        help="dcgm-exporter flavour the simulator speaks (default hostname)")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave everything running after the scenarios until Ctrl-C")
    parser.add_argument("--grafana-url", default="http://localhost:3000",
                        help="Grafana base URL used in deep links (default http://localhost:3000)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="play only this scenario (repeat for several; default all: "
                             "1 XID 94 cascade, 2 thermal slowdown, 5 XID 95 GPU reset)")
    args = parser.parse_args(argv)
    args.scenario = args.scenario or list(SCENARIOS)
    return args


def play(stack: Stack, args: argparse.Namespace, api_key: str | None) -> None:
    """Start the stack and play the chosen scenarios, printing what a W&B user would read.
    Runs on a worker thread: the main thread only waits for it or for a signal."""
    began = time.monotonic()
    print(f"starting simulator (67 hosts x 8 GPUs), exporter, bridge, Alertmanager, Prometheus "
          f"in {args.workdir} ...", flush=True)
    stack.start()
    assert stack.bridge and stack.prometheus and stack.alertmanager
    hosts = list(stack.cluster.hosts)
    print(f"  Prometheus   {stack.prometheus.url}\n  Alertmanager {stack.alertmanager.url}\n"
          f"  bridge       {stack.bridge.url}/runs\n", flush=True)
    runs = []
    if "1" in args.scenario:
        print("scenario 1: XID 94 on gpu-node-017 GPU 3 of a 64-host run, then the NCCL stall "
              "cascade ...", flush=True)
        run1, view1 = scenarios.xid94_cascade(stack, hosts[:64])
        text = stack.bridge_text(run1.path)  # the bridge renders its typed view as text
        # kept as printed (tests/data/demo/ holds one, the README's sample)
        (args.workdir / "scenario1.view.txt").write_text(text + "\n")
        print(text + "\n", flush=True)
        rem = view1.get("remediation") or {}
        print(f"  restart without draining gpu-node-017: {rem.get('verdict')} "
              f"({rem.get('detail')})\n", flush=True)
        runs.append(run1)
    if "2" in args.scenario:
        print("scenario 2: thermal violation on one host of a 2-host run ...", flush=True)
        run2, _, job, neighbour = scenarios.thermal_slowdown(stack, hosts[64:66])
        print(stack.bridge_text(run2.path), flush=True)
        window = job.drop_window()
        if window:
            dropped = time.strftime("%H:%M:%S", time.gmtime(window[0]))
            print(f"    (the job's MFU dropped from {dropped} UTC; the neighbour run "
                  f"{neighbour.path} on the other GPUs has "
                  f"{len(scenarios.run_view(stack, neighbour).get('issues', []))} issue(s))\n")
        runs.append(run2)
    if "5" in args.scenario:
        print("scenario 5: XID 95 on gpu-node-067 GPU 5 needs a GPU reset ...", flush=True)
        run5, before, after = scenarios.gpu_reset(stack, hosts[66])
        print(f"    restart before the reset: {before['verdict']} ({before['detail']})\n"
              f"      {before['advice']}\n"
              f"    restart after the reset:  {after['verdict']} ({after['detail']})\n",
              flush=True)
        runs.append(run5)
    where = "in W&B and " if api_key else ""
    print(f"The issues are {where}at the bridge's run views:\n" + "\n".join(
        f"  {stack.bridge.url}/runs/{run.path}" for run in runs))
    print(f"demo finished in {time.monotonic() - began:.0f} s", flush=True)
    if args.keep_running:
        print("keeping everything running; Ctrl-C to stop", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Play the scenarios on a worker thread; stop everything on the first SIGINT or SIGTERM.

    The signal handlers only record the signal: raising from a handler (KeyboardInterrupt,
    SystemExit) lands wherever the main thread happens to be, and a library that catches
    broadly there (the wandb SDK's start-up, a cleanup callback) can swallow it, leaving the
    demo and its services running. Instead the main thread does nothing but wait, and on a
    signal becomes ``harness.sweep``, which ends the worker thread at once and stops every
    process the demo started (its own descendants, read from /proc, so the wandb SDK's service
    too), without running other threads' cleanup."""
    args = parse_args(argv)
    # inherited by every process the demo starts, however deep: found by it even once adopted
    mark = (DEMO_MARK, uuid.uuid4().hex)
    os.environ[mark[0]] = mark[1]
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        # SIGINT too, even when started from a shell that ignores it for background jobs (``&``,
        # nohup): Python would leave it ignored, and Ctrl-C or ``kill -INT`` would do nothing.
        signal.signal(signum, lambda signum, _frame: received.append(signum))
    shutil.rmtree(args.workdir, ignore_errors=True)
    api_key = os.environ.get("WANDB_API_KEY") or None
    config = StackConfig(
        workdir=args.workdir, hosts=67, flavour=args.flavour, grafana_url=args.grafana_url,
        wandb_api_key=api_key, wandb_base_url=os.environ.get("WANDB_BASE_URL") if api_key else None,
        markers=bool(api_key), jobs_online=bool(api_key))
    if api_key and os.environ.get("WANDB_ENTITY"):
        scenarios.ENTITY = os.environ["WANDB_ENTITY"]
    stack = Stack(config)
    failure: list[BaseException] = []

    def worker() -> None:
        try:
            play(stack, args, api_key)
        except BaseException as exc:  # reported by the main thread, which owns the exit
            failure.append(exc)

    thread = threading.Thread(target=worker, name="demo", daemon=True)
    thread.start()
    while not received and (thread.is_alive() or (args.keep_running and not failure)):
        time.sleep(0.1)
    if received:
        name = signal.Signals(received[0]).name
        print(f"{name}: stopping every service the demo started ...", file=sys.stderr, flush=True)
        # the demo becomes the sweep: its worker thread ends mid-call (no atexit or SDK teardown
        # holds the exit up, and nothing it was starting can start after the sweep)
        sweep.become(mark, 128 + received[0])
    stack.stop()
    if failure:
        traceback.print_exception(failure[0])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
