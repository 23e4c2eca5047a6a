"""One node (NVLink) beside emulated nodes (NCCL's network transport, :mod:`kit.launch.emulated`): the P2P
tables per regime, a bandwidth figure with both, and the comparison the findings state. Across the nodes
``copy`` and ``ipc`` are refused (rows ``kind=skipped``: :func:`kit.transports.registry.across_nodes`), so
what remains are the transports with ``cross_node``.

Each table is the investigation's own (:mod:`.analysis`) per regime (:func:`kit.regimes.per_regime`).
"""

from __future__ import annotations

import pandas as pd

from ... import plot
from ...contract import Observation
from ... import regimes
from . import analysis as A
from . import pipeline_analysis


def _at_256mib(data) -> pd.DataFrame:
    one, both = A.at_size(data, A.AT, "one"), A.at_size(data, A.AT, "both")
    if one.empty:
        return one
    out = one[["bytes", "gbps"]].rename(columns={"gbps": "one_way_gbps"})
    if len(both):
        out["both_ways_total_gbps"] = both["total_gbps"].reindex(out.index)
    return out


def table_regime_256mib(runs) -> pd.DataFrame:
    """Per regime and transport: GB/s at 256 MiB one way, and the total with one message each way at once."""
    return regimes.per_regime(_at_256mib, runs)


def table_regime_overlap(runs) -> pd.DataFrame:
    """Per regime and transport: matmuls and transfers alone, overlapped, and what each costs the other."""
    return regimes.per_regime(A.comm_compute, runs)


def table_regime_pipeline(runs) -> pd.DataFrame:
    """Per regime and transport: the 1F1B pipeline's time per iteration (gloo runs its stages on the CPU:
    it is the CPU transport)."""
    return regimes.per_regime(pipeline_analysis.pipeline, runs)


def fig_bandwidth_regimes(runs):
    """GB/s one way against message size, one line per transport and regime (log y: the regimes differ ~70x)."""
    b = regimes.per_regime(A.bandwidth, runs)
    b = b[(b["kind"] == "bandwidth") & (b["direction"] == "one")] if len(b) else b
    if b.empty:
        return plot.message("no bandwidth rows in these runs", getattr(runs, "title", ""))
    b = b.assign(series=b["transport"].astype(str) + " | " + b["regime"])
    return plot.size_curves(b, y="gbps", hue="series", col="direction", logy=True, ylabel="GB/s one way",
                            title="P2P one way: one node (NVLink) vs emulated nodes (NCCL NET/Socket)")


def _in_every_regime(t: pd.DataFrame) -> list[str]:
    """The transports measured in every regime of table ``t`` (those that crossed the node boundary)."""
    if t.empty or "transport" not in t:
        return []
    per = [set(g["transport"]) for _, g in t.groupby("regime", sort=False)]
    return [x for x in A._ordered(set.intersection(*per))] if len(per) > 1 else []


def regime_findings(runs) -> list[Observation]:
    """Each transport measured in both regimes (across the emulated nodes and on one node): 256 MiB one way,
    the overlapped iteration and the pipeline."""
    bw, ov, pp = table_regime_256mib(runs), table_regime_overlap(runs), table_regime_pipeline(runs)
    out = []
    for t in _in_every_regime(bw):
        n = bw[bw["transport"] == t].set_index("regime")["one_way_gbps"]
        out.append(Observation(f"regime_256mib.{t}", f"{t} at 256 MiB one way: " +
                               "; ".join(f"{r} {v:.3g} GB/s" for r, v in n.items()), float(n.min()), "GB/s"))
    for t in _in_every_regime(ov):
        o = ov[ov["transport"] == t].set_index("regime")
        out.append(Observation(f"regime_overlap.{t}", f"{t} transfers overlapped with matmuls: " + "; ".join(
            f"{r}: transfers {q['comm_alone_us'] / 1e3:.1f} ms alone, {q['comm_in_overlap_us'] / 1e3:.1f} ms "
            f"overlapped, matmuls {q['compute_alone_us'] / 1e3:.1f} ms alone (x{q['compute_slowdown']:.2f} "
            f"overlapped), iteration {q['overlapped_vs_serial']:.2f} of the serial sum" for r, q in o.iterrows()),
            float(o["comm_in_overlap_us"].max() / 1e3), "ms"))
    for t in _in_every_regime(pp):
        p = pp[(pp["transport"] == t) & (pp["driver"] == "host")].set_index("regime")["time_ms_median"]
        out.append(Observation(f"regime_pipeline.{t}", f"1F1B pipeline over {t} (host-driven), ms per iteration: " +
                               "; ".join(f"{r} {v:.1f}" for r, v in p.items()), float(p.max()), "ms"))
    return out
