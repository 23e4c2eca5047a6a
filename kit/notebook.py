"""The calls a notebook makes, the same in every notebook (see kit/README.md, "Thin notebooks")::

    from kit import notebook as nb
    inv, cfg = nb.start("collectives", globals())     # validated Config from the parameters cell
    made = nb.execute(inv, cfg)                        # runs it here; [] (with the reason) if it cannot
    runs = nb.choose(inv, made, analyse)               # this run, the recorded runs, or run dirs you name
    nb.show(inv, "busbw", runs)                        # a table
    inv.figure("busbw", runs)                          # a figure, saved to figures/
    nb.findings(inv, runs)                             # the measured statements
    nb.explore(inv, runs, interactive)                 # ipywidgets over the tables (JupyterLab)

Nothing here computes anything an investigation's ``tables``/``figures``/``findings`` do not: it is the glue
that was once written five ways in five notebooks.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from . import contract, plot, results


def start(name: str, namespace: Mapping[str, Any]):
    """``(investigation, validated Config)``; sets the plot style and pandas display options.

    Parameters left at the notebook's defaults take this machine's preset (``configs/cpu-smoke.yaml`` without a
    CUDA GPU, ``configs/gpu.yaml`` with one; ``KIT_PRESET=<file>`` or ``KIT_PRESET=none`` to choose), so Run All
    fits the machine; under ``kit run`` the parameters already come from a config and are taken as they are.
    The first line printed says which. A relative ``results_root`` is the repository's, wherever the notebook
    was opened."""
    import pandas as pd

    inv = contract.get(name)
    plot.style()
    pd.set_option("display.width", 180, "display.max_columns", 30)
    values, line = with_preset(inv, namespace)
    if line:
        print(line)
    return inv, inv.config(values)


def preset_path() -> Path | None:
    """The config whose values fill the parameters left alone: ``KIT_PRESET``, else this machine's preset."""
    chosen = os.environ.get("KIT_PRESET")
    if chosen:
        return None if chosen.lower() == "none" else Path(chosen)
    from .runner import default_config

    return default_config()


def with_preset(inv: contract.Investigation, namespace: Mapping[str, Any]) -> tuple[dict, str]:
    """The Config's values from the notebook's namespace, those left at their defaults replaced by the preset's;
    and one line saying where the values came from."""
    from .config import load_yaml

    fields = {f.name: f for f in dataclasses.fields(inv.Config)}
    values = {k: v for k, v in namespace.items() if k in fields}
    if inv.run is None:  # an analysis page (the doctor) runs nothing: no preset, no config to name; it says what it read
        line = ""
    elif os.environ.get("KIT_PARAMS"):  # kit run: papermill injected the values of a config file
        line = f"parameters: {os.environ['KIT_PARAMS']} (kit run)"
    else:
        path = preset_path()
        defaults = dataclasses.asdict(inv.Config())
        preset = {}
        if path is not None:
            data = load_yaml(path if path.is_absolute() or path.exists() else results.REPO_ROOT / path)
            preset = {**(data.get("defaults") or {}), **(data.get(inv.name) or {})}
        taken = {k: v for k, v in preset.items() if k in values and values[k] == defaults.get(k) != v}
        mine = sorted(k for k in values if values[k] != defaults.get(k))
        values.update(taken)
        if path is None:
            line = "parameters: as set in the notebook (no preset)"
        else:
            from .launch import cuda_device_count

            gpus = cuda_device_count()
            machine = f"{gpus} CUDA GPU(s)" if gpus else "no CUDA GPU"
            shown = ", ".join(f"{k}={v}" for k, v in list(taken.items())[:6]) + (", ..." if len(taken) > 6 else "")
            line = (f"parameters: {_short(path)} preset ({machine} here) for {len(taken)} left at the notebook's "
                    f"defaults ({shown})" + (f"; yours: {', '.join(mine)}" if mine else "")
                    + " -- `%env KIT_PRESET=none` runs the notebook's own values")
        line += _long_run_warning(inv, values)
    root = values.get("results_root")
    if isinstance(root, str) and not os.path.isabs(root):  # JupyterLab starts the kernel in notebooks/
        values["results_root"] = str(results.REPO_ROOT / root)
    return values, line


def _long_run_warning(inv: contract.Investigation, values: Mapping[str, Any]) -> str:
    """Without a CUDA GPU: a second line naming the sizes well above the CPU preset's (a long run ahead)."""
    from .config import load_yaml
    from .launch import cuda_device_count

    if inv.run is None or cuda_device_count():
        return ""
    cpu = load_yaml(results.REPO_ROOT / "configs" / "cpu-smoke.yaml").get(inv.name) or {}
    big = [f"{k}={values[k]} (CPU preset {v})" for k, v in cpu.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(values.get(k), (int, float))
           and values[k] > 4 * max(v, 1)]
    return f"\nno CUDA GPU: {', '.join(big)} -- a long run on CPU; the progress bar shows it" if big else ""


def execute(inv: contract.Investigation, cfg) -> list[results.Run]:
    """Run the investigation here (one launch per ``env_sets`` entry) with a progress bar over its planned
    measurement points (kit.progress). When this machine cannot run it, print what is missing and return ``[]``:
    the notebook then shows the recorded runs. An interrupt (Kernel > Interrupt) stops the ranks and ends with one
    line."""
    from .progress import watch

    try:
        if os.environ.get("KIT_PARAMS"):  # kit run shows the bar in its terminal (kit.progress.watch)
            made = contract.execute_all(inv.name, cfg)
        else:
            with watch(Path(cfg.results_root) / inv.name, inv.name, contract.planned_points(inv.name, cfg),
                       notebook=True):
                made = contract.execute_all(inv.name, cfg)
    except contract.Skipped as e:
        print(f"{inv.name} cannot run on this machine:")
        for r in e.reasons:
            print(f"  - {r}")
        print("The analyses below show the recorded runs instead.")
        return []
    except KeyboardInterrupt:
        raise Interrupted(f"{inv.name}: interrupted; the ranks are stopped, rows measured so far are in "
                          f"{Path(cfg.results_root) / inv.name}") from None
    for r in made:
        print(f"{r.dir}: {r.meta.get('label') or 'run'} {r.meta.get('status')}, {len(r.rows)} rows",
              *r.meta.get("warnings", []))
    return made


def _short(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(results.REPO_ROOT))
    except ValueError:
        return str(path)


class Interrupted(KeyboardInterrupt):
    """An interrupted run: IPython shows this one line instead of a traceback (``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


def choose(inv: contract.Investigation, made, analyse: Any = "auto") -> results.RunSet:
    """The runs the analyses below show (kit.results.choose). When they are the recorded runs although this
    machine ran the investigation (a CPU run: it proves the path, not the hardware), this run's first table is
    shown too, so the page has this machine's own numbers beside the recorded ones."""
    runs = results.choose(inv.name, made, analyse)
    print(analysing(runs))
    _note_provenance(runs)
    if made and not set(runs.dirs) & {r.dir for r in made}:
        here = results.RunSet([r.dir for r in made], "this run")
        for name in inv.tables:
            t = inv.table(name, here)
            if t is not None and len(t):
                print(f"this machine's own run ({here.title.splitlines()[0]}), table {name!r}; "
                      "the analyses below show the recorded runs:")
                _display(t.head(12).round(2))
                break
    return runs


def recorded(inv: contract.Investigation, *machines: str) -> results.RunSet:
    """The recorded sets ``<investigation>@<machine>`` of ``recorded/sets.json`` as one RunSet (several machines:
    their runs side by side), for a notebook's section on other hardware."""
    sets = [results.choose(inv.name, [], "recorded", set_name=f"{inv.name}@{m}") for m in machines]
    if len(sets) == 1:
        return sets[0]
    return results.RunSet([d for s in sets for d in s.dirs], "recorded: " + ", ".join(machines))


def analysing(runs: results.RunSet) -> str:
    """The line a page prints for the runs it shows: where they come from, how many, their status, and their
    directories relative to the repository (not the recorded machine's or this one's absolute paths)."""
    if not runs.dirs:
        return "analysing: no runs"
    statuses = ", ".join(sorted({results.run_status(m) for m in runs.metas}))
    return (f"analysing {len(runs.dirs)} run(s) ({statuses}) from {runs.source or 'these directories'} -- "
            + ", ".join(_short(d) for d in runs.dirs))


def hardware(runs: results.RunSet) -> None:
    """The machine the runs ran on (its sysinfo) and the nccl-tests binaries they ran, without that machine's own
    paths: an environment value that is an absolute path names its last part only, a binary its file name."""
    if not runs.dirs:
        return
    from . import sysinfo

    info = dict(runs.meta.get("sysinfo") or {})
    info["env"] = {k: (f".../{Path(v).name}" if isinstance(v, str) and v.startswith("/") else v)
                   for k, v in (info.get("env") or {}).items()}
    print(sysinfo.format_text(info) if info.get("hostname") else "hardware: not recorded with these runs")
    bins = (runs.meta.get("nccl_tests") or {}).get("binaries") or {}
    print("nccl-tests:", ", ".join(sorted(Path(b).name for b in bins.values())) if bins
          else "not run (CPU/gloo run, or binaries not found)")


def _note_provenance(runs: results.RunSet) -> None:
    """Under ``kit run``: which runs the figures saved from now on show, for the report index's captions."""
    from . import plot, sysinfo

    when = sorted({(m.get("start_time") or "")[:10] for m in runs.metas} - {""})
    hw = sysinfo.summary(runs.meta.get("sysinfo") or {}).split(" | ")[0] if runs.dirs else ""
    plot.note_source(runs.source, hw, when)


def show(inv: contract.Investigation, name: str, runs: results.RunSet, round_to: int = 2) -> None:
    """Display table ``name`` (rounded); says so when it is empty. Returns nothing (a notebook cell would
    show a returned table a second time); ``inv.table(name, runs)`` gives the DataFrame."""
    t = inv.table(name, runs)
    if t is None or len(t) == 0:
        print(f"{name}: nothing to show for these runs")
        return
    _display(t.round(round_to))


def findings(inv: contract.Investigation, runs: results.RunSet) -> None:
    """Print the measured statements (``inv.findings(runs)`` gives the Observation objects)."""
    fs = inv.findings(runs)
    if not fs:
        print("no findings: these runs have no rows the findings are computed from")
    for f in fs:
        print("-", f.text)


def explore(inv: contract.Investigation, runs: results.RunSet, interactive: bool = True) -> None:
    """Pick a table and filter it by one column's value (ipywidgets). Batch runs (``kit run``) skip it."""
    if not interactive:
        print("interactive = False: widgets skipped (batch run)")
        return
    import ipywidgets as W

    tables = {n: inv.table(n, runs) for n in inv.tables}
    tables = {n: t for n, t in tables.items() if t is not None and len(t)}
    if not tables:
        print("no tables to explore")
        return

    def cols(name):
        return [c for c in tables[name].columns if tables[name][c].nunique() <= 50]

    w_table = W.Dropdown(options=list(tables), description="table")
    w_col = W.Dropdown(options=cols(w_table.value), description="column")
    w_val = W.Dropdown(options=[], description="value")

    def on_table(_):
        w_col.options = cols(w_table.value)

    def on_col(_):
        t = tables[w_table.value]
        w_val.options = ["(all)"] + sorted(map(str, t[w_col.value].dropna().unique())) if w_col.value else ["(all)"]
        w_val.value = "(all)"

    w_table.observe(on_table, "value")
    w_col.observe(on_col, "value")
    on_col(None)
    w_val.value = "(all)"

    def view(table, column, value):
        import pandas as pd

        t = tables[table]
        if column and value not in (None, "(all)"):
            t = t[t[column].astype(str) == value]
        print(f"{table}: {len(t)} of {len(tables[table])} rows -- {runs.source or runs.title}")
        with pd.option_context("display.max_rows", 200, "display.min_rows", 50):
            _display(t.round(3))

    _display(W.interactive(view, table=w_table, column=w_col, value=w_val))


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:  # plain python
        print(obj)
