"""`kit run`: notebooks through papermill into an HTML report; bad configs and failing cells."""

import dataclasses
import json
import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT, assert_plan_kept
from notebook_commit import as_committed, clean_filter, run_filter
from kit import contract, runner
from kit.config import NOTEBOOK_EXTRAS, ConfigError, LaunchConfig, load_yaml, parse_override
from kit.contract import REGISTRY, get


def _params_cell(name):
    nb = nbformat.reads(as_committed(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    return nb, cells[0]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_notebook_parameters_match_config(name):
    """The parameters cell holds plain literals, one per Config field + the notebook extras, same defaults."""
    nb, cell = _params_cell(name)
    ns = {}
    exec(cell.source, {"__builtins__": {}}, ns)  # literals only: no names, no imports
    cfg_cls = get(name).Config
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    own = set(fields)
    if get(name).run is None:  # an analysis page declares its own parameters, not the launch settings
        own -= {f.name for f in dataclasses.fields(LaunchConfig)}
        assert set(ns) == own | {"interactive"}
    else:
        assert set(ns) == own | set(NOTEBOOK_EXTRAS)
    defaults = dataclasses.asdict(cfg_cls())
    for k in own:
        assert ns[k] == defaults[k], k
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "commit notebooks without outputs: `make setup` installs the git filter that strips them (nbstripout)")
    raw = json.loads(as_committed(ROOT / "notebooks" / f"{name}.ipynb"))  # nbformat would add missing ids quietly
    assert all("id" in c for c in raw["cells"]), "every cell has an id (nbformat's MissingIDFieldWarning otherwise)"


def test_committed_notebooks_are_what_the_filter_writes():
    """Every committed notebook passes through the git filter unchanged (nbstripout's form: no outputs, keys
    sorted, no per-machine language_info), so a notebook only run and saved in JupyterLab shows as unchanged in
    ``git status`` (``make test-browser ARGS="--lab collectives"`` checks that in JupyterLab)."""
    rels = [f"notebooks/{name}.ipynb" for name in sorted(REGISTRY)]
    cmd = clean_filter(ROOT / rels[0])
    if cmd is None:
        pytest.skip("no git clean filter configured for notebooks here (`make setup` installs nbstripout's)")
    for rel in rels:
        blob = subprocess.run(["git", "-C", str(ROOT), "show", f":{rel}"], capture_output=True, check=True).stdout
        assert run_filter(cmd, rel, blob) == blob, f"{rel}: commit it as the filter writes it ({cmd} < {rel})"


@pytest.mark.slow
@pytest.mark.background("run", "collectives", "--config", "configs/cpu-smoke.yaml", "--results-root", "{root}")
def test_kit_run_collectives_cpu_smoke(background):
    """The CI path end to end: executed notebook, HTML report with the figure, index page, figures/ copy."""
    p, tmp_path = background
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[1/1] collectives: ok" in p.stdout
    report = next((tmp_path / "reports").iterdir())
    html = (report / "collectives.html").read_text()
    assert "data:image/png;base64" in html  # figures embedded: the HTML can be shared alone
    assert (report / "figures" / "collectives-busbw.png").stat().st_size > 10_000
    assert "collectives.html" in (report / "index.html").read_text()
    assert (ROOT / "figures" / "collectives-busbw.png").exists()
    executed = nbformat.read(report / "collectives.ipynb", as_version=4)
    assert any("interactive = False" in "".join(o.get("text", "") for o in c.get("outputs", []))
               for c in executed.cells if c.cell_type == "code")
    # the experiment's own run directory, written from inside the notebook
    runs = list((tmp_path / "collectives").glob("*/rows.csv"))
    assert len(runs) == 1


def test_bad_config_is_one_clear_error_and_nothing_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  world_size: two\ncollectives:\n  max_byte: 10\nnot_a_notebook: {}\n")
    p = subprocess.run([sys.executable, "-m", "kit", "run", "collectives", "--config", str(bad),
                        "--results-root", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    err = p.stderr
    assert "unknown section(s) ['not_a_notebook']" in err
    assert "world_size: expected int, got str 'two'" in err
    assert "unknown key 'max_byte'" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # nothing ran


def test_world_size_larger_than_gpus_is_a_reason_not_a_crash(tmp_path):
    """More NCCL ranks than GPUs: that investigation cannot run here (its page says why); the others still run."""
    params = runner.resolve_params(["collectives"], ROOT / "configs" / "cpu-smoke.yaml",
                                   [("world_size", 16), ("backend", "nccl")])
    why = runner.cannot_run(["collectives"], params)["collectives"]
    assert "needs 16 GPUs" in why[0]
    with pytest.raises(ConfigError, match="'cuda' is not one of 'auto', 'nccl', 'gloo'"):
        runner.resolve_params(["collectives"], ROOT / "configs" / "cpu-smoke.yaml", [("backend", "cuda")])


def test_failing_cell_names_notebook_and_cell_and_keeps_partial_notebook(tmp_path, monkeypatch):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.read(ROOT / "notebooks" / "collectives.ipynb", as_version=4)
    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])) + 1
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell("raise RuntimeError('boom in a cell')"))
    nbformat.write(nb, nbdir / "collectives.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOKS", nbdir)
    report, entries = runner.run(["collectives"], str(ROOT / "configs" / "cpu-smoke.yaml"), [],
                                 results_root=str(tmp_path / "r"), copy_figures=False, log=lambda *a: None)
    e = entries[0]
    assert e["status"] == "failed"
    assert "notebook collectives: cell" in e["error"] and "RuntimeError: boom in a cell" in e["error"]
    assert (report / "collectives.ipynb").exists() and (report / "collectives.html").exists()
    assert "failed" in (report / "index.html").read_text()


def test_cli_unknown_notebook_is_one_clear_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "kit", "run", "nope", "--results-root", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no notebook for ['nope']" in p.stderr and "Traceback" not in p.stderr


def _failing_notebook(folder):
    """collectives' notebook with a cell that raises after its parameters, registered in its place."""
    nbdir = folder / "nbs"
    nbdir.mkdir()
    nb = nbformat.read(ROOT / "notebooks" / "collectives.ipynb", as_version=4)
    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell("raise RuntimeError('boom from the CLI')"))
    nbformat.write(nb, nbdir / "collectives.ipynb")
    return {"KIT_INVESTIGATIONS": f"collectives=kit.investigations.collectives:{nbdir / 'collectives.ipynb'}"}


@pytest.mark.background("run", "collectives", "--config", "configs/cpu-smoke.yaml", "--results-root", "{root}/r",
                        prepare=_failing_notebook)
def test_cli_exit_code_on_failing_notebook(background):
    """`kit run` on a notebook whose cell raises: exit 1, the message names the notebook and the cell."""
    p, _ = background
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED notebook collectives: cell" in p.stderr and "RuntimeError: boom from the CLI" in p.stderr


def test_world_size_one_what_fits_runs_the_rest_says_why(tmp_path, capsys):
    """On CPU, cut to what it must prove: with one rank graph_gaps, dataloader_sync and the doctor fit
    and the others are asked first and say what is missing; a notebook of one that does not fit prints it and
    analyses the recorded runs (rendering a skipped page, exit 0 and --strict's exit 3 are the toy
    investigation's test in test_contract). The two that fit run on one rank, with their tables, figures and
    findings, in test_graph_gaps.py::test_one_rank_runs_and_says_what_it_lacks and
    test_dataloader_sync.py::test_run_one_rank."""
    from kit import notebook

    names = sorted(REGISTRY)
    params = runner.resolve_params(names, ROOT / "configs" / "cpu-smoke.yaml", [("world_size", 1)])
    why = runner.cannot_run(names, params)
    assert set(why) == {"collectives", "collective_tracing", "p2p_transports"}
    assert all("needs at least 2 ranks" in r[0] for r in why.values()), why
    inv = get("collectives")
    cfg = inv.config({k: v for k, v in params["collectives"].items() if k not in NOTEBOOK_EXTRAS}
                     | {"results_root": str(tmp_path)})
    assert notebook.execute(inv, cfg) == []
    out = capsys.readouterr().out
    assert "collectives cannot run on this machine" in out and "needs at least 2 ranks" in out
    assert not (tmp_path / "collectives").exists()  # nothing launched


# the smallest sizes that still exercise every part on 8 ranks (cpu-smoke, then these)
EIGHT_RANKS = {
    "collectives": ["max_bytes=1024", "iters=1", "repeats=2", "warmup=1"],
    "graph_gaps": ["layers=[2]", "repeats=1", "iters=1", "launch_batches=[1]"],
    "collective_tracing": ["timed_steps=1", "profile_steps=1", "warmup_steps=1"],
    # 8 DDP ranks with their loaders; the other H2D and sync modes are the same code on 2 ranks (test_dataloader_sync)
    "dataloader_sync": ["steps=1", "warmup=1", "bucket_caps_mb=[1.0]", "h2d_modes=[prefetch]", "sync_modes=[ddp]",
                        "keep_traces=[]", "profile_steps=0"],
    "p2p_transports": ["max_bytes=1024", "iters=1", "repeats=2", "warmup=1", "directions=[one]", "pipeline_steps=1"],
}


def _eight_ranks(name: str) -> tuple[str, ...]:
    return ("exp", name, "--config", "configs/cpu-smoke.yaml", "-p", "world_size=8", "-p", "results_root={root}",
            *(a for kv in EIGHT_RANKS[name] for a in ("-p", kv)))


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.background(*_eight_ranks(n)))
                                  for n in sorted(EIGHT_RANKS)])
def test_every_investigation_runs_on_eight_gloo_ranks(background, name):
    """On CPU: an 8-GPU node's world size with gloo -- every investigation that launches ranks runs on
    8 and every rank's rows arrive (the 8-stage pipeline, the 8x8 pair matrix, 8 DDP ranks with their loaders),
    at the smallest sizes that still run every part (each launch in the background: conftest.py)."""
    from kit import results

    p, tmp_path = background
    assert p.returncode == 0, f"{name}: {p.stdout[-2000:]}{p.stderr[-2000:]}"
    for d in sorted((tmp_path / name).iterdir()):
        meta = results.read_meta(d)
        assert meta["world_size"] == 8 and meta["status"] == "ok", (name, meta.get("warnings"))
        df = results.load(d)
        df = df[0] if isinstance(df, tuple) else df
        assert sorted(df["rank"].unique()) == list(range(8)), name
    cfg = contract.make_config(name, {**load_yaml(ROOT / "configs" / "cpu-smoke.yaml")["defaults"],
                                      **load_yaml(ROOT / "configs" / "cpu-smoke.yaml")[name],
                                      **dict(parse_override(kv) for kv in EIGHT_RANKS[name]),
                                      "world_size": 8, "results_root": str(tmp_path)})
    assert_plan_kept(name, cfg, sorted((tmp_path / name).iterdir()))  # the 8x8 matrix, 8 pipeline stages
