"""The multi-GPU planted-fault corpora (tests/data/doctor/corpus-h100x*) are what their truth.json files say, and
their generator (tests/corpus/planted_multi.py) still runs in its gloo/CPU dry mode. What the doctor concludes on
them is tested in tests/test_doctor_corpus.py."""

import gzip
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "corpus" / "planted_multi.py"
CORPORA = sorted(p for p in (ROOT / "tests" / "data" / "doctor").glob("corpus-h[0-9]*x*") if p.is_dir())
KEYS = {"case", "fault", "variant", "expected_rule", "expected_ranks", "model", "parallel", "dtype", "profiler",
        "device", "world_size", "step_us_unprofiled", "control", "added_us", "fault_params", "nccl_env", "torch"}


def _truths(corpus: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(corpus.glob("*/truth.json"))}


@pytest.mark.parametrize("corpus", CORPORA, ids=[c.name for c in CORPORA])
def test_truths_and_traces_agree(corpus):
    truths = _truths(corpus)
    assert truths, corpus
    for name, t in truths.items():
        assert KEYS <= set(t) and t["case"] == name
        assert t["world_size"] == int(corpus.name.rsplit("x", 1)[1])
        s = t["step_us_unprofiled"]
        assert len(s["samples"]) >= 30 and s["p10"] <= s["median"] <= s["p90"]
        assert len(s["per_rank"]) == t["world_size"]
        if t["control"] != name and t["control"] in truths:
            ctl = truths[t["control"]]
            assert ctl["fault"] == "none" and ctl["model"] == t["model"] and ctl["parallel"] == t["parallel"]
            # recorded interleaved with its control in one process: against that control's samples
            if not t.get("paired_control"):
                assert t["added_us"] == pytest.approx(s["median"] - ctl["step_us_unprofiled"]["median"], abs=0.2)
        if t.get("paired_control"):
            _check_pair(t)
        traces = sorted((corpus / name).glob("*.json.gz"))
        assert len(traces) == t["world_size"], name
        pattern = {"tb_handler": "*.pt.trace.json.gz", "kit.capture": "trace_rank*.json.gz"}[t["profiler"]]
        assert sorted((corpus / name).glob(pattern)) == traces
        with gzip.open(traces[0]) as f:
            data = json.load(f)
        steps = [e for e in data["traceEvents"] if e.get("cat") == "user_annotation"
                 and str(e.get("name", "")).startswith("ProfilerStep#")]
        assert len(steps) == t.get("trimmed", {}).get("kept_steps", t["profiled_steps"]), name
        if t["profiler"] == "kit.capture":
            assert len(data["kitCapture"]["unprofiled_step_us"] if isinstance(data.get("kitCapture"), dict)
                       else json.loads(data["kitCapture"])["unprofiled_step_us"]) == 5


def _check_pair(t: dict) -> None:
    """A fault recorded interleaved with its control: per round its block median less the control's block median
    of the same round, in the order the rounds ran (from the samples as stored); the added time is their median,
    inside the interval over rounds that is stored with it, which lies inside the rounds' range."""
    m, il, s = _module(), t["interleaved"], t["step_us_unprofiled"]
    n, rounds, by = il["block_steps"], il["alternations"], t["added_us_by_alternation"]

    def blocks(xs):
        return [statistics.median(xs[i:i + n]) for i in range(0, len(xs), n)]

    fault, ctl = blocks(s["samples"]), blocks(t["paired_control"]["samples"])
    assert len(by) == len(fault) == len(ctl) == rounds >= 2
    assert by == pytest.approx([f - c for f, c in zip(fault, ctl)], abs=0.11)
    assert il["block_median_us"] == pytest.approx(fault, abs=0.06)
    assert il["order"].split() == ["AB" if x else "BA" for x in il["control_first_by_round"]]
    over = t["added_us_over_rounds"]
    assert over == m.paired_added(by) and t["added_us"] == over["median"]
    assert min(by) <= over["low"] <= t["added_us"] <= over["high"] <= max(by)


def test_readme_tables_are_generated_from_the_truths():
    spec_mod = _module()
    for corpus in CORPORA:
        assert (corpus / "README.md").read_text() == spec_mod.readme(corpus)


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("planted_multi_t", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_on_gloo_ranks(tmp_path):
    """A control and its one-rank fault on 2 gloo ranks (CPU sizes, 3 timed steps): truth.json with every rank's
    samples and the added time; the fault's traces as tensorboard_trace_handler names them."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--world", "2", "--out", str(tmp_path),
                        "--steps", "3", "--warm", "1", "--cases", "cnn-ddp-fp32-control,cnn-ddp-fp32-stall_rank"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    ctl = json.loads((tmp_path / "cnn-ddp-fp32-control" / "truth.json").read_text())
    t = json.loads((tmp_path / "cnn-ddp-fp32-stall_rank" / "truth.json").read_text())
    assert t["profiler_env"]["TEARDOWN_CUPTI"] == os.environ.get("TEARDOWN_CUPTI", "1")  # CUPTI detached after a trace
    assert ctl["added_us"] is None and len(ctl["step_us_unprofiled"]["per_rank"]) == 2
    assert t["expected_rule"] == "late_rank" and t["expected_ranks"] == [1] and t["backend"] == "gloo"
    assert t["added_us"] == pytest.approx(t["step_us_unprofiled"]["median"] - ctl["step_us_unprofiled"]["median"],
                                          abs=0.2)
    assert len(list((tmp_path / "cnn-ddp-fp32-stall_rank").glob("*.pt.trace.json.gz"))) == 2
    bad = subprocess.run([sys.executable, str(SCRIPT), "--cases", "no-such-case"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "unknown case" in bad.stderr


def test_a_pair_recorded_interleaved_states_its_added_time_against_its_own_control(tmp_path):
    """--pair: the fault's truth holds its control arm's samples (paired_control), the added time against them and
    per round (each block's job median, the slower rank per step, less the control's block of that round)."""
    m = _module()
    arms = [m.CASES[x] for x in m.PAIRS["accum"]]
    for c in arms:
        (tmp_path / c["name"]).mkdir()
    n, rounds = 3, 2

    def rank(base):  # samples of 2 rounds of n steps; blocks and places in the round as time_interleaved gives them
        out = {}
        for j, (c, add) in enumerate(zip(arms, (0.0, 1000.0))):
            s = [base + add + 10.0 * i for i in range(n * rounds)]
            out[c["name"]] = m.P.summarize(s) | {"blocks": [[0, n], [n, 2 * n]],
                                                 "position": [m.round_order(arms, r).index(c) for r in range(rounds)]}
        return out

    truths = m._pair_truths(arms, 2, "cpu", [rank(20000.0), rank(20005.0)], {}, tmp_path, {}, rounds, n)
    fault, ctl = truths[arms[1]["name"]], truths[arms[0]["name"]]
    m._added(fault, tmp_path)
    assert fault["paired_control"]["samples"] == ctl["step_us_unprofiled"]["samples"]
    assert fault["added_us"] == pytest.approx(1000.0) and fault["added_us_by_alternation"] == [1000.0, 1000.0]
    assert fault["interleaved"]["alternations"] == rounds and fault["interleaved"]["block_median_us"][0] == 21015.0
    assert fault["interleaved"]["order"] == "AB BA" and fault["interleaved"]["control_first_by_round"] == [True, False]
    # the fault's round-0 block (median 21015) against the control's round-1 block (20045)
    assert m.against_next_control(fault) == [970.0]
    _check_pair(fault)


def test_rounds_timed_after_tracing_are_kept_beside_the_rounds_before(tmp_path, monkeypatch):
    """--after-rounds: each arm's job block medians after both arms were traced, its medians before and after, and
    the profiler's teardown setting as set; the fault's per-round added time of those rounds."""
    m = _module()
    arms = [m.CASES[x] for x in m.PAIRS["accum"]]
    for c in arms:
        (tmp_path / c["name"]).mkdir()

    def rank(base, slow):  # 2 rounds of 2 steps per arm, ABBA; `slow` added to the fault's steps
        return {c["name"]: m.P.summarize([base + add * slow + i for i in range(4)]) | {
            "blocks": [[0, 2], [2, 4]], "position": [m.round_order(arms, r).index(c) for r in range(2)]}
            for c, add in zip(arms, (0.0, 1.0))}

    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    truths = m._pair_truths(arms, 2, "cpu", [rank(100.0, 10.0), rank(90.0, 10.0)], {}, tmp_path, {}, 2, 2)
    m.after_tracing(truths, arms, [rank(150.0, 30.0), rank(140.0, 30.0)])
    ctl, fault = (truths[c["name"]]["interleaved"] for c in arms)
    assert fault["profiler_env"] == {"TEARDOWN_CUPTI": "1"} == fault["after_tracing"]["profiler_env"]
    assert ctl["after_tracing"]["block_median_us"] == [150.5, 152.5]
    assert ctl["after_tracing"]["median_of_blocks_before_us"] == 101.5
    assert fault["after_tracing"]["added_us_by_alternation"] == [30.0, 30.0]
    assert "added_us_by_alternation" not in ctl["after_tracing"]


def test_pairs_are_timed_in_abba_order():
    """time_interleaved runs the rounds ABBA (the control first in even rounds, the fault first in odd ones), a
    settling step after each switch, and says each arm's place in its round."""
    m = _module()
    arms = [m.CASES[x] for x in m.PAIRS["accum"]]
    ran = []

    class Job:
        dev = "cpu"

        def arm(self, c):
            self.c = c["name"]

        def step(self):
            ran.append(self.c)

    out = m.time_interleaved(Job(), arms, 1, 2, 4)
    a, b = (c["name"] for c in arms)
    blocks = [ran[i] for i in range(8, len(ran), 3)]  # after 4 warm-up steps per arm; 1 settling + 2 timed a block
    assert blocks == [a, b, b, a, a, b, b, a] and len(ran) == 8 + 8 * 3
    assert out[a]["position"] == [0, 1, 0, 1] and out[b]["position"] == [1, 0, 1, 0]
    assert out[a]["blocks"] == [[0, 2], [2, 4], [4, 6], [6, 8]]


def test_a_pairs_interval_over_rounds():
    """The added time of a pair is the median of its rounds; its interval the order statistics whose binomial
    coverage is at least 90% (8 rounds: the 2nd to the 7th, 93.0%), as scipy's quantile test gives it."""
    m = _module()
    by = [238.4, 3502.7, 2623.8, 5602.5, 6268.3, 3458.2, 4154.5, 13358.4]
    o = m.paired_added(by)
    assert (o["median"], o["low"], o["high"], o["coverage"], o["rounds"]) == (3828.6, 2623.8, 6268.3, 0.93, 8)
    assert m.paired_added([1.0, 2.0, 3.0])["low"] == 1.0 and m.paired_added([1.0, 2.0, 3.0])["coverage"] == 0.75
    stats = pytest.importorskip("scipy.stats")
    for xs in (by, by[:6], by + [100.0, 9000.0, 50.0]):
        ci = stats.quantile_test(xs, q=0, p=0.5).confidence_interval(confidence_level=0.9)
        assert (m.paired_added(xs)["low"], m.paired_added(xs)["high"]) == (ci.low, ci.high)


def test_a_set_states_each_fault_against_its_one_control(tmp_path):
    """A set (a control and several faults timed by turns in one job): every fault's truth holds the control arm's
    samples and its own per-round differences; the control has neither."""
    m = _module()
    arms = [m.CASES[x] for x in m.PAIRS["rec_set"]]
    for c in arms:
        (tmp_path / c["name"]).mkdir()
    n, rounds, slow = 2, 2, (0.0, 20000.0, 5000.0, 1000.0)

    def rank(base):
        out = {}
        for c, add in zip(arms, slow):
            s = [base + add + 10.0 * i for i in range(n * rounds)]
            out[c["name"]] = m.P.summarize(s) | {"blocks": [[0, n], [n, 2 * n]],
                                                 "position": [m.round_order(arms, r).index(c) for r in range(rounds)]}
        return out

    truths = m._pair_truths(arms, 3, "cpu", [rank(8000.0), rank(8003.0), rank(7990.0)], {}, tmp_path, {}, rounds, n,
                            settle=5)
    assert "paired_control" not in truths[arms[0]["name"]]
    for c, add in zip(arms[1:], slow[1:]):
        t = truths[c["name"]]
        assert t["paired_control"]["case"] == arms[0]["name"]
        assert t["added_us_by_alternation"] == pytest.approx([add, add], abs=0.11)
        assert t["interleaved"]["settle_steps_per_block"] == 5 and t["interleaved"]["order"] == "AB BA"
        assert t["held_out"] and t["workers"] == m.REC_WORKERS and t["profiler"] == "json_handler"
        assert t["with_stack"] and t["profile_memory"] and t["profiled_steps"] == m.JSON_ACTIVE
    assert not set(m.GROUPS["held_out"]) & set(m.GROUPS["all"])


def test_the_held_out_profiler_writes_plain_json_named_without_the_rank(tmp_path):
    """json_handler: its own on_trace_ready writes trainer-<pid>-0.json (plain), 5 active steps with shapes, stacks
    (Python frames) and memory events; the recommender's step runs on CPU with its batch-yielding loader."""
    m = _module()
    size = m.SIZES["cpu"]["rec"]
    torch = m.torch
    model = m.Rec(**size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(torch.utils.data.DataLoader(m.RecData(size, rounds=1), batch_size=None))

    def step():
        x, y = next(it)
        model(x, y).backward()
        opt.step()
        opt.zero_grad()

    job = type("J", (), {"step": staticmethod(step), "dev": "cpu"})()
    case = m.CASES["rec-ddp-bf16-control"]
    files = m._json_handler(job, case, tmp_path)
    assert files == [f"trainer-{os.getpid()}-0.json"]
    ev = json.loads((tmp_path / files[0]).read_text())["traceEvents"]
    cats = {e.get("cat") for e in ev}
    assert sum(1 for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")) == m.JSON_ACTIVE
    assert "python_function" in cats
    assert any(e.get("name") == "[memory]" for e in ev)


def test_the_held_out_tables_are_generated_from_the_committed_doctor_json():
    """recorded/h200x4/doctor_heldout: its README's tables are what table.py makes of the committed truths and doctor
    outputs (verdicts.py's row from kit doctor --json, then the pass check)."""
    d = ROOT / "recorded" / "h200x4" / "doctor_heldout"
    if not list(d.glob("*/*/*/truth.json.gz")):
        pytest.skip("no held-out recording committed")
    r = subprocess.run([sys.executable, str(d / "table.py"), "table", str(d)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() and r.stdout.strip() in (d / "README.md").read_text()


@pytest.mark.parametrize("match,doctors", [("s11r2", ["doctor-1b19601-whole"]),
                                           ("s11r1", ["doctor-1b19601-whole"])])
def test_the_session_11_held_out_tables_are_generated_from_the_committed_doctor_json(match, doctors):
    """recorded/h200x4/doctor_heldout_s11: each round's tables in its README are what table.py makes of the committed
    truths and doctor outputs, with session 11's criteria (--input-bound-ok)."""
    d = ROOT / "recorded" / "h200x4" / "doctor_heldout_s11"
    if not (d / "bundle.json.gz").is_file():
        pytest.skip("no session-11 held-out recording committed")
    r = subprocess.run([sys.executable, str(d.parent / "doctor_heldout" / "table.py"), "table", str(d), "--doctor",
                        *doctors, "--match", match, "--input-bound-ok"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() and r.stdout.strip() in (d / "README.md").read_text()


def test_the_held_out_profiler_settings_are_changed_by_the_environment(monkeypatch):
    """PLANTED_MULTI_JSON: another user's json_handler settings (stacks without memory, another schedule) for a later
    held-out round; the case's flags follow them, an unknown key, a non-integer, no active step refused; the
    session-11 sets are pairs."""
    m = _module()
    assert m.json_settings() == {"wait": 1, "warmup": 2, "active": m.JSON_ACTIVE, "stack": 1, "memory": 1, "shapes": 1}
    monkeypatch.setenv(m.JSON_SETTINGS_ENV, "memory=0,wait=2,warmup=1,active=4")
    js = m.json_settings()
    assert (js["memory"], js["stack"], js["wait"], js["warmup"], js["active"]) == (0, 1, 2, 1, 4)
    c = m._c("cnn", "ddp", "fp32", "control", "json_handler")
    assert c["with_stack"] and not c["profile_memory"] and c["record_shapes"]
    for bad in ("mem=0", "active=0", "stack=true", "wait=-1"):  # unknown, no active step, not a number, negative
        monkeypatch.setenv(m.JSON_SETTINGS_ENV, bad)
        with pytest.raises(ValueError):
            m.json_settings()
    for name in ("cnn_set", "gpt_set"):
        arms = [m.CASES[x] for x in m.PAIRS[name]]
        assert arms[0]["fault"] == "none" and all(a["control"] == arms[0]["name"] for a in arms[1:])


def test_the_stall_runs_only_at_its_place_and_a_set_is_named_on_the_command_line(monkeypatch):
    """STALL_AT: a stall_rank case's stall runs at its one place in the step (after the optimizer step, in block 0's
    forward hook, before the backward) and only on ONE_RANK; a set made for one round is its case names, control
    first (arms_of), and the session-12 held-out cases stay out of ``all``."""
    from types import SimpleNamespace

    m = _module()
    monkeypatch.setitem(m.FAULT_PARAMS, "stall_rank", {**m.FAULT_PARAMS["stall_rank"], "stall_ms": 0.2})
    assert m.CASES["gpt-fsdp-bf16-stall_rank-fwd"]["stall_at"] == "in_forward"
    assert m.CASES["cnn-ddp-fp32-stall_rank-bwd"]["stall_at"] == "before_backward"
    assert "stall_at" not in m.CASES["cnn-ddp-fp32-stall_rank"]
    for name in ("gpt-fsdp-bf16-stall_rank-fwd", "cnn-ddp-fp32-stall_rank-bwd", "cnn-ddp-fp32-gpu_rank",
                 "cnn-ddp-fp32-tiny_buckets", "gpt-ddp-fp32-accum_no_sync"):
        assert name in m.GROUPS["held_out"] and name not in m.GROUPS["all"]
    for case in (m.CASES["cnn-ddp-fp32-stall_rank"], m.CASES["gpt-fsdp-bf16-stall_rank-fwd"],
                 m.CASES["cnn-ddp-fp32-stall_rank-bwd"]):
        for rank in (m.ONE_RANK, m.ONE_RANK + 1):
            ran = []
            for where in m.STALL_AT:
                job = SimpleNamespace(kind="stall_rank", rank=rank, case=case, record={"step": 0})
                m.MultiJob._stall(job, where)
                ran += [where] if job.record["step"] else []
            assert ran == ([case.get("stall_at", "after_step")] if rank == m.ONE_RANK else [])
    assert m.arms_of("cnn_set") == m.PAIRS["cnn_set"]
    assert m.arms_of("cnn-ddp-fp32-control,cnn-ddp-fp32-gpu_rank") == ("cnn-ddp-fp32-control", "cnn-ddp-fp32-gpu_rank")
    assert m.main(["--pair", "cnn-ddp-fp32-control,gpt-ddp-bf16-control", "--device", "cpu"]) == 2  # two models
    assert m.main(["--pair", "cnn-ddp-fp32-control,no-such-case", "--device", "cpu"]) == 2


@pytest.mark.parametrize("name", ["gpt-fsdp-bf16-stall_rank-fwd", "cnn-ddp-fp32-stall_rank-bwd"])
def test_the_stall_runs_at_its_place_in_a_built_job(monkeypatch, name):
    """STALL_AT on a job built as the recorder builds it (one gloo rank on CPU, FSDP2 or DDP, the stall on it):
    ``in_forward`` moves the stall's counter between block 0's forward and block 1's (the hook is on the model's
    first block, not on the wrapper), ``before_backward`` after the forward and before the optimizer step,
    ``after_step`` only after the optimizer step (REVIEW_S12 L9: the gate test alone never built the hook)."""
    import socket

    import torch.distributed as dist

    m = _module()
    monkeypatch.setattr(m, "ONE_RANK", 0)
    monkeypatch.setitem(m.FAULT_PARAMS, "stall_rank", {**m.FAULT_PARAMS["stall_rank"], "stall_ms": 0.5})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        case = m.CASES[name]
        job = m.MultiJob(case, "cpu", 0, 1, arms=(m.CASES[case["control"]], case))
        inner = job.model.module if hasattr(job.model, "module") else job.model
        blocks = inner.blocks if case["model"] == "gpt" else inner.layers
        seen = {}

        def mark(key):
            return lambda *_: seen.__setitem__(key, job.record["step"]) and None

        blocks[0].register_forward_pre_hook(mark("block0"))
        blocks[1].register_forward_pre_hook(mark("block1"))
        inner.register_forward_hook(mark("forward_end"))
        step = job.opt.step
        monkeypatch.setattr(job.opt, "step", lambda *a, **k: (mark("optimizer")(), step(*a, **k))[1])
        for arm in (m.CASES[case["control"]], case):
            job.arm(arm)
            seen.clear()
            before = job.record["step"]
            job.step()
            moved = {k: v > before for k, v in seen.items()} | {"step_end": job.record["step"] > before}
            if arm is not case:
                assert not any(moved.values()), (arm["name"], moved)
                continue
            where = case.get("stall_at", "after_step")
            want = {"in_forward": (False, True, True, True), "before_backward": (False, False, False, True),
                    "after_step": (False, False, False, False)}[where]
            assert tuple(moved[k] for k in ("block0", "block1", "forward_end", "optimizer")) == want, (where, moved)
            assert moved["step_end"]
        job.close()
    finally:
        dist.destroy_process_group()


def test_an_unmeasured_fault_is_scored_as_a_control(tmp_path):
    """table.py --unmeasured-unscored (session 12's criteria, REVIEW_S12 L7): a fault arm whose rounds' interval is
    not above 0 is scored by the control criteria -- a one-rank finding at 20% of its step is a miss there, a 2%
    one passes; with a measured fault the same finding is scored as the fault."""
    import gzip

    table = ROOT / "recorded" / "h200x4" / "doctor_heldout" / "table.py"
    step = {"median": 10000.0, "p10": 9500.0, "p90": 10500.0, "per_rank": []}
    low = {"none": -800.0, "measured": 900.0}
    for run, lo in low.items():
        for cost in (2000.0, 200.0):
            case = tmp_path / "tag" / f"{run}-{cost:.0f}" / "cnn-ddp-fp32-input_rank"
            case.mkdir(parents=True)
            truth = {"case": case.name, "fault": "input_rank", "variant": "input_rank", "expected_rule": "late_rank",
                     "expected_ranks": [1], "added_us": 1500.0, "step_us_unprofiled": step,
                     "added_us_over_rounds": {"median": 1500.0, "low": lo, "high": 2500.0}}
            doc = {"findings": [{"rule": "late_rank", "ranks": [1], "cost_us_per_step": cost, "evidence": {}}],
                   "profiler_overhead": {}}
            for n, d in (("truth", truth), ("doctor-x", doc)):
                (case / f"{n}.json.gz").write_bytes(gzip.compress(json.dumps(d).encode()))
    r = subprocess.run([sys.executable, str(table), "table", str(tmp_path), "--doctor", "doctor-x",
                        "--unmeasured-unscored"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split(" | ")[0].split()[-1].split("/")[0]: line for line in r.stdout.splitlines()
            if line.startswith("| tag ") and (" | pass | " in line or " | **miss** | " in line)}
    assert "**miss**" in rows["none-2000"] and "as a control" in rows["none-2000"] and "20%" in rows["none-2000"]
    assert "| pass |" in rows["none-200"] and "as a control" in rows["none-200"]
    assert "| pass |" in rows["measured-2000"] and "1.33x" in rows["measured-2000"]
    assert "**miss**" in rows["measured-200"] and "0.13x" in rows["measured-200"]


def test_the_session_12_held_out_table_is_generated_from_the_committed_doctor_json():
    """recorded/h200x4/doctor_heldout_s12 (the blind round s12r1): the table in its README is what table.py makes of
    the committed truths and doctor outputs, with the criteria of TRUTH.md (--input-bound-ok --unmeasured-unscored)."""
    d = ROOT / "recorded" / "h200x4" / "doctor_heldout_s12"
    if not (d / "bundle.json.gz").is_file():
        pytest.skip("no session-12 held-out recording committed")
    r = subprocess.run([sys.executable, str(d.parent / "doctor_heldout" / "table.py"), "table", str(d), "--doctor",
                        "doctor-6ebaf21-returned", "--match", "s12r1", "--input-bound-ok", "--unmeasured-unscored"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() and r.stdout.strip() in (d / "README.md").read_text()


def test_the_session_13_held_out_families_build_and_step_on_one_gloo_rank(monkeypatch):
    """Session 13's held-out set (recorded/h200x2/doctor_heldout_s13/TRUTH.md): the MoE-ish stack, the ViT and the
    LSTM each build under DDP on one gloo rank (CPU sizes) and step; the MoE's in-forward stall is on block 0; the
    LSTM's slow read sleeps in its collation on the planted rank only; the NCCL arm is its own environment; every
    case stays out of ``all``."""
    import socket
    import time

    import torch.distributed as dist

    m = _module()
    monkeypatch.setattr(m, "ONE_RANK", 0)
    monkeypatch.setitem(m.FAULT_PARAMS, "stall_rank", {**m.FAULT_PARAMS["stall_rank"], "stall_ms": 0.5})
    held = [n for n in m.CASES if n.split("-")[0] in m.HELD_MODELS]
    assert held and set(held) <= set(m.GROUPS["held_out"]) and not set(held) & set(m.GROUPS["all"])
    # every held-out family has cases, each with its control beside its faults (properties, not a count)
    assert {n.split("-")[0] for n in held} == set(m.HELD_MODELS)
    for fam in m.HELD_MODELS:
        mine = [n for n in held if n.startswith(f"{fam}-")]
        assert any("-control" in n for n in mine) and any("-control" not in n for n in mine), fam
    assert m.CASES["moe-ddp-bf16-nchan1"]["nccl_env"] == {"NCCL_MAX_NCHANNELS": "1", "NCCL_PROTO": "Simple"}
    assert m.CASES["vit-ddp-bf16-control"]["workers"] == 4 and m.CASES["moe-ddp-bf16-control"]["pin"] is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        for ctl, fault in (("moe-ddp-bf16-control", "moe-ddp-bf16-stall_rank-fwd"),
                           ("lstm-ddp-fp32-control", "lstm-ddp-fp32-input_rank-io"),
                           ("vit-ddp-bf16-accum", "vit-ddp-bf16-accum_no_sync")):
            case = m.CASES[fault]
            if case["model"] == "vit":  # no worker processes in a test
                case = {**case, "workers": 0}
            job = m.MultiJob(case, "cpu", 0, 1, arms=(m.CASES[ctl], case))
            took = {}
            for arm in (m.CASES[ctl], case):
                job.arm(arm)
                before, t = job.record["step"], time.perf_counter()
                job.step()
                took[arm["kind"]] = (time.perf_counter() - t, job.record["step"] > before)
            if fault.startswith("moe"):
                assert took["stall_rank"][1] and not took["control"][1]
                assert type(job.model.module.blocks[0]).__name__ == "MoEBlock"
            if fault.startswith("lstm"):
                assert job.params_used["io_ms_per_batch"] == m.LSTM_IO_MS
                assert took["input_rank"][0] >= m.LSTM_IO_MS / 1e3 and job._plain is not job._fault_it
            job.close()
    finally:
        dist.destroy_process_group()


def test_the_session_13_held_out_table_is_generated_from_the_committed_doctor_json():
    """recorded/h200x2/doctor_heldout_s13 (the blind rounds s13r1 + s13r1d; the replication s13r1c, tag s13rep): each
    table in its README is what table.py makes of the committed truths and doctor outputs, with the criteria of
    TRUTH.md (--input-bound-ok --unmeasured-unscored)."""
    d = ROOT / "recorded" / "h200x2" / "doctor_heldout_s13"
    if not (d / "bundle.json.gz").is_file():
        pytest.skip("no session-13 held-out recording committed")
    import re

    names = re.findall(r"<!-- table.py table: (s13r1|s13rep) (\S+) -->", (d / "README.md").read_text())
    assert names
    for match, name in names:
        r = subprocess.run([sys.executable, str(ROOT / "recorded" / "h200x4" / "doctor_heldout" / "table.py"), "table",
                            str(d), "--doctor", name, "--match", match, "--input-bound-ok", "--unmeasured-unscored"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() and r.stdout.strip() in (d / "README.md").read_text()
