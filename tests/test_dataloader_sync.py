"""dataloader_sync: dataset and DataLoader, the model, sync modes agree numerically across 2 gloo ranks, the
typed config, a run on 2 gloo ranks and on one rank, every analysis on empty / one-rank / CPU / old recorded
rows (never raising), the findings on the recorded 2xH200 run, and the notebook through `kit run`."""

import gzip
import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml

import exps
from conftest import ROOT, assert_plan_kept
from kit import contract, results
from kit import traces as T
from kit.config import ConfigError
from kit.investigations import dataloader_sync as D
from kit.launch import launch

RECORDED = ROOT / "recorded" / "h200x2" / "dataloader_sync" / "20261122-134536-vm-8b8065"
INV = contract.get("dataloader_sync")
SMALL = {"backend": "gloo", "samples": 32, "image_size": 32, "width": 8, "batch": 4, "num_workers": 1, "steps": 2,
         "warmup": 1, "profile_steps": 1, "bucket_caps_mb": [1.0]}


def _nums(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


def _every_analysis(runs):
    """Every table, figure and the findings of ``runs``: none may raise; returns them."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    tables = {n: INV.table(n, runs) for n in INV.tables}
    for n, t in tables.items():
        assert isinstance(t, pd.DataFrame), n
    for n in INV.figures:
        fig = INV.figures[n](runs)
        assert isinstance(fig, Figure), n
        plt.close(fig)
        INV.figure(n, runs, save=False)
        plt.close("all")
    fs = INV.findings(runs)
    assert all(isinstance(f, contract.Observation) and f.text for f in fs)
    return tables, {f.key: f for f in fs}


# ------------------------------------------------------------------------------------------------ pieces
def test_dataset_generation_and_loader(tmp_path):
    d = D.make_dataset(tmp_path, samples=20, image_size=32, classes=4)
    assert D.make_dataset(tmp_path, samples=20, image_size=32, classes=4) == d  # cached, not rewritten
    ds = D.RawImageFolder(d)
    assert len(ds) == 20 and sorted(set(ds.labels)) == [0, 1, 2, 3]
    x, y = ds[5]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == 5 % 4
    assert (d / f"class_{y}" / "000005.bin").stat().st_size == 3 * 32 * 32 * 4
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=1, drop_last=True)
    batches = list(loader)
    assert len(batches) == 2 and batches[0][0].shape == (8, 3, 32, 32)


def test_loader_forks_its_workers_in_a_spawned_rank(tmp_path):
    """A rank kit.launch spawned inherits spawn as its start method; the loader still forks its workers, as in a
    script torchrun starts (a spawned worker imports torch again, in every configuration)."""
    cfg = INV.config({**SMALL, "world_size": 1, "results_root": str(tmp_path)})
    run = launch(exps.dataloader_sync_worker_kind, cfg, "dataloader_sync_worker_kind")
    assert [r["process"] for r in run.rows] == ["ForkProcess"]


def test_vgg11_shape_and_size():
    m = D.vgg11(width=64, classes=1000)
    convs = [l for l in m if isinstance(l, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128, 256, 256, 512, 512, 512, 512]
    n = sum(p.numel() for p in m.parameters())
    assert n == 132_863_336  # VGG11 (configuration A)
    fc = [l for l in m if isinstance(l, torch.nn.Linear)]
    # the report's "471 MB of classifier gradients" (fp32): the three Linear layers
    assert sum(p.numel() for l in fc for p in l.parameters()) * 4 == pytest.approx(495e6, rel=0.01)
    small = D.vgg11(width=8, classes=10)
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_every_sync_mode_averages_gradients_the_same(tmp_path):
    cfg = contract.make_config("dataloader_sync", {"world_size": 2, "backend": "gloo", "width": 8,
                                                   "results_root": str(tmp_path)})
    run = launch(exps.sync_equivalence, cfg, "sync_eq")
    assert {r["mode"] for r in run.rows} == set(D.SYNC_MODES)
    for r in run.rows:
        assert r["max_abs_err"] < 1e-5 * max(r["norm"], 1), r


def test_config_is_typed():
    with pytest.raises(ConfigError, match="'pagable' is not one of 'pageable', 'pinned'"):
        INV.config({"h2d_modes": ["pagable"]})
    with pytest.raises(ConfigError, match="'dpp' is not one of 'per_param'"):
        INV.config({"sync_modes": ["dpp"]})
    with pytest.raises(ConfigError, match="keep_traces\\[0\\]: 'pageable_per_param' is not one of"):
        INV.config({"keep_traces": ["pageable_per_param"]})
    with pytest.raises(ConfigError, match="image_size must be >= 32"):
        INV.config({"image_size": 16})
    assert INV.config({"keep_traces": ["prefetch+ddp_one_bucket"]}).keep_traces == ["prefetch+ddp_one_bucket"]
    cfg = INV.config({"world_size": 2, "backend": "gloo", "samples": 16, "batch": 32})
    with pytest.raises(contract.Skipped, match="batch 32 is larger than the dataset's share per rank"):
        contract.execute("dataloader_sync", cfg)  # depends on the world size, i.e. on the machine: a reason
    assert INV.needs(cfg, contract.Machine(gpus=0, world_size=1)) == []  # one rank is enough


# ------------------------------------------------------------------------------------------------ runs on gloo
SMOKE = pytest.mark.background("run", "dataloader_sync", "--config", "configs/cpu-smoke.yaml", "--results-root", "{root}")
"""one `kit run dataloader_sync` on configs/cpu-smoke.yaml (2 gloo ranks), in the background (conftest.py): the report
and the run it made, shared by the run's and the notebook's tests (fixture smoke)"""


@pytest.fixture
def smoke(background):
    return background


@pytest.mark.slow
@SMOKE
def test_run_two_gloo_ranks(smoke):
    p, root = smoke
    assert p.returncode == 0, p.stdout + p.stderr
    (run_dir,) = (root / "dataloader_sync").iterdir()
    smoke_cfg = yaml.safe_load((ROOT / "configs" / "cpu-smoke.yaml").read_text())["dataloader_sync"]
    runs = results.RunSet([run_dir], "this run")
    steps = D.rows(runs, "step")
    # pageable only on CPU: 4 sync modes + 1 extra DDP bucket (25 MB beside 1 MB), 2 ranks, 3 steps
    assert smoke_cfg["bucket_caps_mb"] == [1.0, 25.0] and smoke_cfg["steps"] == 3
    assert len(steps) == (4 + 1) * 2 * 3 and set(steps["sample"]) == {0, 1, 2}
    for col in D.PARTS + ["step_us", "step_host_us", "h2d_host_us", "forward_host_us", "loss", "wall_per_step_us"]:
        assert steps[col].notna().all() and (steps[col] >= 0).all(), col
    kept = T.find_traces(run_dir, h2d="pageable", sync="per_param")
    assert [f.rank for f in kept] == [0, 1] and kept[0].path.name == "trace_h2d=pageable_sync=per_param_rank0.json.gz"
    assert not list(run_dir.glob(".trace_tmp*"))
    tables, fs = _every_analysis(runs)
    assert set(tables["breakdown"]["sync"]) == set(D.SYNC_MODES) and (tables["breakdown"]["step_ms"] > 0).all()
    assert set(tables["skipped"]["h2d"]) == {"pinned", "side_stream", "prefetch"}
    assert tables["skipped"]["reason"].str.contains("needs CUDA").all()
    assert list(tables["buckets"]["bucket_cap_mb"]) == [1.0, 25.0, D.ONE_BUCKET_MB]
    assert tables["event_vs_kernel"].empty and tables["overlap"].empty  # CUDA only
    assert len(tables["grad_sync"]) == 1 and not tables["grad_sync"]["h2d"].str.startswith("sweep").any()
    assert fs["pageable_h2d_host_ms"].value is None and "Without CUDA" in fs["pageable_h2d_host_ms"].text
    assert "ran on CPU" in fs["ddp_overlap_share"].text and "ran on CPU" in fs["event_vs_kernel"].text


def test_run_one_rank(tmp_path):
    """world_size 1 runs: the H2D half is meaningful there; the all-reduce half says it needs 2+."""
    cfg = INV.config({**SMALL, "world_size": 1, "sync_modes": ["per_param", "flat", "ddp"], "results_root": str(tmp_path)})
    run = contract.execute("dataloader_sync", cfg)
    assert run.meta["status"] == "ok"
    assert_plan_kept("dataloader_sync", cfg, run)
    runs = results.RunSet([run.dir])
    tables, fs = _every_analysis(runs)
    assert set(tables["breakdown"]["sync"]) == {"per_param", "flat", "ddp"}
    assert tables["grad_sync"].empty
    assert "needs 2+ ranks" in fs["grad_sync_busbw"].text and fs["grad_sync_busbw"].value is None
    assert "needs 2+ ranks" in fs["ddp_overlap_share"].text


# ------------------------------------------------------------------------------------------------ analyses
def test_analyses_on_empty_input():
    for runs in (results.RunSet([]), pd.DataFrame(), pd.DataFrame({"x": [1]}),
                 pd.DataFrame({"kind": ["other"], "h2d": ["pageable"]})):
        tables, fs = _every_analysis(runs)
        assert all(t.empty for t in tables.values()) and fs == {}
    assert D.breakdown(pd.DataFrame()).empty


def _one_gpu_run(tmp_path):
    """The recorded run as one GPU would have recorded it: rank 0's rows, no NCCL kernel (overlap rows with no
    communication), the kept traces gone, world_size 1 in meta."""
    d = tmp_path / "dataloader_sync" / "one-gpu"
    d.mkdir(parents=True)
    df = pd.read_csv(RECORDED / "rows.csv.gz")
    df = df[df["rank"] == 0].copy()
    ov = df["kind"] == "overlap"
    df.loc[ov, ["comm_us", "overlapped_us", "exposed_us"]] = 0.0
    df.loc[ov, "overlap_share"] = float("nan")
    df.to_csv(d / "rows.csv", index=False)
    meta = json.loads((RECORDED / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "world_size": 1}))
    return results.RunSet([d])


def test_analyses_on_one_gpu_rows(tmp_path):
    runs = _one_gpu_run(tmp_path)
    tables, fs = _every_analysis(runs)
    assert len(tables["breakdown"]) == 16 and tables["overlap"].empty and tables["grad_sync"].empty
    evk = tables["event_vs_kernel"]
    assert len(evk) == 22 and evk["kernel_us"].isna().all() and evk["event_us"].notna().all()
    # the H2D half holds on one GPU ...
    assert fs["pageable_h2d_host_ms"].value > 10 and fs["async_h2d_host_ms"].value < 1
    # ... the all-reduce half says what it cannot show
    for key in ("ddp_overlap_share", "grad_sync_busbw"):
        assert fs[key].value is None and "needs 2+ ranks" in fs[key].text, fs[key]
    assert "no NCCL kernel to compare it with (with one rank NCCL launches no kernel" in fs["event_vs_kernel"].text


def test_event_vs_kernel_without_kernels_in_the_traces(tmp_path):
    """Kept traces without any NCCL kernel (as one rank writes them): kernel_us empty, no KeyError."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(RECORDED / "rows.csv.gz", d / "rows.csv.gz")
    shutil.copy(RECORDED / "meta.json", d / "meta.json")
    with gzip.open(d / "trace_pageable_per_param_rank0.json.gz", "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.5, "dur": 10.5, "pid": 0,
                                    "tid": 7, "args": {"device": 0, "stream": 7}}],  # one compute kernel, no NCCL
                   "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"}}, f)
    evk = INV.table("event_vs_kernel", results.RunSet([d]))
    assert len(evk) == 22 and evk["kernel_us"].isna().all()


# ------------------------------------------------------------------------------------------------ recorded run
def test_findings_on_the_recorded_run():
    """FINDINGS.md's numbers ("Why the gradient all-reduce looks slow in training"), from the committed 2xH200
    run's rows (which call the step index `step`) and its kept traces (old names)."""
    runs = results.RunSet([RECORDED])
    fs = {f.key: f for f in INV.findings(runs)}
    lo, hi = _nums(fs["pageable_h2d_host_ms"].text)[:2]  # blocks the host 14-16 ms per step
    assert 13.5 < lo < 14.8 and 15.5 < hi < 16.5
    lo, hi = _nums(fs["async_h2d_host_ms"].text)[:2]  # pinned / side-stream / prefetch: 0.1-0.3 ms
    assert 0.05 < lo < 0.15 and 0.2 < hi < 0.35
    text = fs["host_step_ms"].text  # 24-25.6 ms -> 15.5-18.2 ms (pinned)
    pg = _nums(text.split("pageable")[1])[:2]
    pinned = _nums(text.split("pinned")[1])[:2]
    assert pg == pytest.approx([24.1, 25.6], abs=0.3) and pinned == pytest.approx([15.5, 18.2], abs=0.3)
    assert _nums(fs["ddp_overlap_share"].text)[1:3] == pytest.approx([51, 80], abs=2)  # DDP hides 51-80%
    assert _nums(fs["ddp_backward_sync_ms"].text)[:3] == pytest.approx([10.8, 9.5, 2.4], abs=0.15)
    b = _nums(fs["bucket_step_ms"].text)  # buckets 1-100 MB: 16.65-16.79 ms
    assert b[:4] == pytest.approx([1, 100, 16.65, 16.79], abs=0.02)
    e = _nums(fs["event_vs_kernel"].text)  # 411 MB: event 1.346 vs kernel 1.343 ms
    assert e[0] == 411 and e[1:3] == pytest.approx([1.346, 1.343], abs=0.003)
    assert "the event timing is the all-reduce" in fs["event_vs_kernel"].text
    g = _nums(fs["grad_sync_busbw"].text)
    assert g[1:3] == pytest.approx([128, 206], abs=3)


def test_recorded_tables():
    runs = results.RunSet([RECORDED])
    b = INV.table("breakdown", runs).set_index(["h2d", "sync"])
    for sync in ("ddp", "per_param", "flat"):
        assert b.loc[("pageable", sync), "h2d_host_ms"] > 20 * b.loc[("prefetch", sync), "h2d_host_ms"]
        assert b.loc[("pageable", sync), "step_host_ms"] > b.loc[("prefetch", sync), "step_host_ms"]
    buckets = INV.table("buckets", runs)
    assert list(buckets["bucket_cap_mb"]) == [1.0, 5.0, 25.0, 100.0, D.ONE_BUCKET_MB]
    gs = INV.table("grad_sync", runs)
    assert len(gs) == 7 and gs["busbw_gbps"].between(100, 400).all()
    ov = INV.table("overlap", runs)
    assert ov[ov["sync"] == "ddp"]["overlap_share"].median() > 0.3


# ------------------------------------------------------------------------------------------------ notebook
@pytest.mark.slow
@SMOKE
def test_kit_run_dataloader_sync_cpu_smoke(smoke):
    p, tmp_path = smoke
    assert p.returncode == 0, p.stdout + p.stderr
    report = next((tmp_path / "reports").iterdir())
    html = (report / "dataloader_sync.html").read_text()
    assert "needs CUDA" in html and "Traceback" not in html
    assert re.search(r"blocks the host 1\d\.\d–1\d\.\d ms per step", html)  # the recorded GPU run's findings
    assert {p.name for p in (report / "figures").iterdir()} >= {
        f"dataloader_sync-{n}.png" for n in ("step-breakdown", "event-vs-kernel", "bucket-curve")}


@pytest.mark.gpu
def test_timed_steps_never_wait_for_the_gpu(tmp_path):
    """The investigation's point: nothing inside the timed steps waits for the device (timers read after)."""
    cfg = INV.config({**SMALL, "backend": "nccl", "world_size": 2, "profile_steps": 0, "results_root": str(tmp_path)})
    run = launch(exps.dataloader_sync_waits, cfg, "dataloader_sync_waits")
    rows = [r for r in run.rows if r["kind"] == "check"]
    assert len(rows) == 2 and all(r["waits_in_timed_steps"] == 0 and r["timed_windows"] > 0 for r in rows), rows
