"""What a captured CUDA graph contains: node types counted from a ``cudaGraphDebugDotPrint`` dump
(``torch.cuda.CUDAGraph.debug_dump``) -- the structural evidence of what NCCL inserts into a graph
(event record/wait nodes with ``NCCL_GRAPH_MIXING_SUPPORT=1``)."""

from __future__ import annotations

import re

NODE_TYPES = ("KERNEL", "MEMCPY", "MEMSET", "HOST", "GRAPH", "EMPTY", "EVENT_WAIT", "EVENT_RECORD",
              "EXT_SEMAS_SIGNAL", "EXT_SEMAS_WAIT", "MEM_ALLOC", "MEM_FREE", "BATCH_MEM_OP", "CONDITIONAL")
_NODE = re.compile(r'^"(graph_\d+_node_\d+)"\[(.*?)\];\s*$', re.DOTALL | re.MULTILINE)
_LABEL = re.compile(r'label="(.*)"', re.DOTALL)
_TYPE = re.compile(r"\b(" + "|".join(sorted(NODE_TYPES, key=len, reverse=True)) + r")\b")


def node_types(dot_text: str) -> dict[str, str]:
    """Node id -> type (``KERNEL:nccl``, ``KERNEL:other``, ``EVENT_RECORD``, ...) of a DOT dump."""
    out = {}
    for m in _NODE.finditer(dot_text or ""):
        lab = _LABEL.search(m.group(2))
        text = lab.group(1) if lab else m.group(2)
        t = _TYPE.search(text)
        kind = t.group(1) if t else "UNKNOWN"
        if kind == "KERNEL":
            kind = "KERNEL:nccl" if "nccl" in text.lower() else "KERNEL:other"
        out[m.group(1)] = kind
    return out


_EDGE = re.compile(r'^"(graph_\d+_node_\d+)"\s*->\s*"(graph_\d+_node_\d+)"', re.MULTILINE)


def graph_edges(dot_text: str) -> list[dict[str, object]]:
    """The dependency edges of a DOT dump in graph order: ``src``, ``dst`` (node numbers) and their types --
    e.g. ``EVENT_RECORD -> KERNEL:nccl``: an NCCL kernel that waits for an event-record node. [] for a foreign
    or empty text."""
    types = node_types(dot_text)

    def num(node: str) -> int:
        return int(node.rsplit("_", 1)[1])

    return [{"src": num(a), "dst": num(b), "src_type": types.get(a, "UNKNOWN"), "dst_type": types.get(b, "UNKNOWN")}
            for a, b in _EDGE.findall(dot_text or "")]


def graph_census(dot_text: str) -> dict[str, int]:
    """Count node types in a DOT dump. Kernels are split into ``KERNEL:nccl`` and ``KERNEL:other``; ``edges``
    counts dependencies. An empty or foreign text gives ``{"edges": 0}``."""
    counts: dict[str, int] = {}
    for kind in node_types(dot_text).values():
        counts[kind] = counts.get(kind, 0) + 1
    counts["edges"] = len(re.findall(r"->", dot_text or ""))
    return counts
