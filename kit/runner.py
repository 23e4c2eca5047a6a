"""``kit run``: execute notebooks with papermill and turn them into a shareable report.

For each notebook: parameters = the config file's ``defaults`` + its own section + ``-p`` overrides, all
validated against the experiment's Config before anything runs (plus the world size against the GPUs
present). Output goes to one report directory per invocation::

    results/reports/<run-id>/
        index.html                  links, status and hardware of every notebook in this run
        <name>.ipynb                the executed notebook (kept, partly executed, when a cell fails)
        <name>.html                 nbconvert HTML, images embedded (``--no-input`` hides the code)
        figures/<name>-*.png        every figure the notebook saved; also copied to ./figures/

Every investigation is asked first whether this machine can run it (its ``needs``, kit.contract): those that
fit run; each one that does not is still rendered -- its notebook prints what is missing and what this machine
has, then analyses the committed recorded runs, labelled as such -- and the index marks it ``skipped``.

Exit status (``kit run``): 0 when everything that could run ran; 1 when a notebook failed (the message names the
notebook and the cell); with ``--strict`` a skipped investigation is an error too (exit 3), for CI of GPU nodes.
"""

from __future__ import annotations

import contextlib
import html
import os
import shutil
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from . import contract, progress, results
from .config import NOTEBOOK_EXTRAS, ConfigError, LaunchConfig, load_yaml, validate

REPO = results.REPO_ROOT
CONFIGS = REPO / "configs"
NOTEBOOKS: Path | None = None  # tests point this at a folder of modified notebooks; None = each investigation's own


def notebook_path(name: str) -> Path:
    return (NOTEBOOKS / f"{name}.ipynb") if NOTEBOOKS is not None else contract.get(name).notebook_path


def notebook_names() -> list[str]:
    """Every registered investigation that has a notebook, in registry order."""
    return [n for n in contract.names() if notebook_path(n).exists()]


def default_config() -> Path:
    from .launch import cuda_device_count

    return CONFIGS / ("gpu.yaml" if cuda_device_count() >= 1 else "cpu-smoke.yaml")


def resolve_params(names: list[str], config_path: Path, overrides: list[tuple[str, Any]]) -> dict[str, dict]:
    """Validated papermill parameters per notebook. Raises one ConfigError listing every problem. Whether this
    machine can run each one is :func:`cannot_run`'s question, not a config error."""
    data = load_yaml(config_path) if config_path else {}
    problems: list[str] = []
    known = contract.names()
    unknown = [k for k in data if k != "defaults" and k not in known]
    if unknown:
        problems.append(f"{config_path}: unknown section(s) {unknown}; sections are 'defaults' and {known}")
    defaults = data.get("defaults") or {}
    try:
        validate(LaunchConfig, defaults, where=f"{config_path}:defaults")
    except ConfigError as e:
        problems.append(str(e))
        defaults = {}  # a mistake under defaults: is reported once, above, not again for every notebook
    out = {}
    for name in names:
        mapping = {**defaults, **(data.get(name) or {}), **dict(overrides)}
        try:
            cfg, extras = validate(contract.get(name).Config, mapping, where=name, extras=NOTEBOOK_EXTRAS)
            extras["interactive"] = False  # batch runs never wait for widgets
            out[name] = {**asdict(cfg), **extras}
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    return out


def cannot_run(names: list[str], params: dict[str, dict]) -> dict[str, list[str]]:
    """name -> what is missing on this machine (only those that cannot run): kit.contract.missing, the same
    check ``contract.execute`` makes inside the notebook, so a page announced as skipped is rendered, not failed."""
    out = {}
    for name in names:
        cfg = contract.get(name).config({k: v for k, v in params[name].items() if k not in NOTEBOOK_EXTRAS})
        reasons = contract.missing(name, cfg)
        if reasons:
            out[name] = reasons
    return out


def planned(name: str, params: dict) -> int | None:
    """The measurement points this notebook's run plans (kit.contract.planned_points), for ``kit run``'s bar."""
    try:
        return contract.planned_points(name, contract.get(name).config(
            {k: v for k, v in params.items() if k not in NOTEBOOK_EXTRAS}))
    except ConfigError:
        return None


def _export_html(nb_path: Path, html_path: Path, no_input: bool) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(nb_path, as_version=4)
    exporter = HTMLExporter(exclude_input=no_input, exclude_input_prompt=no_input, exclude_output_prompt=no_input)
    body, _ = exporter.from_notebook_node(nb)
    # a wide table scrolls inside its output instead of running off the page's right edge
    body = body.replace("</head>", "<style>.jp-OutputArea-output table{display:block;overflow-x:auto;max-width:100%}"
                                   "</style></head>", 1)
    html_path.write_text(body)


def run_notebook(name: str, params: dict, report_dir: Path, no_input: bool, log=print,
                 params_from: str = "parameters given") -> dict:
    import papermill as pm

    src = notebook_path(name)
    out_nb = report_dir / f"{name}.ipynb"
    fig_dir = report_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    env_backup = {k: os.environ.get(k) for k in ("KIT_FIGURES_DIR", "KIT_FIGURE_PREFIX", "KIT_PARAMS")}
    os.environ["KIT_FIGURES_DIR"] = str(fig_dir)  # kit.plot.save writes here; inherited by the kernel
    os.environ["KIT_FIGURE_PREFIX"] = name
    os.environ["KIT_PARAMS"] = params_from  # kit.notebook.start: the values are this config's, take them as they are
    t0 = time.time()
    status, error = "ok", None
    try:
        if contract.get(name).run is None:  # an analysis page: only its own parameters, no launch settings
            drop = {f.name for f in fields(LaunchConfig)} | {"analyse"}
            params = {k: v for k, v in params.items() if k not in drop}
        watch = params.get("results_root") if contract.get(name).run is not None else None
        with (progress.watch(Path(watch) / name, f"  {name}", planned(name, params)) if watch
              else contextlib.nullcontext()):
            # the kernel's own log at ERROR: its "running over TCP without encryption" warning (a local kernel
            # on loopback) is nothing a user can act on
            pm.execute_notebook(str(src), str(out_nb), parameters=params, kernel_name="python3", cwd=str(REPO),
                                progress_bar=False, log_output=False,
                                extra_arguments=["--IPKernelApp.log_level=ERROR"])
    except pm.PapermillExecutionError as e:
        status = "failed"
        src_line = (e.source or "").strip().splitlines()[:1]
        error = (f"notebook {name}: cell {e.cell_index} (execution count {e.exec_count}) failed: "
                 f"{e.ename}: {e.evalue}" + (f"\n  cell begins: {src_line[0]}" if src_line else ""))
    except Exception as e:  # kernel died, papermill itself failed
        status = "failed"
        error = f"notebook {name}: {type(e).__name__}: {e}"
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    html_file = None
    if out_nb.exists():
        html_file = report_dir / f"{name}.html"
        try:
            _export_html(out_nb, html_file, no_input)
        except Exception as e:
            log(f"  (HTML export failed: {e})")
            html_file = None
    figures = sorted(fig_dir.glob(f"{name}-*.png"))
    return {"name": name, "status": status, "error": error, "seconds": round(time.time() - t0, 1),
            "notebook": out_nb.name, "html": html_file.name if html_file else None,
            "figures": [f"figures/{f.name}" for f in figures], "params": params,
            "shows": figure_sources(fig_dir, name, figures)}


def figure_sources(fig_dir: Path, name: str, figures: list[Path]) -> dict[str, str]:
    """figure -> what it shows ('this machine, 2026-11-25', 'recorded, 2x NVIDIA H200 (NV18), 2026-11-23', or for
    the doctor 'traces tests/data/doctor/late-rank, 2 ranks on NVIDIA H200, 2026-11-23'): the runs the notebook
    chose (kit.notebook.choose) or the traces it read (kit.doctor.notebook.doctor), last before the figure."""
    import json

    notes_file = fig_dir / f"{name}.provenance.jsonl"
    notes = [json.loads(x) for x in notes_file.read_text().splitlines() if x.strip()] if notes_file.exists() else []
    out = {}
    for f in figures:
        own = [n for n in notes if n.get("figure") == f.name]  # a figure that says what it shows (kit.plot.save)
        before = own or [n for n in notes if "figure" not in n and n["t"] <= f.stat().st_mtime + 1e-3]
        if not before:
            continue
        n = before[-1]
        where = "this machine" if n["source"] == "this run" else (n.get("what") or "recorded")
        out[f"figures/{f.name}"] = ", ".join(x for x in (where, n.get("hardware"), " & ".join(n.get("dates") or []))
                                             if x)
    return out


THUMB_WIDTH = 380
"""px: two figures side by side in the index's figures column of a 1400 px window, their axes readable"""


def figure_title(path: Path) -> str:
    """The title :func:`kit.plot.save` kept in a PNG (its ``Title`` text chunk), or "" (an older figure, another
    tool's)."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            return str(getattr(im, "text", {}).get("Title") or "")
    except Exception:  # noqa: BLE001 - a missing or unreadable figure has no title; the img shows it broken
        return ""


def _thumb(f: str, shows: str | None, title: str = "") -> str:
    """A thumbnail under its figure's title (HTML text: legible whatever the scale), with a caption badge: green
    when it shows this machine's run, grey for the recorded runs."""
    color = "#070" if shows and shows.startswith("this machine") else "#666"
    head = (f'<div style="font-size:85%;font-weight:bold;max-width:{THUMB_WIDTH}px">{html.escape(title)}</div>'
            if title else "")
    cap = (f'<figcaption style="font-size:80%;color:{color};max-width:{THUMB_WIDTH}px">{html.escape(shows)}'
           f'</figcaption>' if shows else "")
    return (f'<figure style="display:inline-block;margin:0 10px 12px 0;vertical-align:top;max-width:{THUMB_WIDTH}px">'
            f'{head}<a href="{f}"><img src="{f}" style="width:{THUMB_WIDTH}px;height:auto" '
            f'alt="{html.escape(title or Path(f).stem)}" title="{html.escape(title or Path(f).stem)}"></a>{cap}'
            f'</figure>')


_STATUS_STYLE = {"ok": ("ran here", "#070"), "skipped": ("cannot run here: recorded runs shown", "#a60"),
                 "failed": ("failed", "#b00")}


def write_index(report_dir: Path, entries: list[dict], config_path: Path | None) -> Path:
    """index.html: one row per notebook -- ran here, skipped (what is missing; the page shows the recorded
    runs), or failed (the cell) -- with its figures; a summary line counts each kind."""
    from . import sysinfo

    info = sysinfo.collect()
    rows = []
    for e in entries:
        link = f'<a href="{e["html"]}">{e["name"]}</a>' if e["html"] else e["name"]
        word, color = _STATUS_STYLE.get(e["status"], (e["status"], "#b00"))
        shows = list((e.get("shows") or {}).values())
        if e["status"] == "ok" and shows and all(s.startswith("traces ") for s in shows):
            word = "ran here on the traces its captions name"
        elif e["status"] == "ok" and shows and not any(s.startswith("this machine") for s in shows):
            word = "ran here; its figures draw the recorded runs"
        status = f'<b style="color:{color}">{html.escape(word)}</b>'
        why = "".join(f"<li>{html.escape(r)}</li>" for r in e.get("missing") or [])
        why = f"<ul>{why}</ul>" if why else ""
        figs = "".join(_thumb(f, (e.get("shows") or {}).get(f), figure_title(report_dir / f)) for f in e["figures"])
        err = f'<pre>{html.escape(e["error"])}</pre>' if e["error"] else ""
        q = f"<br><small>{html.escape(e.get('question') or '')}</small>"
        rows.append(f"<tr><td>{link}{q}</td><td>{status}{why}</td>"
                    f"<td style=\"white-space:nowrap\">{e['seconds']} s</td><td>{figs}{err}</td></tr>")
    counts = {k: sum(e["status"] == k for e in entries) for k in ("ok", "skipped", "failed")}
    summary = (f"{counts['ok']} ran on this machine, {counts['skipped']} cannot run here (their pages show the "
               f"recorded runs, labelled as such), {counts['failed']} failed")
    shown = [s for e in entries for s in (e.get("shows") or {}).values()]
    mine = sum(s.startswith("this machine") for s in shown)
    read = sum(s.startswith("traces ") for s in shown)
    legend = (f"{len(shown)} figure(s): {mine} from this machine's runs, {len(shown) - mine - read} from the recorded "
              f"runs, {read} from the traces the doctor read (each caption names the hardware and date); a CPU run "
              "proves the path, not the hardware, so the notebooks draw the recorded GPU runs and print this "
              "machine's own table beside them")
    page = f"""<!doctype html><meta charset="utf-8"><title>kit report {report_dir.name}</title>
<style>body{{font-family:sans-serif;margin:2em}} td{{vertical-align:top;padding:6px;border-bottom:1px solid #ddd}}
ul{{margin:4px 0;padding-left:18px;font-size:90%}}</style>
<h1>kit report {report_dir.name}</h1>
<p>{html.escape(sysinfo.summary(info))}<br>config: {html.escape(str(config_path))} &middot;
git {html.escape(str(results.git_commit()))} &middot; {time.strftime('%Y-%m-%d %H:%M')}</p>
<p><b>{html.escape(summary)}</b><br>{html.escape(legend)}</p>
<table><tr><th>investigation</th><th>status</th><th>time</th><th>figures</th></tr>{''.join(rows)}</table>
<details><summary>sysinfo</summary><pre>{html.escape(sysinfo.format_text(info))}</pre></details>
"""
    path = report_dir / "index.html"
    path.write_text(page)
    results.write_json(report_dir / "report.json", {"entries": entries, "config": str(config_path), "sysinfo": info,
                                                     "summary": counts})
    return path


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def run(names: list[str], config_path: str | None, overrides: list[tuple[str, Any]], *, no_input: bool = False,
        results_root: str | None = None, copy_figures: bool = True, log=print) -> tuple[Path, list[dict]]:
    """Execute notebooks; returns (report_dir, entries). Raises ConfigError before running anything.

    Entries have ``status`` ``ok``, ``skipped`` (``missing``: what this machine lacks; the notebook was still
    rendered, from the recorded runs) or ``failed`` (``error``). ``results_root`` (``--results-root``) holds
    both the report and the experiments' runs; when not given, the config's (default ``results``) is used.
    """
    if results_root is not None:
        overrides = [("results_root", str(results_root))] + list(overrides)
    if not names or names == ["all"]:
        names = notebook_names()
    known = contract.names()
    missing_nb = [n for n in names if n not in known or not notebook_path(n).exists()]
    if missing_nb:
        raise ConfigError(f"no notebook for {missing_nb}; available: {notebook_names()}")
    cfg_path = Path(config_path) if config_path else default_config()
    if not cfg_path.exists() and (CONFIGS / cfg_path.name).exists():
        cfg_path = CONFIGS / cfg_path.name
    params = resolve_params(names, cfg_path, overrides)
    for p in params.values():  # notebooks run with cwd=REPO: keep a relative results_root relative to the caller
        if not os.path.isabs(p["results_root"]):
            p["results_root"] = os.path.abspath(p["results_root"])
    skip = cannot_run(names, params)
    root = results_root or next(iter(params.values()))["results_root"]
    report_dir = results.new_run_dir(Path(root).resolve(), "reports")
    log(f"kit run: {len(names)} notebook(s) with {cfg_path} -> {report_dir}")
    for name, reasons in skip.items():
        log(f"  {name} cannot run here ({'; '.join(reasons)}): its page shows the recorded runs")
    given = _rel(cfg_path) + "".join(f" -p {k}={v}" for k, v in overrides if k != "results_root")
    entries = []
    for i, name in enumerate(names, 1):
        log(f"[{i}/{len(names)}] {name}: {'rendering recorded runs' if name in skip else 'running'} ...")
        e = run_notebook(name, params[name], report_dir, no_input, log, params_from=given)
        e["question"] = contract.get(name).question
        if name in skip and e["status"] == "ok":
            e["status"], e["missing"] = "skipped", skip[name]
        entries.append(e)
        log(f"[{i}/{len(names)}] {name}: {e['status']} in {e['seconds']} s"
            + (f", {len(e['figures'])} figure(s)" if e["figures"] else ""))
        if e["error"]:
            log("  " + e["error"].replace("\n", "\n  "))
        if copy_figures and e["figures"] and e["status"] == "ok":  # figures/ holds this machine's results only
            dest = REPO / "figures"
            dest.mkdir(exist_ok=True)
            for f in e["figures"]:
                shutil.copy2(report_dir / f, dest / Path(f).name)
    index = write_index(report_dir, entries, cfg_path)
    log(f"report: {index}")
    return report_dir, entries
