"""dataloader_sync on CPU: dataset and DataLoader, the model, sync modes agree numerically across 2 gloo
ranks, the breakdown rows, bad parameters, and the notebook through `kit run`."""

import subprocess
import sys

import pytest
import torch

import exps
from conftest import ROOT
from kit.investigations import dataloader_sync as D
from kit import contract as experiments
from kit.config import ConfigError
from kit.launch import launch


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
    cfg = experiments.make_config("dataloader_sync", {"world_size": 2, "backend": "gloo", "width": 8,
                                                      "results_root": str(tmp_path)})
    run = launch(exps.sync_equivalence, cfg, "sync_eq")
    assert {r["mode"] for r in run.rows} == set(D.SYNC_MODES)
    for r in run.rows:
        assert r["max_abs_err"] < 1e-5 * max(r["norm"], 1), r


def test_breakdown_rows_complete(tmp_path):
    cfg = experiments.make_config("dataloader_sync", {"world_size": 2, "backend": "gloo", "samples": 32, "image_size": 32,
                                                      "width": 8, "batch": 4, "num_workers": 1, "steps": 2, "warmup": 1,
                                                      "profile_steps": 0, "bucket_caps_mb": [1.0],
                                                      "results_root": str(tmp_path)})
    run = experiments.execute("dataloader_sync", cfg)
    df = run.df()
    steps = df[df.kind == "step"]
    # pageable only on CPU: 4 sync modes + 1 extra DDP bucket, 2 ranks, 2 steps
    assert len(steps) == (4 + 1) * 2 * 2
    for col in D.PARTS + ["step_us", "step_host_us", "h2d_host_us", "loss"]:
        assert steps[col].notna().all() and (steps[col] >= 0).all(), col
    sk = df[df.kind == "skipped"]
    assert set(sk.h2d) == {"pinned", "side_stream", "prefetch"} and sk.reason.str.contains("needs CUDA").all()
    b = D.breakdown(df)
    assert set(b.sync) == set(D.SYNC_MODES) and (b.step_us > 0).all()


def test_bad_parameters():
    with pytest.raises(ConfigError, match="unknown mode"):
        experiments.make_config("dataloader_sync", {"h2d_modes": ["pagable"]})
    cfg = experiments.make_config("dataloader_sync", {"world_size": 2, "backend": "gloo", "samples": 16, "batch": 32})
    with pytest.raises(ConfigError, match="batch 32 is larger than the dataset's share per rank"):
        experiments.execute("dataloader_sync", cfg)


def test_kit_run_dataloader_sync_cpu_smoke(tmp_path):
    p = subprocess.run([sys.executable, "-m", "kit", "run", "dataloader_sync", "--config", "configs/cpu-smoke.yaml",
                        "--results-root", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    html = next((tmp_path / "reports").iterdir()).joinpath("dataloader_sync.html").read_text()
    assert "needs CUDA" in html


def test_recorded_gpu_run_shows_the_blocking_copy():
    """The committed 2xH200 run: a pageable copy on the default stream blocks the host for most of a step
    (it waits for the previous step's GPU work); pinned / side-stream / prefetch copies do not. DDP hides part
    of its communication behind backward; per-parameter all-reduces timed with events track their kernels."""
    from kit import results

    d = results.recorded("dataloader_sync")[-1]
    df = results.load(d)
    b = D.breakdown(df).set_index(["h2d", "sync"])
    for sync in ("ddp", "per_param", "flat"):
        assert b.loc[("pageable", sync), "h2d_host_us"].max() > 20 * b.loc[("prefetch", sync), "h2d_host_us"].max()
        assert b.loc[("pageable", sync), "step_host_us"].max() > b.loc[("prefetch", sync), "step_host_us"].max()
    ov = df[(df.kind == "overlap") & (df.sync == "ddp")]
    assert ov.overlap_share.median() > 0.3
    ek = D.event_vs_kernel(df, d)
    big = ek[ek.bytes > 1e8].iloc[0]
    assert abs(big.event_us / big.kernel_us - 1) < 0.1
