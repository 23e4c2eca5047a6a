"""PyTorch's own CUDA-graph machinery with a collective per layer: ``torch.compile(mode="reduce-overhead")``
(CUDA-graph trees) and ``torch.cuda.make_graphed_callables`` -- which stream their replays land on, and whether
the gap appears.

The probe (``recorded/probes/graph_gaps-compile/compile_probe.py``, run under torchrun on 2 GPUs, one launch per
``NCCL_GRAPH_MIXING_SUPPORT`` setting) writes ``<hw>/mixing<0|1>/rows_rank<r>.jsonl``: ``kind=time`` (every
sample, CUDA events on the caller's stream), ``kind=replays`` (``torch.cuda.CUDAGraph.replay`` calls counted by
the current stream's handle: 0x0 is the legacy default stream), ``kind=warmup`` (the first calls, compilation and
recording included), ``kind=error``. :func:`compile_table` reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ... import stats
from ...results import RECORDED_ROOT

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

PROBE = RECORDED_ROOT / "probes" / "graph_gaps-compile"
BASELINE = {"eager": "eager", "compile": "eager", "compile+stream": "eager", "compile_again": "eager",
            "train_eager": "train_eager", "train_graphed": "train_eager", "train_graphed+stream": "train_eager"}
"""each variant's eager counterpart: the ratio ``over_eager`` divides by its time"""


def probe_rows(root: str | Path = PROBE) -> "pd.DataFrame":
    """Every row of every committed run of the probe, with ``hw`` (the folder) added."""
    import pandas as pd

    out = []
    for f in sorted(Path(root).glob("*/mixing*/rows_rank*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                out.append({"hw": f.parent.parent.name, **json.loads(line)})
    return pd.DataFrame(out)


def compile_table(_runs=None, root: str | Path = PROBE) -> "pd.DataFrame":
    """Per (hw, mixing, variant): time per call (slowest rank per sample; median, p10, p90 over the samples),
    its ratio to the variant's eager counterpart, the replays by stream handle (rank 0), the first calls' time
    (compilation / capture included), and the error of a variant that failed. Empty without the probe's runs."""
    import pandas as pd

    d = probe_rows(root)
    cols = ["hw", "mixing", "variant", "layers", "time_ms_median", "time_ms_p10", "time_ms_p90", "samples",
            "over_eager", "replays_by_stream", "first_calls_s", "error"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    keys = ["hw", "mixing", "variant", "layers"]
    t = d[d["kind"] == "time"]
    s = stats.slowest_rank_stats(t, keys) if not t.empty else pd.DataFrame(columns=keys)
    for q in ("median", "p10", "p90"):
        s[f"time_ms_{q}"] = s.get(f"time_us_{q}", pd.Series(dtype=float)) / 1e3
    s["samples"] = s.get("time_us_n", 0)
    base = s.set_index(["hw", "mixing", "variant"])["time_ms_median"]
    s["over_eager"] = [r.time_ms_median / base.get((r.hw, r.mixing, BASELINE.get(r.variant, "")), float("nan"))
                       for r in s.itertuples()]
    r0 = d[d["rank"] == d["rank"].min()]
    rep = r0[r0["kind"] == "replays"].groupby(keys)["replays_by_stream"].last()
    warm = r0[r0["kind"] == "warmup"].groupby(keys)["seconds"].last()
    s = s.merge(rep.map(_streams).rename("replays_by_stream").reset_index(), on=keys, how="outer")
    s = s.merge(warm.rename("first_calls_s").reset_index(), on=keys, how="left")
    err = d[d["kind"] == "error"]
    if not err.empty:
        e = err.groupby(keys)["error"].first().reset_index()
        s = s.merge(e, on=keys, how="outer")
    for c in cols:
        if c not in s.columns:
            s[c] = None
    order = {v: i for i, v in enumerate(BASELINE)}
    s = s.assign(_o=s["variant"].map(order)).sort_values(["hw", "mixing", "_o"], ascending=[True, False, True])
    return s[cols].reset_index(drop=True)


def _streams(by: dict | None) -> str:
    """``{'0x0': 8}`` -> ``'0x0 (legacy default) x8'``; none: ``'no replay'`` (no CUDA graph was replayed)."""
    if not isinstance(by, dict) or not by:
        return "no replay"
    return ", ".join(f"{h}{' (legacy default)' if h == '0x0' else ''} x{n}" for h, n in by.items())

