"""Print what a round's results show: ``python analyze.py RESULTS_DIR`` (the directory run_r*.sh wrote)."""

from __future__ import annotations

import glob
import json
import os
import sys

import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
pd.set_option("display.width", 250)
pd.set_option("display.max_columns", 30)
pd.set_option("display.max_rows", 200)


def probe(d):
    p = os.path.join(d, "probe", "probe.json")
    if not os.path.exists(p):
        print("no probe.json")
        return
    r = json.load(open(p))
    print("== probe env", r.get("env"), {k: v for k, v in r.items() if k.endswith("_s")})
    for k, v in r.items():
        if k.endswith("_error"):
            print("!!", k, v[-1500:])
    for n, res in (r.get("pipeline") or {}).items():
        print(f"-- pipeline {n} stages")
        if isinstance(res, str):
            print(res)
            continue
        print("model_ms", round(res.get("model_ms", float("nan")), 3), "transfer", {k: round(v["median"], 1) for k, v in res.get("transfer_us", {}).items()})
        print("parts F/B median:", {s: (round(x["F"]["median"], 1), round(x["B"]["median"], 1)) for s, x in res.get("parts_us", {}).items()})
        for name, v in res.items():
            if isinstance(v, dict) and "total_ms" in v:
                print(f"   {name:40s} total {v['total_ms']['median']:7.2f} ms (p10 {v['total_ms']['p10']:.2f} p90 {v['total_ms']['p90']:.2f})"
                      f"  issue {v['issue_ms']['median']:7.2f} ms  vs model {v['vs_model']:.2f}")
            elif isinstance(v, str):
                print("  ", name, v)
    if "small" in r:
        print("-- 1 KiB per message GPU0->GPU1 (us): device, host (median; p10-p90)")
        for k, v in r["small"].items():
            dv, hv = v["device_us"], v["host_us"]
            print(f"   {k:34s} device {dv['median']:7.2f} ({dv['p10']:.2f}-{dv['p90']:.2f})   host {hv['median']:7.2f} ({hv['p10']:.2f}-{hv['p90']:.2f})")
    if "call" in r:
        print("-- host time in one 64 KiB call after an idle state (us, median)")
        for k, v in r["call"].items():
            print(f"   {k:45s} call {v['call_us']['median']:7.1f} (p90 {v['call_us']['p90']:.1f})  wait {v['wait_us']['median']:6.1f}  "
                  + " ".join(f"{a}={b:.1f}" for a, b in v["sub_us"].items()))


def cpu_ops(path, top=25):
    from kit import traces

    t = traces.load_trace(path)
    c = t.cpu
    print(f"   {os.path.basename(path)}: cpu span {(c.end.max() - c.ts.min()) / 1e3:.2f} ms, gpu span "
          f"{(t.gpu.end.max() - t.gpu.ts.min()) / 1e3:.2f} ms")
    print(c.groupby(["cat", "name"])["dur"].agg(["count", "sum", "median", "max"]).sort_values("sum", ascending=False).head(top).round(1))
    return t


def gpu_busy(t):
    g = t.gpu
    from kit.traces.overlap import length, union

    out = []
    for (d), x in g.groupby("device"):
        comp = x[~x["name"].str.contains("Memcpy|Memset", regex=True)]
        out.append(dict(device=d, span_ms=(g.end.max() - g.ts.min()) / 1e3, busy_ms=length(union(list(zip(x.ts, x.end)))) / 1e3,
                        compute_kernels_ms=comp.dur.sum() / 1e3, memcpy_ms=x[x.name.str.contains("Memcpy")].dur.sum() / 1e3,
                        n_memcpy=int(x.name.str.contains("Memcpy").sum())))
    print(pd.DataFrame(out).round(3))


def kit_runs(d):
    from kit import results
    from kit.investigations.p2p_transports import analysis as A
    from kit.investigations.p2p_transports import pipeline_analysis as PA

    for sub in ("kit2", "kit4", "h100x2", "h100x4"):
        dirs = glob.glob(os.path.join(d, sub, "p2p_transports", "*"))
        for run in dirs:
            print(f"== {sub}: {run}")
            df = results.load(run)
            print(df["kind"].value_counts().to_dict())
            import subprocess
            subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks", "bench_p2p.py"),
                            "--run", run])
            rs = results.RunSet([run], sub)
            mo = PA.model(rs)
            if len(mo):
                print(mo[["transport", "driver", "stages", "transfer_ms", "predicted_ms", "predicted_p10_ms", "predicted_p90_ms",
                          "formula_ms", "host_model_ms", "measured_ms", "measured_vs_model", "measured_vs_host_model"]].round(3).to_string())
            pa = PA.parts(rs)
            if len(pa):
                print(pa.round(1).to_string())
            try:
                print(PA.idle(rs).round(3).to_string())
            except Exception as e:  # noqa: BLE001
                print("idle failed", e)
            try:
                print(A.matrices(rs).round(1))
            except Exception as e:  # noqa: BLE001
                print("matrix failed", e)
            print(A.at_size(df, 256 << 20, "both"))
            print(A.latency(df).round(2).to_string())
            raw = df[df.kind == "pipeline_part"]
            if "host_us" in raw.columns:
                print(raw.groupby(["transport", "part", "stage"])[["time_us", "host_us"]].median().round(1).unstack("transport").to_string())
            sk = A.skipped(df)
            if len(sk):
                print(sk.to_string())
            err = os.path.join(run, "error.txt")
            if os.path.exists(err):
                print(open(err).read()[:3000])


def ipc(d):
    from kit import results, stats

    runs = glob.glob(os.path.join(d, "ipc", "ipc_probe", "*", "*"))
    for run in runs:
        print("== ipc probe", run)
        err = os.path.join(run, "error.txt")
        if os.path.exists(err):
            print(open(err).read()[:3000])
        df = results.load(run)
        if df.empty:
            continue
        p = df[df["kind"] == "probe"]
        t = p[p["time_us"].notna()]
        keys = ["variant", "transport"] if "transport" in t.columns else ["variant"]
        t = t.assign(transport=t["transport"].fillna("-")) if "transport" in t.columns else t
        s = stats.slowest_rank_stats(t, keys)
        s["GB/s per direction"] = stats.gbps(256 << 20, s["time_us_median"])
        print(s.round(1).to_string())
        ins = p[p["variant"] == "inside incoming"]
        if len(ins):
            print("inside incoming: copy", ins["copy_us"].median(), "round", ins["round_us"].median())


if __name__ == "__main__":
    d = sys.argv[1]
    probe(d)
    for f in sorted(glob.glob(os.path.join(d, "probe", "trace_*.json.gz"))):
        try:
            t = cpu_ops(f)
            gpu_busy(t)
        except Exception as e:  # noqa: BLE001
            print("trace failed", f, e)
    ipc(d)
    kit_runs(d)
