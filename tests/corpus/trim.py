"""Trim a recorded corpus' traces to what is committed: each rank's last ``--keep`` profiled steps (every event --
host and GPU, all streams -- from the start of the first kept ``ProfilerStep#N`` on, as the profiler would have
written had its window begun there; GPU work still queued from the step before stays, as at the start of any
window, and so does GPU work already running at that start: a collective spinning for a late peer across it is the
window's waiting, and dropping it would leave GPU idle the recorded trace does not have), without the profiler's flow arrows (``ac2g``/``fwdbwd``: drawing links between a launch and its kernel,
which the correlation ids already give and no reader here uses). Metadata and the header are kept; the header gains
``"kitTrimmed": {"kept_steps", "dropped"}`` and the case's ``truth.json`` ``"trimmed": {"kept_steps": K}``.

    python tests/corpus/trim.py CORPUS_DIR [--keep 1]

Idempotent: a trace already trimmed to ``--keep`` steps or fewer is left as it is. :func:`cut` is the one trim of
a trace's events (``tests/data/doctor/make_test_data.py`` uses it too).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # kit, without installing it

from kit.traces.frames import GPU_CATS  # noqa: E402

FLOWS = ("ac2g", "fwdbwd")


def cut(ev: list[dict], keep: int, drop: tuple = ()) -> tuple[list[dict], list[dict]]:
    """A trace's events from the start of its first of the last ``keep`` ``ProfilerStep#N`` on, with the metadata
    and GPU activity (:data:`kit.traces.frames.GPU_CATS`) still running at that start, less the categories in
    ``drop``; and the kept step annotations. Without step annotations every event not dropped is kept."""
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])[-keep:]
    t0 = steps[0]["ts"] if steps else None
    return [e for e in ev if e.get("cat") not in drop and (
        t0 is None or e.get("ph") == "M" or e.get("cat") == "Trace" or e.get("ts", t0) >= t0
        or (e.get("cat") in GPU_CATS and e["ts"] + e.get("dur", 0) > t0))], steps


def trim(path: Path, keep: int) -> tuple[int, int]:
    """Trim one gzipped trace in place: (events before, after)."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    ev = data["traceEvents"]
    n_steps = sum(1 for e in ev if e.get("cat") == "user_annotation"
                  and str(e.get("name", "")).startswith("ProfilerStep#"))
    if n_steps <= keep and "kitTrimmed" in data:
        return len(ev), len(ev)
    kept, steps = cut(ev, keep, drop=FLOWS)
    data["traceEvents"] = kept
    data["kitTrimmed"] = {"kept_steps": [e["name"] for e in steps], "dropped": f"earlier steps, {FLOWS}"}
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        json.dump(data, f, separators=(",", ":"))
    tmp.replace(path)
    return len(ev), len(kept)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--keep", type=int, default=1)
    a = ap.parse_args(argv)
    for truth in sorted(a.corpus.glob("*/truth.json")):
        t = json.loads(truth.read_text())
        for p in sorted(truth.parent.glob("*.json.gz")):
            trim(p, a.keep)
        t["trimmed"] = {"kept_steps": a.keep, "by": "tests/corpus/trim.py"}
        truth.write_text(json.dumps(t, indent=1) + "\n")
        print(f"{truth.parent.name}: {sum(p.stat().st_size for p in truth.parent.iterdir()) // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
