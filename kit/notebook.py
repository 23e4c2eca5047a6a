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

from typing import Any, Mapping

from . import contract, plot, results


def start(name: str, namespace: Mapping[str, Any]):
    """``(investigation, validated Config)``; sets the plot style and pandas display options."""
    import pandas as pd

    inv = contract.get(name)
    plot.style()
    pd.set_option("display.width", 180, "display.max_columns", 30)
    return inv, inv.from_notebook(namespace)


def execute(inv: contract.Investigation, cfg) -> list[results.Run]:
    """Run the investigation here (one launch per ``env_sets`` entry). When this machine cannot run it,
    print what is missing and return ``[]``: the notebook then shows the recorded runs."""
    try:
        made = contract.execute_all(inv.name, cfg)
    except contract.Skipped as e:
        print(f"{inv.name} cannot run on this machine:")
        for r in e.reasons:
            print(f"  - {r}")
        print("The analyses below show the recorded runs instead.")
        return []
    for r in made:
        print(f"{r.dir}: {r.meta.get('label') or 'run'} {r.meta.get('status')}, {len(r.rows)} rows",
              *r.meta.get("warnings", []))
    return made


def choose(inv: contract.Investigation, made, analyse: Any = "auto") -> results.RunSet:
    runs = results.choose(inv.name, made, analyse)
    print("analysing", runs)
    return runs


def show(inv: contract.Investigation, name: str, runs: results.RunSet, round_to: int = 2) -> None:
    """Display table ``name`` (rounded); says so when it is empty. Returns nothing (a notebook cell would
    show a returned table a second time); ``inv.table(name, runs)`` gives the DataFrame."""
    t = inv.table(name, runs)
    if t is None or len(t) == 0:
        print(f"{name}: nothing to show for these runs")
        return
    _display(t.round(round_to))


def findings(inv: contract.Investigation, runs: results.RunSet) -> None:
    """Print the measured statements (``inv.findings(runs)`` gives the Finding objects)."""
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

    w_table.observe(on_table, "value")
    w_col.observe(on_col, "value")
    on_col(None)

    def view(table, column, value):
        t = tables[table]
        if column and value not in (None, "(all)"):
            t = t[t[column].astype(str) == value]
        _display(t.round(3))

    _display(W.interactive(view, table=w_table, column=w_col, value=w_val))


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:  # plain python
        print(obj)
