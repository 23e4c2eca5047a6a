"""What ``kit doctor`` says on each case of a planted-fault corpus, beside the truth: the planted fault and its
added time (unprofiled; for a pair recorded interleaved, with its interval over the rounds), the top finding, its
cost as traced and net of the profiler's own overhead as the doctor states it (net of the profiler's overhead for launch-bound costs: :mod:`kit.doctor.overhead`, measured
where kit.capture timed unprofiled steps, else estimated), and the profiler's overhead the doctor took off (traced vs
unprofiled step, median over ranks, each as the job pays it: :func:`kit.doctor.overhead.job_floor`).

    python tests/corpus/verdicts.py tests/data/doctor/corpus-h100x2 [--sweep RUN_DIR] [--markdown]

Exit status 0; 2 when the directory holds no case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _files(case: Path) -> list[Path]:
    return sorted(p for p in case.iterdir() if p.name.endswith((".json.gz", ".json"))
                  and p.name != "truth.json" and not p.name.startswith("capture_"))


def verdict(case: Path, sweep=None) -> dict:
    from kit.doctor import diagnose

    t = json.loads((case / "truth.json").read_text())
    files = _files(case)
    d = diagnose(files, workers=1, sweep=sweep)
    ovs = list(d.overhead.values())  # as the doctor took it off: a job steps at the pace of the rank losing most
    ov_us = statistics.median([o.overhead_us for o in ovs]) if ovs else 0.0
    traced = statistics.median([o.traced_step_us for o in ovs if o.traced_step_us]) if ovs else None
    top = d.problems[0] if d.problems else None
    net = top.cost_us_per_step if top else 0.0  # the doctor's cost: net of the profiler where it states so
    cost = float(top.evidence.get("cost_traced_us_per_step", net)) if top else 0.0
    added = t.get("added_us")
    return {"case": t["case"], "fault": t["fault"], "variant": t.get("variant"), "expected": t["expected_rule"],
            "expected_ranks": t.get("expected_ranks"), "added_us": added,
            "added_over_rounds": t.get("added_us_over_rounds"),
            "unprofiled_us": t["step_us_unprofiled"]["median"], "traced_us": traced,
            "overhead_us": ov_us, "overhead_basis": sorted({o.basis for o in ovs}),
            "top": top.rule if top else None, "top_ranks": list(top.ranks) if top else [],
            "cost_us": cost, "net_us": net,
            "ratio": (cost / added) if added else None, "net_ratio": (net / added) if added else None,
            "others": [(f.rule, round(f.cost_us_per_step)) for f in d.problems[1:4]],
            "ok": (top is not None and top.rule == t["expected_rule"]) if t["expected_rule"] else None}


def markdown(rows: list[dict]) -> str:
    out = ["| case | truth [ranks] | added ms | unprofiled / traced ms (overhead, basis) | top finding [ranks] | "
           "cost ms traced / stated | ratio traced / stated | next |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        truth = (r["expected"] or "none") + (f" {r['expected_ranks']}" if r["expected_ranks"] else "")
        added = "--" if r["added_us"] is None else f"{r['added_us'] / 1e3:+.2f}"
        if r.get("added_over_rounds"):  # a pair recorded interleaved: the interval over its rounds
            o = r["added_over_rounds"]
            added += f" ({o['low'] / 1e3:+.2f}..{o['high'] / 1e3:+.2f})"
        traced = "--" if r["traced_us"] is None else f"{r['traced_us'] / 1e3:.2f}"
        ratio = "--" if r["ratio"] is None else f"{r['ratio']:.2f} / {r['net_ratio']:.2f}"
        out.append(f"| {r['case']} | {truth} | {added} | {r['unprofiled_us'] / 1e3:.2f} / {traced} "
                   f"({r['overhead_us'] / 1e3:.2f}, {','.join(r['overhead_basis'])}) | {r['top'] or '--'} "
                   f"{r['top_ranks'] if r['top'] else ''} | {r['cost_us'] / 1e3:.2f} / {r['net_us'] / 1e3:.2f} | "
                   f"{ratio} | {', '.join(f'{a} {b / 1e3:.1f}' for a, b in r['others'])} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--sweep", help="a collectives sweep of the machine (kit doctor --sweep)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    cases = sorted(p.parent for p in a.corpus.glob("*/truth.json"))
    if not cases:
        print(f"verdicts: no case under {a.corpus}", file=sys.stderr)
        return 2
    sweep = None
    if a.sweep:
        from kit.doctor.sweep import load_sweep

        sweep = load_sweep(a.sweep)
    rows = []
    for c in cases:
        try:
            rows.append(verdict(c, sweep))
        except Exception as e:  # one broken case must not hide the others
            print(f"{c.name}: {type(e).__name__}: {e}", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows) if a.markdown else "\n".join(json.dumps(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
