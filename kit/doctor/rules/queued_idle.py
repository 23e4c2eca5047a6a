"""``queued_idle``: the GPU idles with its next work already issued (the accounting's ``queued`` slice, the part
above the GPU's own dispatch gap: :data:`kit.doctor.accounting.CHARGED`)."""

from __future__ import annotations

from ..accounting import Account, slice_extract
from ..findings import slice_judge
from ..model import Explains, Rule, rule


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) with its next work already issued on "
            f"{who}" + (f" ({a.queued['gaps_per_step']:.0f} gaps per step, median {a.queued['median_us']:.1f} us)"
                        if a.queued.get("median_us") is not None else ""))


rule(Rule(
    id="queued_idle", title="the GPU idles with work already issued", order=140,
    extract=slice_extract("queued_idle"), judge=slice_judge("queued_idle"),
    explains=Explains(("queued",), sentence, lambda a: {"queued": dict(a.queued)}),
    cause=("The GPU was idle although the host had already issued its next work: the gaps the GPU itself "
           "takes between kernels (dispatch, a few us each), waits between streams (an event one stream waits "
           "for), or dependencies inside a replayed CUDA graph."),
    fix=("Fewer, larger kernels (torch.compile, fused optimizers, fused attention); look for cross-stream "
         "waits in the timeline; for graph-replayed collectives see graph_mixing_gap."),
    caveats=("With many short kernels a few us of dispatch per kernel adds up; it is the GPU's own cost and "
             "CUDA graphs remove the host's launch cost, not this gap."),
    notebook="graph_gaps"))
