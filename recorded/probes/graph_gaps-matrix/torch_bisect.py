"""Bisect the PyTorch probe (recorded/probes/graph_gaps-nonccl-h200/gg_nonccl.py, same body): which part of PyTorch's graph
makes the gap before each GEMM grow along a replay, where the CUDA C++ repro's cublasSgemm does not? At N = 160,
hidden 2048, fp32: the BLAS library PyTorch calls (cuBLAS / cuBLASLt, torch.backends.cuda.preferred_blas_library) x
TF32 x the shared external record (ext) or not (plain). Per graph: time per layer (CUDA events, median of 5 replays)
and one profiled replay (OUT/<key>.json.gz); per library a DOT dump (verbose: kernel node attributes, edge types)
of the N = 4 ext graph. One GPU.

    python3 recorded/probes/graph_gaps-matrix/torch_bisect.py OUTDIR [stream]

With ``stream``: the same graph (cuBLAS, no TF32, plain / ext) replayed into PyTorch's default current stream (the
legacy default stream, as gg_nonccl.py does) and into a created stream (``with torch.cuda.stream(s)``).
"""
import gzip
import json
import os
import shutil
import sys

import torch
from torch.profiler import ProfilerActivity, profile

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
dev = torch.device("cuda")


def build(n, hidden, external, keep=False):
    a = torch.randn(1024, hidden, device=dev)
    w = torch.randn(hidden, hidden, device=dev) / hidden ** 0.5
    small = torch.zeros(1, device=dev)
    side = torch.cuda.Stream()
    ev = torch.cuda.Event(external=True) if external else None

    def body():
        x = a
        for _ in range(n):
            x = torch.tanh(x @ w)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                small.add_(1.0)
                if ev is not None:
                    ev.record(side)
            torch.cuda.current_stream().wait_stream(side)
        return x

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=keep) if keep else torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    torch.cuda.synchronize()
    return g, (a, w, small, side, ev)


def timed(g, stream=None):
    """Median of 5 replays (us) on ``stream`` (None: the current stream), then one profiled replay."""
    ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream())
    with ctx:
        g.replay()
        torch.cuda.synchronize()
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(5):
            st.record()
            g.replay()
            en.record()
            en.synchronize()
            ts.append(st.elapsed_time(en) * 1e3)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
    return sorted(ts)[2], prof


def save(prof, key):
    prof.export_chrome_trace(f"/tmp/{key}.json")
    with open(f"/tmp/{key}.json", "rb") as fi, gzip.open(f"{out}/{key}.json.gz", "wb") as fo:
        shutil.copyfileobj(fi, fo)


res = {}
if sys.argv[2:] == ["stream"]:
    torch.backends.cuda.preferred_blas_library("cublas")
    for external in (False, True):
        g, keep = build(160, 2048, external)
        for where, stream in (("default", None), ("created", torch.cuda.Stream())):
            key = f"stream_{where}_{'ext' if external else 'plain'}"
            us, prof = timed(g, stream)
            save(prof, key)
            res[key] = dict(stream=where, external=external, replay_us=us, per_layer_us=us / 160,
                            current=str(torch.cuda.current_stream() if stream is None else stream))
            print(key, res[key], flush=True)
        del g, keep
    json.dump(res, open(f"{out}/stream.json", "w"), indent=1)
    sys.exit(0)
for lib in ("cublas", "cublaslt"):
    torch.backends.cuda.preferred_blas_library(lib)
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for external in (False, True):
            key = f"{lib}_tf32{int(tf32)}_{'ext' if external else 'plain'}"
            try:
                g, keep = build(160, 2048, external)
                g.replay()
                torch.cuda.synchronize()
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ts = []
                for _ in range(5):
                    st.record()
                    g.replay()
                    en.record()
                    en.synchronize()
                    ts.append(st.elapsed_time(en) * 1e3)
                res[key] = dict(lib=lib, tf32=tf32, external=external, replay_us=sorted(ts)[2],
                                per_layer_us=sorted(ts)[2] / 160)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    g.replay()
                    torch.cuda.synchronize()
                prof.export_chrome_trace(f"/tmp/{key}.json")
                with open(f"/tmp/{key}.json", "rb") as fi, gzip.open(f"{out}/{key}.json.gz", "wb") as fo:
                    shutil.copyfileobj(fi, fo)
                del g, keep
            except Exception as e:  # noqa: BLE001 - the row says what failed
                res[key] = dict(lib=lib, tf32=tf32, external=external, error=repr(e)[:300])
            print(key, res[key], flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        g, keep = build(4, 2048, True, keep=True)
        g.debug_dump(f"{out}/{lib}_n4_ext.dot")
        del g, keep
    except Exception as e:  # noqa: BLE001
        print(lib, "dot failed", repr(e)[:300], flush=True)
json.dump(res, open(f"{out}/bisect.json", "w"), indent=1)
