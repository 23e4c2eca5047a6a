"""P2P transport targets on 2 GPUs of one node (GPU 0 -> GPU 1):

* at 256 MiB one way ``copy`` (kit.transports, one process) reaches >= 97% of a bare ``dst.copy_(src)`` loop -- the
  interface must cost nothing measurable at this size;
* at 256 MiB one way ``ipc`` (two processes, CUDA IPC mailbox + interprocess events) reaches >= 90% of ``copy`` --
  the price of crossing a process boundary (host handshake, the receiver's local copy out of the slot); both
  directions at once, ``ipc`` and ``ipc-direct`` >= 95% of ``copy`` (the copy-out competes with the incoming copy
  for memory bandwidth; the zero-copy receive has none);
* at 1 KiB one way ``copy``'s time per message is <= 1.5x the bare loop's -- bookkeeping out of the hot path.

Both are measured by the experiment itself (``kit.investigations.p2p_transports`` bandwidth part, 256 MiB only,
more samples than the notebook), so the numbers are the notebook's. With ``--run DIR`` the ratios are read from an existing
run instead (e.g. the recorded one), and the whole-investigation target (< 3 min on 2 GPUs) is checked from
the ``kit run`` log given with ``--kit-run-log``.

    python benchmarks/bench_p2p.py [--run DIR] [--kit-run-log LOG]
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
SIZE = 256 << 20
COPY_VS_BARE, IPC_VS_COPY, IPC_BOTH_VS_COPY, LAT_VS_BARE, WHOLE_S = 0.97, 0.90, 0.95, 1.5, 180.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", help="read a finished p2p_transports run instead of measuring")
    ap.add_argument("--kit-run-log", help="the output of `kit run p2p_transports` (for the whole-run time)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    from kit import contract as experiments, results
    from kit.investigations import p2p_transports as X
    from kit.investigations.p2p_transports import analysis as A

    if args.run:
        df = results.load(args.run)
    else:
        cfg = experiments.make_config("p2p_transports", {
            "transports": ["copy", "ipc", "ipc-direct"], "parts": ["bandwidth"], "directions": ["one", "both"],
            "min_bytes": SIZE,
            "max_bytes": SIZE, "iters": 10, "repeats": args.repeats, "warmup": 5, "results_root": "results/bench"})
        df = experiments.execute("p2p_transports", cfg).df()
    t = A.at_size(df, SIZE, "one")
    ok = True
    for name in (X.BARE, "copy", "ipc"):
        if name in t.index:
            print(f"{name:11s} {t.loc[name, 'gbps']:7.1f} GB/s  ({t.loc[name, 'time_us_median']:.1f} us per 256 MiB)")
    if X.BARE in t.index and "copy" in t.index:
        r = t.loc["copy", "gbps"] / t.loc[X.BARE, "gbps"]
        ok &= r >= COPY_VS_BARE
        print(f"copy / copy_ loop = {r:.4f}  (target >= {COPY_VS_BARE}) {'PASS' if r >= COPY_VS_BARE else 'FAIL'}")
    if "ipc" in t.index and "copy" in t.index:
        r = t.loc["ipc", "gbps"] / t.loc["copy", "gbps"]
        ok &= r >= IPC_VS_COPY
        print(f"ipc / copy = {r:.4f}  (target >= {IPC_VS_COPY}) {'PASS' if r >= IPC_VS_COPY else 'FAIL'}")
    both = A.at_size(df, SIZE, "both")
    for name in ("ipc", "ipc-direct"):
        if name in both.index and "copy" in both.index:
            r = both.loc[name, "total_gbps"] / both.loc["copy", "total_gbps"]
            ok &= r >= IPC_BOTH_VS_COPY
            print(f"{name} / copy, both directions = {r:.4f}  (target >= {IPC_BOTH_VS_COPY}) "
                  f"{'PASS' if r >= IPC_BOTH_VS_COPY else 'FAIL'}")
    lat = A.latency(df)
    if not args.run:
        print("copy at 1 KiB: not measured here (256 MiB only); give --run DIR of a full run for the 1.5x target")
    elif "vs_copy_loop" in lat.columns and "copy" in lat.index and lat.loc["copy", "bytes"] == 1024:
        r = lat.loc["copy", "vs_copy_loop"]
        ok &= r <= LAT_VS_BARE
        print(f"copy at 1 KiB = {lat.loc['copy', 'time_us_median']:.1f} us, {r:.2f}x the copy_ loop's "
              f"{lat.loc[X.BARE, 'time_us_median']:.1f} us  (target <= {LAT_VS_BARE}x) {'PASS' if r <= LAT_VS_BARE else 'FAIL'}")
    if args.kit_run_log:
        m = re.search(r"p2p_transports: ok in ([\d.]+) s", open(args.kit_run_log).read())
        if m:
            s = float(m.group(1))
            ok &= s < WHOLE_S
            print(f"whole investigation (kit run, notebook included): {s:.1f} s  (target < {WHOLE_S:g} s) "
                  f"{'PASS' if s < WHOLE_S else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
