"""The sample transform protocol: a callable from a sample dict to a sample dict."""

from typing import Any, Mapping, Protocol


class Transform(Protocol):
    """Anything that takes one sample (a mapping) and returns it transformed: the message transforms of
    ``torchtune.data`` (``{"messages": ...}`` out) and the model tokenizers (``tokens`` / ``mask`` out)."""

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        """The transformed sample."""
        ...
