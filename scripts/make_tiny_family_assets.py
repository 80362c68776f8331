"""Write the model folders the families' tiny configs read (``recipes/configs/<family>/tiny_full.yaml``) into
``torchtune/assets/tiny_<family>/``, so that each runs from a fresh clone with nothing to make first.

Each folder is a Hugging Face model folder in the sizes of its config, made by the same functions the tests
use (``tests/_helpers/hf_tiny_run.py``, ``tests/_helpers/tiny_gemma3_run.py``):

- ``config.json`` and ``model.safetensors``: random weights (seed 0) as transformers initialises them (Qwen3,
  Qwen2.5, Mistral, Phi-4) or ``gemma3_tiny``'s with values from N(0, 0.02), stored in bf16 to halve the
  bytes (the recipe casts them to the config's ``dtype``);
- ``tokenizer.json``, ``tokenizer_config.json`` (and the chat template): a tokenizer of the family's kind
  trained on a few sentences (``tests/_helpers/hf_tokenizers.py``, ``tests/_helpers/gemma3_tokenizer.py``);
- ``chats.jsonl`` (not for Gemma 3, whose config trains on the demo's Alpaca data): 16 short chats.

The models are untrained: the configs show that a family loads, trains, saves and resumes, not what it learns.
Needs the dev extras (transformers, tokenizers). From the repository root::

    .venv/bin/python scripts/make_tiny_family_assets.py            # every family, a few seconds
    .venv/bin/python scripts/make_tiny_family_assets.py qwen3      # one
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._helpers.hf_tiny_run import HF_CLASSES, make_tiny_family_folder  # noqa: E402
from tests._helpers.tiny_gemma3_run import make_tiny_gemma3_folder  # noqa: E402

FAMILIES = (*HF_CLASSES, "gemma3")
ASSETS = ROOT / "torchtune" / "assets"


def make(family: str) -> Path:
    """Write ``torchtune/assets/tiny_<family>/`` anew; returns it."""
    folder = ASSETS / f"tiny_{family}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if family == "gemma3":
        make_tiny_gemma3_folder(folder, dtype=torch.bfloat16)
    else:
        make_tiny_family_folder(folder, family, dtype=torch.bfloat16)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("families", nargs="*", metavar="FAMILY", help=f"some of {', '.join(FAMILIES)} (default: all)")
    families = parser.parse_args().families or FAMILIES
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}: choose from {', '.join(FAMILIES)}")
    for family in families:
        folder = make(family)
        files = sorted(p for p in folder.iterdir() if p.is_file())
        print(f"{folder.relative_to(ROOT)}: {sum(p.stat().st_size for p in files):,} bytes in {len(files)} files")


if __name__ == "__main__":
    main()
