"""A small 1F1B pipeline over any :mod:`kit.transports` transport, and the ``pipeline`` experiment that runs it
(:func:`experiment`).

``n`` stages (stage ``s`` on rank ``s``, or on GPU ``s`` of one process for the in-process ``copy``
transport), ``m`` micro-batches. Each stage is ``layers`` matrices ``W`` (hidden x hidden) applied as
``x = tanh(x @ W)``; the last stage's loss is ``sum_i mean(y_i ** 2) / m``. Weights and inputs come from seeded
generators, so any run -- any transport, any number of processes -- computes the same numbers, and
:func:`reference` recomputes them in one process for checking.

Schedule (:func:`schedule`): one-forward-one-backward. Stage ``s`` first runs ``min(n - s - 1, m)`` warm-up
forwards, then alternates forward/backward, then drains the remaining backwards, so at most ``n - s``
activations are alive per stage.

Communication follows Megatron-LM's pairing: the send that ends one step and the receive that starts the
next are posted together (``Transport.exchange``) when they go to the same neighbour -- "send activation to
the next stage + receive its gradient", "send gradient to the previous stage + receive its next activation".
With NCCL this matters: P2P operations between a pair of ranks run in one order on one stream, so if both
neighbours posted their *send* first as separate operations, each would wait for the other's receive
(for messages above NCCL's buffer size: a deadlock). Posted as one group they proceed together.

The experiment (:func:`experiment`): one stage per rank (or per GPU of the driving process for an in-process
transport), wall-clock per iteration from a barrier to every GPU idle, the loss and each stage's gradient norm
(equal across transports: they compute the same thing). Copy-engine transports get a communication stream per
GPU so a transfer overlaps the stage's next compute; NCCL already runs on an internal stream of its own.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Iterator


def schedule(stage: int, n: int, m: int) -> list[tuple[str, int]]:
    """The 1F1B order of ("F", i) / ("B", i) steps for ``stage`` of ``n`` with ``m`` micro-batches."""
    if not (0 <= stage < n) or m < 1:
        raise ValueError(f"need 0 <= stage < n and m >= 1 (stage {stage}, n {n}, m {m})")
    warm = min(n - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    f = warm
    b = 0
    for _ in range(m - warm):
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", i) for i in range(b, m)]
    return ops


def make_weights(stage: int, layers: int, hidden: int, device, dtype, seed: int = 0) -> list:
    import torch

    g = torch.Generator().manual_seed(10_000 + 97 * seed + stage)
    return [(torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).to(device=device, dtype=dtype).requires_grad_()
            for _ in range(layers)]


def make_inputs(m: int, batch: int, hidden: int, device, dtype, seed: int = 0) -> list:
    import torch

    g = torch.Generator().manual_seed(20_000 + seed)
    return [torch.randn(batch, hidden, generator=g).to(device=device, dtype=dtype) for _ in range(m)]


def forward(weights, x):
    import torch

    for w in weights:
        x = torch.tanh(x @ w)
    return x


def loss_of(y, m: int):
    return y.float().pow(2).mean() / m


class Stage:
    """One stage's parameters and its part of an iteration (a generator: it yields only while waiting for a
    message that one process has not posted yet, which happens with in-process transports)."""

    def __init__(self, stage: int, n: int, layers: int, hidden: int, batch: int, m: int, device, dtype, seed: int = 0):
        self.stage, self.n, self.m = stage, n, m
        self.batch, self.hidden = batch, hidden
        self.device, self.dtype = device, dtype
        self.weights = make_weights(stage, layers, hidden, device, dtype, seed)
        self.inputs = make_inputs(m, batch, hidden, device, dtype, seed) if stage == 0 else None

    def zero_grad(self) -> None:
        for w in self.weights:
            w.grad = None

    def iteration(self, T, prev: int | None, nxt: int | None, comm_streams: dict | None = None) -> Iterator[None]:
        """Run this stage's 1F1B steps for one iteration over transport ``T``; ``prev``/``nxt`` are the
        neighbouring endpoints. ``comm_streams`` (device index -> CUDA stream): post copy-engine transfers
        there, so they overlap this stage's compute (NCCL has its own stream). Leaves the loss (last stage)
        in ``self.loss`` and gradients in the weights."""
        import torch

        first, last = self.stage == 0, self.stage == self.n - 1
        acts_in, outs = {}, {}
        self.loss = torch.zeros((), device=self.device, dtype=torch.float32)
        carry: list = []  # the send that ends the previous step, merged with the next receive if same peer
        sends = []
        for kind, i in schedule(self.stage, self.n, self.m):
            recv = None
            if kind == "F" and not first:
                recv = ("recv", torch.empty(self.batch, self.hidden, device=self.device, dtype=self.dtype), prev)
            elif kind == "B" and not last:
                recv = ("recv", torch.empty(self.batch, self.hidden, device=self.device, dtype=self.dtype), nxt)
            if carry and recv and carry[0][2] != recv[2]:
                sends += yield from _issue(T, carry, comm_streams, self.stage)
                carry = []
            works = yield from _issue(T, carry + ([recv] if recv else []), comm_streams, self.stage)
            sends += works[:len(carry)]
            carry = []
            if recv:
                works[-1].wait()
            with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
                if kind == "F":
                    x = self.inputs[i] if first else recv[1].requires_grad_()
                    y = forward(self.weights, x)
                    acts_in[i] = x
                    if last:
                        loss = loss_of(y, self.m)
                        self.loss += loss.detach()
                        outs[i] = loss
                    else:
                        outs[i] = y
                        carry = [("send", y.detach(), nxt)]
                else:
                    y = outs.pop(i)
                    if last:
                        y.backward()
                    else:
                        y.backward(recv[1])
                    x = acts_in.pop(i)
                    if not first:
                        carry = [("send", x.grad, prev)]
        if carry:
            sends += yield from _issue(T, carry, comm_streams, self.stage)
        for w in sends:
            w.wait()


def _issue(T, ops, comm_streams: dict | None = None, me: int | None = None) -> Iterator[None]:
    """Post ``ops`` on ``T``; in one process (``T.caps.in_process``) post the sends, then yield until every receive
    has a posted message. With ``comm_streams`` the transfers are issued on those streams (each first waits
    for the current stream of its device, where the data was produced); ``Work.wait()`` later orders the
    compute stream after them. Returns the Works (a generator's return value)."""
    if not ops:
        return []
    if not T.caps.in_process:
        with _on_streams(ops, comm_streams):
            return T.exchange(ops)
    # one process: post the sends first (the neighbour's matching exchange may be waiting for them), then
    # yield until every receive's message is there -- never yield with the comm streams made current
    works = {}
    with _on_streams(ops, comm_streams):
        works.update({i: T.isend(t, p) for i, (k, t, p) in enumerate(ops) if k == "send"})
    for i, (k, t, p) in enumerate(ops):
        if k == "recv":
            while not T.poll(p, me):
                yield
    with _on_streams(ops, comm_streams):
        works.update({i: T.irecv(t, p) for i, (k, t, p) in enumerate(ops) if k == "recv"})
    return [works[i] for i in range(len(ops))]


class _on_streams:
    """Make the comm streams current on every device (after waiting for that device's current stream) and
    tell the caching allocator the op tensors are used there."""

    def __init__(self, ops, streams):
        self.ops, self.streams = ops, streams or {}

    def __enter__(self):
        import torch

        from ...transports import current_streams

        for d, s in self.streams.items():
            s.wait_stream(torch.cuda.current_stream(d))
        for _, t, _p in self.ops:
            if t.is_cuda and t.device.index in self.streams:
                t.record_stream(self.streams[t.device.index])
        self._cur = current_streams(self.streams.values())
        self._cur.__enter__()

    def __exit__(self, *a):
        return self._cur.__exit__(*a)


def drive(programs: list[Iterator[None]], T=None) -> None:
    """Run stage generators to completion, round-robin (one process driving several stages). A stage yields
    only while its next message has not been posted. If a whole round passes in which no stage finished and
    ``T.posted`` (messages posted so far) did not grow, no stage can ever proceed: a schedule deadlock,
    raised as an error instead of spinning forever."""
    live = list(programs)
    while live:
        before = getattr(T, "posted", None)
        n_live = len(live)
        for g in list(live):
            try:
                next(g)
            except StopIteration:
                live.remove(g)
        if live and len(live) == n_live and before is not None and T.posted == before:
            raise RuntimeError("pipeline: every stage is waiting for a message that no stage will post "
                               "(schedule deadlock)")


def reference(n: int, layers: int, hidden: int, batch: int, m: int, device="cpu", dtype=None, seed: int = 0):
    """(loss, [per-stage list of weight gradients]) of the same model and data, in one process, no pipeline."""
    import torch

    dtype = dtype or torch.float32
    ws = [make_weights(s, layers, hidden, device, dtype, seed) for s in range(n)]
    xs = make_inputs(m, batch, hidden, device, dtype, seed)
    total = torch.zeros((), device=device)
    for x in xs:
        for s in range(n):
            x = forward(ws[s], x)
        loss = loss_of(x, m)
        loss.backward()
        total += loss.detach()
    return float(total), [[w.grad for w in stage] for stage in ws]


def experiment(cfg, ctx, T, S):
    """Rows ``kind="pipeline"``: per step and stage this process runs, the iteration time, loss, gradient norm."""
    import time

    import torch

    from . import harness as H

    n = ctx.world_size
    if T.caps.in_process and torch.cuda.device_count() < n:
        yield dict(kind="skipped", transport=T.name, experiment="pipeline", rank=ctx.rank,
                   reason=f"{n} stages need {n} GPUs in one process")
        return
    dt = H.compute_dtype(cfg, ctx, cuda=S.is_cuda)
    elem = torch.tensor([], dtype=dt).element_size()
    T.setup([(s, s + 1) for s in range(n - 1)] + [(s + 1, s) for s in range(n - 1)],
            cfg.pipeline_batch * cfg.pipeline_hidden * elem)
    if T.caps.in_process:
        mine = list(range(n)) if ctx.rank == 0 else []
    else:
        mine = [ctx.rank]
    stages = {s: Stage(s, n, cfg.pipeline_layers, cfg.pipeline_hidden, cfg.pipeline_batch,
                       cfg.pipeline_micro_batches, T.device(s), dt) for s in mine}
    devs = sorted({st.device.index for st in stages.values()}) if S.is_cuda else []
    comm = {d: torch.cuda.Stream(d) for d in devs} if T.caps.copy_engine else None

    def iteration():
        progs = []
        for s, st in stages.items():
            st.zero_grad()
            progs.append(st.iteration(T, s - 1 if s > 0 else None, s + 1 if s < n - 1 else None, comm))
        drive(progs, T)
        for d in devs:
            torch.cuda.synchronize(d)

    for step in range(-2, cfg.pipeline_steps):
        ctx.step(f"{T.name} pipeline step {step}")
        S.barrier()
        t0 = time.perf_counter()
        iteration()
        t = (time.perf_counter() - t0) * 1e6
        if step < 0:
            continue
        for s, st in stages.items():
            gn = math.sqrt(sum(float(w.grad.float().pow(2).sum()) for w in st.weights))
            yield dict(kind="pipeline", transport=T.name, step=step, stage=s, time_us=t,
                       loss=float(st.loss) if s == n - 1 else math.nan, grad_norm=gn,
                       micro_batches=cfg.pipeline_micro_batches, layers=cfg.pipeline_layers,
                       hidden=cfg.pipeline_hidden, batch=cfg.pipeline_batch, dtype=str(dt).replace("torch.", ""),
                       world_size=n)
    stages.clear()
    H.free(ctx)
