"""``kit trace ...``: analyses of any PyTorch profiler trace (a user's own job's, not only the kit's); the
analyses themselves live in :mod:`kit.traces`.

Every subcommand takes the traces of one job as files, a directory or a glob (:func:`kit.traces.jobs.expand`)
and runs the per-rank work in parallel: ``--workers N`` local processes (default: every core), or
``--scheduler ADDRESS`` on a running Dask cluster (:func:`kit.traces.jobs.map_ranks`).
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT = """\
TRACES: rank trace files (.json, .json.gz, .pt.trace.json[.gz]), a directory of them, or a glob
('job/*rank*.json.gz'; quote it). Each rank is parsed by one worker at a time, so memory stays at about one
rank's trace per worker however many ranks there are.

exit status: 0 every trace analysed; 2 bad input, nothing analysed (every trace unreadable: one line per file;
a directory or glob matching nothing; the Dask scheduler unreachable); 3 partial result: some rank traces could
not be read -- they are named (text: 'could not read', --json: "failed": [{"trace", "error"}]) and the others
were analysed."""


def _positive(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError(f"{v!r}: a number of processes, 1 or more")
    return int(v)


def _jobs(p) -> None:
    p.add_argument("--workers", type=_positive, default=None, metavar="N",
                   help="local worker processes parsing ranks in parallel (default: the machine's cores; 1: in this "
                        "process)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the per-rank work on this dask.distributed scheduler (tcp://host:8786) instead; "
                        "needs pip install 'kit[cluster]' and the traces on a file system every worker sees")
    p.add_argument("--no-cache", action="store_true",
                   help="parse every trace again, neither reading nor writing the trace cache (.kitcache/)")


def add_parser(sub) -> None:
    t = sub.add_parser("trace", help="analyse PyTorch profiler traces (Chrome JSON, .json or .json.gz)")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    g = tsub.add_parser("gaps", help="idle GPU time before NCCL kernels and before other kernels, per GPU",
                        epilog=EXIT, formatter_class=fmt)
    g.add_argument("traces", nargs="+", metavar="TRACES",
                   help="one trace, or many ranks' (then: one line per rank and a summary over all)")
    g.add_argument("--json", action="store_true",
                   help="one trace: {summary: {before_nccl_us, before_other_us, stalls}, per_gpu, ...}; several: "
                        "{per_rank: [...], combined: {summary, ranks, kernels, ...}, failed: [...]}")
    g.add_argument("--threshold-us", type=float, default=None,
                   help="gaps longer than this are host stalls / iteration boundaries, counted apart (default 1000)")
    _jobs(g)
    g.set_defaults(fn=cmd_gaps)
    c = tsub.add_parser("collectives", help="one row per NCCL/gloo collective: bytes, duration, algbw/busbw; summary",
                        epilog=EXIT, formatter_class=fmt)
    c.add_argument("traces", nargs="+", metavar="TRACES",
                   help="one trace per rank (ranks are matched to remove waiting for late peers)")
    c.add_argument("--json", action="store_true", help='print {"collectives": [rows], "summary": [rows]} '
                                                       '(+ "failed": [...] when some rank could not be read)')
    _jobs(c)
    c.set_defaults(fn=cmd_collectives)
    m = tsub.add_parser("merge", help="one trace for Perfetto/chrome://tracing: a process per rank, clocks aligned",
                        epilog=EXIT, formatter_class=fmt)
    m.add_argument("traces", nargs="+", metavar="TRACES")
    m.add_argument("-o", "--output", required=True, help="merged trace (.json or .json.gz)")
    _jobs(m)
    m.set_defaults(fn=cmd_merge)


def _run(verb: str, args, work):
    """``(result, exit status)``: ``work(paths, jobs)`` on the expanded traces, bad input as one line per
    file on stderr (exit 2)."""
    from .. import traces
    from ..traces.jobs import expand

    jobs = dict(workers=args.workers, client=args.scheduler, cache=False if args.no_cache else None)
    try:
        return work(expand(args.traces), jobs), 0
    except (traces.TraceError, ImportError) as e:
        for line in str(e).splitlines():
            print(f"kit trace {verb}: {line}", file=sys.stderr)
        return None, 2


def _failed(verb: str, failed: list[dict], text: bool = True) -> int:
    """Name the ranks that could not be read (text: after the result; --json has them in "failed") and say
    on stderr that the result is partial; 3 when any."""
    if not failed:
        return 0
    if text:
        print(f"\ncould not read {len(failed)} rank trace(s); the result covers the other ranks:")
        for f in failed:
            print(f"  {f['error']}")
    print(f"kit trace {verb}: partial result, {len(failed)} rank trace(s) could not be read", file=sys.stderr)
    return 3


def cmd_gaps(args) -> int:
    from .. import traces

    threshold = args.threshold_us if args.threshold_us is not None else traces.DEFAULT_STALL_US
    res, rc = _run("gaps", args, lambda paths, jobs: traces.trace_gaps(
        paths[0] if len(paths) == 1 else paths, threshold, **jobs))
    if res is None:
        return rc
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(traces.format_gaps(res))
    return _failed("gaps", res.get("failed", []), not args.json)


def cmd_collectives(args) -> int:
    from .. import traces

    df, rc = _run("collectives", args, lambda paths, jobs: traces.collectives(paths, **jobs))
    if df is None:
        return rc
    s = traces.summary(df)
    failed = df.attrs.get("failed", [])
    if args.json:
        traces.comm.write_json(df, s, sys.stdout)
        print()
    else:
        print(traces.format_text(df, s))
    return _failed("collectives", failed, not args.json)


def cmd_merge(args) -> int:
    from .. import traces

    info, rc = _run("merge", args, lambda paths, jobs: traces.merge(paths, args.output, **jobs))
    if info is None:
        return rc
    offs = ", ".join(f"rank {r}: {o:+.1f} us" for r, o in info["offsets_us"].items())
    print(f"{args.output}: {len(info['ranks'])} ranks, clock offsets {offs}")
    for n in info.get("nccl", []):  # NCCL profiler-plugin dumps found beside the traces
        print(f"  NCCL profiler, rank {n['rank']}: {n['matched']} of {n['plugin_collectives']} collectives under "
              f"the kernels; alignment error {n['gpu_error_us']} us (GPU clock), {n['host_error_us']} us (host)")
    return _failed("merge", info.get("failed", []))
