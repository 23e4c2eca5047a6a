"""One node (NVLink) beside emulated nodes (NCCL's network transport, :mod:`kit.launch.emulated`): the same
tables per regime, one figure that puts them side by side, and the comparison the findings state.

Each analysis is the investigation's own (:mod:`.analysis`) applied to each regime's runs
(:func:`kit.regimes.per_regime`): nothing is computed differently for the network-bound regime.
"""

from __future__ import annotations

from kit.contract import Observation
from kit import regimes

from .analysis import _axes, table_breakdown, table_buckets, table_event_vs_kernel

BREAKDOWN = ["h2d", "sync", "step_ms", "sync_ms", "backward_ms", "h2d_host_ms", "step_host_ms"]


def table_regime_breakdown(runs):
    """Per regime and (h2d, sync) at the default bucket size: the step on the device, its sync and backward
    parts, the host time blocked in the H2D call and the host time per step (ms)."""
    t = regimes.per_regime(table_breakdown, runs)
    return t[["regime"] + [c for c in BREAKDOWN if c in t.columns]] if len(t) else t


def table_regime_buckets(runs):
    """Per regime: DDP step time against bucket_cap_mb, and one bucket (ms)."""
    return regimes.per_regime(table_buckets, runs)


def table_regime_event_vs_kernel(runs):
    """Per regime and parameter of the per_param loop: the all-reduce timed with events on the default stream
    against its NCCL kernel (us), and their ratio."""
    t = regimes.per_regime(table_event_vs_kernel, runs)
    return t.assign(event_over_kernel=t["event_us"] / t["kernel_us"]) if len(t) else t


def fig_regimes(runs):
    """Side by side: step time per (h2d, sync) and regime; the DDP bucket curve relative to PyTorch's default
    bucket per regime; event-timed over kernel time per gradient size per regime."""
    import matplotlib.pyplot as plt

    b = table_regime_breakdown(runs)
    if b.empty or b["regime"].nunique() < 2:
        fig, _ = _axes(runs, (10, 3), "needs step rows of two regimes (one node and emulated nodes)")
        return fig
    fig = plt.figure(figsize=(12, 7.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1.1, 1])
    axes = [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]
    wide = b.assign(mode=b["h2d"] + "+" + b["sync"]).pivot_table(index="mode", columns="regime", values="step_ms",
                                                                 sort=False)
    wide.plot.bar(ax=axes[0], logy=True, width=0.8, rot=30)
    for label in axes[0].get_xticklabels():
        label.set_ha("right")
    axes[0].set_ylim(top=float(wide.max().max()) * 4)  # room for the legend above the bars
    axes[0].set_ylabel("ms per step (device, median)")
    axes[0].set_xlabel("H2D mode, sync mode")
    axes[0].legend(fontsize=8)
    k = table_regime_buckets(runs)
    for name, g in k[k["sync"] == "ddp"].groupby("regime", sort=False):
        ref = g.loc[g["bucket_cap_mb"] == 25.0, "step_ms"]
        base = ref.iloc[0] if len(ref) else g["step_ms"].median()
        axes[1].plot(g["bucket_cap_mb"], 100 * (g["step_ms"] / base - 1), marker="o", label=name)
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("bucket_cap_mb (DDP)")
    axes[1].set_ylabel("step vs 25 MB buckets (%)")
    axes[1].legend(fontsize=8)
    e = table_regime_event_vs_kernel(runs)
    for name, g in e.dropna(subset=["kernel_us"]).groupby("regime", sort=False):
        axes[2].scatter(g["bytes"], g["event_over_kernel"], label=name, s=14)
    axes[2].axhline(1, color="grey", lw=0.8)
    axes[2].set_xscale("log")
    axes[2].set_xlabel("gradient bytes (per_param, pageable)")
    axes[2].set_ylabel("event-timed / NCCL kernel")
    axes[2].legend(fontsize=8)
    fig.suptitle("dataloader_sync: one node (NVLink) vs emulated nodes (NCCL NET/Socket)", fontsize=10)
    fig.tight_layout()
    return fig


def regime_findings(runs) -> list[Observation]:
    """The sync modes' step times per regime (prefetch H2D), and what the DDP bucket sweep spans in each."""
    b = table_regime_breakdown(runs)
    if b.empty or b["regime"].nunique() < 2:
        return []
    out = []
    for name, g in b[b["h2d"] == "prefetch"].groupby("regime", sort=False):
        st = g.set_index("sync")["step_ms"]
        parts = ", ".join(f"{s} {st[s]:.1f}" for s in ("per_param", "flat", "ddp", "ddp_one_bucket") if s in st)
        out.append(Observation(f"regime_sync_modes[{name}]", f"[{name}] step per sync mode (prefetch H2D, ms): {parts}; "
                               f"DDP saves {st['per_param'] - st['ddp']:.1f} ms over per-parameter all-reduces "
                               f"({100 * (1 - st['ddp'] / st['per_param']):.0f}%)", float(st["per_param"] - st["ddp"]), "ms"))
    k = table_regime_buckets(runs)
    for name, g in k[k["sync"] == "ddp"].groupby("regime", sort=False):
        lo, hi = g.loc[g["step_ms"].idxmin()], g.loc[g["step_ms"].idxmax()]
        out.append(Observation(f"regime_buckets[{name}]", f"[{name}] DDP buckets {g['bucket_cap_mb'].min():g}–"
                               f"{g['bucket_cap_mb'].max():g} MB: fastest {lo['bucket_cap_mb']:g} MB {lo['step_ms']:.2f} ms, "
                               f"slowest {hi['bucket_cap_mb']:g} MB {hi['step_ms']:.2f} ms "
                               f"({100 * (hi['step_ms'] / lo['step_ms'] - 1):.1f}% apart)",
                               float(hi["step_ms"] - lo["step_ms"]), "ms"))
    return out
