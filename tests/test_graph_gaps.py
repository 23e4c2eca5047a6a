"""graph_gaps on CPU (gloo: eager timing only), its parameters, and its analysis of the recorded GPU runs."""

import subprocess
import sys

import pytest

from conftest import ROOT
from kit import contract as experiments, results
from kit.investigations import graph_gaps as G
from kit.config import ConfigError


def test_gloo_path_rows_and_env_sets(tmp_path):
    cfg = experiments.make_config("graph_gaps", {"world_size": 2, "backend": "gloo", "layers": [2, 3], "batch": 4,
                                                 "hidden": 16, "iters": 2, "repeats": 2, "warmup": 1,
                                                 "results_root": str(tmp_path)})
    runs = experiments.execute_all("graph_gaps", cfg)
    assert [r.meta["label"] for r in runs] == ["default env", "NCCL_GRAPH_MIXING_SUPPORT=0"]
    assert runs[1].meta["sysinfo"]["env"]["NCCL_GRAPH_MIXING_SUPPORT"] == "0"  # reached the ranks
    df = results.load(*[r.dir for r in runs])
    t = df[df.kind == "time"]
    # 2 settings x 2 layer counts x 2 models x 2 ranks x 2 samples, eager only without CUDA
    assert len(t) == 32 and set(t["mode"]) == {"eager"}
    assert (df[df.kind == "check"]["output_rms"] > 0).all()
    ft = G.forward_table(df)
    assert set(ft["layers"]) == {2, 3} and (ft["time_us_median"] > 0).all()


def test_activations_keep_their_size_through_640_all_reduced_layers(tmp_path):
    """Rank-specific weights with Var = 1/(h * world): the all-reduced sum keeps E|y|^2, so the 640-layer
    forward computes on real numbers, not on inf/NaN or underflowed zeros (which can time differently)."""
    cfg = experiments.make_config("graph_gaps", {"world_size": 2, "backend": "gloo", "layers": [640], "batch": 4,
                                                 "hidden": 512, "iters": 1, "repeats": 1, "warmup": 0, "env_sets": [],
                                                 "control": False, "results_root": str(tmp_path)})
    run = experiments.execute("graph_gaps", cfg)
    rms = [r["output_rms"] for r in run.rows if r["kind"] == "check"]
    assert len(rms) == 2 and all(0.05 < x < 20 for x in rms), rms  # the input's RMS is 1


def test_bad_parameters():
    with pytest.raises(ConfigError, match="layers must be"):
        experiments.make_config("graph_gaps", {"layers": []})
    with pytest.raises(ConfigError, match="unknown key 'layer'"):
        experiments.make_config("graph_gaps", {"layer": [10]})
    with pytest.raises(ConfigError, match=r"env_sets\[0\]: expected a mapping"):
        experiments.make_config("graph_gaps", {"env_sets": ["NCCL_GRAPH_MIXING_SUPPORT=0"]})


def test_recorded_runs_show_the_finding():
    """The committed 2xH200 runs: with mixing support on, graph replay's gap before NCCL grows with N and the
    graph gets slower than eager; with NCCL_GRAPH_MIXING_SUPPORT=0 it does not."""
    dirs = results.recorded("graph_gaps")
    labels = {results.run_label(results.read_meta(d)) for d in dirs}
    assert {"default env", "NCCL_GRAPH_MIXING_SUPPORT=0"} <= labels
    ft = G.forward_table(results.load(*dirs))
    g = ft[(ft.model == "allreduce") & (ft["mode"] == "graph")].set_index(["label", "layers"])
    on, off = g.loc["default env"], g.loc["NCCL_GRAPH_MIXING_SUPPORT=0"]
    assert on["gap_nccl_median_us"].is_monotonic_increasing
    assert on.loc[640, "gap_nccl_median_us"] > 10 * off.loc[640, "gap_nccl_median_us"]
    assert on.loc[640, "graph_over_eager"] > 1.2 and off.loc[640, "graph_over_eager"] < 1.05
    ct = G.census_table(results.load(*dirs))
    assert ct.loc["EVENT_RECORD", "default env"] > 0 and ct.loc["EVENT_RECORD", "NCCL_GRAPH_MIXING_SUPPORT=0"] == 0
    lt = G.launch_table(results.load(*dirs))
    assert lt[(lt.bench == "chain") & (lt.batch == 1)]["speedup"].iloc[0] > 2


def test_kit_run_graph_gaps_cpu_smoke(tmp_path):
    p = subprocess.run([sys.executable, "-m", "kit", "run", "graph_gaps", "--config", "configs/cpu-smoke.yaml",
                        "--results-root", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    report = next((tmp_path / "reports").iterdir())
    html = (report / "graph_gaps.html").read_text()
    # without CUDA the notebook shows the committed GPU runs: their figures are in the report
    assert "recorded:" in html and "NVIDIA H200" in html
    figs = {f.name for f in (report / "figures").iterdir()}
    assert {"graph_gaps-forward-time.png", "graph_gaps-census.png", "graph_gaps-gap-vs-layers.png",
            "graph_gaps-launch-speedup.png", "graph_gaps-timeline.png"} <= figs
