"""held22 (s12r1; from held17's): pack a held-out round's traces for the trip back (no doctor on the machine):
every plain ``trainer-*.json`` compressed beside itself (``.json.xz``, lzma preset 3: a third smaller than gzip on
these traces; ``unxz`` gives the file back byte for byte); while the round's output is over ``MAX_MB``, the case
whose traces are largest is cut to its last 3 profiled steps (2 where it has 3) (``tests/corpus/trim.py``'s ``cut``; its truth.json
notes ``trimmed``) and compressed again; past ``DEADLINE`` (epoch s), or with every case cut, the largest cases'
traces are dropped instead. The plain files go last.

    python pack.py OUT_DIR MAX_MB DEADLINE
"""

import json
import lzma
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "tests" / "corpus"))


def _xz(p: str) -> None:
    with open(p, "rb") as f:
        data = f.read()
    with open(p + ".xz.tmp", "wb") as g:
        g.write(lzma.compress(data, preset=3))
    os.replace(p + ".xz.tmp", p + ".xz")


def _trim(p: str, keep: int = 3) -> None:
    from trim import FLOWS, cut

    with open(p) as f:
        data = json.load(f)
    kept, steps = cut(data["traceEvents"], keep, drop=FLOWS)
    data["traceEvents"] = kept
    data["kitTrimmed"] = {"kept_steps": [e["name"] for e in steps], "dropped": f"earlier steps, {FLOWS}"}
    with open(p, "w") as f:
        json.dump(data, f)
    _xz(p)


def packed_mb(root: Path) -> float:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.name.endswith(".json")
               or f.name == "truth.json" or f.suffix == ".json" and not f.name.startswith("trainer-")) / 2**20


def case_mb(case: Path) -> float:
    return sum(f.stat().st_size for f in case.glob("trainer-*.json.xz")) / 2**20


def _keep(case: Path) -> int:
    """held22: the order cases are cut or dropped in: by run, the least new first (E gpt4, D tiny4, C' hb02, C gacc02,
    A fsdp4, B cnn13), in a run the stall/gpu faults first, then controls, the rest last"""
    n, run = case.name, case.parent.name
    order = ("gpt4", "tiny4", "hb02", "gacc02", "fsdp4", "cnn13")
    return 10 * (order.index(run) if run in order else 9) + (0 if ("stall" in n or "gpu_rank" in n) else
                                                            1 if "control" in n else 2)


def main(root: Path, max_mb: float, deadline: float) -> None:
    plain = sorted(str(p) for p in root.rglob("trainer-*.json"))
    with ProcessPoolExecutor(min(48, os.cpu_count() or 2)) as ex:
        list(ex.map(_xz, plain))
    print(f"compressed {len(plain)} traces: {packed_mb(root):.1f} MB", flush=True)
    cut_done = set()
    while packed_mb(root) > max_mb:
        cases = sorted((t.parent for t in root.rglob("truth.json")), key=lambda d: (_keep(d), -case_mb(d)))
        todo = [c for c in cases if c not in cut_done and list(c.glob("trainer-*.json"))]
        if todo and time.time() < deadline:
            case = todo[0]
            t = json.loads((case / "truth.json").read_text())
            keep = 3 if t.get("profiled_steps", 5) > 3 else 2
            with ProcessPoolExecutor(32) as ex:
                list(ex.map(_trim, [str(p) for p in case.glob("trainer-*.json")], [keep] * 99))
            cut_done.add(case)
            t["trimmed"] = {"kept_steps": keep, "by": ".device/held22/pack.py (trim.py's cut)"}
            (case / "truth.json").write_text(json.dumps(t, indent=1) + "\n")
            print(f"cut {case.relative_to(root)} to {keep} steps: {packed_mb(root):.1f} MB", flush=True)
        else:
            case = next(c for c in cases if case_mb(c) > 0)
            for p in case.glob("trainer-*.json.xz"):
                p.unlink()
            print(f"dropped the traces of {case.relative_to(root)}: {packed_mb(root):.1f} MB", flush=True)
    for p in plain:
        os.unlink(p)


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
