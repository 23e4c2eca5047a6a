"""Offline wheelhouse: GPU nodes are often air-gapped.

``kit wheelhouse DIR --python-version 3.12`` downloads, as wheels for that Python and platform, every
dependency of the kit except torch (the node's own CUDA build is used as it is, never replaced), plus a wheel
of the kit itself. On the node::

    pip install --no-index --find-links DIR kit            # into the environment that has torch
    pip install --no-index --find-links DIR --target /tmp/site papermill nbconvert ipykernel ipywidgets
                                                           # or just what is missing, beside a read-only env
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .results import REPO_ROOT

DEFAULT_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]


def requirements(extras: list[str], exclude: list[str]) -> list[str]:
    """The kit's dependencies from pyproject.toml (one source of truth), minus torch and ``exclude``."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(data["dependencies"])
    for x in extras:
        reqs += data.get("optional-dependencies", {}).get(x, [])
    skip = {"torch", *(_name(e) for e in exclude)}
    return [r for r in reqs if _name(r) not in skip]


def _interpreter(version: str) -> str | None:
    import shutil

    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    for cand in (shutil.which(f"python{version}"), *sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))):
        if cand and subprocess.call([str(cand), "-m", "pip", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
            return str(cand)
    return None


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def build(dest: str, python_version: str, platforms: list[str] | None, exclude: list[str], extras: list[str]) -> int:
    dest_p = Path(dest)
    dest_p.mkdir(parents=True, exist_ok=True)
    reqs = requirements(extras, exclude)
    # pip evaluates environment markers (e.g. papermill's `aiohttp; python_version == "3.12"`) for the
    # interpreter that runs it, even with --python-version: use an interpreter of the target version if
    # one is installed, so the wheelhouse holds exactly what that Python will ask for.
    target_py = _interpreter(python_version)
    if target_py is None:
        print(f"warning: no python{python_version} found; environment markers are evaluated for this "
              f"Python {sys.version_info.major}.{sys.version_info.minor} and conditional dependencies may be missing",
              file=sys.stderr)
    cmd = [target_py or sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest_p),
           "--python-version", python_version]
    for plat in platforms or DEFAULT_PLATFORMS:
        cmd += ["--platform", plat]
    print("$ " + " ".join(cmd + reqs), flush=True)
    rc = subprocess.call(cmd + reqs)
    if rc:
        return rc
    # the kit itself, as a pure-Python wheel
    rc = subprocess.call([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dest_p), str(REPO_ROOT)])
    n = len(list(dest_p.glob("*.whl")))
    print(f"{n} wheels in {dest_p} (torch excluded: the node's own build is used)")
    return rc
