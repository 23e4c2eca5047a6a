"""``kit trace ...``: analyses of any PyTorch profiler trace (a user's own job's, not only the kit's)."""

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


def cmd_gaps(args) -> int:
    from . import traces

    try:
        res = traces.trace_gaps(args.trace, args.threshold_us if args.threshold_us is not None else traces.DEFAULT_STALL_US)
    except traces.TraceError as e:
        print(f"kit trace gaps: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res, indent=1) if args.json else traces.format_gaps(res))
    return 0
