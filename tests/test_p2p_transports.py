"""p2p_transports on CPU (gloo, 2-3 ranks): the transport interface keeps data intact (odd sizes, dtypes,
strided tensors, more messages in flight than slots), the overlap harnesses produce complete rows, the 1F1B
pipeline equals a single-process forward/backward, bad parameters are one clear error, and the notebook runs
through `kit run`. GPU tests (marker `gpu`) repeat the integrity check over nccl, ipc and copy."""

import subprocess
import sys

import pytest

import exps
from conftest import ROOT
from kit import contract as experiments
from kit.investigations.p2p_transports import pipeline as P
from kit.investigations import p2p_transports as X
from kit.config import ConfigError
from kit.launch import launch

SMALL = dict(max_bytes=65536, iters=3, repeats=3, warmup=1, flow_bytes=1 << 20, small_bytes=1024, compute_n=32,
             compute_matmuls=2, overlap_bytes=4096, overlap_messages=3, semantics_bytes=[1024], recv_delay_ms=30.0,
             pipeline_hidden=32, pipeline_batch=8, pipeline_steps=2, pipeline_micro_batches=4)


def _cfg(tmp_path, **kw):
    return experiments.make_config("p2p_transports", {"world_size": 2, "backend": "gloo", "timeout_s": 60,
                                                      "results_root": str(tmp_path), **SMALL, **kw})


def test_interface_keeps_data_intact_on_gloo(tmp_path):
    run = launch(exps.p2p_integrity, _cfg(tmp_path), "p2p_integrity")
    df = run.df()
    assert set(df.transport) == {"gloo"}
    # 6 shapes x 4 dtypes x (contiguous, strided) per receiving rank, both directions at once, + the burst
    assert len(df) == 2 * 6 * 4 * 2 + 1
    assert df.ok.all(), df[~df.ok]
    assert (~df.out_contiguous).any()  # strided receive buffers were exercised


def test_pattern_check_catches_corruption():
    import torch

    from kit import transports as p2p

    want = p2p.pattern(1001, "cpu", seq=3, src=0)
    p2p.check(want.clone(), want, "same")
    bad = want.clone()
    bad[517] += 1
    with pytest.raises(AssertionError, match="1 of 1001 bytes, first at byte 517"):
        p2p.check(bad, want, "corrupt")
    with pytest.raises(AssertionError):  # a message of another sequence number is not accepted
        p2p.check(p2p.pattern(1001, "cpu", seq=4, src=0), want, "stale")
    assert torch.equal(p2p.pattern(8, "cpu", 0, 1), p2p.pattern(8, "cpu", 0, 1))


def test_schedule_is_1f1b():
    assert P.schedule(0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert P.schedule(1, 2, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    for n, m in ((3, 5), (4, 2)):
        for s in range(n):
            ops = P.schedule(s, n, m)
            assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            live, peak = 0, 0
            for k, _ in ops:
                live += 1 if k == "F" else -1
                peak = max(peak, live)
            assert peak == min(n - s, m)  # 1F1B bounds the activations kept alive


def test_drive_runs_stages_cooperatively_and_reports_a_deadlock():
    class Box:
        posted = 0

    box = Box()
    log = []

    def producer():
        for i in range(3):
            log.append(("put", i))
            box.posted += 1
            yield

    def consumer():
        for i in range(3):
            while box.posted <= i:
                yield
            log.append(("got", i))

    P.drive([consumer(), producer()], box)
    assert [e for e in log if e[0] == "got"] == [("got", 0), ("got", 1), ("got", 2)]
    assert log.index(("put", 2)) < log.index(("got", 2))

    def waits_forever():
        while True:
            yield

    with pytest.raises(RuntimeError, match="schedule deadlock"):
        P.drive([waits_forever(), waits_forever()], Box())


@pytest.mark.parametrize("world", [2, 3])
def test_pipeline_equals_single_process(tmp_path, world):
    cfg = _cfg(tmp_path, world_size=world, pipeline_micro_batches=5)
    run = launch(exps.pipeline_vs_reference, cfg, "pp_ref")
    df = run.df()
    assert sorted(df.stage) == list(range(world))
    for r in df.itertuples():
        assert r.scale > 0
        assert r.max_err <= 1e-6 * r.scale, r
    last = df[df.stage == world - 1].iloc[0]
    assert last.loss == pytest.approx(last.ref_loss, rel=1e-6)


def test_whole_experiment_on_gloo(tmp_path):
    run = experiments.execute("p2p_transports", _cfg(tmp_path, transports=["copy", "gloo"], verify=True))
    df = run.df()
    skipped = df[df.kind == "skipped"]
    assert set(skipped.transport) == {"copy"} and skipped.reason.str.contains("CUDA").all()
    b = X.bandwidth(df)
    assert set(b.direction) == {"one", "both"} and len(b) == 2 * len(range(10, 17))  # 1 KiB .. 64 KiB
    assert (b.gbps > 0).all() and (b.time_us_n == 3).all()
    assert df[df.kind == "bandwidth"].verified.all()
    cc = X.comm_comm(df)
    assert set(zip(cc.scenario, cc["mode"])) == {(s, m) for s in ("two_flows", "small_behind_big")
                                                  for m in ("one_stream", "two_streams")}
    assert (cc.time_us_n == 3).all()
    co = X.comm_compute(df).iloc[0]
    assert co.compute_alone_us > 0 and co.comm_alone_us > 0 and co.serial_sum_us == co.compute_alone_us + co.comm_alone_us
    se = X.semantics(df).set_index(["api", "role"])
    # gloo's blocking send waits for the late receiver; its isend returns at once and wait() blocks instead
    assert se.loc[("send", "send"), "call_us"] > 0.6 * 30e3
    assert se.loc[("isend", "send"), "call_us"] < 0.3 * 30e3
    assert se.loc[("isend", "send"), "wait_us"] > 0.6 * 30e3
    pp = X.pipeline(df).iloc[0]
    assert pp.steps == 2 and pp.time_ms_median > 0 and pp.loss > 0


def test_three_ranks_pair_matrix_and_one_sender_two_receivers(tmp_path):
    run = experiments.execute("p2p_transports", _cfg(tmp_path, world_size=3, transports=["gloo"],
                                                     parts=["bandwidth", "comm_comm", "semantics"],
                                                     max_bytes=4096, matrix_bytes=4096, directions=["one"]))
    df = run.df()
    m = X.matrix(df, "gloo")  # more than two endpoints: every ordered pair, like p2pBandwidthLatencyTest
    assert m.shape == (3, 3) and m.notna().sum().sum() == 6 and (m.fillna(1) > 0).all().all()
    cc = df[df.kind == "comm_comm"]
    assert set(zip(cc.flow, cc.dst)) == {(0, 1), (1, 2)}
    assert set(cc["rank"]) == {0, 1, 2}


@pytest.mark.parametrize("params, message", [
    ({"transports": ["copy", "rdma"]}, "unknown transport(s) ['rdma']"),
    ({"directions": ["sideways"]}, "unknown direction(s) ['sideways']"),
    ({"parts": ["bandwdith"]}, "unknown part(s) ['bandwdith']"),
    ({"min_bytes": 4096, "max_bytes": 1024}, "min_bytes <= max_bytes"),
    ({"overlap_messages": 0}, "overlap_messages must be >= 1"),
    ({"iters": "ten"}, "expected int"),
    ({"transport": ["nccl"]}, "did you mean 'transports'"),
])
def test_bad_parameters_are_one_clear_error(params, message):
    with pytest.raises(ConfigError) as e:
        experiments.make_config("p2p_transports", params)
    assert message in str(e.value)


def test_one_rank_is_refused_before_launch(tmp_path):
    cfg = _cfg(tmp_path, world_size=1)
    with pytest.raises(ConfigError, match="at least 2 ranks"):
        experiments.execute("p2p_transports", cfg)


def test_kit_run_cpu_smoke(tmp_path):
    p = subprocess.run([sys.executable, "-m", "kit", "run", "p2p_transports", "--config", "configs/cpu-smoke.yaml",
                        "--results-root", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    html = list(tmp_path.glob("reports/*/p2p_transports.html"))
    assert html and "1F1B pipeline" in html[0].read_text()
    figs = {f.name for f in tmp_path.glob("reports/*/figures/*.png")}
    assert {"p2p_transports-bandwidth.png", "p2p_transports-overlap.png", "p2p_transports-pipeline.png"} <= figs


@pytest.mark.gpu
def test_gpu_transports_keep_data_intact(tmp_path):
    cfg = experiments.make_config("p2p_transports", {"world_size": 2, "backend": "nccl", "timeout_s": 120,
                                                     "results_root": str(tmp_path)})
    df = launch(exps.p2p_integrity, cfg, "p2p_integrity").df()
    assert set(df.transport) == {"gloo", "nccl", "ipc", "copy"}
    assert df.ok.all(), df[~df.ok]


@pytest.mark.gpu
def test_gpu_pipeline_same_numbers_over_every_transport(tmp_path):
    cfg = experiments.make_config("p2p_transports", {"world_size": 2, "backend": "nccl", "timeout_s": 120,
                                                     "results_root": str(tmp_path), "transports": ["copy", "ipc", "nccl"],
                                                     "parts": ["pipeline"], "pipeline_hidden": 256,
                                                     "pipeline_batch": 64, "pipeline_steps": 2, "dtype": "float32"})
    pp = X.pipeline(experiments.execute("p2p_transports", cfg).df()).set_index("transport")
    assert set(pp.index) == {"copy", "ipc", "nccl"}
    assert pp.loss.max() - pp.loss.min() <= 1e-6 * pp.loss.max()
    assert len(set(pp.grad_norms)) == 1


def test_analysis_of_the_recorded_gpu_run():
    """The committed 2-GPU run: every analysis works on it, the three GPU transports agree on the pipeline's
    numbers, and the profiled overlap shows the transfer as copy-engine memcpys (copy, ipc) vs NCCL kernels."""
    from kit import results

    runs = results.recorded("p2p_transports")
    assert runs, "no recorded p2p_transports run"
    df = results.load(runs[-1])
    b = X.bandwidth(df)
    assert {"copy", "ipc", "nccl", X.BARE} <= set(b.transport)
    assert set(b.direction) == {"one", "both"} and b.bytes.max() == 1 << 30
    assert len(X.at_size(df, 256 << 20)) == 4
    pp = X.pipeline(df).set_index("transport")
    assert set(pp.index) == {"copy", "ipc", "nccl"} and len(set(pp.grad_norms)) == 1
    assert len(X.comm_compute(df)) == 3 and len(X.comm_comm(df)) == 3 * 2 * 2 * 2
    se = X.semantics(df)
    assert set(se.transport) == {"copy", "ipc", "nccl"}
    for t, want_memcpy in (("copy", True), ("ipc", True), ("nccl", False)):
        ev = X.trace_events(runs[-1], t)
        memcpy = ev[(ev.cat == "gpu_memcpy") & ev.name.str.contains("PtoP")]
        assert (len(memcpy) > 0) == want_memcpy, t
        if t == "nccl":
            assert ev[ev.nccl].name.str.contains("SendRecv|Send|Recv").any()
