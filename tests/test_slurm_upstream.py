"""The Slurm source on ``squeue --json`` documents other projects captured from real clusters
(21.08, 23.11) and the 24.05 schema sample (tests/data/slurm, provenance in tests/data/README.md),
run through the source's real command path (``cat`` stands in for ``squeue``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.model import Gpu
from wandb_infra.exporter.sources.slurm import SlurmSource, parse_squeue_json

DATA = Path(__file__).parent / "data" / "slurm"
RUN = RunKey("acme", "llm", "r1")
# (file, running job id, its node, the job's name): read off the fixtures.
CAPTURED = [("squeue-21.08.json", "26515966", "cs75", "job_name"),
            ("squeue-23.11.json", "7745162", "n0180", "rands")]


def _source(path: Path, **cfg: object) -> SlurmSource:
    return SlurmSource({"command": ["cat", str(path)], **cfg})


@pytest.mark.parametrize(("name", "job_id", "node", "job_name"), CAPTURED)
def test_captured_output_parses_without_problems(name, job_id, node, job_name):
    jobs, problems = parse_squeue_json((DATA / name).read_text())
    assert problems == []
    running = [j for j in jobs if j.state == "RUNNING"]
    assert [(j.job_id, j.nodes, j.name) for j in running] == [(job_id, [node], job_name)]
    assert all(j.state == "PENDING" and j.nodes == [] for j in jobs if j not in running)


@pytest.mark.integration
@pytest.mark.parametrize(("name", "job_id", "node", "job_name"), CAPTURED)
def test_job_name_convention_on_captured_output(name, job_id, node, job_name):
    result = _source(DATA / name, job_name_regex=f"(?P<run_id>{job_name})",
                     default_entity="acme", default_project="llm").poll()
    assert result.problems == []
    [placement] = result.placements
    assert (placement.run, placement.host, placement.gpus) == (
        RunKey("acme", "llm", job_name), node, ())
    assert dict(placement.extra)["slurm_job_id"] == job_id


@pytest.mark.integration
@pytest.mark.parametrize(("name", "job_id", "node", "job_name"), CAPTURED)
def test_comment_and_gres_on_captured_schema(tmp_path, name, job_id, node, job_name):
    """The captured document with only the fields our convention uses filled in: the run in the
    comment and a GPU GRES detail, in whatever shape that version has."""
    data = json.loads((DATA / name).read_text())
    job = next(j for j in data["jobs"] if "RUNNING" in json.dumps(j["job_state"]))
    job["comment"] = "ckpt=s3://x wandb:acme/llm/r1"
    job["gres_detail"] = ["gpu:h100:4(IDX:0-1,4,6)"]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    [placement] = _source(path).poll().placements
    assert placement.run == RUN and placement.host == node
    assert placement.gpus == tuple(Gpu(index=i) for i in ("0", "1", "4", "6"))


def test_24_05_schema_sample_parses():
    """24.05 (data_parser v0.0.41): wrapped numbers, state lists, ``job_resources.nodes`` as an
    object with ``allocation``; the sample's values are placeholders, the shapes are real."""
    jobs, problems = parse_squeue_json((DATA / "squeue-24.05-schema.json").read_text())
    assert problems == []
    assert [(j.job_id, j.state) for j in jobs] == [("4", "PENDING"), ("4", "PENDING")]
    data = json.loads((DATA / "squeue-24.05-schema.json").read_text())
    del data["jobs"][0]["nodes"]  # the 24.05 hostlist is job_resources.nodes.list
    assert parse_squeue_json(json.dumps(data))[0][0].nodes == ["list"]
    del data["jobs"][0]["job_resources"]["nodes"]["list"]  # then the per-node allocation
    assert parse_squeue_json(json.dumps(data))[0][0].nodes == ["name", "name"]
