"""The Flight Recorder: every rank's ring buffer of its collectives (sequence number, op, sizes, state), and
lining the buffers of all ranks up to name the rank a hang is waiting for.

Enabled by ``TORCH_FR_BUFFER_SIZE`` (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``) > 0 in the environment before
the process group exists. :func:`dump_flight_recorder` reads this process's buffer, :func:`fr_entries` turns it
into rows, :func:`fr_mismatches` lines up the rows of all ranks per (process group, sequence number) and
:func:`fr_statements` says what is wrong in words; :func:`load_fr_dumps` reads the JSON dumps of a job's ranks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

MISMATCH_COLUMNS = ["pg_name", "seq", "ops", "present", "missing", "states", "problem"]


def dump_flight_recorder() -> dict[str, Any]:
    """This process's Flight Recorder buffer. Works for NCCL and, in recent PyTorch, gloo."""
    import pickle

    import torch._C._distributed_c10d as c10d

    # NCCL process groups keep their own recorder (_dump_nccl_trace); gloo's is the generic one
    # (_dump_fr_trace), which on a CUDA build of torch 2.11 is empty for NCCL jobs: keep the fuller dump.
    dumps = []
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is not None:
            try:
                dumps.append(pickle.loads(fn()))
            except Exception:
                continue
    if not dumps:
        raise RuntimeError("this PyTorch build exposes no Flight Recorder dump (_dump_nccl_trace / _dump_fr_trace)")
    return max(dumps, key=lambda d: len(d.get("entries", [])))


def fr_entries(dump: dict[str, Any], rank: int) -> "pd.DataFrame":
    import pandas as pd

    rows = []
    for e in dump.get("entries", []):
        pg = e.get("process_group") or ("", "")
        rows.append({"rank": rank, "pg_name": pg[0], "pg_desc": pg[1], "seq": e.get("collective_seq_id"),
                     "p2p_seq": e.get("p2p_seq_id"), "is_p2p": e.get("is_p2p"), "op": e.get("profiling_name"),
                     "state": e.get("state"), "retired": e.get("retired"),
                     "input_sizes": json.dumps(e.get("input_sizes")), "output_sizes": json.dumps(e.get("output_sizes")),
                     "dtype": (e.get("input_dtypes") or [None])[0], "duration_ms": e.get("duration_ms"),
                     "time_created_ns": e.get("time_created_ns")})
    return pd.DataFrame(rows)


FR_RANK = re.compile(r"rank[_-]?(\d+)")


def load_fr_dumps(paths: "Iterable[str | Path]") -> "pd.DataFrame | None":
    """The rows of Flight Recorder dumps (:func:`fr_entries`), one JSON dump per rank (the rank from the file
    name, ``fr_run_rank0.json``, else the dump's order). A missing or unreadable file, or a pickled dump (never
    unpickled here: a pickle can run code), is a TraceError naming it."""
    import pandas as pd

    from .parse import TraceError

    frames, bad = [], []
    for i, p in enumerate(Path(x) for x in paths):
        try:
            raw = p.read_bytes()
        except OSError as e:
            bad.append(f"{p}: cannot read ({e.strerror or e})")
            continue
        if raw[:2] == b"\x1f\x8b":  # gzipped (fr_rank0.json.gz)
            import gzip

            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as e:
                bad.append(f"{p}: a truncated or corrupt gzip file ({e})")
                continue
        if raw[:1] == b"\x80":
            bad.append(f"{p}: a pickled Flight Recorder dump; give the JSON one (TORCH_FR_DUMP as JSON, or "
                       f"json.dump(pickle.load(f)) where you trust the file)")
            continue
        try:
            dump = json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError as e:
            bad.append(f"{p}: not JSON ({e})")
            continue
        if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
            bad.append(f"{p}: not a Flight Recorder dump (no 'entries' list)")
            continue
        m = FR_RANK.search(p.name)
        frames.append(fr_entries(dump, int(m.group(1)) if m else int(dump.get("rank", i))))
    if bad:
        raise TraceError("\n".join(bad))
    return pd.concat(frames, ignore_index=True) if frames else None


def _truth(x) -> bool:
    if isinstance(x, str):
        return x.strip().lower() in ("true", "1")
    return bool(x) and x == x  # NaN (a row written without the field) is not p2p


def _pg(v) -> str:
    return str(int(v)) if isinstance(v, float) and v == v and v.is_integer() else str(v)


def fr_mismatches(df: "pd.DataFrame") -> "pd.DataFrame":
    """Per (process group, sequence number) of collectives: which ranks recorded it and which did not. A rank
    missing from a sequence number that others reached is the one that never issued that collective (the
    one a hang is waiting for); differing ops at one sequence number are a desync. Rows of ``fr_entries``
    (or the ``kind=fr`` rows of a run); empty in, empty out with :data:`MISMATCH_COLUMNS`."""
    import pandas as pd

    need = {"rank", "pg_name", "seq", "op", "state"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame(columns=MISMATCH_COLUMNS)
    p2p = df["is_p2p"].map(_truth) if "is_p2p" in df.columns else pd.Series(False, index=df.index)
    c = df[~p2p.astype(bool) & df["seq"].notna()]
    c = c.assign(pg_name=c["pg_name"].map(_pg))  # rows read back from CSV: 0.0 -> '0'
    all_ranks = sorted(int(r) for r in df["rank"].unique())
    out = []
    for (pg, seq), g in c.groupby(["pg_name", "seq"]):
        present = sorted(int(r) for r in g["rank"].unique())
        ops = sorted(set(map(str, g["op"])))
        out.append({"pg_name": pg, "seq": int(seq), "ops": ", ".join(ops), "present": present,
                    "missing": [r for r in all_ranks if r not in present],
                    "states": ", ".join(f"{int(r)}:{s}" for r, s in zip(g["rank"], g["state"])),
                    "problem": "missing rank(s)" if len(present) < len(all_ranks) else ("op mismatch" if len(ops) > 1 else "")})
    return pd.DataFrame(out, columns=MISMATCH_COLUMNS)


def fr_statements(mm: "pd.DataFrame") -> list[str]:
    """One sentence per problem of :func:`fr_mismatches`: 'seq 4 (nccl:all_reduce): reached by rank(s) [0],
    never issued by rank(s) [1]'."""
    out = []
    for r in mm[mm["problem"] != ""].itertuples() if len(mm) else ():
        if r.problem == "missing rank(s)":
            out.append(f"seq {r.seq} ({r.ops}): reached by rank(s) {list(r.present)}, never issued by rank(s) "
                       f"{list(r.missing)}")
        else:
            out.append(f"seq {r.seq}: ranks issued different collectives ({r.ops}): a desync")
    return out
