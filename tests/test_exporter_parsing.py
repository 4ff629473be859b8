"""Parsing: Slurm host lists, GRES indices, squeue/scontrol output, W&B configs, host names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.model import Gpu
from wandb_infra.exporter.nodelist import NodeListError, expand_hostlist, gres_gpu_indices
from wandb_infra.exporter.sources.slurm import (
    DEFAULT_COMMENT_REGEX,
    RunNaming,
    SlurmJob,
    SlurmSource,
    parse_scontrol,
    parse_squeue_json,
    placements_from_jobs,
)
from wandb_infra.exporter.sources.wandb_runs import run_placements, writer_environments, writer_gpus

DATA = Path(__file__).parent / "data" / "exporter"
NAMING = RunNaming(re.compile(DEFAULT_COMMENT_REGEX), None)


@pytest.mark.parametrize(("text", "hosts"), [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("r[1-2]n[08-10]", ["r1n08", "r1n09", "r1n10", "r2n08", "r2n09", "r2n10"]),
    ("a[1-2],b3,c[5]", ["a1", "a2", "b3", "c5"]),
    ("node[8-10]", ["node8", "node9", "node10"]),
    ("node[008-010]-ib", ["node008-ib", "node009-ib", "node010-ib"]),
    ("x[1,1,2]", ["x1", "x2"]),
    ("", []),
    ("(null)", []),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["gpu[01-03", "gpu]1[", "gpu[a-b]", "gpu[3-1]", "g[[1]]",
                                 "n[0-999999999]"])
def test_expand_hostlist_rejects(bad):
    with pytest.raises(NodeListError):
        expand_hostlist(bad)


@given(st.text(max_size=40))
def test_expand_hostlist_never_crashes_otherwise(text):
    try:
        hosts = expand_hostlist(text)
    except NodeListError:
        return
    assert all(isinstance(h, str) and h for h in hosts)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=20, unique=True))
def test_expand_hostlist_roundtrip(numbers):
    body = ",".join(f"{n:03d}" for n in numbers)
    assert expand_hostlist(f"gpu[{body}]") == [f"gpu{n:03d}" for n in numbers]


@pytest.mark.parametrize(("gres", "indices"), [
    ("gpu:4(IDX:0-3)", ["0", "1", "2", "3"]),
    ("gpu:h100:8(IDX:0-7)", [str(i) for i in range(8)]),
    ("gpu:2(IDX:0,2)", ["0", "2"]),
    ("gpu:a100:3(IDX:0-1,5)", ["0", "1", "5"]),
    ("gpu:1(IDX:N/A)", []),
    ("", []),
    ("mps:100,gpu:2(IDX:1,3)", ["1", "3"]),
    ("gpu:h100:2(IDX:6-7),gpu:a100:1(IDX:0)", ["6", "7", "0"]),
])
def test_gres_indices(gres, indices):
    assert gres_gpu_indices(gres) == indices


def test_squeue_json_2205_real_capture():
    jobs, problems = parse_squeue_json((DATA / "squeue-22.05.json").read_text())
    assert problems == []
    placements, _ = placements_from_jobs(jobs, NAMING)
    got = {(p.run.path(), p.host, p.gpus, dict(p.extra)["slurm_job_id"]) for p in placements}
    assert got == {("e/p/r", "vm", (Gpu("0"),), "1"), ("e/p/r2", "vm", (Gpu("1"),), "2")}


def test_scontrol_2205_real_capture_matches_squeue():
    a, _ = parse_squeue_json((DATA / "squeue-22.05.json").read_text())
    b, problems = parse_scontrol((DATA / "scontrol-22.05.txt").read_text())
    assert problems == []
    assert placements_from_jobs(a, NAMING) == placements_from_jobs(b, NAMING)


def test_squeue_json_newer_schema():
    doc = {"jobs": [
        {"job_id": {"set": True, "infinite": False, "number": 77}, "name": "train",
         "job_state": ["RUNNING"], "comment": "wandb:team/llm/run77",
         "nodes": "gpu[01-02]", "gres_detail": ["gpu:h100:8(IDX:0-7)", "gpu:h100:4(IDX:4-7)"]},
        {"job_id": 78, "job_state": ["PENDING"], "comment": "wandb:team/llm/run78", "nodes": ""},
        {"job_id": 79, "job_state": ["RUNNING"], "comment": "no run here", "nodes": "gpu03"},
        {"job_id": 80, "job_state": ["RUNNING", "CONFIGURING"], "comment": "wandb:team/llm/r80",
         "job_resources": {"nodes": {"list": "gpu04", "allocation": [{"name": "gpu04"}]}}},
        "garbage",
    ], "meta": {}}
    jobs, problems = parse_squeue_json(json.dumps(doc))
    assert len(problems) == 1
    placements, _ = placements_from_jobs(jobs, NAMING)
    got = {(p.run.path(), p.host, len(p.gpus)) for p in placements}
    assert got == {("team/llm/run77", "gpu01", 8), ("team/llm/run77", "gpu02", 4),
                   ("team/llm/r80", "gpu04", 0)}
    assert [g.index for g in placements[1].gpus] == ["4", "5", "6", "7"]


def test_job_name_convention_with_defaults():
    naming = RunNaming(None, re.compile(r"^wb-(?P<run_id>[a-z0-9]+)$"), "ent", "proj")
    job = SlurmJob("5", "wb-abc123", "RUNNING", "", ["n1"], [""])
    placements, _ = placements_from_jobs([job], naming)
    assert placements[0].run == RunKey("ent", "proj", "abc123")
    bad = SlurmJob("6", "wb-abc123", "RUNNING", "", ["n1"], [""])
    assert placements_from_jobs([bad], RunNaming(None, naming.name_regex))[0] == []


@pytest.mark.parametrize("text", ["not json", "[]", '{"jobs": 3}'])
def test_squeue_garbage_is_a_source_error(text):
    with pytest.raises(SourceError):
        parse_squeue_json(text)


def test_slurm_source_config_errors():
    with pytest.raises(ConfigError):
        SlurmSource({"mode": "sacct"})
    with pytest.raises(ConfigError):
        SlurmSource({"job_name_regex": "(no-run-id-group)"})
    with pytest.raises(ConfigError):
        SlurmSource({"comment_regex": "(unclosed"})


def _wandb_env(host, uuids, slurm=None):
    env = {"host": host, "gpu_nvidia": [{"name": "H100", "uuid": u} for u in uuids]}
    if slurm is not None:
        env["slurm"] = slurm
    return env


def test_wandb_config_shapes():
    env = _wandb_env("gpu01", ["GPU-a", "GPU-b"])
    wire = json.dumps({"lr": {"value": 1}, "_wandb": {"value": {"e": {"w1": env}}}})
    assert writer_environments(wire) == [env]
    assert writer_environments({"_wandb": {"e": {"w1": env}}}) == [env]
    assert writer_environments("{broken") == []
    assert writer_environments({"_wandb": {"value": {"e": "nope"}}}) == []
    camel = {"host": "h", "gpuNvidia": [{"uuid": "GPU-z"}]}
    assert writer_gpus(camel) == (Gpu("0", "GPU-z"),)


def test_wandb_gpus_from_slurm_indices():
    env = _wandb_env("gpu01", ["GPU-0", "GPU-1", "GPU-2", "GPU-3"], {"job_gpus": "1,3"})
    assert writer_gpus(env) == (Gpu("1", "GPU-1"), Gpu("3", "GPU-3"))


def test_wandb_rank0_only_multinode_expands_nodelist():
    env = _wandb_env("gpu01.cluster.local", ["GPU-0"],
                     {"job_id": "42", "job_nodelist": "gpu[01-03]", "job_gpus": "0"})
    node = {"name": "r1", "displayName": "big-run", "group": "g",
            "config": json.dumps({"_wandb": {"value": {"e": {"w": env}}}})}
    placements = run_placements(RunKey("e", "p", "r1"), node, "wandb")
    hosts = [(p.host, p.gpus) for p in placements]
    assert hosts == [("gpu01.cluster.local", (Gpu("0", "GPU-0"),)), ("gpu02", ()), ("gpu03", ())]
    assert all(dict(p.extra) == {"wandb_run_group": "g", "slurm_job_id": "42"}
               for p in placements)
    assert all(p.run_name == "big-run" for p in placements)


def test_hostname_mapper():
    mapper = HostnameMapper.from_config({
        "rewrites": [{"match": r"slurmd-(\w+)-\d+", "replace": r"k8s-\1"}]})
    assert mapper("GPU01.Cluster.Local") == "gpu01"
    assert mapper("slurmd-pool-3") == "k8s-pool"
    assert mapper("10.0.0.5") == "10.0.0.5"
    keep = HostnameMapper.from_config({"strip_domain": False, "lowercase": False})
    assert keep("Gpu01.x") == "Gpu01.x"
    with pytest.raises(ConfigError):
        HostnameMapper.from_config({"rewrites": [{"match": "("}]})
    with pytest.raises(ConfigError):
        HostnameMapper.from_config({"rewrites": "x"})
