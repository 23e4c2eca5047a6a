"""A cache of parsed traces: the frames of a trace, in Parquet, so re-running a notebook cell does not re-parse.

**Where.** ``.kitcache/`` beside the trace (a run directory keeps its own cache; delete it any time), or, when
that folder cannot be written (a read-only share, a recorded run owned by someone else), under
``$XDG_CACHE_HOME/kit/traces`` (``~/.cache/kit/traces``). ``KIT_TRACE_CACHE=0`` turns it off;
``KIT_TRACE_CACHE=/some/dir`` puts every cache there (one subfolder per trace folder). ``load_trace(..., cache=False)`` and the CLI's
``--no-cache`` bypass it for one call.

**When it is trusted.** Each entry records a key: the kit's trace-layer version (:data:`VERSION`: bump it when
frames change), the CPU mode, the adapters in force (their declared keys), and the trace file's size, mtime (ns) and a BLAKE2 hash of
its first and last MiB. A key that differs -- the file was rewritten, appended, touched, or the kit changed --
means the entry is rebuilt; an entry that cannot be read (truncated, corrupt, another pyarrow) is deleted and
rebuilt: never trusted. Hashing the whole file would cost ~0.1 s per 100 MB, half the reopen budget; size +
mtime + the file's two ends catches every rewrite a profiler or copy makes (the same trade ``ccache``'s direct
mode and ``make`` make).

**Format.** One Parquet file per frame (``<trace name>.<cpu mode>.gpu.parquet`` / ``.cpu.parquet``), written
with pyarrow; ``name``/``cat`` stay dictionary-encoded (categorical in pandas), numbers keep their widths.
Object columns (collective names, process-group ranks, input dims -- lists of varying depth) are stored as
their JSON text and decoded on read. The trace header and the key are the file's schema metadata. Parquet
rather than Arrow IPC: compressed (a 100 MB trace's frames are a few MB), and readable by every dataframe tool.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

VERSION = 3
"""bump when the frames built from a trace change (columns, dtypes, what is kept)"""
_DIR = ".kitcache"
_EDGE = 1 << 20


def enabled(flag: bool | None = None) -> bool:
    """Whether a call uses the cache: ``flag`` when given, else on unless ``KIT_TRACE_CACHE`` is 0/off/no."""
    if flag is False or not _have_pyarrow():
        return False
    if flag:
        return True
    return os.environ.get("KIT_TRACE_CACHE", "1").strip().lower() not in ("0", "off", "no", "false")


@lru_cache(maxsize=1)
def _have_pyarrow() -> bool:
    """pyarrow is a dependency of kit; on a node where kit runs from a checkout without it (PYTHONPATH only),
    traces are parsed every time instead of failing."""
    return importlib.util.find_spec("pyarrow") is not None


def key(path: Path, cpu: str, parser: str) -> str:
    """The entry's key: :data:`VERSION`, the CPU mode, ``parser`` (what the caller parses with: the trace
    layer passes a digest of the adapters in force, so a user's added adapter invalidates old entries), the
    file's size, mtime and the hash of its two ends."""
    st = path.stat()
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if st.st_size > 2 * _EDGE:
            f.seek(-_EDGE, os.SEEK_END)
            h.update(f.read(_EDGE))
    return f"v{VERSION}:{cpu}:{parser}:{st.st_size}:{st.st_mtime_ns}:{h.hexdigest()}"


def _dirs(path: Path) -> list[Path]:
    # outside the trace's folder, entries are kept per folder: rank0.json.gz of two jobs must not evict each other
    where = hashlib.blake2b(str(path.resolve().parent).encode(), digest_size=8).hexdigest()
    env = os.environ.get("KIT_TRACE_CACHE", "")
    if env and env not in ("1", "on", "yes", "true"):
        return [Path(env).expanduser() / where]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kit" / "traces"
    return [path.parent / _DIR, home / where]


def _files(d: Path, path: Path, cpu: str) -> tuple[Path, Path]:
    return d / f"{path.name}.{cpu}.gpu.parquet", d / f"{path.name}.{cpu}.cpu.parquet"


def entry(path: Path, cpu: str = "default") -> Path | None:
    """The existing cache file of a trace's GPU frame (None when there is none) -- for tests and ``ls``."""
    for d in _dirs(path):
        g, _ = _files(d, path, cpu)
        if g.exists():
            return g
    return None


def read(path: Path, cpu: str, parser: str) -> "tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]] | None":
    """``(gpu frame, cpu frame, metadata)`` when an entry with this key exists and reads back whole (the
    metadata as :func:`write` was given it); None otherwise (a corrupt entry is deleted). Plain frames: the
    trace layer makes the Trace."""
    if not path.is_file():
        return None
    try:
        k = key(path, cpu, parser)
    except OSError:
        return None
    for d in _dirs(path):
        g, c = _files(d, path, cpu)
        if not g.exists() or not c.exists():
            continue
        try:
            gpu, meta = _read_frame(g)
            if meta.get("key") != k:
                continue
            cpu_df, meta_c = _read_frame(c)
            if meta_c.get("key") != k:
                continue
            return gpu, cpu_df, meta
        except Exception:  # corrupt, truncated, written by an incompatible pyarrow: rebuild
            for f in (g, c):
                f.unlink(missing_ok=True)
    return None


def write(path: Path, cpu: str, parser: str, gpu: "pd.DataFrame", cpu_frame: "pd.DataFrame",
          meta: dict[str, Any]) -> Path | None:
    """Store a trace's two frames with ``meta`` (JSON-able: what :func:`read` gives back); returns the GPU
    frame's file, or None when no cache folder is writable (the trace was parsed; only the next open is
    slower)."""
    try:
        k = key(path, cpu, parser)
    except OSError:
        return None
    meta = {**meta, "key": k}
    for d in _dirs(path):
        try:
            d.mkdir(parents=True, exist_ok=True)
            g, c = _files(d, path, cpu)
            _write_frame(cpu_frame, c, meta)
            _write_frame(gpu, g, meta)
            return g
        except OSError:
            continue
    return None


def _write_frame(df: "pd.DataFrame", dest: Path, meta: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = df.copy()
    json_cols = [c for c in d.columns if d[c].dtype == object]
    for c in json_cols:
        d[c] = [None if v is None or (isinstance(v, float) and v != v) else json.dumps(v) for v in d[c]]
    table = pa.Table.from_pandas(d, preserve_index=False)
    m = dict(table.schema.metadata or {})
    m[b"kit"] = json.dumps({**meta, "json_columns": json_cols}, default=str).encode()
    table = table.replace_schema_metadata(m)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, dest)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_frame(src: Path) -> tuple["pd.DataFrame", dict[str, Any]]:
    import msgspec
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    from .columns import CATEGORY_COLUMNS

    table = pq.read_table(src)
    meta = json.loads((table.schema.metadata or {})[b"kit"])
    df = table.to_pandas()
    for c in meta.get("json_columns", []):
        v = df[c].to_numpy(dtype=object)
        mask = df[c].notna().to_numpy()
        out = np.full(len(v), None, dtype=object)
        if mask.any():  # mostly empty: only the events that carry it are decoded
            for i, x in zip(np.flatnonzero(mask), msgspec.json.decode(b"[" + ",".join(v[mask]).encode() + b"]")):
                out[i] = x  # one by one: values may be lists, which numpy would broadcast
        df[c] = pd.Series(out, index=df.index, dtype=object)
    for c in CATEGORY_COLUMNS:  # an empty dictionary column comes back as plain strings
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = pd.Categorical(df[c].tolist())
    return df, meta
