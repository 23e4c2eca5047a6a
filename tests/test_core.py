"""Config validation, results storage, timing statistics, sysinfo without NVML."""

import json
import sys
import types
from pathlib import Path

import pytest

from kit import results, stats, sysinfo, timing
from kit.investigations.collectives import Config as CollConfig
from kit.config import ConfigError, parse_override, validate


# ------------------------------------------------------------------------------------------------ config
def test_config_unknown_key_and_wrong_type_in_one_error():
    with pytest.raises(ConfigError) as ei:
        validate(CollConfig, {"max_byte": 10, "iters": "many", "env": {"NCCL_ALGO": 3}}, where="collectives")
    msg = str(ei.value)
    assert "unknown key 'max_byte'" in msg and "did you mean 'max_bytes'" in msg
    assert "collectives.iters: expected int, got str 'many'" in msg


def test_config_types_are_coerced_only_where_safe():
    cfg = validate(CollConfig, {"timeout_s": 5, "env": {"NCCL_GRAPH_MIXING_SUPPORT": 0}, "collectives": ["all_reduce"]})
    assert cfg.timeout_s == 5.0 and isinstance(cfg.timeout_s, float)
    assert cfg.env == {"NCCL_GRAPH_MIXING_SUPPORT": "0"}  # env values are strings for os.environ
    with pytest.raises(ConfigError, match="expected bool"):
        validate(CollConfig, {"device_time": "yes"})
    with pytest.raises(ConfigError, match="expected int"):
        validate(CollConfig, {"iters": True})  # a bool is not an int here


def test_config_semantic_check():
    with pytest.raises(ConfigError, match="'allreduce' is not one of 'all_reduce'"):
        validate(CollConfig, {"collectives": ["all_reduce", "allreduce"]})
    with pytest.raises(ConfigError, match="min_bytes <= max_bytes"):
        validate(CollConfig, {"min_bytes": 4096, "max_bytes": 1024})


def test_parse_override_yaml_values():
    assert parse_override("max_bytes=4096") == ("max_bytes", 4096)
    assert parse_override("collectives=[all_reduce,broadcast]") == ("collectives", ["all_reduce", "broadcast"])
    assert parse_override("env={NCCL_ALGO: Ring}") == ("env", {"NCCL_ALGO": "Ring"})
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")


# ------------------------------------------------------------------------------------------------ results
def test_run_ids_never_collide(tmp_path):
    dirs = {results.new_run_dir(tmp_path, "x") for _ in range(50)}
    assert len(dirs) == 50 and all(d.is_dir() for d in dirs)


def test_rowwriter_appends_and_widens_header(tmp_path):
    import pandas as pd

    w = results.RowWriter(tmp_path / "rows.csv")
    w.add({"a": 1, "b": 2})
    w.add({"a": 3, "b": 4})
    assert (tmp_path / "rows.csv").read_text().splitlines() == ["a,b", "1,2", "3,4"]
    w.add({"a": 5, "c": [1, 2]})  # new column: file rewritten with the union header
    df = pd.read_csv(tmp_path / "rows.csv")
    assert list(df.columns) == ["a", "b", "c"] and len(df) == 3
    assert df["c"].iloc[2] == "[1, 2]"


def test_load_several_runs_side_by_side(tmp_path):
    for label, env in (("", {"NCCL_ALGO": "Ring"}), ("tree run", {"NCCL_ALGO": "Tree"})):
        d = results.new_run_dir(tmp_path, "collectives")
        results.write_json(d / "meta.json", {"label": label, "env_overrides": env,
                                             "sysinfo": {"gpus": [{"name": "GPU-X"}], "hostname": "h"}})
        results.RowWriter(d / "rows.csv").extend([{"bytes": 1, "time_us": 2.0}, {"bytes": 2, "time_us": 3.0}])
    df = results.load(tmp_path / "collectives")
    assert len(df) == 4
    assert set(df["label"]) == {"NCCL_ALGO=Ring", "tree run"}
    assert set(df["gpu"]) == {"GPU-X"} and df["run_id"].nunique() == 2
    assert len(results.load(str(tmp_path / "collectives" / "*"))) == 4  # a glob works too


def test_meta_written_atomically(tmp_path):
    results.write_json(tmp_path / "meta.json", {"a": 1, "n": float("1.5")})
    assert json.loads((tmp_path / "meta.json").read_text()) == {"a": 1, "n": 1.5}
    assert not list(tmp_path.glob("*.tmp*"))


# ------------------------------------------------------------------------------------------------ timing
def _recorded_metas(machine: str) -> list[tuple[Path, dict]]:
    return [(f, json.loads(f.read_text())) for f in sorted((results.RECORDED_ROOT / machine).rglob("meta.json"))]


@pytest.mark.parametrize("machine", ["h100x1", "h100x2", "h100x4", "h200x2", "h200x2-emulated"])
def test_machine_name_of_recorded_runs_is_their_folder(machine):
    """The GPU model word (not 'hbm3' of 'NVIDIA H100 80GB HBM3') and the GPUs the run used: the h100x2 runs
    were taken with CUDA_VISIBLE_DEVICES=0,1 on a 4-GPU host whose sysinfo lists all four."""
    runs = _recorded_metas(machine)
    if not runs:
        pytest.skip(f"no recorded runs under recorded/{machine}")
    assert {f.relative_to(results.RECORDED_ROOT).as_posix(): results.machine_name(m) for f, m in runs} == \
        {f.relative_to(results.RECORDED_ROOT).as_posix(): machine for f, _ in runs}
    if machine == "h100x2":  # the case that was filed as 'hbm3x4'
        assert any(len(m["sysinfo"]["gpus"]) == 4 for _, m in runs)


def test_machine_name_counts_visible_devices_without_world_size(tmp_path):
    f, meta = (_recorded_metas("h100x2") or [(None, None)])[0]
    if meta is None:
        pytest.skip("no recorded runs under recorded/h100x2")
    meta.pop("world_size")
    assert results.run_gpu_count(meta) == 2  # CUDA_VISIBLE_DEVICES=0,1 of the host's four
    meta["sysinfo"]["env"].pop("CUDA_VISIBLE_DEVICES")
    assert results.machine_name(meta) == "h100x4"  # nothing says fewer: every GPU of the host
    run = tmp_path / "runs" / "collectives" / f.parent.name
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({**meta, "world_size": 2}))
    assert results.record(run, root=tmp_path / "rec") == tmp_path / "rec" / "h100x2" / "collectives" / run.name


@pytest.mark.parametrize("name, model", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                         ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L40S", "l40s"),
                                         ("NVIDIA GeForce RTX 4090", "4090")])
def test_gpu_model_word(name, model):
    assert results.gpu_model(name) == model


def test_stats_known_values():
    st = stats.stats(list(range(1, 11)))  # 1..10
    assert st["n"] == 10 and st["median"] == 5.5 and st["min"] == 1
    assert st["p10"] == pytest.approx(1.9) and st["p90"] == pytest.approx(9.1)
    assert st["mean"] == 5.5


def test_summarize_groups():
    import pandas as pd

    df = pd.DataFrame({"k": ["a"] * 3 + ["b"] * 2, "time_us": [1, 2, 30, 5, 7]})
    s = stats.summarize(df, ["k"]).set_index("k")
    assert s.loc["a", "time_us_median"] == 2 and s.loc["b", "time_us_median"] == 6
    assert s.loc["a", "time_us_n"] == 3


class _HostCtx:
    is_cuda = False
    world_size = 1

    def __init__(self):
        self.barriers = 0

    def sync(self):
        pass

    def barrier(self):
        self.barriers += 1


class _Clock:
    """The host clock kit.timing reads, advanced only by the work a test times: exact, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def work(self, s: float) -> None:
        self.now += s


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(timing, "time", c)
    return c


def test_measure_host_clock_keeps_every_sample(clock):
    ctx = _HostCtx()
    calls = []
    s = timing.measure(lambda: (calls.append(1), clock.work(0.002)), ctx, iters=3, repeats=4, warmup=2)
    assert len(calls) == 2 + 3 * 4
    assert len(s.device_s) == 4 and ctx.barriers == 4  # one aligned start per sample
    assert s.device_s == pytest.approx([0.002] * 4)  # per call, not per sample
    rows = s.rows(collective="x")
    assert [r["sample"] for r in rows] == [0, 1, 2, 3] and rows[0]["method"] == "eager"


def test_measure_interleaved_takes_samples_in_turn(clock):
    """Functions compared in one point: every one warmed up, then sample i of each before sample i + 1, each
    sample barrier-aligned, so a drift of the machine reaches all of them; a slow one stays slow."""
    ctx = _HostCtx()
    log = []
    fns = {"a": lambda: log.append("a"), "b": lambda: (log.append("b"), clock.work(0.002))}
    s = timing.measure_interleaved(fns, ctx, iters=2, repeats=3, warmup=1, finish={"a": lambda: log.append("|")})
    assert "".join(log) == "a|b" + "aa|bb" * 3  # a's finish once per sample (and after its warm-up), b has none
    assert ctx.barriers == 2 * 3 and list(s) == ["a", "b"]
    assert len(s["a"].device_s) == len(s["b"].device_s) == 3
    assert s["a"].device_s == [0.0] * 3 and s["b"].device_s == pytest.approx([0.002] * 3)


# ------------------------------------------------------------------------------------------------ sysinfo
def test_sysinfo_without_nvml_driver(monkeypatch):
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        raise NVMLError("NVML Shared Library Not Found")

    fake.NVMLError = NVMLError
    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    info = sysinfo.collect()
    assert info["gpus"] == [] and "NVML Shared Library Not Found" in info["nvml_error"]
    assert info["env"]["NCCL_ALGO"] == "Ring"
    assert info["torch"] and info["python"] and info["cpu_count"] >= 1
    assert "CPU only" in sysinfo.summary(info)
    text = sysinfo.format_text(info)
    assert "GPUs          none (NVMLError: NVML Shared Library Not Found)" in text and "env           NCCL_ALGO=Ring" in text


def test_sysinfo_topology_from_fake_nvml(monkeypatch):
    """Two GPUs joined by 18 NVLinks, a third on PCIe behind the same host bridge: the nvidia-smi topo labels."""
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    fake.NVMLError = NVMLError
    fake.NVML_CLOCK_SM, fake.NVML_FEATURE_ENABLED, fake.NVML_NVLINK_MAX_LINKS = 1, 1, 18
    bus = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    ns = types.SimpleNamespace
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlSystemGetDriverVersion = lambda: "580.1"
    fake.nvmlSystemGetCudaDriverVersion = lambda: 13000
    fake.nvmlDeviceGetCount = lambda: 3
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: "GPU-X"
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    fake.nvmlDeviceGetPciInfo = lambda h: ns(busId=bus[h])
    fake.nvmlDeviceGetMemoryInfo = lambda h: ns(total=80 * 2**30)
    fake.nvmlDeviceGetClockInfo = lambda h, c: 1500
    fake.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980

    def link_state(h, link):
        if h == 2 or link >= 18:
            raise NVMLError("not supported")
        return 1

    fake.nvmlDeviceGetNvLinkState = link_state
    fake.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: ns(busId=bus[1 - h])
    fake.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 30
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = sysinfo.collect()
    assert info["nvml_error"] is None and info["cuda_driver_version"] == "13.0"
    assert [g["nvlinks_up"] for g in info["gpus"]] == [18, 18, 0]
    assert info["topology"] == [["X", "NV18", "PHB"], ["NV18", "X", "PHB"], ["PHB", "PHB", "X"]]
    assert sysinfo.summary(info).startswith("3x GPU-X (NV18)")


def test_git_commit_survives_a_slow_status(monkeypatch):
    """A ``git status`` that does not answer in time (the notebooks' clean filter starting after a checkout) keeps
    the commit and says its state is unknown; a checkout's commit is a 40-hex hash either way."""
    import subprocess

    real = subprocess.run

    def slow_status(cmd, *a, **k):
        if "status" in cmd:
            raise subprocess.TimeoutExpired(cmd, k.get("timeout", 0))
        return real(cmd, *a, **k)

    good = results.git_commit()
    if good is None:
        pytest.skip("not a git checkout")
    monkeypatch.setattr(subprocess, "run", slow_status)
    got = results.git_commit()
    assert got == good.split("-")[0] + "-dirty-unknown" and len(got.split("-")[0]) == 40
