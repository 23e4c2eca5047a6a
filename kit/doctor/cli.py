"""``kit doctor TRACE...``: which known causes a job's per-rank profiler traces show (:mod:`kit.doctor`).

The traces are files, directories (their ``*.json[.gz]`` rank traces) or glob patterns, one trace per rank of
one job. Text report by default (:mod:`kit.doctor.report`); ``--json`` prints :meth:`Diagnosis.to_json`;
``--html DIR`` also renders ``notebooks/doctor.ipynb`` for these traces into ``DIR`` (papermill + nbconvert,
the machinery of ``kit run``: :func:`kit.runner.run_notebook`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_CLEAN, EXIT_NOTEBOOK, EXIT_BAD_INPUT, EXIT_PARTIAL, EXIT_FINDINGS = 0, 1, 2, 3, 4
EPILOG = """\
exit status:
  0  diagnosed: no finding at or above 'low' (0.5% of the step)
  4  diagnosed: at least one finding at or above 'low' (like a linter, for CI)
  3  partial: some rank traces could not be read (one line each), or ranks of the job's world size
     were not given (named); the others were diagnosed, cross-rank costs marked partial
     (3 whatever they show)
  2  bad input, nothing diagnosed: missing, truncated or foreign files, traces of different jobs, one rank
     twice, an unknown rule id, an unreadable sweep or Flight Recorder dump, an --html DIR that cannot be
     created (one line per problem)
  1  the diagnosis ran but --html could not render the notebook
"""


def add_parser(sub) -> None:
    d = sub.add_parser("doctor", help="diagnose a distributed job from its per-rank profiler traces",
                       description="Which known causes of slow distributed training a job's per-rank PyTorch "
                                   "profiler traces show, what each costs per step, and the fix; rules that cannot "
                                   "run on these traces are listed with the reason.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("traces", nargs="+", metavar="TRACE",
                   help="rank traces of one job: files, directories or glob patterns (.json, .json.gz)")
    d.add_argument("--json", action="store_true",
                   help='print {"findings": [...], "checked": [...], "skipped": [{"rule", "why"}], ...}')
    d.add_argument("--html", metavar="DIR", help="also render notebooks/doctor.ipynb for these traces into DIR")
    d.add_argument("--sweep", metavar="RUN_DIR",
                   help="a collectives sweep of the same machine (a kit collectives run, or nccl-tests output) "
                        "for low_busbw; without it, the reference table of known GPU/link types")
    d.add_argument("--fr", nargs="+", metavar="DUMP", default=[],
                   help="Flight Recorder dumps (JSON, one per rank; rank from the file name, e.g. fr_rank0.json)")
    d.add_argument("--workers", type=int, default=None, metavar="N",
                   help="local processes for the per-rank phase (default: one per core; 1 = in this process)")
    d.add_argument("--scheduler", metavar="ADDR", help="a Dask scheduler (tcp://host:8786) for the per-rank phase")
    d.add_argument("--rules", metavar="IDS", help=f"comma-separated rule ids to run (default: all): {rule_ids()}")
    d.add_argument("--no-cache", action="store_true",
                   help="parse every trace again, neither reading nor writing the trace cache (.kitcache/)")
    d.set_defaults(fn=cmd)


def rule_ids() -> str:
    """Every rule id, from the registry (importing the rules: a few ms, no pandas)."""
    from .rules import ids

    return ", ".join(ids())


def _fail(lines: str) -> int:
    for line in str(lines).splitlines() or [""]:
        print(f"kit doctor: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd(args) -> int:
    from ..traces import TraceError
    from ..traces.flight_recorder import load_fr_dumps
    from ..traces.jobs import JobError
    from .engine import diagnose
    from .rules import RuleIdError, parse_ids
    from .sweep import SweepError

    if getattr(args, "no_cache", False):  # the workers (local or Dask, started from here) inherit it
        os.environ["KIT_TRACE_CACHE"] = "0"
    if args.html:  # before the diagnosis: a folder that cannot be made is bad input, not a late traceback
        try:
            Path(args.html).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return _fail(f"--html: cannot create {args.html}: {e.strerror or e}")
    try:
        try:
            only = parse_ids(args.rules)
        except RuleIdError as e:
            raise RuleIdError(f"--rules: {e}") from None
        fr = load_fr_dumps(args.fr) if args.fr else None
        d = diagnose(args.traces, sweep=args.sweep, flight_recorder=fr, workers=args.workers,
                     client=args.scheduler, only=only)
    except (TraceError, JobError, SweepError, RuleIdError, ImportError) as e:
        return _fail(e)
    try:
        if args.json:
            print(json.dumps(d.to_json(), indent=1, default=str))
        else:
            from .report import format_text

            print(format_text(d))
        sys.stdout.flush()
    except BrokenPipeError:  # `kit doctor ... | head`: the reader left; not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.html and render_html(d, args, Path(args.html)) != 0:
        return EXIT_NOTEBOOK
    if d.failed or d.missing:
        return EXIT_PARTIAL
    return EXIT_FINDINGS if d.problems else EXIT_CLEAN


def render_html(d, args, out_dir: Path) -> int:
    """``notebooks/doctor.ipynb`` with the traces that were diagnosed (absolute paths: the notebook runs in the
    repository) rendered to ``out_dir/doctor.html`` (+ the executed ``doctor.ipynb`` and its figures)."""
    from .. import contract, runner
    from ..config import ConfigError

    nb = contract.get("doctor").notebook_path
    if not nb.exists():
        print(f"kit doctor: --html: {nb} is not there", file=sys.stderr)
        return 1
    overrides = [("traces", [str(Path(t).resolve()) for t in d.traces]),
                 ("sweep", str(Path(args.sweep).resolve()) if args.sweep else ""),
                 ("workers", int(args.workers or 0)),
                 ("flight_recorder", [str(Path(f).resolve()) for f in args.fr]),
                 ("rules", args.rules or "")]
    try:
        params = runner.resolve_params(["doctor"], None, overrides)["doctor"]
    except ConfigError as e:
        print(f"kit doctor: --html: {e}", file=sys.stderr)
        return 1
    import papermill as pm

    declared = pm.inspect_notebook(str(nb))  # the notebook's parameters cell; LaunchConfig's other fields stay out
    params = {k: v for k, v in params.items() if k in declared}
    out_dir.mkdir(parents=True, exist_ok=True)
    entry = runner.run_notebook("doctor", params, out_dir, no_input=True, log=lambda m: print(m, file=sys.stderr))
    if entry["status"] != "ok" or not entry["html"]:
        print(f"kit doctor: --html: {entry['error'] or 'no HTML written'}", file=sys.stderr)
        return 1
    print(f"kit doctor: report {out_dir / entry['html']}", file=sys.stderr)
    return 0
