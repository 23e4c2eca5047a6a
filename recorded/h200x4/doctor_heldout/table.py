"""The held-out round's verdicts: per case the truth, the doctor's top finding, its cost as traced and as stated
(net of the profiler) and the ratio to the unprofiled added time -- ``tests/corpus/verdicts.py``'s row and table,
read from ``kit doctor --json`` output (one run of the doctor per case serves the table and the pass check) -- and
whether the case passes the criteria fixed before recording (``/work/team/ROUND10-held16.txt``, issue 39's
done-when): a fault first, on its ranks, its stated cost 0.5-2x the added time; a control with no single-rank
finding >= 10% of its unprofiled step and no input/sync/allocator/stall finding >= 5%.

    python table.py import RESULTS DIR [--name NAME]   # a round's results: slim truths + the machine's doctor JSON
    python table.py doctor DIR --kit ROOT --traces TRACES --name NAME [--full FULL]
    python table.py table DIR --doctor NAME [NAME ...] [--match TEXT] [--input-bound-ok] [--unmeasured-unscored]
    python table.py bundle DIR                   # every case's files into DIR/bundle.json.gz (the tree's size)

``import``: every ``RESULTS/<tag>/<run>/<case>/truth.json`` into ``DIR/<tag>/<run>/<case>/truth.json.gz`` without each
rank's samples (their summaries stay; the job's samples, the control arm's and the per-round differences stay: the
whole file is in the round's results), and the machine's ``RESULTS/doctor/<tag>/<run>/<case>.json`` (the doctor
of the snapshot on the whole traces) as ``doctor-23f7b9c-whole.json.gz``, slim (:func:`slim`). ``doctor``: ``kit
doctor --json --no-cache`` of the checkout at ROOT on each case's traces under ``TRACES/<tag>/<run>/<case>/``
(``trainer-*.json`` or ``.json.xz``, unpacked under their own names; ``tensorboard_trace_handler``'s
``*.pt.trace.json.gz`` as they are), slim into ``NAME.json.gz``, whole into FULL.
``table``: verdicts.py's table per doctor NAME, then the pass check per case.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "corpus"))
import verdicts  # noqa: E402

CONTROL_RULES = ("input_bound", "host_sync", "allocator_churn", "host_stall", "pageable_h2d")
"""input, sync, allocator and stall findings: a control passes with none of them at >= 5% of its step"""


def _load(p: Path) -> dict:
    return json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())


def row(truth: dict, doc: dict) -> dict:
    """verdicts.verdict's row from the doctor's JSON instead of its objects."""
    ovs = list(doc.get("profiler_overhead", {}).values())
    top = doc["findings"][0] if doc["findings"] else None
    net = top["cost_us_per_step"] if top else 0.0
    cost = float(top["evidence"].get("cost_traced_us_per_step", net)) if top else 0.0
    added = truth.get("added_us")
    traced = [o["traced_step_us"] for o in ovs if o.get("traced_step_us")]
    return {"case": truth["case"], "fault": truth["fault"], "variant": truth.get("variant"),
            "expected": truth["expected_rule"], "expected_ranks": truth.get("expected_ranks"), "added_us": added,
            "added_over_rounds": truth.get("added_us_over_rounds"),
            "unprofiled_us": truth["step_us_unprofiled"]["median"],
            "traced_us": statistics.median(traced) if traced else None,
            "overhead_us": statistics.median([o["profiler_overhead_us"] for o in ovs]) if ovs else 0.0,
            "overhead_basis": sorted({o["basis"] for o in ovs}),
            "top": top["rule"] if top else None, "top_ranks": list(top["ranks"]) if top else [],
            "cost_us": cost, "net_us": net,
            "ratio": (cost / added) if added else None, "net_ratio": (net / added) if added else None,
            "others": [(f["rule"], round(f["cost_us_per_step"])) for f in doc["findings"][1:4]],
            "ok": (top is not None and top["rule"] == truth["expected_rule"]) if truth["expected_rule"] else None}


MIN_SEQUENTIAL_ADDED_US = 500.0
"""session 12's criteria: a fault whose added time is measured sequentially (no rounds) below this is no measurable
fault (``unmeasured``)"""


def unmeasured(truth: dict) -> str | None:
    """Session 12's criteria (``recorded/h200x4/doctor_heldout_s12/TRUTH.md``, written before recording): why a fault
    case is not scored as its fault -- its added time over the rounds not above 0 (the interval's low end <= 0), or,
    measured sequentially, under :data:`MIN_SEQUENTIAL_ADDED_US` or under its control's p10-p90 spread; else None.
    Such a case is scored by the control criteria instead (REVIEW_S12 L7: a finding that says a fault there is the
    same miss as on a control)."""
    if not truth["expected_rule"]:
        return None
    added, over = truth.get("added_us"), truth.get("added_us_over_rounds")
    if added is None:
        return "no added time"
    if over:
        return None if over["low"] > 0 else f"no fault measured (rounds' interval {over['low'] / 1e3:+.2f}.." \
                                             f"{over['high'] / 1e3:+.2f} ms)"
    spread = truth.get("control_spread_us")
    if added < MIN_SEQUENTIAL_ADDED_US or (spread is not None and added < spread):
        return f"no measurable fault (+{added / 1e3:.2f} ms, measured in turn" + (
            f"; the control's p10-p90 {spread / 1e3:.2f} ms)" if spread is not None else ")")
    return None


def check(truth: dict, doc: dict, r: dict, input_bound_ok: bool = False) -> tuple[bool, str]:
    """The pass criteria, and why. ``input_bound_ok`` (session 11's criteria): an input straggler passes with a
    one-rank ``input_bound`` on its rank first too (the right rank and cause), not a job-level one."""
    step = truth["step_us_unprofiled"]["median"]
    if truth["expected_rule"]:
        want = truth.get("expected_ranks")
        alt = input_bound_ok and truth["fault"] == "input_rank" and r["top"] == "input_bound"
        if r["top"] != truth["expected_rule"] and not alt:
            return False, f"first: {r['top']} {r['top_ranks']}, not {truth['expected_rule']}"
        if want and r["top_ranks"] != want:
            return False, f"{r['top']} names {r['top_ranks']}, the fault is on {want}"
        if r["net_ratio"] is None or not 0.5 <= r["net_ratio"] <= 2.0:
            return False, f"stated cost {r['net_us'] / 1e3:.2f} ms = {r['net_ratio']:.2f}x the added time"
        return True, f"first, {r['net_ratio']:.2f}x"
    bad = []
    for f in doc["findings"]:
        share = f["cost_us_per_step"] / step
        if len(f["ranks"]) == 1 and share >= 0.10:
            bad.append(f"{f['rule']} {f['ranks']} {share:.0%} (single rank >= 10%)")
        elif f["rule"] in CONTROL_RULES and share >= 0.05:
            bad.append(f"{f['rule']} {f['ranks']} {share:.0%} (>= 5%)")
    return (not bad), ("; ".join(bad) or "clean by the criteria")


def cases(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/*/*/truth.json.gz"))


BUNDLE = "bundle.json.gz"
"""every case's files of a directory in one gzip (``bundle``: one stream compresses the repeated keys and sentences
of 26 cases 3.5x better than a file each -- the tree's size limit)"""


def do_bundle(root: Path) -> None:
    """Pack every ``<tag>/<run>/<case>/*.json.gz`` of ``root`` into ``root/bundle.json.gz`` (keyed by the case's
    path, then the file's name less ``.json.gz``; merged into a bundle already there) and remove them."""
    out = _load(root / BUNDLE) if (root / BUNDLE).is_file() else {}
    files = sorted(root.glob("*/*/*/*.json.gz"))
    for p in files:
        out.setdefault(str(p.parent.relative_to(root)), {})[p.name[:-len(".json.gz")]] = _load(p)
    (root / BUNDLE).write_bytes(gzip.compress(json.dumps(out, sort_keys=True, separators=(",", ":")).encode(), 9,
                                              mtime=0))
    for p in files:
        p.unlink()
    for d in sorted({p.parent for p in files}, key=lambda d: -len(d.parts)):
        for x in (d, d.parent, d.parent.parent):
            if x != root and x.is_dir() and not any(x.iterdir()):
                x.rmdir()


def _cases_files(root: Path, packed: dict | None):
    """(relative case path, {file name less .json.gz: content}) per case, from the bundle or the case folders."""
    if packed is not None:
        for k in sorted(packed):
            yield Path(k), packed[k]
        return
    for case in cases(root):
        files = {p.name[:-len(".json.gz")]: _load(p) for p in case.glob("*.json.gz")}
        files.update({p.name[:-len(".json")]: _load(p) for p in case.glob("*.json")})
        yield case.relative_to(root), files


def run_doctor(traces: Path, kit_root: Path) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for p in sorted([*traces.glob("trainer-*.json*"), *traces.glob("*.pt.trace.json*")]):
            name = p.name[:-3] if p.name.endswith(".xz") else p.name
            (Path(tmp) / name).write_bytes(lzma.decompress(p.read_bytes()) if p.name.endswith(".xz")
                                           else p.read_bytes())
            files.append(str(Path(tmp) / name))
        if not files:
            return None
        env = {**os.environ, "PYTHONPATH": str(kit_root)}
        r = subprocess.run([sys.executable, "-m", "kit", "doctor", "--json", "--no-cache", "--workers", "2", *files],
                           capture_output=True, text=True, env=env, cwd=kit_root)
        if not r.stdout.strip():
            print(f"{traces}: kit doctor exit {r.returncode}: {r.stderr[-500:]}", file=sys.stderr)
            return None
        doc = json.loads(r.stdout)
        doc["traces"] = [Path(t).name for t in doc.get("traces", [])]
        for f in doc.get("failed", []):
            f["trace"] = Path(f["trace"]).name
        return doc


def slim(doc: dict) -> dict:
    """What the table and a reader need of ``kit doctor --json``: each finding's rule, ranks, cost, sentence and the
    evidence that says how it was costed; the profiler's overhead per rank without its long basis text."""
    keep = ("cost_traced_us_per_step", "basis", "cost_basis", "reason", "share_of_step", "job_level")
    return {"findings": [{"rule": f["rule"], "severity": f.get("severity"), "ranks": f["ranks"],
                          "cost_us_per_step": round(f["cost_us_per_step"], 1), "summary": f.get("summary"),
                          "evidence": {k: f["evidence"][k] for k in keep if k in f.get("evidence", {})}}
                         for f in doc["findings"]],
            "profiler_overhead": {r: {k: v for k, v in o.items() if k != "how"}
                                  for r, o in doc.get("profiler_overhead", {}).items()},
            **{k: doc.get(k) for k in ("step_us", "steps", "world_size", "ranks", "devices", "failed")},
            "skipped": [s["rule"] for s in doc.get("skipped", [])]}


def _write(p: Path, doc: dict) -> None:
    p.write_bytes(gzip.compress((json.dumps(doc, indent=0) + "\n").encode(), 9, mtime=0))


def do_import(results: Path, dest: Path, name: str = "doctor-23f7b9c-whole") -> None:
    for t in sorted(results.glob("*/*/*/truth.json")):
        rel = t.parent.relative_to(results)
        truth = json.loads(t.read_text())
        ctl = t.parent.parent / truth["control"] / "truth.json"
        if truth.get("added_us") is not None and not truth.get("paired_control") and ctl.is_file():
            c = json.loads(ctl.read_text())["step_us_unprofiled"]  # measured in turn: the control's spread beside it
            truth["control_spread_us"] = round(c["p90"] - c["p10"], 1)
        s = truth["step_us_unprofiled"]
        s["per_rank"] = [{k: r[k] for k in ("median", "p10", "p90")} for r in s["per_rank"]]
        truth["slim"] = "each rank's samples and host periods left out: the whole truth.json is in the round's results"
        (dest / rel).mkdir(parents=True, exist_ok=True)
        _write(dest / rel / "truth.json.gz", truth)
        d = results / "doctor" / f"{rel}.json"
        if d.is_file() and d.stat().st_size:
            _write(dest / rel / f"{name}.json.gz", slim(json.loads(d.read_text())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("import")
    i.add_argument("results", type=Path)
    i.add_argument("dir", type=Path)
    i.add_argument("--name", default="doctor-23f7b9c-whole", help="the machine's doctor JSON under this name")
    d = sub.add_parser("doctor")
    d.add_argument("dir", type=Path)
    d.add_argument("--kit", type=Path, required=True)
    d.add_argument("--traces", type=Path, required=True)
    d.add_argument("--name", required=True)
    d.add_argument("--full", type=Path, help="the doctor's whole JSON here, per case")
    b = sub.add_parser("bundle")
    b.add_argument("dir", type=Path)
    t = sub.add_parser("table")
    t.add_argument("dir", type=Path)
    t.add_argument("--doctor", nargs="+", default=["doctor-23f7b9c-whole"])
    t.add_argument("--match", default="", help="only the cases whose tag holds this text (a round's: -s11r2)")
    t.add_argument("--input-bound-ok", action="store_true", help="session 11's criteria: an input straggler passes "
                   "with a one-rank input_bound on its rank first too")
    t.add_argument("--unmeasured-unscored", action="store_true", help="session 12's criteria: a fault case whose "
                   "added time was not measured above 0 (unmeasured) is scored by the control criteria")
    a = ap.parse_args(argv)
    if a.cmd == "import":
        do_import(a.results, a.dir, a.name)
        return 0
    if a.cmd == "doctor":
        for case in cases(a.dir):
            rel = case.relative_to(a.dir)
            doc = run_doctor(a.traces / rel, a.kit)
            if doc is None:
                print(f"{rel}: no result", file=sys.stderr)
                continue
            _write(case / f"{a.name}.json.gz", slim(doc))
            if a.full:
                (a.full / rel).parent.mkdir(parents=True, exist_ok=True)
                (a.full / f"{rel}.json").write_text(json.dumps(doc) + "\n")
        return 0
    if a.cmd == "bundle":
        do_bundle(a.dir)
        return 0
    packed = _load(a.dir / BUNDLE) if (a.dir / BUNDLE).is_file() else None
    for name in a.doctor:
        rows, checks = [], []
        for rel, files in _cases_files(a.dir, packed):
            if a.match not in rel.parts[0]:
                continue
            if name not in files:
                continue
            truth, doc = files["truth"], files[name]
            r = row(truth, doc)
            r["case"] = f"{rel.parts[0]} {rel.parts[1]}/{truth['case']}" + (" (cut)" if truth.get("trimmed") else "")
            rows.append(r)
            skip = unmeasured(truth) if a.unmeasured_unscored else None
            if skip:  # no fault measured: a control for the score
                ok, why = check({**truth, "expected_rule": None}, doc, r)
                why = f"{skip}: as a control, {why}"
            else:
                ok, why = check(truth, doc, r, a.input_bound_ok)
            checks.append(f"| {r['case']} | {'pass' if ok else '**miss**'} | {why} |")
        print(f"#### {name}\n\n" + verdicts.markdown(rows))
        print(f"{sum(c.count('| pass |') for c in checks)} of {len(checks)} pass.\n\n| case | criteria | why |\n"
              "|---|---|---|\n" + "\n".join(checks) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
