"""Two regimes side by side: runs on one node (NVLink) and on emulated nodes (NCCL's network transport between
torchrun agents, :mod:`kit.launch.emulated`). Which recorded runs go beside a run (:func:`beside`, the
emulated-nodes counterpart of :func:`kit.results.choose`), a run's regime, any investigation's table or
findings per regime, and the transport NCCL chose per peer from a run's meta. The analyses themselves do not
change: the same table, computed per regime."""

from __future__ import annotations

from typing import Callable

from . import results

EMULATED = "emulated"
"""the recorded sets on emulated nodes are ``<experiment>@emulated`` in :data:`kit.results.RECORDED_SETS`"""


def recorded(experiment: str, emulated: bool = False) -> results.RunSet:
    """The recorded runs of ``experiment`` on one node, or on emulated nodes (:func:`kit.results.choose`)."""
    return results.choose(experiment, None, "recorded", set_name=f"{experiment}@{EMULATED}" if emulated else None)


def is_emulated(meta: dict) -> bool:
    return bool((meta or {}).get("emulated"))


def beside(experiment: str, runs: results.RunSet) -> results.RunSet:
    """``runs`` with the recorded runs of the other regime beside them: emulated runs get the recorded
    one-node (NVLink) runs, one-node GPU runs the recorded emulated ones; runs without CUDA (a CPU machine)
    are replaced by both recorded sets. Each run keeps its label (``2 nodes x 1 (emulated)``, ...), which is
    what the analyses tell the regimes apart by."""
    mine = list(runs.dirs) if runs.cuda else []
    emu = [d for d in mine if is_emulated(results.read_meta(d))]
    dirs = list(mine)
    if not mine or len(emu) < len(mine):
        dirs += recorded(experiment, emulated=True).dirs
    if not mine or emu:
        dirs += recorded(experiment).dirs
    dirs = list(dict.fromkeys(dirs))
    return results.RunSet(dirs, "one node (NVLink) beside emulated nodes (NET/Socket)")


def regime(meta: dict) -> str:
    """A run's regime for people: its label on emulated nodes (``2 nodes x 1 (emulated)``), else ``1 node``
    (with the label when it names a setting)."""
    label = results.run_label(meta)
    if is_emulated(meta):
        return label
    return "1 node" + (f", {label}" if label and label != "default env" else "")


def split(runs: results.RunSet) -> dict[str, results.RunSet]:
    """The runs grouped by :func:`regime` (one regime or setting each), in the order they come; {} for rows
    without run directories (a DataFrame)."""
    groups: dict[str, list] = {}
    for d in getattr(runs, "dirs", None) or []:
        groups.setdefault(regime(results.read_meta(d)) or d.name, []).append(d)
    return {label: results.RunSet(ds, runs.source) for label, ds in groups.items()}


def per_regime(table: Callable, runs: results.RunSet):
    """``table(runs)`` for each regime's runs (:func:`split`), one frame with the regime as its first column."""
    import pandas as pd

    parts = []
    for label, sub in split(runs).items():
        t = table(sub)
        if t is not None and len(t):
            t = t.reset_index(drop=all(n is None for n in t.index.names))  # a named index (transport) stays
            parts.append(t.drop(columns=["label"], errors="ignore").assign(regime=label))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["regime"] + [c for c in out.columns if c != "regime"]]


def per_regime_findings(findings: Callable, runs: results.RunSet) -> list:
    """``findings(runs)`` per regime (:func:`split`), each statement prefixed with it, when the runs hold more
    than one; otherwise the findings as they are."""
    from .contract import Observation

    groups = split(runs)
    if len(groups) < 2:
        return findings(runs)
    return [Observation(f"{f.key}[{label}]", f"[{label}] {f.text}", f.value, f.unit)
            for label, sub in groups.items() for f in findings(sub)]


def transports_table(runs: results.RunSet):
    """Per NCCL run: its nodes, ranks per node and the transport NCCL chose per directed peer pair (from the
    INFO lines in its logs, ``meta["nccl"]``); runs that did not log it (one-node runs without NCCL_DEBUG=INFO)
    have one row saying so. Empty without NCCL runs."""
    import pandas as pd

    out = []
    for d in getattr(runs, "dirs", None) or []:
        meta = results.read_meta(d)
        if meta.get("backend") != "nccl":  # gloo / CPU runs: no NCCL transport to show
            continue
        place = meta.get("placement") or {}
        base = {"regime": regime(meta), "nodes": place.get("nodes", 1 if meta else None),
                "ranks_per_node": place.get("ranks_per_node", meta.get("world_size"))}
        tr = (meta.get("nccl") or {}).get("transports") or []
        comms = (meta.get("nccl") or {}).get("communicators") or []
        nnodes = ",".join(sorted({str(c["nNodes"]) for c in comms})) or None
        out += [{**base, "from": t["from"], "to": t["to"], "via": t["via"], "channels": t["channels"],
                 "nccl_nNodes": nnodes} for t in tr] or [{**base, "via": "not logged (run without NCCL_DEBUG=INFO)"}]
    return pd.DataFrame(out)
