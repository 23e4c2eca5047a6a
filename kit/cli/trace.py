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

The traces given must be one job (checked before anything is analysed): one world size, no rank twice, no rank
outside the world size, one GPU family (H100, A100, V100, ...), recorded together (their traced spans overlap;
one that does not is named with its host and pid: another run, or clocks that disagree). Non-fatal problems
(events with a negative or zero duration dropped, a zero-duration ProfilerStep, a trace without rank taken in
file order) are printed once each on stderr as 'warning:' lines.

exit status (the same for every verb):
  0 every trace analysed, every rank of the job given;
  2 bad input, nothing analysed: one line per problem on stderr -- a file unreadable, truncated, not UTF-8
    (the byte offset), without events, not a trace (every one of them: one line per file); traces of more
    than one job (world sizes, a rank twice, GPU families, times); a directory or glob matching nothing; the
    Dask scheduler unreachable;
  3 partial result, printed: some ranks of the job's world size not given ('2 of 8 ranks given; missing 2-7:
    cross-rank results are partial'; --json: "job": {"missing", "partial", "note"}) or some rank traces could
    not be read (named: text 'could not read', --json "failed": [{"trace", "error"}]); the others analysed.
    One trace given to 'gaps' is a per-rank analysis: never partial."""


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
    tsub = t.add_subparsers(dest="trace_cmd", metavar="VERB", title="verbs")
    t.set_defaults(fn=lambda args: t.print_help() or 2)  # `kit trace` alone: its verbs, not "required: trace_cmd"
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
    """``(result, exit status)``: ``work(paths, jobs)`` on the expanded traces, bad input (a TraceError; a
    :class:`kit.traces.jobs.JobError`: not one job) as one line per problem on stderr (exit 2)."""
    from .. import traces
    from ..traces.jobs import expand

    jobs = dict(workers=args.workers, client=args.scheduler, cache=False if args.no_cache else None)
    try:
        return work(expand(args.traces), jobs), 0
    except (traces.TraceError, ImportError) as e:
        for line in str(e).splitlines():
            print(f"kit trace {verb}: {line}", file=sys.stderr)
        return None, 2


def _finish(verb: str, failed: list[dict], text: bool = True, job: dict | None = None,
            warnings: list[str] = ()) -> int:
    """After the result: each warning once on stderr; the ranks that could not be read named (text: after the
    result; --json has them in "failed"); the missing ranks of the job named on stderr. 3 when the result is
    partial either way, else 0."""
    for w in dict.fromkeys(warnings):
        print(f"kit trace {verb}: warning: {w}", file=sys.stderr)
    rc = 0
    if failed:
        if text:
            print(f"\ncould not read {len(failed)} rank trace(s); the result covers the other ranks:")
            for f in failed:
                print(f"  {f['error']}")
        print(f"kit trace {verb}: partial result, {len(failed)} rank trace(s) could not be read", file=sys.stderr)
        rc = 3
    if job and job.get("partial"):
        print(f"kit trace {verb}: {job['note']}", file=sys.stderr)
        rc = 3
    return rc


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
    return _finish("gaps", res.get("failed", []), not args.json, res.get("job"), res.get("warnings", []))


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
    return _finish("collectives", failed, not args.json, df.attrs.get("job"), df.attrs.get("warnings", []))


def cmd_merge(args) -> int:
    from ..nccl_profiler.merge import merge

    info, rc = _run("merge", args, lambda paths, jobs: merge(paths, args.output, **jobs))
    if info is None:
        return rc
    offs = ", ".join(f"rank {r}: {o:+.1f} us" for r, o in info["offsets_us"].items())
    print(f"{args.output}: {len(info['ranks'])} ranks, clock offsets {offs}")
    for n in info.get("nccl", []):  # NCCL profiler-plugin dumps found beside the traces
        print(f"  NCCL profiler, rank {n['rank']}: {n['matched']} of {n['plugin_collectives']} collectives under "
              f"the kernels; alignment error {n['gpu_error_us']} us (GPU clock), {n['host_error_us']} us (host)")
    return _finish("merge", info.get("failed", []), True, info.get("job"), info.get("warnings", []))
