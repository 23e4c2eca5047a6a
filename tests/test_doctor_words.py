"""kit doctor's words follow what ran: on a CPU-only job it speaks of the host's main thread, not a GPU; its text
report reads as sentences (relative times, measured delays, no JSON blobs, no empty fields); its page names the
hardware, runs nothing and cuts no sentence; ``--help`` lists the rule ids. CPU only, on committed traces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kit import traces
from conftest import diagnosed
from kit.doctor import diagnose
from kit.doctor.report import format_text


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("KIT_DOCTOR_STRICT", "1")


DOC = Path(__file__).resolve().parent / "data" / "doctor"
CORPUS = DOC / "corpus"


@pytest.fixture(scope="module")
def cpu_job():
    """gloo3-cnn-late_rank: three gloo ranks on CPU, rank 1 sleeping before its backward."""
    return diagnose([CORPUS / "gloo3-cnn-late_rank"], workers=1)


@pytest.fixture(scope="module")
def gpu_late():
    """examples/train_ddp.py's late-rank case on 2xH200 (kit.capture): rank 1 sleeps 200 ms per step."""
    return diagnose([DOC / "late-rank"], workers=1)


# ------------------------------------------------------------------------------------------- a CPU-only job
def _cpu_trace(header: dict):
    ev = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 5000, "pid": 1, "tid": 1},
          {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10, "dur": 3000, "pid": 1, "tid": 1}]
    return traces.from_dict({"schemaVersion": 1, **header, "traceEvents": ev})


def test_capture_note_without_gpu_activity_follows_the_machine():
    """No GPU activity: the note says so and that GPU rules cannot run; it advises ProfilerActivity.CUDA only
    where the header shows a CUDA device."""
    from kit.doctor.notes import capture_notes
    from kit.doctor.steps import steps_frame

    bare = _cpu_trace({})
    (note,) = [n for n in capture_notes(bare, steps_frame(bare.cpu)) if n.startswith("no GPU activity")]
    assert "GPU work cannot run" in note and "ProfilerActivity.CUDA" not in note and "CPU-only job" in note
    gpu_box = _cpu_trace({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]})
    (note,) = [n for n in capture_notes(gpu_box, steps_frame(gpu_box.cpu)) if n.startswith("no GPU activity")]
    assert "has a CUDA device" in note and "ProfilerActivity.CUDA" in note


def test_cpu_only_job_speaks_of_the_main_thread(cpu_job):
    text = format_text(cpu_job)
    header = next(line for line in text.splitlines() if line.startswith("step accounting"))
    assert "main thread" in header and "GPU busy" not in header and "GPU idle" not in header
    assert "rank 1: waiting" in text
    for f in cpu_job.findings:
        assert "GPU sat idle" not in f.summary and "GPU idled" not in f.summary, f.summary
    (late,) = [f for f in cpu_job.findings if f.rule == "late_rank"]
    assert "stalled on the host" in late.summary and "main thread" in late.summary
    assert "GPU" not in late.summary
    assert not any("ProfilerActivity" in s.why for s in cpu_job.skipped)  # advice is the capture note's alone


def test_cpu_only_page_figure_title_names_no_gpu(cpu_job):
    import matplotlib

    matplotlib.use("Agg")
    from kit.doctor import notebook as dn

    title = dn.accounting_figure(cpu_job).axes[0].get_title()
    assert "main thread" in title and "GPU busy" not in title and "on CPU" in title


# ------------------------------------------------------------------------------------------- the text report
def test_late_rank_states_the_measured_delay_not_the_threshold(gpu_late):
    (f,) = [f for f in gpu_late.findings if f.rule == "late_rank"]
    assert "by more than" not in f.summary
    lead = f.evidence["after_next_latest_us_median"] / 1e3
    assert f"a median {lead:.2f} ms after the next-latest rank" in f.summary
    assert f"up to {f.evidence['late_by_us_max'] / 1e3:.1f} ms after the first" in f.summary


def test_text_report_has_no_json_blob_nor_absolute_time(gpu_late, cpu_job):
    for d in (gpu_late, cpu_job):
        text = format_text(d)
        assert "{" not in text and '"' not in text and "start_us" not in text
        assert not re.search(r"\d{10,}", text), re.search(r".{40}\d{10,}.{10}", text)
    stalls = next(f for f in cpu_job.findings if f.rule == "late_rank").evidence["own_idle"]["host_stall"]
    s = stalls["longest_stalls"][0]
    assert s["step"] >= 0 and 0 <= s["into_step_us"] < 1e6  # relative: a step and how far into it


@pytest.fixture(scope="module")
def stall():
    """cpu-gpt-host_stall: one CPU rank whose step sleeps (a host stall); host_stall names no notebook."""
    return diagnose([CORPUS / "cpu-gpt-host_stall"], workers=1)


def test_stall_sentence_says_where_in_the_step(stall):
    (f,) = [f for f in stall.findings if f.rule == "host_stall"]
    assert re.search(r"in step \d+, \d+\.\d ms into it", f.summary), f.summary


def test_no_empty_notebook_field(stall):
    from kit.doctor import notebook as dn

    (f,) = [f for f in stall.findings if f.rule == "host_stall"]
    assert f.notebook is None  # the rule names none: the line is left out, not said empty
    text = format_text(stall)
    assert "(none)" not in text and "notebook  none" not in text
    assert "Reproduced in" not in dn.finding_text(f)


def test_unexplained_idle_on_kit_capture_traces_does_not_advise_the_capture_they_had():
    """examples/train_ddp.py's clean case on 2xH200 (kit.capture): the step's edges idle the GPU ~0.6 ms."""
    (f,) = [f for f in diagnose([DOC / "clean"], workers=1).findings if f.rule == "unexplained_idle"]
    assert "Profile with ProfilerActivity.CPU and CUDA" not in f.fix and "kit.capture" in f.fix


# ------------------------------------------------------------------------------------------- the page
def test_doctor_page_names_no_config_it_does_not_run(monkeypatch):
    from kit import contract, notebook

    monkeypatch.setenv("KIT_PARAMS", "configs/cpu-smoke.yaml")
    _, line = notebook.with_preset(contract.get("doctor"), {"traces": ["x.json"]})
    assert line == ""


def test_doctor_figures_name_the_hardware_and_cut_no_sentence(gpu_late):
    import pandas as pd

    from kit.doctor import notebook as dn

    (f,) = [f for f in gpu_late.findings if f.rule == "late_rank"]
    title = dn.excerpt_title(gpu_late, f)
    assert "NVIDIA" in title and "…" not in title and f.summary not in title
    assert "NVIDIA" in dn.accounting_title(gpu_late)
    dn.start({"traces": [str(DOC / "late-rank")]})
    assert pd.get_option("display.max_colwidth") is None  # summaries and skip reasons shown whole
    for g in gpu_late.findings:
        assert "…" not in g.summary and "..." not in g.summary


# ------------------------------------------------------------------------------------------- --rules
def test_help_lists_every_rule_id(capsys):
    from kit import cli
    from kit.doctor import RULES

    with pytest.raises(SystemExit):
        cli.main(["doctor", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for rid in RULES:
        assert rid in out


def test_one_rules_parser_for_cli_page_and_notebook():
    from kit.doctor.page import DoctorConfig
    from kit.doctor.rules import RuleIdError, parse_ids

    assert parse_ids(" late_rank , host_sync") == ["late_rank", "host_sync"] and parse_ids("") is None
    with pytest.raises(RuleIdError, match="no_such"):
        parse_ids("late_rank,no_such")
    assert any("no_such" in b for b in DoctorConfig(traces=["x"], rules="no_such").check())


# ------------------------------------------------------------------------------------------- one sentence, one cost
COST_SAID = re.compile(r"(\d+(?:\.(\d+))?) (ms|us) per step")
"""a cost per step as the sentences say it: '4.19 ms per step', '2032 us per step'"""
RECORDED = Path(__file__).resolve().parents[1] / "recorded"
CORPUS_CASES = sorted(f"{p.parent.parent.name}/{p.parent.name}" for c in DOC.glob("corpus*") if c.is_dir()
                      for p in c.glob("*/truth.json")) + [
    "p2p-disabled",  # low_busbw, the exposed communication folded in at the smaller cost
    "cuda-graph-per-param",  # graph_mixing_gap
]


def first_cost_said(summary: str) -> tuple[float, float] | None:
    """The first cost per step a sentence says, in us, and half the unit of its last digit (what its rounding may
    hide), or None when it says none."""
    m = COST_SAID.search(summary)
    if m is None:
        return None
    scale = 1e3 if m.group(3) == "ms" else 1.0
    return float(m.group(1)) * scale, 0.5 * 10.0 ** -len(m.group(2) or "") * scale


def _corpus_case(case: str):
    """A corpus case through the doctor as tests/test_doctor_corpus.py runs it (with its machine's collectives sweep
    where one is recorded); another folder of tests/data/doctor as it is."""
    corpus = case.split("/")[0]
    runs = sorted((RECORDED / corpus.removeprefix("corpus-") / "collectives").glob("*/rows.csv.gz")) \
        if corpus.startswith("corpus-") else []
    files = sorted(p for p in (DOC / case).iterdir() if p.name.endswith((".json.gz", ".json"))
                   and p.name != "truth.json" and not p.name.startswith("capture_"))
    return diagnosed(files, sweep=runs[-1].parent if runs else None)


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_each_sentence_says_its_finding_cost_first(case):
    """Every corpus case, and the rules the corpus does not reach. One sentence, one cost: the first cost per step a finding's sentence says is the finding's cost, as the
    sentence rounds it (the cost itself is kept to 0.1 us) -- net of the profiler where the cost is, the traced
    number after it, labelled; a rule's own estimate, where the step accounting sets the cost, only in the
    evidence."""
    for f in _corpus_case(case).findings:
        said = first_cost_said(f.summary)
        assert said is not None, f"{f.rule}: says no cost per step: {f.summary}"
        assert abs(said[0] - f.cost_us_per_step) <= said[1] + 0.05, \
            f"{f.rule}: cost {f.cost_us_per_step:.1f} us, the sentence says {said[0]:.1f} first: {f.summary}"
        assert "the rule's estimate" not in f.summary
