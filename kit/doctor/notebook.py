"""What ``notebooks/doctor.ipynb`` shows of a :class:`~kit.doctor.model.Diagnosis`: the findings as a table, per
finding its text and a timeline excerpt of the evidence, and what was checked, skipped or missing.

**Timeline excerpts.** A finding may point at the stretch of the trace that shows it, as
``evidence["excerpt"] = {"rank": r, "ranks": [...], "t0_us": ..., "t1_us": ...}`` (times on rank ``r``'s trace
clock). :func:`excerpt_figure` loads those ranks' traces, puts them on one clock
(:func:`kit.traces.clock_offsets`: the end of a collective every rank ran is the same moment everywhere) and draws,
per rank, a host lane (DataLoader waits orange, synchronising calls purple, other runtime calls that blocked the
host brown, collective calls red, step boundaries as lines) above the rank's GPU streams (NCCL kernels red,
compute blue, copies grey): the gap before the NCCL kernel, the blocked host call, the late rank's collective
starting after the others', the communication with nothing beside it. A finding without an excerpt is drawn over
its rank's first profiled step; traces that cannot be read here give a figure that says so
(:func:`kit.plot.message`), never an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import plot
from .model import Diagnosis, Finding

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SYNC_COLOR, DATA_COLOR, COMM_COLOR, NCCL_COLOR, COMPUTE_COLOR, COPY_COLOR, CALL_COLOR = (
    "#9467bd", "#ff7f0e", "#d62728", "#d62728", "#1f77b4", "#999999", "#8c564b")
LONG_CALL_US = 50.0
"""a runtime call (a copy, a launch) longer than this is drawn on the host lane: the host was blocked in it"""
MAX_BARS = 4000
"""bars drawn per lane at most (the busiest excerpt of a 500 MB trace stays drawable)"""


def start(namespace: dict[str, Any]):
    """``kit.notebook.start("doctor", ...)`` on the notebook's parameters, with ``traces`` also accepted as a
    string (``papermill -p traces '["a.json.gz", "b.json.gz"]'`` passes one: a JSON list or a single path)."""
    import json

    from .. import notebook as nb

    import pandas as pd

    ns = dict(namespace)
    t = ns.get("traces")
    if isinstance(t, str):
        ns["traces"] = json.loads(t) if t.strip().startswith("[") else [t]
    out = nb.start("doctor", ns)
    pd.set_option("display.max_colwidth", None)  # a finding's summary and a skip's reason are read whole
    return out


def resolve(paths: list[str]) -> list[str]:
    """Trace paths as given, or relative to the repository when they are not found from here (a notebook opened
    in ``notebooks/`` runs there; ``kit run`` runs at the repository root)."""
    import glob

    from ..results import REPO_ROOT

    return [p if Path(p).is_absolute() or glob.glob(str(p)) else str(REPO_ROOT / p) for p in paths]


def doctor(traces: list[str], sweep: str | None = None, workers: int | None = None,
           flight_recorder: list[str] | None = None, rules: str = "") -> Diagnosis:
    """:func:`kit.doctor.diagnose` on the notebook's parameters (``sweep=""``: none, ``workers=0``: one per
    core, ``flight_recorder=[]``: none, ``rules=""``: all), with one line saying what was read."""
    from ..traces.flight_recorder import load_fr_dumps
    from .engine import diagnose
    from .rules import parse_ids

    fr = load_fr_dumps(resolve(list(flight_recorder))) if flight_recorder else None
    d = diagnose(resolve(list(traces)), sweep=resolve([sweep])[0] if sweep else None, workers=workers or None,
                 flight_recorder=fr, only=parse_ids(rules))
    plot.note_source("traces", _hardware(d), d.dates, what=f"traces {_where(d.traces)}")
    step = f"{d.step_us / 1e3:.2f} ms" if d.step_us else "unknown"
    print(f"{len(d.traces)} rank trace(s), ranks {d.ranks}; step {step} "
          f"({d.steps or 'no'} profiled steps{'' if d.steps else ': the whole trace counts as one'}); "
          f"{len(d.problems)} problem(s) at or above 'low', {len(d.findings)} finding(s) in all"
          + (f"; {len(d.failed)} trace(s) unreadable" if d.failed else ""))
    return d


def _hardware(d: Diagnosis) -> str:
    """'2 ranks on NVIDIA H200' from the traces' headers (the caption of the doctor's figures)."""
    n = len(d.ranks)
    who = f"{n} rank{'s' if n != 1 else ''}"
    if d.accounting and {a["mode"] for a in d.accounting.values()} == {"cpu"}:  # no GPU activity in the traces
        return f"{who} on CPU" + (f" (the host has {', '.join(d.devices)}, unused)" if d.devices else "")
    return f"{who} on {', '.join(d.devices)}" if d.devices else f"{who} (GPU not named in the traces)"


def _where(paths: list[str]) -> str:
    """The traces' common folder, relative to the repository when inside it."""
    import os

    from ..results import REPO_ROOT

    common = Path(os.path.commonpath([str(Path(p).resolve().parent) for p in paths])) if paths else Path(".")
    try:
        return str(common.relative_to(REPO_ROOT))
    except ValueError:
        return str(common)


def findings_table(d: Diagnosis) -> "pd.DataFrame":
    """One row per finding, most costly first: rule, severity, cost per step (us and share of the step), ranks,
    the one-sentence summary."""
    import pandas as pd

    rows = [{"rule": f.rule, "severity": f.severity, "cost_us_per_step": round(f.cost_us_per_step, 1),
             "share_of_step": (f"{100 * f.cost_us_per_step / d.step_us:.1f}%" if d.step_us else ""),
             "ranks": ",".join(map(str, f.ranks)), "summary": f.summary} for f in d.findings]
    return pd.DataFrame(rows, columns=["rule", "severity", "cost_us_per_step", "share_of_step", "ranks", "summary"])


def status_table(d: Diagnosis) -> "pd.DataFrame":
    """What the diagnosis covered: every rule checked or skipped (with why), the traces that failed, and the
    notes on what the traces lack (how to capture them better)."""
    import pandas as pd

    rows = [{"what": "checked", "item": r, "why": ""} for r in d.checked]
    rows += [{"what": "skipped", "item": s.rule, "why": s.why} for s in d.skipped]
    rows += [{"what": "failed", "item": f.get("trace", ""), "why": f.get("error", "")} for f in d.failed]
    rows += [{"what": "note", "item": "", "why": n} for n in d.notes]
    return pd.DataFrame(rows, columns=["what", "item", "why"])


SLICE_COLORS = {"compute": "#1f77b4", "comm": "#d62728", "memory": "#999999", "input": "#ff7f0e",
                "sync": "#9467bd", "allocator": "#e377c2", "host_stall": "#8c564b", "launch": "#bcbd22",
                "step_start": "#dbdb8d", "queued": "#17becf", "unexplained": "#c7c7c7"}
"""one colour per accounting slice (busy: blue/red/grey; idle: by cause)"""


def accounting_table(d: Diagnosis) -> "pd.DataFrame":
    """The step accounting, one row per rank: the job's step split into GPU-busy classes and GPU-idle time by
    what the host was doing (ms per step; the slices of a rank sum to its step), and the idle share."""
    import pandas as pd

    from .accounting import IDLE, SLICES

    rows = []
    for rank, a in sorted(d.accounting.items(), key=lambda kv: int(kv[0])):
        row = {"rank": int(rank), "mode": a["mode"], "steps": a["steps"],
               "step_ms": round((a["step_us"] or a["window_us"]) / 1e3, 3),
               "gpu_idle_share": round(sum(a["share"][s] for s in IDLE), 4)}
        row.update({f"{s}_ms": round(a["us_per_step"][s] / 1e3, 3) for s in SLICES})
        rows.append(row)
    return pd.DataFrame(rows)


def accounting_figure(d: Diagnosis):
    """A stacked bar per rank (tb_plugin's step-time breakdown, with the idle time attributed): each slice's
    share of the rank's step, busy first, then idle by cause; the legend outside the bars."""
    import matplotlib.pyplot as plt

    from .accounting import SLICES

    if not d.accounting:
        return plot.message("no step accounting: no trace with GPU activity (or CPU ops) was read")
    items = sorted(d.accounting.items(), key=lambda kv: int(kv[0]))
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(items) + 1.6))
    y = list(range(len(items)))
    left = [0.0] * len(items)
    for s in SLICES:
        vals = [100 * a["share"][s] for _, a in items]
        if not any(v > 0 for v in vals):
            continue
        ax.barh(y, vals, left=left, color=SLICE_COLORS[s], label=s, edgecolor="white", linewidth=0.5)
        left = [l + v for l, v in zip(left, vals)]
    ax.set_yticks(y, [f"rank {r}" for r, _ in items])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the rank's step (%)")
    ax.set_title(accounting_title(d), fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def accounting_title(d: Diagnosis) -> str:
    """The accounting figure's title: what its bars split, in the mode the doctor ran in, and on what hardware."""
    modes = {a["mode"] for a in d.accounting.values()}
    what = ("the main thread busy (ops, collectives), then waiting by cause" if modes == {"cpu"} else
            "GPU busy, then GPU idle by what the host did")
    return f"Where each rank's step goes: {what} ({_hardware(d)})"


def accounting(d: Diagnosis, save: bool = True) -> "pd.DataFrame":
    """In a notebook: the accounting figure (saved as ``doctor-accounting`` with :func:`kit.plot.save` when
    ``save``), then the table returned for the cell to show."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    fig = accounting_figure(d)
    if save:
        plot.save(fig, "doctor-accounting")
    display(fig)
    plt.close(fig)
    return accounting_table(d)


def finding_text(f: Finding) -> str:
    """The finding as markdown: summary, cause, fix, caveats and the notebook that reproduces it."""
    ranks = ", ".join(map(str, f.ranks)) or "-"
    return (f"### `{f.rule}` ({f.severity}, {f.cost_us_per_step:.0f} us per step, ranks {ranks})\n\n"
            f"{f.summary}\n\n**Cause.** {f.cause}\n\n**Fix.** {f.fix}"
            + (f"\n\n**Caveats.** {f.caveats}" if f.caveats else "")
            + (f"\n\n**Reproduced in** [`notebooks/{f.notebook}.ipynb`](../notebooks/{f.notebook}.ipynb)"
               if f.notebook else ""))


def _paths(d: Diagnosis) -> dict[int, str]:
    return {int(r): p for r, p in zip(d.ranks, d.traces)}


def excerpt_title(d: Diagnosis, f: Finding) -> str:
    """A finding's figure title: its rule, severity, cost and ranks, and the hardware (its sentence is the text
    above the figure)."""
    ranks = ", ".join(map(str, f.ranks[:8])) + (", ..." if len(f.ranks) > 8 else "")
    s = "s" if len(f.ranks) > 1 else ""
    return f"{f.rule} ({f.severity}, {f.cost_us_per_step / 1e3:.2f} ms per step, rank{s} {ranks}): {_hardware(d)}"


def excerpt_figure(d: Diagnosis, f: Finding):
    """The timeline excerpt of one finding (see the module docstring); a message figure when there is none."""
    ex = dict(f.evidence or {}).get("excerpt")
    title = excerpt_title(d, f)
    paths = _paths(d)
    if not ex or "t0_us" not in ex:
        rank = dict(f.evidence or {}).get("rank", f.ranks[0] if f.ranks else None)
        ex = _first_step(paths.get(int(rank))) if rank is not None and int(rank) in paths else None
        if ex is None:
            return plot.message(f"no timeline excerpt for {f.rule}: see its evidence numbers", title)
        ex, title = {"rank": int(rank), **ex}, f"{title}; the rule names no moment: rank {rank}'s first step"
    ranks = [int(r) for r in ex.get("ranks") or [ex["rank"]] if int(r) in paths]
    if not ranks:
        return plot.message(f"the excerpt's ranks {ex.get('ranks')} are not among the traces given", title)
    try:
        return _draw(paths, ranks, int(ex["rank"]), float(ex["t0_us"]), float(ex["t1_us"]), title)
    except Exception as e:  # a trace moved or unreadable here: say so where the figure would be
        return plot.message(f"cannot draw the excerpt: {type(e).__name__}: {e}", title)


def _first_step(path: str | None) -> dict[str, float] | None:
    """The window of a trace's first profiled step (or of its first :data:`MAX_BARS` GPU activities): where a
    finding that names no moment is drawn."""
    from .. import traces
    from .steps import steps_frame

    if path is None:
        return None
    t = traces.load_trace(path)
    st = steps_frame(t.cpu)
    if len(st):
        end = float(st["ts"].iloc[1]) if len(st) > 1 else float(st["end"].iloc[0])
        return {"t0_us": float(st["ts"].iloc[0]), "t1_us": end}
    g = t.gpu.sort_values("ts").iloc[:MAX_BARS]
    return {"t0_us": float(g["ts"].min()), "t1_us": float(g["end"].max())} if len(g) else None


def _draw(paths: dict[int, str], ranks: list[int], clock_rank: int, t0: float, t1: float, title: str):
    import textwrap

    import matplotlib.pyplot as plt

    from .. import traces
    from .calls import STEP_PREFIX

    loaded = {r: traces.load_trace(paths[r]) for r in sorted(set(ranks) | {clock_rank})}
    offs = traces.clock_offsets(list(loaded.values())) if len(loaded) > 1 else {clock_rank: 0.0}
    shift = offs.get(clock_rank, 0.0)
    a, b = t0 + shift, t1 + shift  # the window on the common clock
    lanes: list[tuple[str, list, str]] = []  # (label, [(start, dur, color)], kind)
    for r in ranks:
        t, off = loaded[r], offs.get(r, 0.0)
        lanes.append((f"rank {r} host", _host_bars(t, off, a, b), "host"))
        gpu = t.gpu.assign(ts=t.gpu["ts"] + off, end=t.gpu["end"] + off)
        gpu = gpu[(gpu["end"] > a) & (gpu["ts"] < b)]
        for (dev, stream), g in gpu.groupby(["device", "stream"], sort=True):
            bars = [(s, e - s, NCCL_COLOR if n else (COMPUTE_COLOR if c == "kernel" else COPY_COLOR))
                    for s, e, n, c in zip(g["ts"], g["end"], g["nccl"], g["cat"])]
            lanes.append((f"rank {r} GPU{dev} s{stream}", bars[:MAX_BARS], "gpu"))
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.42 * len(lanes)))
    for y, (label, bars, kind) in enumerate(reversed(lanes)):
        if bars:
            ax.broken_barh([((s - a) / 1e3, max(w, 0.05) / 1e3) for s, w, _ in bars], (y - 0.3, 0.6),
                           facecolors=[c for _, _, c in bars], edgecolors="none", linewidth=0)
    for r in ranks:  # step boundaries
        t, off = loaded[r], offs.get(r, 0.0)
        st = t.cpu[(t.cpu["cat"] == "user_annotation") & t.cpu["name"].astype(str).str.startswith(STEP_PREFIX)]
        for x in st["ts"] + off:
            if a <= x <= b:
                ax.axvline((x - a) / 1e3, color="k", lw=0.6, ls=":")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([lab for lab, _, _ in reversed(lanes)], fontsize=8)
    ax.set_xlim(0, (b - a) / 1e3)
    ax.set_xlabel("ms (ranks on one clock: the end of a shared collective is the same moment)")
    ax.set_title("\n".join(textwrap.wrap(title, 130)[:3]), fontsize=8)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=n) for n, c in (("NCCL / collective call", NCCL_COLOR),
                                                           ("compute kernel", COMPUTE_COLOR),
                                                           ("memcpy/memset", COPY_COLOR),
                                                           ("DataLoader wait", DATA_COLOR),
                                                           ("synchronising call", SYNC_COLOR),
                                                           (f"other call > {LONG_CALL_US:g} us", CALL_COLOR))],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def _host_bars(t, off: float, a: float, b: float) -> list[tuple[float, float, str]]:
    """The host events an excerpt shows in ``[a, b)`` (the trace's clock + ``off``): DataLoader waits, synchronising
    calls and other long runtime calls (a launch into a full queue) as the host model classifies them
    (:func:`kit.doctor.host_model.runtime_calls`: a device-to-pageable-host copy is a sync), collective ops (the
    trace layer's :data:`kit.traces.frames.COMM_OPS`)."""
    from ..traces.frames import COMM_OPS
    from .calls import DATALOADER
    from .host_model import runtime_calls
    from .model import RankView
    from .steps import steps_frame

    def cut(df):
        df = df.assign(ts=df["ts"] + off, end=df["end"] + off)
        return df[(df["end"] > a) & (df["ts"] < b)]

    cpu = cut(t.cpu)
    calls = cut(runtime_calls(RankView(trace=t, steps=steps_frame(t.cpu), rank=-1))) if not t.cpu.empty else cpu
    names = cpu["name"].astype(str)
    sync = calls["kind"].eq("sync") if "kind" in calls else calls["ts"].isna() & False
    kinds = [(cpu, cpu["cat"].eq("user_annotation") & names.str.startswith(DATALOADER), DATA_COLOR),
             (calls, sync, SYNC_COLOR),
             (calls, ~sync & (calls["dur"] > LONG_CALL_US), CALL_COLOR),
             (cpu, cpu["cat"].isin(["user_annotation", "cpu_op"]) & names.str.match(COMM_OPS), COMM_COLOR)]
    out = []
    for df, mask, color in kinds:
        sel = df[mask]
        out += [(s, e - s, color) for s, e in zip(sel["ts"], sel["end"])][:MAX_BARS]
    return out


def show(d: Diagnosis, save: bool = True) -> None:
    """In a notebook: for each finding its text (markdown) and its excerpt figure (saved to figures/ with
    :func:`kit.plot.save` when ``save``)."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    if not d.findings:
        display(Markdown("**No findings**: every rule that could run found nothing (see the table below)."))
    for i, f in enumerate(d.findings):
        display(Markdown(finding_text(f)))
        fig = excerpt_figure(d, f)
        if save:
            plot.save(fig, f"doctor-{i + 1}-{f.rule}")
        display(fig)
        plt.close(fig)


def explore(d: Diagnosis, interactive: bool = True) -> None:
    """Pick a finding and read its evidence as JSON (ipywidgets). Batch runs (``kit run``) skip it."""
    if not interactive:
        print("interactive = False: widgets skipped (batch run)")
        return
    if not d.findings:
        print("no findings to explore")
        return
    import json

    import ipywidgets as W
    from IPython.display import display

    pick = W.Dropdown(options=[(f"{f.rule} ({f.severity})", i) for i, f in enumerate(d.findings)],
                      description="finding")
    out = W.Output()

    def on_pick(_: Any = None) -> None:
        out.clear_output()
        with out:
            print(json.dumps(d.findings[pick.value].evidence, indent=1, default=str))

    pick.observe(on_pick, "value")
    on_pick()
    display(W.VBox([pick, out]))
