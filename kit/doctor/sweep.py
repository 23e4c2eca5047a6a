"""The attainable bandwidth of a machine, from a collectives sweep of it: ``load_sweep(path)`` and ``attainable``.

``low_busbw`` compares a job's traced busbw with what the same machine reaches at the same size. Two inputs:

* a **kit collectives run** (``kit run collectives`` / ``kit exp collectives``: a run directory with
  ``rows.csv[.gz]``, or a folder of such runs) -- read with :func:`kit.results.load` and summarised with
  :func:`kit.sweeps.summarize` (the per-sample conventions live there: kernel durations are the minimum over
  ranks, eager/graph the maximum). Per (collective, bytes) one method is kept, in the order
  ``kernel`` (NCCL kernel durations from the profiler: the same measurement as a trace's kernels), then
  ``nccl-tests`` (out-of-place), ``nccl-tests-graph``, ``graph``, ``eager``;
* **nccl-tests output** (``all_reduce_perf ... > out.txt``; one file may hold several tests, as the kit's
  ``nccl-tests.log`` does): its table is parsed by :func:`kit.sweeps.parse_nccl_tests`, out-of-place busbw; the
  collective comes from the ``# Collective test starting: <binary>`` line (else the file name,
  ``all_reduce_perf.txt``).

The result is a frame ``collective, bytes, busbw_gbps, source`` (``source``: the method, or ``nccl-tests``).
Between the sweep's sizes busbw is interpolated on log-log axes (:func:`attainable`); outside them there is no
answer (below the smallest size busbw falls with the size, above the largest it may still rise).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..collective_ops import COLLECTIVES

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SWEEP_COLUMNS = ["collective", "bytes", "busbw_gbps", "source"]
METHOD_ORDER = ("kernel", "nccl-tests", "nccl-tests-graph", "graph", "eager")
"""which measurement of a kit sweep stands for the machine at a size, first present wins"""

_BINARY = {c.nccl_tests: c.name for c in COLLECTIVES.values() if c.nccl_tests and c.name != "send"}
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)", re.MULTILINE)


class SweepError(ValueError):
    """The sweep given cannot be read: one line naming the path and what is wrong."""


def load_sweep(path: str | Path) -> "pd.DataFrame":
    """``collective, bytes, busbw_gbps, source`` of a kit collectives run directory or an nccl-tests output file
    (see the module docstring). Raises :class:`SweepError` for a missing path, a directory without a collectives
    run, or a file without an nccl-tests table."""
    p = Path(path)
    if not p.exists():
        raise SweepError(f"{p}: no such file or directory (give a kit collectives run directory or nccl-tests output)")
    df = _from_run(p) if p.is_dir() else _from_nccl_tests(p)
    df = df[(df["bytes"] > 0) & (df["busbw_gbps"] > 0)]
    if df.empty:
        raise SweepError(f"{p}: the sweep has no positive busbw at any size")
    return df.sort_values(["collective", "bytes"]).reset_index(drop=True)[SWEEP_COLUMNS]


def _from_run(p: Path) -> "pd.DataFrame":
    import pandas as pd

    from .. import results
    from ..sweeps import summarize

    dirs = [d for d in results.run_dirs(p) if results.read_meta(d).get("experiment") in (None, "collectives")]
    if not dirs:
        raise SweepError(f"{p}: no kit collectives run at or below it (a run directory holds meta.json and rows.csv)")
    gpus = {((results.read_meta(d).get("sysinfo") or {}).get("gpus") or [{}])[0].get("name") for d in dirs} - {None}
    if len(gpus) > 1:
        raise SweepError(f"{p}: collectives runs of several GPU models ({', '.join(sorted(gpus))}): give the run "
                         f"directory of the machine the job ran on")
    try:
        rows = results.load(*dirs)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise SweepError(f"{p}: the run's rows cannot be read ({type(e).__name__}: {e})") from None
    need = {"collective", "bytes", "method", "time_us"}
    if rows.empty or not need <= set(rows.columns):
        missing = sorted(need - set(rows.columns)) if not rows.empty else ["rows"]
        raise SweepError(f"{p}: not a collectives sweep (its rows lack {', '.join(missing)})")
    s = summarize(rows)
    s = s[s["method"].isin(METHOD_ORDER) & s["busbw_gbps"].notna()]
    if s.empty:
        raise SweepError(f"{p}: the collectives run has no timed sizes (did it fail? see its error.txt)")
    s = s.assign(rank_=s["method"].map({m: i for i, m in enumerate(METHOD_ORDER)}))
    # several runs (or labels) in the folder: the best of them at each size and method is what the machine does
    s = s.groupby(["collective", "bytes", "method", "rank_"], as_index=False)["busbw_gbps"].max()
    s = s.sort_values("rank_").drop_duplicates(["collective", "bytes"], keep="first")
    return pd.DataFrame({"collective": s["collective"].astype(str), "bytes": s["bytes"].astype("int64"),
                         "busbw_gbps": s["busbw_gbps"].astype(float), "source": s["method"].astype(str)})


def _from_nccl_tests(p: Path) -> "pd.DataFrame":
    import pandas as pd

    from ..sweeps import parse_nccl_tests

    try:
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{p}: not nccl-tests output ({type(e).__name__})") from None
    starts = list(_STARTING.finditer(text))
    if starts:  # one or several tests, each from its 'Collective test starting' line to the next
        parts = [(m.group(1), text[m.start():(starts[i + 1].start() if i + 1 < len(starts) else len(text))])
                 for i, m in enumerate(starts)]
    else:
        parts = [(p.name, text)]
    if not any(parse_nccl_tests(chunk, "?") for _, chunk in parts):
        raise SweepError(f"{p}: no nccl-tests table in the file (expected lines of size, count, type, redop, "
                         f"root, time, algbw, busbw, ...)")
    rows = []
    for binary, chunk in parts:
        coll = next((c for b, c in _BINARY.items() if str(binary).startswith(b)), None)
        if coll is None:
            raise SweepError(f"{p}: cannot tell which collective {binary!r} measured (expected an nccl-tests "
                             f"binary: {', '.join(sorted(_BINARY))})")
        rows += [r for r in parse_nccl_tests(chunk, coll) if r["placement"] == "out-of-place"]
    df = pd.DataFrame(rows)
    df = df.groupby(["collective", "bytes"], as_index=False)["busbw_gbps"].max()
    return df.assign(source="nccl-tests")


def attainable(sweep: "pd.DataFrame", collective: str, nbytes: float) -> float | None:
    """The sweep's busbw (GB/s) of ``collective`` at ``nbytes``, interpolated on log-log axes between its two
    nearest sizes; None when the sweep lacks the collective or the size is outside its range."""
    import numpy as np

    if sweep is None or not nbytes or nbytes <= 0:
        return None
    q = sweep[sweep["collective"] == collective].sort_values("bytes")
    if q.empty:
        return None
    b = q["bytes"].to_numpy(dtype=float)
    if not b[0] <= nbytes <= b[-1]:
        return None
    bw = q["busbw_gbps"].to_numpy(dtype=float)
    return float(np.exp(np.interp(np.log(nbytes), np.log(b), np.log(bw))))
