"""The measured statements of a dataloader_sync run set (``findings(runs)``), each computed from the tables in
:mod:`.analysis` -- never pre-written. On the recorded 2xH200 run they are the numbers of the README's "Why the
gradient all-reduce looks slow in training" (unit-tested in tests/test_dataloader_sync.py). A statement the runs
cannot support (CPU rows, one rank, no traces) comes back as a finding without a value that says what is missing.

Ranges are over the sync modes (or H2D modes) of one H2D mode (or sync mode) at the default bucket size; every
number is a median over steps of the slowest rank (see :mod:`.analysis`).
"""

from __future__ import annotations

from kit.contract import Observation

from .analysis import (ONE_RANK, _default_buckets, breakdown, on_cuda, ranks, table_buckets, table_event_vs_kernel,
                       table_grad_sync, table_overlap)
from .config import CUDA_ONLY_H2D, DDP_DEFAULT_BUCKET_MB


def _ms(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 1 else f"{x:.1f}"


def _range(values, fmt=_ms) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def _h2d(main, cuda: bool) -> list[Observation]:
    if not cuda:
        return [Observation("pageable_h2d_host_ms", "Without CUDA a copy to the device is a copy within CPU memory: host "
                            "blocking by a pageable copy and the pinned / side-stream / prefetch modes need a GPU "
                            "(the recorded GPU run shows them).")]
    out = []
    pg = main[main["h2d"] == "pageable"]
    fast = main[main["h2d"].isin(CUDA_ONLY_H2D)]
    if len(pg) and "h2d_host_us" in pg:
        ms = pg["h2d_host_us"] / 1e3
        out.append(Observation("pageable_h2d_host_ms", f"A pageable `.to(device)` on the default stream blocks the host "
                               f"{_range(ms)} ms per step (it waits for the previous step's GPU work; median of the "
                               f"slowest rank, over {len(ms)} sync modes).", float(ms.median()), "ms"))
    if len(fast) and "h2d_host_us" in fast:
        ms = fast["h2d_host_us"] / 1e3
        modes = [m.replace("_", "-") for m in ("pinned", "side_stream", "prefetch") if m in set(fast["h2d"])]
        modes = ", ".join(modes[:-1]) + " and " + modes[-1] if len(modes) > 1 else modes[0]
        out.append(Observation("async_h2d_host_ms", f"{modes[0].upper() + modes[1:]} copies block it {_range(ms)} ms "
                               "per step.",
                               float(ms.max()), "ms"))
    if len(pg) and len(fast) and "step_host_us" in main:
        per = [f"{h} {_range(main[main['h2d'] == h]['step_host_us'] / 1e3)} ms"
               for h in ("pinned", "side_stream", "prefetch") if h in set(fast["h2d"])]
        ms = pg["step_host_us"] / 1e3
        out.append(Observation("host_step_ms", f"Host time per step (median): pageable {_range(ms)} ms; "
                               + "; ".join(per) + ".", float(ms.median()), "ms"))
    return out


def _ddp(runs, main, n: int, cuda: bool) -> list[Observation]:
    out = []
    ov = table_overlap(runs)
    d = ov[(ov["sync"] == "ddp") & (ov["bucket_cap_mb"] == DDP_DEFAULT_BUCKET_MB)]
    if len(d):
        share = d["overlap_share"]
        out.append(Observation("ddp_overlap_share", f"DDP ({DDP_DEFAULT_BUCKET_MB:g} MB buckets) hides "
                               f"{_range(share * 100, lambda x: f'{x:.0f}')}% of its communication behind backward (NCCL "
                               f"kernel time overlapped by compute in the profiler trace; median over ranks, per H2D "
                               f"mode).", float(share.median())))
    elif "ddp" in set(main["sync"]):
        why = (f"needs 2+ ranks: {ONE_RANK}" if n < 2 else
               "is read from the CUDA profiler trace: these runs ran on CPU" if not cuda else
               "is read from the profiled steps: these runs have none (profile_steps = 0)")
        out.append(Observation("ddp_overlap_share", f"DDP's overlap of communication with backward {why}."))
    common = set(main[main["sync"] == "ddp"]["h2d"]) & set(main[main["sync"] == "per_param"]["h2d"])
    if common and {"backward_us", "sync_us"} <= set(main.columns):
        h = "prefetch" if "prefetch" in common else sorted(common)[0]
        ddp = main[(main["h2d"] == h) & (main["sync"] == "ddp")].iloc[0]
        pp = main[(main["h2d"] == h) & (main["sync"] == "per_param")].iloc[0]
        total = (ddp["backward_us"] + ddp["sync_us"]) / 1e3
        out.append(Observation("ddp_backward_sync_ms", f"Backward + sync: {_ms(total)} ms with DDP (its all-reduces run "
                               f"inside backward) vs {_ms(pp['backward_us'] / 1e3)} + {_ms(pp['sync_us'] / 1e3)} ms with "
                               f"per-parameter all-reduces after it ({h} H2D).", float(total), "ms"))
    return out


def _buckets(runs) -> list[Observation]:
    dd = table_buckets(runs)
    x = dd[dd["sync"] == "ddp"] if "sync" in dd else dd
    if len(x) < 2 or "step_ms" not in x:
        return []
    one = dd[dd["sync"] == "ddp_one_bucket"]
    tail = f"; one bucket (no overlap with backward): {one['step_ms'].iloc[0]:.2f} ms" if len(one) else ""
    return [Observation("bucket_step_ms", f"DDP bucket sizes {x['bucket_cap_mb'].min():g}–{x['bucket_cap_mb'].max():g} MB: "
                        f"step {_range(x['step_ms'], lambda v: f'{v:.2f}')} ms on the device ({x['h2d'].iloc[0]} H2D)"
                        f"{tail}.", float(x["step_ms"].max() - x["step_ms"].min()), "ms")]


def _event_vs_kernel(runs, n: int, cuda: bool) -> list[Observation]:
    evk = table_event_vs_kernel(runs)
    if evk.empty:
        if cuda:
            return []
        return [Observation("event_vs_kernel", "Per-parameter all-reduces are timed with CUDA events: these runs "
                            "ran on CPU.")]
    big = evk.sort_values("bytes").iloc[-1]
    head = (f"Largest gradient ({big['bytes'] / 1e6:.0f} MB): its all-reduce timed with events on the default "
            f"stream (the report's way) {big['event_us'] / 1e3:.3f} ms")
    k = big["kernel_us"]
    if k == k:
        verdict = ("the event timing is the all-reduce" if abs(big["event_us"] / k - 1) < 0.1 else
                   f"the events count {(big['event_us'] - k) / 1e3:.3f} ms of other work queued before it")
        return [Observation("event_vs_kernel", f"{head} vs its NCCL kernel {k / 1e3:.3f} ms: {verdict}.",
                            float(big["event_us"] / 1e3), "ms")]
    why = ONE_RANK if n < 2 else "no pageable+per_param trace kept"
    return [Observation("event_vs_kernel", f"{head}; no NCCL kernel to compare it with ({why}).",
                        float(big["event_us"] / 1e3), "ms")]


def _grad_sync(runs, n: int) -> list[Observation]:
    if 0 < n < 2:
        return [Observation("grad_sync_busbw", f"The flat gradient all-reduce's bandwidth needs 2+ ranks: {ONE_RANK}.")]
    g = table_grad_sync(runs)
    if g.empty:
        return []
    sweep = g["h2d"].str.startswith("sweep")
    mine, ref = g[~sweep], g[sweep & g["h2d"].str.contains("kernel")]
    cmp = (f" vs {ref['busbw_gbps'].iloc[0]:.3g} GB/s for the NCCL kernel in the recorded collectives sweep "
           f"({ref['h2d'].iloc[0].split('@')[1].strip()})" if len(ref) else "")
    return [Observation("grad_sync_busbw", f"The flat all-reduce of every gradient ({int(mine['bytes'].iloc[0]) / 1e6:.0f} "
                        f"MB) reaches busbw {_range(mine['busbw_gbps'], lambda v: f'{v:.3g}')} GB/s in training "
                        f"(events on the default stream, over H2D modes){cmp}.", float(mine["busbw_gbps"].max()), "GB/s")]


def findings(runs) -> list[Observation]:
    """The investigation's measured statements for ``runs`` (a RunSet); [] without step rows. Runs of two
    regimes (one node beside emulated nodes, :func:`kit.regimes.beside`): the statements per regime,
    then their comparison (:func:`.regimes.regime_findings`)."""
    from kit import regimes as kit_regimes

    from .regimes import regime_findings

    if getattr(runs, "dirs", None) and len(kit_regimes.split(runs)) > 1:
        return kit_regimes.per_regime_findings(_findings, runs) + regime_findings(runs)
    return _findings(runs)


def _findings(runs) -> list[Observation]:
    """The statements for the runs of one regime."""
    b = breakdown(runs)
    if b.empty:
        return []
    main, n, cuda = _default_buckets(b), ranks(runs), on_cuda(runs)
    return (_h2d(main, cuda) + _ddp(runs, main, n, cuda) + _buckets(runs) + _event_vs_kernel(runs, n, cuda)
            + _grad_sync(runs, n))
