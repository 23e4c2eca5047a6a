"""Decoding a trace file: bytes -> typed events, with msgspec. The only place that reads JSON.

**Why msgspec.** A profile of a few steps of a real model is 50-500 MB per rank. Decoded into Python dicts
(``json.loads``: 4.4 s for 100 MB; ``orjson``: 2.9 s) every CPU op's ``args`` -- input dims, strides, types of
every tensor -- becomes Python objects that are thrown away. msgspec decodes straight into :class:`Event`
structs that declare only the fields the trace layer maps: unknown keys are skipped while scanning, never
materialised (0.4 s for the same 100 MB). The ``args`` struct is *generated* from the adapters'
declarations (:data:`kit.traces.frames.ADAPTERS`): the raw keys an adapter names are the only ``args`` keys
decoded, so adding an adapter for a new torch version adds its keys here with no code change.

Two entry points:

* :func:`decode` -- ``(header, events)`` with ``events`` a list of :class:`Event` structs (what
  :mod:`kit.traces.frames` builds frames from);
* :func:`load` -- the whole trace as plain dicts (``{"traceEvents": [event dicts], ...header}``) for code that
  writes events back out (:mod:`kit.traces.merge`); ``keep`` filters events.

Errors are one line for the user (:class:`TraceError`): missing, unreadable/truncated gzip, not UTF-8 (the
first bad byte's offset), binary, not JSON (with where it stopped), JSON that is not a Chrome trace, a trace
without events (``traceEvents: []``).
"""

from __future__ import annotations

import gc
import gzip
import mmap
import os
import re
import zlib
from contextlib import contextmanager
from functools import lru_cache
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgspec

Keep = Callable[[dict], bool]


class TraceError(ValueError):
    """A file that is not a readable PyTorch profiler trace (message is meant for the user, no traceback)."""


_NULL = msgspec.Raw(b"null")
_EMPTY = msgspec.Raw(b'""')


class Event(msgspec.Struct, gc=False):
    """One Chrome-trace event with the fields the trace layer reads. ``name`` and ``args`` stay raw JSON
    (:class:`msgspec.Raw`, a view into the file's bytes): most events of a trace are CPU ops the analyses
    drop, so their names and args are never turned into Python objects -- :func:`names` and
    :func:`arg_columns` decode those of the kept events in one call each. ``gc=False``: half a million structs without
    reference cycles need no tracking by the garbage collector."""

    name: msgspec.Raw = _EMPTY
    cat: str | None = None
    ph: str | None = None
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: msgspec.Raw = _NULL


@lru_cache(maxsize=8)
def _args_struct(raw_keys: tuple[str, ...]) -> type:
    """The args struct with one field per declared raw key (renamed: raw keys have spaces)."""
    fields = [(f"a{i}", Any, msgspec.field(default=None, name=k)) for i, k in enumerate(raw_keys)]
    return msgspec.defstruct("Args", fields, gc=False)


def args_type(raw_keys: Iterable[str]) -> tuple[type, dict[str, str]]:
    """The struct decoding ``args`` with exactly ``raw_keys``, and raw key -> its attribute name."""
    keys = tuple(sorted(set(raw_keys)))
    return _args_struct(keys), {k: f"a{i}" for i, k in enumerate(keys)}


def _array(raws: list[msgspec.Raw]) -> bytes:
    """``[raw,raw,...]`` in one join (joining the views, then wrapping the result in brackets, held two copies)."""
    if len(raws) == 1:
        return b"[" + bytes(raws[0]) + b"]"
    return b",".join([b"[" + bytes(raws[0]), *raws[1:-1], bytes(raws[-1]) + b"]"])


def _batch(raws: list[msgspec.Raw], type_: Any) -> list:
    """Decode many raw JSON values in one call (one C-level parse of ``[v1,v2,...]``, not one per value)."""
    if not raws:
        return []
    return msgspec.json.decode(b"".join((b"[", b",".join(raws), b"]")), type=list[type_])


def names(events: list[Event]) -> list[str]:
    """The events' names as str (non-string names, which Kineto never writes, become their JSON text)."""
    return [x if isinstance(x, str) else str(x) for x in _batch([e.name for e in events], Any)]


def arg_columns(events: list[Event], raw_keys: Iterable[str]) -> dict[str, tuple]:
    """The events' ``args`` as one column per raw key: ``{raw key: (value or None, one per event)}``. The args
    are decoded in one call into :func:`args_type` structs and turned into columns at C speed
    (``msgspec.structs.astuple`` per event, one ``zip`` transposing them): no attribute look-up per event and
    key. An event without ``args``, or whose ``args`` is not a JSON object (Kineto never writes one, another
    tool might), has None in every column."""
    a, attr = args_type(raw_keys)
    keys = sorted(attr, key=lambda k: int(attr[k][1:]))
    raws = [e.args for e in events]
    try:
        structs = _batch(raws, a | None)
    except msgspec.ValidationError:
        structs = [msgspec.convert(x, a) if isinstance(x, dict) else None for x in _batch(raws, Any)]
    none = a()
    rows = list(map(msgspec.structs.astuple, [none if x is None else x for x in structs]))
    cols = list(zip(*rows)) if rows else [()] * len(keys)
    return dict(zip(keys, cols))


def _is_gzip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


READ_CHUNK = 1 << 22
"""bytes decompressed per call when reading a gzipped trace into its buffer"""


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _buffer(size: int) -> Any:
    """``size`` writable bytes to read a file into: an anonymous mapping whose pages the kernel provides at once
    (``MAP_POPULATE``, Linux), else a bytearray -- which zero-fills them page by page first (0.03 s more CPU for a
    154 MB trace, of the 0.12 s its read took). Not the file mapped itself: a file truncated by another process
    while mapped would end this one with SIGBUS."""
    if _POPULATE:
        try:
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        except (OSError, ValueError):
            pass
    return bytearray(size)


def _read_into(p: Path, gz: bool) -> Any:
    """The file's bytes (decompressed) in one buffer sized up front -- the file's size, or a gzip's ISIZE
    trailer -- and filled in place (:func:`_buffer` for a plain file): reading a gzip whole (``GzipFile.read()``)
    joins its pieces at the end, the file's size twice at once. Mutable, so that :func:`_select` and
    :func:`_stretches` can decode stretches of it in place. A file that holds more or less than announced (a gzip
    of several members, or over 4 GiB: ISIZE is the last member's, modulo 2**32; a file that changed meanwhile) is
    read to its end, into a bytearray."""
    if gz:
        with open(p, "rb") as f:
            f.seek(-4, os.SEEK_END)
            size = int.from_bytes(f.read(4), "little")
        opened, buf = gzip.open(p, "rb"), bytearray(size)
    else:
        size, opened = p.stat().st_size, open(p, "rb", buffering=0)
        buf = _buffer(size) if size else bytearray()
    got = 0
    with opened as f:
        with memoryview(buf) as view:
            while got < size:
                n = f.readinto(view[got:got + READ_CHUNK] if gz else view[got:])
                if not n:
                    break
                got += n
        if got < size:
            if isinstance(buf, bytearray):
                del buf[got:]
            else:
                buf = bytearray(buf[:got])
        else:
            while more := f.read(READ_CHUNK):
                if not isinstance(buf, bytearray):
                    buf = bytearray(buf)
                buf += more
    return buf


def read_bytes(p: Path) -> Any:
    """The file's bytes, decompressed when gzipped (:func:`_read_into`). TraceError when missing or not
    readable."""
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    if p.is_dir():
        raise TraceError(f"{p}: is a directory, not a trace file")
    try:
        if p.stat().st_size == 0:
            raise TraceError(f"{p}: empty file (was the profiler stopped before it wrote the trace?)")
        data = _read_into(p, p.suffix == ".gz" or _is_gzip(p))
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise TraceError(f"{p}: cannot read ({type(e).__name__}: {e}); is the file complete?") from None
    if not data[:4096].strip() and not bytes(data).strip():  # the full strip (a copy) only when it starts blank
        raise TraceError(f"{p}: empty file (was the profiler stopped before it wrote the trace?)")
    check_utf8(p, data)
    return data


def check_utf8(p: Path, data: bytes) -> None:
    """TraceError naming the first byte that is not UTF-8 (JSON is UTF-8; a corrupt or binary-patched trace
    would otherwise fail later, in whichever event's name holds it, or not at all). An ASCII file -- what
    Kineto writes unless a name holds other characters -- is checked at memory speed (``bytes.isascii``)."""
    plain = isinstance(data, (bytes, bytearray))
    if data.isascii() if plain else all(data[i:i + READ_CHUNK].isascii() for i in range(0, len(data), READ_CHUNK)):
        return
    try:
        (data if plain else bytes(data)).decode("utf-8")
    except UnicodeDecodeError as e:
        where = "of the decompressed JSON" if p.suffix == ".gz" or _is_gzip(p) else "of the file"
        raise TraceError(f"{p}: not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset {e.start} {where} "
                         f"(a corrupt or binary file?)") from None


def _first_char(buf: bytes) -> str:
    s = buf[:4096].lstrip()
    return chr(s[0]) if s else ""


def _json_error(p: Path, buf: bytes, e: Exception) -> TraceError:
    msg = str(e)
    if _first_char(buf) not in ("{", "["):
        try:
            buf[:4096].decode("utf-8")
        except UnicodeDecodeError:
            return TraceError(f"{p}: not a text/JSON file")
        return TraceError(f"{p}: not JSON ({msg}); is it a PyTorch profiler trace?")
    if "truncated" in msg.lower():
        return TraceError(f"{p}: not valid JSON ({msg}); the trace looks truncated -- is the file complete?")
    return TraceError(f"{p}: not valid JSON ({msg}); the trace looks truncated or is not a Chrome trace")


def _split(p: Path, buf: bytes) -> tuple[dict[str, Any], msgspec.Raw]:
    """Top level -> (header decoded whole, the traceEvents array still raw). The bare-array variant of the
    Chrome trace format (a list of events) has an empty header."""
    try:
        if _first_char(buf) == "[":
            return {}, msgspec.Raw(buf)
        top = msgspec.json.decode(buf, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _json_error(p, buf, e) from None
    if "traceEvents" not in top:
        raise TraceError(f"{p}: not a PyTorch profiler trace (no 'traceEvents' list)")
    events = top.pop("traceEvents")
    try:
        header = {k: msgspec.json.decode(v) for k, v in top.items()}
    except msgspec.DecodeError as e:  # pragma: no cover - the raw split already validated the JSON
        raise _json_error(p, buf, e) from None
    return header, events


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused, then restored as it was. Parsing a trace allocates hundreds of
    thousands of objects that form no reference cycles (lists, tuples, strings, numbers); the collector would
    scan the growing heap again and again and free nothing (~0.03 s of a 100 MB trace's 0.7 s)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


CHUNK = 8192
"""events decoded at a time: one chunk's structs live at once, not the file's (a 42 MB rank: 65536 peaked 60 MB
higher, 16384 10 MB; 4096 took no less CPU)"""


def _address(obj: Any) -> int:
    """Where the bytes of a buffer (bytes, bytearray, memoryview, :class:`msgspec.Raw`) start in memory: how the
    views msgspec returns are placed in the file's bytes. Through the buffer protocol with ctypes, not numpy: the
    parse holds the whole file until it has picked its events, and importing numpy then (14 MB) would add to that
    peak; numpy comes after the file is dropped."""
    import ctypes

    view = _py_buffer()()
    if ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(obj), ctypes.byref(view), 0) != 0:
        raise TypeError(f"not a buffer: {type(obj).__name__}")  # pragma: no cover - every caller passes one
    try:
        return int(view.buf or 0)
    finally:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(view))


@lru_cache(maxsize=1)
def _py_buffer() -> type:
    """CPython's ``Py_buffer`` as a ctypes structure (``obj`` a plain pointer: ``PyBuffer_Release`` owns it)."""
    import ctypes

    class PyBuffer(ctypes.Structure):
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                    ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]

    return PyBuffer


class _Top(msgspec.Struct, gc=False):
    """A trace's top level as one pass sees it: the events as raw views, every other key skipped."""

    traceEvents: list[msgspec.Raw]


def _one_pass(p: Path, buf: bytes) -> tuple[dict[str, Any], Any, list[msgspec.Raw]] | None:
    """:func:`raw_events` in one pass over the file instead of two (the top level, then the events array:
    0.09 s of CPU per 100 MB saved): the events as raw views straight from the top level, the header decoded
    from the file with the events array cut out -- the views point into ``buf``, so the array's bounds are those
    of its first and last event. None where that does not hold (an empty array, a bare array, views that are
    copies), and the caller takes the two passes."""
    if _first_char(buf) != "{":
        return None
    try:
        raws = msgspec.json.decode(buf, type=_Top).traceEvents
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # the two-pass path says what is wrong
    if not raws:
        return None
    base = _address(buf)
    first = _address(raws[0]) - base
    last = _address(raws[-1]) - base + len(raws[-1])
    if not (0 <= first < last <= len(buf)) or buf[first:first + len(raws[0])] != bytes(raws[0]) \
            or buf[last - len(raws[-1]):last] != bytes(raws[-1]):
        return None
    lb = buf.rfind(b"[", 0, first)
    rb = buf.find(b"]", last)
    if lb < 0 or rb < 0 or buf[lb + 1:first].strip() or buf[last:rb].strip():
        return None
    try:
        top = msgspec.json.decode(buf[:lb] + b"[]" + buf[rb + 1:], type=dict[str, msgspec.Raw])
        top.pop("traceEvents", None)
        header = {k: msgspec.json.decode(v) for k, v in top.items()}
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return header, memoryview(buf)[lb:rb + 1], raws


def raw_events(path: str | Path) -> tuple[dict[str, Any], Any, list[msgspec.Raw]]:
    """``(header, the traceEvents array raw, one raw view per event)``: the file split, nothing decoded yet.
    Raises TraceError."""
    p = Path(path)
    return _raw_events(p, read_bytes(p))


def _raw_events(p: Path, buf: Any) -> tuple[dict[str, Any], Any, list[msgspec.Raw]]:
    """:func:`raw_events` of the file's bytes ``buf``."""
    done = _one_pass(p, buf)
    if done is not None:
        return done
    header, raw = _split(p, buf)
    try:
        raws = msgspec.json.decode(raw, type=list[msgspec.Raw])
    except msgspec.ValidationError as e:
        raise TraceError(f"{p}: not a PyTorch profiler trace (traceEvents: {e})") from None
    except msgspec.DecodeError as e:
        raise _json_error(p, buf, e) from None
    if not raws:
        raise TraceError(f"{p}: no events (traceEvents is empty: was the profiler stopped before its first step?)")
    return header, raw, raws


def event_dicts(path: str | Path, chunk: int | None = None,
                raw_values: bool = False) -> Iterator[list[dict[str, Any]]]:
    """The file's events as plain dicts, ``chunk`` at a time (for code that writes them back out: merge);
    the whole file is never a list of dicts. ``raw_values``: only the keys are decoded, every value stays its
    JSON text (a :class:`msgspec.Raw`, encoded back verbatim) -- a caller that changes a few fields
    (:func:`values` decodes them) copies the rest, args and all, without building it as Python objects
    (``kit trace merge``'s pass over a 100 MB rank: 2.0 s instead of 4.0 s). Raises TraceError."""
    p = Path(path)
    _, _, raws = raw_events(p)
    size = chunk or CHUNK
    type_ = dict[str, msgspec.Raw] if raw_values else dict[str, Any]
    for i in range(0, len(raws), size):
        try:
            yield _batch(raws[i:i + size], type_)
        except msgspec.ValidationError:
            raise TraceError(f"{p}: not a PyTorch profiler trace (trace events are not JSON objects)") from None


def values(raws: list[msgspec.Raw]) -> list[Any]:
    """Raw JSON values (from :func:`event_dicts` with ``raw_values``) as Python values, in one call."""
    return _batch(raws, Any)


class _Head(msgspec.Struct, gc=False):
    """What decides whether an event is kept, and nothing else (a first pass over every event). ``ph``
    is not read here: the few events of a kept category that are not complete ("X") are dropped by the
    frame builder; decoding a second string per event of the file cost more than they do."""

    cat: str | None = None


HEAD_CHUNK = 1 << 14
"""events whose ``cat`` the first pass reads at a time: its structs and strings (~90 bytes an event) live for one
chunk (1.5 MB), not for the whole file (~50 MB at once for a 150 MB trace of 600,000 events)"""


def _select(raw: Any, raws: list[msgspec.Raw], want: set[str]) -> list[msgspec.Raw]:
    """The raw events whose ``cat`` is in ``want``: each chunk of :data:`HEAD_CHUNK` decoded as :class:`_Head`
    structs (``cat`` only) and filtered (a comprehension: ~110 ns an event; ``map``/``compress`` at C level took
    longer, ~140 ns, in the set look-up through a bound method).

    A chunk's events are one stretch of the events array ``raw`` (the views point into it). Where ``raw`` is
    writable (the file read into a bytearray, :func:`read_bytes`), the stretch is decoded where it lies: the
    separator bytes just before and after it (a comma or a blank, between two events) are set to ``[`` and ``]``
    for the call and put back after -- no copy (copying each stretch cost ~0.04 s per 60 MB, joining the views
    anew for each chunk +0.1 s of system time per 100 MB in page faults). Otherwise each chunk is copied out."""
    out: list[msgspec.Raw] = []
    mv = memoryview(raw).cast("B")
    base = _address(mv) if len(mv) else 0
    addr = lambda r: _address(r) - base  # noqa: E731
    for i in range(0, len(raws), HEAD_CHUNK):
        part = raws[i:i + HEAD_CHUNK]
        a, b = addr(part[0]), addr(part[-1]) + len(part[-1])
        heads = None
        if not mv.readonly and 1 <= a < b < len(mv) and mv[a - 1] in _GAP and mv[b] in _GAP \
                and mv[a:a + len(part[0])] == part[0] and mv[b - len(part[-1]):b] == part[-1]:
            before, after = mv[a - 1], mv[b]
            mv[a - 1], mv[b] = 0x5B, 0x5D  # [ ... ]
            try:
                with mv[a - 1:b + 1] as view:
                    heads = msgspec.json.decode(view, type=list[_Head])
            finally:
                mv[a - 1], mv[b] = before, after
        if heads is None or len(heads) != len(part):  # not writable, or a stretch holding other values
            heads = _batch(part, _Head)
        out += [r for r, h in zip(part, heads) if h.cat in want]
    return out


_GAP = frozenset(b" \t\r\n,[]")
"""the bytes that may stand between two events of the array (and around it)"""


STRETCH = 1 << 22
"""bytes of the events array the first pass of :func:`decode` reads at a time (:func:`_stretches`)"""
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
"""where the events array may be cut between two events: a ``}``, JSON whitespace and one comma, a ``{``"""
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_TRIES = 4
"""tries at each end: bounds of the events array (:func:`_bounds`), cuts of a stretch (:func:`_stretches`)"""


def _bounds(buf: Any) -> tuple[dict[str, Any], int, int] | None:
    """``(header, lb, rb)``: the offsets of the events array's ``[`` and ``]``, found without reading the events --
    the first ``"traceEvents": [`` and the last ``]`` whose tail, with the start, decodes as the top level -- and
    the header decoded from the file with the array cut out. Trusted only where the file with ``[]`` in place of
    the array decodes with that ``[]`` as its top-level ``traceEvents`` (the events themselves are checked as
    :func:`_stretches` decodes them); a bare array (the format's other variant) is the whole file. None otherwise
    (another layout: the caller splits the file into views instead)."""
    if _first_char(buf) == "[":  # the bare-array variant: no header
        head = bytes(buf[:4096])
        lb, rb = len(head) - len(head.lstrip()), buf.rfind(b"]")
        return ({}, lb, rb) if lb < rb and not bytes(buf[rb + 1:]).strip() else None
    m = _KEY.search(buf)
    if m is None:
        return None
    lb, end = m.end() - 1, len(buf)
    for _ in range(_TRIES):
        rb = buf.rfind(b"]", lb + 1, end)
        if rb < 0:
            return None
        end = rb
        cut = bytes(buf[:lb]) + b"[]" + bytes(buf[rb + 1:])
        try:
            top = msgspec.json.decode(cut, type=dict[str, msgspec.Raw])
        except msgspec.DecodeError:
            continue  # a ']' of the tail: try the one before
        ev = top.pop("traceEvents", None)
        if ev is None or bytes(ev) != b"[]" or _address(ev) - _address(cut) != lb:
            return None
        try:
            return {k: msgspec.json.decode(v) for k, v in top.items()}, lb, rb
        except msgspec.DecodeError:  # pragma: no cover - the top level decoded whole
            return None
    return None


def _stretches(buf: Any, lb: int, rb: int, want: set[str]) -> tuple[int, list[msgspec.Raw]] | None:
    """``(events in the array, raw views of those whose cat is in want)``: the events array ``buf[lb:rb + 1]``
    (:func:`_bounds`) read a stretch of about :data:`STRETCH` bytes at a time, in place, without splitting the
    whole array into one view per event first. Each stretch is cut at a :data:`_CUT` after its first STRETCH
    bytes; the byte before it and the byte after it are set to ``[`` and ``]`` for the calls and put back after
    (as :func:`_select` does). Its ``cat`` values are decoded (:class:`_Head`); only a stretch that holds a wanted
    one is decoded again as raw views, to pick them (a PyTorch trace writes its GPU events together, after the
    CPU ones: most stretches are read once).

    A cut is trusted because its stretch decodes: a stretch starts between two events of the array, so it
    decodes as an array only when the cut is between two events too -- a ``}, {`` inside a string or a nested
    value leaves a string or a bracket open. Such a stretch is cut at the next candidate instead (up to
    :data:`_TRIES` times). None where the stretches do not decode, or the array holds no event: the caller
    takes the split into views (:func:`raw_events`), which says what is wrong with the file."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    if mv.readonly:
        return None
    n, out, a = 0, [], lb
    cat = _CAT
    while a < rb:
        pos = a + STRETCH
        for _ in range(_TRIES):
            m = _CUT.search(mv, pos, rb) if pos < rb else None
            b = m.start() + 1 if m else rb  # the byte after the stretch's last '}' (or the array's ']')
            before, after = mv[a], mv[b]
            mv[a], mv[b] = 0x5B, 0x5D  # [ ... ]
            try:
                view = mv[a:b + 1]  # not released: the views picked below point into it
                heads = msgspec.json.decode(view, type=list[_Head])
                if not want.isdisjoint(map(cat, heads)):
                    raws = msgspec.json.decode(view, type=list[msgspec.Raw])
                    out += [r for r, h in zip(raws, heads) if h.cat in want]
                break
            except msgspec.DecodeError:
                if m is None:
                    return None
                pos = m.end()
            finally:
                mv[a], mv[b] = before, after
        else:
            return None
        n += len(heads)
        a = m.end() - 2 if m else rb  # the byte before the next stretch's first '{'
    return (n, out) if n else None


_CAT = attrgetter("cat")


def decode(path: str | Path, cats: Iterable[str] | None = None,
           chunk: int | None = None) -> tuple[dict[str, Any], int, Iterator[list[Event]]]:
    """``(header, n_events, chunks)``: the file's events as lists of at most ``chunk`` :class:`Event` each.
    Raises TraceError (a malformed event is found when its chunk is decoded, i.e. while iterating).

    Without ``cats`` the events array is first split into one :class:`msgspec.Raw` per event (a view of its
    bytes, ~50 bytes each: msgspec finds the events' bounds); chunks of them are then decoded into structs. Peak memory is the file's bytes + the views + one chunk, not the file + every event's struct.

    ``cats``: only events of these raw categories are decoded, found by a first pass that reads just ``cat``
    (the builder keeps the complete ones, ``ph`` "X") -- for ``kit trace gaps``, which needs the GPU events (5-10%
    of a trace), this halves the decoding time. That pass reads the events array a stretch of bytes at a time
    where it lies (:func:`_bounds`, :func:`_stretches`), without the split into one view per event: on a 154 MB
    trace with stacks and memory events the split and the ``cat`` pass over the views took 0.31 s of CPU, the
    stretches 0.19 s, and the peak holds no view per event; a file whose array is not found that way
    is split into views and read by :func:`_select`. The selected events' bytes are then copied out (one JSON
    array per chunk) and the file's bytes and views are dropped before they are decoded: the rest of the parse
    holds a tenth of the file, not all of it. ``None`` decodes every event."""
    p = Path(path)
    size = chunk or CHUNK
    blobs: list[bytes] | None = None
    if cats is None:
        header, raw, raws = raw_events(p)
        n = len(raws)
    else:
        want = set(cats)
        buf = read_bytes(p)
        bounds = _bounds(buf)
        picked = _stretches(buf, bounds[1], bounds[2], want) if bounds else None
        if picked is not None:
            header, (n, sel), picked = bounds[0], picked, None
        else:  # another layout, or a file with something wrong (which the split into views says)
            header, raw, raws = _raw_events(p, buf)
            n = len(raws)
            try:
                sel = _select(raw, raws, want)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:  # pragma: no cover - validated above
                raise TraceError(f"{p}: not a PyTorch profiler trace (traceEvents: {e})") from None
            del raw, raws
        del buf
        blobs = [_array(sel[i:i + size]) for i in range(0, len(sel), size)]
        del sel  # the views were the last references to the file's bytes

    def chunks() -> Iterator[list[Event]]:
        if blobs is not None:
            while blobs:
                try:
                    yield msgspec.json.decode(blobs.pop(0), type=list[Event])
                except msgspec.ValidationError as e:
                    raise TraceError(f"{p}: not a PyTorch profiler trace (traceEvents: {e})") from None
            return
        for i in range(0, len(raws), size):
            try:
                yield _batch(raws[i:i + size], Event)
            except msgspec.ValidationError as e:
                raise TraceError(f"{p}: not a PyTorch profiler trace (traceEvents[{i}...]: {e})") from None

    return header, n, chunks()


def load(path: str | Path, keep: Keep | None = None) -> dict[str, Any]:
    """The parsed trace as plain Python values, ``{"traceEvents": [event dicts], ...header}`` -- for code that
    writes events back out. ``keep``: a predicate on event dicts. Raises TraceError."""
    p = Path(path)
    buf = read_bytes(p)
    header, raw = _split(p, buf)
    try:
        events = msgspec.json.decode(raw, type=list[dict[str, Any]])
    except msgspec.ValidationError:
        raise TraceError(f"{p}: not a PyTorch profiler trace (trace events are not JSON objects)") from None
    except msgspec.DecodeError as e:
        raise _json_error(p, buf, e) from None
    if not events:
        raise TraceError(f"{p}: no events (traceEvents is empty: was the profiler stopped before its first step?)")
    if keep is not None:
        events = [e for e in events if keep(e)]
    return {**header, "traceEvents": events}
