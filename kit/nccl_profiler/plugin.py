"""Build NCCL's example profiler plugin from an NCCL source tree, into a cache directory.

NCCL (>= 2.23) loads a *profiler plugin* -- a shared library named by ``NCCL_PROFILER_PLUGIN`` -- and calls it
for its own events: the group and collective API calls, the kernel launch, each collective with the algorithm,
protocol and channel count NCCL chose, each channel's kernel with GPU clock stamps, and the proxy thread's
operations and steps when a network transport is used (``ext-profiler/README.md`` of NCCL). NCCL ships an
example plugin (``ext-profiler/example``) that keeps the last events in pools and writes them, when a
communicator is destroyed, as a Chrome trace of async events (one file per communicator and rank).

The kit commits no NCCL code: :func:`build` takes an NCCL checkout (or a git directory of one and a tag: the
two folders it needs, ``ext-profiler/example`` and ``makefiles``, are exported into the cache) and builds the
example with the node's own C++ compiler, the same way the kit uses nccl-tests. Match the checkout to the
NCCL your torch loads (``torch.cuda.nccl.version()``): the plugin's interface version is what that NCCL asks
for first (2.28 asks for v5, then v4 ... v1, ``src/plugin/profiler.cc``).

The result is recorded in ``<out>/plugin.json`` (:class:`Plugin`): the library's path, the interface version
it exports (the highest ``ncclProfiler_v<N>`` symbol), the NCCL version of the source, the compiler. A run
finds it there (:func:`find`), sysinfo reports it, the converter checks the interface version.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import tarfile
import io
import time
from dataclasses import asdict, dataclass
from pathlib import Path

EXAMPLE = "ext-profiler/example"
LIBRARY = "libnccl-profiler-example.so"
DEFAULT_DIR = ".nccl-profiler"
"""the cache directory when none is given (git-ignored in this repository); ``$KIT_NCCL_PROFILER_DIR`` overrides"""


class PluginError(Exception):
    """A plugin that cannot be built or found: one line saying why and what to do."""


@dataclass
class Plugin:
    path: str
    """the built shared library (absolute)"""
    interface: int
    """the profiler-plugin interface version the library exports (``ncclProfiler_v<interface>``)"""
    nccl_version: str
    """the NCCL version of the source tree it was built from (``makefiles/version.mk``)"""
    name: str = "example"
    source: str = ""
    compiler: str = ""
    built_at: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def cache_dir(out: str | os.PathLike | None = None) -> Path:
    return Path(out or os.environ.get("KIT_NCCL_PROFILER_DIR") or DEFAULT_DIR).resolve()


def nccl_version(src: Path) -> str:
    """``major.minor.patch`` from ``makefiles/version.mk`` of an NCCL tree."""
    try:
        text = (src / "makefiles" / "version.mk").read_text()
    except OSError as e:
        raise PluginError(f"{src}: no makefiles/version.mk ({e.strerror}); is this an NCCL source tree?") from None
    v = dict(re.findall(r"^NCCL_(MAJOR|MINOR|PATCH)\s*:=\s*(\d+)", text, re.M))
    if len(v) < 3:
        raise PluginError(f"{src}/makefiles/version.mk: no NCCL_MAJOR/MINOR/PATCH in it")
    return f"{v['MAJOR']}.{v['MINOR']}.{v['PATCH']}"


def export_tree(git_dir: str | os.PathLike, ref: str, dest: str | os.PathLike) -> Path:
    """Export the two folders the example needs (``ext-profiler/example``, ``makefiles``) at ``ref`` of an NCCL
    git directory (a bare clone or a checkout's ``.git``) into ``dest``; returns ``dest``."""
    dest = Path(dest)
    try:
        blob = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", ref, EXAMPLE, "makefiles"],
                              check=True, capture_output=True).stdout
    except FileNotFoundError:
        raise PluginError("git is not installed: export the NCCL tree yourself and pass its folder") from None
    except subprocess.CalledProcessError as e:
        raise PluginError(f"git archive {ref} in {git_dir}: {e.stderr.decode(errors='replace').strip()}") from None
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        tf.extractall(dest, filter="data")
    return dest


def _source(nccl_src: str | os.PathLike, out: Path) -> Path:
    """``DIR`` (a checkout) or ``DIR@REF`` (a git directory and a tag/commit, exported into ``out/src``)."""
    s = str(nccl_src)
    if "@" in s:
        git_dir, ref = s.rsplit("@", 1)
        return export_tree(git_dir, ref, out / "src")
    src = Path(s).resolve()
    if not (src / EXAMPLE / "Makefile").is_file():
        raise PluginError(f"{src}: no {EXAMPLE}/Makefile; pass an NCCL checkout (or GITDIR@TAG, e.g. "
                          f"nccl/.git@v2.28.9-1)")
    return src


def cuda_include() -> str | None:
    """The CUDA headers the example includes (``cuda_runtime.h``): ``$CUDA_HOME``, /usr/local/cuda, or the
    nvidia-cuda-runtime wheel beside torch."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for c in cands:
        if c and (Path(c) / "include" / "cuda_runtime.h").is_file():
            return str(Path(c) / "include")
    try:
        import nvidia.cuda_runtime as cr  # the pip wheel torch depends on

        for p in cr.__path__:
            if (Path(p) / "include" / "cuda_runtime.h").is_file():
                return str(Path(p) / "include")
    except ImportError:
        pass
    return None


def interface_version(lib: str | os.PathLike) -> int:
    """The highest ``ncclProfiler_v<N>`` the library exports (what NCCL looks up first)."""
    try:
        so = ctypes.CDLL(str(lib))
    except OSError as e:
        raise PluginError(f"{lib}: cannot be loaded: {e}") from None
    for v in range(9, 0, -1):
        if hasattr(so, f"ncclProfiler_v{v}"):
            return v
    raise PluginError(f"{lib}: exports no ncclProfiler_v<N> symbol: not an NCCL profiler plugin")


def build(nccl_src: str | os.PathLike, out: str | os.PathLike | None = None, *, cxx: str | None = None) -> Plugin:
    """Build the example plugin of ``nccl_src`` (a checkout, or ``GITDIR@REF``) into ``out`` (default
    :func:`cache_dir`) with the node's compiler (``$CXX``, else g++/c++); write and return ``out/plugin.json``."""
    out = cache_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    src = _source(nccl_src, out)
    version = nccl_version(src)
    inc = cuda_include()
    if inc is None:
        raise PluginError("no CUDA headers (cuda_runtime.h) found: set CUDA_HOME to the CUDA toolkit")
    cxx = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise PluginError("no C++ compiler on this node (set CXX)")
    make = shutil.which("make")
    if not make:
        raise PluginError("make is not installed")
    build_dir = out / "build"
    build_dir.mkdir(exist_ok=True)
    cmd = [make, "-C", str(src / EXAMPLE), f"BUILDDIR={build_dir}", f"CUDA_INC={inc}", f"CXX={cxx}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    (out / "build.log").write_text(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    lib = build_dir / LIBRARY
    if p.returncode or not lib.is_file():
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise PluginError(f"make failed (exit {p.returncode}), see {out / 'build.log'}: " + " | ".join(tail))
    cc = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()
    plugin = Plugin(path=str(lib), interface=interface_version(lib), nccl_version=version, source=str(src),
                    compiler=cc[0] if cc else cxx, built_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    (out / "plugin.json").write_text(json.dumps(plugin.to_json(), indent=1))
    return plugin


def describe(lib: str | os.PathLike) -> Plugin:
    """The :class:`Plugin` of a library path (``NCCL_PROFILER_PLUGIN``): its build record when the library
    was built by :func:`build` (``plugin.json`` one folder up), else what the library itself says."""
    lib = Path(lib).resolve()
    for rec in (lib.parent / "plugin.json", lib.parent.parent / "plugin.json"):
        if rec.is_file():
            try:
                d = json.loads(rec.read_text())
                if Path(d.get("path", "")).resolve() == lib:
                    return Plugin(**{k: d[k] for k in Plugin.__dataclass_fields__ if k in d})
            except (ValueError, TypeError):
                pass
    return Plugin(path=str(lib), interface=interface_version(lib), nccl_version="unknown", name=lib.stem)


def find(path: str | os.PathLike | None = None) -> Plugin:
    """The plugin to load: ``path`` (a ``plugin.json``, its folder, or a library -- then its interface version
    is read from it), else ``$KIT_NCCL_PROFILER_DIR`` or ``.nccl-profiler``. PluginError says how to build one."""
    p = Path(path) if path else cache_dir()
    if p.is_dir():
        p = p / "plugin.json"
    if p.suffix == ".so" and p.is_file():
        return Plugin(path=str(p.resolve()), interface=interface_version(p), nccl_version="unknown", name=p.stem)
    if not p.is_file():
        raise PluginError(f"no NCCL profiler plugin at {p}: build one with "
                          f"`kit nccl-profiler build --nccl-src NCCL_CHECKOUT` on this node")
    d = json.loads(p.read_text())
    plugin = Plugin(**{k: d[k] for k in Plugin.__dataclass_fields__ if k in d})
    if not Path(plugin.path).is_file():
        raise PluginError(f"{p} names {plugin.path}, which does not exist: build the plugin again")
    return plugin
