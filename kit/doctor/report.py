"""The doctor's text report (``kit doctor`` without ``--json``): what a person reads in a terminal.

Order: one header line (traces, ranks, steps, step time); the findings at or above ``low``, most costly per step
first, each with its severity, rule, cost (us and share of the step), ranks, the one-sentence summary, the
evidence numbers, the cause, the fix, the caveats and the notebook that reproduces it; then the findings below
``low`` in one line each (information: within the run-to-run spread of a step); then what was checked, what was
skipped and why, what the traces lack (capture notes) and the traces that could not be read.
"""

from __future__ import annotations

import textwrap
from typing import Any

from .model import REPORTED, SEVERITY_SHARE, Diagnosis, Finding

WIDTH = 110


def _wrap(label: str, text: str) -> list[str]:
    pad = " " * 6
    return textwrap.wrap(text, WIDTH, initial_indent=f"    {label:<9} ", subsequent_indent=pad + " " * 8) or [
        f"    {label}"]


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _value(v: Any) -> str:
    """A value in words: numbers rounded; a flat mapping as ``key value, ...``, a flat list as ``a, b``; anything
    deeper named by its keys or length (its numbers are in ``--json``), never a JSON blob."""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"
    if isinstance(v, dict):
        if all(_scalar(x) for x in v.values()):
            return "(" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + ")" if v else "none"
        return f"({', '.join(map(str, v))}: in --json)"
    if isinstance(v, (list, tuple)):
        if all(_scalar(x) for x in v):
            return ", ".join(_value(x) for x in v) or "none"
        return f"{len(v)} entr{'y' if len(v) == 1 else 'ies'} (in --json)"
    return str(v)


def evidence_lines(ev: dict[str, Any]) -> list[str]:
    """The evidence as ``key value`` pairs, wrapped, then each rank's cost (the timeline pointer ``excerpt`` is
    the notebook's)."""
    skip = {"per_rank", "excerpt", "per_rank_note"}
    pairs = [f"{k} {_value(v)}" for k, v in ev.items() if k not in skip]
    out = textwrap.wrap("; ".join(pairs), WIDTH, initial_indent="    evidence  ", subsequent_indent=" " * 14)
    per = ev.get("per_rank")
    if isinstance(per, dict) and len(per) > 1 and all(  # the full per-rank numbers are in --json
            isinstance(n, dict) and n.get("cost_us_per_step") is not None for n in per.values()):
        note = f", {ev['per_rank_note']}" if ev.get("per_rank_note") else ""
        costs = ", ".join(f"{rank}: {_value(nums.get('cost_us_per_step'))}" for rank, nums in per.items())
        out += textwrap.wrap(f"cost per rank (us per step{note}) {costs}", WIDTH, initial_indent="    ",
                             subsequent_indent=" " * 14)
    return out


def finding_lines(i: int, f: Finding, step_us: float | None) -> list[str]:
    share = f" ({100 * f.cost_us_per_step / step_us:.1f}% of the step)" if step_us else ""
    ranks = ", ".join(map(str, f.ranks[:16])) + (f", ... ({len(f.ranks)} ranks)" if len(f.ranks) > 16 else "")
    out = [f"{i}. [{f.severity.upper()}] {f.rule}: {f.cost_us_per_step:.0f} us per step{share}, rank(s) {ranks}"]
    out += textwrap.wrap(f.summary, WIDTH, initial_indent="    ", subsequent_indent="    ")
    out += evidence_lines(dict(f.evidence))
    out += _wrap("cause", f.cause) + _wrap("fix", f.fix)
    if f.caveats:
        out += _wrap("caveats", f.caveats)
    if f.notebook:
        out.append(f"    notebook  notebooks/{f.notebook}.ipynb")
    return out


def accounting_header(modes: set[str]) -> str:
    """What the accounting's slices mean, in the mode the doctor ran in: the GPU's timeline, or on a CPU-only job
    (no GPU activity in the traces) the main thread's."""
    if modes == {"cpu"}:
        return ("step accounting (share of each rank's step; no GPU in the traces, the main thread's time: busy in "
                "compute (its ops) or comm (a collective running), else waiting, by cause):")
    return ("step accounting (share of each rank's step; GPU busy: compute, comm, memory; GPU idle, by what the host "
            "was doing)" + ("; CPU-only ranks: the main thread's time" if "cpu" in modes else "") + ":")


def accounting_lines(d: Diagnosis, max_ranks: int = 16) -> list[str]:
    """The step accounting per rank: one line each, the slices that are not zero as a share of the step
    (busy first, then idle by cause; they sum to 100%)."""
    from .accounting import BUSY, SLICES

    if not d.accounting:
        return []
    items = sorted(d.accounting.items(), key=lambda kv: int(kv[0]))
    out = ["\n" + accounting_header({a["mode"] for _, a in items})]
    for rank, a in items[:max_ranks]:
        parts = [f"{s} {100 * a['share'][s]:.1f}%" for s in SLICES if a["share"].get(s, 0) >= 0.0005]
        idle = sum(a["share"][s] for s in SLICES if s not in BUSY)
        split = a.get("comm_split")
        if split and a["us_per_step"].get("comm"):
            c = a["us_per_step"]["comm"]
            parts = [p + (f" (waiting for peers {100 * split['waiting_us'] / c:.0f}%)" if p.startswith("comm ") else "")
                     for p in parts]
        out.append(f"  rank {rank}: {'idle' if a['mode'] == 'gpu' else 'waiting'} {100 * idle:.1f}% | "
                   + ", ".join(parts))
    if len(items) > max_ranks:
        out.append(f"  ... {len(items) - max_ranks} more ranks in --json")
    return out


def format_text(d: Diagnosis) -> str:
    """The whole report (module docstring)."""
    step = f"{d.step_us:.0f} us" if d.step_us else "unknown"
    steps = f"{d.steps} profiled step(s)" if d.steps else "no step annotations (the traced span is one step)"
    lines = [f"kit doctor: {len(d.traces)} trace(s), rank(s) {', '.join(map(str, d.ranks))}; {steps}; "
             f"step time {step} (median over ranks)"]
    lines += accounting_lines(d)
    problems = [f for f in d.findings if f.severity in REPORTED]
    info = [f for f in d.findings if f.severity not in REPORTED]
    lo = 100 * SEVERITY_SHARE["low"]
    if problems:
        lines.append(f"\n{len(problems)} finding(s), most costly first (severity: cost per step as a share of the "
                     f"step; high >= {100 * SEVERITY_SHARE['high']:g}%, medium >= "
                     f"{100 * SEVERITY_SHARE['medium']:g}%, low >= {lo:g}%):")
        for i, f in enumerate(problems, 1):
            lines.append("")
            lines += finding_lines(i, f, d.step_us)
    else:
        lines.append(f"\nno finding at or above 'low' ({lo:g}% of the step)")
    if info:
        lines.append("\nbelow 'low' (information, within a run's step-time spread):")
        lines += [f"  {f.rule}: {f.cost_us_per_step:.0f} us per step, rank(s) {', '.join(map(str, f.ranks[:16]))}"
                  for f in info]
    lines.append(f"\nchecked ({len(d.checked)}): {', '.join(d.checked) or 'none'}")
    if d.skipped:
        lines.append(f"skipped ({len(d.skipped)}):")
        for s in d.skipped:
            lines += textwrap.wrap(f"{s.rule}: {s.why}", WIDTH, initial_indent="  ", subsequent_indent="    ")
    if d.notes:
        lines.append("capture notes (what the traces lack):")
        for n in d.notes:
            lines += textwrap.wrap(n, WIDTH, initial_indent="  ", subsequent_indent="    ")
    if d.flight_recorder:
        lines.append("Flight Recorder (--fr):")
        for n in d.flight_recorder:
            lines += textwrap.wrap(n, WIDTH, initial_indent="  ", subsequent_indent="    ")
    if d.failed:
        lines.append(f"failed traces ({len(d.failed)}; the diagnosis covers the others):")
        lines += [f"  {x['error'] if x['error'].startswith(x['trace']) else x['trace'] + ': ' + x['error']}"
                  for x in d.failed]
    return "\n".join(lines)
