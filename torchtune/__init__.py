"""A fine-tuning library for large language models in plain PyTorch.

Importing the package has no side effects: nothing is downloaded, no global state is changed, and
optional dependencies (bitsandbytes, torchao, matplotlib, tensorboard) are imported only where used.
"""

from torchtune._errors import ConfigError, TuneError, UsageError

__version__ = "0.1.0"

__all__ = ["ConfigError", "TuneError", "UsageError", "__version__"]
