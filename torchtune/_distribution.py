"""The distribution's own name, the pip commands that install what is missing, and the one other
library this one must not share an environment with.

The distribution is ``plaintune``; its import packages are ``torchtune`` and ``recipes`` and its
command is ``tune``. PyTorch's torchtune is published as ``torchtune`` and installs the same import
package and the same ``tune`` command, so whichever is installed second overwrites files of the first.
This module is cheap to import (no torch): ``tune`` checks for the other install on every start.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Optional

DISTRIBUTION = "plaintune"
# The distribution name of PyTorch's torchtune (and of this project before it was renamed).
PYTORCH_TORCHTUNE = "torchtune"

# Import names whose pip package is spelled differently; any other module installs under its own name.
_PIP_NAMES = {
    "yaml": "PyYAML",
    "lm_eval": "lm-eval",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "google": "protobuf",
}


def pip_name(module: str) -> str:
    """The pip package that provides the import ``module`` (``yaml.constructor`` -> ``PyYAML``)."""
    top = module.split(".")[0]
    return _PIP_NAMES.get(top, top)


def install_hint(module: str) -> str:
    """The command that installs the package providing ``module``, e.g. ``pip install bitsandbytes``."""
    return f"pip install {pip_name(module)}"


def _is_build_leftover(dist: importlib.metadata.Distribution) -> bool:
    """True for ``torchtune.egg-info`` in this source tree: what setuptools left when the project was
    still called torchtune. It is found only because the checkout's root is on ``sys.path``."""
    path = getattr(dist, "_path", None)  # the metadata folder; not public, hence the care
    if path is None or not str(path).endswith(".egg-info"):
        return False
    return Path(str(path)).resolve().parent == Path(__file__).resolve().parent.parent


def other_torchtune() -> Optional[importlib.metadata.Distribution]:
    """A distribution called ``torchtune`` installed in this environment (PyTorch's torchtune), or None."""
    for dist in importlib.metadata.distributions(name=PYTORCH_TORCHTUNE):
        if not _is_build_leftover(dist):
            return dist
    return None


def conflict_message(dist: importlib.metadata.Distribution) -> str:
    """Why another ``torchtune`` distribution next to this one is a problem, and what to do."""
    location = ""
    try:
        location = f" (metadata in {Path(str(dist.locate_file(''))).resolve()})"
    except Exception:  # a distribution type without files on disk
        pass
    return (
        f"Warning: the distribution '{PYTORCH_TORCHTUNE}' {dist.version} is installed in this Python environment"
        f"{location} next to {DISTRIBUTION}. That is PyTorch's torchtune (or an install of {DISTRIBUTION} from "
        f"before it was renamed): it provides the same import package 'torchtune' and the same 'tune' command, "
        f"so one overwrites the other's files and `tune` may run either. Keep them in separate virtual "
        f"environments: here, run `{Path(sys.executable).name} -m pip uninstall {PYTORCH_TORCHTUNE}` and then "
        f"reinstall {DISTRIBUTION} (`make setup` in a checkout)."
    )


def warn_if_other_torchtune() -> bool:
    """Print ``conflict_message`` to stderr when PyTorch's torchtune is installed here; True if it is."""
    dist = other_torchtune()
    if dist is None:
        return False
    from torchtune._errors import format_message

    print(format_message(conflict_message(dist)), file=sys.stderr)
    return True
