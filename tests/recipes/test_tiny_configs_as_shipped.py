"""Every family's tiny config runs from the repository as shipped, with nothing made first: its model folder,
tokenizer and data ship in torchtune/assets (scripts/make_tiny_family_assets.py made the families' folders).
Two steps each, on CPU, in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests._helpers.tiny_run import read_losses, run_recipe
from torchtune import _recipe_registry as registry
from torchtune import config

TINY = sorted(c.name for r in registry.get_all_recipes() for c in r.configs if c.name.endswith("/tiny_full"))


def test_every_family_has_a_tiny_config():
    assert {name.split("/")[0] for name in TINY} == {"llama2", "gemma3", "qwen3", "qwen2_5", "mistral", "phi4"}


@pytest.mark.parametrize("name", TINY)
def test_the_tiny_config_runs_as_shipped(name, tmp_path):
    raw = OmegaConf.to_container(OmegaConf.load(registry.get_config(name).path), resolve=False)
    for node, key in (("tokenizer", "path"), ("checkpointer", "checkpoint_dir"), ("dataset", "data_files")):
        assert str(raw[node][key]).startswith("${asset:"), f"{name}: {node}.{key} is not a bundled file"
    cfg = config.load_config(name)
    hf_config = json.loads((Path(cfg.checkpointer.checkpoint_dir) / "config.json").read_text())
    assert hf_config["vocab_size"] == cfg.model.vocab_size  # Gemma 3's was 512 for a 656-token tokenizer
    out = tmp_path / "out"
    run_recipe(cfg, output_dir=str(out), epochs=1, max_steps_per_epoch=2, save_every_n_steps=None)
    losses = read_losses(out)
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses), losses
    assert list((out / "epoch_0").glob("*.safetensors")), sorted(p.name for p in (out / "epoch_0").iterdir())
