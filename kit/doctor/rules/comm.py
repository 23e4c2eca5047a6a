"""The comm rules' shared extracts (:mod:`.per_param_allreduce`, :mod:`.exposed_comm`, :mod:`.late_rank`,
:mod:`.comm_compute_contention`, :mod:`.low_busbw`): the rank's collectives timeline
(:mod:`kit.doctor.collectives`), or why a rule cannot read it; and how much of a collective's host work a step
would lose (:func:`host_work`: :mod:`.per_param_allreduce`, :mod:`.repeated_grad_sync`)."""

from __future__ import annotations

from ..collectives import Timeline, timeline
from ..model import RankView, Skip


# ------------------------------------------------------------------------------------------- extracts
def extract_timeline(view: RankView) -> Timeline | Skip:
    """The extract of a rule that reads the collectives whatever runs them: the rank's :class:`Timeline`."""
    return timeline(view)


def gpu_extract(rule_id: str):
    """The extract of a rule that needs collectives on GPU kernels: the Timeline, or a Skip saying why not."""

    def extract(view: RankView) -> Timeline | Skip:
        tl = timeline(view)
        if tl.gpu_kernels == 0:
            return Skip(rule_id, "gloo collectives run on CPU threads and the trace has no GPU kernels: nothing to "
                                 "overlap" if tl.backend == "gloo" else
                                 "no GPU kernels in the trace (the capture notes say why)")
        return tl

    extract.__name__ = f"extract_{rule_id}"
    return extract



def host_work(ctx, rank: int, traced_us: float) -> tuple[float, float]:
    """Host time ``traced_us`` spent on rank ``rank`` issuing collectives the job need not issue, as the step would
    lose it, and the profiler scale used: (1) net of the profiler's own overhead in proportion (x unprofiled / traced
    step of the rank, :mod:`kit.doctor.overhead`; the profiler slows every op the host runs), (2) never more than
    the job's GPU time idle for its hosts' issuing (the largest ``launch`` slice of any rank, net of the profiler:
    :func:`kit.doctor.reconcile.net_costs`) -- a host that runs ahead of a busy GPU loses nothing by its calls."""
    from ..reconcile import net_costs

    ovh = ctx.overhead or {}
    o = ovh.get(int(rank))
    scale = (min(1.0, o.unprofiled_step_us / o.traced_step_us) if o is not None and o.basis != "none"
             and o.unprofiled_step_us and o.traced_step_us else 1.0)
    accounts = [(rk, s.account) for rk, s in (ctx.summaries or {}).items()
                if getattr(s, "account", None) is not None and hasattr(s.account, "cost")]
    cap = max((net_costs(a, ovh.get(int(rk)))["launch"] for rk, a in accounts), default=None)
    net = traced_us * scale
    return (net if cap is None else min(net, cap)), scale
