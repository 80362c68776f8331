"""The ``profiler`` key: torchtune's ``setup_torch_profiler`` node, built when ``enabled``, stepped once per
optimizer step by the recipes."""

from __future__ import annotations

from typing import Any

from torchtune import config


class NoProfiler:
    """What a recipe holds when nothing is profiled: a context manager whose ``step`` does nothing."""

    def __enter__(self) -> "NoProfiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def step(self) -> None:
        """Nothing to record."""


def build_profiler(node: Any) -> Any:
    """The profiler of the ``profiler`` node: ``NoProfiler`` when it is null or ``enabled: False``, else
    the object its ``_component_`` builds (torchtune's ``setup_torch_profiler`` returns ``(profiler, cfg)``:
    the profiler is kept). The recipe enters it around training and calls ``step()`` after each step."""
    if node is None or not node.get("enabled", True):
        return NoProfiler()
    built = config.instantiate(node)
    return built[0] if isinstance(built, tuple) else built
