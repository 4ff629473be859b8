"""Merging, grace periods, stable labels, the exposition and registration validation."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.clock import ManualClock
from harness.processes import wait_for
from wandb_infra.common import labels
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.collector import Exposition, render
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.model import Gpu, RunPlacement, SourceResult
from wandb_infra.exporter.placements import PlacementMerger, merge_gpus
from wandb_infra.exporter.pushed import (
    RegistrationError,
    RegistrationStore,
    parse_registration,
)
from wandb_infra.exporter.server import poll_forever
from wandb_infra.exporter.sources.slurm import SlurmSource

RUN = RunKey("ent", "proj", "run1")


def place(host, source="slurm", gpus=(), *, run=RUN, name="", extra=()):
    return RunPlacement(run, host, source, tuple(gpus), name, tuple(extra))


def series(registry):
    families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
    out = {}
    for name in (labels.NODE_INFO, labels.GPU_INFO):
        fam = families.get(name)
        out[name] = sorted(tuple(sorted(s.labels.items())) for s in fam.samples) if fam else []
    return out, families


def test_merge_dedupes_sources_and_keeps_first_labels():
    clock = ManualClock(1000.0)
    reg = PlacementMerger(HostnameMapper(), clock=clock)
    reg.record_success("slurm", SourceResult([place("gpu01.x", gpus=[Gpu("0")],
                                                    extra=[("slurm_job_id", "7")])]), 0.1)
    reg.record_success("wandb", SourceResult([place("GPU01", "wandb", [Gpu("0", "GPU-a")],
                                                    name="nice")]), 0.1)
    got, _ = series(reg)
    assert len(got[labels.NODE_INFO]) == 1
    node = dict(got[labels.NODE_INFO][0])
    assert node == {"wandb_entity": "ent", "wandb_project": "proj", "wandb_run_id": "run1",
                    "hostname": "gpu01", "source": "slurm", "slurm_job_id": "7",
                    "wandb_run_name": "nice"}
    gpus = [dict(s) for s in got[labels.GPU_INFO]]
    assert gpus == [{"wandb_entity": "ent", "wandb_project": "proj", "wandb_run_id": "run1",
                     "hostname": "gpu01", "gpu": "0", "gpu_uuid": "GPU-a", "source": "slurm"}]


def test_labels_stay_constant_while_run_lives():
    reg = PlacementMerger(clock=ManualClock(1000.0))
    reg.record_success("wandb", SourceResult([place("h1", "wandb", name="first")]), 0)
    before, _ = series(reg)
    reg.record_success("slurm", SourceResult([place("h1", extra=[("slurm_job_id", "9")])]), 0)
    reg.record_success("wandb", SourceResult([place("h1", "wandb", name="renamed")]), 0)
    after, _ = series(reg)
    assert before[labels.NODE_INFO] == after[labels.NODE_INFO]
    reg.record_success("wandb", SourceResult([]), 0)
    reg.record_success("slurm", SourceResult([]), 0)
    assert series(reg)[0][labels.NODE_INFO] == []
    reg.record_success("wandb", SourceResult([place("h1", "wandb", name="renamed")]), 0)
    assert dict(series(reg)[0][labels.NODE_INFO][0])["wandb_run_name"] == "renamed"


def test_gpu_labels_stay_constant_when_another_source_adds_uuid():
    reg = PlacementMerger(clock=ManualClock(1000.0))
    reg.record_success("slurm", SourceResult([place("h1", gpus=[Gpu("0"), Gpu("1")])]), 0)
    before = series(reg)[0][labels.GPU_INFO]
    reg.record_success("wandb", SourceResult([place("h1", "wandb", [Gpu("0", "GPU-a"),
                                                                    Gpu("1", "GPU-b"),
                                                                    Gpu("2", "GPU-c")])]), 0)
    after = [dict(s) for s in series(reg)[0][labels.GPU_INFO]]
    assert [tuple(sorted(d.items())) for d in after[:2]] == before
    assert [(d["gpu"], d.get("gpu_uuid")) for d in after] == [("0", None), ("1", None),
                                                              ("2", "GPU-c")]
    reg.record_success("slurm", SourceResult([]), 0)
    reg.record_success("wandb", SourceResult([]), 0)
    assert series(reg)[0][labels.GPU_INFO] == []
    reg.record_success("wandb", SourceResult([place("h1", "wandb", [Gpu("0", "GPU-a")])]), 0)
    assert dict(series(reg)[0][labels.GPU_INFO][0])["gpu_uuid"] == "GPU-a"


def test_failed_source_keeps_mapping_for_grace_then_drops():
    clock = ManualClock(1000.0)
    reg = PlacementMerger(grace_seconds=60, clock=clock)
    reg.add_source("slurm")
    _, fams = series(reg)
    up = {s.labels["source"]: s.value for s in fams["wandb_infra_exporter_source_up"].samples}
    assert up == {"slurm": 0.0}
    reg.record_success("slurm", SourceResult([place("h1"), place("h2")]), 0.5)
    clock.now += 30
    reg.record_failure("slurm", "squeue timed out", 10.0)
    got, fams = series(reg)
    assert len(got[labels.NODE_INFO]) == 2
    samples = {s.name: s.value for f in fams.values() for s in f.samples
               if s.labels.get("source") == "slurm"}
    assert samples["wandb_infra_exporter_source_up"] == 0
    assert samples["wandb_infra_exporter_source_errors_total"] == 1
    assert samples["wandb_infra_exporter_source_last_success_timestamp_seconds"] == 1000.0
    assert samples["wandb_infra_exporter_source_duration_seconds"] == 10.0
    assert samples["wandb_infra_exporter_source_hosts"] == 2
    clock.now += 31
    assert series(reg)[0][labels.NODE_INFO] == []
    reg.record_success("slurm", SourceResult([place("h3")], ["bad job skipped"]), 0.1)
    got, fams = series(reg)
    assert [dict(s)["hostname"] for s in got[labels.NODE_INFO]] == ["h3"]
    errors = fams["wandb_infra_exporter_source_errors"].samples[0].value
    assert errors == 2


def test_two_runs_share_a_host_and_gpus_stay_apart():
    other = RunKey("ent", "proj", "run2")
    reg = PlacementMerger(clock=ManualClock(1000.0))
    reg.record_success("slurm", SourceResult([place("h", gpus=[Gpu("0"), Gpu("1")]),
                                              place("h", gpus=[Gpu("2")], run=other)]), 0)
    got, fams = series(reg)
    assert len(got[labels.NODE_INFO]) == 2
    by_run = {}
    for s in got[labels.GPU_INFO]:
        d = dict(s)
        by_run.setdefault(d["wandb_run_id"], []).append(d["gpu"])
    assert by_run == {"run1": ["0", "1"], "run2": ["2"]}
    assert fams["wandb_infra_exporter_runs"].samples[0].value == 2
    assert fams["wandb_infra_exporter_hosts"].samples[0].value == 1


def test_merge_gpus():
    assert merge_gpus([Gpu("0"), Gpu("0", "GPU-a"), Gpu(uuid="GPU-a"), Gpu(uuid="GPU-b"),
                       Gpu("10"), Gpu("2")]) == (Gpu("0", "GPU-a"), Gpu("2"), Gpu("10"),
                                                 Gpu(uuid="GPU-b"))


def test_exposition_escapes_and_never_emits_job_or_instance():
    reg = PlacementMerger(clock=ManualClock(1000.0))
    reg.record_success("wandb", SourceResult([place("h", "wandb", name='a "quoted"\\ name\n')]),
                       0)
    text = render(reg).decode()
    assert "job=" not in text.replace("slurm_job_id=", "") and "instance=" not in text
    _, fams = series(reg)
    assert fams[labels.NODE_INFO].samples[0].labels["wandb_run_name"] == 'a "quoted"\\ name\n'


def test_registration_store_ttl_and_delete():
    clock = ManualClock(1000.0)
    store = RegistrationStore(max_entries=2, clock=clock)
    p1, _ = parse_registration({"entity": "e", "project": "p", "run_id": "r",
                                "hostname": "h1"}, "registrations", 60, 600)
    p2 = RunPlacement(p1.run, "h2", "registrations")
    assert store.put(p1, 60) is True
    assert store.put(p1, 60) is False
    store.put(p2, 10)
    with pytest.raises(OverflowError):
        store.put(RunPlacement(RunKey("e", "p", "x"), "h", "registrations"), 5)
    v = store.version()
    clock.now += 11
    assert store.active() == [p1]
    assert store.version() != v
    assert store.delete(p1.run, "nope") == 0
    assert store.delete(p1.run) == 1
    assert store.active() == []


def test_registration_parsing():
    placement, ttl = parse_registration(
        {"entity": "e", "project": "p", "run_id": "r-1", "hostname": "gpu01",
         "gpus": [0, "1", {"index": 2, "uuid": "GPU-x"}, "GPU-y", {"uuid": "MIG-1/2"}],
         "slurm_job_id": 12, "pod": "p-0", "ttl_seconds": 30, "run_name": "n"},
        "registrations", 600, 3600)
    assert ttl == 30
    assert placement.gpus == (Gpu("0"), Gpu("1"), Gpu("2", "GPU-x"), Gpu(uuid="GPU-y"),
                              Gpu(uuid="MIG-1/2"))
    assert dict(placement.extra) == {"slurm_job_id": "12", "pod": "p-0"}


@pytest.mark.parametrize(("payload", "reason"), [
    ([], "JSON object"),
    ({"entity": "e", "project": "p", "run_id": "r"}, "'hostname' is required"),
    ({"entity": "e", "project": "p", "run_id": "r", "hostname": "h", "colour": 1},
     "unknown fields: colour"),
    ({"entity": "e/x", "project": "p", "run_id": "r", "hostname": "h"}, "'entity'"),
    ({"entity": "e", "project": "p", "run_id": "r r", "hostname": "h"}, "'run_id'"),
    ({"entity": "e", "project": "p", "run_id": "r", "hostname": "h", "gpus": "0"}, "'gpus'"),
    ({"entity": "e", "project": "p", "run_id": "r", "hostname": "h", "gpus": [True]}, "boolean"),
    ({"entity": "e", "project": "p", "run_id": "r", "hostname": "h", "gpus": [-1]}, "0..1023"),
    ({"entity": "e", "project": "p", "run_id": "r", "hostname": "h", "ttl_seconds": 0},
     "ttl_seconds"),
    ({"entity": "e", "project": "p", "run_id": "r", "hostname": "h", "ttl_seconds": 1e9},
     "ttl_seconds"),
    ({"entity": 5, "project": "p", "run_id": "r", "hostname": "h"}, "must be a string"),
])
def test_registration_rejections(payload, reason):
    with pytest.raises(RegistrationError, match=reason):
        parse_registration(payload, "registrations", 600, 3600)


def test_poller_survives_crashing_and_garbage_sources():
    class Flaky:
        name, interval = "flaky", 0.01

        def __init__(self):
            self.calls = 0

        def poll(self):
            self.calls += 1
            if self.calls == 1:
                raise ZeroDivisionError("bug")
            return SourceResult([place("h9", "flaky")])

    class Garbage:
        returncode, stdout, stderr = 0, "\x00\xff{not json", ""

    garbage = SlurmSource({"interval_seconds": 0.01}, runner=lambda *a, **k: Garbage())
    reg = PlacementMerger(clock=ManualClock(1000.0))
    flaky = Flaky()

    def polled() -> bool:
        status = {s.name: s for s in reg.snapshot().sources}
        return (status.get("flaky") is not None and status["flaky"].up
                and status.get("slurm") is not None and status["slurm"].errors_total >= 2)

    async def main():
        tasks = [asyncio.create_task(poll_forever(s, reg)) for s in (flaky, garbage)]
        # the pollers run on this loop, so the wait runs beside it, in a thread
        await asyncio.to_thread(wait_for, polled, 10, "flaky up again and slurm failed twice",
                                0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    status = {s.name: s for s in reg.snapshot().sources}
    assert status["flaky"].up and status["flaky"].errors_total == 1
    assert not status["slurm"].up and status["slurm"].errors_total >= 2
    assert [dict(s)["hostname"] for s in series(reg)[0][labels.NODE_INFO]] == ["h9"]


# Read from the OS and the garbage collector at each render: two renders a moment apart differ
# whenever a CPU tick, a page of resident memory or a collection falls between them.
LIVE_FAMILIES = ("process_", "python_gc_")


def _without_live_families(body: bytes) -> list[str]:
    """The body's lines but the process and GC self-metrics, which two renders need not
    share."""
    out = []
    for line in body.decode().splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") else line
        if not name.startswith(LIVE_FAMILIES):
            out.append(line)
    return out


def test_memoised_exposition_equals_fresh_rendering():
    reg = PlacementMerger(clock=ManualClock(1000.0))
    exposition = Exposition()
    steps = [
        [place("h1", gpus=[Gpu("0"), Gpu("1")]), place("h2", name='q"uote')],
        [place("h1", gpus=[Gpu("0")]), place("h3", gpus=[Gpu("5", "GPU-z")])],
        [],
        [place("h1", gpus=[Gpu("0"), Gpu("1")])],
    ]
    for placements in steps:
        reg.record_success("slurm", SourceResult(placements), 0)
        memoised, fresh = exposition.render(reg), render(reg)
        assert LIVE_FAMILIES[0].encode() in memoised, "the process self-metrics are served"
        assert _without_live_families(memoised) == _without_live_families(fresh)
