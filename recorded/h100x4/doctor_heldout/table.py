"""The held-out round's verdicts: per case the truth, the doctor's top finding, its cost as traced and as stated
(net of the profiler) and the ratio to the unprofiled added time -- ``tests/corpus/verdicts.py``'s row and table,
read from ``kit doctor --json`` output (one run of the doctor per case serves the table and the pass check) -- and
whether the case passes the criteria fixed before recording (``/work/team/ROUND10-held16.txt``, issue 39's
done-when): a fault first, on its ranks, its stated cost 0.5-2x the added time; a control with no single-rank
finding >= 10% of its unprofiled step and no input/sync/allocator/stall finding >= 5%.

    python table.py DIR [--doctor NAME] [--run-doctor KIT_ROOT --traces TRACE_ROOT]

``DIR/<tag>/<run>/<case>/truth.json`` with the doctor's JSON at ``DIR/<tag>/<run>/<case>/NAME.json[.gz]``;
``--run-doctor`` first runs ``kit doctor --json --no-cache`` of the checkout at ``KIT_ROOT`` on each case's traces
under ``TRACE_ROOT/<tag>/<run>/<case>/`` (``trainer-*.json``, ``.json.xz`` unpacked to a temporary directory under
their own names) and writes NAME.json.gz.
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


def check(truth: dict, doc: dict, r: dict) -> tuple[bool, str]:
    """The pass criteria, and why."""
    step = truth["step_us_unprofiled"]["median"]
    if truth["expected_rule"]:
        want = truth.get("expected_ranks")
        if r["top"] != truth["expected_rule"]:
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
    return sorted({p.parent for p in root.glob("*/*/*/truth.json*")})


def run_doctor(case: Path, traces: Path, kit_root: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for p in sorted(traces.glob("trainer-*.json*")):
            name = p.name[:-3] if p.name.endswith(".xz") else p.name
            (Path(tmp) / name).write_bytes(lzma.decompress(p.read_bytes()) if p.name.endswith(".xz")
                                           else p.read_bytes())
            files.append(str(Path(tmp) / name))
        env = {**os.environ, "PYTHONPATH": str(kit_root)}
        r = subprocess.run([sys.executable, "-m", "kit", "doctor", "--json", "--no-cache", "--workers", "2", *files],
                           capture_output=True, text=True, env=env, cwd=kit_root)
        if not r.stdout.strip():
            print(f"{case}: kit doctor exit {r.returncode}: {r.stderr[-500:]}", file=sys.stderr)
            return
        doc = json.loads(r.stdout)
        doc["traces"] = [Path(t).name for t in doc.get("traces", [])]
        for f in doc.get("failed", []):
            f["trace"] = Path(f["trace"]).name
        out.write_bytes(gzip.compress((json.dumps(doc, separators=(",", ":")) + "\n").encode(), 9, mtime=0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--doctor", default="doctor-23f7b9c-whole", help="the doctor JSON's name in each case")
    ap.add_argument("--run-doctor", type=Path, help="a checkout whose kit doctor to run first")
    ap.add_argument("--traces", type=Path, help="with --run-doctor: where each case's traces are")
    a = ap.parse_args(argv)
    rows, checks = [], []
    for case in cases(a.dir):
        rel = case.relative_to(a.dir)
        if a.run_doctor:
            run_doctor(case, a.traces / rel, a.run_doctor, case / f"{a.doctor}.json.gz")
        src = next((p for p in (case / f"{a.doctor}.json.gz", case / f"{a.doctor}.json") if p.is_file()), None)
        if src is None:
            print(f"{rel}: no {a.doctor}", file=sys.stderr)
            continue
        truth = _load(next(p for p in (case / "truth.json", case / "truth.json.gz") if p.is_file()))
        doc = _load(src)
        r = row(truth, doc)
        r["case"] = f"{rel.parts[0]} {rel.parts[1]}/{truth['case']}"
        rows.append(r)
        ok, why = check(truth, doc, r)
        checks.append(f"| {r['case']} | {'pass' if ok else '**miss**'} | {why} |")
    print(verdicts.markdown(rows))
    print("| case | criteria | why |\n|---|---|---|\n" + "\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
