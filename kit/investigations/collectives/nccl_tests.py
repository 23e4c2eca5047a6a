"""nccl-tests beside the sweep: find the ``*_perf`` binaries, run them at the sweep's sizes (plain and with
``-G``, its CUDA-graph mode) once the ranks are done, and parse their table into rows ``kind="nccl-tests"``."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

from ...collective_ops import SWEEPABLE, nccl_tests_binary
from ...sweeps import parse_nccl_tests
from .sweep import Config

_NCCL_TESTS_DTYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
                     "int32": "int32", "int8": "int8"}


def find_nccl_tests(setting: str) -> dict[str, str]:
    """Map collective -> nccl-tests binary. ``setting``: 'auto' (PATH, $NCCL_TESTS_DIR), a directory, a binary."""
    if not setting:
        return {}
    dirs: list[str] = []
    if setting == "auto":
        if os.environ.get("NCCL_TESTS_DIR"):
            dirs.append(os.environ["NCCL_TESTS_DIR"])
    elif os.path.isfile(setting):
        dirs.append(os.path.dirname(setting) or ".")
    else:
        dirs.append(setting)
    found = {}
    for coll in SWEEPABLE:
        exe = nccl_tests_binary(coll)
        cands = [os.path.join(d, sub, exe) for d in dirs for sub in ("", "build")]
        hit = next((c for c in cands if os.access(c, os.X_OK)), None)
        if hit is None and setting == "auto":
            hit = shutil.which(exe)
        if hit:
            found[coll] = hit
    return found


_VERSIONS = re.compile(r"nccl-headers=(\d+)\s+nccl-library=(\d+)")


def nccl_code_version(code: int | str) -> str:
    """NCCL's version code as nccl-tests prints it (``NCCL_VERSION_CODE``: 22809) -> '2.28.9'."""
    c = int(code)
    return f"{c // 10000}.{c % 10000 // 100}.{c % 100}"


def nccl_versions(text: str) -> dict[str, str]:
    """The NCCL nccl-tests was compiled against and the one it loaded, from its header line
    (``# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22803``); {} when absent."""
    m = _VERSIONS.search(text)
    return {"nccl_headers": nccl_code_version(m.group(1)), "nccl_library": nccl_code_version(m.group(2))} if m else {}


def torch_nccl_libdir() -> str | None:
    """The directory of the NCCL library PyTorch's wheel ships (the ``nvidia-nccl`` package), if any. nccl-tests
    links ``libnccl.so.2`` by name; without this first on ``LD_LIBRARY_PATH`` the loader may pick a system NCCL
    of another version (on the 2x H200 image: 2.28.3 in /lib/x86_64-linux-gnu beside torch's 2.28.9)."""
    try:
        import nvidia.nccl as pkg
    except ImportError:
        return None
    for root in getattr(pkg, "__path__", []):
        lib = os.path.join(root, "lib")
        if glob.glob(os.path.join(lib, "libnccl.so*")):
            return lib
    return None


def reference_env(cfg_env: dict[str, str]) -> dict[str, str]:
    """The environment nccl-tests runs in: this process's, the run's ``env``, and torch's NCCL library first on
    ``LD_LIBRARY_PATH``, so the reference uses the NCCL the sweep used (its log's header line says which it
    loaded: :func:`nccl_versions`)."""
    env = {**os.environ, **cfg_env}
    lib = torch_nccl_libdir()
    if lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([lib, *[p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]])
    return env


def run_nccl_tests(binaries: dict[str, str], cfg: Config, ngpus: int, timeout_s: float = 600,
                   launcher: list[str] | None = None, world: int | None = None) -> tuple[list[dict], list[str]]:
    """Run each binary over the configured sizes on ``ngpus`` GPUs per process: one process (``-g ngpus``), or
    under ``launcher`` (``mpirun ...``: :func:`mpi_launcher`) with ``world`` ranks in all.

    Time: nccl-tests warms up ``-w`` calls at *every* size and then times ``-n`` calls out of place and ``-n``
    in place, so 1 KiB-1 GiB with ``-w 20 -n 15`` moves about (20 + 2 x 15) x 2 GiB = 100 GiB per binary: ~0.5 s
    over NVLink, ~27 s through NCCL's socket transport at ~3.8 GB/s (emulated nodes, measured on 2x H200: 1 KiB-
    1 GiB took 32 s plain and 35 s with -G, whole ``mpirun`` included). ``timeout_s`` bounds each binary."""
    rows, logs = [], []
    env = reference_env(cfg.env)
    # as many timed calls as one of our points (iters x repeats); a longer warm-up than ours because each
    # binary is a fresh process whose GPU clocks and NCCL connections start cold
    n, w = cfg.iters * cfg.repeats, max(cfg.warmup, 20)
    for coll in cfg.collectives:
        exe = binaries.get(coll)
        if not exe:
            continue
        base = [exe, "-b", str(cfg.min_bytes), "-e", str(cfg.max_bytes), "-f", "2", "-g", str(ngpus),
                "-w", str(w), "-d", _NCCL_TESTS_DTYPE[cfg.dtype], "-c", "0"]
        for method, extra in (("nccl-tests", ["-n", str(n)]), ("nccl-tests-graph", ["-n", str(cfg.iters), "-G", str(cfg.repeats)])):
            cmd = [*(launcher or []), *base, *extra]
            out, timed_out = _run(cmd, env, timeout_s)
            logs.append(f"$ {' '.join(cmd)}\n{out}" + (f"\n(timed out after {timeout_s:g} s: the sizes above "
                                                      f"finished and are kept)" if timed_out else ""))
            for r in parse_nccl_tests(out, coll):
                r.update(method=method, world_size=world or ngpus, iters=cfg.iters, dtype=cfg.dtype)
                rows.append(r)
    return rows, logs


EMULATED_NODES = ("nccl-tests not run on emulated nodes: built with MPI=0 it drives every rank from one process, "
                  "and NCCL computes one host hash per process (NCCL_HOSTID is read once, getHostHash in "
                  "src/misc/utils.cc), so its ranks are always one host and talk over NVLink; in one process NCCL "
                  "does not fall back to the network either (net.cc canConnect asks ncclTopoCheckNet, which "
                  "rejects a NIC farther from the GPUs than a PCIe switch, as lo is). Two hosts need two processes: "
                  "nccl-tests built with MPI=1 under mpirun, NCCL_HOSTID set per rank")


def _run(cmd: list[str], env: dict, timeout_s: float) -> tuple[str, bool]:
    """Output (stdout and stderr) of ``cmd`` and whether it timed out. It runs in a session of its own: on
    timeout the whole session is killed (mpirun's ranks included) and what it printed so far is kept -- the
    rows of the sizes that finished."""
    import signal

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return out.decode(errors="replace"), False
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or b""
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rest, _ = p.communicate()
        return (partial + (rest or b"")).decode(errors="replace"), True


def is_mpi_build(binary: str) -> bool:
    """Was this nccl-tests binary built with MPI=1 (linked against libmpi)?"""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "libmpi" in out


def mpi_launcher(meta: dict, env: dict[str, str]) -> list[str]:
    """``mpirun`` for an MPI build of nccl-tests on the emulated nodes of ``meta``: one process per rank
    (``-g 1``), rank r getting the ``NCCL_HOSTID`` of its agent (r // ranks per node), as the kit's own ranks
    had, and the network variables of ``env``. nccl-tests picks each process's GPU by its local rank."""
    emu = meta["emulated"]
    host = emu["agents"][0]["NCCL_HOSTID"].rsplit("-kit-node", 1)[0]
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    exported = [a for k in sorted(env) if k.startswith("NCCL_") for a in ("-x", f"{k}={env[k]}")]
    hostid = f'NCCL_HOSTID={host}-kit-node$((OMPI_COMM_WORLD_RANK / {emu["ranks_per_node"]})) exec "$@"'
    return ["mpirun", *root, "-np", str(emu["nodes"] * emu["ranks_per_node"]), "--bind-to", "none", *exported,
            "sh", "-c", hostid, "sh"]


def _record_versions(meta: dict, logs: list[str]) -> None:
    """``meta["nccl_tests"]``: the NCCL nccl-tests loaded (its header line) and whether it is the sweep's."""
    v = nccl_versions("\n".join(logs))
    if v:
        meta["nccl_tests"].update(v)
        torch_nccl = (meta.get("sysinfo") or {}).get("nccl")
        if torch_nccl:
            meta["nccl_tests"]["same_nccl_as_sweep"] = v["nccl_library"] == torch_nccl
            if v["nccl_library"] != torch_nccl:
                meta["warnings"] = [*(meta.get("warnings") or []),
                    f"nccl-tests loaded NCCL {v['nccl_library']}, the sweep ran on NCCL {torch_nccl}: the reference "
                    f"is another library (put torch's NCCL first on LD_LIBRARY_PATH)"]


def after(cfg: Config, run) -> None:
    """Launcher-side step once the ranks are done: nccl-tests at the same sizes, into the same run (on
    emulated nodes a note saying why it cannot run there, :data:`EMULATED_NODES`)."""
    from ... import results

    meta = run.meta
    if meta.get("launcher") == "emulated nodes" and meta.get("backend") == "nccl":
        return _after_emulated(cfg, run)
    if meta.get("backend") != "nccl" or meta.get("mode") != "spawn":
        return
    binaries = find_nccl_tests(cfg.nccl_tests)
    meta["nccl_tests"] = {"binaries": binaries}
    if not binaries:
        return
    rows, logs = run_nccl_tests(binaries, cfg, meta["world_size"])
    (run.dir / "nccl-tests.log").write_text("\n\n".join(logs))
    _record_versions(meta, logs)
    run.add_rows(rows)
    results.write_json(run.dir / "meta.json", meta)


def _after_emulated(cfg: Config, run) -> None:
    """On emulated nodes: an MPI build of nccl-tests under ``mpirun``, every rank with its agent's
    ``NCCL_HOSTID`` and the run's network variables (:func:`mpi_launcher`); else a note row saying why not."""
    from ... import results

    meta = run.meta
    binaries = find_nccl_tests(cfg.nccl_tests)
    usable = {c: b for c, b in binaries.items() if is_mpi_build(b)} if shutil.which("mpirun") else {}
    meta["nccl_tests"] = {"binaries": usable, "launcher": "mpirun" if usable else None}
    if not usable:
        run.add_rows([dict(kind="note", collective=c, bytes=None, method="nccl-tests", note=EMULATED_NODES)
                      for c in cfg.collectives])
    else:
        env = {**meta["emulated"]["network_env"], **cfg.env}
        rows, logs = run_nccl_tests(usable, cfg, 1, launcher=mpi_launcher(meta, env), world=meta["world_size"])
        (run.dir / "nccl-tests.log").write_text("\n\n".join(logs))
        _record_versions(meta, logs)
        run.add_rows(rows)
    results.write_json(run.dir / "meta.json", meta)
