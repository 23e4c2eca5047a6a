"""`make test-browser`: open a `kit run` report in headless Chromium and fail on what a reader would see broken.

    python tests/browser/check_report.py [REPORT_DIR] [--screenshots DIR] [--lab NOTEBOOK]

REPORT_DIR defaults to the newest ``results/reports/<run-id>/``. The index and every page it links are opened in
the system's Chromium (``apt-get install chromium chromium-driver``) through Selenium; a page fails on an image
that did not load (naturalWidth 0), on an error output of its executed notebook (``<name>.ipynb`` beside the page)
or on a Python traceback in its text. ``--screenshots`` saves the index and every page as PNG (full width,
up to 2400 px: the index from its top, a page from its run cell down). ``--lab collectives`` also starts JupyterLab (as ``make lab`` does), opens that notebook, runs
all its cells, checks its progress bar ended at the planned points, drives the explorer's widgets (a value picked in
a dropdown must change the table), saves it (File > Save) and checks that git sees no change: ``git add`` would
store the committed notebook unchanged, without outputs, ``git diff`` is empty and ``git status`` clean (the file's bytes are put back
after, unless ``--keep-saved``). Exit 0 when every page is clean, 1 with one line per problem, 2 on bad input. Not part of
``make test``: it needs a browser and a report.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def newest_report() -> Path | None:
    reports = sorted((ROOT / "results" / "reports").glob("*/index.html"), key=lambda p: p.stat().st_mtime)
    return reports[-1].parent if reports else None


def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
              "--allow-file-access-from-files"):
        opts.add_argument(a)
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if binary:
        opts.binary_location = binary
    chromedriver = shutil.which("chromedriver")
    return webdriver.Chrome(options=opts, service=Service(chromedriver) if chromedriver else None)


BROKEN_IMAGES = """return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))
                    .map(i => (i.getAttribute('src') || '').slice(0, 80));"""


def error_cells(notebook: Path) -> list[str]:
    if not notebook.exists():
        return []
    nb = json.loads(notebook.read_text())
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}"[:200] for i, c in enumerate(nb["cells"])
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def check_page(d, path: Path, shots: Path | None) -> list[str]:
    d.get(path.as_uri())
    d.execute_script("window.scrollTo(0, document.body.scrollHeight); window.scrollTo(0, 0);")
    problems = [f"{path.name}: image not loaded: {src}" for src in d.execute_script(BROKEN_IMAGES)]
    text = d.find_element("tag name", "body").text
    if "Traceback (most recent call last)" in text:
        problems.append(f"{path.name}: a Python traceback on the page")
    problems += [f"{path.name}: error output, {e}" for e in error_cells(path.with_suffix(".ipynb"))]
    if shots is not None:  # the index from its top; a page from the run's cell down to its first figures
        height = min(d.execute_script("return document.body.scrollHeight") or 1000, 2400)
        d.set_window_size(1400, height)
        if path.name != "index.html":
            d.execute_script("""const c = Array.from(document.querySelectorAll('.jp-Cell'))
                                  .find(c => c.textContent.includes('analysing'));
                                if (c) { c.scrollIntoView(); window.scrollBy(0, -10); }""")
        d.save_screenshot(str(shots / f"{path.stem}.png"))
        d.set_window_size(1400, 1000)
    return problems


def save_and_check_git(d, name: str, keep_saved: bool = False, timeout_s: float = 60) -> list[str]:
    """File > Save (what Ctrl+S and autosave do) on the notebook just run; then the file must hold outputs (it was
    saved), while git must see no change: ``git add`` would store the committed blob as it is (the nbstripout
    filter, tests/notebook_commit.py), ``git diff`` is empty and ``git status`` does not list it (the post-save
    hook ``make lab`` sets, kit/lab.py). The file's bytes are put back after, unless ``keep_saved``."""
    import subprocess
    import time

    sys.path.insert(0, str(ROOT / "tests"))
    from notebook_commit import as_committed, clean_filter

    path = ROOT / "notebooks" / f"{name}.ipynb"
    rel = str(path.relative_to(ROOT))
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)  # noqa: E731
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    problems = []
    try:
        d.execute_script("window.jupyterapp.commands.execute('docmanager:save')")
        for _ in range(int(timeout_s * 2)):
            if path.stat().st_mtime_ns != mtime:
                break
            time.sleep(0.5)
        else:
            return [f"lab {name}: File > Save did not write {path.name} in {timeout_s:.0f} s"]
        time.sleep(1)  # the write is whole
        n_out = sum(len(c.get("outputs", [])) for c in json.loads(path.read_text())["cells"])
        left = sum(len(c.get("outputs", [])) for c in json.loads(as_committed(path))["cells"])
        stored = git("hash-object", f"--path={rel}", "--", rel).stdout.strip()  # through the filter, not written
        committed = git("rev-parse", f":{rel}").stdout.strip()
        diff = git("diff", "--", rel).stdout
        if not n_out:
            problems.append(f"lab {name}: saved without outputs: nothing to check")
        if clean_filter(path) is None:
            problems.append(f"lab {name}: no git clean filter for notebooks (`make setup` installs nbstripout's)")
        if left:
            problems.append(f"lab {name}: git would commit {left} output(s) of the saved notebook")
        if stored != committed or diff:
            problems.append(f"lab {name}: after a save git sees a change (git add would store {stored[:10]}, "
                            f"committed {committed[:10]}); git diff:\n{diff[:1500]}")
        status = git("status", "--porcelain", "--", rel).stdout.strip()
        if status:
            problems.append(f"lab {name}: after a save git status lists it: {status}")
        print(f"lab {name}: saved ({n_out} outputs in the file); git add would store the committed blob "
              f"{'unchanged' if stored == committed else 'CHANGED'} ({left} outputs), git diff "
              f"{'empty' if not diff else 'NOT empty'}; git status: {status or 'clean'}")
    finally:
        if not keep_saved:
            from kit.lab import git_refresh

            path.write_bytes(before)
            git_refresh(str(path))  # the bytes put back are a save too
    return problems


def check_lab(d, name: str, shots: Path | None, timeout_s: float = 600, keep_saved: bool = False) -> list[str]:
    """JupyterLab on notebooks/ (a free port, a token), ``name`` opened, Run > Run All Cells, then the explorer:
    its 'column' dropdown set to another column must re-draw the table (the line 'N of M rows' changes); then
    File > Save and what git makes of the saved notebook (:func:`save_and_check_git`)."""
    import os
    import secrets
    import socket
    import subprocess
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(8)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True", "--notebook-dir", str(ROOT / "notebooks"),
           "--ContentsManager.post_save_hook=kit.lab.git_refresh"]  # as make lab
    if os.getuid() == 0:
        cmd.append("--allow-root")
    lab = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    problems = []
    try:
        d.set_window_size(1400, 1000)
        url = f"http://127.0.0.1:{port}/lab/tree/{name}.ipynb?token={token}"
        for _ in range(60):
            try:
                d.get(url)
                break
            except Exception:
                time.sleep(1)
        wait = WebDriverWait(d, 120)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell"))
        time.sleep(5)  # the kernel starts
        # Run > Run All Cells, through the app's command registry (exposed by --LabApp.expose_app_in_browser)
        wait.until(lambda d: d.execute_script("return !!(window.jupyterapp && window.jupyterapp.commands)"))
        d.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        WebDriverWait(d, timeout_s).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".widget-dropdown select"))
        time.sleep(3)
        errors = d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        tracebacks = [e.text[:200] for e in errors
                      if "Traceback" in e.text or re.search(r"^\w+(Error|Exception|Interrupt)\b", e.text, re.M)]
        problems += [f"lab {name}: error output: {t}" for t in tracebacks]
        # the run's progress bar (tqdm's ipywidgets bar, kit.progress): it must end at its planned total
        bars = [e.text for e in d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output .widget-hbox")
                if re.search(r"\d+/\d+", e.text)]
        done = [b for b in bars if (m := re.search(r"(\d+)/(\d+)", b)) and m.group(1) == m.group(2)]
        if not done:
            problems.append(f"lab {name}: no progress bar ended at its planned points (saw {bars[:2]})")
        elif shots is not None:  # the run cell: the parameters line, the bar at its total, where the runs went
            bar = next(e for e in d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output .widget-hbox")
                       if e.text in done)
            cell = bar.find_element(By.XPATH, "ancestor::div[contains(@class,'jp-CodeCell')]")
            d.execute_script("arguments[0].scrollIntoView();", cell)
            d.save_screenshot(str(shots / f"lab-{name}-progress.png"))
        selects = d.find_elements(By.CSS_SELECTOR, ".widget-dropdown select")
        if len(selects) < 3:
            return problems + [f"lab {name}: the explorer shows {len(selects)} dropdown(s), expected 3"]
        out = selects[0].find_element(By.XPATH, "ancestor::div[contains(@class,'widget-interact')]")
        before = out.text
        col, val = Select(selects[1]), Select(selects[2])
        if val.first_selected_option.text != "(all)":
            problems.append(f"lab {name}: the value dropdown starts at {val.first_selected_option.text!r}, not (all)")
        for i in range(len(col.options)):  # a column with more than one value, so that a pick filters rows
            col.select_by_index(i)
            time.sleep(2)
            val = Select(out.find_elements(By.CSS_SELECTOR, ".widget-dropdown select")[2])
            if len(val.options) > 2:
                break
        before = out.text
        if len(val.options) > 2:
            val.select_by_index(1)
            time.sleep(3)
            if out.text == before:
                problems.append(f"lab {name}: picking a value did not re-draw the table")
        if shots is not None:
            d.execute_script("arguments[0].scrollIntoView();", out)
            d.save_screenshot(str(shots / f"lab-{name}.png"))
        print(f"lab {name}: ran all cells, progress bar {' | '.join(t.replace(chr(10), ' ') for t in done[:1])!r}, "
              f"explorer: {len(col.options)} columns, table re-drawn on a pick")
        problems += save_and_check_git(d, name, keep_saved)
    finally:
        lab.terminate()
        try:
            lab.wait(timeout=10)
        except subprocess.TimeoutExpired:
            lab.kill()
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", help="a report directory (default: the newest under results/reports/)")
    ap.add_argument("--screenshots", metavar="DIR", help="save a PNG of the index and of every page here")
    ap.add_argument("--lab", metavar="NOTEBOOK", help="also run this notebook in JupyterLab, drive its widgets, save "
                                                     "it and check what git makes of it")
    ap.add_argument("--keep-saved", action="store_true",
                    help="with --lab: leave the notebook as JupyterLab saved it (outputs in the file)")
    a = ap.parse_args(argv)
    report = Path(a.report).resolve() if a.report else newest_report()
    if report is None or not (report / "index.html").exists():
        print(f"no report at {report or ROOT / 'results/reports'}: run `make report` first", file=sys.stderr)
        return 2
    shots = Path(a.screenshots) if a.screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    try:
        d = driver()
    except Exception as e:  # no browser / driver: one line
        print(f"cannot start headless Chromium ({type(e).__name__}: {str(e).splitlines()[0]}); "
              "apt-get install -y chromium chromium-driver", file=sys.stderr)
        return 2
    problems, pages = [], []
    try:
        index = report / "index.html"
        problems += check_page(d, index, shots)
        d.get(index.as_uri())
        links = d.execute_script("return Array.from(document.links).map(a => a.getAttribute('href'));")
        pages = sorted({report / h for h in links if h and h.endswith(".html") and "://" not in h})
        problems += [f"index.html: links {p.name}, which does not exist" for p in pages if not p.exists()]
        for p in (p for p in pages if p.exists()):
            problems += check_page(d, p, shots)
        if a.lab:
            problems += check_lab(d, a.lab, shots, keep_saved=a.keep_saved)
    finally:
        d.quit()
    for line in problems:
        print("FAIL", line)
    print(f"{report}: index and {len(pages)} page(s) opened in headless Chromium, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
