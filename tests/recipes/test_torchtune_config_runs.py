"""torchtune 0.6.1's full-finetune configs, as torchtune ships them, run by `tune run` for two steps on tiny
models (tests/_helpers/torchtune_tiny.py: only the user's paths, the model's sizes and device=cpu are
overridden), and each gives the losses of the same job run with this library's own config.

"Our config for that job" is the shipped config of the same family and recipe (OURS), with the choices in
which the two configs differ set to torchtune's (ALIGNED: optimizer, LR schedule, batch, precision,
tokenizer and dataset nodes ...; a key torchtune's config leaves out takes FINETUNE_DEFAULTS). What is not
aligned, and so checked by the equal losses: torchtune's loss component (CEWithChunkedOutputLoss) against
ours, its checkpointer and metric logger nodes, its profiler node, the keys its configs leave out (filled
with this library's defaults), the model builders it names, its launch line and its batch_size per process.

Which run: the 15 single-device configs, each (in this process, through `tune`'s own entry point); of the
23 distributed ones a sample of two on 2 gloo processes -- llama2/7B_full (the plain one) and
llama3_1/70B_full (torchtune's parallelism keys, fsdp_cpu_offload, a checkpoint_files mapping) -- since each
multi-process pair costs about a minute on 2 cores. The other 21 distributed configs are checked by
`tune validate` (test_torchtune_configs.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest
from omegaconf import OmegaConf

from tests._helpers.tiny_run import read_losses, run_tune
from tests._helpers.torchtune_tiny import family_of, run_overrides
from tests._helpers.torchtune_wheel import CONFIGS, SINGLE_DEVICE, extract_configs

# The shipped config of each family for each recipe (the model is swapped for the tiny one on both sides).
OURS = {
    "llama2": ("llama2/7B_full_low_memory", "llama2/7B_full"),
    "llama3": ("llama3_1/8B_full_low_memory", "llama3_1/8B_full"),
    "llama3_1": ("llama3_1/8B_full_low_memory", "llama3_1/8B_full"),
    "llama3_2": ("llama3_2/1B_full_single_device", "llama3_1/8B_full"),
    "mistral": ("mistral/tiny_full", "mistral/7B_full"),
    "phi3": ("phi4/mini_full_single_device", "phi4/14B_full"),
    "phi4": ("phi4/mini_full_single_device", "phi4/14B_full"),
    "qwen2": ("qwen2_5/0.5B_full_single_device", "qwen2_5/7B_full"),
    "qwen2_5": ("qwen2_5/0.5B_full_single_device", "qwen2_5/7B_full"),
    "gemma": ("gemma3/1B_full_single_device", "gemma3/12B_full"),
    "gemma2": ("gemma3/1B_full_single_device", "gemma3/12B_full"),
}
# The choices set to torchtune's on our side (nodes whole).
ALIGNED = (
    "tokenizer",
    "dataset",
    "loss",  # ours for Gemma 2 is Gemma 3's config, whose chunked loss has no logit soft-cap
    "checkpointer.model_type",
    "optimizer",
    "optimizer_in_bwd",
    "lr_scheduler",
    "batch_size",
    "gradient_accumulation_steps",
    "clip_grad_norm",
    "enable_activation_checkpointing",
    "enable_activation_offloading",
    "dtype",
    "compile",
    "shuffle",
    "seed",
    "bf16_stochastic_rounding",
)
# Every distributed config of torchtune 0.6.1, two steps on 2 gloo processes each (about 12 s a config).
DISTRIBUTED = tuple(name for name in CONFIGS if name not in SINGLE_DEVICE)


@pytest.fixture(scope="module")
def torchtune_configs(tmp_path_factory):
    return extract_configs(tmp_path_factory.mktemp("torchtune_configs"))


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_families")


def _value(cfg, key: str):
    from torchtune.training import FINETUNE_DEFAULTS

    node = OmegaConf.select(cfg, key, default=FINETUNE_DEFAULTS.get(key))
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _ours(name: str, theirs, ours_name: str) -> List[str]:
    """Overrides that set, in our config for the job, the choices of torchtune's config (ALIGNED)."""
    from torchtune.config import load_config

    ours = load_config(ours_name)
    overrides = []
    for key in ALIGNED:
        value = _value(theirs, key)
        if value != _value(ours, key):
            overrides.append(f"{key}={json.dumps(value)}")  # JSON is YAML: nodes go whole
    return overrides


def _run(recipe: str, config: str, overrides: List[str], nproc: int = 1) -> None:
    args = ["run", *(["--nproc_per_node", str(nproc)] if nproc > 1 else []), recipe, "--config", config, *overrides]
    if nproc > 1:
        result = run_tune(args, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        return
    from torchtune._cli.tune import main

    assert main(args) == 0


def _pair(name: str, torchtune_configs: Dict[str, Path], kits: Path, tmp_path: Path, nproc: int = 1):
    from torchtune.config import load_config

    recipe = CONFIGS[name]
    path = str(torchtune_configs[name])
    theirs_overrides = run_overrides(name, load_config(path), kits, tmp_path / "theirs")
    theirs = load_config(path, theirs_overrides)
    single, distributed = OURS[family_of(name)]
    ours_name = single if recipe == "full_finetune_single_device" else distributed
    # our config reads the same tiny weights with its own checkpointer (Meta's consolidated.00.pth or the HF folder)
    ours_overrides = run_overrides(name, load_config(ours_name), kits, tmp_path / "ours") + _ours(
        name, theirs, ours_name
    )
    _run(recipe, path, theirs_overrides, nproc)
    _run(recipe, ours_name, ours_overrides, nproc)
    return read_losses(tmp_path / "theirs"), read_losses(tmp_path / "ours")


@pytest.mark.parametrize("name", SINGLE_DEVICE)
def test_single_device_config_runs_as_our_config_for_that_job(name, torchtune_configs, kits, tmp_path):
    theirs, ours = _pair(name, torchtune_configs, kits, tmp_path)
    assert len(theirs) == 2
    assert theirs == pytest.approx(ours, abs=1e-5, rel=0)


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_distributed_config_runs_on_two_processes_as_our_config_for_that_job(name, torchtune_configs, kits, tmp_path):
    theirs, ours = _pair(name, torchtune_configs, kits, tmp_path, nproc=2)
    assert len(theirs) == 2
    assert theirs == pytest.approx(ours, abs=1e-5, rel=0)
