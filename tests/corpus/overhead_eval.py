"""The profiler-overhead estimate's per-op price, judged on every committed job whose overhead was measured.

Where a trace has no unprofiled step time, :mod:`kit.doctor.overhead` prices the profiler's host time (recorded
events per step x a per-event cost) and takes off the part that lengthened the step (``overhead._exposed``). Here
that price meets the committed GPU jobs whose unprofiled step *was* timed (:func:`cases`: ``truth.json``'s
``step_us_unprofiled``, per rank where it has them; the 2x H200 example jobs' ``summary_rank*.json`` ``step_ms``):
the true overhead per rank is its traced step (median of its step windows) less its unprofiled median, with the
spread against the unprofiled p10-p90; the job's is the median over its ranks. The multi-process jobs recorded
with and without ``record_shapes`` (:data:`MULTI`: ``recorded/profiler_overhead/multi/probe.py``'s kit.capture
windows, their traces not committed) come as each window's features, read once from the probe's output
(``--multi-from DIR``, written to :data:`MULTI`); their with-shapes windows are a validation set never fitted on, and
so are the windows of :data:`MULTI_HELD_OUT`'s hosts; the other no-shapes windows are fitted only by the models whose
settings split distributed jobs (:data:`MULTI_MODELS`).

Per rank (:func:`rank_features`): ops, runtime calls, kernels, short ops, ops that launched, settings, CUPTI's own
events, two host readings (the median traced length of its kernel launches and of its cheap leaf ops) and its
exposure curve (the overhead ``_exposed`` gives at each uniform per-op price of :data:`GRID`). A price model
(:data:`MODELS`) gives each rank its recorded-event host time per step; through the rank's curve that is the
overhead it estimates, the job's the largest over its ranks. Models are fitted (``scipy.optimize.nnls`` on the
relative error, or medians) on the jobs whose price is determined (:func:`implied`) and judged on the scored jobs
leave one job out, fitted on the other GPU model's jobs, and on the other model family's. Every fit's residuals
are printed; ``--out`` writes :data:`CHOSEN` as the doctor's table.

    python tests/corpus/overhead_eval.py [--cache /tmp/overhead_eval.json] [--out recorded/profiler_overhead/jobs-launch.json]
    python tests/corpus/overhead_eval.py --multi-from DIR   # writes MULTI, then judges
    # DIR: every probe run's <hw>x<world>/ folders side by side (s7r2's h200x2, h200x4; s8r2's h100x2, h100x4),
    # traces as .json.gz (s8r2 sent them as .json.xz: xz -dc | gzip)

Exit status 0; 2 when no job has a measured overhead.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "doctor"
EXAMPLES = ROOT / "recorded" / "h200x2" / "doctor"
MULTI = ROOT / "recorded" / "profiler_overhead" / "multi" / "jobs.json.gz"
"""the multi-process kit.capture windows' features (:func:`multi_features`; gzipped JSON, one window a line): the
traces are not committed (but one window's)"""
MULTI_STACK = ROOT / "recorded" / "profiler_overhead" / "multi" / "stack.json.xz"
"""the multi-process kit.capture windows recorded with record_shapes, + with_stack, + with_stack and profile_memory
(``recorded/profiler_overhead/multi/stack/``'s probe, round s11r1: features computed on the device, ``--stack-from``;
no trace committed): their stack windows fit the with_stack row, their plain-shapes windows are validation"""
STACK_HELD_OUT = ("s11r2-",)
MULTI_OFFOPS = ROOT / "recorded" / "profiler_overhead" / "multi" / "offops" / "features-s12r1-h200x4.json.xz"
"""the stack probe of session 12 (``offops/run.sh``, round s12r1, 2 of 4x H200: record_shapes / + with_stack, ABBA):
GPT DDP control, GPT with its input transform on rank 1's training thread, FSDP control and stall_rank. Their stack
windows of the controls join the with_stack row's fit (FSDP's 10-11 Python frames per op among its ops, where the
DDP windows hold about 1); each rank's frames off the ops (``py_off``, priced apart: :func:`off_frame_fit`) are
left out of its frames (:func:`frames_x`), the input transform's windows (priced mostly by them) and the stall_rank
ones (:data:`FRAME_FIT_OUT`) are checks"""
"""the stack windows recorded after the with_stack row was fitted (round s11r2, another machine or session): a
validation set, never fitted on"""
OFF_FRAMES = ROOT / "recorded" / "profiler_overhead" / "multi" / "off_frames.json"
"""the ranks whose pure-Python work off their ops was traced with stacks, with their measured overhead: the with_stack
row's price per frame off the ops (:func:`off_frame_fit`; the file's ``how`` says what each number is)"""
MULTI_HELD_OUT = ("h100x2/", "h100x4/")
"""the multi-process windows recorded after the distributed row was fitted (on 4x H100, a host it was not fitted on):
a validation set, never fitted on, like every window with shapes"""
GRID = [round(0.5 * i, 1) for i in range(21)] + [float(x) for x in range(11, 31)]
"""the uniform per-op prices (us) each rank's exposure curve is computed at: 0-10 by 0.5, then to 30 by 1"""
GPU_BOUND = 1.25
"""a job whose unprofiled step is below this x its busiest GPU's compute is GPU-bound: its price is not determined"""
CHEAP_OPS = ("aten::view", "aten::as_strided", "aten::t", "aten::transpose", "aten::detach", "aten::empty",
             "aten::expand", "aten::slice", "aten::select", "aten::reshape", "aten::unsqueeze", "aten::permute")
"""ops that launch nothing and do little: their traced length is mostly the host's and the profiler's"""


# ------------------------------------------------------------------------------------------------ the set
def cases() -> list[dict]:
    """Every committed GPU job whose unprofiled step was timed: name, trace files, per-rank unprofiled samples
    (rank -> list of us), and the truth's facts (device, model family, settings, profiler, world size)."""
    out = []
    for truth in sorted(DATA.glob("*/*/truth.json")) + sorted(DATA.glob("*/truth.json")):
        t = json.loads(truth.read_text())
        dev = t.get("device") or ""
        u = t.get("step_us_unprofiled")
        if not isinstance(u, dict) or "NVIDIA" not in dev:
            continue
        files = sorted(str(p) for p in truth.parent.glob("*.json.gz"))
        if not files:
            continue
        per = u.get("per_rank")
        unprof = {r: p["samples"] for r, p in enumerate(per)} if per else {None: u.get("samples") or [u["median"]]}
        if not isinstance(next(iter(unprof.values())), list):
            unprof = {r: [u["median"]] for r in unprof}
        out.append({"case": str(truth.parent.relative_to(DATA)), "files": files, "unprof": unprof,
                    "device": dev, "family": t.get("model") or truth.parent.name.split("-")[0],
                    "profiler": t.get("profiler"), "world_size": int(t.get("world_size") or 1),
                    "record_shapes": t.get("record_shapes"), "with_stack": t.get("with_stack"),
                    "host_cpu": t.get("host_cpu")})
    for summ in sorted(EXAMPLES.glob("*/summary_rank0.json")):
        d = DATA / summ.parent.name
        files = sorted(str(p) for p in d.glob("trace_rank*.json.gz"))
        if not files:
            continue
        unprof = {}
        for r in range(8):
            s = summ.parent / f"summary_rank{r}.json"
            if s.is_file():
                unprof[r] = [1e3 * float(json.loads(s.read_text())["step_ms"])]
        cap = json.loads((summ.parent / "capture_rank0.json").read_text())
        out.append({"case": f"examples-h200x2/{d.name}", "files": files, "unprof": unprof,
                    "device": cap.get("device_name") or "", "family": "gpt", "profiler": "kit.capture (no timing)",
                    "world_size": len(unprof), "record_shapes": cap.get("record_shapes"),
                    "with_stack": cap.get("with_stack"), "host_cpu": None})
    for meta in sorted(ROOT.glob("recorded/*/collective_tracing/*/meta.json")):
        import pandas as pd  # the collective_tracing runs: steps timed unprofiled (rows.csv.gz), then profiled

        cfg, rows = json.loads(meta.read_text())["config"], meta.parent / "rows.csv.gz"
        st = pd.read_csv(rows, low_memory=False) if rows.is_file() else None
        for part in ("ddp", "tp"):
            files = sorted(str(p) for p in meta.parent.glob(f"trace_*{part}_rank*.json.gz"))
            if not files or st is None:
                continue
            t = st[(st["kind"] == "step") & (st["part"] == part)]
            out.append({"case": f"{meta.parent.parent.parent.name}/collective_tracing/{meta.parent.name[:15]}-{part}",
                        "files": files, "unprof": {int(r): list(g["time_us"]) for r, g in t.groupby("rank")},
                        "device": "NVIDIA H100 80GB HBM3" if "h100" in str(meta) else "NVIDIA H200",
                        "family": "mlp" if part == "ddp" else "tp", "profiler": "collective_tracing",
                        "world_size": len(files), "record_shapes": None, "with_stack": None, "host_cpu": None,
                        "per_window": int(cfg.get("profile_steps") or 1), "validation": True})
    if MULTI.is_file():
        for j in json.loads(gzip.decompress(MULTI.read_bytes()))["jobs"]:
            out.append({**j, "unprof": {int(r): v for r, v in j["unprof"].items()}, "files": [], "multi": True,
                        "validation": bool(j["record_shapes"]) or j["case"].startswith(MULTI_HELD_OUT)})
    if MULTI_STACK.is_file():
        import lzma

        for j in json.loads(lzma.decompress(MULTI_STACK.read_bytes()))["jobs"]:
            out.append({**j, "unprof": {int(r): v for r, v in j["unprof"].items()}, "files": [], "multi": True,
                        "stackset": True,
                        "validation": not j.get("with_stack") or j["case"].startswith(STACK_HELD_OUT)})
    out += offops_windows()
    return out


def offops_windows() -> list[dict]:
    """:data:`MULTI_OFFOPS`' windows as :func:`cases` gives them (``s12r1-`` cases), each rank's Python frames those
    among its ops (``py_frames`` less ``py_off``); [] without the file."""
    import lzma

    if not MULTI_OFFOPS.is_file():
        return []
    out = []
    for j in json.loads(lzma.decompress(MULTI_OFFOPS.read_bytes()))["jobs"]:
        ranks = [{**r, "py_frames": max(0.0, (r.get("py_frames") or 0.0) - (r.get("py_off") or 0.0))}
                 for r in j["ranks"]]
        out.append({**j, "case": f"s12r1-{j['case']}", "group": f"s12r1-{j['group']}", "ranks": ranks,
                    "unprof": {int(r): v for r, v in j["unprof"].items()}, "files": [], "multi": True,
                    "stackset": True, "validation": not j.get("with_stack") or "input_rank" in j["case"]})
    return out


def stack_features(path: Path) -> dict:
    """The stack probe's features as the device wrote them (``features.json[.xz]``: :func:`multi_features`' format,
    with ``with_stack`` / ``profile_memory`` from each window's sidecar) as :data:`MULTI_STACK` holds them: each case
    and group prefixed with the round, so that no window shares a name or a group with :data:`MULTI`'s."""
    import lzma

    raw = path.read_bytes()
    d = json.loads(lzma.decompress(raw) if path.suffix == ".xz" else raw)
    rnd = path.parent.name if path.parent.name.startswith("s") else "stack"
    drop = ("file", "bytes_gz", "mem_events_all", "extra_error", "traced_min_us", "traced_max_us", "ops_all",
            "short_ops", "launches", "ops_with_kernel", "shown_us", "cupti_events", "cupti_us")  # not read here
    jobs = [{**{k: v for k, v in j.items() if k != "unprof_host"}, "case": f"{rnd}-{j['case']}",
             "group": f"{rnd}-{j['group']}", "ranks": [{k: v for k, v in r.items() if k not in drop} for r in j["ranks"]]}
            for j in d["jobs"]]
    if MULTI_STACK.is_file():  # another round's windows stay (one round's replaced)
        import lzma as _lz

        old = json.loads(_lz.decompress(MULTI_STACK.read_bytes()))["jobs"]
        jobs += [j for j in old if not j["case"].startswith(f"{rnd}-")]
    return {"how": "stack probe windows (recorded/profiler_overhead/multi/stack/): each rank's features and its "
                   "kit.capture unprofiled samples (us)", "jobs": sorted(jobs, key=lambda j: j["case"])}


def probe_windows(root: Path, features) -> list[dict]:
    """The probe's windows under ``root`` (``<hw>x<world>/<job>/<k>-<arm>/``: each rank's trace and kit.capture
    sidecar, and the job's ``meta.json``) as :data:`MULTI` holds them: per window the case as :func:`cases` gives one
    (the unprofiled samples per rank from the sidecar; the profiler settings from it) with each rank's features
    (``features(path)``: :func:`rank_features`, or what a device run computed; None leaves the rank out; ``group``:
    the job on that machine, left out whole when one of its windows is judged)."""
    jobs = []
    for meta_p in sorted(root.glob("*x*/*/meta.json")):
        meta, hw = json.loads(meta_p.read_text()), meta_p.parent.parent.name
        for w in sorted(p for p in meta_p.parent.iterdir() if p.is_dir()):
            ranks, unprof, host, cap = [], {}, {}, {}
            for f in sorted(w.glob("trace_rank*.json.gz")):
                cap = json.loads((w / f.name.replace("trace_", "capture_").replace(".json.gz", ".json")).read_text())
                unprof[cap["rank"]], host[cap["rank"]] = cap["unprofiled_step_us"], cap.get("unprofiled_host_us")
                feat = features(f)
                if feat is not None:
                    ranks.append({k: round(v, 3) if isinstance(v, float) else v for k, v in feat.items()})
            if ranks:
                jobs.append({"case": f"{hw}/{meta['job']}/{w.name}", "group": f"{hw}/{meta['job']}",
                             "device": meta["device"], "family": meta["case"]["model"],
                             "parallel": meta["case"]["parallel"], "profiler": "kit.capture",
                             "world_size": meta["world_size"], "record_shapes": cap.get("record_shapes"),
                             "with_stack": bool(cap.get("with_stack")),
                             **({"profile_memory": cap["profile_memory"]} if "profile_memory" in cap else {}),
                             "host_cpu": meta.get("host_cpu"), "unprof": unprof, "unprof_host": host, "ranks": ranks})
    return jobs


def window_features(f) -> tuple[dict | None, str | None]:
    """One probe trace's :func:`rank_features` for a device features.py (``recorded/profiler_overhead/multi/stack/``,
    ``offops/``), or None and why (an exception's text; ``no steps``)."""
    try:
        feat = rank_features(str(f))
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"
    return (None, "no steps") if feat is None else (feat, None)


def features_main(one, how: str, argv: list[str] | None = None, order=None) -> None:
    """A device features.py's main (``ROOT OUT.json [procs] [seconds]``): ``one(path) -> (path, features or None, error
    or None, seconds)`` over the probe's traces under ROOT (``*x*/*/*/trace_rank*.json.gz``, sorted by ``order``, a key,
    else by name) in a pool of ``procs`` processes until ``seconds`` have passed, then its windows
    (:func:`probe_windows`) written to OUT.json with ``how``."""
    import os
    import time
    from multiprocessing import Pool

    argv = sys.argv[1:] if argv is None else argv
    root, out = Path(argv[0]), Path(argv[1])
    procs = int(argv[2]) if len(argv) > 2 else os.cpu_count()
    deadline = time.time() + (float(argv[3]) if len(argv) > 3 else 1e9)
    files = sorted(root.glob("*x*/*/*/trace_rank*.json.gz"), key=order)
    print(f"features: {len(files)} traces, {procs} procs", flush=True)
    t0 = time.time()
    got = {}
    p = Pool(procs)
    it = p.imap_unordered(one, files)
    for _ in files:
        try:
            f, feat, err, dt = it.next(timeout=max(0.1, deadline - time.time()))
        except Exception as e:  # noqa: BLE001  (the deadline)
            print(f"features: stopped at the deadline with {len(got)} of {len(files)} ({type(e).__name__})", flush=True)
            break
        got[f] = feat
        print(f"  {Path(f).relative_to(root)} {dt:.1f} s {err or ''}", flush=True)
    p.terminate()
    jobs = probe_windows(root, lambda f: got.get(str(f)))
    out.write_text(json.dumps({"how": how, "jobs": jobs}))
    print(f"features: {len(jobs)} windows in {time.time() - t0:.0f} s -> {out}", flush=True)


def multi_features(root: Path) -> dict:
    """The probe's output as :data:`MULTI` holds it (:func:`probe_windows`, each rank's :func:`rank_features`)."""
    jobs = probe_windows(root, lambda f: rank_features(str(f)))
    return {"how": "tests/corpus/overhead_eval.py --multi-from: recorded/profiler_overhead/multi/probe.py's windows, "
                   "each rank's features (rank_features) and its kit.capture unprofiled samples (us)",
            "jobs": jobs}


PER_STEP = ("traced_us", "traced_min_us", "traced_max_us", "gpu_compute_us", "ops", "runtime", "ops_all", "launches",
            "kernels", "ops_with_kernel", "cupti_events", "cupti_us")
"""a rank's features that a trace of several steps in one window (no step annotations) holds per window"""


def rank_features(path: str) -> dict | None:
    """What one rank's trace shows per step (module docstring); None without step windows."""
    import numpy as np

    from kit import traces
    from kit.doctor.host_model import PROFILER_EVENTS, names_str
    from kit.doctor.overhead import LAUNCH_CALLS, _counts, _events, _exposed, _per_step, _settings, _shown_us, _view

    v = _view(path)
    ps = _per_step(v)
    if ps is None or v.trace.gpu.empty:
        return None
    ev = _events(v, ps)
    ops, rt, _ = _counts(ev)
    a, b = float(ps["ts"].min()), float(ps["end"].max())
    n = ev["n"]
    cpu_all = traces.load_trace(path, cpu="all").cpu
    names, cats = names_str(cpu_all["name"]).to_numpy(), names_str(cpu_all["cat"]).to_numpy()
    ts, dur = cpu_all["ts"].to_numpy(float), cpu_all["dur"].to_numpy(float)
    inside = (ts >= a) & (ts < b)
    is_op, is_rt = cats == "cpu_op", np.isin(cats, ["cuda_runtime", "cuda_driver"])
    launch = is_rt & np.isin(names, LAUNCH_CALLS)
    # leaf ops: nothing recorded inside them on their thread
    leaf = np.zeros(len(ts), bool)
    tids = cpu_all["tid"].to_numpy()
    for tid in np.unique(tids):
        i = np.flatnonzero(tids == tid)
        i = i[np.argsort(ts[i], kind="stable")]
        nxt = np.r_[ts[i][1:], np.inf]
        leaf[i] = nxt >= ts[i] + dur[i]
    cheap = is_op & inside & np.isin(names, CHEAP_OPS) & leaf
    ext = cpu_all["external_id"].to_numpy() if "external_id" in cpu_all else np.full(len(ts), np.nan)
    with_kernel = len({x for x in ext[launch & inside] if x == x})
    gpu = v.trace.gpu
    gk = gpu[(gpu["ts"] >= a) & (gpu["ts"] < b)]
    prof = np.isin(names, PROFILER_EVENTS) & inside
    shapes, stack, _ = _settings(v, None)
    rank = v.trace.info.rank
    return {
        "file": Path(path).name, "rank": rank, "steps": int(n),
        "traced_us": float(ps["dur"].median()), "traced_min_us": float(ps["dur"].min()),
        "traced_max_us": float(ps["dur"].max()), "gpu_compute_us": float(ps["gpu_compute_us"].median()),
        "ops": ops, "runtime": rt, "ops_all": float((is_op & inside).sum()) / n,
        "short_ops": ev["short"], "launches": float((launch & inside).sum()) / n, "kernels": len(gk) / n,
        "ops_with_kernel": with_kernel / n, "shown_us": _shown_us(ps),
        "cupti_events": float(prof.sum()) / n, "cupti_us": float(dur[prof].sum()) / n,
        "launch_us": ev["launch_us"],
        "cheap_us": float(np.median(dur[cheap])) if cheap.any() else None,
        "trace_record_shapes": shapes, "trace_with_stack": stack,
        "exposed": [round(_exposed(v, ps, ev, c, 0.0)[0], 1) for c in GRID],
    }


def collect(cache: Path | None) -> list[dict]:
    """:func:`cases` with each rank's :func:`rank_features` (read from / written to ``cache``, keyed by file)."""
    memo = json.loads(cache.read_text()) if cache and cache.is_file() else {}
    out = []
    for c in cases():
        if c.get("ranks"):  # the multi set: features kept, traces not committed
            out.append(c)
            continue
        ranks = []
        for f in c["files"]:
            key = str(Path(f).relative_to(ROOT))
            if key not in memo:
                memo[key] = rank_features(f)
                if cache:
                    cache.write_text(json.dumps(memo))
            if memo[key] is not None:
                k = c.get("per_window", 1)  # per step where one window holds k steps
                ranks.append({**memo[key], **{f: memo[key][f] / k for f in PER_STEP},
                              "exposed": [x / k for x in memo[key]["exposed"]]})
        if ranks:
            out.append({**c, "ranks": ranks})
    return out


# ------------------------------------------------------------------------------------------------ the truth
def at(curve: list[float], c: float) -> float:
    """A rank's exposure curve at uniform per-op price ``c`` (linear between grid points, flat past the grid)."""
    if c <= 0:
        return curve[0]
    if c >= GRID[-1]:
        return curve[-1]
    i = next(k for k, g in enumerate(GRID) if g >= c)
    f = (c - GRID[i - 1]) / (GRID[i] - GRID[i - 1])
    return curve[i - 1] + f * (curve[i] - curve[i - 1])


def measured(job: dict) -> None:
    """Per rank: traced step (median of its windows) less its unprofiled median, and the spread (against the
    unprofiled p10-p90); the job's: the median over ranks. Written into ``job``."""
    un = job["unprof"]
    for r in job["ranks"]:
        s = un.get(r["rank"]) or un.get(None) or [x for v in un.values() for x in v]
        q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
        r["unprof_us"] = statistics.median(s)
        r["overhead_us"] = r["traced_us"] - r["unprof_us"]
        r["overhead_lo_us"], r["overhead_hi_us"] = r["traced_us"] - q[-1], r["traced_us"] - q[0]
    job["overhead_us"] = statistics.median(r["overhead_us"] for r in job["ranks"])
    job["overhead_lo_us"] = statistics.median(r["overhead_lo_us"] for r in job["ranks"])
    job["overhead_hi_us"] = statistics.median(r["overhead_hi_us"] for r in job["ranks"])
    job["unprof_us"] = statistics.median(r["unprof_us"] for r in job["ranks"])
    job["traced_us"] = statistics.median(r["traced_us"] for r in job["ranks"])
    gpu = max(r["gpu_compute_us"] for r in job["ranks"])
    job["gpu_bound"] = job["unprof_us"] < GPU_BOUND * gpu
    job["gpu"] = "H200" if "H200" in job["device"] else "H100" if "H100" in job["device"] else job["device"]
    traced = [r["traced_us"] for r in job["ranks"]]
    job["why_not"] = ("no step annotations: its windows are not steps" if job["profiler"] == "no_steps" else
                      "GPU-bound without the profiler" if job["gpu_bound"] else
                      "under 1 ms measured" if job["overhead_us"] < 1000.0 else
                      "its ranks' traced windows disagree (> 1.5x): a window is not one step" if max(traced) > 1.5 *
                      min(traced) else
                      "its traced steps vary more than the overhead (p10-p90 spread above the measured overhead)"
                      if job["overhead_hi_us"] - job["overhead_lo_us"] > job["overhead_us"] else None)
    job["scored"] = job["why_not"] is None


def estimate(job: dict, prices: list[float]) -> float:
    """The job's estimated overhead for per-rank recorded-event prices (us per step): through each rank's exposure
    curve at the equivalent uniform per-op price, the largest over its ranks."""
    return max(at(r["exposed"], p / r["ops"] if r["ops"] else 0.0) for r, p in zip(job["ranks"], prices))


def implied(job: dict) -> tuple[float | None, dict | None]:
    """The uniform per-op price at which the job's estimate meets its measured overhead, and the rank that sets the
    pace there; (None, None) where no price does (a GPU-bound job; a measured overhead above all the GPU idle the
    replay can remove) or nothing was measured."""
    ovh = job["overhead_us"]
    if not job["scored"]:
        return None, None
    curve = [max(r["exposed"][i] for r in job["ranks"]) for i in range(len(GRID))]
    if curve[-1] < ovh:
        return None, None
    if curve[0] >= ovh:
        c = 0.0
    else:
        i = next(k for k in range(1, len(GRID)) if curve[k] >= ovh)
        lo, hi = curve[i - 1], curve[i]
        c = GRID[i - 1] + (ovh - lo) / (hi - lo) * (GRID[i] - GRID[i - 1]) if hi > lo else GRID[i]
    pace = max(job["ranks"], key=lambda r: at(r["exposed"], c))
    return c, pace


# ------------------------------------------------------------------------------------------------ the models
BEFORE = "f4ca961"
"""the commit whose tables (recorded/profiler_overhead/, the H100 jobs table among them) are "today" here"""


@functools.lru_cache(maxsize=1)
def _before() -> str:
    """:data:`BEFORE`'s tables, unpacked into a temporary folder; without that commit (a shallow clone, a tarball)
    this tree's loop tables, said on stderr."""
    import shutil

    d = tempfile.mkdtemp(prefix="overhead_eval_")
    try:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "recorded/profiler_overhead"],
                             capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", d], input=tar, check=True)
    except (OSError, subprocess.CalledProcessError):
        shutil.rmtree(d, ignore_errors=True)
        print(f"overhead_eval: commit {BEFORE} is not in this checkout: 'today' is this tree's loop tables, without "
              f"the retired H100 jobs table", file=sys.stderr)
        return str(ROOT / "recorded" / "profiler_overhead")
    return str(Path(d) / "recorded" / "profiler_overhead")


def today(job: dict, r: dict, loo: bool = False) -> float:
    """The price before the scaled one (kit.doctor.overhead.pick on :data:`BEFORE`'s tables); ``loo``: a jobs
    table's per-op price is the median of its other jobs' (the job left out of the table it is priced with)."""
    from kit.doctor.overhead import pick

    t, row = pick(job["device"], True, bool(r["trace_record_shapes"] if job["record_shapes"] is None
                                            else job["record_shapes"]),
                  bool(r["trace_with_stack"] if job["with_stack"] is None else job["with_stack"]), job["world_size"] > 1,
                  _before())
    if row is None:
        return 0.0
    c_op = row["us_per_op"]
    if loo and t.get("kind") == "jobs":
        c_op = statistics.median(p["us_per_op"] for p in t["points"] if p.get("us_per_op") and p["case"] != job["case"])
    return r["ops"] * max(0.0, c_op) + r["runtime"] * max(0.0, row["us_per_runtime"])


def _nnls(rows: list[list[float]], y: list[float]) -> list[float]:
    """Non-negative least squares on the relative error (each row divided by its target)."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.array(rows, float) / np.array(y, float)[:, None]
    return list(nnls(a, np.ones(len(y)))[0])


def _settings_key(job: dict, r: dict) -> tuple:
    s = r["trace_record_shapes"] if job["record_shapes"] is None else job["record_shapes"]
    k = r["trace_with_stack"] if job["with_stack"] is None else job["with_stack"]
    return bool(s), bool(k)


def _settings_dist_key(job: dict, r: dict) -> tuple:
    """:func:`_settings_key`, a trace without shapes or with stacks split by the kind of job (a rank of a
    multi-process job or not: ``kit.doctor.overhead.pick_scaled``'s ``distributed`` row; the stack row is fitted on
    multi-process jobs alone, so a one-GPU trace with stacks is not priced by it)."""
    s, k = _settings_key(job, r)
    return (s, k) if s and not k else (s, k, job["world_size"] > 1)


def linear(features):
    """A model P = sum_k p_k x_k(rank), fitted by nnls on the pace ranks of the training jobs."""
    def fit(train: list[dict]):
        rows, y = [], []
        for j in train:
            rows.append(features(j, j["pace"]))
            y.append(j["c_star"] * j["pace"]["ops"])
        p = _nnls(rows, y)
        return p, lambda job, r: float(sum(a * x for a, x in zip(p, features(job, r))))
    return fit


def per_op_median(key=None):
    """One price per op (the median of the training jobs' implied prices), per group ``key(job, rank)`` where the
    group has training jobs, else over all of them."""
    def fit(train: list[dict]):
        allc = statistics.median(j["c_star"] for j in train)
        groups = {}
        for j in train:
            groups.setdefault(key(j, j["pace"]) if key else None, []).append(j["c_star"])
        med = {g: statistics.median(v) for g, v in groups.items()}
        params = med if key else [allc]
        return params, lambda job, r: r["ops"] * med.get(key(job, r) if key else None, allc)
    return fit


def scaled(reading: str, key=None):
    """One price per op proportional to a host reading the trace carries (``reading``: us), k = median of the
    training jobs' implied price over their pace rank's reading (per group ``key(job, rank)`` where the group has
    training jobs, else over all of them)."""
    def fit(train: list[dict]):
        ks = [j["c_star"] / j["pace"][reading] for j in train if j["pace"].get(reading)]
        k_all = statistics.median(ks)
        groups = {}
        for j in train:
            if j["pace"].get(reading):
                groups.setdefault(key(j, j["pace"]) if key else None, []).append(j["c_star"] / j["pace"][reading])
        ks = {g: statistics.median(v) for g, v in groups.items()}
        typical = statistics.median(j["pace"][reading] for j in train if j["pace"].get(reading))

        def price(job, r):  # a rank without the reading (no such call: a CUDA graph) at the job's, else the typical
            mine = [x[reading] for x in job["ranks"] if x.get(reading)]
            k = ks.get(key(job, r) if key else None, k_all)
            return r["ops"] * k * (r.get(reading) or (statistics.median(mine) if mine else typical))
        return ({str(g): round(v, 4) for g, v in ks.items()} if key else [k_all]), price
    return fit


def committed(train: list[dict]):
    """The doctor's table as committed (``recorded/profiler_overhead/jobs-launch.json``, as ``kit.doctor.overhead.
    pick_scaled`` takes it), not refitted: what a job the table was never fitted on is priced at today; a rank without
    a launch reading at its job's median one, a setting without a row by :func:`today`."""
    from kit.doctor.overhead import pick_scaled

    def price(job, r):
        shapes, stack = _settings_key(job, r)
        _, row = pick_scaled(True, shapes, stack, distributed=job["world_size"] > 1)
        mine = [x["launch_us"] for x in job["ranks"] if x.get("launch_us")]
        reading = r.get("launch_us") or (statistics.median(mine) if mine else None)
        if row is None or not reading:
            return today(job, r)
        frame = float(row.get("us_per_frame_per_launch_us") or 0.0) * frames_x(r)
        return r["ops"] * (float(row["us_per_op_per_launch_us"]) + frame) * reading
    return "recorded/profiler_overhead/jobs-launch.json as committed", price


MODELS = {
    "today": None,
    "committed": committed,
    "per-op": per_op_median(),
    "op+rt+kernel": linear(lambda j, r: [r["ops"], r["runtime"], r["kernels"]]),
    "per-settings": per_op_median(_settings_key),
    "x launch_us": scaled("launch_us"),
    "x launch/settings": scaled("launch_us", _settings_key),
    "x launch/settings+dist": scaled("launch_us", _settings_dist_key),
    "x cheap_us": scaled("cheap_us"),
    "cupti only": lambda train: ([], lambda job, r: 0.0),
}
"""name -> fit(training jobs) -> (parameters, price(job, rank) -> recorded-event host time per step, us)"""
MULTI_MODELS = ("x launch/settings+dist",)
"""the models fitted on the multi set's no-shapes windows too (the others never see them: for them the multi set is
validation)"""


# ------------------------------------------------------------------------------------------------ the judging
def _run(job: dict):
    """One recording's key: copies of one run (a case with its steps removed) share their unprofiled timing; the
    windows of one multi-process job share its ``group``."""
    return job.get("group") or round(job["unprof_us"], 1)


def judge(jobs: list[dict]) -> dict:
    """Every model's estimate of every scored job, leave one job out and across GPU models and families: name ->
    {scheme -> {case -> estimate us}}; and the fit on every determined job with its residuals."""
    fitted = [j for j in jobs if j.get("c_star") is not None and not j.get("validation")]
    out = {}
    for name, fit in MODELS.items():
        res = {"lojo": {}, "gpu": {}, "family": {}}
        if fit is not None and name not in MULTI_MODELS:
            fit = (lambda f: lambda train: f([x for x in train if not x.get("multi")]))(fit)
        if fit is None:
            for j in jobs:
                est = estimate(j, [today(j, r) for r in j["ranks"]])
                for k in res:
                    res[k][j["case"]] = est
                res["lojo"][j["case"]] = estimate(j, [today(j, r, loo=True) for r in j["ranks"]])
            out[name] = {"schemes": res, "params": "recorded/profiler_overhead/*.json as kit.doctor.overhead.pick "
                                                     "takes them", "residuals": {}}
            continue
        for j in jobs:
            train = [x for x in fitted if _run(x) != _run(j)]
            _, price = fit(train)
            res["lojo"][j["case"]] = estimate(j, [price(j, r) for r in j["ranks"]])
            for scheme, attr in (("gpu", "gpu"), ("family", "family")):
                other = [x for x in train if x[attr] != j[attr]]
                if other:
                    _, price = fit(other)
                    res[scheme][j["case"]] = estimate(j, [price(j, r) for r in j["ranks"]])
        params, price = fit(fitted)
        out[name] = {"schemes": res, "params": params,
                     "residuals": {j["case"]: estimate(j, [price(j, r) for r in j["ranks"]]) / j["overhead_us"]
                                   for j in fitted if name in MULTI_MODELS or not j.get("multi")}}
    return out


def summary(jobs: list[dict], est: dict[str, float], keep=lambda j: True) -> str:
    """n, median |log2 ratio|, within 0.5-2x, the worst ratios, over the scored jobs ``keep`` selects."""
    rs = sorted(est[j["case"]] / j["overhead_us"] for j in jobs if j["scored"] and keep(j) and j["case"] in est)
    if not rs:
        return "-"
    err = statistics.median(abs(math.log2(r)) if r > 0 else 10.0 for r in rs)
    inside = sum(0.5 <= r <= 2.0 for r in rs)
    return f"{inside}/{len(rs)} in 0.5-2x, median |log2| {err:.2f}, {rs[0]:.2f}-{rs[-1]:.2f}x"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, help="keep each trace's features here (a JSON; recomputed when absent)")
    ap.add_argument("--out", type=Path, help=f"write the {CHOSEN!r} model fitted on every determined job here "
                                             "(recorded/profiler_overhead/jobs-launch.json)")
    ap.add_argument("--multi-from", type=Path, help=f"read the multi-process probe's output here first and write "
                                                    f"its features to {MULTI.relative_to(ROOT)}")
    ap.add_argument("--stack-from", type=Path, help=f"read the stack probe's features.json[.xz] first and write them to "
                                                    f"{MULTI_STACK.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if a.stack_from:
        got = stack_features(a.stack_from)
        lines = [f' "{k}": ' + (json.dumps(v) if k != "jobs" else "[\n  " + ",\n  ".join(json.dumps(x) for x in v)
                                + "\n ]") for k, v in got.items()]
        import lzma

        MULTI_STACK.write_bytes(lzma.compress(("{\n" + ",\n".join(lines) + "\n}\n").encode(),
                                              preset=9 | lzma.PRESET_EXTREME))
    if a.multi_from:
        got = multi_features(a.multi_from)
        if not got["jobs"]:
            print(f"overhead_eval: no probe window with a trace under {a.multi_from}", file=sys.stderr)
            return 2
        lines = [f' "{k}": ' + (json.dumps(v) if k != "jobs" else "[\n  " + ",\n  ".join(json.dumps(x) for x in v)
                                + "\n ]") for k, v in got.items()]
        MULTI.write_bytes(gzip.compress(("{\n" + ",\n".join(lines) + "\n}\n").encode(), mtime=0))
    jobs = collect(a.cache)
    if not jobs:
        print("overhead_eval: no job with a measured overhead", file=sys.stderr)
        return 2
    for j in jobs:
        measured(j)
        j["c_star"], j["pace"] = implied(j)
    got = judge(jobs)
    names = list(MODELS)
    print("Per job (ms): measured overhead = median over ranks of traced step - unprofiled median [against the "
          "unprofiled p90..p10]; c* = the uniform per-op price (us) at which the replayed estimate meets it; each "
          "model's estimate leave-one-job-out (today's: the tables as they are)\n")
    head = f"{'case':46s} {'gpu':4s} {'fam':3s} {'ops':>5s} {'rt':>4s} {'krn':>4s} {'lnch':>4s} {'chp':>4s} " \
           f"{'measured':>18s} {'c*':>5s} " + " ".join(f"{n[:10]:>10s}" for n in names)
    print(head)
    for j in jobs:
        p = j["pace"] or max(j["ranks"], key=lambda r: r["ops"])
        cells = " ".join(f"{got[n]['schemes']['lojo'].get(j['case'], float('nan')) / 1e3:10.2f}" for n in names)
        c = f"{j['c_star']:5.2f}" if j["c_star"] is not None else ("  gpu" if j["gpu_bound"] else "    -")
        print(f"{j['case'][:46]:46s} {j['gpu']:4s} {j['family'][:3]:3s} {p['ops']:5.0f} {p['runtime']:4.0f} "
              f"{p['kernels']:4.0f} {p['launch_us'] or 0:4.1f} {p['cheap_us'] or 0:4.2f} "
              f"{j['overhead_us'] / 1e3:6.2f} [{j['overhead_lo_us'] / 1e3:5.2f}..{j['overhead_hi_us'] / 1e3:5.2f}] "
              f"{c} {cells}{'' if j['scored'] else '   (not scored: ' + j['why_not'] + ')'}")
    fit = lambda j: not j.get("validation") and not j.get("multi")  # noqa: E731
    groups = {"all": fit, "H100": lambda j: fit(j) and j["gpu"] == "H100",
              "H200": lambda j: fit(j) and j["gpu"] == "H200", "cnn": lambda j: fit(j) and j["family"] == "cnn",
              "gpt": lambda j: fit(j) and j["family"] == "gpt",
              "validation": lambda j: j.get("validation") and not j.get("multi"),
              "multi no-shapes": lambda j: j.get("multi") and not j["record_shapes"],
              "multi shapes": lambda j: j.get("multi") and j["record_shapes"] and not j.get("with_stack"),
              "multi stack": lambda j: j.get("multi") and j.get("with_stack") and not j.get("profile_memory"),
              "multi stack+memory": lambda j: j.get("multi") and j.get("with_stack") and j.get("profile_memory"),
              "stack held out": lambda j: j.get("stackset") and j.get("with_stack")
              and j["case"].startswith(STACK_HELD_OUT)}
    for g in sorted({j["gpu"] for j in jobs if j.get("multi")}):  # each host's windows apart
        groups[f"multi no-shapes {g}"] = lambda j, g=g: j.get("multi") and not j["record_shapes"] and j["gpu"] == g
        groups[f"multi shapes {g}"] = lambda j, g=g: (j.get("multi") and j["record_shapes"] and not j.get("with_stack")
                                                      and j["gpu"] == g)
    n_scored = sum(j["scored"] for j in jobs if fit(j))
    print(f"\nScored jobs (measured overhead >= 1 ms, not GPU-bound): {n_scored}, and the collective_tracing runs as "
          f"validation (never fitted on: the models fitted on every other job); the multi-process windows "
          f"(recorded/profiler_overhead/multi): their no-shapes ones fitted only by {', '.join(MULTI_MODELS)}, their "
          f"shapes ones and those of {', '.join(h.rstrip('/') for h in MULTI_HELD_OUT)} never; estimate / measured:")
    for scheme, what in (("lojo", "leave one job out"), ("gpu", "fitted on the other GPU model's jobs"),
                         ("family", "fitted on the other model family's jobs")):
        print(f"\n  {what}:")
        for n in names:
            est = got[n]["schemes"][scheme]
            print(f"    {n:22s} " + " | ".join(f"{g} {summary(jobs, est, k)}" for g, k in groups.items()))
    print("\nFits on every job whose price is determined (parameters; residual = estimate / measured):")
    for n in names:
        r = got[n]["residuals"]
        params = got[n]["params"]
        ptxt = params if isinstance(params, str) else json.dumps(params if isinstance(params, list) else
                                                                 {str(k): v for k, v in params.items()})
        print(f"  {n}: {ptxt}")
        if r:
            print("    " + ", ".join(f"{c.split('/')[-1]} {v:.2f}" for c, v in r.items()))
    other = "x launch/settings+dist" if CHOSEN == "x launch/settings" else "x launch/settings"
    print(f"\nHeld out, today's tables and the committed table (not refitted) against {CHOSEN!r} (ms; estimate / "
          f"measured; last column {other!r} one job out):")
    print(f"  {'case':46s} {'measured':>8s} {'today':>13s} {'committed':>13s} {'one job out':>13s} {'other GPU':>13s} "
          f"{'other family':>13s} {other[9:22]:>13s}")
    for j in jobs:
        if not j["scored"] and "control-tb" not in j["case"]:
            continue
        m = j["overhead_us"]
        cells = [got[n]["schemes"]["lojo"].get(j["case"]) for n in ("today", "committed")] \
            + [got[CHOSEN]["schemes"][k].get(j["case"]) for k in ("lojo", "gpu", "family")] \
            + [got[other]["schemes"]["lojo"].get(j["case"])]
        print(f"  {j['case'][:46]:46s} {m / 1e3:8.2f} " + " ".join(
            f"{x / 1e3:6.2f} ({x / m:4.2f})" if x is not None else f"{'-':>13s}" for x in cells)
            + ("" if j["scored"] else f"  (not scored: {j['why_not']})"))
    print(f"\nThe {CHOSEN!r} model's factor per row (us per op per us of launch), fitted on every determined job: the "
          f"median of their implied factors; how far one job moves it (each left out in turn) and the median's "
          f"bootstrap 5-95% ({BOOT} resamples, seed 0):")
    for key, ks in _row_factors(jobs).items():
        loo = [statistics.median(ks[:i] + ks[i + 1:]) for i in range(len(ks))] if len(ks) > 1 else ks
        rnd = random.Random(0)
        boot = sorted(statistics.median(rnd.choices(ks, k=len(ks))) for _ in range(BOOT))
        print(f"  record_shapes={key[0]} with_stack={key[1]}" + (f" distributed={key[2]}" if len(key) > 2 else "")
              + f": {statistics.median(ks):.4f} over {len(ks)} jobs (their factors {min(ks):.2f}-{max(ks):.2f}); one "
              f"job out {min(loo):.4f}-{max(loo):.4f}; bootstrap {boot[BOOT // 20]:.3f}-{boot[BOOT - BOOT // 20]:.3f}")
    stack_pairs(jobs)
    if a.out:
        a.out.write_text(table(jobs) + "\n")
    return 0


def _arm(j: dict) -> str:
    return "stack+memory" if j.get("profile_memory") else "stack" if j.get("with_stack") else "shapes"


def stack_pairs(jobs: list[dict]) -> None:
    """The stack probe's windows (:data:`MULTI_STACK`) paired within each job: per arm the median over its windows of
    the measured overhead and of the implied factor (c* over the pace rank's median launch); the ratios stack /
    shapes and stack+memory / stack, per job and their median."""
    by: dict[str, dict[str, list[dict]]] = {}
    for j in jobs:
        if j.get("stackset"):
            by.setdefault(j["group"], {}).setdefault(_arm(j), []).append(j)
    if not by:
        return
    print("\nThe stack probe paired within each job (ms measured overhead, median over the arm's windows; factor = "
          "c* / launch_us of the pace rank; ops per step of rank 0; launch_us):")
    ratios: dict[str, list[float]] = {"stack/shapes": [], "stack+memory/stack": [], "f stack/shapes": [],
                                      "f stack+memory/stack": [], "launch stack/shapes": []}
    for g, arms in sorted(by.items()):
        med = {a: statistics.median(x["overhead_us"] for x in v) for a, v in arms.items()}
        fac = {a: statistics.median(x["c_star"] / x["pace"]["launch_us"] for x in v) for a, v in arms.items()
               if all(x.get("c_star") is not None and x["pace"].get("launch_us") for x in v)}
        lau = {a: statistics.median(statistics.median(r["launch_us"] for r in x["ranks"] if r.get("launch_us"))
                                    for x in v) for a, v in arms.items()}
        ops = {a: statistics.median(x["ranks"][0]["ops"] for x in v) for a, v in arms.items()}
        print(f"  {g:46s} " + " | ".join(f"{a} {med[a] / 1e3:6.2f} ms f {fac.get(a, float('nan')):.3f} "
                                          f"ops {ops[a]:.0f} launch {lau[a]:.2f}"
                                          + ("" if all(x["scored"] for x in arms[a]) else " (not all scored)")
                                          for a in ("shapes", "stack", "stack+memory") if a in arms))
        for num, den in (("stack", "shapes"), ("stack+memory", "stack")):
            if num in med and den in med and med[den] > 0:
                ratios[f"{num}/{den}"].append(med[num] / med[den])
            if num in fac and den in fac and fac[den] > 0:
                ratios[f"f {num}/{den}"].append(fac[num] / fac[den])
        if "stack" in lau and "shapes" in lau:
            ratios["launch stack/shapes"].append(lau["stack"] / lau["shapes"])
    for k, v in ratios.items():
        if v:
            print(f"  {k}: median {statistics.median(v):.2f} over {len(v)} jobs ({min(v):.2f}-{max(v):.2f})")
    frames_per_op(jobs)


def frames_per_op(jobs: list[dict]) -> None:
    """Not the doctor's model (printed to judge it): the stack windows' price as a per-op part plus a part per
    recorded Python frame, factor = a + b x (frames per op of the pace rank, ``py_frames``), least squares, judged
    leave one job out against the one factor (the row) -- with every window and without the timed-stall ones
    (``stall_rank``: its ~20 ms loop of ``json.dumps`` records thousands of frames that a timed loop does not pay)."""
    import numpy as np

    st = [j for j in jobs if j.get("stackset") and j.get("with_stack") and j["scored"] and j["c_star"] is not None]
    if len(st) < 4:
        return

    def x_of(r):
        return (r.get("py_frames") or 0.0) / max(1.0, r["ops"])

    def fit(train, two):
        f = np.array([j["c_star"] / j["pace"]["launch_us"] for j in train])
        if not two:
            return float(np.median(f)), 0.0
        a, b = np.linalg.lstsq(np.c_[np.ones(len(train)), [x_of(j["pace"]) for j in train]], f, rcond=None)[0]
        return (float(a), float(b)) if b > 0 else (float(np.mean(f)), 0.0)  # no frame makes the host faster

    print("\n  Python frames as a second term (factor = a + b x frames per op; one job out):")
    for excl in (False, True):
        use = [j for j in st if not (excl and "stall_rank" in j["case"])]
        for two in (False, True):
            rs = []
            for j in use:
                a, b = fit([x for x in use if x["group"] != j["group"]], two)
                mine = [r["launch_us"] for r in j["ranks"] if r.get("launch_us")]
                rs.append(estimate(j, [r["ops"] * (a + b * x_of(r)) * (r.get("launch_us") or statistics.median(mine))
                                       for r in j["ranks"]]) / j["overhead_us"])
            a, b = fit(use, two)
            print(f"    {'a + b x' if two else 'one factor':10s} {'without stall_rank' if excl else 'every window':18s} "
                  f"a {a:.3f} b {b:.3f}: {len(rs)} windows, {sum(0.5 <= r <= 2 for r in rs)} in 0.5-2x, median "
                  f"|log2| {statistics.median(abs(math.log2(r)) for r in rs):.3f}, {min(rs):.2f}-{max(rs):.2f}x")


BOOT = 10000
"""bootstrap resamples of a row's median factor (its spread, printed)"""


CHOSEN = "x launch/settings+dist"
"""the model kit.doctor.overhead prices with (``pick_scaled``): the best held out (FINDINGS.md)"""


def _fitted(jobs: list[dict]) -> list[dict]:
    """The jobs :data:`CHOSEN`'s table is fitted on: every determined job with a launch reading, not validation."""
    return [j for j in jobs if j.get("c_star") is not None and j["pace"].get("launch_us") and not j.get("validation")
            and (CHOSEN in MULTI_MODELS or not j.get("multi"))]


def _row_factors(jobs: list[dict]) -> dict[tuple, list[float]]:
    """Per row of :data:`CHOSEN`'s table (its settings key), the fitted jobs' implied factors (per-op price over the
    pace rank's median kernel launch): the row is their median."""
    key_of = _settings_dist_key if CHOSEN in MULTI_MODELS else _settings_key
    fitted = _fitted(jobs)
    return {key: [j["c_star"] / j["pace"]["launch_us"] for j in fitted if key_of(j, j["pace"]) == key]
            for key in sorted({key_of(j, j["pace"]) for j in fitted}, key=str)}


FRAME_FIT_OUT = ("stall_rank",)
"""windows the with_stack row's frame term is not fitted on: ``stall_rank``'s deadline loop of ``json.dumps`` records
thousands of Python frames without an op, which a loop timed to 20 ms does not pay for -- the doctor leaves such
frames out (``TraceInfo.python_frames_off_ops``); the device's features counted them (``py_frames``)"""


def frames_x(r: dict) -> float:
    """A rank's Python frames per recorded op in its steps (the stack probe's ``py_frames``; 0 without)."""
    return (r.get("py_frames") or 0.0) / max(1.0, r["ops"])


def frame_fit(train: list[dict]) -> tuple[float, float, list[dict]]:
    """The with_stack row's price per op per us of launch as a + b x Python frames per op (least squares on the
    implied factors of ``train`` less :data:`FRAME_FIT_OUT`; b >= 0), and the windows it was fitted on."""
    import numpy as np

    use = [j for j in train if not any(k in j["case"] for k in FRAME_FIT_OUT)]
    f = np.array([j["c_star"] / j["pace"]["launch_us"] for j in use])
    a, b = np.linalg.lstsq(np.c_[np.ones(len(use)), [frames_x(j["pace"]) for j in use]], f, rcond=None)[0]
    return (float(a), float(b), use) if b > 0 else (float(np.mean(f)), 0.0, use)


def off_frame_factor(p: dict) -> float:
    """One point's implied price per Python frame off the ops per us of launch (:data:`OFF_FRAMES`): its measured
    overhead less what its ops are priced at, over its frames off the ops and its launch reading."""
    return (p["overhead_us"] - p["ops_overhead_us"]) / (p["off_frames"] * p["launch_us"])


def off_frame_fit(points: list[dict] | None = None) -> float | None:
    """The with_stack row's ``us_per_off_frame_per_launch_us``: the median :func:`off_frame_factor` over the fitted
    points of :data:`OFF_FRAMES` (or ``points``); None without one. A frame off the ops (a builtin call of a
    pure-Python loop: ``ord``, ``list.append``) costs the tracer far less than the frames among the ops, whose term
    (``us_per_frame_per_launch_us``, :func:`frame_fit`) also carries what comes with them (module calls, their ops'
    shapes)."""
    if points is None:
        if not OFF_FRAMES.is_file():
            return None
        points = json.loads(OFF_FRAMES.read_text())["points"]
    use = [off_frame_factor(p) for p in points if p.get("fitted", True)]
    return statistics.median(use) if use else None


def table(jobs: list[dict]) -> str:
    """:data:`CHOSEN` fitted on every job whose price is determined, as the table kit.doctor.overhead reads: per
    profiler setting, the per-op price per microsecond of the trace's median kernel launch (runtime calls folded in),
    with the jobs it was fitted on (each job's implied price, reading and residual)."""
    fitted = _fitted(jobs)
    rows = [{"cuda": True, "record_shapes": key[0], "with_stack": key[1], **({"distributed": key[2]} if len(key) > 2
                                                                            else {}),
             "us_per_op_per_launch_us": round(statistics.median(ks), 4), "us_per_runtime": 0.0, "cases": len(ks)}
            for key, ks in _row_factors(jobs).items()]
    _, price = MODELS[CHOSEN](fitted)
    stack = {}
    for row in rows:  # the with_stack row: a + b x Python frames per op (frame_fit)
        if row["with_stack"]:
            mine = [j for j in fitted if _settings_dist_key(j, j["pace"]) == (row["record_shapes"], True,
                                                                              row.get("distributed"))]
            a, b, use = frame_fit(mine)
            row.update(us_per_op_per_launch_us=round(a, 4), us_per_frame_per_launch_us=round(b, 4), cases=len(use))
            off = off_frame_fit()
            if off is not None:
                row["us_per_off_frame_per_launch_us"] = round(off, 4)
            stack.update({j["case"]: (a, b) for j in mine})

    def priced(j):
        if j["case"] not in stack:
            return [price(j, r) for r in j["ranks"]]
        a, b = stack[j["case"]]
        mine = [r["launch_us"] for r in j["ranks"] if r.get("launch_us")]
        return [r["ops"] * (a + b * frames_x(r)) * (r.get("launch_us") or statistics.median(mine)) for r in j["ranks"]]
    points = [{"case": j["case"], "gpu": j["gpu"], "family": j["family"], "world_size": j["world_size"],
               "record_shapes": _settings_key(j, j["pace"])[0], "with_stack": _settings_key(j, j["pace"])[1],
               "overhead_us": round(j["overhead_us"], 1), "us_per_op": round(j["c_star"], 3),
               "launch_us": round(j["pace"]["launch_us"], 3),
               **({"frames_per_op": round(frames_x(j["pace"]), 3),
                   "fitted": not any(k in j["case"] for k in FRAME_FIT_OUT)} if j["case"] in stack else {}),
               "residual": round(estimate(j, priced(j)) / j["overhead_us"], 2)}
              for j in fitted]
    t = {"kind": "jobs-launch", "machine": {"device": None, "gpus": sorted({j["device"] for j in fitted})},
         "settings": rows, "points": points,
         "how": "tests/corpus/overhead_eval.py --out: per setting, the median over the determined jobs of the implied "
                "uniform per-op price over the pace rank's median kernel-launch length"}
    lines = [f' "{k}": ' + (json.dumps(v) if not isinstance(v, list) else
                            "[\n  " + ",\n  ".join(json.dumps(x) for x in v) + "\n ]") for k, v in t.items()]
    return "{\n" + ",\n".join(lines) + "\n}"  # one row, one point per line


if __name__ == "__main__":
    sys.exit(main())
