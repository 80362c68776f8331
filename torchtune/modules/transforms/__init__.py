"""Sample transforms (torchtune's ``torchtune.modules.transforms``): the ``Transform`` protocol, and under
``tokenizers`` the tokenizer protocols and base tokenizers. The vision transforms of torchtune's multimodal
models are not part of this library."""

from torchtune.modules.transforms._transforms import Transform

__all__ = ["Transform"]
