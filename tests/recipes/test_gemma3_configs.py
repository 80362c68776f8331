"""The shipped Gemma 3 configs: model builder, checkpointer model_type, tokenizer and the folder they
read belong together, and their headers give the download command for that folder and the estimate."""

import re

import pytest
from omegaconf import OmegaConf

from torchtune import _recipe_registry as registry

CONFIGS = {
    "gemma3/1B_full_single_device": ("gemma3_1b", "google/gemma-3-1b-it"),
    "gemma3/4B_full_single_device": ("gemma3_4b", "google/gemma-3-4b-it"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_model_tokenizer_and_checkpointer_belong_together(name):
    builder, repo = CONFIGS[name]
    path = registry.get_config(name).path
    cfg = OmegaConf.load(path)
    assert cfg.model._component_ == f"torchtune.models.gemma3.{builder}"
    assert cfg.checkpointer.model_type == "GEMMA3"
    assert cfg.tokenizer._component_ == "torchtune.models.gemma3.gemma3_tokenizer"
    assert cfg.tokenizer.path == f"{cfg.checkpointer.checkpoint_dir}/tokenizer.json"
    header = path.read_text()
    assert f"tune download {repo} --output-dir {cfg.checkpointer.checkpoint_dir} " in header
    assert re.search(r"([\d.]+) GB at 512 tokens,\s*#?\s*([\d.]+) GB at 2048", header), "estimate figures"
    assert "16 GB" in header.split("\n\n")[0]
