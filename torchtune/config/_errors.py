"""The config errors at torchtune's path: ``ConfigError`` (every problem ``config.validate`` finds, in
``errors``) and ``InstantiationError`` (a ``_component_`` that cannot be imported or built)."""

from torchtune._errors import ConfigError


class InstantiationError(ConfigError):
    """A ``_component_`` path that does not import, or a node that is not a component."""


__all__ = ["ConfigError", "InstantiationError"]
