"""Decoding a trace file: bytes -> ``{"traceEvents": [event dicts], ...top-level keys}``.

This is the only place that reads JSON. Everything above it (:mod:`kit.traces.frames`) works on the decoded
event dicts, so a faster decoder (msgspec, a cache of decoded files -- issue 18) replaces :func:`load` and
nothing else: it must return the same dict (``traceEvents`` holding only the events ``keep`` accepts, the
other top-level keys whole) and raise :class:`TraceError` for a file that is not a trace.

``keep`` is the memory knob: with it the ``traceEvents`` array is decoded one event at a time and only kept
events are held, so a 100 MB trace needs memory for what is kept, not for every CPU op in it.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, Callable

Keep = Callable[[dict], bool]


class TraceError(ValueError):
    """A file that is not a readable PyTorch profiler trace (message is meant for the user, no traceback)."""


def _is_gzip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_text(p: Path) -> str:
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    try:
        opener = gzip.open if p.suffix == ".gz" or _is_gzip(p) else open
        with opener(p, "rb") as f:
            return f.read().decode("utf-8")
    except (EOFError, gzip.BadGzipFile, OSError) as e:
        raise TraceError(f"{p}: cannot read ({type(e).__name__}: {e}); is the file complete?") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not a text/JSON file") from None


def load(path: str | Path, keep: Keep | None = None) -> dict[str, Any]:
    """The parsed trace ``{"traceEvents": [...], ...top-level keys}``. Raises TraceError for a missing,
    truncated or foreign file. ``keep``: a predicate on events (see the module docstring)."""
    p = Path(path)
    text = read_text(p)
    if keep is not None:
        data = _stream(text, keep)
        if data is not None:
            return data
        if hasattr(keep, "reset"):  # a counting predicate (kit.traces.frames) starts over for the one-piece parse
            keep.reset()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{p}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                         f"the trace looks truncated or is not a Chrome trace") from None
    if isinstance(data, list):  # the bare-array variant of the Chrome trace format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p}: not a PyTorch profiler trace (no 'traceEvents' list)")
    if not all(isinstance(e, dict) for e in data["traceEvents"]):
        raise TraceError(f"{p}: not a PyTorch profiler trace (trace events are not JSON objects)")
    if keep is not None:
        data["traceEvents"] = [e for e in data["traceEvents"] if keep(e)]
    return data


_TE = re.compile(r'"traceEvents"\s*:\s*\[')
_WS = re.compile(r"[\s,]*")


def _stream(text: str, keep: Keep) -> dict[str, Any] | None:
    """Decode the traceEvents array event by event; other top-level keys are decoded whole. Returns None
    when the text is not laid out as expected (the caller then parses it in one piece)."""
    m = _TE.search(text)
    if not m or not text.lstrip().startswith("{"):
        return None
    dec = json.JSONDecoder()
    i, n, events = m.end(), len(text), []
    while True:
        i = _WS.match(text, i).end()
        if i >= n:
            return None  # truncated inside the array: let json.loads produce the precise error
        if text[i] == "]":
            break
        try:
            e, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        if not isinstance(e, dict):
            return None  # the one-piece parse reports it
        if keep(e):
            events.append(e)
    try:  # the other top-level keys: the object with the events array emptied
        rest = json.loads(text[: m.end()] + text[i:])
    except json.JSONDecodeError:
        return None
    rest["traceEvents"] = events
    return rest
