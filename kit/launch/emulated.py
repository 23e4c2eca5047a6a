"""Emulated nodes: one GPU host plays K nodes -- K torchrun agents started by the kit, NCCL's network
transport between them, the same experiment code run in place.

Why: on one NVLink host every collective and send/recv goes through NVLink (hundreds of GB/s), so questions
about jobs across nodes -- an all-reduce that is network-bound, per-parameter all-reduces, bucket sizes, P2P
where copy engines and CUDA IPC no longer reach the peer -- cannot be asked there. Telling NCCL that groups of
ranks are different hosts makes it move their data through its network transport instead.

How (``KIT_NODES=K`` in the config's ``env`` or the launching process's environment, e.g.
``configs/emulated-nodes.yaml`` or ``env_sets: [{}, {KIT_NODES: "2"}]`` for both regimes in one notebook run):

* the launcher (this process, which never touches CUDA) creates the run directory and starts K agents of
  ``torch.distributed.run`` (``--nnodes K --nproc-per-node G``, c10d rendezvous on ``127.0.0.1``), each
  in its own session and dying with the launcher (``PR_SET_PDEATHSIG``: SIGTERM, on which an agent stops
  its workers);
* agent ``i`` sees only its own G GPUs (``CUDA_VISIBLE_DEVICES``) and gets ``NCCL_HOSTID=<host>-kit-node<i>``.
  NCCL hashes ``NCCL_HOSTID`` instead of hostname + boot id into the host hash
  (``getHostHashOnce`` in ``src/misc/utils.cc``, NCCL v2.28.9-1); the P2P and SHM transports refuse peers
  whose host hash differs (``p2pCanConnect`` in ``src/transport/p2p.cc``, ``shmCanConnect`` in
  ``src/transport/shm.cc``), which leaves the network transport (``src/transport/net.cc``). Ranks inside
  one agent keep NVLink;
* the network is NCCL's own socket transport over loopback: ``NCCL_NET=Socket`` chooses the net plugin by
  name (``src/init.cc``), ``NCCL_SOCKET_IFNAME=lo`` the interface (NCCL's environment documentation: the
  loopback interface is not selected unless named). Any of these can be overridden in ``cfg.env`` (e.g.
  ``NCCL_NET: IB`` on a host with InfiniBand NICs) -- except ``NCCL_HOSTID``, which is what makes the nodes;
* ``NCCL_DEBUG=INFO`` (unless set): NCCL logs, at communicator set-up, one line per channel and peer with
  the transport it chose, ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0`` (``src/transport/net.cc``;
  ``via P2P/CUMEM`` from ``p2p.cc``, ``via SHM/...`` from ``shm.cc``), and ``comm ... nRanks 2 nNodes 2
  localRanks 1`` (``src/init.cc``). Every rank's output goes to ``logs/rank<N>.log`` (those lines are kept);
  :func:`nccl_transports` reads them back into ``meta.json``;
* the ranks run :func:`kit.launch.inplace.launch_in_place` as under any torchrun: rank 0 writes the run
  directory (the one the launcher made, ``KIT_RUN_DIR``), streams its rows and gathers the others'; the
  meta records the placement (nodes, ranks per node). The launcher then adds ``meta["emulated"]`` (agents,
  their NCCL_HOSTID and GPUs, the network variables) and ``meta["nccl"]`` (the transport per peer).

Faults: a rank's own watchdog (``timeout_s``) ends a hang (see :mod:`kit.launch.inplace`); once one agent
has failed the others get ``_PEER_GRACE_S`` to end before they are stopped (the agents are supervised on
:class:`kit.launch.procs.ProcessSupervisor`'s template, stopped by its one escalation); the error names the agent and
shows the tail of the failing rank's log; each worker dies with its agent. nccl-tests built with ``MPI=0``
cannot play two hosts (one process holds every rank and NCCL computes one host hash per process); the
collectives investigation runs an ``MPI=1`` build under ``mpirun`` with one ``NCCL_HOSTID`` per rank instead
(:mod:`kit.investigations.collectives.nccl_tests`).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .. import results
from ..config import ConfigError
from . import meta as run_meta
from .procs import ProcessSupervisor, exit_code
from .node import cuda_device_count, free_port, resolve
from .rank import die_with_parent, log_path, tail

NODES_VAR = "KIT_NODES"
"""how many nodes to emulate on this host (in ``cfg.env`` or the launching process's environment)"""
NETWORK_ENV = {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO"}
"""what every agent gets unless ``cfg.env`` says otherwise: NCCL's socket transport over loopback, and the
INFO lines that name the transport chosen per peer"""
RUN_DIR_VAR = "KIT_RUN_DIR"
"""the run directory the launcher made; rank 0 writes into it (:mod:`kit.launch.inplace`)"""
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
              "MASTER_PORT", "TORCHELASTIC_", "SLURM_")
_PEER_LOSS = ("DistBackendError", "Connection closed by peer", "Connection reset by peer", "remote process exited")
_PEER_GRACE_S = 10.0  # after one agent failed, how long the others may take to notice before they are stopped
_KILL_GRACE_S = 15.0  # SIGTERM to an agent (it stops its workers) -> SIGKILL to its whole session
_POLL_S = 0.2


def nodes_requested(cfg) -> int:
    """The number of nodes ``cfg`` asks for (1 = no emulation); a value that is no positive integer is a
    :class:`~kit.config.ConfigError`."""
    raw = str(cfg.env.get(NODES_VAR) or os.environ.get(NODES_VAR) or "1").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{NODES_VAR} must be a positive integer (nodes to emulate on this host), not {raw!r}")
    return int(raw)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Who runs where: ``nodes`` agents of ``per_node`` ranks each; ``gpus[i]`` the devices agent i sees."""

    nodes: int
    per_node: int
    world: int
    backend: str
    gpus: list[list[str]]


def plan(cfg, nodes: int) -> Plan:
    """Split this host into ``nodes`` nodes for ``cfg`` (``world_size`` 0: every GPU, or 2 gloo ranks on CPU).
    Raises ConfigError when the ranks do not split evenly or there are not enough GPUs."""
    world, backend = resolve(cfg)
    if world % nodes:
        raise ConfigError(f"{world} ranks do not split evenly into {nodes} emulated nodes "
                          f"(set world_size to a multiple of {nodes})")
    per = world // nodes
    gpus: list[list[str]] = [[] for _ in range(nodes)]
    if backend == "nccl":
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        visible = visible or [str(i) for i in range(cuda_device_count())]
        gpus = [visible[i * per:(i + 1) * per] for i in range(nodes)]
    return Plan(nodes, per, world, backend, gpus)


def host_id(node: int) -> str:
    return f"{socket.gethostname().split('.')[0]}-kit-node{node}"


def agent_env(cfg, p: Plan, node: int, run_dir: Path) -> dict[str, str]:
    """The environment of agent ``node`` (its workers inherit it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_RANK_VARS)}
    env.update(NETWORK_ENV)
    env.update({k: str(v) for k, v in cfg.env.items()})
    env.update({"NCCL_HOSTID": host_id(node), NODES_VAR: str(p.nodes), RUN_DIR_VAR: str(run_dir),
                "PYTHONPATH": os.pathsep.join(dict.fromkeys(x for x in sys.path if x)), "PYTHONUNBUFFERED": "1"})
    if p.backend == "nccl":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(p.gpus[node])
    return env


def agent_cmd(p: Plan, port: int, payload: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(p.nodes), "--nproc-per-node",
            str(p.per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
            f"kit-{payload.parent.name}", "--max-restarts", "0", "-m", "kit.launch.emulated", str(payload)]


def _die_with_launcher() -> None:  # runs in the agent between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def launch_emulated(fn, cfg, experiment: str, nodes: int, on_row: Callable[[dict], None] | None = None,
                    verbose: bool = False) -> results.Run:
    """Run ``fn`` on ``nodes`` emulated nodes of this host (see the module docstring); the Run once every
    agent has ended. Raises :class:`~kit.launch.LaunchError` when an agent fails."""
    from .supervisor import LaunchError

    p = plan(cfg, nodes)
    if not cfg.label:
        cfg = dataclasses.replace(cfg, label=f"{p.nodes} nodes x {p.per_node} (emulated)")
    run_dir = results.new_run_dir(cfg.results_root, experiment)
    (run_dir / "logs").mkdir()
    payload = run_dir / "launch.pkl"
    payload.write_bytes(pickle.dumps((fn, cfg, experiment)))
    try:
        codes = _Agents(verbose).supervise(p, cfg, run_dir, payload)
    except BaseException:  # the agents were stopped on the way out (ProcessSupervisor._close)
        _finish_meta(run_dir, p, cfg, "interrupted", "launcher interrupted; every agent was stopped")
        raise
    finally:
        payload.unlink(missing_ok=True)
    failed = [i for i, c in enumerate(codes) if c != 0]
    meta = _finish_meta(run_dir, p, cfg, "failed" if failed else None,
                        _failure(run_dir, codes) if failed else None)
    run = results.Run(run_dir, meta, _read_rows(run_dir))
    if failed:
        raise LaunchError(_failure(run_dir, codes), run, None, "error")
    if on_row:
        for row in run.rows:
            on_row(row)
    return run


class _Agents(ProcessSupervisor):
    """The K torchrun agents of one run, on :class:`kit.launch.procs.ProcessSupervisor`'s template: each in its
    own session; stopping one is SIGTERM to the agent (it stops its workers), then SIGKILL to its session."""

    kill_grace_s = _KILL_GRACE_S
    kill_session = True

    def __init__(self, verbose: bool = False):
        super().__init__()
        self.verbose = verbose

    def _start(self, p: Plan, cfg, run_dir: Path, payload: Path) -> None:
        port = free_port()
        for i in range(p.nodes):
            with open(run_dir / "logs" / f"agent{i}.log", "wb") as out:
                self.procs.append(subprocess.Popen(agent_cmd(p, port, payload), env=agent_env(cfg, p, i, run_dir),
                                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                                   preexec_fn=_die_with_launcher))

    def _poll(self) -> list[int]:
        """Every agent's exit code; once one fails, the others get ``_PEER_GRACE_S`` and are then stopped."""
        failed_at = None
        while True:
            codes = [exit_code(a) for a in self.procs]
            if all(c is not None for c in codes):
                return codes
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
                if self.verbose:
                    print(f"[kit] agent(s) {[i for i, c in enumerate(codes) if c not in (None, 0)]} failed",
                          flush=True)
            if failed_at is not None and time.monotonic() - failed_at > _PEER_GRACE_S:
                self.stop_all()
                return [c if (c := exit_code(a)) is not None else -signal.SIGKILL for a in self.procs]
            time.sleep(_POLL_S)


def _failure(run_dir: Path, codes: list[int]) -> str:
    """The error: which agents failed, and the traceback of the rank that raised first (its
    ``logs/rank<N>.error``; a rank that raised later usually only saw its peer go away), else the agents' logs."""
    lines = [f"emulated nodes: agent(s) {[i for i, c in enumerate(codes) if c != 0]} failed (exit codes {codes})"]
    def peer_loss(f: Path) -> bool:  # the error of a rank whose peer went away, not the cause
        return any(m in f.read_text(errors="replace") for m in _PEER_LOSS)

    errors = sorted((run_dir / "logs").glob("rank*.error"), key=lambda f: (peer_loss(f), f.stat().st_mtime))
    if errors:
        lines.append(f"--- {errors[0].stem} raised first ---\n{errors[0].read_text(errors='replace').strip()}")
    else:
        lines.extend(f"--- end of logs/{a.name} ---\n{tail(a, 10)}" for a in sorted((run_dir / "logs").glob("agent*.log")))
    return "\n".join(lines)


def _read_rows(run_dir: Path) -> list[dict]:
    """The rows rank 0 wrote, typed back (numbers as numbers, empty cells dropped) -- as the spawn and in-place
    launchers hand them to ``on_row`` and ``Run.rows``: rank 0's process is gone, only ``rows.csv`` is left."""
    import pandas as pd

    path = run_dir / "rows.csv"
    if not path.exists() or path.stat().st_size == 0:
        return []
    df = pd.read_csv(path)
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items() if not pd.isna(v)}
            for r in df.to_dict("records")]


def _finish_meta(run_dir: Path, p: Plan, cfg, status: str | None, error: str | None) -> dict:
    """Add what only the launcher knows to rank 0's meta (or write one when rank 0 never got that far)."""
    meta = results.read_meta(run_dir)
    if not meta:
        meta = run_meta.start_meta(run_dir.parent.name, cfg, p.world, p.backend, "in-place")
    meta["launcher"] = "emulated nodes"
    meta["emulated"] = {
        "nodes": p.nodes, "ranks_per_node": p.per_node,
        "agents": [{"node": i, "NCCL_HOSTID": host_id(i), "gpus": p.gpus[i]} for i in range(p.nodes)],
        "network_env": {k: str(cfg.env.get(k, v)) for k, v in NETWORK_ENV.items()},
        "launched_by": results.supervisor_identity(),
    }
    meta["nccl"] = {"transports": nccl_transports(run_dir), "communicators": nccl_communicators(run_dir)}
    if status and meta.get("status") in (None, "running", "ok"):
        run_meta.finish(run_dir, meta, status, error)
    else:
        run_meta.write(run_dir, meta)
    return meta


# ------------------------------------------------------------------------------------------ NCCL's INFO lines
_CHANNEL = re.compile(r"NCCL INFO Channel (\d+)(?:/(\d+))? : (\d+)\[(\d+)\] -> (\d+)\[(\d+)\]"
                      r"(?: \[(send|receive)\])? via (\S+)")
_COMM = re.compile(r"NCCL INFO comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) "
                   r"localRank (\d+)")


def _log_lines(run_dir: Path):
    for log in sorted((Path(run_dir) / "logs").glob("rank*.log")):
        with open(log, errors="replace") as f:
            yield from f


def nccl_transports(run_dir: Path) -> list[dict]:
    """The transport NCCL chose per directed peer pair, from the ranks' ``NCCL_DEBUG=INFO`` lines: one entry
    per (from, to, via) with the number of distinct channels. Ranks are those of the communicator that logged
    the line (the default group's equal the global ranks). [] when no rank logged any (gloo, NCCL_DEBUG off)."""
    seen: dict[tuple[int, int, str], set] = {}
    for line in _log_lines(run_dir):
        m = _CHANNEL.search(line)
        if m:
            ch, conn, a, _, b, _, _, via = m.groups()
            seen.setdefault((int(a), int(b), via), set()).add((int(ch), int(conn or 0)))
    return [{"from": a, "to": b, "via": via, "transport": via.split("/")[0], "channels": len(chs)}
            for (a, b, via), chs in sorted(seen.items())]


def nccl_communicators(run_dir: Path) -> list[dict]:
    """The communicators NCCL set up, as their ranks logged them: one entry per (nRanks, nNodes, localRanks)
    with how many rank lines said so (``comm ... nRanks 2 nNodes 2 localRanks 1``, ``src/init.cc``)."""
    counts: dict[tuple[int, int, int], int] = {}
    for line in _log_lines(run_dir):
        m = _COMM.search(line)
        if m:
            key = (int(m.group(3)), int(m.group(4)), int(m.group(5)))
            counts[key] = counts.get(key, 0) + 1
    return [{"nRanks": r, "nNodes": n, "localRanks": lr, "rank_lines": c} for (r, n, lr), c in sorted(counts.items())]


# ------------------------------------------------------------------------------------------ a worker
def _worker(payload: str) -> None:
    """What torchrun starts in each agent: output to ``logs/rank<N>.log``, then the experiment in place. The
    worker dies with its agent (torch elastic starts workers in their own session, so killing the agent's
    session would not reach them): a rank that ignores SIGTERM cannot outlive a stopped run."""
    die_with_parent(os.getppid())
    run_dir = Path(os.environ[RUN_DIR_VAR])
    log = open(log_path(run_dir, int(os.environ["RANK"])), "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    fn, cfg, experiment = pickle.loads(Path(payload).read_bytes())
    from .inplace import launch_in_place

    code = 0
    try:
        launch_in_place(fn, cfg, experiment)
    except BaseException:  # noqa: BLE001 - rank 0 wrote meta/error.txt; the traceback goes to this rank's log
        import traceback

        log_path(run_dir, int(os.environ["RANK"])).with_suffix(".error").write_text(traceback.format_exc())
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter-exit destructors (seen to hang after NCCL work; see kit.launch.rank)


if __name__ == "__main__":
    _worker(sys.argv[1])
