"""``kit nccl-profiler build|convert``: build NCCL's example profiler plugin; convert its dumps.

    kit nccl-profiler build --nccl-src DIR|GITDIR@TAG [--out DIR]    build into a cache dir (default .nccl-profiler)
    kit nccl-profiler convert DUMP... -o OUT.json[.gz]                the dumps as one Chrome trace (own clock)

Exit status: 0 ok; 2 bad input (no source, unreadable dump, unknown interface version); 1 the build failed.
"""

from __future__ import annotations

import argparse
import json
import sys


def cmd_build(args) -> int:
    from .plugin import PluginError, build

    try:
        p = build(args.nccl_src, args.out)
    except PluginError as e:
        print(f"kit nccl-profiler build: {e}", file=sys.stderr)
        return 2 if "make failed" not in str(e) else 1
    print(json.dumps(p.to_json(), indent=1))
    return 0


def cmd_convert(args) -> int:
    from .chrome import write_chrome
    from .dump import DumpError, read_dumps

    try:
        dumps = read_dumps(args.dumps)
    except DumpError as e:
        print(f"kit nccl-profiler convert: {e}", file=sys.stderr)
        return 2
    try:
        n = write_chrome(dumps, args.output)
    except OSError as e:
        print(f"kit nccl-profiler convert: cannot write {args.output} ({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"{n} events from {len(dumps)} dump(s) -> {args.output}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("nccl-profiler", help="NCCL's profiler plugin: build it, convert its dumps")
    s = p.add_subparsers(dest="nccl_profiler_cmd", required=True)
    b = s.add_parser("build", help="build NCCL's example profiler plugin with this node's compiler")
    b.add_argument("--nccl-src", required=True,
                   help="an NCCL checkout, or GITDIR@TAG (e.g. nccl/.git@v2.28.9-1); match torch's NCCL version")
    b.add_argument("--out", help="cache directory (default: $KIT_NCCL_PROFILER_DIR or .nccl-profiler)")
    b.set_defaults(fn=cmd_build)
    c = s.add_parser("convert", help="the plugin's dumps (one per rank) as one Chrome trace on their own clock "
                                     "(kit trace merge puts them under the Kineto kernels)")
    c.add_argument("dumps", nargs="+")
    c.add_argument("-o", "--output", required=True)
    c.set_defaults(fn=cmd_convert)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kit")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["nccl-profiler", *(sys.argv[1:] if argv is None else argv)])
    return args.fn(args)
