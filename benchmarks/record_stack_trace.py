"""Record a real one-rank trace of the size users bring: a plain GPT training loop on one GPU, profiled with
``with_stack=True``, ``profile_memory=True`` and ``record_shapes=True`` (the heaviest settings), written by
``torch.profiler.tensorboard_trace_handler`` -- the input of ``benchmarks/bench_doctor.py`` and
``bench_trace_tools.py``'s real-trace rows. Needs a CUDA GPU (``--device cpu``: a CPU-only trace of the same
loop with the same options, for a dry run or for profiling the parser before a GPU trace is at hand).

    python benchmarks/record_stack_trace.py OUT_DIR [--active 12] [--layers 8] [--model encoder|nanogpt]
                                                    [--device cuda|cpu] [--also-active N]

``--model nanogpt``: the blocks written out in Python (attention from q, k, v, a causal mask, softmax; an MLP),
as most training scripts do, so each op sits under a deeper Python stack and allocates more small tensors:
more ``python_function`` and ``[memory]`` events per op than ``nn.TransformerEncoderLayer``'s fused path.
``--also-active N``: first a short profile of N steps (written under ``OUT_DIR/short``, so a time limit that
stops the long one still leaves a trace), then the long one under ``OUT_DIR``.

Prints each file, its size and what recorded it; not committed (100-150 MB): regenerate it on a GPU node.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path


def build(kind: str, layers: int, d: int, vocab: int, seq: int):
    import torch
    import torch.nn as nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), 8
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return self.down(nn.functional.gelu(self.up(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Attention(), nn.LayerNorm(d), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    if kind == "nanogpt":
        layer = Block
    else:
        layer = lambda: nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True)  # noqa: E731
    return nn.Sequential(nn.Embedding(vocab, d), *[layer() for _ in range(layers)], nn.Linear(d, vocab))


def main() -> int:
    import torch
    import torch.nn as nn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--active", type=int, default=12, help="profiled steps")
    ap.add_argument("--also-active", type=int, default=0, help="first a short profile of this many steps")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--model", choices=("encoder", "nanogpt"), default="encoder")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("record_stack_trace: needs a CUDA GPU (--device cpu for a CPU-only trace)", file=sys.stderr)
        return 2
    dev = a.device
    d, vocab, seq, batch = (512, 8192, 256, 16) if dev == "cuda" else (128, 1024, 64, 4)
    model = build(a.model, a.layers, d, vocab, seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(vocab, (64, seq + 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=batch, shuffle=True,
                                         drop_last=True)
    gpu = f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" if dev == "cuda" else "cpu"

    def step(x):
        x = x.to(dev, non_blocking=True)
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def record(out: Path, active: int) -> None:
        out.mkdir(parents=True, exist_ok=True)
        sched = torch.profiler.schedule(wait=1, warmup=2, active=active, repeat=1)
        acts = [torch.profiler.ProfilerActivity.CPU]
        if dev == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        t0 = time.time()
        with torch.profiler.profile(activities=acts, schedule=sched, with_stack=True, profile_memory=True,
                                    record_shapes=True,
                                    on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out))) as prof:
            it = iter(())
            for _ in range(3 + active):
                try:
                    (x,) = next(it)
                except StopIteration:
                    it = iter(loader)
                    (x,) = next(it)
                step(x)
                prof.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        for f in sorted(out.glob("*.json*")):
            print(f"{f} {f.stat().st_size / 1e6:.1f} MB ({time.time() - t0:.1f} s, {active} profiled steps, "
                  f"model {a.model} x{a.layers}, torch {torch.__version__}, {gpu})", flush=True)

    if a.also_active:
        record(a.out / "short", a.also_active)
    record(a.out, a.active)
    return 0


if __name__ == "__main__":
    sys.exit(main())
