"""A small GPT trained with DDP, instrumented with ``kit.capture`` -- and flags that plant one known problem each.

This is not a kit experiment: it is the kind of job a user brings to ``kit doctor``. Run it under torchrun
(one process per GPU; gloo on CPU) or alone (one rank)::

    torchrun --nproc-per-node 2 examples/train_ddp.py --out traces/clean
    torchrun --nproc-per-node 2 examples/train_ddp.py --out traces/late --late-rank 1
    python examples/train_ddp.py --out traces/one-rank
    kit doctor traces/late/trace_rank*.json.gz

**The clean job.** A GPT (token + position embedding, ``--layers`` pre-norm blocks of causal self-attention and
a 4x GELU MLP, a final norm and an untied head) on a synthetic token dataset through a real
``torch.utils.data.DataLoader`` (worker processes, ``DistributedSampler``, pinned batches), in bf16 autocast on
GPUs; DDP averages gradients in buckets while backward runs; AdamW. The next batch is copied from pinned memory
on a side stream while the current step computes (``BatchPrefetcher``); nothing in the step waits for the GPU
(the loss is summed on the device and read once at the end). GPU defaults (d_model 1024, 6 layers, seq 1024,
batch 32 per rank) make a 2xH200 step compute-bound, not launch-bound, also under the profiler; CPU defaults are
tiny.

**Steps.** ``--warmup-steps`` untimed steps (at least 11 with ``--cuda-graph``: DDP's rule before capture),
then ``--timed-steps`` steps timed by the wall clock between two synchronisations (``step_ms`` in
``summary_rank<r>.json``: the planted problem's cost without the profiler), then the profiler's schedule
(``--wait``/``--warmup``/``--active``): ``kit.capture`` writes ``trace_rank<r>.json.gz`` and
``capture_rank<r>.json`` per rank into ``--out``.

**Planted problems** (one flag = one problem; the rule ids of ``kit doctor``):

=================================  ===========================  =================================================
flag                               rule                         what changes
=================================  ===========================  =================================================
``--pageable``                     ``pageable_h2d``             the DataLoader does not pin: the (still
                                                                prefetched) copies come from pageable memory
``--h2d-on-compute-stream``        ``h2d_on_compute_stream``    no prefetch: each batch is copied on the compute
                                                                stream at the start of its step
``--per-param-allreduce``          ``per_param_allreduce``,     no DDP: one ``all_reduce`` per parameter after
                                   ``exposed_comm``             backward (nothing overlaps it)
``--cuda-graph``                   ``graph_mixing_gap``         the whole step (forward, backward with its
                                                                all-reduces, optimizer) captured in one CUDA graph
                                                                and replayed, ``NCCL_GRAPH_MIXING_SUPPORT`` left
                                                                as it is (NCCL's default: on); see below
``--late-rank R --late-ms MS``     ``late_rank``                rank R sleeps MS ms at the start of every step
``--item``                         ``host_sync``                ``loss.item()`` every step
``--tiny-kernels``                 ``launch_bound``             ``--tiny-ops`` tiny elementwise ops on a 256-
                                                                element buffer after each step: the host now
                                                                takes longer than the GPU
``--contention``                   ``comm_compute_contention``  every other step, ``--contention-matmuls`` bf16
                                                                matmuls on a side stream start with the last
                                                                gradient bucket's all-reduce (alone otherwise)
=================================  ===========================  =================================================

``exposed_comm`` needs no flag of its own: ``--per-param-allreduce`` exposes all of the communication.
``--cuda-graph`` with DDP hides its all-reduces behind backward on NCCL's stream, so no idle GPU time precedes
them and the mixing gap does not show (2xH200: gap 0); with ``--per-param-allreduce`` too, the captured
all-reduces are serialised with the compute and it does (median 1.60 us before each NCCL kernel vs 0.45 us with
``NCCL_GRAPH_MIXING_SUPPORT=0``). ``--contention`` lengthened the contended all-reduce only 1.07x on 2xH200
(NVLink; see ``recorded/h200x2/doctor/README.md``).
``low_busbw`` is planted from outside, by the environment: ``NCCL_P2P_DISABLE=1`` makes NCCL move the
all-reduces through host shared memory instead of NVLink (compare with a collectives sweep of the same machine).
Flags that need CUDA say so and are ignored on CPU.

Longer than the kit's ~400-line modules on purpose: it is a user's training script, self-contained so it can be copied, with one flag per planted problem.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the kit, when run from a checkout
from kit import capture  # noqa: E402

CUDA_ONLY = {"pageable": "pinned memory and host-to-device copies", "h2d_on_compute_stream": "CUDA streams",
             "cuda_graph": "CUDA graphs", "tiny_kernels": "GPU kernels the host cannot launch fast enough",
             "contention": "a second CUDA stream"}


# ------------------------------------------------------------------------------------------------ the model
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and a 4x GELU MLP, each with a residual."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, layers: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


# ------------------------------------------------------------------------------------------------ the data
class SyntheticTokens(torch.utils.data.Dataset):
    """Sample i: an arithmetic token sequence ``(a + b*t) mod vocab`` with (a, b) drawn from a generator seeded
    by i -- learnable (the loss falls), reproducible on every rank and worker, no files needed."""

    def __init__(self, samples: int, seq: int, vocab: int):
        self.samples, self.seq, self.vocab = samples, seq, vocab

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i):
        r = random.Random(i)  # Python's generator: no tensor op (and no .item()) in the loader's process
        a, b = r.randrange(self.vocab), r.randrange(1, 17)
        s = (a + b * torch.arange(self.seq + 1)) % self.vocab
        return s[:-1], s[1:]


class BatchPrefetcher:
    """Device batches from a DataLoader, epoch after epoch.

    ``side_stream=True`` (the clean job): batch n+1 is copied on a side stream while step n computes; ``next()``
    makes the compute stream wait for that copy and hands the tensors over to it (``record_stream``), then issues
    the following copy. ``side_stream=False``: the batch is copied on the compute stream when asked for."""

    def __init__(self, loader, sampler, device, side_stream: bool):
        self.loader, self.sampler, self.device, self.epoch = loader, sampler, device, 0
        self.it = iter(loader)
        self.side = torch.cuda.Stream(device) if side_stream and device.type == "cuda" else None
        self.ready = None

    def _host(self):
        try:
            return next(self.it)
        except StopIteration:
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.it = iter(self.loader)
            return next(self.it)

    def _copy(self):
        return [t.to(self.device, non_blocking=True) for t in self._host()]

    def next(self):
        if self.side is None:
            return self._copy()
        if self.ready is None:
            with torch.cuda.stream(self.side):
                self.ready = self._copy()
        batch, cur = self.ready, torch.cuda.current_stream(self.device)
        cur.wait_stream(self.side)
        for t in batch:
            t.record_stream(cur)
        with torch.cuda.stream(self.side):
            self.ready = self._copy()
        return batch


# ------------------------------------------------------------------------------------------------ setup
class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except None (the CPU/GPU-dependent ones, whose help says them)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=_Help)
    p.add_argument("--out", default="traces/train_ddp", help="directory for every rank's trace and sidecar")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    g = p.add_argument_group("model and data (defaults: GPU sizes with CUDA, tiny ones on CPU)")
    for name, help_ in [("layers", "transformer blocks"), ("d-model", "width"), ("heads", "attention heads"),
                        ("seq", "tokens per sample"), ("batch", "samples per rank per step"),
                        ("vocab", "vocabulary size"), ("num-workers", "DataLoader worker processes per rank")]:
        g.add_argument(f"--{name}", type=int, default=None, help=help_)
    g.add_argument("--lr", type=float, default=3e-4)
    s = p.add_argument_group("steps and profiler schedule (kit.capture)")
    s.add_argument("--warmup-steps", type=int, default=None, help="untimed steps first (>= 11 with --cuda-graph)")
    s.add_argument("--timed-steps", type=int, default=None, help="steps timed without the profiler recording")
    s.add_argument("--wait", type=int, default=1)
    s.add_argument("--warmup", type=int, default=2, help="profiler warm-up steps (recorded, then discarded)")
    s.add_argument("--active", type=int, default=3, help="recorded steps")
    s.add_argument("--flight-recorder", action="store_true",
                   help="keep a Flight Recorder buffer (sets TORCH_FR_BUFFER_SIZE before the process group) and "
                        "dump it per rank")
    f = p.add_argument_group("planted problems (one each; rule ids of kit doctor)")
    f.add_argument("--pageable", action="store_true",
                   help="pageable_h2d: the DataLoader does not pin its batches (copies from pageable memory)")
    f.add_argument("--h2d-on-compute-stream", action="store_true",
                   help="h2d_on_compute_stream: copy each batch on the compute stream, no prefetch on a side stream")
    f.add_argument("--per-param-allreduce", action="store_true",
                   help="per_param_allreduce + exposed_comm: no DDP, one all_reduce per parameter after backward")
    f.add_argument("--cuda-graph", action="store_true",
                   help="graph_mixing_gap: capture the whole step in a CUDA graph and replay it "
                        "(NCCL_GRAPH_MIXING_SUPPORT left at NCCL's default); the gap shows with "
                        "--per-param-allreduce (all-reduces serialised with the compute), not behind DDP's overlap")
    f.add_argument("--late-rank", type=int, default=None, metavar="R", help="late_rank: this rank sleeps before "
                   "every step (with --late-ms)")
    f.add_argument("--late-ms", type=float, default=200.0,
                   help="how long --late-rank sleeps per step; to show, it must exceed the host's lead over its GPU "
                        "(in a GPU-bound loop without syncs, up to a few steps)")
    f.add_argument("--item", action="store_true", help="host_sync: loss.item() every step")
    f.add_argument("--tiny-kernels", action="store_true",
                   help="launch_bound: --tiny-ops tiny elementwise ops after each step")
    f.add_argument("--tiny-ops", type=int, default=None,
                   help="tiny ops per step (default: 6000 on GPU, enough to make the host slower than the GPU step)")
    f.add_argument("--contention", action="store_true",
                   help="comm_compute_contention: every other step --contention-matmuls matmuls on a side stream "
                        "run beside the last gradient bucket's all-reduce")
    f.add_argument("--contention-n", type=int, default=4096, help="each side matmul is n x n x n in bf16")
    f.add_argument("--contention-matmuls", type=int, default=8, help="side matmuls per contended step")
    return p.parse_args(argv)


def init_distributed(args) -> tuple[int, int, torch.device]:
    """Process group from torchrun's environment, or a one-rank group when started alone."""
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    if "RANK" not in os.environ:  # started alone: a one-rank job
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.flight_recorder:
        capture.enable_flight_recorder()
    if cuda:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def defaults(args, cuda: bool) -> None:
    # batch 32: the GPU step (~70 ms on H200) stays longer than the host's, also under the profiler (which
    # doubles the host's time per op: at batch 8, 17 ms of GPU work per step met 28-37 ms of profiled host time)
    gpu = dict(layers=6, d_model=1024, heads=16, seq=1024, batch=32, vocab=8192, num_workers=2, warmup_steps=5,
               timed_steps=10, tiny_ops=6000)
    cpu = dict(layers=2, d_model=64, heads=4, seq=32, batch=4, vocab=256, num_workers=0, warmup_steps=1,
               timed_steps=1, tiny_ops=100)
    for k, v in (gpu if cuda else cpu).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.cuda_graph and cuda:
        args.warmup_steps = max(args.warmup_steps, 11)


def drop_cuda_only(args, cuda: bool, rank: int) -> list[str]:
    """The planted flags that need CUDA are switched off on CPU, one line each; returns the flags in force."""
    if not cuda:
        for flag, why in CUDA_ONLY.items():
            if getattr(args, flag):
                setattr(args, flag, False)
                if rank == 0:
                    print(f"train_ddp: --{flag.replace('_', '-')} needs CUDA ({why}): ignored on CPU")
    if args.cuda_graph and args.contention:
        raise SystemExit("train_ddp: --contention alternates between steps, a CUDA graph replays one: use one of them")
    on = [f for f in ("pageable", "h2d_on_compute_stream", "per_param_allreduce", "cuda_graph", "item",
                      "tiny_kernels", "contention") if getattr(args, f)]
    return on + ([f"late_rank={args.late_rank}"] if args.late_rank is not None else [])


class SideMatmul:
    """``--contention``: a DDP comm hook (PyTorch's ``allreduce_hook``) that, when ``on``, follows the last bucket's
    all-reduce with ``k`` n x n x n bf16 matmuls on a side stream that waits for the compute stream, as NCCL's
    does: both start together. Several medium matmuls rather than one big one, so that the GPU's block scheduler
    cannot hold the NCCL kernel back until one huge grid has been dispatched (seen on 2xH200: one 8192^3 matmul
    issued first delayed the all-reduce by ~1.5 ms, and it then overlapped only the matmul's tail)."""

    def __init__(self, n: int, k: int, device):
        self.on, self.k, self.side = False, k, torch.cuda.Stream(device)
        self.a, self.b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        self.c = torch.empty(n, n, device=device, dtype=torch.bfloat16)

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        fut = allreduce_hook(state, bucket)
        if self.on and bucket.is_last():
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                for _ in range(self.k):
                    torch.mm(self.a, self.b, out=self.c)
        return fut

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.side)


# ------------------------------------------------------------------------------------------------ the job
def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world, device = init_distributed(args)
    cuda = device.type == "cuda"
    defaults(args, cuda)
    planted = drop_cuda_only(args, cuda, rank)
    if args.d_model % args.heads:
        raise SystemExit("train_ddp: --d-model must be a multiple of --heads")
    if args.timed_steps < 1 or args.active < 1:
        raise SystemExit("train_ddp: --timed-steps and --active must be >= 1")

    torch.manual_seed(0)  # same initial weights on every rank
    model = GPT(args.vocab, args.seq, args.d_model, args.layers, args.heads).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    graph_stream = torch.cuda.Stream(device) if args.cuda_graph else None
    side_mm = None
    if args.per_param_allreduce:
        net = model
    elif graph_stream is not None:  # DDP constructed on a side stream before a whole-backward capture
        # (PyTorch's CUDA-graph notes also ask for TORCH_NCCL_ASYNC_ERROR_HANDLING=0 before the group exists; with
        # torch 2.11 under torchrun, which sets it to 1, the capture worked without it on 2xH200)
        with torch.cuda.stream(graph_stream):
            net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    else:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        if args.contention:
            side_mm = SideMatmul(args.contention_n, args.contention_matmuls, device)
            net.register_comm_hook(None, side_mm.hook)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, capturable=args.cuda_graph)

    data = SyntheticTokens(100_000, args.seq, args.vocab)
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.num_workers,
                                         pin_memory=cuda and not args.pageable, drop_last=True,
                                         persistent_workers=args.num_workers > 0)
    batches = BatchPrefetcher(loader, sampler, device, side_stream=cuda and not args.h2d_on_compute_stream)
    tiny = torch.zeros(256, device=device)
    loss_sum = torch.zeros((), device=device)

    def forward_backward_update(x, y, zero_grad: bool = True):
        # no autocast weight cache: a captured graph must not keep casts made outside it (PyTorch's graph notes)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda, cache_enabled=False):
            logits = net(x)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.view(-1))
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.per_param_allreduce:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()
        return loss.detach()

    graph, static = None, None
    if args.cuda_graph:
        x, y = batches.next()
        static = (x.clone(), y.clone())
        graph_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(graph_stream):  # >= 11 eager DDP iterations before the capture
            for _ in range(args.warmup_steps):
                forward_backward_update(*static)
        torch.cuda.current_stream().wait_stream(graph_stream)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients from the graph's pool
        # thread_local: the DataLoader's pin-memory thread keeps allocating pinned memory during the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_loss = forward_backward_update(*static, zero_grad=False)

    def step(i: int) -> None:
        if args.late_rank == rank:
            time.sleep(args.late_ms / 1e3)
        x, y = batches.next()
        if graph is not None:
            static[0].copy_(x)
            static[1].copy_(y)
            graph.replay()
            loss = static_loss
        else:
            if side_mm is not None:
                side_mm.on = i % 2 == 0
            loss = forward_backward_update(x, y)
            if side_mm is not None:
                side_mm.join()
        if args.tiny_kernels:  # per-step bookkeeping done one tiny op at a time
            for k in range(args.tiny_ops):
                if k % 2:
                    tiny.mul_(0.999)
                else:
                    tiny.add_(1e-3)
        if args.item:
            losses.append(loss.item())
        loss_sum.add_(loss)

    losses: list[float] = []
    if graph is None:
        for i in range(args.warmup_steps):
            step(i)
    warm_loss = None
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sched = dict(wait=args.wait, warmup=args.warmup, active=args.active)
    recorded = args.wait + args.warmup + args.active
    with capture.profile(args.out, unprofiled=args.timed_steps, flight_recorder=args.flight_recorder, **sched) as prof:
        for i in range(args.timed_steps + prof.unprofiled_host + recorded):  # + the host-timed steps
            if i == 0:
                sync()
                warm_loss = float(loss_sum) / args.warmup_steps if graph is None and args.warmup_steps else None
                loss_sum.zero_()
                t0 = time.perf_counter()
            step(args.warmup_steps + i)
            if i == args.timed_steps - 1:
                sync()
                step_ms = (time.perf_counter() - t0) * 1e3 / args.timed_steps
            prof.step()
    sync()
    last = float(loss_sum) / (args.timed_steps + prof.unprofiled_host + recorded)
    summary = {"rank": rank, "world_size": world, "backend": dist.get_backend(), "planted": planted,
               "params": n_params, "step_ms": round(step_ms, 3), "timed_steps": args.timed_steps,
               "loss_warmup_steps": warm_loss, "loss_later_steps": last, "traces": [p.name for p in prof.paths],
               "args": vars(args)}
    Path(args.out, f"summary_rank{rank}.json").write_text(json.dumps(summary, indent=1))
    dist.barrier()
    if rank == 0:
        print(f"train_ddp: {world} rank(s) ({dist.get_backend()}), {n_params / 1e6:.1f} M params, planted: "
              f"{', '.join(planted) or 'nothing'}; {step_ms:.2f} ms/step over {args.timed_steps} unprofiled steps; "
              f"loss {warm_loss if warm_loss is None else round(warm_loss, 3)} -> {last:.3f}; traces in {args.out}")
    code = 0 if math.isfinite(last) else 1
    if graph is not None:
        # the captured graph holds NCCL work: tearing the process group down with it alive hung on 2xH200
        # (torch 2.11), so the graph is released and the process leaves without the teardown
        graph.reset()
        torch.cuda.synchronize()
        sys.stdout.flush()
        os._exit(code)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
