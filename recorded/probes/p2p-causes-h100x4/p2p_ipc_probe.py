"""Round-1 probe: ``ipc`` both directions at once (2 ranks, kit.launch), what its copy-out costs.

Variants, each timed by the kit's own harness (``timed_rows``: barrier-aligned samples of ``iters`` rounds,
slowest rank per sample) at ``SIZE`` both ways, rows ``kind=probe`` with ``variant``:

* ``ipc`` as shipped (round 1: 8 equal pieces from 64 MiB; round 2: halving pieces), ``ipc 8 equal pieces``,
  ``ipc 1 piece`` (no pieces),
* ``ipc-direct`` (no copy-out), ``ipc one way``,
* ``local copy_`` alone: each GPU copies SIZE bytes inside itself (the copy-out alone: 2 x SIZE of HBM traffic),
* ``local copy_ + incoming``: rank 0 copies SIZE inside GPU 0 while rank 1 pushes SIZE into GPU 0 (ipc-direct one
  way 1 -> 0): does HBM traffic of the copy-out slow the link (or the link the copy)?

plus a profiled window of 3 rounds of each (traces in the run directory).

    python -c "import p2p_ipc_probe as m; m.main()"   (OUT_DIR set; 2 GPUs visible)
"""

from __future__ import annotations

import os
import sys

SIZE = 256 << 20


def probe(cfg, ctx):
    import torch

    from kit import timing, traces, transports
    from kit.investigations.p2p_transports import harness as H
    from kit.transports import ipc as I
    from kit.transports import mailbox

    both = [(0, 1, SIZE), (1, 0, SIZE)]
    one = [(0, 1, SIZE)]
    keys = dict(bytes=SIZE, iters=cfg.iters)

    def rows_of(T, S, flows, variant, reference=None):
        rows = H.timed_rows(cfg, ctx, T, S, flows, dict(keys, variant=variant, flows=len(flows)), kind="probe",
                            reference=reference)
        path = traces.trace_path(ctx, experiment="probe", variant=variant.replace(" ", "-"))
        bufs = H.buffers(T, flows)

        def step():
            for _ in range(3):
                H.transfer(T, ctx, flows, bufs)

        timing.trace_steps(step, S, 1, path, record_shapes=False)
        return rows

    def equal_pieces(n):  # round 1's pieces: 8 equal ones from PIECE_MIN_BYTES
        if n < I.PIECE_MIN_BYTES:
            return [(0, n)]
        step = -(-n // 8 // mailbox.SLOT_ALIGN) * mailbox.SLOT_ALIGN
        return [(o, min(step, n - o)) for o in range(0, n, step)]

    shipped = I.pieces
    min0 = I.PIECE_MIN_BYTES
    plan = [("ipc", "ipc", shipped, min0, both), ("ipc 8 equal pieces", "ipc", equal_pieces, min0, both),
            ("ipc 1 piece", "ipc", shipped, 1 << 62, both), ("ipc-direct", "ipc-direct", shipped, min0, both),
            ("ipc one way", "ipc", shipped, min0, one), ("ipc-direct one way", "ipc-direct", shipped, min0, one)]
    for variant, which, cut, pmin, flows in plan:
        ctx.step(variant)
        I.pieces, I.PIECE_MIN_BYTES = cut, pmin
        T = transports.make(which, ctx, cfg.timeout_s, slots=cfg.ipc_slots)
        T.setup([(0, 1), (1, 0)], SIZE)
        S = H.sync_for(T, ctx)
        local = None
        if variant == "ipc-direct one way":  # the local copy on GPU 0 while GPU 1 pushes into it
            scratch = [torch.empty(SIZE, dtype=torch.uint8, device=ctx.device) for _ in range(2)]

            def local(bufs):
                if ctx.rank != 0:
                    return {"local copy_ (peer idle)": lambda: None}
                return {"local copy_ (peer idle)": lambda: scratch[0].copy_(scratch[1])}
        try:
            yield from rows_of(T, S, flows, variant, reference=local)
        finally:
            ctx.sync()
            T.close()
            I.pieces, I.PIECE_MIN_BYTES = shipped, min0
    # local copy alone on both GPUs, and local copy on GPU 0 while GPU 1 pushes into GPU 0 (one sample set each)
    T = transports.make("ipc-direct", ctx, cfg.timeout_s, slots=cfg.ipc_slots)
    T.setup([(1, 0)], SIZE)
    S = H.sync_for(T, ctx)
    a = torch.empty(SIZE, dtype=torch.uint8, device=ctx.device)
    b = torch.empty(SIZE, dtype=torch.uint8, device=ctx.device)
    inc = torch.empty(SIZE, dtype=torch.uint8, device=ctx.device)
    out = torch.zeros(SIZE, dtype=torch.uint8, device=ctx.device)

    def local():
        b.copy_(a)

    def with_incoming():  # rank 1 pushes SIZE into GPU 0 while rank 0 copies SIZE inside GPU 0
        if ctx.rank == 0:
            w = T.irecv(out, 1)
            b.copy_(a)
            w.wait()
        else:
            T.isend(inc, 0).wait()

    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    evc = torch.cuda.Event(enable_timing=True)
    for name, fn in (("local copy_ alone", local), ("local copy_ + incoming", with_incoming)):
        s = timing.measure(fn, S, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
        yield from (dict(r, kind="probe", variant=name) for r in s.rows(**keys))
    # the local copy's own time inside the with_incoming round (events around the copy only)
    for i in range(cfg.repeats):
        S.barrier()
        if ctx.rank == 0:
            w = T.irecv(out, 1)
            ev0.record()
            b.copy_(a)
            evc.record()
            w.wait()
            ev1.record()
            ev1.synchronize()
            yield dict(kind="probe", variant="inside incoming", sample=i, copy_us=ev0.elapsed_time(evc) * 1e3,
                       round_us=ev0.elapsed_time(ev1) * 1e3, **keys)
        else:
            T.isend(inc, 0).wait()
    ctx.sync()
    T.close()


def main():
    from kit import contract, launch

    cfg = contract.make_config("p2p_transports", {"iters": 10, "repeats": 10, "warmup": 3,
                                                  "results_root": os.path.join(os.environ["OUT_DIR"], "ipc_probe"),
                                                  "world_size": 2})
    run = launch.launch(probe, cfg, "p2p_ipc_probe")
    print("ipc probe:", run.dir if hasattr(run, "dir") else run)


if __name__ == "__main__":
    sys.exit(main())
