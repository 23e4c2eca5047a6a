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


def graph_census(dot_text: str) -> dict[str, int]:
    """Count node types in a DOT dump. Kernels are split into ``KERNEL:nccl`` and ``KERNEL:other``; ``edges``
    counts dependencies. An empty or foreign text gives ``{"edges": 0}``."""
    counts: dict[str, int] = {}
    for m in _NODE.finditer(dot_text or ""):
        lab = _LABEL.search(m.group(2))
        text = lab.group(1) if lab else m.group(2)
        t = _TYPE.search(text)
        kind = t.group(1) if t else "UNKNOWN"
        if kind == "KERNEL":
            kind = "KERNEL:nccl" if "nccl" in text.lower() else "KERNEL:other"
        counts[kind] = counts.get(kind, 0) + 1
    counts["edges"] = len(re.findall(r"->", dot_text or ""))
    return counts
