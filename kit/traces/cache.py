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
and read with pyarrow alone, from and back to the builder's :class:`~kit.traces.columns.Columns` -- pandas is
not imported (its import costs more CPU than the write): ``name``/``cat`` stay dictionary-encoded (categorical
in pandas), numbers keep their widths. Object columns (collective names, process-group ranks, input dims --
lists of varying depth) are stored as their JSON text and decoded on read. The trace header and the key are the
file's schema metadata. Parquet rather than Arrow IPC: compressed (a 100 MB trace's frames are a few MB), and
readable by every dataframe tool.

**On by default, because measured so** (benchmarks/README.md): writing the entry adds about a tenth to a first run
of ``kit trace gaps``, a second run reads it for about a third of the first's CPU; through pandas it was a loss for a
trace analysed once, hence pyarrow's buffers here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from .columns import Columns, _categorical

VERSION = 14
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


def read(path: Path, cpu: str, parser: str) -> tuple[Columns, Columns, dict[str, Any]] | None:
    """``(gpu frame, cpu frame, metadata)`` when an entry with this key exists and reads back whole (the
    frames as :class:`~kit.traces.columns.Columns`, the metadata as :func:`write` was given it); None otherwise
    (a corrupt entry is deleted). Plain frames: the trace layer makes the Trace."""
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


def write(path: Path, cpu: str, parser: str, gpu: Columns, cpu_frame: Columns,
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


# pyarrow imports pandas (0.18 s of CPU) the first time it converts a Python or numpy object (pa.array,
# to_numpy, to_pylist): the arrays are made from and read back as buffers, which it does not.
def _arrow(v: Any, n: int) -> Any:
    """A numpy array (numbers, bools) or a list of str/None as an Arrow array, through its buffers."""
    import numpy as np
    import pyarrow as pa

    if isinstance(v, np.ndarray):
        if v.dtype == bool:
            return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(v, bitorder="little"))])
        v = np.ascontiguousarray(v)
        return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), n, [None, pa.py_buffer(v)])
    enc = [b"" if x is None else x.encode() for x in v]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, enc), dtype=np.int64, count=n), out=offsets[1:])
    valid = np.fromiter((x is not None for x in v), dtype=bool, count=n)
    nulls = n - int(valid.sum())
    bits = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.large_string(), n, [bits, pa.py_buffer(offsets), pa.py_buffer(b"".join(enc))],
                                 null_count=nulls)


def _numpy(chunks: list, dtype: Any) -> "Any":
    """Arrow chunks of numbers or bools (no nulls) as one numpy array, from their buffers."""
    import numpy as np

    out = []
    for ch in chunks:
        buf = ch.buffers()[1]
        if dtype == bool:
            bits = np.frombuffer(buf, dtype=np.uint8)
            out.append(np.unpackbits(bits, count=ch.offset + len(ch), bitorder="little")[ch.offset:].astype(bool))
        else:
            out.append(np.frombuffer(buf, dtype=dtype, count=len(ch), offset=ch.offset * np.dtype(dtype).itemsize))
    return np.concatenate(out) if out else np.zeros(0, dtype=dtype)


def _strings(chunks: list) -> tuple["Any", list[str]]:
    """Arrow chunks of (large) strings, from their buffers: ``(positions of the non-null values, those values)``
    -- the JSON columns are mostly null, and only their values are sliced and decoded."""
    import numpy as np

    where, out, base = [], [], 0
    for ch in chunks:
        n = len(ch)
        bits, offs, data = ch.buffers()[:3]
        wide = np.int64 if str(ch.type) == "large_string" else np.int32
        o = np.frombuffer(offs, dtype=wide, count=n + 1, offset=ch.offset * np.dtype(wide).itemsize)
        if bits is not None and ch.null_count:
            valid = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=ch.offset + n, bitorder="little")
            idx = np.flatnonzero(valid[ch.offset:])
        else:
            idx = np.arange(n)
        raw = data.to_pybytes() if data is not None else b""
        starts, ends = o[idx].tolist(), o[idx + 1].tolist()
        out += [raw[a:b].decode() for a, b in zip(starts, ends)]
        where.append(idx + base)
        base += n
    return (np.concatenate(where) if where else np.zeros(0, dtype=np.int64)), out


def _write_frame(cols: Columns, dest: Path, meta: dict[str, Any]) -> None:
    """One frame's :class:`~kit.traces.columns.Columns` as Parquet, through pyarrow alone and without pandas
    (:func:`_arrow`): categorical columns as dictionary arrays (codes and categories as they are), numpy
    columns as they are, list columns as JSON text."""
    import msgspec
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays, json_cols = {}, []
    enc = msgspec.json.encode
    n = cols.n
    for c in cols.columns:
        v = cols.values[c]
        if c in cols.categories:
            codes = _arrow(np.asarray(v, dtype=np.int32), n)
            arrays[c] = pa.DictionaryArray.from_arrays(codes, _arrow(cols.categories[c], len(cols.categories[c])))
        elif isinstance(v, np.ndarray):
            arrays[c] = _arrow(v, n)
        else:
            json_cols.append(c)
            arrays[c] = _arrow([None if x is None else enc(x).decode() for x in v], n)
    extra = {"json_columns": json_cols, "columns": list(cols.columns), "n": n,
             "dtypes": {c: str(v.dtype) for c, v in cols.values.items() if isinstance(v, np.ndarray)
                        and c not in cols.categories},
             "categories": cols.categories if not n else {}}  # an empty dictionary column keeps no values
    table = pa.Table.from_arrays(list(arrays.values()), names=list(arrays))
    table = table.replace_schema_metadata({b"kit": json.dumps({**meta, **extra}, default=str).encode()})
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, dest)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_frame(src: Path) -> tuple[Columns, dict[str, Any]]:
    """The :class:`~kit.traces.columns.Columns` :func:`_write_frame` stored, exactly (dtypes, codes and their
    categories), and the metadata; without pandas."""
    import msgspec
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.ParquetFile(src).read()  # not read_table: that imports pyarrow.dataset, which imports pandas
    meta = json.loads((table.schema.metadata or {})[b"kit"])
    n = int(meta["n"])
    values: dict[str, Any] = {}
    cats: dict[str, list[str]] = {}
    for c in meta["columns"]:
        chunks = [ch for ch in table.column(c).chunks if len(ch)]
        if c in meta["json_columns"]:
            idx, v = _strings(chunks)
            out: list[Any] = [None] * n
            if v:  # mostly empty: only the events that carry it are decoded, in one call
                for i, x in zip(idx.tolist(), msgspec.json.decode(("[" + ",".join(v) + "]").encode())):
                    out[i] = x
            values[c] = out
        elif c in meta["dtypes"]:
            values[c] = _numpy(chunks, np.dtype(meta["dtypes"][c]).type if meta["dtypes"][c] != "bool" else bool).copy()
        elif not n:
            values[c], cats[c] = np.zeros(0, dtype=np.int32), list(meta["categories"].get(c, []))
        else:
            d = _strings([chunks[0].dictionary])[1]
            if all(_strings([ch.dictionary])[1] == d for ch in chunks[1:]):
                values[c] = _numpy([ch.indices for ch in chunks], np.int32).astype(np.int32)
                cats[c] = d
            else:  # row groups with their own dictionaries: back to the values, coded again as the builder does
                values[c], cats[c] = _categorical([d_[i] for ch in chunks for d_ in [_strings([ch.dictionary])[1]]
                                                   for i in _numpy([ch.indices], np.int32).tolist()])
    return Columns(n, tuple(meta["columns"]), values, cats), meta
