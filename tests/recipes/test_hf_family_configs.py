"""The shipped Qwen3 / Qwen2.5 / Mistral / Phi-4 configs: model, tokenizer and checkpointer belong to one
family (its registration), the header's download command fills checkpoint_dir, and the header states what
`tune estimate-memory` prints."""

import re
import subprocess

import pytest
from omegaconf import OmegaConf

from tests._helpers.estimate_memory import printed
from tests._helpers.tiny_run import REPO_ROOT, TUNE
from torchtune import _recipe_registry as registry
from torchtune.models._hf_family import canonical_model_type, families

SIZED = [
    "qwen3/0.6B_full_single_device",
    "qwen3/1.7B_full_single_device",
    "qwen3/4B_full_single_device",
    "qwen2_5/0.5B_full_single_device",
    "qwen2_5/1.5B_full_single_device",
    "qwen2_5/3B_full_single_device",
    "phi4/mini_full_single_device",
]
# Their headers' per-GPU figures are checked by tests/recipes/test_distributed_configs.py.
DISTRIBUTED = [
    "qwen3/8B_full",
    "qwen3/14B_full",
    "qwen3/32B_full",
    "qwen2_5/7B_full",
    "qwen2_5/14B_full",
    "qwen2_5/32B_full",
    "mistral/7B_full",
    "phi4/14B_full",
]
TINY = ["qwen3/tiny_full", "qwen2_5/tiny_full", "mistral/tiny_full", "phi4/tiny_full"]
# The estimate runs take 10-20 s each on a quiet machine: two configs, one per optimizer kind.
ESTIMATED = ["qwen3/0.6B_full_single_device", "qwen3/4B_full_single_device"]
_STATED = re.compile(r"batch \d+: ([\d.]+) GB at 512 tokens")


@pytest.mark.parametrize("name", SIZED + DISTRIBUTED + TINY)
def test_model_tokenizer_and_checkpointer_belong_together(name):
    text = registry.get_config(name).path.read_text()
    cfg = OmegaConf.load(registry.get_config(name).path)
    family = name.split("/")[0]
    assert cfg.model._component_.startswith(f"torchtune.models.{family}.")
    assert cfg.tokenizer._component_ == f"torchtune.models.{family}.{family}_tokenizer"
    assert cfg.tokenizer.path == f"{cfg.checkpointer.checkpoint_dir}/tokenizer.json"
    registered = families()[canonical_model_type(cfg.checkpointer.model_type)]
    assert registered.builder.startswith(f"torchtune.models.{family}.")
    if name in SIZED + DISTRIBUTED:
        assert re.search(rf"--output-dir {cfg.checkpointer.checkpoint_dir}( --|\n)", text), "download command"
    if name in SIZED:
        assert _STATED.search(text.replace("\n#", "")), f"{name}: no estimate in the header"


def test_tune_ls_lists_them():
    out = subprocess.run([TUNE, "ls"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in SIZED + DISTRIBUTED + TINY:
        assert name in out.stdout


@pytest.mark.parametrize("name", ESTIMATED)
def test_header_states_the_estimate(name):
    """The header's figure at 512 tokens, as printed (in this process, once per session: the docs figure
    test, tests/test_memory_figures.py, runs the same command)."""
    stdout = printed(f"tune estimate-memory --config {name} --seq-len 512 --steps-only")
    header = registry.get_config(name).path.read_text()
    stated = _STATED.search(header.replace("\n#", "")).group(1)
    total = re.search(r"total \(device peak\)\s+([\d.]+) GB", stdout).group(1)
    assert stated == total, f"{name}: header says {stated} GB, the tool {total} GB"
