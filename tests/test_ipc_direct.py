"""The ``ipc-direct`` transport (:mod:`kit.transports.ipc_direct`): its descriptor ring and the protocol on both
ends on CPU (two mappings of one shared page, as the two processes have); on GPUs (marker ``gpu``, 2 ranks)
the data of many messages both ways, strided receives, a late receiver, ``exchange``, a size mismatch, and
that a receive runs nothing on the receiver's GPU (the sender's copy engine writes its tensor)."""

import threading
import time

import pytest

from kit import transports
from kit.transports import Transport, TransportUnavailable, mailbox
from kit.transports import ipc_direct as D


@pytest.fixture
def page(tmp_path):
    """Two mappings of one shared page: the receiver's (creates it) and the sender's."""
    path = str(tmp_path / "ring")
    slots = 4
    recv = D.Ring(mailbox.map_shared(path, True, D.Ring.size(slots)), slots)
    send = D.Ring(mailbox.map_shared(path, False), slots)
    yield recv, send
    for r in (recv, send):
        r.close()


def _handle(seq: int) -> bytes:
    return bytes((seq * 7 + i) % 256 for i in range(64))


class _Ctx:
    world_size, is_cuda = 1, False

    def __init__(self, rank=0):
        self.rank = rank


def _transport(rank: int, slots=4, timeout_s=2.0) -> D.IpcDirectTransport:
    """Rank ``rank``'s transport, host side only (its constructor needs GPUs): for the protocol methods that
    touch only the rings (progress, arrival, the size check)."""
    T = D.IpcDirectTransport.__new__(D.IpcDirectTransport)
    Transport.__init__(T, _Ctx(rank), timeout_s)
    T.slots, T._out, T._in = slots, {}, {}
    return T


# ------------------------------------------------------------------------------------------------ the ring
def test_descriptor_round_trips_through_the_shared_page(page):
    recv, send = page
    assert (send.announced, send.posted) == (0, 0) and send.descriptor(0) is None
    recv.announce(0, _handle(0), 4096 + 512, 123457)
    assert send.announced == 1
    assert send.descriptor(0) == D.Descriptor(0, _handle(0), 4096 + 512, 123457)
    assert recv.sent(0) is None
    send.post(0, 123457)
    assert recv.posted == 1 and recv.sent(0) == 123457
    assert D.Ring.size(4) <= 4096


def test_ring_wraps_around_and_refuses_to_overrun(page):
    recv, send = page
    for seq in range(3 * recv.slots + 1):  # wrap three times, the receiver always a full ring ahead
        while recv.announced - recv.posted < recv.slots:
            k = recv.announced
            recv.announce(k, _handle(k), k, 10 * k)
        with pytest.raises(RuntimeError, match="cannot announce"):
            recv.announce(recv.announced, _handle(0), 0, 0)
        d = send.descriptor(seq)
        assert (d.seq, d.handle, d.offset, d.nbytes) == (seq, _handle(seq), seq, 10 * seq)
        send.post(seq, 10 * seq)
    with pytest.raises(RuntimeError, match="cannot post"):
        send.post(send.posted + 5, 0)


def test_a_ring_larger_than_its_page_is_refused(tmp_path):
    mm = mailbox.map_shared(str(tmp_path / "p"), True, 100)
    with pytest.raises(ValueError, match="descriptors needs"):
        D.Ring(mm, 1000)
    mm.close()


# ------------------------------------------------------------------------------------------------ the two ends
def _ends(page):
    recv, send = page
    return D.RecvEnd(0, recv, [], []), D.SendEnd(1, send, [], [])


def test_queued_sends_issue_in_order_as_descriptors_arrive(page):
    r, s = _ends(page)
    for k in range(5):
        s.post(D.Send(k, None, 100))
    assert list(s.issuable()) == []  # nothing announced: every send waits, the host did not block
    for k in range(2):
        r.announce(D.Recv(k, None, None, 100), _handle(k), 0)
    got = [item.seq for item, _ in s.issuable()]
    assert got == [0, 1] and [i.seq for i in s.queue] == [2, 3, 4]
    for k in (0, 1):
        s.ring.post(k, 100)
        r.complete(r.live[k])
    for k in range(2, 5):
        r.announce(D.Recv(k, None, None, 100), _handle(k), 0)
    assert [(i.seq, d.handle) for i, d in s.issuable()] == [(k, _handle(k)) for k in (2, 3, 4)]


def test_a_full_ring_blocks_on_the_oldest_receive_not_completed(page):
    r, s = _ends(page)
    for k in range(r.ring.slots):
        assert r.blocking() is None
        r.announce(D.Recv(k, None, None, 8), _handle(k), 0)
    assert r.blocking().seq == 0  # the next receive needs message 0's slot
    r.complete(r.live[2])  # completing a later one frees nothing
    assert r.blocking().seq == 0
    r.complete(r.live[0])
    assert r.blocking() is None


def test_receiver_waits_for_a_full_ring_while_the_sender_issues(page):
    """Two threads, each with its own mapping of the page, as two processes: the receiver posts 3 rings' worth
    of receives and waits (host) whenever the ring is full; the sender issues queued sends in order."""
    r, s = _ends(page)
    n, got, errors = 3 * r.ring.slots + 1, [], []

    def receiver():
        try:
            for k in range(n):
                while (old := r.blocking()) is not None:
                    mailbox.spin(lambda: r.ring.posted > old.seq, 5.0, "receiver")
                    got.append((old.seq, r.ring.sent(old.seq)))
                    r.complete(old)
                r.announce(D.Recv(k, None, None, 10 + k), _handle(k), k)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=receiver)
    th.start()
    for k in range(n):
        s.post(D.Send(k, None, 10 + k))
    issued = []
    deadline = time.monotonic() + 10
    while len(issued) < n and time.monotonic() < deadline:
        for item, d in s.issuable():
            assert (d.seq, d.offset, d.nbytes, d.handle) == (item.seq, item.seq, item.nbytes, _handle(item.seq))
            issued.append(item.seq)
            s.ring.post(item.seq, item.nbytes)
    th.join(10)
    assert not errors and issued == list(range(n))
    assert got == [(k, 10 + k) for k in range(n - r.ring.slots)]


# ------------------------------------------------------------------------------------------------ size checks
def test_size_mismatch_is_one_clear_error_on_both_ends(page):
    sender, receiver = _transport(0), _transport(1)
    r, s = _ends(page)
    sender._out = {1: s}
    item = D.Recv(0, None, None, 2048)
    r.announce(item, _handle(0), 0)
    send = D.Send(0, object(), 1024)
    s.post(send)
    sender._progress()  # the sender finds the receive's size differs: it posts its own size, copies nothing
    assert send.issued and send.src is None and r.ring.posted == 1
    assert send.error == D.size_error(0, 1, 0, 1024, 2048)
    with pytest.raises(ValueError) as e:
        receiver._arrive(r, item)
    assert str(e.value) == send.error
    assert "has 1024 B" in send.error and "receive of 2048 B" in send.error and "\n" not in send.error
    assert D.size_error(0, 1, 3, 5, 5) is None


def test_arrival_times_out_with_what_it_waited_for(page):
    T = _transport(1, timeout_s=0.2)
    r, _ = _ends(page)
    item = D.Recv(0, None, None, 8)
    r.announce(item, _handle(0), 0)
    with pytest.raises(TimeoutError, match="waiting for message 0 from rank 0"):
        T._arrive(r, item)


# ------------------------------------------------------------------------------------------------ registration
def test_registered_with_the_capabilities_of_ipc():
    assert "ipc-direct" in transports.names()
    assert transports.get("ipc-direct") is D.IpcDirectTransport
    assert transports.capabilities("ipc-direct") == transports.capabilities("ipc")
    caps = transports.capabilities("ipc-direct")
    assert caps.copy_engine and caps.cuda and caps.needs_peer_access
    assert not (caps.in_process or caps.cross_node or caps.graph_capture)


def test_unavailable_without_cuda_with_one_message():
    assert D.IpcDirectTransport.unavailable(_Ctx()) == "ipc-direct needs CUDA"
    with pytest.raises(TransportUnavailable, match="ipc-direct needs CUDA"):
        transports.make("ipc-direct", _Ctx(), slots=4)  # the ipc option is accepted


# ------------------------------------------------------------------------------------------------ GPU
def gpu_checks(cfg, ctx):
    """Two ranks, one check per row (``check``, ``ok``, ``detail``)."""
    import torch
    import torch.distributed as dist

    from kit.transports import check, pattern

    T = transports.make("ipc-direct", ctx, 60.0, slots=4)
    T.setup([(0, 1), (1, 0)], 0)
    me, peer, dev = ctx.rank, 1 - ctx.rank, ctx.device

    def row(name, errors, **kw):
        return dict(check=name, rank=me, ok=not errors, detail="; ".join(map(str, errors[:3])), **kw)

    def checked(out, n, seq, src, errors):
        try:
            check(out, pattern(n, dev, seq, src), f"message {seq} from {src}, {n} B")
        except AssertionError as e:
            errors.append(e)

    # many messages of several sizes both ways at once, two of each direction per exchange
    errors, seq = [], 0
    sizes = [0, 1, 7, 1000, 4099, 1 << 20, (64 << 20) + 5]
    for _ in range(3):
        for n in sizes:
            seq += 2
            outs = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(2)]
            ops = [("send", pattern(n, dev, seq, me), peer), ("recv", outs[0], peer),
                   ("recv", outs[1], peer), ("send", pattern(n, dev, seq + 1, me), peer)]
            for w in T.exchange(ops):
                w.wait()
            for k in range(2):
                checked(outs[k], n, seq + k, peer, errors)
    yield row("both_ways", errors, messages=seq)

    # a burst deeper than the ring one way: queued sends, the receiver's full ring, waits in reverse order
    errors, burst = [], 3 * 4 + 1
    sizes = [4096 * (k + 1) + k for k in range(burst)]
    if me == 0:
        works = [T.isend(pattern(n, dev, 100 + k, 0), 1) for k, n in enumerate(sizes)]  # sources dropped at once
        for w in works:
            w.wait()
    else:
        outs = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
        works = [T.irecv(o, 0) for o in outs]
        for w in reversed(works):
            w.wait()
        for k, (o, n) in enumerate(zip(outs, sizes)):
            checked(o, n, 100 + k, 0, errors)
    yield row("burst", errors, messages=burst)

    # strided receive (and send)
    errors = []
    g = torch.Generator().manual_seed(5)
    want = torch.randn(33, 65, generator=g).to(dev)
    src = torch.empty(33, 130, device=dev)[:, ::2].copy_(want)
    out = torch.zeros(33, 130, device=dev)[:, ::2]
    for w in T.exchange([("send", src, peer), ("recv", out, peer)]):
        w.wait()
    if not torch.equal(out, want):
        errors.append("strided receive differs")
    yield row("strided", errors)

    # a late receiver: isend returns before the receive is posted (the receiver posts only after the barrier
    # that follows it: an isend that blocked would hang here, and the watchdog names this step), and the send is
    # not done until the receive is posted; then the wait completes it
    errors, n = [], 8 << 20
    ctx.barrier()
    if me == 0:
        w = T.isend(pattern(n, dev, 7, 0), 1)
        early = w.done()  # the receiver is still before the barrier: nothing can have been issued
        ctx.barrier()
        w.wait()
        torch.cuda.synchronize(dev)
        if early:
            errors.append("the send was done before its receive was posted")
        yield row("late_receiver", errors)
    else:
        ctx.barrier()
        out = torch.empty(n, dtype=torch.uint8, device=dev)
        T.irecv(out, 0).wait()
        checked(out, n, 7, 0, errors)
        yield row("late_receiver", errors)

    # no kernel and no copy on the receiver's GPU: the sender's copy engine writes the receiver's tensor
    n, k = 64 << 20, 8
    bufs = [pattern(n, dev, 200 + i, 0) if me == 0 else torch.empty(n, dtype=torch.uint8, device=dev)
            for i in range(k)]
    torch.cuda.synchronize(dev)
    ctx.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        works = [T.isend(b, 1) if me == 0 else T.irecv(b, 0) for b in bufs]
        for w in works:
            w.wait()
        torch.cuda.synchronize(dev)
    on_gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    errors = []
    if me == 1:
        for i, b in enumerate(bufs):
            checked(b, n, 200 + i, 0, errors)
        if on_gpu:
            errors.append(f"the receiver's GPU ran {len(on_gpu)} kernels/copies: {sorted(set(on_gpu))[:4]}")
        t0 = time.perf_counter()
        for _ in range(100):
            mailbox.export(bufs[0])
        export_us = (time.perf_counter() - t0) * 1e4
    else:
        copies = [x for x in on_gpu if "memcpy" in x.lower()]
        if len(copies) < k:
            errors.append(f"the sender's GPU shows {len(copies)} copies for {k} messages: {sorted(set(on_gpu))[:4]}")
        export_us = float("nan")
    yield row("zero_sm", errors, gpu_events=len(on_gpu), names="|".join(sorted(set(on_gpu))), export_us=export_us)
    del bufs

    # a receive of another size than the send: one clear error on both ranks, and the ring goes on
    errors = []
    t = pattern(1000, dev, 9, 0) if me == 0 else torch.empty(2000, dtype=torch.uint8, device=dev)
    try:
        (T.isend(t, 1) if me == 0 else T.irecv(t, 0)).wait()
        errors.append("no error")
    except ValueError as e:
        msg = str(e)
        if "has 1000 B" not in msg or "receive of 2000 B" not in msg:
            errors.append(msg)
    out = torch.empty(64, dtype=torch.uint8, device=dev)
    for w in T.exchange([("send", pattern(64, dev, 11, me), peer), ("recv", out, peer)]):
        w.wait()
    checked(out, 64, 11, peer, errors)
    yield row("size_mismatch", errors)
    dist.barrier()
    T.close()


@pytest.fixture(scope="module")
def gpu_rows(tmp_path_factory):
    import torch

    from kit.config import LaunchConfig
    from kit.launch import launch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = LaunchConfig(world_size=2, backend="nccl", results_root=str(tmp_path_factory.mktemp("res")), timeout_s=180)
    return launch(gpu_checks, cfg, "ipc_direct_checks").df()


def _ok(rows, name):
    got = rows[rows.check == name]
    assert set(got["rank"]) == {0, 1}, rows
    assert got.ok.all(), got[~got.ok].detail.tolist()
    return got


@pytest.mark.gpu
def test_gpu_many_messages_both_ways_keep_their_data(gpu_rows):
    assert _ok(gpu_rows, "both_ways").messages.min() == 42


@pytest.mark.gpu
def test_gpu_burst_deeper_than_the_ring(gpu_rows):
    _ok(gpu_rows, "burst")


@pytest.mark.gpu
def test_gpu_strided_receive(gpu_rows):
    _ok(gpu_rows, "strided")


@pytest.mark.gpu
def test_gpu_late_receiver_does_not_block_isend(gpu_rows):
    _ok(gpu_rows, "late_receiver")


@pytest.mark.gpu
def test_gpu_receiver_runs_nothing_on_its_gpu(gpu_rows):
    got = _ok(gpu_rows, "zero_sm")
    assert int(got[got["rank"] == 1].gpu_events.iloc[0]) == 0


@pytest.mark.gpu
def test_gpu_size_mismatch_is_one_error_on_both_ranks(gpu_rows):
    _ok(gpu_rows, "size_mismatch")
