"""Every analysis of every investigation in the registry, on input it cannot draw anything from: no runs, and a
CPU (gloo) run whose rows hold nothing the analysis knows. Each table is a DataFrame, each figure is drawn or says
why not (:func:`conftest.figure_says`), the findings are statements -- nothing raises."""

import pandas as pd
import pytest

from conftest import figure_says, make_run
from kit import contract, results

NAMES = [n for n in contract.REGISTRY if contract.get(n).run is not None]  # analysis pages (the doctor) run nothing


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
        assert isinstance(inv.table(table, runs), pd.DataFrame), (name, table)
    for fig_name, fig in inv.figures.items():
        assert figure_says(fig(runs)), (name, fig_name)
    found = inv.findings(runs)
    assert all(isinstance(f, contract.Observation) and f.text for f in found), name
