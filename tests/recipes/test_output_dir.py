"""A second run into the output_dir of another never overwrites it: it stops with the three choices
(resume, another output_dir, overwrite=True); a resumed run continues metrics.jsonl without duplicate
steps; overwrite=True replaces the earlier run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests._helpers.tiny_run import make_tiny_run, run_recipe, run_tune
from torchtune.training.metric_logging import read_metrics

# 2 steps, a resumable step checkpoint after each, then the final epoch_0.
RUN = dict(epochs=1, max_steps_per_epoch=2, save_every_n_steps=1)


def _files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """(config, output_dir of a finished run): step_1, step_2, epoch_0 and its metrics."""
    root = tmp_path_factory.mktemp("first")
    config = make_tiny_run(root, **RUN)
    run_recipe(config, output_dir=str(root / "out"))
    return config, root / "out"


def test_a_second_run_stops_and_leaves_the_first_untouched(first, tmp_path):
    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = _files(out)
    result = run_tune(["run", "full_finetune_single_device", "--config", str(config), f"output_dir={out}"])
    err = _flat(result.stderr)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"output_dir={out} already holds another run: the checkpoints step_1, epoch_0 and" in err
    assert "(steps 1 to 2). This run would overwrite it; nothing was loaded or changed." in err
    # the run finished (step 2 was its last): nothing to resume, but its weights to train on from
    assert "nothing to resume: that run finished, epoch_0 is its final checkpoint" in err
    assert f"checkpointer.checkpoint_dir={out}/epoch_0" in err
    assert "output_dir=ANOTHER_FOLDER" in err and "overwrite=True" in err
    assert "Traceback" not in result.stderr and "Loss" not in result.stderr
    assert _files(out) == before  # epoch_0, step_1 and metrics.jsonl byte for byte


def test_the_message_of_a_stopped_run_offers_its_latest_step_to_resume(first, tmp_path):
    from omegaconf import OmegaConf

    from torchtune import training
    from torchtune._errors import TuneError

    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "epoch_0")  # as if stopped after step 1
    cfg = OmegaConf.load(config)
    cfg.output_dir = str(out)
    with pytest.raises(TuneError) as error:
        training.prepare_output_dir(cfg)
    assert f"resume_from_checkpoint=True checkpointer.recipe_checkpoint={out}/step_1/recipe_state.pt" in str(
        error.value
    )


def test_a_resumed_run_continues_the_metrics_without_duplicate_steps(first, tmp_path):
    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    first_rows = read_metrics(out / "logs" / "metrics.jsonl")
    run_recipe(
        config,
        output_dir=str(out),
        resume_from_checkpoint=True,
        **{"checkpointer.recipe_checkpoint": str(out / "step_1" / "recipe_state.pt")},
    )
    rows = read_metrics(out / "logs" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [r["step"] for r in first_rows] == [1, 2]
    assert rows[0] == first_rows[0]  # step 1 is kept as it was logged
    assert rows[1]["loss"] == first_rows[1]["loss"]  # step 2 logged again by the exact resume


def test_a_new_lr_given_on_resume_is_used_and_logged(first, tmp_path):
    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    first_rows = read_metrics(out / "logs" / "metrics.jsonl")
    resume = ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={out}/step_1/recipe_state.pt"]
    result = run_tune(
        ["run", "full_finetune_single_device", "--config", str(config), f"output_dir={out}", "optimizer.lr=1e-4"]
        + resume
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "optimizer.lr=0.0001 (the checkpoint's run had 0.001)" in _flat(result.stderr)
    rows = read_metrics(out / "logs" / "metrics.jsonl")
    # step 2 at the same point of the warm-up, from the new peak
    assert rows[1]["lr"] == pytest.approx(first_rows[1]["lr"] / 10, rel=1e-9)


def test_a_refused_resume_leaves_the_metrics_as_they_were(first, tmp_path):
    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = _files(out)
    result = run_tune(
        ["run", "full_finetune_single_device", "--config", str(config), f"output_dir={out}", "batch_size=1"]
        + ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={out}/step_1/recipe_state.pt"]
    )
    assert result.returncode == 1 and "batch_size" in result.stderr, result.stderr[-3000:]
    assert _files(out) == before  # metrics.jsonl still holds step 2: only an accepted resume drops it


def test_overwrite_true_replaces_the_earlier_run(first, tmp_path):
    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    old_weights = (out / "epoch_0" / "model-00001-of-00001.safetensors").read_bytes()
    run_recipe(config, output_dir=str(out), overwrite=True, save_every_n_steps=None, **{"optimizer.lr": 1e-2})
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["epoch_0", "logs"]  # step folders deleted
    assert (out / "epoch_0" / "model-00001-of-00001.safetensors").read_bytes() != old_weights
    rows = read_metrics(out / "logs" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["lr"] != pytest.approx(1e-3)


def test_overwrite_with_resume_or_of_its_own_weights_is_refused(first, tmp_path):
    from torchtune._errors import ConfigError

    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    resume = {"resume_from_checkpoint": True, "checkpointer.recipe_checkpoint": str(out / "step_1/recipe_state.pt")}
    with pytest.raises(ConfigError, match="overwrite=True and resume_from_checkpoint=True contradict"):
        run_recipe(config, output_dir=str(out), overwrite=True, **resume)
    with pytest.raises(ConfigError, match="overwrite=True would delete checkpointer.checkpoint_dir"):
        run_recipe(config, output_dir=str(out), overwrite=True, **{"checkpointer.checkpoint_dir": str(out / "epoch_0")})
    assert (out / "step_1").is_dir() and (out / "epoch_0").is_dir()


def test_a_damaged_step_with_nothing_earlier_names_the_resume_key_on_its_own_line(first, tmp_path):
    config, finished = first
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    weights = out / "step_1" / "model-00001-of-00001.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: found by the background checksums once training runs
    weights.write_bytes(bytes(data))
    recipe_checkpoint = out / "step_1" / "recipe_state.pt"
    result = run_tune(
        ["run", "full_finetune_single_device", "--config", str(config), f"output_dir={out}"]
        + ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={recipe_checkpoint}"]
    )
    assert result.returncode == 1, result.stderr[-3000:]
    err = _flat(result.stderr)
    assert f"Checkpoint file {weights} does not match the checksum it was saved with" in err
    assert "No earlier checkpoint of this run is in" in err and "Point checkpointer.recipe_checkpoint at" in err
    assert "checkpointer.checkpoint_dir" not in err
    assert "\nError: " in result.stderr  # on a line of its own, not after the progress bar's
    assert not [line for line in result.stderr.splitlines() if "Error:" in line and not line.startswith("Error:")]


def test_a_final_epoch_as_recipe_checkpoint_says_so_and_names_a_step(first, tmp_path):
    from omegaconf import OmegaConf

    from torchtune import training
    from torchtune._errors import TuneError

    config, finished = first
    cfg = OmegaConf.load(config)
    cfg.resume_from_checkpoint = True
    cfg.checkpointer.recipe_checkpoint = str(finished / "epoch_0" / "recipe_state.pt")
    with pytest.raises(TuneError) as error:
        training.resolve_resume(cfg, None)
    message = str(error.value)
    assert f"points into {finished / 'epoch_0'}, a final checkpoint" in message
    assert f"checkpointer.recipe_checkpoint={finished / 'step_1' / 'recipe_state.pt'}" in message
