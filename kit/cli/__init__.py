"""The ``kit`` command (also ``python -m kit``).

    kit run [NAME ...|all] [--config FILE] [-p key=value ...] [--no-input] [--strict]
                                                                              notebooks -> HTML report
    kit exp NAME [--config FILE] [-p key=value ...] [--nodes K]               one experiment, no notebook
                                                                              (spawn here, or in place under torchrun/srun;
                                                                              --nodes K: this host as K emulated nodes)
    kit sysinfo [--json]                                                      hardware and software of this node
    kit trace gaps|collectives|merge TRACE ...                                analyse any PyTorch profiler trace
    kit doctor TRACE... [--json] [--html DIR] [--sweep RUN_DIR] [--fr DUMP...]
                                                                              which known causes a job's traces show
                                                                              (own exit status: kit doctor --help)
    kit runs [NAME ...] [--root DIR] [--json]                                 runs on disk: status (died: its supervisor
                                                                              is gone), rows, label, hardware
    kit nccl-profiler build --nccl-src DIR|GITDIR@TAG [--out DIR]             build NCCL's example profiler plugin
    kit nccl-profiler convert DUMP... -o OUT                                  its dumps as a Chrome trace (own clock)
    kit record RUN_DIR ...                                                    copy runs into recorded/ to commit
    kit wheelhouse DIR [--python-version 3.12] [--platform ...] [--exclude NAME ...]
                                                                              wheels for an offline node (never torch)

Exit status: 0 success; 1 a run or notebook failed; 2 bad input (config, file), nothing ran; 3 an investigation
cannot run on this machine (``kit exp``, or ``kit run --strict``), with what is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from ..config import ConfigError, parse_override


def _overrides(items):
    return [parse_override(p) for p in items or []]


def cmd_sysinfo(args) -> int:
    from .. import sysinfo

    info = sysinfo.collect()
    print(json.dumps(info, indent=1) if args.json else sysinfo.format_text(info))
    return 0


def _emulate_nodes(args) -> None:
    """``--nodes K``: every launch of this command runs on K emulated nodes of this host (kit.launch.emulated
    reads ``KIT_NODES``; notebook kernels inherit it). A config's own ``env: {KIT_NODES: ...}`` wins."""
    if getattr(args, "nodes", None) is not None:
        if args.nodes < 1:
            raise ConfigError(f"--nodes must be >= 1, not {args.nodes}")
        os.environ["KIT_NODES"] = str(args.nodes)


def cmd_run(args) -> int:
    from .. import runner

    _emulate_nodes(args)
    _, entries = runner.run(args.names, args.config, _overrides(args.param), no_input=args.no_input,
                            results_root=args.results_root)
    failed = [e for e in entries if e["status"] == "failed"]
    skipped = [e for e in entries if e["status"] == "skipped"]
    for e in failed:
        print(f"kit run: FAILED {e['error']}", file=sys.stderr)
    for e in skipped:
        print(f"kit run: {e['name']} cannot run here ({'; '.join(e['missing'])}); its page shows the recorded runs",
              file=sys.stderr)
    if failed:
        return 1
    return 3 if (skipped and args.strict) else 0


def cmd_exp(args) -> int:
    from .. import contract
    from ..config import load_yaml
    from ..launch import LaunchError, launched_externally

    _emulate_nodes(args)
    data = load_yaml(args.config) if args.config else {}
    mapping = {**(data.get("defaults") or {}), **(data.get(args.name) or {}), **dict(_overrides(args.param))}
    cfg = contract.make_config(args.name, mapping)
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) if launched_externally() else 0
    from ..progress import watch

    # a bar over the planned measurement points (stderr; silent when stderr is not a terminal, and on ranks but 0)
    bar = (watch(Path(cfg.results_root) / args.name, f"kit exp {args.name}", contract.planned_points(args.name, cfg))
           if rank == 0 else contextlib.nullcontext())
    try:
        with bar:
            runs = contract.execute_all(args.name, cfg, verbose=args.verbose)
    except contract.Skipped as e:
        print(f"kit exp {args.name}: cannot run on this machine:\n  " + "\n  ".join(e.reasons), file=sys.stderr)
        return 3
    except LaunchError as e:
        print(f"kit exp {args.name}: {e}", file=sys.stderr)
        if e.run is not None:
            print(f"kit exp {args.name}: {len(e.run.rows)} row(s) saved before the fault in {e.run.dir}", file=sys.stderr)
        return 1
    if rank == 0:
        for run in runs:
            print(f"{len(run.rows)} rows -> {run.dir}")
    return 0


def cmd_record(args) -> int:
    from .. import results

    for d in args.runs:
        try:
            print(f"{d} -> {results.record(d)}")
        except (FileNotFoundError, FileExistsError) as e:
            print(f"kit record: {d}: {e}", file=sys.stderr)
            return 2
    return 0


def cmd_wheelhouse(args) -> int:
    from .. import wheelhouse

    return wheelhouse.build(args.dir, args.python_version, args.platform, args.exclude, args.extras)


NODES_HELP = ("run on K emulated nodes of this host: K torchrun agents, each with its share of the GPUs and its own "
              "NCCL_HOSTID, NCCL's network transport (sockets over loopback) between them (kit/launch/emulated.py; "
              "sizes for it: configs/emulated-nodes.yaml)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``kit`` parser. ``only="trace"``: without the subcommands that import heavier modules (the doctor's
    imports its rules: ~0.06 s of every ``kit trace`` run, a tenth of a 100 MB trace's parse)."""
    p = argparse.ArgumentParser(prog="kit", description="Distributed-GPU performance investigations in PyTorch.",
                                epilog="kit COMMAND --help: its options and exit status. The notebooks' report: "
                                       "make report; the tests: make test (README).")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", title="commands")

    r = sub.add_parser("run", help="execute notebooks with papermill and write an HTML report")
    r.add_argument("names", nargs="*", help="notebook stems (e.g. collectives) or 'all' (default: all)")
    r.add_argument("--config", "-c", help="YAML config (default: configs/gpu.yaml with GPUs, else configs/cpu-smoke.yaml)")
    r.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="override a parameter (YAML value)")
    r.add_argument("--no-input", action="store_true", help="hide code cells in the HTML report")
    r.add_argument("--results-root", help="where runs and reports are written (default: the config's, else results/)")
    r.add_argument("--strict", action="store_true",
                   help="an investigation this machine cannot run is an error (exit 3), e.g. in CI of GPU nodes")
    r.add_argument("--nodes", type=int, metavar="K", help=NODES_HELP)
    r.set_defaults(fn=cmd_run)

    e = sub.add_parser("exp", help="run one experiment without a notebook (works under torchrun / srun)")
    e.add_argument("name")
    e.add_argument("--config", "-c")
    e.add_argument("-p", "--param", action="append", metavar="KEY=VALUE")
    e.add_argument("-v", "--verbose", action="store_true", help="print every rank's steps")
    e.add_argument("--nodes", type=int, metavar="K", help=NODES_HELP)
    e.set_defaults(fn=cmd_exp)

    s = sub.add_parser("sysinfo", help="GPUs, topology, driver, torch/CUDA/NCCL, NCCL_*/TORCH_*/CUDA_* env")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_sysinfo)

    rc = sub.add_parser("record", help="copy runs into recorded/ (committed evidence: rows gzipped, small files)")
    rc.add_argument("runs", nargs="+")
    rc.set_defaults(fn=cmd_record)

    w = sub.add_parser("wheelhouse", help="download every dependency except torch as wheels, for offline nodes")
    w.add_argument("dir")
    w.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    w.add_argument("--platform", action="append", help="pip platform tag(s) (default: manylinux x86_64 tags)")
    w.add_argument("--exclude", nargs="*", default=[], help="requirements the node already has (by name)")
    w.add_argument("--extras", nargs="*", default=["lab"], help="optional dependency groups to include")
    w.set_defaults(fn=cmd_wheelhouse)

    from . import trace as trace_cli

    trace_cli.add_parser(sub)
    if only == "trace":
        return p
    from ..doctor import cli as doctor_cli

    doctor_cli.add_parser(sub)
    from . import runs as runs_cli

    runs_cli.add_parser(sub)
    from ..nccl_profiler import cli as nccl_profiler_cli

    nccl_profiler_cli.add_parser(sub)
    return p


def main(argv=None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["trace"]:
        # no linear algebra in `kit trace`: OpenBLAS's threads, started with numpy, only spun on the cores the
        # parse needs (perf: 8% of a 60 MB trace's samples in blas_thread_server on 2 cores; 0.45 -> 0.40 s of CPU)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        # a trace's parse makes hundreds of thousands of objects without cycles (the trace layer pauses the
        # collector while it decodes, and the first allocation after would scan them all): collections 100x rarer
        # for this one command, 25 collections / 24 ms of a 0.4 s run on a 60 MB trace before
        import gc

        gc.set_threshold(70_000, 20, 20)
    parser = build_parser(only="trace" if given[:1] == ["trace"] else None)
    if not given:  # `kit` alone: what it can do, not argparse's "required: cmd"
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    try:
        return args.fn(args) or 0
    except ConfigError as e:
        print(f"kit: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # ``kit runs | head``: the reader has gone; stop quietly as other Unix tools do
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not raise BrokenPipeError again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
