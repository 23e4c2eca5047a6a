"""A trace's frames as columns before pandas (:class:`Columns`), and the builder's last step that makes them
(:func:`to_columns`): numbers to numpy arrays of their final width, names to categorical codes.

Why not a DataFrame straight away: ``import pandas`` alone is 0.3-0.4 s on a 2-core box (pandas 3 also loads
pyarrow), a third of ``kit trace gaps`` on a 100 MB trace. :class:`kit.traces.Trace` holds these columns and
builds each DataFrame on first access of ``gpu``/``cpu``; ``kit trace gaps`` reads the few columns it needs as
arrays (``Trace.array``) and never imports pandas. The DataFrame is the same either way (dtypes, categories and
their order included).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

INT_COLUMNS = ("device", "stream", "pid", "tid")
"""int64 when every value is an integer (Kineto: always, for GPU events), else left as they are"""
NUM_COLUMNS = ("correlation", "external_id", "in_nelems", "out_nelems", "group_size", "seq")
"""float64, NaN where the event has none: ids and counts below 2**53 are exact"""
CATEGORY_COLUMNS = ("name", "cat")
"""categorical: half a million kernel/op names are a few thousand distinct strings"""


_NUMBERS = frozenset({int, float, type(None)})
_NCCL = re.compile(r"(^|_Z\d+)nccl(Dev)?Kernel", re.IGNORECASE)


def is_nccl_kernel(name: str) -> bool:
    """NCCL kernels under both the old (``ncclKernel_*``) and the new (``ncclDevKernel_*``) naming, with or
    without a C++ mangling prefix (``_Z39ncclDevKernel_...``)."""
    return bool(_NCCL.search(name or "")) or (name or "").startswith("nccl")


@dataclass
class Columns:
    """A frame's columns as the builder makes them, before pandas: numbers and flags as numpy arrays of their
    final dtype, the categorical columns (:data:`CATEGORY_COLUMNS`) as int32 codes into a sorted list of
    distinct values, the rest (metadata strings and lists, mostly None) as lists. :meth:`frame` is the
    DataFrame (built once per Trace, on first access of ``Trace.gpu``/``cpu``)."""

    n: int
    columns: tuple[str, ...]
    values: dict[str, Any]
    categories: dict[str, list[str]] = field(default_factory=dict)

    def array(self, c: str) -> "np.ndarray":
        """Column ``c`` as a numpy array (a categorical one: an object array of its values)."""
        import numpy as np

        v = self.values[c]
        if c in self.categories:
            return np.array(self.categories[c], dtype=object)[v]
        return v if isinstance(v, np.ndarray) else np.array(v, dtype=object)

    def take(self, order: "np.ndarray") -> "Columns":
        """The rows in ``order`` (numpy fancy indexing; list columns picked one by one, or all None at once)."""
        idx = order.tolist()
        vals = {c: v[order] if hasattr(v, "shape") else [None] * len(idx) if v.count(None) == len(v)
                else list(map(v.__getitem__, idx)) for c, v in self.values.items()}
        return replace(self, n=len(order), values=vals)

    def frame(self) -> "pd.DataFrame":
        import pandas as pd

        out: dict[str, Any] = {}
        for c in self.columns:
            v = self.values[c]
            if c in self.categories:
                out[c] = pd.Categorical.from_codes(v, categories=self.categories[c])
            elif isinstance(v, list):
                out[c] = pd.Series(v, dtype=object)
            else:
                out[c] = v
        return pd.DataFrame(out, index=pd.RangeIndex(self.n))


def _categorical(v: list) -> tuple["np.ndarray", list[str]]:
    """``(codes, sorted distinct values)`` of a column of str -- what ``pd.Categorical(v)`` holds, made with one
    dict look-up per value (half a million events are a few thousand distinct names). A value that is not a
    str is its text (None: "")."""
    import numpy as np

    distinct = set(v)
    if not all(type(x) is str for x in distinct):
        v = [x if isinstance(x, str) else ("" if x is None else str(x)) for x in v]
        distinct = set(v)
    cats = sorted(distinct)
    index = {x: i for i, x in enumerate(cats)}
    return np.fromiter(map(index.__getitem__, v), dtype=np.int32, count=len(v)), cats


def to_columns(cols: dict[str, list], columns: tuple[str, ...]) -> Columns:
    """The built columns with narrow dtypes (:data:`INT_COLUMNS`, :data:`NUM_COLUMNS`, :data:`CATEGORY_COLUMNS`);
    string metadata (collective, dtype, process group) stays object: mostly None, and code compares and fills
    it like strings. Numbers are converted by numpy when every value is an int, a float or None (Kineto's), by
    ``pd.to_numeric(errors="coerce")`` otherwise."""
    import numpy as np

    n = len(cols["name"])
    out: dict[str, Any] = {}
    cats: dict[str, list[str]] = {}
    for c in columns:
        v = cols.get(c)
        if c == "end":
            continue
        if c in ("ts", "dur"):
            out[c] = np.array([0.0 if x is None else x for x in v], dtype=np.float64)
        elif c in CATEGORY_COLUMNS:
            out[c], cats[c] = _categorical(v)
        elif c in NUM_COLUMNS:
            if set(map(type, v)) <= _NUMBERS:
                out[c] = np.array(v, dtype=np.float64) if n else np.zeros(0)
            else:  # strings or lists where a number belongs: what pandas makes of them
                import pandas as pd

                out[c] = pd.to_numeric(pd.Series(v, dtype=object), errors="coerce").to_numpy(np.float64)
        elif c in INT_COLUMNS and n and set(map(type, v)) == {int}:
            out[c] = np.array(v, dtype=np.int64)
        elif c != "nccl":
            out[c] = v
    out["end"] = out["ts"] + out["dur"]
    if "nccl" in columns:  # decided once per distinct name, not per kernel
        is_nccl = np.array([is_nccl_kernel(x) for x in cats["name"]], dtype=bool)
        kernel = cats["cat"].index("kernel") if "kernel" in cats["cat"] else -2
        out["nccl"] = is_nccl[out["name"]] & (out["cat"] == kernel)
    return Columns(n, tuple(columns), out, cats)


def concat(parts: list[Columns]) -> Columns:
    """The rows of ``parts`` (each :func:`to_columns` of one chunk of events) as :func:`to_columns` of them all
    would make them -- same dtypes, categories (sorted), and a list where any part's :data:`INT_COLUMNS` column is
    one -- so that the builder drops each chunk's Python objects as it goes (a 42 MB rank: 60 MB less at the peak)."""
    import numpy as np

    n = sum(p.n for p in parts)
    if len(parts) == 1 or not n:
        return parts[0]
    full = [p for p in parts if p.n]
    out: dict[str, Any] = {}
    cats: dict[str, list[str]] = {}
    for c in parts[0].values:
        vals = [p.values[c] for p in full]
        if c in parts[0].categories:
            cats[c] = sorted(set().union(*(p.categories[c] for p in full)))
            index = {x: i for i, x in enumerate(cats[c])}
            out[c] = np.concatenate([np.array([index[x] for x in p.categories[c]], dtype=np.int32)[v]
                                     for p, v in zip(full, vals)])
        elif all(hasattr(v, "shape") for v in vals):
            out[c] = np.concatenate(vals)
        else:
            out[c] = list(itertools.chain.from_iterable(v.tolist() if hasattr(v, "shape") else v for v in vals))
    return Columns(n, parts[0].columns, out, cats)
