"""Every analysis of every investigation in the registry, on input it cannot draw anything from: no runs, and a
CPU (gloo) run whose rows hold nothing the analysis knows. Each table has no rows (nothing was measured; a table
that always shows a recorded run holds that run's rows, the same whatever the input), each figure is drawn or says why not
(:func:`conftest.figure_says`), the findings are statements -- nothing raises."""

import pandas as pd
import pytest

from conftest import figure_says, make_run
from kit import contract, results

NAMES = [n for n in contract.REGISTRY if contract.get(n).run is not None]  # analysis pages (the doctor) run nothing
_FIXED: dict = {}


def _on_no_runs(name: str, table: str) -> pd.DataFrame:
    if (name, table) not in _FIXED:
        _FIXED[name, table] = contract.get(name).table(table, results.RunSet([]))
    return _FIXED[name, table]


@pytest.fixture(params=["no-runs", "cpu-run"])
def runs(request, tmp_path):
    if request.param == "no-runs":
        return results.RunSet([])
    d = make_run(tmp_path / "r" / "20990101-000000-x-000000", [{"rank": 0, "kind": "unknown", "time_us": 1.0}],
                 "any", backend="gloo", world_size=1)
    return results.RunSet([d])


@pytest.mark.parametrize("name", NAMES)
def test_every_analysis_on_nothing_to_analyse(name, runs):
    inv = contract.get(name)
    assert inv.tables and inv.figures, name
    for table in inv.tables:
        t = inv.table(table, runs)
        assert isinstance(t, pd.DataFrame), (name, table)
        # rows only from the runs given (none here), or a recorded run the table always shows (an emulated-nodes
        # run's network proxy, graph_gaps' probes): the same rows whatever the input
        if not runs.dirs:
            _FIXED[name, table] = t
        fixed = _on_no_runs(name, table)
        assert t.empty if fixed.empty else t.equals(fixed), (name, table, t.head())
    for fig_name, fig in inv.figures.items():
        assert figure_says(fig(runs)), (name, fig_name)
    found = inv.findings(runs)
    assert all(isinstance(f, contract.Observation) and f.text for f in found), name
