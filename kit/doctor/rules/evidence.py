"""How the comm rules write their evidence: plain rounded numbers, sizes in words, where the notebook's timeline
excerpt looks."""

from __future__ import annotations

import math
from typing import Any

MiB = 1 << 20


def num(x: float | None, nd: int = 1) -> float | None:
    """A plain, rounded float for evidence (None for NaN/None)."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else round(x, nd)


def excerpt(rank: int, a: float, b: float, ranks=None, pad: float = 0.15) -> dict[str, Any]:
    """Where the notebook's timeline excerpt looks (times on ``rank``'s clock, us)."""
    w = max(b - a, 1.0)
    return {"rank": int(rank), "ranks": [int(r) for r in (ranks or [rank])], "t0_us": float(a - pad * w),
            "t1_us": float(b + pad * w)}


def dur_text(us: float | None) -> str:
    """'369 us', '3.83 ms', '180.7 ms' (a measured duration, in words)."""
    if us is None:
        return "?"
    us = float(us)
    return f"{us:.0f} us" if us < 1000 else f"{us / 1e3:.2f} ms" if us < 10_000 else f"{us / 1e3:.1f} ms"


def size_text(b: float) -> str:
    """'25 MiB', '6.8 KiB', '4 B' (three significant digits)."""
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"
