"""Facts per case and rank of the train_ddp traces (what each doctor rule needs), as one table.

python3 recorded/h200x2/doctor/check_traces.py DIR [--json OUT]   (DIR: one folder per case, e.g. this one)
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kit import traces
from kit.traces.overlap import union, length, intersect

SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def facts(path: Path) -> dict:
    t = traces.load_trace(path, cpu="all", cache=False)
    gpu, cpu = t.gpu, t.cpu
    names = cpu["name"].astype(str)
    steps = cpu[names.str.startswith("ProfilerStep#")].sort_values("ts")
    n = max(len(steps), 1)
    win = (steps["ts"].min(), (steps["ts"] + steps["dur"]).max()) if len(steps) else (gpu["ts"].min(), gpu["end"].max())
    k = gpu[gpu["cat"] == "kernel"]
    nccl = k[k["nccl"].astype(bool)]
    comp = k[~k["nccl"].astype(bool)]
    main_stream = comp["stream"].value_counts().idxmax() if len(comp) else None
    mem = gpu[gpu["cat"] == "gpu_memcpy"]
    mname = mem["name"].astype(str)
    h2d = mem[mname.str.contains("HtoD")]
    g = traces.gaps(gpu)
    ok = g[~g["stall"].astype(bool)]
    inwin = (gpu["ts"] >= win[0]) & (gpu["end"] <= win[1])
    busy = length(union(list(zip(gpu[inwin]["ts"], gpu[inwin]["end"]))))
    span = win[1] - win[0]
    rt = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"])]
    rtn = rt["name"].astype(str)
    coll = t.collectives
    out = {
        "rank": t.info.rank, "world": t.info.world_size, "backend": t.info.backend, "kb": path.stat().st_size // 1024,
        "steps": len(steps), "step_ms": round(float(steps["dur"].mean()) / 1e3, 2) if len(steps) else None,
        "kernels/step": round(len(k) / n, 1), "nccl/step": round(len(nccl) / n, 1),
        "nccl_bytes": sorted({int(b) for b in coll["bytes"].dropna()})[:3] + ["..."] if len(coll) else [],
        "nccl_med_us": round(float(nccl["dur"].median()), 1) if len(nccl) else None,
        "nccl_max_us": round(float(nccl["dur"].max()), 1) if len(nccl) else None,
        "h2d/step": round(len(h2d) / n, 1), "h2d_pageable": int(mname.str.contains("Pageable").sum()),
        "h2d_on_main": int((h2d["stream"] == main_stream).sum()) if main_stream is not None else 0,
        "graph_launch": int((rtn == "cudaGraphLaunch").sum()),
        "sync_calls": int(rtn.isin(SYNC).sum()), "item": int((names == "aten::item").sum()),
        "gap_nccl_med_us": round(float(ok[ok["before"] == "nccl"]["gap_us"].median()), 2) if (ok["before"] == "nccl").any() else None,
        "gap_nccl_p90_us": round(float(ok[ok["before"] == "nccl"]["gap_us"].quantile(0.9)), 2) if (ok["before"] == "nccl").any() else None,
        "gap_other_med_us": round(float(ok[ok["before"] == "other"]["gap_us"].median()), 2) if (ok["before"] == "other").any() else None,
        "tiny_kernels/step": round(int((comp["dur"] < 5).sum()) / n, 1),
        "gpu_busy_%": round(100 * busy / span, 1) if span > 0 else None,
        "header_kitCapture": "kitCapture" in t.header,
    }
    # comm overlapped by compute (union of non-NCCL kernels inside NCCL kernels), per step
    if len(nccl):
        cu = union(list(zip(comp["ts"], comp["end"])))
        nu = union(list(zip(nccl["ts"], nccl["end"])))
        out["comm_us/step"] = round(length(nu) / n, 1)
        out["comm_hidden_%"] = round(100 * length(intersect(nu, cu)) / max(length(nu), 1e-9), 1)
    return out


def main():
    root = Path(sys.argv[1])
    rows = []
    for case in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in traces.find_traces(case):
            try:
                rows.append({"case": case.name, **facts(f.path)})
            except Exception as e:  # one broken trace must not hide the others
                rows.append({"case": case.name, "rank": f.rank, "error": f"{type(e).__name__}: {e}"})
        for s in sorted(case.glob("summary_rank*.json")):
            d = json.loads(s.read_text())
            for r in rows:
                if r["case"] == case.name and r.get("rank") == d["rank"]:
                    r["summary_step_ms"] = d["step_ms"]
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 250, "display.max_columns", 40, "display.max_colwidth", 30)
    print(df.drop(columns=["nccl_bytes", "header_kitCapture", "world", "backend"], errors="ignore").to_string())
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(df.to_json(orient="records", indent=1))


if __name__ == "__main__":
    main()
