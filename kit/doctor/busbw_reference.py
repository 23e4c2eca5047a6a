"""What known GPU/link types deliver, for ``low_busbw`` when no sweep of the job's machine is given: the reference
table ``busbw_reference.csv`` (package data beside this module; its header says what each column means and where
every row comes from), and how a job's traces pick their rows.

The table holds, per GPU model (the name CUDA reports, as the trace's ``deviceProperties`` give it), link type and
GPU count, each collective's bus bandwidth over a size curve: the kit's own collectives sweeps committed under
``recorded/`` (NCCL kernel durations, the same measurement as a trace's kernels; rebuilt from them by
``python -m kit.doctor.busbw_reference RUN_DIR ...``) and nccl-tests output published for other types (the
citation in its ``source``). A number is never typed into this module.

How a job picks its rows (:func:`reference`):

* the GPU name: every rank's trace must name the same one; a name the table lacks -> no reference;
* the link: traces do not record the topology, so a row is used only where the GPU name alone fixes the link
  (``link_from_name``: the SXM/HBM3 parts sit on NVLink boards); a PCIe part may or may not be NVLink-bridged,
  and its rows are only cited in the reason for having no answer;
* the node: the table holds single-node figures; ranks the traces place on several hosts -> no reference;
* the GPU count: the collective's group size must match a row's ``gpus``.

Only sizes in the reference's bandwidth-bound range are judged (:func:`bandwidth_bound`): from the first size at
which the curve reaches half its peak busbw. Below it a collective's time is mostly its fixed latency (at half the
peak, latency and transfer take equal time), which another machine, NCCL version or launch path changes far more
than the links do, so small collectives are never compared against another machine's figures.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

TABLE = Path(__file__).with_name("busbw_reference.csv")
COLUMNS = ["gpu", "link", "link_from_name", "gpus", "collective", "bytes", "busbw_gbps", "method", "source",
           "environment"]
COLLECTIVES_KEPT = ("all_reduce", "all_gather", "reduce_scatter")
"""what the table keeps of a kit sweep: the collectives data-parallel and sharded training run"""
BANDWIDTH_BOUND_SHARE = 0.5
"""sizes where the reference reaches this share of its peak busbw are bandwidth-bound (module docstring)"""
QUIET_ENV = ("NCCL_VERSION", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_TESTS_DIR")
"""NCCL_* variables that do not change how NCCL moves data (not listed as likely reasons)"""


class TableError(ValueError):
    """The reference table cannot be read: one line naming the file and what is wrong."""


def load_table(path: str | Path = TABLE) -> "pd.DataFrame":
    """The reference table (:data:`COLUMNS`), validated: one clear error for a missing column or a bad value."""
    import pandas as pd

    p = Path(path)
    try:
        df = pd.read_csv(p, comment="#", dtype={"gpu": str, "link": str, "source": str, "method": str,
                                               "environment": str, "collective": str}, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise TableError(f"{p}: cannot be read ({type(e).__name__}: {e})") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TableError(f"{p}: missing column(s) {', '.join(missing)}")
    try:
        df = df.assign(gpus=df["gpus"].astype(int), bytes=df["bytes"].astype("int64"),
                       busbw_gbps=df["busbw_gbps"].astype(float),
                       link_from_name=df["link_from_name"].map({"yes": True, "no": False}))
    except (ValueError, TypeError) as e:
        raise TableError(f"{p}: a non-numeric gpus, bytes or busbw_gbps ({e})") from None
    if df["link_from_name"].isna().any():
        raise TableError(f"{p}: link_from_name must be yes or no")
    if (df["bytes"] <= 0).any() or (df["busbw_gbps"] <= 0).any() or (df["gpus"] < 2).any():
        raise TableError(f"{p}: bytes and busbw_gbps must be positive and gpus at least 2")
    return df[COLUMNS]


def bandwidth_bound(curve: "pd.DataFrame") -> "pd.DataFrame":
    """The rows of one (source, collective) curve from the first size reaching :data:`BANDWIDTH_BOUND_SHARE` of
    its peak busbw on (module docstring)."""
    c = curve.sort_values("bytes")
    reached = (c["busbw_gbps"] >= BANDWIDTH_BOUND_SHARE * c["busbw_gbps"].max()).to_numpy()
    return c.iloc[int(reached.argmax()):]


@dataclass(frozen=True)
class Reference:
    """The rows a job's traces picked (:func:`reference`): ``rows`` in the sweep's form (``collective, bytes,
    busbw_gbps, source``) per GPU count, and what the finding says of its basis."""

    gpu: str
    link: str
    rows: "dict[int, pd.DataFrame]" = field(repr=False)
    """GPU count -> the bandwidth-bound rows of every source for that count"""
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)
    """source -> (its method, its environment: the NCCL_* settings it ran with, ``K=V K=V``, '' when unknown)"""

    def basis(self, source: str, gpus: int | None) -> str:
        """'reference table: <method> on <gpus>x <gpu> (<link>), <source>': what one comparison stood on."""
        method = self.sources.get(source, ("?", ""))[0]
        return f"reference table: {method} on {gpus}x {self.gpu} ({self.link}), {source}"


def _one(values: Iterable[str | None]) -> set[str]:
    return {v for v in values if v}


def reference(devices: Iterable[str | None], hosts: Iterable[str | None], table: "pd.DataFrame | None" = None
              ) -> Reference | str:
    """The reference rows for a job whose ranks' traces name ``devices`` (GPU names) and ``hosts``, or why there
    are none (one line: the GPU name is unknown to the table, the link cannot be told from the name, the ranks ran
    on several hosts)."""
    t = load_table() if table is None else table
    names = _one(devices)
    if not names:
        return "the traces name no GPU (no deviceProperties in their headers)"
    if len(names) > 1:
        return f"the ranks name different GPUs ({', '.join(sorted(names))})"
    gpu = names.pop()
    if len(_one(hosts)) > 1:
        return (f"the ranks ran on {len(_one(hosts))} hosts; the reference table holds single-node figures only "
                f"(give a sweep of the job's nodes, --sweep)")
    mine = t[t["gpu"] == gpu]
    if mine.empty:
        known = ", ".join(sorted(set(t["gpu"])))
        return f"{gpu} is not in the reference table (it has {known}); give a sweep of this machine (--sweep)"
    named = mine[mine["link_from_name"]]
    if named.empty:
        links = "; ".join(f"{lk} ({', '.join(sorted(set(g['source'])))})" for lk, g in mine.groupby("link"))
        return (f"the reference table has {gpu} only with links its name does not tell ({links}) and the traces do "
                f"not record the topology; give a sweep of this machine (--sweep)")
    if named["link"].nunique() > 1:
        return f"the reference table gives {gpu} several link types ({', '.join(sorted(set(named['link'])))})"
    import pandas as pd

    rows = {}
    for n, g in named.groupby("gpus"):
        parts = [bandwidth_bound(c) for _, c in g.groupby(["source", "collective"])]
        rows[int(n)] = pd.concat(parts)[["collective", "bytes", "busbw_gbps", "source"]].reset_index(drop=True)
    sources = {s: (m, e) for s, m, e in zip(named["source"], named["method"], named["environment"])}
    return Reference(gpu=gpu, link=str(named["link"].iloc[0]), rows=rows, sources=sources)


def attainable(ref: Reference, collective: str, nbytes: float, gpus: int | None) -> tuple[float, str] | None:
    """The reference busbw (GB/s) of ``collective`` at ``nbytes`` on ``gpus`` GPUs and the source giving it: the
    highest of its sources, each interpolated on its own curve (:func:`kit.doctor.sweep.attainable`); None when
    no source covers that count, collective and size."""
    from .sweep import attainable as on_curve

    if gpus is None or int(gpus) not in ref.rows:
        return None
    rows = ref.rows[int(gpus)]
    got = [(bw, s) for s, g in rows.groupby("source") if (bw := on_curve(g, collective, nbytes)) is not None]
    return max(got) if got else None


def environment_differences(job_env: dict[str, str] | None, reference_env: str | None) -> list[str]:
    """The job's NCCL_* settings (from its ``kitCapture`` header) that the reference did not run with, and the
    reference's that the job lacks: ``['NCCL_P2P_DISABLE=1 (the reference: unset)', ...]``; with the reference's
    environment unknown (None), the job's settings as they are. :data:`QUIET_ENV` left out."""
    job = {k: str(v) for k, v in (job_env or {}).items() if k.startswith("NCCL_") and k not in QUIET_ENV}
    if reference_env is None:
        return [f"{k}={v}" for k, v in sorted(job.items())]
    ref = dict(kv.split("=", 1) for kv in reference_env.split() if "=" in kv)
    ref = {k: v for k, v in ref.items() if k.startswith("NCCL_") and k not in QUIET_ENV}
    out = [f"{k}={v} (the reference: {ref.get(k, 'unset')})" for k, v in sorted(job.items()) if ref.get(k) != v]
    out += [f"{k} unset (the reference: {v})" for k, v in sorted(ref.items()) if k not in job]
    return out


# ------------------------------------------------------------------------------------------------ building it
def sweep_rows(run_dir: str | Path, label: str | None = None) -> "pd.DataFrame":
    """The table's rows of one kit collectives run (:func:`kit.doctor.sweep.load_sweep`, the NCCL kernel
    durations): its GPU name, links and NCCL environment from the run's ``meta.json``; ``source`` is ``label``
    (default: the run directory as given, e.g. ``recorded/h100x2/collectives/<run id>``)."""
    import pandas as pd

    from .. import results
    from .sweep import load_sweep

    d = Path(run_dir)
    meta = results.read_meta(d)
    sysinfo = meta.get("sysinfo") or {}
    sysinfo = json.loads(sysinfo) if isinstance(sysinfo, str) else sysinfo
    gpu0 = (sysinfo.get("gpus") or [{}])[0]
    env = {k: v for k, v in (sysinfo.get("env") or {}).items() if k.startswith("NCCL_") and k not in QUIET_ENV}
    if meta.get("placement") or meta.get("emulated") or meta.get("launcher") == "emulated nodes":
        raise TableError(f"{d}: a run over several (emulated) nodes; the table holds single-node figures")
    if not gpu0.get("name"):
        raise TableError(f"{d}: meta.json names no GPU")
    s = load_sweep(d)
    s = s[s["collective"].isin(COLLECTIVES_KEPT)]
    up, to_switch = gpu0.get("nvlinks_up"), gpu0.get("nvlinks_to_switch")
    link = (f"NVLink NV{up} through NVSwitch" if up and to_switch == up else
            f"NVLink NV{up}" if up else "PCIe (no NVLink up)")
    return pd.DataFrame({"gpu": gpu0["name"], "link": link, "link_from_name": "yes",
                         "gpus": int(meta.get("world_size") or 0), "collective": s["collective"],
                         "bytes": s["bytes"], "busbw_gbps": s["busbw_gbps"].round(2),
                         "method": "kit sweep, NCCL kernel time (min over ranks)",
                         "source": label or str(run_dir).rstrip("/"),
                         "environment": " ".join(f"{k}={v}" for k, v in sorted(env.items()))})


def rebuild(run_dirs: Iterable[str | Path], path: str | Path = TABLE) -> int:
    """Rewrite the table's kit-sweep rows from ``run_dirs`` (every other row and the header kept); the number of
    rows written."""
    import pandas as pd

    p = Path(path)
    text = p.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    old = load_table(p)
    kept = old[~old["method"].str.startswith("kit sweep")].assign(
        link_from_name=lambda d: d["link_from_name"].map({True: "yes", False: "no"}))
    new = pd.concat([kept, *[sweep_rows(d) for d in run_dirs]])[COLUMNS]
    p.write_text(header + new.to_csv(index=False))
    return len(new)


def main(argv: list[str] | None = None) -> int:
    """``python -m kit.doctor.busbw_reference RUN_DIR ...``: rebuild the table's kit-sweep rows from those runs."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m kit.doctor.busbw_reference RUN_DIR [RUN_DIR ...]  (kit collectives runs)",
              file=sys.stderr)
        return 2
    try:
        n = rebuild(args)
    except (TableError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{TABLE}: {n} rows")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
