"""The torch version a feature needs."""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion


def torch_version_ge(version: str) -> bool:
    """True when the installed torch is ``version`` or newer (``"2.4"``, ``"2.5.0.dev20240801"``).

    Compared as versions, so torch 2.13 is newer than 2.4 (torchtune 0.6.1 compares the strings, which says it
    is not).
    """
    return TorchVersion(torch.__version__) >= version
