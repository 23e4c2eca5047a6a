"""The registry of transports: ``@register("name")`` on a :class:`~kit.transports.base.Transport` subclass adds
it; :func:`make` builds one by name on every rank; :func:`names` lists them; :func:`capabilities` tells what
one can do without building it (for analyses and config checks).

Adding a transport is one class and one ``@register`` line; the module that holds it must be imported before
:func:`make` is asked for it (the built-in ones are imported by :mod:`kit.transports`).
"""

from __future__ import annotations

import inspect
from typing import Callable

from .base import Capabilities, Transport, TransportUnavailable

_REGISTRY: dict[str, type[Transport]] = {}


def register(name: str) -> Callable[[type[Transport]], type[Transport]]:
    """Class decorator: register a Transport subclass under ``name`` (and set its ``name``)."""

    def add(cls: type[Transport]) -> type[Transport]:
        if not (isinstance(cls, type) and issubclass(cls, Transport)):
            raise TypeError(f"@register({name!r}) needs a Transport subclass, got {cls!r}")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"transport {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def names() -> list[str]:
    """Registered transport names, in registration order."""
    return list(_REGISTRY)


def get(name: str) -> type[Transport]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown transport {name!r}; choose from {names()}")
    return _REGISTRY[name]


def capabilities(name: str) -> Capabilities | None:
    """The capabilities of transport ``name`` (None when no transport has that name, e.g. a reference row)."""
    cls = _REGISTRY.get(name)
    return cls.caps if cls is not None else None


def _accepts(cls: type, key: str) -> bool:
    params = inspect.signature(cls.__init__).parameters
    return key in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def make(name: str, ctx, timeout_s: float = 300.0, **options) -> Transport:
    """The transport ``name`` for this rank. Collective: call on every rank in the same order.

    ``options`` are keyword arguments for the transports that take them (e.g. ``slots`` for ``ipc``); a
    transport whose constructor does not take one ignores it, an option no registered transport takes is an
    error. Raises :class:`TransportUnavailable` -- on every rank alike, with the first reason any rank found --
    when it cannot run here: first the checks its capabilities imply (:meth:`Transport.unavailable`), then its
    constructor's own (which may run collectives: every rank reaches it or none does).
    """
    cls = get(name)
    unknown = [k for k in options if not any(_accepts(c, k) for c in _REGISTRY.values())]
    if unknown:
        raise TypeError(f"no transport takes option(s) {unknown}")
    _agree(ctx, across_nodes(cls, ctx) or _reason(lambda: cls.unavailable(ctx)))
    made: list[Transport] = []
    why = _reason(lambda: made.append(cls(ctx, timeout_s, **{k: v for k, v in options.items() if _accepts(cls, k)})))
    try:
        _agree(ctx, why)
    except TransportUnavailable:
        for t in made:
            t.close()
        raise
    return made[0]


def across_nodes(cls: type[Transport], ctx) -> str | None:
    """Collective: why ``cls`` cannot join these ranks because they are on more than one node (None: it can).
    Asks the capability ``cross_node``, never the name. Nodes are told apart as NCCL does
    (:func:`kit.launch.node.node_id`: ``NCCL_HOSTID``, else the host name), so emulated nodes count as nodes."""
    if cls.caps.cross_node or ctx.world_size < 2:
        return None
    import torch.distributed as dist

    from ..launch.node import node_id

    nodes: list = [None] * ctx.world_size
    dist.all_gather_object(nodes, node_id())
    distinct = list(dict.fromkeys(nodes))
    if len(distinct) < 2:
        return None
    where = "; ".join(f"{n}: ranks {[r for r, m in enumerate(nodes) if m == n]}" for n in distinct)
    reach = "the peer GPU in its own process" if cls.caps.in_process else "the peer process on the same host"
    if cls.caps.copy_engine:
        reach += " (its copy engines write memory of a GPU this process can address)"
    return (f"{cls.name} cannot cross nodes: it needs {reach}, and these ranks are on "
            f"{len(distinct)} nodes ({where}); across nodes only transports with cross_node "
            f"({', '.join(n for n, c in _REGISTRY.items() if c.caps.cross_node)}) reach the peer")


def _reason(fn: Callable[[], str | None | object]) -> str | None:
    try:
        out = fn()
    except TransportUnavailable as e:
        return str(e)
    return out if isinstance(out, str) else None


def _agree(ctx, why: str | None) -> None:
    """Raise TransportUnavailable on every rank if any rank has a reason."""
    if ctx.world_size > 1:
        import torch.distributed as dist

        every: list = [None] * ctx.world_size
        dist.all_gather_object(every, why)
        why = next((w for w in every if w), None)
    if why:
        raise TransportUnavailable(why)
