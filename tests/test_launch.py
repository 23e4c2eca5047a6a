"""Launcher on 2 gloo ranks: rows from every rank, env overrides, and every fault with a time bound."""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import exps
from conftest import ROOT, pids_of, wait_dead
from kit import launch as L
from kit.launch import LaunchError, launch


def test_rows_from_both_ranks_and_env_override(cfg):
    cfg = dataclasses.replace(cfg, env={"KIT_TEST_VAR": "hello", "NCCL_ALGO": "Ring"})
    run = launch(exps.echo, cfg, "echo")
    rows = sorted(run.rows, key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["env_seen"] == "hello" and r["nccl_algo"] == "Ring" for r in rows)
    assert all(r["sum"] == 3.0 and r["world"] == 2 and r["backend"] == "gloo" for r in rows)
    meta = json.loads((run.dir / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["env_overrides"] == {"KIT_TEST_VAR": "hello", "NCCL_ALGO": "Ring"}
    assert meta["sysinfo"]["env"]["NCCL_ALGO"] == "Ring"  # sysinfo is taken in rank 0, after the override
    assert meta["end_time"] and meta["start_time"] and meta["config"]["world_size"] == 2
    assert (run.dir / "rows.csv").read_text().count("\n") == 3
    assert wait_dead([r["pid"] for r in rows], 5) == []


def test_rank_raises_names_rank_and_keeps_rows(cfg):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        launch(exps.raise_on_rank1, cfg, "raise")
    elapsed = time.monotonic() - t0
    e = ei.value
    msg = str(e)
    assert e.rank == 1 and e.kind == "error"
    assert "rank 1 raised" in msg and "deliberate failure on rank 1" in msg
    assert "Traceback" in msg and "raise ValueError" in msg  # the rank's own traceback
    assert "about to fail" in msg  # its last step
    # rank 0 was blocked in a barrier (and would then sleep 60 s): it must have been stopped promptly
    assert elapsed < 30, elapsed
    assert wait_dead(pids_of(e.run.dir), 10) == []
    # rows produced before the fault are kept, in memory and on disk, with the error
    assert sorted((r["rank"], r["i"]) for r in e.run.rows) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert (e.run.dir / "rows.csv").read_text().count("\n") == 7
    meta = json.loads((e.run.dir / "meta.json").read_text())
    assert meta["status"] == "failed" and "deliberate failure" in meta["error"]
    assert "deliberate failure" in (e.run.dir / "error.txt").read_text()


def test_other_ranks_stopped_within_10s_of_a_raise(cfg):
    """Time from the error to every rank gone, measured from the parent's side."""
    with pytest.raises(LaunchError) as ei:
        launch(exps.raise_on_rank1, cfg, "raise")
    t_raised = time.monotonic()
    assert wait_dead(pids_of(ei.value.run.dir), 10) == []
    assert time.monotonic() - t_raised < 10


def test_hang_watchdog_names_rank_and_step(cfg):
    cfg = dataclasses.replace(cfg, timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        launch(exps.hang_on_rank1, cfg, "hang")
    elapsed = time.monotonic() - t0
    e = ei.value
    msg = str(e)
    assert e.kind == "hang" and e.rank == 1
    assert msg.startswith("rank 1 hung") and "stuck in a sleep" in msg
    assert "rank 0: last step 'waiting for rank 1'" in msg
    assert "Python stack of rank 1" in msg and "hang_on_rank1" in msg  # faulthandler dump of the culprit
    assert elapsed < 3 + 20
    assert wait_dead(pids_of(e.run.dir), 10) == []
    assert [r["i"] for r in e.run.rows] == [0, 0]


def test_teardown_hang_is_bounded_and_results_kept(cfg):
    cfg = dataclasses.replace(cfg, teardown_s=2)
    t0 = time.monotonic()
    run = launch(exps.hang_in_teardown, cfg, "teardown")
    assert time.monotonic() - t0 < 25
    assert [r["done"] for r in run.rows] == [1, 1]
    assert run.meta["status"] == "ok"
    assert any("did not exit within teardown_s=2" in w for w in run.meta["warnings"])
    assert wait_dead(pids_of(run.dir), 10) == []


def test_rank_dying_without_error(cfg):
    with pytest.raises(LaunchError) as ei:
        launch(exps.exit_hard_on_rank0, cfg, "die")
    assert ei.value.kind == "died" and ei.value.rank == 0
    assert "rank 0 died with exit code 3" in str(ei.value)
    assert wait_dead(pids_of(ei.value.run.dir), 10) == []


def test_port_taken_is_retried(cfg, monkeypatch):
    """The first port offered is taken by a listening socket: the launcher retries with another."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = iter([busy.getsockname()[1]])
    real = L.free_port
    monkeypatch.setattr(L, "free_port", lambda: next(ports, None) or real())
    try:
        run = launch(exps.echo, dataclasses.replace(cfg, timeout_s=30), "port")
    finally:
        busy.close()
    assert sorted(r["rank"] for r in run.rows) == [0, 1]


PARENT = textwrap.dedent("""
    import sys, dataclasses
    sys.path[:0] = [{tests!r}, {root!r}]
    import exps
    from kit.config import LaunchConfig
    from kit.launch import launch
    if __name__ == "__main__":
        cfg = LaunchConfig(world_size=2, backend="gloo", results_root={res!r}, timeout_s=300)
        launch(exps.sleep_forever, cfg, "signal")
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_parent_signal_leaves_no_rank_behind(tmp_path, sig):
    res = tmp_path / "res"
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(tests=str(ROOT / "tests"), root=str(ROOT), res=str(res)))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    pids = []
    while time.monotonic() < deadline and len(pids) < 2:
        dirs = list(res.glob("signal/*"))
        pids = pids_of(dirs[0]) if dirs else []
        time.sleep(0.2)
    assert len(pids) == 2, p.stdout.read().decode() if p.poll() is not None else "ranks did not start"
    time.sleep(0.5)
    p.send_signal(sig)
    p.wait(timeout=20)
    assert wait_dead(pids, 10) == [], f"ranks left behind after {sig.name}"
    if sig != signal.SIGKILL:
        meta = json.loads(next(res.glob("signal/*/meta.json")).read_text())
        assert meta["status"] == "interrupted"


def test_resolve_rejects_more_ranks_than_gpus():
    from kit.config import ConfigError, LaunchConfig

    with pytest.raises(ConfigError, match="needs 64 GPUs"):
        L.resolve(LaunchConfig(world_size=64, backend="nccl"))
    assert L.resolve(LaunchConfig(world_size=0, backend="auto"))[0] >= 1


def test_launched_externally_detection(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    assert not L.launched_externally()
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a single-task allocation: spawn as usual
    assert not L.launched_externally()
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert L.launched_externally()
    monkeypatch.delenv("SLURM_PROCID")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert L.launched_externally()


def test_torchrun_two_agents(tmp_path):
    """Two torchrun agents on localhost (--nnodes 2, c10d rendezvous): one run dir, rows from both ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = tmp_path / "res"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "kit-test",
           "--max-restarts", "0", "-m", "kit", "exp", "collectives", "--config", str(ROOT / "configs/cpu-smoke.yaml"),
           "-p", f"results_root={res}", "-p", "max_bytes=4096", "-p", "collectives=[all_reduce,all_gather]"]
    agents = [subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
              for _ in range(2)]
    outs = []
    for a in agents:
        try:
            outs.append(a.communicate(timeout=150)[0].decode())
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            pytest.fail("torchrun agents did not finish")
    assert all(a.returncode == 0 for a in agents), "\n----\n".join(outs)
    runs = list(res.glob("collectives/*/meta.json"))
    assert len(runs) == 1, runs  # rank 0 alone writes
    meta = json.loads(runs[0].read_text())
    assert meta["mode"] == "in-place" and meta["world_size"] == 2 and meta["status"] == "ok"
    import pandas as pd

    df = pd.read_csv(runs[0].parent / "rows.csv")
    assert set(df["rank"]) == {0, 1}
    assert set(df["collective"]) == {"all_reduce", "all_gather"}
    assert set(df["bytes"]) == {1024, 2048, 4096}


def test_slurm_style_in_place_run(tmp_path):
    """Two processes with the variables srun sets (SLURM_PROCID/NTASKS/LOCALID, no RANK/WORLD_SIZE) run the
    experiment in place: one run directory, written by rank 0, with both ranks' rows."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = tmp_path / "res"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_"))}
    base.update(PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURM_NTASKS="2",
                SLURM_JOB_ID="4242")
    cmd = [sys.executable, "-m", "kit", "exp", "collectives", "--config", str(ROOT / "configs/cpu-smoke.yaml"),
           "-p", f"results_root={res}", "-p", "max_bytes=2048", "-p", "collectives=[broadcast]"]
    procs = [subprocess.Popen(cmd, env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n----\n".join(outs)
    runs = list(res.glob("collectives/*/meta.json"))
    assert len(runs) == 1
    meta = json.loads(runs[0].read_text())
    assert meta["mode"] == "in-place" and meta["world_size"] == 2
    import pandas as pd

    df = pd.read_csv(runs[0].parent / "rows.csv")
    assert set(df["rank"]) == {0, 1} and set(df["collective"]) == {"broadcast"}
