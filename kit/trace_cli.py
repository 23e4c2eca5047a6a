"""``kit trace ...``: analyses of any PyTorch profiler trace (a user's own job's, not only the kit's); the
analyses themselves live in :mod:`kit.traces`."""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    t = sub.add_parser("trace", help="analyse PyTorch profiler traces (Chrome JSON, .json or .json.gz)")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    g = tsub.add_parser("gaps", help="idle GPU time before NCCL kernels and before other kernels, per GPU")
    g.add_argument("trace")
    g.add_argument("--json", action="store_true", help="print {summary: {before_nccl_us, before_other_us, ...}, per_gpu}")
    g.add_argument("--threshold-us", type=float, default=None,
                   help="gaps longer than this are host stalls / iteration boundaries, counted apart (default 1000)")
    g.set_defaults(fn=cmd_gaps)
    c = tsub.add_parser("collectives", help="one row per NCCL/gloo collective: bytes, duration, algbw/busbw; summary")
    c.add_argument("traces", nargs="+", help="one trace per rank (ranks are matched to remove waiting for late peers)")
    c.add_argument("--json", action="store_true", help='print {"collectives": [rows], "summary": [rows]}')
    c.set_defaults(fn=cmd_collectives)
    m = tsub.add_parser("merge", help="one trace for Perfetto/chrome://tracing: a process per rank, clocks aligned")
    m.add_argument("traces", nargs="+")
    m.add_argument("-o", "--output", required=True, help="merged trace (.json or .json.gz)")
    m.set_defaults(fn=cmd_merge)


def cmd_gaps(args) -> int:
    from . import traces

    try:
        res = traces.trace_gaps(args.trace, args.threshold_us if args.threshold_us is not None else traces.DEFAULT_STALL_US)
    except traces.TraceError as e:
        print(f"kit trace gaps: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res, indent=1) if args.json else traces.format_gaps(res))
    return 0


def cmd_collectives(args) -> int:
    from . import traces

    try:
        df = traces.collectives(args.traces)
    except traces.TraceError as e:
        print(f"kit trace collectives: {e}", file=sys.stderr)
        return 2
    s = traces.summary(df)
    print(json.dumps(traces.to_json(df, s), indent=1, default=str) if args.json else traces.format_text(df, s))
    return 0


def cmd_merge(args) -> int:
    from . import traces

    try:
        info = traces.merge(args.traces, args.output)
    except traces.TraceError as e:
        print(f"kit trace merge: {e}", file=sys.stderr)
        return 2
    offs = ", ".join(f"rank {r}: {o:+.1f} us" for r, o in info["offsets_us"].items())
    print(f"{args.output}: {len(info['ranks'])} ranks, clock offsets {offs}")
    return 0
