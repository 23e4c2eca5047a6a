"""The no-NCCL control of the mechanism: does the growing gap need NCCL, or only the graph structure NCCL's
mixing support builds?

A standalone probe (``recorded/probes/graph_gaps-nonccl-h200/gg_nonccl.py``, run once on one H200 -- it needs one GPU and
no communicator) captures N layers of ``tanh(x @ W)`` (fp32, TF32 off) where, after each GEMM, a side stream
runs one tiny kernel (the stand-in for the collective) and is joined back. In the ``ext`` graphs the side stream
also records *one shared* external event after every tiny kernel -- what ``ncclStrongStreamRelease`` adds with
``GRAPH_MIXING_SUPPORT`` on (``cudaGraphAddEventRecordNode`` of ``serialEvent``, NCCL ``src/misc/strongstream.cc``)
-- and in the ``plain`` graphs it does not. Nothing else differs. Its profiled replays are committed beside the
script; :func:`probe_table` reads them with :mod:`kit.traces` and states the GPU's idle time per layer along the
replay.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ... import traces
from ...results import RECORDED_ROOT

# the one-H200 probe of 2026-11-23
PROBE = RECORDED_ROOT / "probes" / "graph_gaps-nonccl-h200"
# the same probe and its bisection on one H100: <hw>/{probe,bisect,stream}/
TORCH = RECORDED_ROOT / "probes" / "graph_gaps-torch"
_NAME = re.compile(r"h(?P<hidden>\d+)_n(?P<layers>\d+)_(?P<graph>ext|plain)\.json\.gz$")
TINY = "CUDAFunctorOnSelf_add"  # the side stream's kernel: one layer ends with it


def idle_by_layer(path) -> "pd.Series":
    """Idle GPU time (us) per layer of one replay: each kernel's and memset's gap (:func:`kit.traces.gaps`: its
    start minus the latest end of any earlier activity), summed per layer (a layer ends with the tiny kernel).
    Memsets get a gap row here (kit.traces.gaps gives kernels only): cuBLASLt's fp32 GEMM starts with one, and
    the idle time before it is the layer's gap."""
    import numpy as np
    import pandas as pd

    ev = traces.load_trace(path, cpu="none").gpu
    ev = ev.assign(cat=ev["cat"].astype(str).replace({"gpu_memset": "kernel"}))
    g = traces.gaps(ev)
    tiny = g["name"].astype(str).str.contains(TINY).to_numpy()
    layer = np.cumsum(np.r_[0, tiny[:-1]])
    return pd.Series(np.bincount(layer, weights=g["gap_us"].to_numpy()), name="idle_us")


def probe_table(_runs=None, probe: str | Path = PROBE, quarters: int = 4) -> "pd.DataFrame":
    """Per probe graph (hidden, N, ext/plain): replay time per layer (CUDA events, median of 5), the idle time of
    the profiled replay, and the idle per layer in each quarter of the replay. Empty without the probe."""
    import numpy as np
    import pandas as pd

    probe = Path(probe)
    timed = json.loads((probe / "nonccl.json").read_text()) if (probe / "nonccl.json").exists() else {}
    rows = []
    for f in sorted(probe.glob("*.json.gz")):
        m = _NAME.search(f.name)
        if not m:
            continue
        per = idle_by_layer(f)
        key = f.name[: -len(".json.gz")]
        row = dict(hidden=int(m["hidden"]), layers=int(m["layers"]), graph=m["graph"],
                   replay_per_layer_us=timed.get(key, {}).get("per_layer_us", np.nan), idle_ms=per.sum() / 1e3)
        for i, q in enumerate(np.array_split(per.to_numpy()[1:], quarters)):
            row[f"idle_per_layer_q{i + 1}_us"] = float(q.mean())
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["hidden", "layers", "graph"]).reset_index(drop=True) if rows else pd.DataFrame()


def torch_table(_runs=None, root: str | Path = TORCH, quarters: int = 4) -> "pd.DataFrame":
    """The PyTorch probe re-run and bisected (``<root>/<hw>/{probe,bisect,stream}/``): per profiled replay its
    factors (hidden, N, BLAS library, TF32, the stream it was replayed into, ext/plain), the time per layer of
    the timed replays (CUDA events, median of 5), the profiled replay's span per layer and idle per layer in each
    quarter (:func:`idle_by_layer`). Empty without the folders."""
    import numpy as np
    import pandas as pd

    rows = []
    for d in sorted(Path(root).glob("*/*")):
        timed = {}
        for j in d.glob("*.json"):
            timed.update(json.loads(j.read_text()))
        for f in sorted(d.glob("*.json.gz")):
            key = f.name[: -len(".json.gz")]
            m = _NAME.search(f.name)
            t = timed.get(key, {})
            row = dict(hw=d.parent.name, probe=d.name, key=key, hidden=int(m["hidden"]) if m else 2048,
                       layers=int(m["layers"]) if m else 160, graph="ext" if key.endswith("ext") else "plain",
                       blas=t.get("lib", "cublas" if d.name != "probe" else "default"),
                       tf32=bool(t.get("tf32", False)), stream=t.get("stream", "default"),
                       replay_per_layer_us=t.get("per_layer_us", np.nan))
            ev = traces.load_trace(f, cpu="none").gpu
            row["span_per_layer_us"] = float(ev["end"].max() - ev["ts"].min()) / row["layers"]
            per = idle_by_layer(f)
            for i, q in enumerate(np.array_split(per.to_numpy()[1:], quarters)):
                row[f"idle_per_layer_q{i + 1}_us"] = float(q.mean())
            rows.append(row)
    return pd.DataFrame(rows)
