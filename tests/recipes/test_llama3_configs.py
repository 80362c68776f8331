"""The shipped Llama 3.x configs: their header's memory figure is what `tune estimate-memory` prints, and
their model, tokenizer and checkpointer belong together."""

import re

import pytest
from omegaconf import OmegaConf

from tests._helpers.estimate_memory import printed
from torchtune import _recipe_registry as registry

# config -> the header's phrase stating the estimate at 512 tokens
CONFIGS = {
    "llama3_2/1B_full_single_device": r"batch 4: ([\d.]+) GB at 512 tokens",
    "llama3_2/3B_full_single_device": r"shipped \(torch AdamW in backward\): ([\d.]+) GB at 512 tokens",
    "llama3_1/8B_full_low_memory": r"shipped \(PagedAdamW8bit\): ([\d.]+) GB at 512 tokens",
}


def _estimate(name):
    """`tune estimate-memory --seq-len 512 --steps-only`, run in this process once per session (the docs
    figure test runs the same command: tests/test_memory_figures.py)."""
    stdout = printed(f"tune estimate-memory --config {name} --seq-len 512 --steps-only")
    return {
        "total": re.search(r"total \(device peak\)\s+([\d.]+) GB", stdout).group(1),
        "weights": re.search(r"^\s*weights\s+([\d.]+) GB", stdout, re.M).group(1),
    }


@pytest.mark.parametrize("name", CONFIGS)
def test_header_states_the_estimate(name):
    estimates = {name: _estimate(name)}
    header = registry.get_config(name).path.read_text()
    stated = re.search(CONFIGS[name], header.replace("\n#", "")).group(1)
    # as printed, to the last digit: a header 0.01 GB off has gone stale
    assert stated == estimates[name]["total"], f"{name}: header says {stated} GB, the tool {estimates[name]}"
    weights = re.search(r"weights alone take ([\d.]+) GB", header.replace("\n#", ""))
    if weights is not None:
        assert weights.group(1) == estimates[name]["weights"], f"{name}: header says weights {weights.group(1)} GB"


@pytest.mark.parametrize("name", CONFIGS)
def test_model_tokenizer_and_checkpointer_belong_together(name):
    cfg = OmegaConf.load(registry.get_config(name).path)
    tied = name.startswith("llama3_2")
    assert cfg.model._component_.startswith("torchtune.models.llama3_2." if tied else "torchtune.models.llama3_1.")
    assert cfg.checkpointer.model_type == ("LLAMA3_2" if tied else "LLAMA3")
    assert cfg.tokenizer._component_ == "torchtune.models.llama3.llama3_tokenizer"
    assert cfg.tokenizer.path == f"{cfg.checkpointer.checkpoint_dir}/original/tokenizer.model"
    assert f"--output-dir {cfg.checkpointer.checkpoint_dir} " in registry.get_config(name).path.read_text()
