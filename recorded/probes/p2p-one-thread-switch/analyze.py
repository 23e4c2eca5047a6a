"""Tables from ``probe.py``'s samples: per variant the host per iteration (calls, step blocks, the kit's parts), and
each forward / backward call split by what came before it on the one thread (a call of the same stage, or of another
stage: a device switch in between).

    python analyze.py DIR [DIR ...]     (each holding probe-<N>.json.gz)
"""

import glob
import gzip
import json
import os
import statistics as stat
import sys


def q(xs):
    xs = sorted(xs)
    if not xs:
        return "-"
    return f"{stat.median(xs):.1f} ({xs[len(xs) // 10]:.1f}-{xs[(9 * len(xs)) // 10]:.1f}, n={len(xs)})"


def main(d):
    for path in sorted(glob.glob(os.path.join(d, "probe-*.json.gz"))):
        r = json.load(gzip.open(path, "rt"))
        n = r["stages"]
        print(f"== {path}: {n} stages, {r.get('gpus', [])[:1]}, core {r.get('core')}, "
              f"{len(r['reps'].get('c', []))} reps, torch {r['torch']}")
        print("host us per call, by kind and by what preceded it on the thread "
              "(same stage / another stage; the first call of an iteration counts as another)")
        for name, reps in r["reps"].items():
            out = {}
            for rep in reps:
                prev = None
                for kind, s, us in rep["calls"]:
                    if kind == "L":
                        continue
                    key = (kind, "same" if prev == s else "switch")
                    out.setdefault(key, []).append(us)
                    prev = s
            print(f"  {name:3s} " + " | ".join(f"{k[0]} after {k[1]}: {q(v)}" for k, v in sorted(out.items())))
        print("host ms per iteration: F+B calls / step blocks / parts' own (p, p0)")
        for name, reps in r["reps"].items():
            calls = [sum(c[2] for c in x["calls"]) / 1e3 for x in reps]
            blocks = [sum(x["block_us"]) / 1e3 for x in reps] if "block_us" in reps[0] else []
            parts = [sum(sum(fb) for us in x["parts_host_us"].values() for fb in us) / 1e3 for x in reps] \
                if "parts_host_us" in reps[0] else []
            prog = [sum(x["host_us"]) / 1e3 for x in reps] if "host_us" in reps[0] else []
            print(f"  {name:3s} calls {q(calls)}  blocks {q(blocks)}  parts {q(parts)}  programs {q(prog)}  "
                  f"iteration {q([x['time_us'] / 1e3 for x in reps])}")


if __name__ == "__main__":
    for d in sys.argv[1:]:
        main(d)
