"""Emulated nodes on CPU: two torchrun agents started by the kit (gloo), the meta's placement and launcher
fields, the NCCL INFO parsing on lines from a recorded 2xH200 run, and copy/ipc refused across the nodes."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import exps  # noqa: E402
from conftest import pids_of, wait_dead  # noqa: E402
from kit import results  # noqa: E402
from kit.config import ConfigError, LaunchConfig  # noqa: E402
from kit.launch import LaunchError, emulated, launch  # noqa: E402
from kit.launch import meta as run_meta  # noqa: E402

RECORDED = ROOT / "recorded" / "h200x2-emulated"


def _cfg(tmp_path, **env):
    return LaunchConfig(world_size=2, backend="gloo", results_root=str(tmp_path / "res"), timeout_s=60,
                        env={"KIT_NODES": "2", "KIT_TEST_VAR": "seen", **env})


def test_two_gloo_agents_one_run_dir(tmp_path):
    """KIT_NODES=2: two agents of one rank each; rank 0 writes the one run directory with both ranks' rows; each
    agent had its own NCCL_HOSTID, so the placement says two nodes of one rank."""
    run = launch(exps.echo, _cfg(tmp_path), "emulated")
    (run_dir,) = [p.parent for p in (tmp_path / "res").glob("emulated/*/meta.json")]
    assert run.dir == run_dir and not (run_dir / "launch.pkl").exists()
    meta = results.read_meta(run_dir)
    assert meta["status"] == "ok" and meta["mode"] == "in-place" and meta["launcher"] == "emulated nodes"
    assert meta["placement"]["nodes"] == 2 and meta["placement"]["ranks_per_node"] == 1
    hostids = [a["NCCL_HOSTID"] for a in meta["emulated"]["agents"]]
    assert len(set(hostids)) == 2 and set(meta["placement"]["ranks"]) == set(hostids)
    assert meta["emulated"]["network_env"] == {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO"}
    assert meta["label"] == "2 nodes x 1 (emulated)"
    assert meta["nccl"]["transports"] == []  # gloo: NCCL logged nothing
    df = results.load(run_dir)
    assert sorted(df["rank"]) == [0, 1] and set(df["sum"]) == {3.0} and set(df["env_seen"]) == {"seen"}
    assert sorted(r["rank"] for r in run.rows) == [0, 1] and {r["sum"] for r in run.rows} == {3.0}  # typed
    assert {p.name for p in (run_dir / "logs").iterdir()} >= {"agent0.log", "agent1.log", "rank0.log", "rank1.log"}


def test_bad_node_counts_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="KIT_NODES must be a positive integer"):
        launch(exps.echo, _cfg(tmp_path, KIT_NODES="two"), "emulated")
    with pytest.raises(ConfigError, match="2 ranks do not split evenly into 3 emulated nodes"):
        launch(exps.echo, _cfg(tmp_path, KIT_NODES="3"), "emulated")
    assert not (tmp_path / "res").exists()  # nothing started


def test_a_failing_rank_fails_the_run_with_its_log(tmp_path):
    with pytest.raises(LaunchError) as ei:
        launch(exps.raise_on_rank1, _cfg(tmp_path), "emulated")
    assert "agent(s)" in str(ei.value) and "deliberate failure on rank 1" in str(ei.value)
    meta = results.read_meta(ei.value.run.dir)
    assert meta["status"] == "failed" and meta["emulated"]["nodes"] == 2


def test_a_rank_ignoring_sigterm_does_not_outlive_the_run(tmp_path, monkeypatch):
    """torch elastic starts workers in their own session: killing an agent's session does not reach them, so
    each worker dies with its agent (kit.launch.emulated._worker); found by review, reproduced here. The
    launcher's waits are shortened (the same escalation: the failed agent's peer stopped, SIGTERM to its agent,
    ignored by its rank, then SIGKILL to the agent's session), not skipped: 10 s + 15 s of waiting otherwise."""
    monkeypatch.setattr(emulated, "_PEER_GRACE_S", 1.0)
    monkeypatch.setattr(emulated._Agents, "kill_grace_s", 2.0)
    with pytest.raises(LaunchError, match="deliberate failure on rank 1"):
        launch(exps.raise_on_rank1_while_rank0_ignores_sigterm, _cfg(tmp_path), "emulated")
    (run_dir,) = [p.parent for p in (tmp_path / "res").glob("emulated/*/meta.json")]
    pids = pids_of(run_dir)
    # rank 0's sleep: it was killed (every rank gone, none slept out), not waited out
    assert len(pids) == 2 and wait_dead(pids, 30) == [] and not (run_dir / "slept").exists()


def test_placement_summary():
    p = run_meta.placement([{"rank": 1, "node": "b"}, {"rank": 0, "node": "a"}, {"rank": 2, "node": "a"}])
    assert p == {"nodes": 2, "ranks_per_node": None, "ranks": {"a": [0, 2], "b": [1]}}


def test_nccl_info_lines_give_the_transport_per_peer(tmp_path):
    """Lines in the formats of NCCL 2.28.9's net.cc / p2p.cc / init.cc, as written to a rank's log."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        "h:1:2 [0] NCCL INFO comm 0x5c1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
        "h:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0\n"
        "h:1:2 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Socket/0\n"
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
        "h:1:2 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM/read\n")
    (logs / "rank1.log").write_text(
        "h:3:4 [0] NCCL INFO comm 0x7a2 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
        "h:3:4 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0\n")
    assert emulated.nccl_transports(tmp_path) == [
        {"from": 0, "to": 1, "via": "NET/Socket/0", "transport": "NET", "channels": 1},
        {"from": 0, "to": 1, "via": "P2P/CUMEM/read", "transport": "P2P", "channels": 1},
        {"from": 1, "to": 0, "via": "NET/Socket/0", "transport": "NET", "channels": 2}]
    assert emulated.nccl_communicators(tmp_path) == [{"nRanks": 2, "nNodes": 2, "localRanks": 1, "rank_lines": 2}]


def test_agent_env_sets_a_host_per_agent_and_keeps_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "5")  # a stale rank variable of the caller never reaches the agents
    cfg = LaunchConfig(world_size=4, backend="gloo", env={"NCCL_NET": "IB", "NCCL_HOSTID": "mine"})
    p = emulated.plan(cfg, 2)
    assert (p.nodes, p.per_node, p.world) == (2, 2, 4)
    envs = [emulated.agent_env(cfg, p, i, tmp_path) for i in range(2)]
    assert envs[0]["NCCL_HOSTID"] != envs[1]["NCCL_HOSTID"]  # what makes the nodes cannot be overridden
    assert {e["NCCL_NET"] for e in envs} == {"IB"} and {e["NCCL_SOCKET_IFNAME"] for e in envs} == {"lo"}
    assert all("RANK" not in e and e["KIT_RUN_DIR"] == str(tmp_path) for e in envs)


def test_copy_and_ipc_refused_across_emulated_nodes(tmp_path):
    """p2p_transports on two emulated nodes (gloo): copy and ipc are skipped with the cross-node reason, gloo runs."""
    from kit import contract

    cfg = contract.make_config("p2p_transports", {
        "world_size": 2, "backend": "gloo", "results_root": str(tmp_path / "res"), "timeout_s": 60,
        "env": {"KIT_NODES": "2"}, "transports": ["copy", "ipc", "gloo"], "parts": ["bandwidth"],
        "max_bytes": 4096, "iters": 2, "repeats": 2, "warmup": 1})
    (run,) = contract.execute_all("p2p_transports", cfg)
    df = results.load(run.dir)
    skipped = df[df["kind"] == "skipped"].drop_duplicates("transport").set_index("transport")["reason"]
    assert set(skipped.index) == {"copy", "ipc"}
    for name, reason in skipped.items():
        assert reason.startswith(f"{name} cannot cross nodes: it needs the peer")
        assert "these ranks are on 2 nodes" in reason and "only transports with cross_node" in reason
    assert "the peer GPU in its own process" in skipped["copy"]
    assert "the peer process on the same host" in skipped["ipc"]
    assert set(df.loc[df["kind"] == "bandwidth", "transport"]) == {"gloo"}


@pytest.mark.skipif(not RECORDED.exists(), reason="no recorded emulated runs")
def test_recorded_runs_went_through_the_network_transport():
    """Every recorded emulated GPU run: NCCL logged NET/Socket for every peer pair, two nodes of one rank."""
    metas = [json.loads(m.read_text()) for m in RECORDED.glob("*/*/meta.json")]
    assert metas
    for meta in metas:
        assert meta["emulated"]["nodes"] == 2 and meta["placement"]["nodes"] == 2
        vias = {t["via"].split("/")[0] + "/" + t["via"].split("/")[1] for t in meta["nccl"]["transports"]}
        assert vias == {"NET/Socket"}, vias
        assert all(c["nNodes"] == 2 for c in meta["nccl"]["communicators"])


_FAKE_MPIRUN = r'''#!/bin/sh
# stands in for OpenMPI's mpirun: -np N, -x K=V; runs the command once per rank with OMPI_COMM_WORLD_RANK set
np=1
while [ $# -gt 0 ]; do
  case "$1" in
    -np) np=$2; shift 2;;
    -x) export "$2"; shift 2;;
    --bind-to) shift 2;;
    --allow-run-as-root) shift;;
    *) break;;
  esac
done
r=0
while [ $r -lt $np ]; do OMPI_COMM_WORLD_RANK=$r "$@"; r=$((r + 1)); done
'''
_FAKE_PERF = r'''#!/bin/sh
# stands in for an MPI build of all_reduce_perf: says which host it was told it is on, prints one table row
echo "# rank $OMPI_COMM_WORLD_RANK NCCL_HOSTID=$NCCL_HOSTID NCCL_NET=$NCCL_NET"
[ "$OMPI_COMM_WORLD_RANK" = 0 ] && echo "     1048576        262144     float     sum      -1   400.00    2.62    2.62      0   401.00    2.61    2.61      0"
[ -n "$FAKE_HANG" ] && sleep 60
true
'''


def test_nccl_tests_under_mpirun_get_one_host_per_agent(tmp_path, monkeypatch):
    """On emulated nodes the collectives' launcher-side step runs an MPI build of nccl-tests under mpirun, each
    rank with its agent's NCCL_HOSTID and the run's network variables (fake mpirun and binary; the real pair
    needs GPUs and OpenMPI)."""
    from kit import contract
    from kit.investigations.collectives import nccl_tests

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("mpirun", _FAKE_MPIRUN), ("all_reduce_perf", _FAKE_PERF)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr(nccl_tests, "is_mpi_build", lambda b: True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = {"launcher": "emulated nodes", "backend": "nccl", "world_size": 2,
            "emulated": {"nodes": 2, "ranks_per_node": 1, "network_env": {"NCCL_NET": "Socket"},
                         "agents": [{"node": i, "NCCL_HOSTID": f"h-kit-node{i}", "gpus": [str(i)]} for i in (0, 1)]}}
    cfg = contract.make_config("collectives", {"collectives": ["all_reduce"], "nccl_tests": str(bin_dir),
                                                "min_bytes": 1 << 20, "max_bytes": 1 << 20, "env": {"KIT_NODES": "2"}})
    run = results.Run(run_dir, meta, [])
    nccl_tests.after(cfg, run)
    log = (run_dir / "nccl-tests.log").read_text()
    assert "# rank 0 NCCL_HOSTID=h-kit-node0 NCCL_NET=Socket" in log and "# rank 1 NCCL_HOSTID=h-kit-node1" in log
    rows = [r for r in run.rows if r["method"] == "nccl-tests" and r["placement"] == "out-of-place"]
    assert rows and rows[0]["busbw_gbps"] == 2.62 and rows[0]["world_size"] == 2
    assert results.read_meta(run_dir)["nccl_tests"]["launcher"] == "mpirun"


def test_nccl_tests_past_the_time_limit_keep_the_sizes_they_finished(tmp_path):
    """A binary that prints a row and then hangs: killed at the limit (its session), the row kept."""
    from kit import contract
    from kit.investigations.collectives import nccl_tests

    exe = tmp_path / "all_reduce_perf"
    exe.write_text(_FAKE_PERF)
    exe.chmod(0o755)
    cfg = contract.make_config("collectives", {"collectives": ["all_reduce"], "min_bytes": 1 << 20,
                                                "max_bytes": 1 << 20, "env": {"FAKE_HANG": "1",
                                                                              "OMPI_COMM_WORLD_RANK": "0"}})
    rows, logs = nccl_tests.run_nccl_tests({"all_reduce": str(exe)}, cfg, 1, timeout_s=2)
    assert "timed out after 2 s: the sizes above finished and are kept" in logs[0]
    assert {r["busbw_gbps"] for r in rows if r["placement"] == "out-of-place"} == {2.62}


def test_without_an_mpi_build_the_run_says_why(tmp_path, monkeypatch):
    from kit import contract
    from kit.investigations.collectives import nccl_tests

    monkeypatch.setattr(nccl_tests.shutil, "which", lambda name: None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = {"launcher": "emulated nodes", "backend": "nccl", "world_size": 2}
    run = results.Run(run_dir, meta, [])
    nccl_tests.after(contract.make_config("collectives", {"collectives": ["all_reduce"]}), run)
    assert [r["note"] for r in run.rows] == [nccl_tests.EMULATED_NODES]


def test_nccl_tests_run_on_torchs_nccl_and_say_which_they_loaded(tmp_path, monkeypatch):
    """nccl-tests links libnccl.so.2 by name: the step puts torch's NCCL first on LD_LIBRARY_PATH and records the
    library nccl-tests reports in its header; another library than the sweep's is a warning (on the 2xH200 image
    a binary left to the loader picked the system's NCCL 2.28.3 beside torch's 2.28.9)."""
    from kit import contract
    from kit.investigations.collectives import nccl_tests

    assert nccl_tests.nccl_versions("# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22803") == {
        "nccl_headers": "2.28.9", "nccl_library": "2.28.3"}
    assert nccl_tests.nccl_versions("no header") == {} and nccl_tests.nccl_code_version(21903) == "2.19.3"
    monkeypatch.setattr(nccl_tests, "torch_nccl_libdir", lambda: "/torch/nvidia/nccl/lib")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/x")
    assert nccl_tests.reference_env({"A": "1"})["LD_LIBRARY_PATH"] == "/torch/nvidia/nccl/lib:/usr/lib/x"
    exe = tmp_path / "all_reduce_perf"
    exe.write_text('#!/bin/sh\necho "# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=$FAKE_LIB '
                   'ld=$LD_LIBRARY_PATH"\n' + _FAKE_PERF.split("\n", 2)[2])
    exe.chmod(0o755)
    for lib, same in (("22809", True), ("22803", False)):
        run_dir = tmp_path / f"run{lib}"
        run_dir.mkdir()
        meta = {"backend": "nccl", "mode": "spawn", "world_size": 1, "sysinfo": {"nccl": "2.28.9"}, "warnings": None}
        cfg = contract.make_config("collectives", {"collectives": ["all_reduce"], "nccl_tests": str(exe),
                                                    "min_bytes": 1 << 20, "max_bytes": 1 << 20,
                                                    "env": {"FAKE_LIB": lib, "OMPI_COMM_WORLD_RANK": "0"}})
        nccl_tests.after(cfg, results.Run(run_dir, meta, []))
        m = results.read_meta(run_dir)
        assert "ld=/torch/nvidia/nccl/lib:" in (run_dir / "nccl-tests.log").read_text()
        assert m["nccl_tests"]["same_nccl_as_sweep"] is same and m["nccl_tests"]["nccl_headers"] == "2.28.9"
        assert bool(m.get("warnings")) is not same


def test_recorded_emulated_collectives_have_their_reference():
    """The 2xH200 emulated run with nccl-tests (MPI build under mpirun, torch's NCCL): busbw at 64 MiB and 1 GiB,
    the library it loaded, NET/Socket in its own INFO lines."""
    import pandas as pd

    d = RECORDED / "collectives" / "20261123-102933-vm-8196f6"
    meta = results.read_meta(d)
    assert meta["nccl_tests"]["launcher"] == "mpirun" and meta["nccl_tests"]["nccl_library"] == "2.28.9"
    assert meta["nccl_tests"]["same_nccl_as_sweep"] is True and not meta.get("warnings")
    df = pd.read_csv(d / "rows.csv.gz")
    nt = df[(df["kind"] == "nccl-tests") & (df["placement"] == "out-of-place")].set_index(["method", "bytes"])
    assert nt.loc[("nccl-tests", 64 << 20), "busbw_gbps"] == pytest.approx(4.40, abs=0.01)
    assert nt.loc[("nccl-tests", 1 << 30), "busbw_gbps"] == pytest.approx(4.55, abs=0.01)
    log = (d / "nccl-tests.log").read_text()
    assert log.count("via NET/Socket/0") == 16 and "via P2P" not in log and "via SHM" not in log
