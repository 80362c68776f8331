"""torchtune.training's resume: one function says what to load and from where, or why it cannot."""

import json
import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

from torchtune import ConfigError, TuneError, training
from torchtune.models.llama2 import llama2_tiny, tune_to_hf
from torchtune.training import FullModelHFCheckpointer

HEADS, KV_HEADS, DIM = 4, 2, 64  # llama2_tiny
SETTINGS = training.RunSettings(
    optimizer_in_bwd=True, batch_size=4, gradient_accumulation_steps=1, seed=7, max_steps_per_epoch=None, epochs=2
)


@pytest.fixture
def saved(tmp_path) -> Path:
    """A resumable step_5 folder written the way the recipe writes one."""
    base = tmp_path / "base"
    base.mkdir()
    torch.manual_seed(0)
    model = llama2_tiny()
    save_file(
        tune_to_hf(model.state_dict(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM), base / "model.safetensors"
    )
    (base / "config.json").write_text(
        json.dumps({"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "hidden_size": DIM})
    )
    optimizer = training.build_optimizer({"_component_": "torch.optim.AdamW", "lr": 1e-3}, model, optimizer_in_bwd=True)
    state = training.recipe_state(
        optimizer=optimizer,
        lr_scheduler=None,
        progress=training.TrainingProgress(epochs_run=0, global_step=5, steps_run_in_epoch=5),
        settings=SETTINGS,
        seed=7,
        max_steps_per_epoch=None,
        model=model,
    )
    checkpointer = FullModelHFCheckpointer(base, ["model.safetensors"], output_dir=tmp_path / "out")
    return checkpointer.save_checkpoint({"model": model.state_dict(), **state}, epoch=0, step=5, intermediate=True)


def _cfg(folder: Path, recipe_checkpoint, resume: bool = True):
    return OmegaConf.create(
        {
            "resume_from_checkpoint": resume,
            "checkpointer": {
                "_component_": "torchtune.training.FullModelHFCheckpointer",
                "checkpoint_dir": str(folder.parent.parent / "base"),
                "checkpoint_files": ["model.safetensors"],
                "recipe_checkpoint": recipe_checkpoint,
                "output_dir": str(folder.parent),
            },
        }
    )


def test_a_new_run_has_no_plan(saved):
    assert training.resolve_resume(_cfg(saved, None, resume=False), SETTINGS) is None


@pytest.mark.parametrize("how", ["absolute", "relative_to_cwd", "relative_to_checkpoint_dir"])
def test_plan_points_at_the_saved_folder_and_its_progress(saved, monkeypatch, how):
    if how == "absolute":
        path = str(saved / "recipe_state.pt")
    elif how == "relative_to_cwd":
        monkeypatch.chdir(saved.parent)
        path = f"{saved.name}/recipe_state.pt"
    else:  # torchtune's convention: relative to checkpointer.checkpoint_dir
        path = f"../out/{saved.name}/recipe_state.pt"
    plan = training.resolve_resume(_cfg(saved, path), SETTINGS)
    assert plan.checkpoint_dir == saved.resolve()
    assert plan.progress == training.TrainingProgress(epochs_run=0, global_step=5, steps_run_in_epoch=5)
    assert plan.seed == 7 and plan.max_steps_per_epoch is None
    assert set(plan.optimizer_state) == {n for n, _ in llama2_tiny().named_parameters()}
    # the weights come from the resumed folder, not from the base model
    checkpointer = training.build_checkpointer(_cfg(saved, path).checkpointer, plan)
    assert checkpointer._checkpoint_dir == saved.resolve()
    plan.check_model(llama2_tiny())
    with pytest.raises(TuneError, match="different model"):
        plan.check_model(llama2_tiny(num_layers=1))
    plan.drop_loaded_states()
    assert "optimizer" not in plan.state and plan.progress.global_step == 5


def test_resume_without_recipe_checkpoint_names_the_key(saved):
    with pytest.raises(ConfigError, match="checkpointer.recipe_checkpoint"):
        training.resolve_resume(_cfg(saved, None), SETTINGS)


def test_recipe_checkpoint_without_resume_is_not_silently_ignored(saved):
    with pytest.raises(ConfigError, match="resume_from_checkpoint=True .* checkpointer.recipe_checkpoint=null"):
        training.resolve_resume(_cfg(saved, str(saved / "recipe_state.pt"), resume=False), SETTINGS)


def test_missing_recipe_state_names_the_path(saved):
    with pytest.raises(TuneError, match="step_9/recipe_state.pt does not exist"):
        training.resolve_resume(_cfg(saved, str(saved.parent / "step_9" / "recipe_state.pt")), SETTINGS)


def test_damaged_recipe_state_is_caught_by_the_manifest(saved):
    with open(saved / "recipe_state.pt", "r+b") as f:
        f.truncate(10)
    with pytest.raises(TuneError, match="recipe_state.pt has 10 bytes"):
        training.resolve_resume(_cfg(saved, str(saved / "recipe_state.pt")), SETTINGS)


def test_a_file_that_is_not_a_recipe_state_is_refused(saved, tmp_path):
    other = tmp_path / "weights.pt"
    torch.save({"model": {"w": torch.ones(1)}}, other)
    with pytest.raises(TuneError, match="not a resumable recipe state"):
        training.resolve_resume(_cfg(saved, str(other)), SETTINGS)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"optimizer_in_bwd": False}, "optimizer_in_bwd=True but this run has optimizer_in_bwd=False"),
        ({"batch_size": 8}, r"global batch of 4 \(batch_size x processes\), this run has 8"),
        ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps=1, this run has"),
    ],
)
def test_settings_that_would_change_the_meaning_of_the_state_are_refused(saved, change, message):
    settings = training.RunSettings(**{**SETTINGS.__dict__, **change})
    with pytest.raises(TuneError, match=message):
        training.resolve_resume(_cfg(saved, str(saved / "recipe_state.pt")), settings)


def test_settings_that_can_change_are_warned_about(saved, caplog):
    settings = training.RunSettings(**{**SETTINGS.__dict__, "seed": 8, "epochs": 3, "max_steps_per_epoch": 2})
    with caplog.at_level(logging.WARNING, logger="torchtune"):
        plan = training.resolve_resume(_cfg(saved, str(saved / "recipe_state.pt")), settings)
    text = caplog.text
    assert "seed=8 differs from the checkpoint's seed=7" in text
    assert "epochs=3 differs" in text and "max_steps_per_epoch=2 differs" in text
    assert plan.seed == 7 and plan.max_steps_per_epoch is None  # the checkpoint's, so the data order continues


def test_paged_optimizer_state_is_synced_before_it_is_saved(monkeypatch):
    """bitsandbytes' paged state is CUDA managed memory updated by asynchronous kernels: recipe_state waits
    for the device before reading it (and not for other optimizers). The CUDA calls are recorded here: a
    CPU machine has no device to wait for; tests/gpu runs the real save."""
    bnb = pytest.importorskip("bitsandbytes")
    from torchtune.utils import OptimInBackwardWrapper

    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(a))
    weight = torch.nn.Parameter(torch.zeros(4))
    common = dict(
        lr_scheduler=None,
        progress=training.TrainingProgress(epochs_run=0, global_step=1, steps_run_in_epoch=1),
        settings=SETTINGS,
        seed=7,
        max_steps_per_epoch=None,
        model=torch.nn.Linear(1, 1),
    )
    training.recipe_state(optimizer=torch.optim.AdamW([weight]), **common)
    assert synced == []
    paged = OptimInBackwardWrapper({"w": bnb.optim.PagedAdamW8bit([weight])})
    training.recipe_state(optimizer=paged, **common)
    assert len(synced) == 1
