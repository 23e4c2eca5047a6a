"""Did every run under a results root keep its investigation's plan? (kit.progress: rank 0's points vs
Investigation.points at the run's own config, world size and backend.) Usage: python3 check.py RESULTS_ROOT"""
import json
import sys
from pathlib import Path

from kit import contract, progress
from kit.config import ConfigError

root = Path(sys.argv[1])
for name in contract.names():
    inv = contract.get(name)
    if inv.points is None:
        continue
    for d in sorted((root / name).glob("*/meta.json")):
        meta = json.loads(d.read_text())
        if meta.get("status") != "ok" or not meta.get("world_size"):
            print(name, d.parent.name, "status", meta.get("status"), "(not checked)")
            continue
        cfg = {k: v for k, v in (meta.get("config") or {}).items()}
        try:
            c = inv.config({k: v for k, v in cfg.items() if k in {f for f in inv.Config.__dataclass_fields__}})
        except ConfigError as e:
            print(name, d.parent.name, "config?", e)
            continue
        planned = inv.points(c, meta.get("world_size"), meta.get("backend") == "nccl")
        done, last = progress.read_points(d.parent)
        print(f"{name:18} {d.parent.name}  world {meta.get('world_size')} {meta.get('backend'):5}  "
              f"planned {planned:3}  reported {done:3}  {'ok' if planned == done else 'MISMATCH'}  last: {last}")
