"""Tests that need 2 CUDA GPUs (marker `gpu`; run with `pytest -m gpu` on a GPU node)."""

import dataclasses

import pytest

import exps
from conftest import assert_plan_kept, pids_of, wait_dead
from kit import contract as experiments, results, traces
from kit.launch import launch

pytestmark = pytest.mark.gpu


def test_nccl_rows_and_env_override(cfg):
    cfg = dataclasses.replace(cfg, backend="auto", env={"KIT_TEST_VAR": "x", "NCCL_ALGO": "Ring"})
    run = launch(exps.echo, cfg, "echo")
    assert run.meta["backend"] == "nccl"
    assert sorted(r["rank"] for r in run.rows) == [0, 1]
    assert all(r["sum"] == 3.0 and r["nccl_algo"] == "Ring" and r["backend"] == "nccl" for r in run.rows)
    assert run.meta["sysinfo"]["gpus"] and run.meta["sysinfo"]["nccl"]


def test_teardown_with_profiler_and_graph_is_bounded(cfg):
    cfg = dataclasses.replace(cfg, backend="auto", teardown_s=15)
    run = launch(exps.profiler_and_graph_then_finish, cfg, "teardown")  # returns: the teardown was bounded
    # 1 -> 2 (eager) -> 4 (side-stream warm-up) -> 8 (graph replay); capture itself runs nothing
    assert [r["value"] for r in sorted(run.rows, key=lambda r: r["rank"])] == [8.0, 8.0]
    assert wait_dead(pids_of(run.dir), 10) == []


def test_collectives_gpu_methods(cfg):
    c = experiments.make_config("collectives", {"world_size": 2, "max_bytes": 1 << 20, "min_bytes": 1 << 16,
                                                "iters": 5, "repeats": 3, "results_root": cfg.results_root,
                                                "nccl_tests": ""})
    run = experiments.execute("collectives", c)
    assert_plan_kept("collectives", c, run)
    df = run.df()
    assert {"eager", "graph", "kernel"} <= set(df["method"])
    k = df[df.method == "kernel"]
    # one NCCL kernel per call: iters kernels per (collective, size, rank)
    assert (k.groupby(["collective", "bytes", "rank"]).size() == 5).all()
    assert (df[df.method == "eager"]["host_us"] > 0).all()


def test_graph_gaps_census_and_profile(cfg):
    """Both settings: the census shows NCCL's event nodes only with mixing support on; profile rows exist."""
    c = experiments.make_config("graph_gaps", {"world_size": 2, "layers": [4], "batch": 64, "hidden": 256,
                                               "iters": 2, "repeats": 2, "launch_batches": [8], "launch_layers": 8,
                                               "keep_traces": [4], "results_root": cfg.results_root})
    runs = experiments.execute_all("graph_gaps", c)
    assert_plan_kept("graph_gaps", c, runs)
    assert [r.meta["env_overrides"] for r in runs] == [{}, {"NCCL_GRAPH_MIXING_SUPPORT": "0"}]
    census = []
    for r in runs:
        rows = [x for x in r.rows if x["kind"] == "census" and x["rank"] == 0]
        census.append({x["node_type"]: x["count"] for x in rows})
        assert {x["mode"] for x in r.rows if x["kind"] == "profile"} == {"eager", "graph"}
        assert traces.find_traces(r.dir, model="allreduce", layers=4, mode="graph", rank=0)
    default, off = census
    assert default["KERNEL:nccl"] == off["KERNEL:nccl"] == 4
    assert default.get("EVENT_RECORD", 0) + default.get("EVENT_WAIT", 0) > 0
    assert off.get("EVENT_RECORD", 0) + off.get("EVENT_WAIT", 0) == 0


def test_graph_gaps_replay_streams(cfg):
    """The graph replays into each stream it is asked for: the legacy default stream (handle 0x0), a created one,
    the per-thread default stream (0x2) and a blocking one; each gets its timing, profile and position rows."""
    streams = ["legacy", "created", "per_thread", "blocking"]
    c = experiments.make_config("graph_gaps", {"world_size": 2, "layers": [4], "batch": 64, "hidden": 256,
                                               "iters": 1, "repeats": 2, "warmup": 1, "control": False,
                                               "mechanism": False, "launch_batches": [], "env_sets": [],
                                               "replay_streams": streams, "results_root": cfg.results_root})
    run = experiments.execute("graph_gaps", c)
    info = {r["stream"]: r for r in run.rows if r["kind"] == "stream" and r["rank"] == 0}
    assert all(info[s]["available"] for s in streams), info
    assert info["legacy"]["stream_handle"] == "0x0" and info["per_thread"]["stream_handle"] == "0x2"
    for kind in ("time", "profile", "position"):
        assert {r["stream"] for r in run.rows if r["kind"] == kind and r["mode"] == "graph"} == set(streams), kind


def test_collective_tracing_nccl_metadata(cfg):
    c = experiments.make_config("collective_tracing", {"world_size": 2, "ddp_layers": 2, "hidden": 512, "batch": 8,
                                                       "tp_layers": 1, "tp_tokens": 256, "tp_hidden": 512,
                                                       "timed_steps": 2, "profile_steps": 2, "results_root": cfg.results_root})
    run = experiments.execute("collective_tracing", c)
    assert_plan_kept("collective_tracing", c, run)
    from kit import traces
    from kit.traces import comm as CT

    df = CT.collectives([f.path for f in traces.find_traces(run.dir, part="tp")])
    assert set(df["rank"]) == {0, 1} and set(df["backend"]) == {"nccl"}
    ag = df[df.collective == "all_gather"]
    assert (ag["bytes"] == 256 * 512 * 2).all() and (ag["group_size"] == 2).all()  # bf16, gathered output
    assert (df["wait_us"] >= 0).all()
    assert any(r["kind"] == "overlap" for r in run.rows) and any(r["kind"] == "fr" for r in run.rows)


@pytest.mark.gpu(gpus=1)
def test_graph_gaps_one_gpu(cfg):
    """One GPU: launch overhead and graph replay are measured; the gap before NCCL kernels is named
    as what one rank cannot show."""
    from kit.investigations import graph_gaps as G

    c = experiments.make_config("graph_gaps", {"world_size": 1, "layers": [4], "batch": 64, "hidden": 256,
                                               "iters": 2, "repeats": 2, "launch_batches": [8], "launch_layers": 8,
                                               "env_sets": [], "work_layers": 8, "work_hidden": [256],
                                               "work_every": [4], "replays": 3, "results_root": cfg.results_root})
    run = experiments.execute("graph_gaps", c)
    assert_plan_kept("graph_gaps", c, run)
    keys = {f.key for f in G.INVESTIGATION.findings(results.RunSet([run.dir]))}
    assert "no_nccl_kernel" in keys and any(k.startswith("graph_over_eager") for k in keys)


@pytest.mark.gpu(gpus=1)
def test_dataloader_sync_one_gpu(cfg):
    """One GPU: the H2D part runs (a pageable copy blocks the host); the all-reduce parts say they need 2 ranks."""
    c = experiments.make_config("dataloader_sync", {"world_size": 1, "samples": 64, "image_size": 32, "width": 8,
                                                    "batch": 8, "num_workers": 1, "steps": 3, "warmup": 1,
                                                    "profile_steps": 1, "bucket_caps_mb": [25.0],
                                                    "results_root": cfg.results_root})
    run = experiments.execute("dataloader_sync", c)
    assert_plan_kept("dataloader_sync", c, run)
    from kit.investigations import dataloader_sync as D

    fs = D.INVESTIGATION.findings(results.RunSet([run.dir]))
    assert fs and any("needs 2+ ranks" in f.text for f in fs)


def test_capture_and_doctor_name_the_planted_sync_on_gpus(tmp_path):
    """examples/train_ddp.py under torchrun on 2 GPUs with ``--item``: kit.capture writes one trace per rank and
    kit doctor names host_sync; the same job without the flag gets no host_sync finding."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    def job(name, *flags):
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "examples/train_ddp.py"), "--out", str(out), "--layers", "2", "--batch", "16",
                        "--timed-steps", "2", *flags], check=True, timeout=240, cwd=ROOT)
        r = subprocess.run([sys.executable, "-m", "kit", "doctor", str(out), "--json", "--workers", "2"],
                           capture_output=True, text=True, timeout=240, cwd=ROOT)
        assert r.returncode in (0, 4), r.stderr
        return json.loads(r.stdout)

    planted, clean = job("item", "--item"), job("clean")
    assert sorted(planted["ranks"]) == [0, 1] and planted["steps"] >= 2
    sync = [f for f in planted["findings"] if f["rule"] == "host_sync"]
    assert sync and sync[0]["evidence"]
    assert not [f for f in clean["findings"] if f["rule"] == "host_sync" and f["severity"] != "info"]
