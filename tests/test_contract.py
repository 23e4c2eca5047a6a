"""The experiment contract (kit/README.md): a throwaway investigation built from the recipe alone -- one
module, a thin notebook, a config section, registered from outside the kit's tree -- runs through `kit exp`
and `kit run` on gloo; one this machine cannot run gets a page that says why. Plus the shared primitives."""

import json
import os
import textwrap

import nbformat
import pytest

from conftest import ROOT
from kit import contract, results, stats
from kit.collective_ops import COLLECTIVES, bus_factor, canonical, from_kernel
from kit.config import ConfigError

TOY = '''
"""toy: the smallest investigation the recipe allows (kit/README.md)."""
from dataclasses import dataclass
from typing import Literal

from kit import stats, timing
from kit.config import LaunchConfig
from kit.contract import Observation, Investigation, Needs


@dataclass
class Config(LaunchConfig):
    numel: int = 1024
    op: Literal["sum", "max"] = "sum"
    repeats: int = 4


def run(cfg, ctx):
    import torch
    import torch.distributed as dist

    t = torch.ones(cfg.numel)
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[cfg.op]
    s = timing.measure(lambda: dist.all_reduce(t, op=op), ctx, iters=2, repeats=cfg.repeats, warmup=1)
    yield from s.rows(kind="sample", numel=cfg.numel, bytes=cfg.numel * 4)


def times(runs):
    return stats.slowest_rank_stats(runs.df, ["numel"]) if len(runs.df) else runs.df


def times_figure(runs):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    t = times(runs)
    ax.bar([str(n) for n in t.get("numel", [])], t.get("time_us_median", []))
    return fig


def findings(runs):
    t = times(runs)
    if t.empty:
        return []
    r = t.iloc[0]
    return [Observation("median_us", f"all_reduce of {int(r.numel)} floats: {r.time_us_median:.1f} us (median)",
                        float(r.time_us_median), "us")]


INVESTIGATION = Investigation(name=NAME, Config=Config, run=run, columns=("kind", "sample", "time_us"),
                              tables={"times": times}, figures={"times": times_figure}, findings=findings,
                              needs=Needs(ranks=RANKS), question="how long does a tiny gloo all_reduce take?")
'''

NOTEBOOK_CODE = [
    "from kit import notebook as nb\ninv, cfg = nb.start(NAME, globals())\nmade = nb.execute(inv, cfg)\n"
    "runs = nb.choose(inv, made, analyse)",
    "nb.show(inv, 'times', runs)\ninv.figure('times', runs)\nnb.findings(inv, runs)\nnb.explore(inv, runs, interactive)",
]


def _make_investigation(tmp_path, name, ranks):
    """The recipe, followed to the letter in a folder outside the kit: module, notebook, config section."""
    pkg = tmp_path / "mine"
    pkg.mkdir(exist_ok=True)
    (pkg / f"{name}.py").write_text(TOY.replace("NAME", repr(name)).replace("RANKS", str(ranks)))
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    params = nbformat.v4.new_code_cell("world_size = 0\nbackend = 'auto'\nnumel = 1024\nop = 'sum'\nrepeats = 4\n"
                                       "interactive = True\nanalyse = 'auto'")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), params] + [
        nbformat.v4.new_code_cell(c.replace("NAME", repr(name))) for c in NOTEBOOK_CODE]
    nbformat.write(nb, pkg / f"{name}.ipynb")
    return pkg


def _toy_files(folder):
    """The two toy investigations and their config in ``folder``: the variables that register them."""
    pkg = _make_investigation(folder, "toy", 2)
    _make_investigation(folder, "toy_big", 64)
    (folder / "toy.yaml").write_text("defaults:\n  world_size: 2\n  backend: gloo\n  timeout_s: 60\ntoy:\n  numel: 2048\n"
                                     "toy_big:\n  repeats: 2\n")
    return {"PYTHONPATH": f"{pkg}{os.pathsep}{ROOT}",
            "KIT_INVESTIGATIONS": f"toy=toy:{pkg / 'toy.ipynb'},toy_big=toy_big:{pkg / 'toy_big.ipynb'}"}


@pytest.fixture
def toy_env(tmp_path):
    return {**os.environ, **_toy_files(tmp_path)}, tmp_path / "toy.yaml"


# the recipe's four commands, each on its own copy of the toy files, in the background (conftest.py): ~30 s of
# notebook kernels and launches beside the other tests
EXP_TOY = ("exp", "toy", "--config", "{root}/toy.yaml", "-p", "results_root={root}/r")
RUN_BOTH = ("run", "toy", "toy_big", "--config", "{root}/toy.yaml", "--results-root", "{root}/k")
RUN_STRICT = ("run", "toy_big", "--config", "{root}/toy.yaml", "--results-root", "{root}/k", "--strict")
EXP_BIG = ("exp", "toy_big", "--config", "{root}/toy.yaml", "-p", "results_root={root}/r")


@pytest.mark.slow
@pytest.mark.background(*EXP_TOY, prepare=_toy_files)
@pytest.mark.background(*RUN_BOTH, prepare=_toy_files)
@pytest.mark.background(*RUN_STRICT, prepare=_toy_files)
@pytest.mark.background(*EXP_BIG, prepare=_toy_files)
def test_recipe_investigation_runs_through_kit_exp_and_kit_run(backgrounds):
    p, root = backgrounds[EXP_TOY]
    assert p.returncode == 0, p.stdout + p.stderr
    df = results.load(root / "r" / "toy")
    assert set(df["rank"]) == {0, 1} and (df["kind"] == "sample").all() and (df["numel"] == 2048).all()
    assert len(df) == 2 * 4  # every sample of every rank kept

    p, root = backgrounds[RUN_BOTH]
    assert p.returncode == 0, p.stdout + p.stderr  # toy_big cannot run here: still exit 0
    report = next((root / "k" / "reports").iterdir())
    entries = {e["name"]: e for e in json.loads((report / "report.json").read_text())["entries"]}
    assert entries["toy"]["status"] == "ok" and entries["toy"]["figures"] == ["figures/toy-times.png"]
    assert entries["toy_big"]["status"] == "skipped"
    assert "needs at least 64 ranks; this configuration starts 2" in entries["toy_big"]["missing"][0]
    index = (report / "index.html").read_text()
    assert "1 ran on this machine, 1 cannot run here" in index and "needs at least 64 ranks" in index
    html = (report / "toy_big.html").read_text()
    assert "toy_big cannot run on this machine" in html and "Traceback" not in html
    executed = (report / "toy.html").read_text()
    assert "all_reduce of 2048 floats" in executed  # the finding, printed from findings(runs)

    p, _ = backgrounds[RUN_STRICT]
    assert p.returncode == 3 and "toy_big cannot run here" in p.stderr and "Traceback" not in p.stderr
    p, _ = backgrounds[EXP_BIG]
    assert p.returncode == 3 and "cannot run on this machine" in p.stderr and "Traceback" not in p.stderr


def test_recipe_config_is_typed_and_rows_are_checked(tmp_path, toy_env, monkeypatch):
    env, _ = toy_env
    monkeypatch.setenv("KIT_INVESTIGATIONS", env["KIT_INVESTIGATIONS"])
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    inv = contract.get("toy")
    with pytest.raises(ConfigError) as e:
        inv.config({"op": "mean", "numell": 3})
    assert "'mean' is not one of 'sum', 'max'" in str(e.value) and "unknown key 'numell'" in str(e.value)
    with pytest.raises(KeyError, match="without declared column"):
        inv.check_row({"kind": "sample", "sample": 0})
    assert inv.notebook_path == tmp_path / "mine" / "toy.ipynb"
    with pytest.raises(KeyError, match="has no table 'nope'"):
        inv.table("nope", results.RunSet([]))


def test_registry_lists_every_builtin_investigation_with_a_notebook():
    for name in contract.REGISTRY:
        inv = contract.get(name)
        assert inv.name == name and inv.notebook_path.exists() and inv.question
        if inv.run is None:  # an analysis page (the doctor): launches nothing, has no tables of runs
            assert contract.missing(name, inv.config()) == []
            continue
        assert "kind" in inv.columns and inv.tables and inv.figures


def test_bad_registry_entry_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("KIT_INVESTIGATIONS", "justaname")
    with pytest.raises(ConfigError, match="not name=module"):
        contract.names()
    with pytest.raises(ConfigError, match="unknown investigation 'nope'"):
        monkeypatch.delenv("KIT_INVESTIGATIONS")
        contract.get("nope")


def test_needs_say_what_is_missing_and_what_the_machine_has():
    from kit.config import LaunchConfig

    one_h100 = contract.Machine(gpus=1, gpu_name="NVIDIA H100 80GB HBM3", nccl=True, world_size=1, backend="nccl")
    two = contract.Needs(ranks=2, cuda=True)(LaunchConfig(), one_h100)
    assert two == ["needs 2 CUDA GPU(s) in one node with NCCL; this machine: 1 x NVIDIA H100 80GB HBM3"]
    assert contract.Needs(ranks=1)(LaunchConfig(), one_h100) == []
    cpu = contract.Machine(gpus=0, world_size=1)
    assert "this configuration starts 1" in contract.Needs(ranks=2)(LaunchConfig(world_size=1), cpu)[0]
    no_p2p = contract.Machine(gpus=2, gpu_name="X", peer_access=False, nccl=True, world_size=2, backend="nccl")
    assert "peer access" in contract.Needs(ranks=2, peer_access=True)(LaunchConfig(), no_p2p)[0]


# ------------------------------------------------------------------------------------------------ primitives
def test_stats_and_slowest_rank_per_sample():
    import pandas as pd

    st = stats.stats(list(range(1, 11)))
    assert st["n"] == 10 and st["median"] == 5.5 and st["min"] == 1 and abs(st["p90"] - 9.1) < 1e-9
    assert stats.stats([])["n"] == 0 and stats.stats([3.0])["std"] == 0.0
    df = pd.DataFrame({"k": ["a"] * 4, "rank": [0, 1, 0, 1], "sample": [0, 0, 1, 1], "time_us": [1.0, 5.0, 2.0, 3.0]})
    slow = stats.per_sample(df, ["k"])
    assert slow["time_us"].tolist() == [5.0, 3.0]
    assert stats.per_sample(df, ["k"], how="min")["time_us"].tolist() == [1.0, 2.0]
    s = stats.slowest_rank_stats(df, ["k"])
    assert s.loc[0, "time_us_median"] == 4.0 and s.loc[0, "time_us_n"] == 2
    empty = stats.slowest_rank_stats(pd.DataFrame(), ["k"])
    assert empty.empty and "time_us_median" in empty.columns


def test_gbps_one_definition():
    import pandas as pd

    assert stats.gbps(1e9, 1e6) == 1.0  # 1 GB in 1 s
    s = stats.gbps(pd.Series([2e9, 1.0]), pd.Series([1e6, 0.0]))
    assert s.iloc[0] == 2.0 and s.isna().iloc[1]


def test_collectives_table_matches_nccl_tests_and_traces():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8 and bus_factor("all_gather", 4) == 0.75
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("send", 2) == 1.0 and bus_factor("all_reduce", 1) == 0.0
    assert COLLECTIVES["all_to_all"].nccl_tests == "alltoall_perf"
    assert canonical("gloo:allreduce") == "all_reduce" and canonical("_allgather_base") == "all_gather"
    assert canonical("_reduce_scatter_base") == "reduce_scatter"
    assert from_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "all_reduce"
    assert from_kernel("_Z29ncclKernel_AllGather_RING_LL_Sum_int8_t") == "all_gather"
    assert from_kernel("volta_sgemm") is None


def test_choose_runs_one_rule(tmp_path):
    def fake(root, exp, name, backend, label):
        d = root / exp / name
        d.mkdir(parents=True)
        results.write_json(d / "meta.json", {"experiment": exp, "status": "ok", "backend": backend, "label": label,
                                             "sysinfo": {"gpus": [{"name": "G"}] if backend == "nccl" else []}})
        (d / "rows.csv").write_text("kind,x\na,1\n")
        return results.Run(d, results.read_meta(d))

    rec = tmp_path / "recorded"
    fake(rec, "e", "20260101-000000-a", "nccl", "default env")
    newer = fake(rec, "e", "20260102-000000-a", "nccl", "default env")
    other = fake(rec, "e", "20260101-000001-a", "nccl", "NCCL_X=0")
    cpu_run = fake(tmp_path / "results", "e", "20260103-000000-a", "gloo", "")
    gpu_run = fake(tmp_path / "results", "e", "20260103-000001-a", "nccl", "")
    auto_cpu = results.choose("e", cpu_run, "auto", root=rec)
    assert auto_cpu.dirs == sorted([newer.dir, other.dir]) and auto_cpu.source.startswith("recorded")
    assert results.choose("e", [gpu_run], "auto", root=rec).dirs == [gpu_run.dir]
    assert results.choose("e", cpu_run, "this", root=rec).dirs == [cpu_run.dir]
    assert results.choose("e", [], "auto", root=tmp_path / "none").dirs == []
    given = results.choose("e", cpu_run, [str(tmp_path / "results" / "e")], root=rec)
    assert len(given.dirs) == 2 and len(given.df) == 2
    with pytest.raises(ValueError, match="analyse must be"):
        results.choose("e", cpu_run, "everything", root=rec)


def test_notebooks_are_thin():
    """<= 40 lines of code beyond the parameters cell, and the findings come from findings(runs)."""
    for name in contract.REGISTRY:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
        lines = [ln for c in code for ln in c.source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(lines) <= 40, (name, len(lines))
        if contract.get(name).run is None:  # an analysis page runs nothing and has no runs to choose
            continue
        src = "\n".join(c.source for c in code)
        assert "nb.findings(inv, runs)" in src and "nb.choose(" in src, name
        assert textwrap.dedent(src).count("nb.execute(") == 1, name
