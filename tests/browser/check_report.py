"""`make test-browser`: open a `kit run` report in headless Chromium and fail on what a reader would see broken.

    python tests/browser/check_report.py [REPORT_DIR] [--screenshots DIR]

REPORT_DIR defaults to the newest ``results/reports/<run-id>/``. The index and every page it links are opened in
the system's Chromium (``apt-get install chromium chromium-driver``) through Selenium; a page fails on an image
that did not load (naturalWidth 0), on an error output of its executed notebook (``<name>.ipynb`` beside the page)
or on a Python traceback in its text. ``--screenshots`` saves the index and every page as PNG (full width,
first 2400 px). Exit 0 when every page is clean, 1 with one line per problem, 2 on bad input. Not part of
``make test``: it needs a browser and a report.
"""

from __future__ import annotations

import argparse
import json
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
    if shots is not None:
        height = min(d.execute_script("return document.body.scrollHeight") or 1000, 2400)
        d.set_window_size(1400, height)
        d.save_screenshot(str(shots / f"{path.stem}.png"))
        d.set_window_size(1400, 1000)
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", help="a report directory (default: the newest under results/reports/)")
    ap.add_argument("--screenshots", metavar="DIR", help="save a PNG of the index and of every page here")
    a = ap.parse_args(argv)
    report = Path(a.report) if a.report else newest_report()
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
    finally:
        d.quit()
    for line in problems:
        print("FAIL", line)
    print(f"{report}: index and {len(pages)} page(s) opened in headless Chromium, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
