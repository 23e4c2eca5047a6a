"""Where do ipc's last ~3% both ways go? (2 GPUs, 256 MiB, one process per GPU, run by torchrun.)

Variants timed in turn (sample i of every variant, then i + 1; order reversed every other sample), each sample
after a gloo barrier and a sync, CUDA events on the rank's current stream around R rounds, the sample's time the
slower rank's (both ranks' kept). Every variant moves 256 MiB each way per round:

* raw: one cuMemcpyDtoDAsync per round into the peer's mailbox slot (mapped by kit's ipc), nothing else: the link
  both ways between two processes, rounds chained only by each rank's own stream;
* raw+local: raw plus a local 256 MiB copy_ on a second stream each round, joined at the round's end (the
  copy-out's HBM pass, no dependency on the arrival);
* raw-pieces / raw-pieces+ev: raw in the pieces of kit's ipc, without / with an interprocess event record after each;
* ipc-nocopy: kit's ipc protocol (pieces, ready/consumed events, counters) with the copy-out left out;
* ipc: kit's ipc as it is (the code this runs from); ipc-tail*/-shrink*: its pieces with another TAIL_BYTES /
  SHRINK (ipc-shrink3-tail8M: both); ipc-halving:
  the pieces before 2026-11-27 15:00 (halving down to 4 MiB, 7 pieces at 256 MiB); ipc-whole:
  one piece; ipc-eq8: 8 equal pieces (which exist depends on the code: VARIANTS selects);
* ipc-R40, ipc-halving-R40: 40 rounds per sample instead of 10 (the per-sample fixed cost);
* local-sm / local-ce: a local 256 MiB copy alone, as copy_ (the copy-out as kit issues it) / as a
  cuMemcpyBatchAsync with CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (a copy engine instead of SMs: the driver's
  hint, CUDA >= 12.8); raw+local-ce: raw beside the latter; ipc-ce: kit's ipc with its copy-out issued that way
  (on a stream of its own: the batch call refuses the legacy default stream);
then, in one process driving both GPUs (the other idle at a gloo barrier), copy both ways as kit's copy transport
posts it (exchange of 4 ops) with R = 10 and 40, and a raw cuMemcpy both ways (one stream per GPU).
Writes ipcgap.json (every sample) and prints a summary."""
import ctypes, json, os, statistics, sys, time, types

import torch
import torch.distributed as dist

from kit.transports import ipc as IPC, mailbox as MB
from kit.transports.copy import CopyTransport

N = 256 << 20
OUT = sys.argv[1]
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 15
rank = int(os.environ["RANK"])
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
dist.init_process_group("gloo")
ctx = types.SimpleNamespace(rank=rank, world_size=2, device=dev, is_cuda=True, barrier=dist.barrier)
T = IPC.IpcTransport(ctx, timeout_s=60)
T.setup([(0, 1), (1, 0)], N)
peer = 1 - rank
out_ch, in_ch = T._out[peer], T._in[peer]
src = torch.full((N,), 1 + rank, dtype=torch.uint8, device=dev)
dst = torch.empty(N, dtype=torch.uint8, device=dev)
loc_in, loc_out = torch.ones(N, dtype=torch.uint8, device=dev), torch.empty(N, dtype=torch.uint8, device=dev)
side = torch.cuda.Stream(dev)
orig = dict(tail=IPC.TAIL_BYTES, pmin=IPC.PIECE_MIN_BYTES, pieces=IPC.pieces, shrink=getattr(IPC, "SHRINK", None))


def halving():  # the pieces of kit's ipc as it is (raw-pieces variants)
    return orig["pieces"](N)


def raw():
    MB.memcpy_dtod(out_ch.slots[0].data_ptr(), src.data_ptr(), N, torch.cuda.current_stream())


def raw_local():
    cur = torch.cuda.current_stream()
    side.wait_stream(cur)
    MB.memcpy_dtod(out_ch.slots[0].data_ptr(), src.data_ptr(), N, cur)
    with torch.cuda.stream(side):
        loc_out.copy_(loc_in)
    cur.wait_stream(side)


def raw_pieces(ev):
    cur, d, s = torch.cuda.current_stream(), out_ch.slots[0].data_ptr(), src.data_ptr()
    for k, (o, m) in enumerate(halving()):
        MB.memcpy_dtod(d + o, s + o, m, cur)
        if ev:
            out_ch.ready[k].record(cur)


def ipc_round():
    works = T.exchange([("send", src, peer), ("recv", dst, peer)])
    works[1].wait()
    works[0].wait()


def complete_nocopy(ch, item):
    out = item["out"]
    seq, slot = ch.seq, ch.seq % T.slots
    T._spin(lambda: int(ch.counters[0]) > seq, "nocopy wait")
    parts = IPC.pieces(N)
    stream = torch.cuda.current_stream(out.device)
    for k in range(len(parts)):
        stream.wait_event(ch.ready[slot * IPC.MAX_PIECES + k])
    ch.consumed[slot].record(stream)
    ch.counters[1] = seq + 1
    ch.seq += 1
    ev = torch.cuda.Event()
    ev.record(stream)
    item["done"] = ev
    ch.pending.popleft()


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Attr(ctypes.Structure):  # CUmemcpyAttributes
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", Loc), ("dstLocHint", Loc), ("flags", ctypes.c_uint)]


_lib = MB.libcuda()
_v2 = getattr(_lib, "cuMemcpyBatchAsync_v2", None)
_v1 = getattr(_lib, "cuMemcpyBatchAsync", None)
ce_stream = torch.cuda.Stream(dev)


def ce_copy(d, s_, n, stream):
    dsts, srcs, sizes = (ctypes.c_uint64 * 1)(d), (ctypes.c_uint64 * 1)(s_), (ctypes.c_size_t * 1)(n)
    attr = Attr(1, Loc(1, rank), Loc(1, rank), 1)  # order: stream; device locations; prefer overlap with compute
    idx = (ctypes.c_size_t * 1)(0)
    h = ctypes.c_void_p(stream.cuda_stream)
    if _v2 is not None:
        rc = _v2(dsts, srcs, sizes, ctypes.c_size_t(1), ctypes.byref(attr), idx, ctypes.c_size_t(1), h)
    else:
        fail = ctypes.c_size_t(0)
        rc = _v1(dsts, srcs, sizes, ctypes.c_size_t(1), ctypes.byref(attr), idx, ctypes.c_size_t(1), ctypes.byref(fail), h)
    if rc != 0:
        raise RuntimeError(f"cuMemcpyBatchAsync: CUresult {rc}")


def local_sm():
    loc_out.copy_(loc_in)


def local_ce():
    cur = torch.cuda.current_stream()
    ce_stream.wait_stream(cur)
    ce_copy(loc_out.data_ptr(), loc_in.data_ptr(), N, ce_stream)
    cur.wait_stream(ce_stream)


def raw_local_ce():
    cur = torch.cuda.current_stream()
    ce_stream.wait_stream(cur)
    MB.memcpy_dtod(out_ch.slots[0].data_ptr(), src.data_ptr(), N, cur)
    ce_copy(loc_out.data_ptr(), loc_in.data_ptr(), N, ce_stream)
    cur.wait_stream(ce_stream)


def complete_ce(ch, item):
    out = item["out"]
    seq, slot = ch.seq, ch.seq % T.slots
    T._spin(lambda: int(ch.counters[0]) > seq, "ce wait")
    cur = torch.cuda.current_stream(out.device)
    x = ce_stream
    x.wait_stream(cur)
    box = ch.slots[slot]
    for k, (o, m) in enumerate(IPC.pieces(N)):
        x.wait_event(ch.ready[slot * IPC.MAX_PIECES + k])
        ce_copy(out.data_ptr() + o, box.data_ptr() + o, m, x)
    ch.consumed[slot].record(x)
    ch.counters[1] = seq + 1
    ch.seq += 1
    ev = torch.cuda.Event()
    ev.record(x)
    cur.wait_event(ev)  # the caller's stream after the copy-out (kit's ipc issues it on that stream itself)
    item["done"] = ev
    ch.pending.popleft()


def eq8(n):
    if n < IPC.PIECE_MIN_BYTES:
        return [(0, n)]
    m = n // 8
    return [(i * m, m) for i in range(8)]


def halving_pieces(n):  # the pieces before 2026-11-27 15:00: halving down to 4 MiB (7 pieces at 256 MiB)
    if n < IPC.PIECE_MIN_BYTES:
        return [(0, n)]
    out, o = [], 0
    while n - o >= 2 * (4 << 20) and len(out) < IPC.MAX_PIECES - 1:
        m = (n - o) // 2 // MB.SLOT_ALIGN * MB.SLOT_ALIGN
        out.append((o, m))
        o += m
    return out + [(o, n - o)]


def configure(v):
    IPC.TAIL_BYTES, IPC.PIECE_MIN_BYTES, IPC.pieces = orig["tail"], orig["pmin"], orig["pieces"]
    if hasattr(IPC, "SHRINK"):
        IPC.SHRINK = orig["shrink"]
    T.__dict__.pop("_complete", None)
    if v == "ipc-tail1M":
        IPC.TAIL_BYTES = 1 << 20
    elif v == "ipc-tail8M":
        IPC.TAIL_BYTES = 8 << 20
    elif v == "ipc-tail16M":
        IPC.TAIL_BYTES = 16 << 20
    elif v == "ipc-tail32M":
        IPC.TAIL_BYTES = 32 << 20
    elif v == "ipc-shrink3":
        IPC.SHRINK = 3
    elif v == "ipc-shrink3-tail8M":
        IPC.SHRINK, IPC.TAIL_BYTES = 3, 8 << 20
    elif v == "ipc-shrink2":
        IPC.SHRINK = 2
    elif v == "ipc-shrink6":
        IPC.SHRINK = 6
    elif v.startswith("ipc-halving"):
        IPC.pieces = halving_pieces
    elif v == "ipc-whole":
        IPC.PIECE_MIN_BYTES = 1 << 62
    elif v == "ipc-eq8":
        IPC.pieces = eq8
    elif v == "ipc-nocopy":
        T._complete = complete_nocopy
    elif v == "ipc-ce":
        T._complete = complete_ce


ALL = {"raw": (raw, 10), "raw+local": (raw_local, 10), "raw-pieces": (lambda: raw_pieces(False), 10),
       "raw-pieces+ev": (lambda: raw_pieces(True), 10), "ipc-nocopy": (ipc_round, 10), "ipc": (ipc_round, 10),
       "ipc-tail1M": (ipc_round, 10), "ipc-tail8M": (ipc_round, 10), "ipc-tail16M": (ipc_round, 10),
       "ipc-tail32M": (ipc_round, 10), "ipc-shrink3": (ipc_round, 10), "ipc-shrink3-tail8M": (ipc_round, 10),
       "ipc-shrink2": (ipc_round, 10), "ipc-shrink6": (ipc_round, 10),
       "ipc-halving": (ipc_round, 10), "ipc-whole": (ipc_round, 10),
       "ipc-eq8": (ipc_round, 10), "ipc-R40": (ipc_round, 40), "ipc-halving-R40": (ipc_round, 40),
       "local-sm": (local_sm, 10), "local-ce": (local_ce, 10), "raw+local-ce": (raw_local_ce, 10),
       "ipc-ce": (ipc_round, 10)}
# the variants of this run (VARIANTS, comma-separated names; default: all)
VARIANTS = {k: ALL[k] for k in (os.environ.get("VARIANTS") or ",".join(ALL)).split(",")}
try:  # the copy-engine variants only where the driver has the batch call and takes these attributes
    local_ce()
    torch.cuda.synchronize()
    ce_ok = bool(torch.equal(loc_out[:4096], loc_in[:4096]))
except Exception as e:  # noqa: BLE001
    print(f"rank {rank}: copy-engine variants left out: {e!r}", flush=True)
    ce_ok = False
oks = [None, None]
dist.all_gather_object(oks, ce_ok)
if not all(oks):
    VARIANTS = {k: v for k, v in VARIANTS.items() if k not in ("local-ce", "raw+local-ce", "ipc-ce")}


def sample(fn, r, rounds):
    dist.barrier()
    torch.cuda.synchronize()
    dist.barrier()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    h0 = time.perf_counter()
    e0.record()
    for _ in range(rounds):
        fn()
    e1.record()
    h1 = time.perf_counter()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000.0 / rounds, (h1 - h0) * 1e6 / rounds


res = {"bytes": N, "reps": REPS, "ce_ok": all(oks), "pieces_halving": halving(), "samples_us": {}, "host_us": {}}
t_start = time.time()
res["data_ok"] = {}
for v, (fn, rounds) in VARIANTS.items():  # warm-up; what an ipc variant delivers is checked
    configure(v)
    dst.zero_()
    for _ in range(2):
        sample(fn, 1, 3)
    if v.startswith("ipc") and v != "ipc-nocopy":
        res["data_ok"][v] = bool((dst == 1 + peer).all())
mine = {v: [] for v in VARIANTS}
host = {v: [] for v in VARIANTS}
names = list(VARIANTS)
for r in range(REPS):
    for v in (names if r % 2 == 0 else names[::-1]):
        configure(v)
        fn, rounds = VARIANTS[v]
        d, h = sample(fn, r, rounds)
        mine[v].append(d)
        host[v].append(h)
configure("ipc")
everyone = [None, None]
dist.all_gather_object(everyone, (mine, host))
for v in names:
    res["samples_us"][v] = [everyone[0][0][v], everyone[1][0][v]]
    res["host_us"][v] = [everyone[0][1][v], everyone[1][1][v]]
oks = [None, None]
dist.all_gather_object(oks, res["data_ok"])
res["data_ok"] = oks
res["two_process_s"] = time.time() - t_start
if rank == 0:  # kept if the one-process part below does not finish
    json.dump(res, open(os.path.join(OUT, "ipcgap.json"), "w"))

# ---- in one process: copy both ways as kit's copy transport posts it, and raw cuMemcpy both ways
def phase2():
    if rank == 0:
        dev1 = torch.device("cuda", 1)
        cctx = types.SimpleNamespace(rank=0, world_size=2, device=dev, is_cuda=True)
        C = CopyTransport(cctx)
        a0, a1 = torch.ones(N, dtype=torch.uint8, device=dev), torch.ones(N, dtype=torch.uint8, device=dev1)
        b0, b1 = torch.empty(N, dtype=torch.uint8, device=dev), torch.empty(N, dtype=torch.uint8, device=dev1)
        C._peer(0, 1)
        s1 = torch.cuda.current_stream(1)
        join_ev = torch.cuda.Event()

        def copy_round():
            ws = C.exchange([("send", a0, 1), ("recv", b1, 0), ("send", a1, 0), ("recv", b0, 1)])
            ws[1].wait(); ws[3].wait(); ws[0].wait(); ws[2].wait()

        def raw2():
            MB.memcpy_dtod(b1.data_ptr(), a0.data_ptr(), N, torch.cuda.current_stream(0))
            MB.memcpy_dtod(b0.data_ptr(), a1.data_ptr(), N, s1)

        def csample(fn, rounds):
            torch.cuda.synchronize(0); torch.cuda.synchronize(1)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(rounds):
                fn()
            join_ev.record(s1)
            torch.cuda.current_stream(0).wait_event(join_ev)
            e1.record()
            torch.cuda.synchronize(0); torch.cuda.synchronize(1)
            return e0.elapsed_time(e1) * 1000.0 / rounds

        CV = {"copy": (copy_round, 10), "copy-R40": (copy_round, 40), "raw-1proc": (raw2, 10)}
        for v, (fn, rounds) in CV.items():
            for _ in range(2):
                csample(fn, 3)
        cs = {v: [] for v in CV}
        for r in range(REPS):
            for v in (list(CV) if r % 2 == 0 else list(CV)[::-1]):
                cs[v].append(csample(*CV[v]))
        res["one_process_us"] = cs


try:
    phase2()
except Exception as e:  # noqa: BLE001 -- the two-process part is kept
    res["one_process_error"] = repr(e)
    print("one-process part failed:", repr(e), flush=True)
dist.barrier()
if rank == 0:
    res.update(torch=torch.__version__, cuda=torch.version.cuda, gpus=[torch.cuda.get_device_name(i) for i in range(2)])
    json.dump(res, open(os.path.join(OUT, "ipcgap.json"), "w"))
    ref = statistics.median(res["one_process_us"]["copy"]) if "one_process_us" in res else float("nan")
    print(f"copy both ways (1 process, R=10): {ref:.1f} us per round")
    for v in names:
        per = [max(a, b) for a, b in zip(*res["samples_us"][v])]
        m = statistics.median(per)
        print(f"{v:14s} median {m:8.1f} us  (p10 {sorted(per)[len(per) // 10]:.1f}, p90 {sorted(per)[len(per) * 9 // 10]:.1f})"
              f"  copy/this {ref / m:.3f}  host {statistics.median(res['host_us'][v][0]):.0f} us/round")
    print("data delivered intact:", res["data_ok"], " ce variants:", res["ce_ok"])
    for v, s in res.get("one_process_us", {}).items():
        print(f"{v:14s} median {statistics.median(s):8.1f} us")
T.close()
dist.destroy_process_group()
