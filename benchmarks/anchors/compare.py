"""Run the anchor tools side by side on PyTorch profiler trace jobs and print what each one concludes.

The anchors are third-party tools. They are imported only when this script runs, from a separate venv that
is not the kit's (see benchmarks/anchors/RESULTS.md for how it was set up):

- traceinsight (HolisticTraceAnalysis, ``hta``): ``get_temporal_breakdown`` (idle / compute / non-compute per
  rank) and ``get_idle_time_breakdown`` (host wait / kernel wait / other, per stream, summed here per rank);
- torch-tb-profiler: ``RunLoader`` gives the overview's average step-time breakdown and its recommendations;
- TraceLens: ``TreePerfAnalyzer.get_df_gpu_timeline`` per rank, and on multi-rank jobs with collectives
  ``NcclAnalyser.build_df_straggler_summary``.

On jobs of more than one rank also traceinsight's ``get_comm_comp_overlap`` (the share of communication time
that overlaps computation, per rank) and torch-tb-profiler's distributed view (per worker, averaged over steps:
computation, overlapping, communication and other time; communication split into data transfer and
synchronizing, i.e. waiting for peers). ``--kit-python PY`` fills the last column with ``kit doctor --json
--workers 1`` run by that interpreter (the kit's own venv) on the same files: its first findings with their cost
per step (net of the profiler's overhead where it states so, and as traced) and the ranks they name.

A job is a directory whose ``*.json``/``*.json.gz`` files holding ``traceEvents`` are its ranks, a single
trace file, or a quoted glob of its rank files (for a folder that holds several jobs). Usage::

    .scratch/anchors/venv/bin/python benchmarks/anchors/compare.py JOB [JOB ...] \
        [--json all.json] [--temporal-json tests/data/anchors/traceinsight_temporal.json] \
        [--kit-python .venv/bin/python] [--last-step]

``--last-step`` prints traceinsight's ``include_last_profiler_step=True`` results: on a trace of one profiled step
(the committed corpus cuts) its default drops that step's kernels. A tool that fails on a job gets
``failed: <error line>`` in its column; the others still run. Exit codes: 0 on success, 2 if a job has no trace file.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------- jobs

def _head(path: Path, size: int = 1 << 20) -> bytes:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read(size)


def trace_files(job: Path) -> list[Path]:
    """The trace files of a job: the file itself, the directory's JSON files that hold traceEvents, or a glob's."""
    if any(c in str(job) for c in "*?["):
        return sorted(p for p in map(Path, glob.glob(str(job))) if p.is_file())
    if job.is_file():
        return [job]
    out = []
    for p in sorted(job.iterdir()):
        if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")):
            if b'"traceEvents"' in _head(p):
                out.append(p)
    return out


def rank_of(path: Path, index: int) -> int:
    """distributedInfo.rank when the header has it, else a number in the name (rank3, rank-3, worker3), else index."""
    m = re.search(rb'"distributedInfo"\s*:\s*\{[^}]*?"rank"\s*:\s*(\d+)', _head(path, 1 << 16))
    if m:
        return int(m.group(1))
    m = re.search(r"(?:rank|worker)[-_]?(\d+)", path.name)
    return int(m.group(1)) if m else index


def ranks_of(files: list[Path]) -> dict[int, Path]:
    ranks = {}
    for i, p in enumerate(files):
        r = rank_of(p, i)
        if r in ranks:  # two files claim one rank (e.g. two spans of one worker): keep them apart by index
            r = max(ranks) + 1
        ranks[r] = p
    return dict(sorted(ranks.items()))


def _err(exc: BaseException) -> str:
    """The exception's first line; for a bare assert, the asserting source line and where it is."""
    line = (str(exc).strip().splitlines() or [""])[0]
    if not line and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        line = f"{frame.line} ({Path(frame.filename).name}:{frame.lineno})"
    return f"failed: {type(exc).__name__}: {line[:200]}"


@contextlib.contextmanager
def _quiet():
    """The anchors print progress and warnings to stdout/stderr; keep them out of the table."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


# -------------------------------------------------------------------------------------------- traceinsight

def run_traceinsight(ranks: dict[int, Path]) -> dict:
    from importlib.metadata import version

    from hta.trace_analysis import TraceAnalysis

    out: dict = {"version": version("traceinsight")}
    files = {r: str(p.resolve()) for r, p in ranks.items()}
    # default: traceinsight drops the last ProfilerStep (include_last_profiler_step=False); "all_steps" keeps it
    for label, include_last in (("default", False), ("all_steps", True)):
        try:
            with _quiet():
                ta = TraceAnalysis(trace_files=files, include_last_profiler_step=include_last)
                tb = ta.get_temporal_breakdown(visualize=False)
        except Exception as exc:  # noqa: BLE001 -- an anchor's failure is a result to report
            out[label] = {"error": _err(exc)}
            continue
        per_rank = {}
        for row in tb.to_dict("records"):
            r = int(row["rank"])
            df = ta.t.traces[r]
            k = df[df["stream"].ne(-1)]
            span = float(row["kernel_time(us)"])
            per_rank[str(r)] = {
                "idle_share": round(float(row["idle_time(us)"]) / span, 6) if span else None,
                "compute_share": round(float(row["compute_time(us)"]) / span, 6) if span else None,
                "non_compute_share": round(float(row["non_compute_time(us)"]) / span, 6) if span else None,
                "idle_us": float(row["idle_time(us)"]),
                "span_us": span,
                "span_start_ts": float(k["ts"].min() + ta.t.min_ts) if len(k) else None,
                "span_end_ts": float((k["ts"] + k["dur"]).max() + ta.t.min_ts) if len(k) else None,
                "gpu_events": int(len(k)),
            }
        res: dict = {"temporal": per_rank}
        # both variants get the idle breakdown and the overlap: a one-step cut is read with its last step kept
        res["idle_breakdown"] = _idle_breakdown(ta, list(per_rank))
        if len(files) > 1:
            try:
                with _quiet():
                    ov = ta.get_comm_comp_overlap(visualize=False)
                res["comm_comp_overlap"] = {str(int(r["rank"])): round(float(r["comp_comm_overlap_pctg"]), 2)
                                            for r in ov.to_dict("records")}
            except Exception as exc:  # noqa: BLE001
                res["comm_comp_overlap"] = {"error": _err(exc)}
        out[label] = res
    return out


def _idle_breakdown(ta, ranks: list[str]) -> dict:
    """get_idle_time_breakdown per rank; the per-stream idle times summed per category, as shares of the sum."""
    out = {}
    for r in ranks:
        try:
            with _quiet():
                df, _ = ta.get_idle_time_breakdown(ranks=[int(r)], visualize=False)
        except Exception as exc:  # noqa: BLE001
            out[r] = {"error": _err(exc)}
            continue
        by_cat = df.groupby("idle_category")["idle_time"].sum()
        total = float(by_cat.sum())
        out[r] = {str(c): round(float(v) / total, 4) if total else None for c, v in by_cat.items()}
    return out


# ------------------------------------------------------------------------------------------------ tb_plugin

def run_tb_plugin(ranks: dict[int, Path]) -> dict:
    from importlib.metadata import version

    from torch_tb_profiler import io as tbio
    from torch_tb_profiler.profiler.loader import RunLoader

    out: dict = {"version": version("torch-tb-profiler"), "workers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        for r, p in ranks.items():  # RunLoader wants <worker>[.<span>].pt.trace.json[.gz] names
            suffix = ".pt.trace.json.gz" if p.name.endswith(".gz") else ".pt.trace.json"
            (run_dir / f"rank_{r}{suffix}").symlink_to(p.resolve())  # <node>_<pid>, as tb_plugin parses it
        cache_dir = Path(tmp) / "cache"
        cache_dir.mkdir()
        try:
            with _quiet():
                run = RunLoader("job", str(run_dir), tbio.Cache(str(cache_dir))).load()
        except Exception as exc:  # noqa: BLE001
            out["error"] = _err(exc)
            return out
        for r in ranks:
            prof = next((v for (w, _span), v in run.profiles.items() if w == f"rank_{r}"), None)
            if prof is None or getattr(prof, "overview", None) is None:
                out["workers"][str(r)] = {"error": "failed: no profile (the loader logged an exception)"}
                continue
            ov = prof.overview
            perf = ov["performance"][0]  # "Average Step Time" with its parts
            parts = {c["name"]: c["extra"] for c in perf.get("children", [])}
            recs = [re.sub(r"<[^>]+>", "", li).strip() for li in re.split(r"</li>", ov.get("recommendations", ""))]
            out["workers"][str(r)] = {
                "steps": len(ov["steps"]["rows"]),
                "avg_step_us": perf["value"],
                "breakdown_pct": parts,
                "recommendations": [li for li in recs if li],
            }
        dist = next((v for (w, _span), v in run.profiles.items() if w == "All"), None)
        if dist is not None and len(ranks) > 1:
            ov = (dist.steps_to_overlap or {}).get("data", {}).get("all", {})
            wt = (dist.steps_to_wait or {}).get("data", {}).get("all", {})
            out["distributed"] = {w.replace("rank_", ""): {
                "computation_us": v[0], "overlapping_us": v[1], "communication_us": v[2], "other_us": v[3],
                "transfer_us": (wt.get(w) or [None, None])[0], "synchronizing_us": (wt.get(w) or [None, None])[1]}
                for w, v in ov.items()}
    return out


# ------------------------------------------------------------------------------------------------- TraceLens

def _tracelens_commit() -> str | None:
    import TraceLens

    root = Path(TraceLens.__file__).resolve().parents[1]
    f = root / "COMMIT"
    return f.read_text().strip() if f.exists() else None


def run_tracelens(ranks: dict[int, Path]) -> dict:
    from TraceLens import NcclAnalyser, TreePerfAnalyzer

    out: dict = {"commit": _tracelens_commit(), "ranks": {}}
    for r, p in ranks.items():
        try:
            with _quiet():
                tl = TreePerfAnalyzer.from_file(str(p))
                df = tl.get_df_gpu_timeline()
            out["ranks"][str(r)] = {row["type"]: round(float(row["percent"]), 2) for row in df.to_dict("records")}
        except Exception as exc:  # noqa: BLE001
            out["ranks"][str(r)] = {"error": _err(exc)}
    if len(ranks) > 1:
        try:
            with _quiet():
                na = NcclAnalyser([str(p) for p in ranks.values()], len(ranks))
                st = na.build_df_straggler_summary()
            out["straggler"] = st.to_dict("records") if not st.empty else []
        except Exception as exc:  # noqa: BLE001
            out["straggler"] = {"error": _err(exc)}
    return out


# ------------------------------------------------------------------------------------------------- summary

def _range(vals, scale: float = 1.0, unit: str = "%", nd: int = 1) -> str:
    vals = [v * scale for v in vals if v is not None]
    if not vals:
        return "-"
    lo, hi = f"{min(vals):.{nd}f}", f"{max(vals):.{nd}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _traceinsight_cell(ti: dict, variant: str = "default") -> str:
    """``variant`` "default" (traceinsight's default, the last ProfilerStep dropped; if that fails, the cell says so
    and gives all steps) or "all_steps" (``include_last_profiler_step=True``, for traces of one step)."""
    if "error" in ti:
        return ti["error"]
    d = ti[variant]
    label = ""
    if variant == "all_steps" and "error" in d:
        return d["error"]
    if "error" in d:  # e.g. no ProfilerStep: the default keeps no kernel; say so, then give all steps
        label = f"default {d['error']}; with the last step: "
        d = ti["all_steps"]
        if "error" in d:
            return label + d["error"]
    t = d["temporal"].values()
    cell = (f"{label}idle {_range([v['idle_share'] for v in t], 100)}, "
            f"compute {_range([v['compute_share'] for v in t], 100)}, "
            f"non-compute {_range([v['non_compute_share'] for v in t], 100)}")
    ib = d.get("idle_breakdown", {})
    # a rank whose idle time sums to 0 has no shares (None): it has no idle to break down
    ok = [v for v in ib.values() if "error" not in v and any(x is not None for x in v.values())]
    cats = {c: [v.get(c, 0.0) for v in ok] for c in sorted({c for v in ok for c in v})}
    ordered = sorted(cats.items(), key=lambda kv: -max(kv[1]))
    shown = [f"{c} {_range(v, 100, nd=0)}" for c, v in ordered if max(v) >= 0.05]
    if shown:
        cell += "; of idle: " + ", ".join(shown)
    errs = [v["error"] for v in ib.values() if "error" in v]
    if errs:
        cell += f"; idle breakdown {errs[0]}"
    ov = d.get("comm_comp_overlap")
    if isinstance(ov, dict) and "error" in ov:
        cell += f"; comm/compute overlap {ov['error']}"
    elif ov:
        cell += f"; comm overlapped by compute {_range(list(ov.values()), nd=0)}"
    return cell


def _recommendations(workers: dict) -> str:
    """Each distinct recommendation once (its first two sentences); 'GPU n' of several workers merged into one."""
    texts: dict[str, list] = {}
    for r, w in workers.items():
        for rec in w["recommendations"]:
            two = " ".join(re.split(r"(?<=\.) ", rec)[:2])
            m = re.match(r"GPU (\d+) (.*)", two)
            key = f"GPU {{}} {m.group(2)}" if m else two
            texts.setdefault(key, []).append(m.group(1) if m else r)
    out = []
    for key, who in texts.items():
        who = ",".join(sorted(set(who), key=int))
        if "{}" in key:
            out.append(f'"{key.format(who)}"')
        else:
            out.append(f'"{key}"' if len(set(texts[key])) == len(workers) else f'"{key}" (ranks {who})')
    return " ".join(out) if out else "nothing"


def _tb_cell(tb: dict) -> str:
    if "error" in tb:
        return tb["error"]
    ws = tb["workers"]
    ok = {r: w for r, w in ws.items() if "error" not in w}
    bits = []
    if ok:
        parts = sorted({k for w in ok.values() for k in w["breakdown_pct"]},
                       key=lambda k: -max(w["breakdown_pct"].get(k, 0) for w in ok.values()))
        top = [k for k in parts if max(w["breakdown_pct"].get(k, 0) for w in ok.values()) >= 5][:4]
        bits.append(
            f"{_range([w['steps'] for w in ok.values()], unit=' steps', nd=0)}, "
            f"avg step {_range([w['avg_step_us'] for w in ok.values()], 1e-3, ' ms')}: "
            + ", ".join(f"{k} {_range([w['breakdown_pct'].get(k, 0) for w in ok.values()])}" for k in top))
        bits.append("recommends: " + _recommendations(ok))
    bad = [w["error"] for w in ws.values() if "error" in w]
    if bad:
        bits.append(f"{len(bad)}/{len(ws)} workers {bad[0]}")
    dist = tb.get("distributed")
    if dist:
        comm = {w: v["overlapping_us"] + v["communication_us"] for w, v in dist.items()}
        over = [v["overlapping_us"] / comm[w] if comm[w] else None for w, v in dist.items()]
        bits.append(f"distributed: communication {_range(list(comm.values()), 1e-3, ' ms')} per step, "
                    f"{_range(over, 100, nd=0)} of it overlapped; data transfer "
                    f"{_range([v['transfer_us'] for v in dist.values()], 1e-3, ' ms')}, synchronizing "
                    f"{_range([v['synchronizing_us'] for v in dist.values()], 1e-3, ' ms')}")
    return "; ".join(bits)


def _tracelens_cell(tl: dict) -> str:
    if "error" in tl:
        return tl["error"]
    ok = {r: v for r, v in tl["ranks"].items() if "error" not in v}
    bits = []
    if ok:
        def col(name):
            return _range([v.get(name) for v in ok.values()])
        bits.append(f"idle {col('idle_time')}, computation {col('computation_time')}, "
                    f"exposed comm {col('exposed_comm_time')}")
    bad = [v["error"] for v in tl["ranks"].values() if "error" in v]
    if bad:
        bits.append(f"{len(bad)}/{len(tl['ranks'])} ranks {bad[0]}")
    st = tl.get("straggler")
    if isinstance(st, dict):
        bits.append(f"straggler report {st['error']}")
    elif st:
        s0 = st[0]
        bits.append(f"straggler: rank {s0['rank']} (least total wait, {s0['total_wait_time_us']:.0f} us; "
                    f"last in {s0['pct_arrived_last']:.0f}% of {s0['num_collectives']} collectives)")
    elif st == []:
        bits.append("straggler report empty")
    return "; ".join(bits)


def _doctor_cell(doc: dict | None) -> str:
    """The doctor's first three findings at or above 'low': rule, cost per step (ms; net of the profiler's overhead
    where the doctor states it so, with the cost as traced beside it where they differ), ranks."""
    if not doc:
        return ""
    if "error" in doc:
        return doc["error"]
    shown = [f for f in doc["findings"] if f["severity"] != "info"][:3]
    if not shown:
        return "nothing at or above 'low'"
    given = set(doc.get("ranks") or [])

    def who(f):
        return "all" if len(given) > 1 and set(f["ranks"]) == given else ",".join(map(str, f["ranks"]))
    def cost(f):  # net of the profiler's overhead where the doctor states it so, then as traced where that differs
        net, traced = f"{f['cost_us_per_step'] / 1e3:.1f}", f.get("cost_traced_us_per_step")
        return f"{net} ms" if traced is None or f"{traced / 1e3:.1f}" == net else f"{net} ms ({traced / 1e3:.1f} traced)"
    return "; ".join(f"{'**' if i == 0 else ''}{f['rule']}{'**' if i == 0 else ''} {cost(f)} [{who(f)}]"
                     for i, f in enumerate(shown))


def run_doctor(job: Path, python: str, sweep: Path | None = None) -> dict:
    """``kit doctor --json --workers 1 [--sweep RUN]`` on the job's trace files, with the kit's own interpreter."""
    files = [str(p) for p in trace_files(job)]
    more = ["--sweep", str(sweep)] if sweep else []
    r = subprocess.run([python, "-m", "kit", "doctor", "--json", "--workers", "1", *more, *files], capture_output=True,
                       text=True, cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    try:
        d = json.loads(r.stdout)
    except ValueError:
        return {"error": f"failed (exit {r.returncode}): {(r.stderr.strip().splitlines() or [''])[-1][:200]}"}
    keep = ("rule", "cost_us_per_step", "ranks", "severity")
    return {"commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip(),
            "findings": [{**{k: f[k] for k in keep},
                          "cost_traced_us_per_step": (f.get("evidence") or {}).get("cost_traced_us_per_step")}
                         for f in d["findings"]], "ranks": d.get("ranks"),
            "step_us": d.get("step_us"), "notes": d.get("notes", []), "sweep": str(sweep) if sweep else None}


def summarize(res: dict, ti_variant: str = "default") -> dict[str, str]:
    """One short cell per tool, only what the tool computed (traceinsight's ``ti_variant``: see _traceinsight_cell)."""
    return {"traceinsight": _traceinsight_cell(res["traceinsight"], ti_variant),
            "tb_plugin": _tb_cell(res["tb_plugin"]),
            "tracelens": _tracelens_cell(res["tracelens"]), "doctor": _doctor_cell(res.get("doctor"))}


# -------------------------------------------------------------------------------------------------- main

def _tracked(paths: list[Path]) -> bool:
    try:
        rel = [str(p.resolve().relative_to(REPO)) for p in paths]
    except ValueError:
        return False
    r = subprocess.run(["git", "-C", str(REPO), "ls-files", "--error-unmatch", *rel],
                       capture_output=True, text=True)
    return r.returncode == 0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_job(job: Path, kit_python: str | None = None, sweep: Path | None = None, doctor_only: dict | None = None,
            ti_variant: str = "default") -> dict:
    ranks = ranks_of(trace_files(job))
    res = {"job": str(job), "ranks": {str(r): str(p) for r, p in ranks.items()},
           "sha256": {str(r): _sha256(p) for r, p in ranks.items()}}
    for name, fn in (("traceinsight", run_traceinsight), ("tb_plugin", run_tb_plugin), ("tracelens", run_tracelens)):
        if doctor_only is not None:  # the anchors' saved results, only the doctor run again
            res[name] = doctor_only[name]
            continue
        try:
            res[name] = fn(ranks)
        except Exception as exc:  # noqa: BLE001 -- an import error or an unguarded failure of that anchor
            res[name] = {"error": _err(exc)}
        print(f"  {job}: {name} done", file=sys.stderr, flush=True)
    if kit_python:
        res["doctor"] = run_doctor(job, kit_python, sweep)
    res["summary"] = summarize(res, ti_variant)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="*", type=Path)
    ap.add_argument("--from-json", type=Path, action="append", default=[],
                    help="print the table (and write --temporal-json) from results saved by --json; runs nothing")
    ap.add_argument("--json", type=Path, help="write every tool's full result here")
    ap.add_argument("--temporal-json", type=Path,
                    help="write traceinsight's temporal breakdown for the jobs whose files are committed")
    ap.add_argument("--kit-python", help="the kit's interpreter: fill the kit doctor column (kit doctor --json)")
    ap.add_argument("--sweep", type=Path, help="the machine's collectives sweep, passed to kit doctor --sweep")
    ap.add_argument("--last-step", action="store_true",
                    help="traceinsight's column with include_last_profiler_step=True (for one-step traces, whose "
                         "only step is the last one that its default drops)")
    ap.add_argument("--doctor-only", action="store_true",
                    help="with --from-json and --kit-python: run only kit doctor again on the saved jobs")
    args = ap.parse_args(argv)
    if not args.jobs and not args.from_json:
        ap.error("give a job or --from-json")
    for j in [*args.jobs, *args.from_json]:
        if not (j.exists() or glob.glob(str(j))) or (j in args.jobs and not trace_files(j)):
            print(f"compare.py: no such job or file, or no trace file in it: {j}", file=sys.stderr)
            return 2
    variant = "all_steps" if args.last_step else "default"
    results = [res for f in args.from_json for res in json.loads(f.read_text())]
    if args.doctor_only and args.kit_python:
        results = [run_job(Path(res["job"]), args.kit_python, args.sweep, doctor_only=res, ti_variant=variant)
                   for res in results]
    ti = "traceinsight (last step kept)" if args.last_step else "traceinsight"
    print(f"| case | {ti} | torch-tb-profiler | TraceLens | kit doctor |\n|---|---|---|---|---|")
    for res in results:
        _print_row(res, summarize(res, variant))
    for j in args.jobs:
        res = run_job(j, args.kit_python, args.sweep, ti_variant=variant)
        results.append(res)
        _print_row(res, res["summary"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.temporal_json:
        write_temporal(results, args.temporal_json)
    return 0


def _print_row(res: dict, s: dict) -> None:
    """A Markdown row: case (ranks) | traceinsight | tb_plugin | TraceLens | kit doctor (empty without
    ``--kit-python``)."""
    job = re.sub(r"^.*\.device/results/", "recorded: ", res["job"].replace(".scratch/public/", "public: "))
    n = len(res["ranks"])
    truth = Path(res["job"]) / "truth.json"  # a planted-fault corpus case says what was planted
    committed = REPO / "tests" / "data" / "doctor" / Path(res["job"]).parent.name / Path(res["job"]).name / "truth.json"
    if committed.is_file() and (not truth.is_file() or json.loads(committed.read_text()).get("recorded")
                                == json.loads(truth.read_text()).get("recorded")):
        truth = committed  # the committed copy of this recording's truth (with the time its fault added)
    planted = ""
    if truth.is_file():
        t = json.loads(truth.read_text())
        added = f", +{t['added_us'] / 1000:.1f} ms" if t.get("added_us") is not None else ""
        step = t["step_us_unprofiled"]["median"] / 1000
        exp = t.get("expected_rule")
        expect = f" -> {exp}" + (f" {t['expected_ranks']}" if t.get("expected_ranks") else "") if exp else ""
        planted = f"; planted: {t.get('variant') or t.get('fault')}{added}{expect}; step {step:.1f} ms"
    print(f"| `{job}` ({n} rank{'s' if n > 1 else ''}{planted}) | {s['traceinsight']} | {s['tb_plugin']} | "
          f"{s['tracelens']} | {s.get('doctor', '')} |", flush=True)


def write_temporal(results: list[dict], dest: Path) -> None:
    """traceinsight's per-rank shares for every job whose trace files are tracked by git, keyed by repo path."""
    from importlib.metadata import version

    old = json.loads(dest.read_text()) if dest.exists() else {}
    traces = old.get("traces", {})
    for res in results:
        files = [Path(p) for p in res["ranks"].values()]
        if not _tracked(files) or "error" in res["traceinsight"]:
            continue
        shas = res.get("sha256", {})
        if any(shas.get(r) not in (None, _sha256(Path(p))) for r, p in res["ranks"].items()):
            print(f"compare.py: {res['job']} changed since it was run; left out of {dest}", file=sys.stderr)
            continue
        ti = res["traceinsight"]
        job = res["job"] if "*" in res["job"] else str(Path(res["job"]).resolve().relative_to(REPO))
        for label in ("default", "all_steps"):
            for r, v in ti.get(label, {}).get("temporal", {}).items():
                rel = str(Path(res["ranks"][r]).resolve().relative_to(REPO))
                entry = traces.setdefault(rel, {"rank": int(r), "job": job})
                entry[label] = v
                if r in shas:
                    entry["sha256"] = shas[r]
            err = ti.get(label, {}).get("error")
            if err:
                for r, p in res["ranks"].items():
                    rel = str(Path(p).resolve().relative_to(REPO))
                    entry = traces.setdefault(rel, {"rank": int(r), "job": job})
                    entry[label] = {"error": err}
                    if r in shas:
                        entry["sha256"] = shas[r]
    doc = {
        "tool": "traceinsight",
        "version": version("traceinsight"),
        "what": ("TraceAnalysis(trace_files={rank: file}).get_temporal_breakdown(): shares of the span from the "
                 "first GPU kernel's start to the last one's end, over the kernels traceinsight keeps. 'default' "
                 "is include_last_profiler_step=False (traceinsight's default: kernels launched from the last "
                 "ProfilerStep on are dropped); 'all_steps' is include_last_profiler_step=True. span_start_ts/"
                 "span_end_ts are the trace's own ts (us) as traceinsight holds them (whole us), gpu_events the "
                 "GPU events (stream != -1) it kept; the ranks of one job are loaded together."),
        "traces": dict(sorted(traces.items())),
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
