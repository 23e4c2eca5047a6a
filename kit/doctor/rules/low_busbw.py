"""``low_busbw``: traced busbw well below what the machine's links deliver at the same size -- against the same
machine's sweep (:mod:`kit.doctor.sweep`) when one is given, else against the reference table of known GPU/link
types (:mod:`kit.doctor.busbw_reference`); the finding says which."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..collectives import Timeline, gloo_only, per_step_divisor
from ..findings import make
from ..model import Finding, Rule, Skip, rule
from .comm import extract_timeline
from .evidence import excerpt, num, size_text

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..busbw_reference import Reference

LOW_BUSBW_RATIO = 0.5
"""traced busbw below this share of the reference's at the same size is 'well below'"""


@dataclass(frozen=True, eq=False)
class _Basis:
    """What the traced busbw is compared with: this machine's ``sweep`` (its rows, :mod:`kit.doctor.sweep`) when
    one is given, else the reference table's rows for the job's GPU (``ref``); exactly one of them is set."""

    sweep: "pd.DataFrame | None" = None
    ref: "Reference | None" = None

    @property
    def kind(self) -> str:
        """'sweep' (this machine's) or 'reference table'"""
        return "sweep" if self.sweep is not None else "reference table"

    def lookup(self, collective: str, nbytes: float, gpus: int | None) -> tuple[float, str] | None:
        """``(busbw, source)`` of ``collective`` at ``nbytes`` on ``gpus`` GPUs; None outside what the basis covers."""
        from .. import busbw_reference as table
        from ..sweep import attainable

        if self.sweep is None:
            return table.attainable(self.ref, collective, nbytes, gpus)
        bw = attainable(self.sweep, collective, nbytes)
        return None if bw is None else (bw, "sweep")

    def has(self, collective: str, gpus: int | None) -> bool:
        """The basis has ``collective`` (on ``gpus`` GPUs) at some size."""
        if self.sweep is not None:
            return bool((self.sweep["collective"] == collective).any())
        return gpus is not None and int(gpus) in self.ref.rows and bool(
            (self.ref.rows[int(gpus)]["collective"] == collective).any())

    def says(self, source: str, gpus: int | None) -> str:
        """The basis of one comparison, as the finding states it."""
        if self.sweep is not None:
            return f"this machine's sweep ({', '.join(sorted(set(self.sweep['source'].astype(str))))})"
        return self.ref.basis(source, gpus)

    def environment(self, source: str) -> str | None:
        """The NCCL_* settings ``source`` ran with; None when unknown (a sweep does not record them)."""
        return None if self.sweep is not None else self.ref.sources.get(source, ("", None))[1]


def _basis(ctx) -> _Basis | Skip:
    """The sweep given (it wins), else the reference table's rows for the GPU the traces name (or why none)."""
    from .. import busbw_reference as table

    if ctx.sweep is not None:
        return _Basis(sweep=ctx.sweep)
    ids = [s.identity for s in ctx.summaries.values()]
    ref = table.reference([getattr(i, "device", None) for i in ids], [getattr(i, "host", None) for i in ids])
    if isinstance(ref, str):
        return Skip("low_busbw", f"no sweep given (--sweep) and no reference for this machine: {ref}")
    return _Basis(ref=ref)


def _job_env(ctx) -> dict[str, str] | None:
    """The job's environment from its ``kitCapture`` header (the first rank that has one), None without."""
    for cap in (ctx.capture or {}).values():
        if isinstance(cap, dict) and isinstance(cap.get("env"), dict):
            return cap["env"]
    return None


def _cost(df: "pd.DataFrame", low: list[dict], tl_of: dict[int, Timeline]) -> tuple[float, float, str]:
    """Per step: how much longer the slow collectives take than at the reference's busbw, and what the step would
    save at it, with its basis. Each slow instance's transfer (the last ``instance_min_us`` of its kernel on every
    rank) would end ``t - t_ref`` sooner: of that tail, the step saves the time GPU work waited behind it -- work
    already launched and not started, no compute running (:attr:`Timeline.held`) -- on every rank the instance
    ran on (its least); a rank whose GPU had nothing to run then was waiting for its host, which a faster
    collective does not change, and time hidden under compute is saved by no one. Without launch calls in a trace
    (``held`` unknown) the tail's time that no compute hid is counted (``'exposed'``)."""
    import numpy as np

    from ...collective_ops import bus_factor
    from ..collectives import kernel_parts
    from ...traces.intervals import covered, union_np

    n = max(per_step_divisor(tl) for tl in tl_of.values())
    held = all(tl.held is not None for tl in tl_of.values())
    stepped = any(tl.steps for tl in tl_of.values())
    longer = saved = 0.0
    tails: dict = {}  # (rank, device) -> the tails' [b - cut, b] of every slow instance on it
    for r in low:
        g = df[(df["collective"] == r["collective"]) & (df["bytes"] == r["bytes"])]
        g = g[g["step"].notna()] if stepped else g
        if g.empty:
            continue
        f = bus_factor(r["collective"], int(r["group_size"])) if r["group_size"] else 1.0
        t_ref = r["bytes"] * f / (r["reference_busbw_gbps"] * 1e3)  # us
        r["reference_us"] = t_ref
        a, b = kernel_parts(g, "transfer")
        cut = np.clip((b - a) - t_ref, 0.0, None)  # the transfer's tail that would vanish
        gain = np.zeros(len(g))
        for (rank, dev), i in g.groupby([g["rank"], g["device"].astype(str)]).indices.items():
            iv = _basis_iv(tl_of[int(rank)], held, dev)
            got = covered(iv["a"].to_numpy(dtype=float), iv["b"].to_numpy(dtype=float), b[i] - cut[i], b[i])
            gain[i] = got if held else cut[i] - got
            tails.setdefault((int(rank), dev), []).append((b[i] - cut[i], b[i]))
        key = [g["match_key"], g["instance"]] if "instance" in g else [g.index]
        per = g.assign(cut=cut, gain=gain).groupby(key)
        longer += float(per["cut"].max().sum())
        saved += float(per["gain"].min().sum())
    # instances running at once (two process groups or streams) share their held time: per rank, what the union of
    # the tails gains, counted once, bounds the sum over instances
    for (rank, dev), t in tails.items():
        ta, tb = union_np(np.concatenate([x[0] for x in t]), np.concatenate([x[1] for x in t]))
        iv = _basis_iv(tl_of[rank], held, dev)
        got = float(covered(iv["a"].to_numpy(dtype=float), iv["b"].to_numpy(dtype=float), ta, tb).sum())
        saved = min(saved, got if held else float((tb - ta).sum()) - got)
    return longer / n, saved / n, "held" if held else "exposed"


def _basis_iv(tl: Timeline, held: bool, dev: str) -> "pd.DataFrame":
    """The intervals a slow collective's tail is measured against on one device of a rank: GPU work held behind it
    (:attr:`Timeline.held`), else compute (what hid it)."""
    iv = tl.held if held else tl.compute
    return iv[iv["device"].astype(str) == dev]


def whole_groups(df: "pd.DataFrame") -> "tuple[pd.DataFrame, str]":
    """The instances seen on every rank of their process group (:func:`kit.doctor.collectives.arrivals`' ``whole``),
    and why the others were left out ('' when none was): where some ranks of a group are not given (a subset of a
    bigger job's traces, one rank's trace), every given rank may have waited for one that is not, and a busbw from
    its kernel says how late the missing ranks were, not what the links deliver."""
    if df["whole"].all():
        return df, ""
    part = df[~df["whole"]]
    seen, of = int(part["ranks_seen"].max()), int(part["group_size"].max())
    why = (f"{len(part.drop_duplicates(['match_key', 'instance']))} collective instance(s) seen on {seen} of the "
           f"{of} ranks of their process group: with the group's other ranks not given, every kernel given may hold "
           "waiting for one of them, so the transfer time (and busbw) is not known; only collectives seen on every "
           "rank of their group are judged")
    return df[df["whole"]], why


def judge_low_busbw(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    from ...traces import summary as comm_summary
    from ..busbw_reference import environment_differences

    if gloo_only(summaries):
        return Skip("low_busbw", "no NCCL collective in the traces, only gloo ops: busbw is judged on NCCL kernels")
    df = ctx.collectives("nccl")
    if df is None:
        return []
    if df["bytes"].isna().all():
        return Skip("low_busbw", "the NCCL kernels carry no collective metadata (bytes unknown: torch < 2.3?); "
                                 "busbw cannot be computed")
    df, partial = whole_groups(df)
    if df.empty:
        return Skip("low_busbw", partial)
    basis = _basis(ctx)
    if isinstance(basis, Skip):
        return basis
    s = comm_summary(df[df["bytes"].notna()])
    tl_of = dict(summaries)
    rows, outside, missing = [], [], set()
    for r in s.itertuples():
        if r.busbw_gbps_p50 is None or r.busbw_gbps_p50 != r.busbw_gbps_p50:
            continue
        n = None if r.group_size is None or r.group_size != r.group_size else int(r.group_size)
        got = basis.lookup(r.collective, float(r.bytes), n)
        if got is None:
            if basis.has(r.collective, n):
                outside.append(f"{r.collective} {size_text(r.bytes)}")
            else:
                missing.add(r.collective if basis.kind == "sweep" else f"{r.collective} on {n} GPUs")
            continue
        ref, src = got
        rows.append({"collective": r.collective, "bytes": int(r.bytes), "count": int(r.count),
                     "busbw_gbps": float(r.busbw_gbps_p50), "reference_busbw_gbps": ref,
                     "ratio": float(r.busbw_gbps_p50) / ref, "dur_us_p50": float(r.dur_us_p50),
                     "group_size": r.group_size, "reference_source": src})
    where = "the sweep covers" if basis.kind == "sweep" else "the reference table's bandwidth-bound sizes cover"
    notes = {"outside_reference_sizes": outside, "not_in_reference": sorted(missing),
             **({"left_out": partial} if partial else {})}
    low = [r for r in rows if r["ratio"] < LOW_BUSBW_RATIO]
    if not rows:
        return Skip("low_busbw", f"{where} none of the traced collectives at their sizes "
                                 f"({', '.join(sorted(missing) + outside) or 'none'})")
    if not low:
        return []
    longer, cost, basis_cost = _cost(df, low, tl_of)
    top = min(low, key=lambda r: r["ratio"])
    ex = df[(df["collective"] == top["collective"]) & (df["bytes"] == top["bytes"])].iloc[0]
    env = _job_env(ctx)
    said = basis.says(top["reference_source"], top["group_size"])
    ref_env = basis.environment(top["reference_source"])
    likely = environment_differences(env, ref_env) if env is not None else None
    ev = {"sizes": [{k: (num(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in low],
          "checked_sizes": len(rows), **notes, "basis": basis.kind, "basis_text": said,
          "longer_us_per_step": num(longer), "cost_basis": basis_cost,
          "reference_sources": sorted({r["reference_source"] for r in rows}), "job_nccl_differences": likely,
          "excerpt": excerpt(int(ex["rank"]), float(ex["start_us"]), float(ex["end_us"]))}
    summary = (f"collectives below the machine's links cost {cost:.0f} us per step: " + (
               "the part of the time they take longer than at the busbw the links deliver "
               f"({longer:.0f} us per step) during which GPU work waited behind them on every rank" if basis_cost ==
               "held" else f"the part of the time they take longer than at the busbw the links deliver ({longer:.0f} "
               "us per step) that no compute hid") + f"; {len(low)} of {len(rows)} traced (collective, size) pairs reach under "
               f"{100 * LOW_BUSBW_RATIO:.0f}% of the busbw the machine's links deliver; worst: {top['collective']} of "
               f"{size_text(top['bytes'])} at {top['busbw_gbps']:.1f} GB/s against {top['reference_busbw_gbps']:.1f}"
               f" GB/s ({100 * top['ratio']:.0f}%; basis: {said})"
               + ("" if not likely else f"; the job sets {', '.join(likely)}" if ref_env is None else
                  f"; the job's NCCL settings differ from the reference's: {', '.join(likely)}"))
    return [make("low_busbw", cost, sorted(tl_of), ev, summary)]


rule(Rule(id="low_busbw", title="collectives slower than this machine's links deliver", extract=extract_timeline,
          judge=judge_low_busbw,
          order=50, cross_rank=True,
          cause=("The job's collectives reach a fraction of the bandwidth the machine's links deliver at the same size "
                 "(its sweep, else nccl-tests figures for its GPU/link type): NCCL is configured differently in the "
                 "job (an NCCL_* variable forcing a protocol, algorithm or fewer channels, or disabling P2P), the "
                 "traffic takes another path (a process group across nodes, P2P disabled, wrong NIC), or the kernels "
                 "share the GPU with compute."),
          fix=("Compare the job's NCCL environment with the reference's (NCCL_DEBUG=INFO prints the chosen algorithm, "
               "protocol, channels and transport per communicator); unset NCCL_ALGO/NCCL_PROTO/NCCL_MAX_NCHANNELS "
               "overrides; check NCCL_P2P_DISABLE, NCCL_IB_HCA/NCCL_SOCKET_IFNAME; run the sweep with the job's "
               "environment to confirm."),
          caveats=("Traced durations are the per-instance minimum over ranks (the transfer, not the waiting), judged "
                   "only for collectives seen on every rank of their process group: with some of its ranks not given "
                   "(one rank's trace, a subset of a bigger job's) the ranks given may have waited for one that is not, "
                   "and those collectives are skipped, said in the evidence or the skip. The cost is the part of "
                   "the longer time during which launched GPU work waited behind the collectives on every rank, "
                   "summed per instance and at most what the union of their tails holds on each rank (instances running "
                   "at once count their shared held time once; still an upper bound where one collective's delay is "
                   "absorbed before the next). A sweep must come from "
                   "the same machine; sizes outside its range are not judged. Without a sweep, the reference table "
                   "(kit/doctor/busbw_reference.csv) is another machine of the same GPU and link type: only its "
                   "bandwidth-bound sizes (from half its peak busbw up) are judged, at the job's GPU count; the "
                   "traces do not record the topology, so only GPU names that fix the link are used."),
          notebook="collectives"))
