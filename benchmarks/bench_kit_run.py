"""`kit run collectives --config configs/cpu-smoke.yaml` wall time. Target: under 60 s on 2 cores.

    python benchmarks/bench_kit_run.py
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 60


def main():
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "kit", "run", "collectives", "--config", "configs/cpu-smoke.yaml",
                            "--results-root", tmp], cwd=ROOT)
        dt = time.perf_counter() - t
    print(f"kit run collectives (cpu-smoke): {dt:.1f} s (target < {TARGET_S} s) -> {'PASS' if dt < TARGET_S and p.returncode == 0 else 'FAIL'}")
    return 0 if dt < TARGET_S and p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
