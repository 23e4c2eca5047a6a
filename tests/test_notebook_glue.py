"""What a notebook does before and around a run: the machine's preset for parameters left alone, where runs land,
the progress count of `kit run`, the report index's caption per figure."""

import json
import os
import time

import pytest

from conftest import ROOT
from kit import contract, notebook, progress, runner


def _defaults(name):
    import dataclasses

    return dataclasses.asdict(contract.get(name).Config())


@pytest.fixture
def no_kit_env(monkeypatch):
    for k in ("KIT_PARAMS", "KIT_PRESET", "KIT_FIGURES_DIR", "KIT_FIGURE_PREFIX"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(runner, "default_config", lambda: ROOT / "configs" / "cpu-smoke.yaml")
    import kit.launch

    monkeypatch.setattr(kit.launch, "cuda_device_count", lambda: 0)  # the same lines on a GPU node


def test_parameters_left_alone_take_the_preset_and_the_first_line_says_so(no_kit_env):
    inv = contract.get("collectives")
    ns = {**_defaults("collectives"), "iters": 7, "interactive": True, "analyse": "auto"}
    values, line = notebook.with_preset(inv, ns)
    # cpu-smoke.yaml: defaults world_size 2, backend gloo; collectives max_bytes 65536, repeats 5
    assert (values["world_size"], values["backend"], values["max_bytes"], values["repeats"]) == (2, "gloo", 65536, 5)
    assert values["iters"] == 7  # the user's own value stays
    assert values["min_bytes"] == 1024  # same in both: untouched
    assert line.startswith("parameters: configs/cpu-smoke.yaml preset") and "yours: iters" in line
    assert values["results_root"] == str(ROOT / "results")  # the repository's results/, wherever the kernel runs
    assert inv.config(values).max_bytes == 65536


def test_kit_run_and_kit_preset_none_keep_the_values_as_given(no_kit_env, monkeypatch):
    inv = contract.get("collectives")
    ns = _defaults("collectives")
    monkeypatch.setenv("KIT_PRESET", "none")
    values, line = notebook.with_preset(inv, ns)
    assert values["max_bytes"] == 2**30 and line.startswith("parameters: as set in the notebook (no preset)\n")
    monkeypatch.delenv("KIT_PRESET")
    monkeypatch.setenv("KIT_PARAMS", "configs/gpu.yaml -p iters=3")
    values, line = notebook.with_preset(inv, ns)
    assert values["max_bytes"] == 2**30 and line == "parameters: configs/gpu.yaml -p iters=3 (kit run)"


def test_progress_bar_counts_planned_points_of_the_runs_written_meanwhile(tmp_path):
    """kit.progress: rank 0's points land in progress.json (written whole); the bar sums the runs that appear while
    it watches against the plan, names the last point, and never shows more than planned."""
    old = tmp_path / "20200101-old"
    old.mkdir()
    progress.PointsFile(old).step("from before")  # a run that was there before the watch began
    with progress.watch(tmp_path, "t", 5, every_s=0.05) as bar:
        a, b = tmp_path / "20260101-a", tmp_path / "20260101-b"
        a.mkdir(), b.mkdir()
        pa, pb = progress.PointsFile(a, every_s=0), progress.PointsFile(b, every_s=0)
        for i in range(3):
            pa.step(f"all_reduce {i}")
        pa.step("a finer step", point=False)
        pb.step("all_gather 1 KiB")
        pa.close(), pb.close()
    assert progress.read_points(a) == (3, "all_reduce 2") and progress.read_points(b) == (1, "all_gather 1 KiB")
    assert (bar.done, bar.total, bar.last) == (4, 5, "all_gather 1 KiB")
    assert not list(a.glob(".progress.json.*"))  # the temporary file was renamed, not left behind
    with progress.watch(tmp_path, "t", 2, every_s=0.05) as bar:  # a plan that undercounts: the total follows
        c = tmp_path / "20260101-c"
        c.mkdir()
        pc = progress.PointsFile(c, every_s=0)
        for i in range(3):
            pc.step(str(i))
        pc.close()
    assert (bar.done, bar.total) == (3, 3)


def test_index_caption_names_the_runs_each_figure_shows(tmp_path):
    figs = tmp_path / "figures"
    figs.mkdir()
    notes = [{"t": 100.0, "source": "this run", "hardware": "CPU only (2 cores)", "dates": ["2026-11-25"]},
             {"t": 200.0, "source": "recorded: 2x NVIDIA H200 ...", "hardware": "2x NVIDIA H200 (NV18)",
              "dates": ["2026-11-23"]}]
    (figs / "x.provenance.jsonl").write_text("".join(json.dumps(n) + "\n" for n in notes))
    a, b, c = figs / "x-a.png", figs / "x-b.png", figs / "x-c.png"
    for f, t in ((a, 150), (b, 250), (c, 50)):
        f.write_bytes(b"png")
        os.utime(f, (t, t))
    shows = runner.figure_sources(figs, "x", [a, b, c])
    assert shows == {"figures/x-a.png": "this machine, CPU only (2 cores), 2026-11-25",
                     "figures/x-b.png": "recorded, 2x NVIDIA H200 (NV18), 2026-11-23"}


def test_a_figure_drawn_from_committed_data_says_so_whatever_the_runs(tmp_path, monkeypatch):
    """graph_gaps' probe matrix figure draws the committed matrix, not the runs chosen: its caption names the
    matrix and its GPU (kit.plot.save's ``source``), and the figures after it are the runs' again."""
    import matplotlib.pyplot as plt

    from kit import contract, plot

    monkeypatch.setenv("KIT_FIGURES_DIR", str(tmp_path))
    monkeypatch.setenv("KIT_FIGURE_PREFIX", "graph_gaps")
    plot.note_source("this run", "CPU only (2 cores)", ["2026-11-25"])
    inv = contract.get("graph_gaps")
    name = next(n for n in inv.figures if n.startswith("probe-matrix-"))
    inv.figure(name, None)
    fig, _ = plt.subplots()
    plot.save(fig, "after")
    files = sorted(tmp_path.glob("graph_gaps-*.png"))
    shows = runner.figure_sources(tmp_path, "graph_gaps", files)
    hw = name[len("probe-matrix-"):]
    assert shows[f"figures/graph_gaps-{name}.png"].startswith(
        f"recorded probe matrix recorded/probes/graph_gaps-matrix/{hw}, NVIDIA ")
    assert shows["figures/graph_gaps-after.png"] == "this machine, CPU only (2 cores), 2026-11-25"


def test_doctor_figures_are_captioned_with_the_traces_hardware_and_date(tmp_path, monkeypatch):
    """The doctor page reads traces, not runs: its figures' captions name the traces' folder, the GPU their headers
    give and the day they were captured (the recorded 2xH200 late-rank job's last step)."""
    from kit.doctor import notebook as dn

    monkeypatch.setenv("KIT_FIGURES_DIR", str(tmp_path))
    monkeypatch.setenv("KIT_FIGURE_PREFIX", "doctor")
    d = dn.doctor(["tests/data/doctor/late-rank/trace_rank*.json.gz"])
    assert d.devices == ["NVIDIA H200"] and d.dates == ["2026-11-23"]
    f = tmp_path / "doctor-accounting.png"
    f.write_bytes(b"png")
    shows = runner.figure_sources(tmp_path, "doctor", [f])
    assert shows == {"figures/doctor-accounting.png":
                     "traces tests/data/doctor/late-rank, 2 ranks on NVIDIA H200, 2026-11-23"}


def test_an_interrupted_run_is_one_line_in_jupyter():
    e = notebook.Interrupted("collectives: interrupted; the ranks are stopped")
    assert isinstance(e, KeyboardInterrupt)
    assert e._render_traceback_() == ["KeyboardInterrupt: collectives: interrupted; the ranks are stopped"]


def test_gpu_sizes_without_a_gpu_say_a_long_run_is_ahead(no_kit_env, monkeypatch):
    monkeypatch.setenv("KIT_PRESET", "none")
    _, line = notebook.with_preset(contract.get("collectives"), _defaults("collectives"))
    assert "no CUDA GPU: max_bytes=1073741824 (CPU preset 65536)" in line and "a long run on CPU" in line


def test_index_thumbnails_are_readable_and_the_time_does_not_wrap(tmp_path, monkeypatch):
    """The index shows each figure 380 px wide under its title as HTML text (kept in the PNG by kit.plot.save,
    without the lines naming the runs' hardware and date, which the caption says), and its time column does not
    break '29.6 s' over two lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kit import plot

    (tmp_path / "figures").mkdir()
    monkeypatch.setenv("KIT_FIGURES_DIR", str(tmp_path / "figures"))
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    fig.suptitle("all_reduce busbw by message size\n2x NVIDIA H200 (NV18) | driver 580.159.04 | torch 2.11.0+cu130\n"
                 "collectives run 2026-11-23")  # the runs' lines: the caption names them
    plot.save(fig, "x-busbw")
    plt.close(fig)
    entry = {"name": "x", "html": "x.html", "status": "ok", "seconds": 29.6, "figures": ["figures/x-busbw.png"],
             "error": None, "question": "q", "shows": {"figures/x-busbw.png": "this machine, CPU only, 2026-11-27"}}
    page = runner.write_index(tmp_path, [entry], None).read_text()
    fig, ax = plt.subplots()
    ax.set_title("gap vs layers\n2x NVIDIA H200 (NV18) | driver 580.159.04 | torch 2.11.0+cu130")
    assert plot.title_of(fig) == "gap vs layers"  # an axes title without its runs' line too
    plt.close(fig)
    assert '<td style="white-space:nowrap">29.6 s</td>' in page
    assert 'font-weight:bold;max-width:380px">all_reduce busbw by message size</div>' in page
    assert 'style="width:380px;height:auto"' in page and 'height="120"' not in page


def test_a_page_names_its_runs_and_machine_without_absolute_paths():
    """What a collectives page prints about the runs it analyses: a sentence with repository-relative directories
    (not ``RunSet(...)``), and the recorded machine's sysinfo without its own paths (env values, nccl-tests
    binaries)."""
    import contextlib
    import io

    from kit import results

    runs = results.choose("collectives", [], "recorded")
    line = notebook.analysing(runs)
    assert line.startswith("analysing 1 run(s) (ok) from recorded: 2x NVIDIA H200") and "RunSet" not in line
    assert line.endswith("-- recorded/h200x2/collectives/20261123-022931-vm-d798f8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        notebook.hardware(runs)
    text = out.getvalue()
    assert "NCCL_TESTS_DIR=.../build" in text and "nccl-tests: all_gather_perf, all_reduce_perf" in text
    assert "/work/" not in text and "/usr/" not in text and str(ROOT) not in line
