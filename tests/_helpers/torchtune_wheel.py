"""torchtune 0.6.1's full-finetune configs, read from its published wheel (never installed, never committed).

``make setup`` downloads the wheel without its dependencies into ``<venv>/peer-wheels`` (``pip download
--no-deps torchtune==0.6.1``); the configs are the wheel's ``recipes/configs/<name>.yaml`` files, as torchtune
ships them. A missing wheel fails the tests that need it, with the command that gets it.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Dict

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.6.1"

# torchtune 0.6.1's full-finetune configs of the families this library ships, with the recipe each names in
# its launch line (DPO, PPO and QAT configs of these families are out of scope: docs/torchtune.md).
SINGLE_DEVICE = (
    "llama2/7B_full_low_memory",
    "llama3/8B_full_single_device",
    "llama3_1/8B_full_single_device",
    "llama3_2/1B_full_single_device",
    "llama3_2/3B_full_single_device",
    "mistral/7B_full_low_memory",
    "phi3/mini_full_low_memory",
    "phi4/14B_full_low_memory",
    "qwen2/0.5B_full_single_device",
    "qwen2/1.5B_full_single_device",
    "qwen2/7B_full_single_device",
    "qwen2_5/0.5B_full_single_device",
    "qwen2_5/1.5B_full_single_device",
    "qwen2_5/3B_full_single_device",
    "qwen2_5/7B_full_single_device",
)
DISTRIBUTED = (
    "gemma/2B_full",
    "gemma/7B_full",
    "gemma2/2B_full",
    "gemma2/9B_full",
    "gemma2/27B_full",
    "llama2/7B_full",
    "llama2/13B_full",
    "llama3/8B_full",
    "llama3/70B_full",
    "llama3_1/8B_full",
    "llama3_1/70B_full",
    "llama3_2/1B_full",
    "llama3_2/3B_full",
    "mistral/7B_full",
    "phi3/mini_full",
    "phi4/14B_full",
    "qwen2/0.5B_full",
    "qwen2/1.5B_full",
    "qwen2/7B_full",
    "qwen2_5/0.5B_full",
    "qwen2_5/1.5B_full",
    "qwen2_5/3B_full",
    "qwen2_5/7B_full",
)
CONFIGS: Dict[str, str] = {
    **{name: "full_finetune_single_device" for name in SINGLE_DEVICE},
    **{name: "full_finetune_distributed" for name in DISTRIBUTED},
}


def wheel_path() -> Path:
    """The torchtune wheel: ``$TORCHTUNE_WHEEL``, or the one ``make setup`` put beside this Python's venv."""
    if os.environ.get("TORCHTUNE_WHEEL"):
        return Path(os.environ["TORCHTUNE_WHEEL"])
    for folder in (Path(sys.prefix) / "peer-wheels", REPO / ".venv" / "peer-wheels"):
        found = sorted(folder.glob(f"torchtune-{VERSION}-*.whl"))
        if found:
            return found[0]
    pytest.fail(
        f"torchtune {VERSION}'s wheel is not in {Path(sys.prefix) / 'peer-wheels'}: the tests read torchtune's configs "
        f"from it. Run `make setup`, or: {sys.executable} -m pip download --no-deps torchtune=={VERSION} "
        f"-d {Path(sys.prefix) / 'peer-wheels'} (or set TORCHTUNE_WHEEL to the wheel's path)."
    )


def extract_configs(folder: Path) -> Dict[str, Path]:
    """Write the ``CONFIGS`` files of the wheel under ``folder`` (``folder/llama2/7B_full.yaml`` ...), as shipped."""
    paths = {}
    with zipfile.ZipFile(wheel_path()) as wheel:
        for name in CONFIGS:
            path = folder / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(wheel.read(f"recipes/configs/{name}.yaml"))
            paths[name] = path
    return paths
