"""Does PyTorch's own CUDA-graph machinery replay into the legacy default stream, with NCCL collectives inside?

Run under torchrun on 2+ GPUs (one launch per NCCL_GRAPH_MIXING_SUPPORT setting: NCCL reads it once; the training
variants run first, then the compiled ones, whose compilation takes longest):

    torchrun --nproc-per-node 2 compile_probe.py --out DIR [--layers 160]

The model is graph_gaps' (N x Linear(2048, 2048, bias=False) + an all_reduce after every layer, batch 1024, fp32,
TF32 off). Variants, each timed with CUDA events on the caller's stream (warm-up, then every sample kept):

* ``eager``            -- the Python loop with ``dist.all_reduce`` (inference);
* ``compile``          -- ``torch.compile(mode="reduce-overhead")`` of the loop written with functional collectives
  (``torch.distributed._functional_collectives.all_reduce``): CUDA-graph trees, called as a training loop does;
* ``compile+stream``   -- the same compiled function called inside ``with torch.cuda.stream(s)`` (s joined);
  ``compile_again`` the plain call once more after it;
* ``train_eager``      -- a training step (forward with the differentiable ``torch.distributed.nn.functional
  .all_reduce``, backward, no optimizer) in eager mode;
* ``train_graphed``    -- the same module through ``torch.cuda.make_graphed_callables``;
* ``train_graphed+stream`` -- that graphed step called inside ``with torch.cuda.stream(s)``.

Which stream each replay went to: ``torch.cuda.CUDAGraph.replay`` is wrapped to count
``torch.cuda.current_stream().cuda_stream`` at every call (0x0: the legacy default stream). One profiled step per
variant is kept (``trace_variant=<v>_rank<r>.json.gz``) for the gap analysis (kit.traces.gaps) on CPU.
Writes ``rows_rank<r>.jsonl`` (one JSON object a line) and ``info_rank<r>.json``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import os
import shutil
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

REPLAYS: collections.Counter = collections.Counter()
_orig_replay = torch.cuda.CUDAGraph.replay


def _counting_replay(self, *a, **k):
    REPLAYS[hex(torch.cuda.current_stream().cuda_stream)] += 1
    return _orig_replay(self, *a, **k)


torch.cuda.CUDAGraph.replay = _counting_replay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=160)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--train-layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated variant groups: compile,train")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = open(out / f"rows_rank{rank}.jsonl", "w")
    mixing = os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "1")
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gpu": torch.cuda.get_device_name(dev), "world": world, "mixing": mixing,
            "default_stream": hex(torch.cuda.default_stream(dev).cuda_stream),
            "current_stream": hex(torch.cuda.current_stream(dev).cuda_stream)}

    def emit(**r):
        rows.write(json.dumps({"rank": rank, "world": world, "mixing": mixing, **r}) + "\n")
        rows.flush()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream(dev)

    def in_stream(fn):
        def call():
            cur = torch.cuda.current_stream(dev)
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                r = fn()
            cur.wait_stream(side)
            return r
        return call

    def timed(variant, fn, layers):
        REPLAYS.clear()
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            fn()
        torch.cuda.synchronize()
        emit(kind="warmup", variant=variant, layers=layers, seconds=time.perf_counter() - t0,
             replays_by_stream=dict(REPLAYS))
        REPLAYS.clear()
        for i in range(a.repeats):
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            emit(kind="time", variant=variant, layers=layers, sample=i, time_us=start.elapsed_time(end) * 1e3)
        emit(kind="replays", variant=variant, layers=layers, replays_by_stream=dict(REPLAYS))
        dist.barrier()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        path = out / f"trace_variant={variant.replace('+', '-')}_rank{rank}.json"
        prof.export_chrome_trace(str(path))
        with open(path, "rb") as src, gzip.open(f"{path}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()

    def attempt(variant, make, layers):
        try:
            fn = make()
            timed(variant, fn, layers)
        except Exception as e:  # noqa: BLE001 -- a variant that fails is a finding: keep its error, go on
            emit(kind="error", variant=variant, layers=layers, error=f"{type(e).__name__}: {e}"[:2000],
                 tb=traceback.format_exc()[-4000:])
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 -- the error above is what is kept
                pass

    g = torch.Generator(device=dev).manual_seed(1234 + rank)
    h, b = a.hidden, a.batch
    scale = 1.0 / math.sqrt(h * world)
    groups = set(a.only.split(",")) if a.only else {"compile", "train"}

    if "train" in groups:
        import torch.distributed.nn.functional as dnnf

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(h, h, bias=False) for _ in range(a.train_layers))
                for lin in self.layers:
                    torch.nn.init.normal_(lin.weight, std=scale)

            def forward(self, inp):
                y = inp
                for lin in self.layers:
                    y = dnnf.all_reduce(lin(y))
                return y

        xt = torch.randn(b, h, device=dev, generator=g, requires_grad=True)

        def step_of(model):
            def step():
                model(xt).square().mean().backward()
            return step

        attempt("train_eager", lambda: step_of(Net().to(dev)), a.train_layers)

        def graphed():
            net = Net().to(dev)
            return step_of(torch.cuda.make_graphed_callables(net, (xt,)))

        gstep = None

        def make_graphed():
            nonlocal gstep
            gstep = graphed()
            return gstep

        attempt("train_graphed", make_graphed, a.train_layers)
        if gstep is not None:
            attempt("train_graphed+stream", lambda: in_stream(gstep), a.train_layers)

    if "compile" in groups:
        from torch.distributed import _functional_collectives as funcol

        ws = [torch.randn(h, h, device=dev, generator=g) * scale for _ in range(a.layers)]
        x = torch.randn(b, h, device=dev, generator=g)
        group = dist.group.WORLD

        def eager():
            y = x
            for w in ws:
                y = torch.nn.functional.linear(y, w)
                dist.all_reduce(y)
            return y

        class Functional(torch.nn.Module):
            """The same weights as parameters (CUDA-graph trees keep parameters static: not copied per replay)."""

            def __init__(self):
                super().__init__()
                self.ws = torch.nn.ParameterList(torch.nn.Parameter(w, requires_grad=False) for w in ws)

            def forward(self, inp):
                y = inp
                for w in self.ws:
                    y = funcol.all_reduce(torch.nn.functional.linear(y, w), "sum", group)
                return y

        functional = Functional()

        with torch.no_grad():
            attempt("eager", lambda: eager, a.layers)
            t0 = time.perf_counter()
            compiled = torch.compile(functional, mode="reduce-overhead")

            def call():
                return compiled(x)

            attempt("compile", lambda: call, a.layers)
            emit(kind="compile_time", variant="compile", layers=a.layers, seconds=time.perf_counter() - t0)
            attempt("compile+stream", lambda: in_stream(call), a.layers)
            attempt("compile_again", lambda: call, a.layers)  # after the stream variant: does the order matter?
        del ws

    info["replay_wrapper"] = "torch.cuda.CUDAGraph.replay counted by current stream"
    (out / f"info_rank{rank}.json").write_text(json.dumps(info, indent=1))
    rows.close()
    dist.barrier()
    torch.cuda.synchronize()
    # no destroy_process_group: CUDA-graph trees keep their graphs (and with them NCCL's references on the
    # communicator) alive to the end, and ncclCommDestroy waits for those graphs to die -- graph_gaps' teardown
    # hang (recorded/probes/graph_gaps-teardown-h200x2/); this probe's first run sat there until its timeout
    os._exit(0)


if __name__ == "__main__":
    main()
