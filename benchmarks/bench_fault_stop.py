"""How fast the launcher stops a faulty run (the speed targets the tests do not assert: tests only await the
outcome, with the faulty rank's own sleep as a hang guard).

On 2 gloo ranks (the experiments of ``tests/exps.py``), ``--repeats`` times each, median and range:

* ``raise``    -- rank 1 raises while rank 0 waits in a barrier (then would sleep 60 s): from the LaunchError to
  every rank process gone. Target: 10 s.
* ``hang``     -- rank 1 sleeps 600 s, ``timeout_s=3``: launch start to the LaunchError. Target: 3 + 20 s.
* ``teardown`` -- destroy_process_group hangs, ``teardown_s=2``: launch start to the run returned. Target: 25 s.

    python benchmarks/bench_fault_stop.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
TARGETS = {"raise": 10.0, "hang": 23.0, "teardown": 25.0}


def once(case: str, root: str) -> float:
    import exps
    from conftest import pids_of, wait_dead

    from kit.config import LaunchConfig
    from kit.launch import LaunchError, launch

    cfg = LaunchConfig(world_size=2, backend="gloo", results_root=root, timeout_s=60)
    t0 = time.monotonic()
    if case == "teardown":
        launch(exps.hang_in_teardown, dataclasses.replace(cfg, teardown_s=2), "teardown")
        return time.monotonic() - t0
    fn, cfg = ((exps.raise_on_rank1, cfg) if case == "raise" else
               (exps.hang_on_rank1, dataclasses.replace(cfg, timeout_s=3)))
    try:
        launch(fn, cfg, case)
    except LaunchError as e:
        if case == "raise":
            t0 = time.monotonic()
            left = wait_dead(pids_of(e.run.dir), 120)
            if left:
                raise SystemExit(f"raise: ranks {left} still alive after 120 s")
        return time.monotonic() - t0
    raise SystemExit(f"{case}: the launch did not fail")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| case | median s | min-max s | target s | met |\n|---|---|---|---|---|")
    ok = True
    for case, target in TARGETS.items():
        with tempfile.TemporaryDirectory() as root:
            t = [once(case, root) for _ in range(args.repeats)]
        med = statistics.median(t)
        ok &= med <= target
        print(f"| {case} | {med:.1f} | {min(t):.1f}-{max(t):.1f} | {target:g} | {'yes' if med <= target else 'NO'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
