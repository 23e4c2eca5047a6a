"""NCCL's own events next to Kineto: build NCCL's profiler plugin, turn it on for traced steps, read its dumps,
align them with the Kineto trace of the same rank.

* :mod:`.plugin`  -- build the example plugin of an NCCL checkout into a cache dir (``kit nccl-profiler build``)
* :mod:`.runtime` -- the launch environment, and ``start``/``stop`` around the traced steps inside a rank
* :mod:`.dump`    -- the plugin's dump (Chrome async events, not strict JSON) -> one row per event
* :mod:`.align`   -- its clocks -> the Kineto trace's clock of the same rank, with the residual error
"""

from .plugin import Plugin, PluginError, build, find

__all__ = ["Plugin", "PluginError", "build", "find"]
