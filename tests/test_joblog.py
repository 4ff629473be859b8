"""The job-log reading on real console lines and excerpts from public issue threads
(``tests/data/joblog/``, each line beside its source), its robustness on hostile input, and the
join with the infrastructure diagnosis."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.budget import examples
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Diagnosis, Issue
from wandb_infra.bridge.joblog import text as T
from wandb_infra.bridge.joblog.join import join
from wandb_infra.bridge.joblog.reading import (
    PREFILTER,
    Budget,
    Reading,
    Scanner,
    Verdict,
    classify,
    stream,
    tail,
)
from wandb_infra.bridge.joblog.sources import FileSource, SlurmFiles, expand, read
from wandb_infra.bridge.projection.notes import render_section
from wandb_infra.bridge.runs.view import RunView
from wandb_infra.bridge.web.pages import job_log_html
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.logsignatures import BY_ID, SIGNATURES, LogClass
from wandb_infra.common.runkey import RunKey

DATA = Path(__file__).resolve().parent / "data" / "joblog"
EXAMPLES = json.loads((DATA / "signatures.json").read_text())
EXCERPTS = json.loads((DATA / "excerpts.json").read_text())
SOURCE = re.compile(r"^https://(github\.com/[\w.-]+/[\w.-]+/(issues|pull)/[0-9]+|[\w.-]+/\S+)$")


def reading_of(text: str | bytes):
    data = text.encode() if isinstance(text, str) else text
    scanner = Scanner()
    scanner.feed(data, "log", 0)
    return scanner.reading()


# --- the catalog -------------------------------------------------------------------------


def test_every_signature_has_a_real_example_line_with_its_public_source():
    assert len(SIGNATURES) >= 25
    assert {s.id for s in SIGNATURES} == {e["signature"] for e in EXAMPLES}
    assert all(SOURCE.match(e["source"]) for e in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e["signature"])
def test_each_example_line_is_its_signature_and_passes_the_prefilter(example):
    sig = classify(example["line"])
    assert sig is not None and sig.id == example["signature"]
    assert PREFILTER.search(example["line"].encode())


@pytest.mark.integration
def test_every_pattern_means_the_same_to_grep_as_to_python():
    """The benchmark times ``grep -E`` on the same patterns: both engines must match each
    example line with its own signature's pattern."""
    for example in EXAMPLES:
        pattern = BY_ID[example["signature"]].pattern
        out = subprocess.run(["grep", "-E", "-c", "-e", pattern], input=example["line"] + "\n",
                             capture_output=True, text=True, check=False, timeout=10)
        assert out.stdout.strip() == "1", (example["signature"], out.stderr)


def test_corroborating_alerts_exist_and_infrastructure_signatures_say_what_telemetry_needs():
    for sig in SIGNATURES:
        assert set(sig.alerts) <= set(ALERTS), sig.id
        if sig.cls is LogClass.INFRASTRUCTURE:
            assert sig.gap and sig.alerts, sig.id


# --- the real excerpts -------------------------------------------------------------------


def test_the_excerpts_are_real_multi_line_logs_with_an_established_cause():
    caused = [e for e in EXCERPTS if e["lines"] > 1 and e["truth"] != "unknown"]
    assert len(caused) >= 20
    assert all(SOURCE.match(e["source"]) and e["cause"] for e in EXCERPTS)
    for e in EXCERPTS:  # never a wrong verdict; ambiguous lines may say unknown
        assert e["expect"]["verdict"] in (e["truth"], "unknown"), e["file"]


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=lambda e: e["file"])
def test_each_excerpt_gives_its_verdict_first_error_and_place(excerpt):
    reading = read([FileSource(str(DATA / "excerpts" / excerpt["file"]))])
    expect = excerpt["expect"]
    assert str(reading.verdict) == expect["verdict"]
    first = reading.first_error
    if expect["line"] is None:
        assert first is None
        return
    assert first is not None
    assert (first.line, first.signature) == (expect["line"], expect["signature"])
    for key in ("rank", "host", "gpu", "task"):
        if key in expect:
            assert getattr(first, key) == expect[key], key
    lines = (DATA / "excerpts" / excerpt["file"]).read_text().splitlines()
    assert T.quote(lines[first.line - 1].strip()) == first.text


def test_a_silent_hang_is_unknown_and_no_cause_is_invented():
    reading = read([FileSource(str(DATA / "excerpts" / "marian-251-silent-hang.log"))])
    joined = join(reading, None)
    assert reading.first_error is None and reading.quotes == ()
    assert joined.verdict is Verdict.UNKNOWN and "no fatal line" in joined.statement


def test_only_consequences_say_the_failing_rank_is_not_in_the_log():
    reading = read([FileSource(str(DATA / "excerpts" / "ace-348-timeouts-only.log"))])
    assert reading.first_error is None and reading.cascade_ranks == 3
    assert "only consequences" in join(reading, None).statement


# --- what the lines name -----------------------------------------------------------------

FANOUT = ("[2026-04-29T23:36:37.809] error: *** STEP 52222788.0 ON nid002888 CANCELLED AT "
          "2026-04-29T23:36:37 DUE TO TASK FAILURE ***\n"
          "srun: error: nid002888: tasks 0-57,59-63: Terminated\n")  # desihub/desispec#2744


def test_the_task_missing_from_the_terminated_fan_out_is_the_origin():
    reading = reading_of(FANOUT)
    assert reading.origin_tasks == (58,) and reading.first_error is None
    assert "task(s) 58" in join(reading, None).statement


def test_nccl_communicator_lines_give_the_failing_rank_gpu_and_pci_bus():
    # the init line is sgl-project/sglang#4289's; the warning is placed on the same process
    log = ("node17-2:36754:36754 [6] NCCL INFO ncclCommInitRank comm 0xa624cf0 rank 6 nranks 8 "
           "cudaDev 6 nvmlDev 6 busId 90000 commId 0x551d06754c6bacf2 - Init START\n"
           "node17-2:36754:36790 [6] transport/nvls.cc:244 NCCL WARN Cuda failure 1 "
           "'invalid argument'\n")
    first = reading_of(log).first_error
    assert first is not None
    assert (first.rank, first.host, first.gpu, first.pci_bus) == (6, "node17-2", 6, "90000")


def test_torchruns_root_cause_block_is_read():
    block = ("Root Cause (first observed failure):\n[0]:\n  time      : 2024-09-11_09:17:37\n"
             "  host      : 9018.idas\n  rank      : 1 (local_rank: 1)\n"
             "  exitcode  : -6 (pid: 886322)\n  error_file: <N/A>\n"
             "  traceback : Signal 6 (SIGABRT) received by PID 886322\n")  # NVIDIA/nccl#1439
    launcher = reading_of(block).launcher
    assert launcher is not None
    assert (launcher.host, launcher.rank, launcher.exitcode) == ("9018.idas", 1, -6)


@pytest.mark.parametrize(("line", "rank", "gpu", "host"), [
    (EXAMPLES[[e["source"] for e in EXAMPLES].index(
        "https://github.com/alibaba/Pai-Megatron-Patch/issues/366")]["line"], 11, 3, None),
    (EXAMPLES[[e["source"] for e in EXAMPLES].index(
        "https://github.com/NVIDIA-NeMo/Speech/issues/14348")]["line"], 2, 2, "dcfai-xe9680-01"),
])
def test_megatrons_nan_assertion_names_rank_gpu_and_node(line, rank, gpu, host):
    first = reading_of(line + "\n").first_error
    assert first is not None and (first.rank, first.gpu, first.host) == (rank, gpu, host)


def test_exit_codes_reclass_the_launchers_exit_line():
    assert reading_of("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7)"
                      " local_rank: 0 (pid: 5275) of binary: /usr/bin/python\n").verdict \
        is Verdict.APPLICATION
    six = reading_of("E0816 01:45:43.466000 1 api.py:833] failed (exitcode: -6) local_rank: 7 "
                     "(pid: 340264) of binary: python\n")
    assert six.first_error is None and six.cascade_lines == 1


def test_a_concrete_error_beats_an_earlier_generic_wrapper():
    log = ("terminate called after throwing an instance of 'std::runtime_error'\n"
           "NameError: name 'trainer' is not defined\n"
           "RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    first = reading_of(log).first_error
    assert first is not None and (first.line, first.signature) == (3, "cuda_ecc_uncorrectable")


# --- robustness ----------------------------------------------------------------------------

ECC = b"RuntimeError: CUDA error: uncorrectable ECC error encountered"


@settings(max_examples=examples(150), deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_crash_and_quotes_stay_small(junk):
    reading = reading_of(junk)
    assert len(reading.quotes) <= T.QUOTE_LINES
    assert all(len(q) <= T.QUOTE_CHARS for q in reading.quotes)
    json.dumps(reading.as_dict())


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.binary(max_size=200).filter(lambda b: b"\n" not in b and b"\r" not in b),
                max_size=30), st.sampled_from([b"\n", b"\r\n"]))
def test_the_error_is_found_on_its_line_among_junk_lines(junk, newline):
    noise = [j for j in junk if not PREFILTER.search(j)]
    data = newline.join([*noise, b"\x1b[31m" + ECC + b"\x1b[0m", b"\xff\xfe junk"]) + newline
    first = reading_of(data).first_error
    assert first is not None and first.signature == "cuda_ecc_uncorrectable"
    assert first.line == len(noise) + 1 and "\x1b" not in first.text


def test_a_progress_bar_does_not_hide_the_error_on_its_line():
    line = b"  4%|\xe2\x96\x8d   | 1/23 [00:07<02:39,  7.23s/it]\r" + ECC + b"\n"
    first = reading_of(line).first_error
    assert first is not None and first.text.startswith("RuntimeError")


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(["WANDB_API_KEY=", "Authorization: Bearer ", "token=", "api_key: "]),
       st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=12, max_size=40))
def test_secret_looking_lines_never_leave_the_reader(marker, secret):
    secret = f"S3CRET{secret}"
    log = f"{marker}{secret} RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    out = json.dumps(reading_of(log).as_dict())
    assert secret not in out and T.REDACTED in out


def test_a_long_line_is_quoted_at_most_300_characters():
    first = reading_of(ECC.decode() + " " + "x" * 5000 + "\n").first_error
    assert first is not None and len(first.text) == T.QUOTE_CHARS


def test_the_budget_reads_the_tail_and_says_it_cut(tmp_path):
    path = tmp_path / "big.log"
    path.write_bytes(b"noise line\n" * 20_000 + ECC + b"\n" + b"after\n" * 10)
    data, cut = tail(str(path), Budget(max_bytes=4096, max_lines=None))
    assert cut and len(data) <= 4096 and data.startswith(b"noise line\n")
    data, cut = tail(str(path), Budget(max_bytes=None, max_lines=11))
    assert cut and data.startswith(ECC)
    reading = read([FileSource(str(path))], Budget(max_bytes=4096, max_lines=None))
    assert reading.cut and reading.first_error is not None
    assert not read([FileSource(str(path))]).cut


def test_streaming_reads_the_whole_file_in_chunks_with_the_right_line(tmp_path):
    path = tmp_path / "big.log"
    path.write_bytes(b"noise line\n" * 50_000 + ECC + b"\n")
    scanner = Scanner()
    for block, first in stream(str(path), chunk=4096):
        scanner.feed(block, str(path), 0, first)
    first_error = scanner.reading().first_error
    assert first_error is not None and first_error.line == 50_001


def test_a_missing_file_is_named_and_the_other_logs_stand(tmp_path):
    good = tmp_path / "good.log"
    good.write_bytes(ECC + b"\n")
    reading = read([FileSource(str(tmp_path / "nope.log")), FileSource(str(good))])
    assert reading.verdict is Verdict.INFRASTRUCTURE
    assert reading.sources[0].error.startswith("no console log: cannot read")


# --- Slurm files ---------------------------------------------------------------------------


def test_sruns_filename_pattern_is_expanded():
    assert expand("/l/%x-%j-%N.%4t.out%%", "123", "node7", 5) == "/l/%x-123-node7.0005.out%"


def test_slurm_files_per_node_name_their_node(tmp_path):
    (tmp_path / "77-gpu-node-017.out").write_bytes(ECC + b"\n")
    (tmp_path / "77-gpu-node-018.out").write_bytes(b"step 1\n")
    source = SlurmFiles((str(tmp_path / "%j-%N.out"),), "77", ("gpu-node-017", "gpu-node-018",
                                                                 "gpu-node-019"))
    first = read([source]).first_error
    assert first is not None and first.host == "gpu-node-017"
    missing = read([SlurmFiles((str(tmp_path / "%j.err"),), "78")])
    assert missing.sources[0].error.startswith("no console log: no Slurm output file")


# --- joined with the diagnosis -----------------------------------------------------------

AT = datetime(2026, 3, 1, 21, 44, 22, tzinfo=UTC)


def issue(alertname: str, host: str, gpu: str = "", xid: str = "") -> Issue:
    fact = AlertFact(fingerprint="f", alertname=alertname, starts_at=AT, hostname=host, gpu=gpu,
                     labels={"xid": xid} if xid else {})
    return Issue(root=fact, consequences=(), started_at=AT, ended_at=None, reasoning="")


CASCADE = ("gpu-node-017:4242:4300 [3] NCCL INFO comm 0x1 rank 137 nranks 512 cudaDev 3 busId "
           "9b000 - Init COMPLETE\n"
           "gpu-node-017:4242:4301 [3] NCCL WARN Cuda failure 'uncorrectable ECC error "
           "encountered'\n"
           + "".join(f"[E ProcessGroupNCCL.cpp:457] [Rank {r}] Watchdog caught collective "
                     "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600097 "
                     "milliseconds before timing out.\n" for r in range(511) if r != 137))


def test_the_log_names_the_first_rank_of_the_alerts_gpu_and_calls_the_rest_consequences():
    joined = join(reading_of(CASCADE), issue("GpuContainedEccError", "gpu-node-017", "3", "94"))
    assert joined.verdict is Verdict.INFRASTRUCTURE
    assert "on 510 rank(s)" in joined.statement and "consequences of XID 94 on gpu-node-017 " \
        "GPU 3 at 21:44:22" in joined.statement
    assert "rank 137 (gpu-node-017 GPU 3) on that GPU failed first" in joined.statement


def test_an_application_error_with_no_alert_is_the_applications():
    log = ("node-003:77:78 [4] NCCL INFO comm 0x2 rank 12 nranks 64 cudaDev 4 busId 1b000 - "
           "Init COMPLETE\n[rank12]: torch.OutOfMemoryError: CUDA out of memory. Tried to "
           "allocate 2.00 GiB.\n")
    joined = join(reading_of(log), None)
    assert joined.verdict is Verdict.APPLICATION
    assert joined.app_error == "torch.OutOfMemoryError on rank 12 (node-003 GPU 4)"


def test_an_infrastructure_line_with_no_alert_names_the_telemetry_gap():
    joined = join(reading_of(ECC + b"\n"), None, coverage="gpu-node-017 unseen from 21:40")
    assert joined.verdict is Verdict.INFRASTRUCTURE
    assert "seen in the job's log" in joined.statement
    assert "telemetry did not see it: gpu-node-017 unseen from 21:40" in joined.statement
    assert "GpuContainedEccError" in join(reading_of(ECC + b"\n"), None).statement


def test_a_coincident_alert_is_not_called_the_cause_of_an_application_error():
    log = b"[rank12]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    joined = join(reading_of(log), issue("GpuThermalViolation", "node-009", "1"))
    assert joined.verdict is Verdict.APPLICATION
    assert "does not explain this error" in joined.statement
    assert "GpuThermalViolation on node-009 GPU 1" in joined.statement


@pytest.mark.parametrize("excerpt", EXCERPTS[:8], ids=lambda e: e["file"])
def test_a_stored_reading_reads_back_the_same(excerpt):
    reading = read([FileSource(str(DATA / "excerpts" / excerpt["file"]))])
    back = Reading.from_dict(json.loads(json.dumps(reading.as_dict())))
    assert back.as_dict() == reading.as_dict()
    assert join(back, None) == join(reading, None)


def test_the_summary_keys_name_the_verdict_and_the_applications_error():
    log = b"[rank12]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    assert join(reading_of(log), None).summary() == {
        "infra/verdict": "application", "infra/app_error": "torch.OutOfMemoryError on rank 12"}
    assert join(reading_of(b"step 1\n"), None).summary() == {"infra/verdict": "unknown"}


def test_a_huge_line_is_read_up_to_its_first_64_kib():
    first = reading_of(ECC + b" " + b"\x00junk" * 2_000_000 + b"\n").first_error
    assert first is not None and len(first.text) <= T.QUOTE_CHARS
    assert reading_of(b"x" * (T.LINE_BYTES + 10) + ECC + b"\n").first_error is None


def test_the_notes_and_page_quote_the_log_escaped_and_the_summary_keys_follow():
    log = (b"[rank3]: RuntimeError: CUDA error: uncorrectable ECC error encountered "
           b"[see](https://evil.example) <script>x</script>\n")
    view = RunView(RunKey("e", "p", "r"), (), Diagnosis(()), (), job_log=reading_of(log))
    notes = render_section(view, lambda *_: "")
    assert "**Job log: infrastructure**" in notes and "rank 3" in notes
    assert "\\[see\\]" in notes and "<script>" not in notes and "https://" not in notes
    assert view.job_log is not None and view.job_log_joined is not None
    page = job_log_html(view.job_log, view.job_log_joined)
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert view.job_log_joined.summary() == {"infra/verdict": "infrastructure"}
