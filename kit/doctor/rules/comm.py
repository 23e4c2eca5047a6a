"""The comm rules' shared extracts (:mod:`.per_param_allreduce`, :mod:`.exposed_comm`, :mod:`.late_rank`,
:mod:`.comm_compute_contention`, :mod:`.low_busbw`): the rank's collectives timeline
(:mod:`kit.doctor.collectives`), or why a rule cannot read it."""

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

