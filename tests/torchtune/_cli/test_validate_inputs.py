"""`tune validate` checks the inputs as `tune run` reads them before the weights (output_dir, resume state,
tokenizer, data head, checkpoint headers), with the run's own messages, reading no tensor data; and every
shipped config passes it as shipped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests._helpers.tiny_run import build_recipe
from torchtune import _recipe_registry as registry
from torchtune import config
from torchtune._assets import asset_path
from torchtune._cli.tune import main
from torchtune._errors import TuneError, format_message

TINY = "llama2/tiny_full"


def _shipped_configs():
    """(recipe, YAML) for every file under recipes/configs: registered ones with their recipe, the
    others (recipes/configs/NAME.yaml) with the recipe of that name."""
    pairs = [(r, c.path) for r in registry.get_all_recipes() for c in r.configs]
    registered = {path.resolve() for _, path in pairs}
    for path in sorted((registry.builtin_recipes_dir() / "configs").rglob("*.yaml")):
        if path.resolve() not in registered:
            recipe = registry.get_recipe(path.stem)
            assert recipe is not None, f"{path} is shipped but belongs to no recipe"
            pairs.append((recipe, path))
    return pairs


def _ships_its_files(path) -> bool:
    """Whether the config's tokenizer and weights ship inside the package (``${asset:...}``), so that its input
    files can be checked here; the others name folders the user downloads (or other tests write)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return all(
        str(raw.get(node, {}).get(key, "")).startswith("${asset:")
        for node, key in (("tokenizer", "path"), ("checkpointer", "checkpoint_dir"))
    )


def _validate_args(recipe, path, tmp_path) -> list:
    args = ["validate", str(path), "--recipe", recipe.name]
    if not _ships_its_files(path):
        return [*args, "--config-only"]  # its weights are downloaded by the user, not here
    return [*args, f"output_dir={tmp_path}"] if "output_dir" in config.load_config(str(path)) else args


def _config_id(value) -> str:
    if isinstance(value, Path):
        return str(value.relative_to(registry.builtin_recipes_dir() / "configs").with_suffix(""))
    return value.name


@pytest.mark.parametrize("recipe, path", _shipped_configs(), ids=_config_id)
def test_every_shipped_config_passes_tune_validate(capsys, tmp_path, recipe, path):
    """Generic checks and the recipe's; for the configs whose files ship, the inputs too."""
    rc = main(_validate_args(recipe, path, tmp_path))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"passes the checks of the {recipe.name} recipe" in out, out
    if _ships_its_files(path):
        assert "Inputs checked" in out and "tensor headers fit the model" in out, out


def test_shipped_tiny_configs_say_nothing_on_stderr(tmp_path):
    """No warning from our own configs: `tune validate` of every config whose files ship (the set-up of
    their runs up to the weights) writes nothing to stderr. The full run of llama2/tiny_full is checked
    by tests/recipes/test_run_output.py."""
    calls = [_validate_args(recipe, path, tmp_path / str(i)) for i, (recipe, path) in enumerate(_shipped_configs())]
    calls = [args for args in calls if "--config-only" not in args]
    assert len(calls) >= 4, calls  # llama2 tiny_full, tiny_full_distributed, tiny_eval; generate
    code = f"import sys\nfrom torchtune._cli.tune import main\nsys.exit(max(main(args) for args in {calls!r}))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def _same_message_from_validate_and_run(capsys, tmp_path, overrides, expected):
    """`tune validate` fails with exactly the paragraph the recipe's set-up raises, and names ``expected``."""
    overrides = [f"output_dir={tmp_path / 'out'}", *overrides]
    capsys.readouterr()
    rc = main(["validate", TINY, *overrides])
    err = capsys.readouterr().err
    assert rc != 0 and expected in " ".join(err.split()), err
    with pytest.raises(TuneError) as raised:
        build_recipe(config.load_config(TINY, overrides))
    assert err.strip() == format_message(f"Error: {raised.value}").strip()


def _copy_base_model(tmp_path):
    folder = tmp_path / "base"
    shutil.copytree(asset_path("demo/base_model"), folder)
    return folder


def test_missing_data_column(capsys, tmp_path):
    rows = [{"instruction": f"Say {i}", "input": ""} for i in range(40)]
    (tmp_path / "data.json").write_text(json.dumps(rows))
    _same_message_from_validate_and_run(
        capsys, tmp_path, [f"dataset.data_files={tmp_path / 'data.json'}"], "has no column(s) 'output'"
    )


def test_damaged_tokenizer(capsys, tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    _same_message_from_validate_and_run(
        capsys, tmp_path, [f"tokenizer.path={tmp_path / 'tokenizer.model'}"], "tokenizer"
    )


def test_truncated_weights(capsys, tmp_path):
    folder = _copy_base_model(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    _same_message_from_validate_and_run(
        capsys, tmp_path, [f"checkpointer.checkpoint_dir={folder}"], "could not be read as a safetensors file"
    )


def test_weights_missing_a_tensor_or_quantized(capsys, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy_base_model(tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    dropped = dict(weights)
    del dropped["model.layers.1.mlp.up_proj.weight"]
    save_file(dropped, str(folder / "model.safetensors"))
    _same_message_from_validate_and_run(
        capsys,
        tmp_path,
        [f"checkpointer.checkpoint_dir={folder}"],
        "The checkpoint does not fit the model: missing from the checkpoint: layers.1.mlp.w3.weight",
    )
    quantized = {**weights, "model.norm.weight": weights["model.norm.weight"].to(torch.int8)}
    save_file(quantized, str(folder / "model.safetensors"))
    _same_message_from_validate_and_run(
        capsys, tmp_path, [f"checkpointer.checkpoint_dir={folder}"], "model.norm.weight (I8)"
    )


def test_output_dir_of_another_run_is_reported_and_left_alone(capsys, tmp_path):
    """The run's message; and with overwrite=True validate passes but deletes nothing (the run would)."""
    earlier = tmp_path / "out" / "step_5"
    earlier.mkdir(parents=True)
    (earlier / "model.safetensors").write_bytes(b"x")
    _same_message_from_validate_and_run(capsys, tmp_path, [], "already holds another run")
    capsys.readouterr()
    assert main(["validate", TINY, f"output_dir={tmp_path / 'out'}", "overwrite=True"]) == 0
    assert "would be deleted first (overwrite=True)" in capsys.readouterr().out
    assert (earlier / "model.safetensors").read_bytes() == b"x"


def _resume_state(folder, model_cfg, **changes):
    """A recipe_state.pt as a save writes it (a real one, from recipe_state()), beside a copy of the weights."""
    from torchtune import training

    shutil.copytree(asset_path("demo/base_model"), folder)
    model = training.model_skeleton(model_cfg, dtype=torch.float32)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
    settings = training.RunSettings(
        optimizer_in_bwd=True, batch_size=16, gradient_accumulation_steps=1, seed=42, max_steps_per_epoch=None, epochs=1
    )
    state = training.recipe_state(
        optimizer=optimizer,
        lr_scheduler=None,
        progress=training.TrainingProgress(0, 5, 5),
        settings=settings,
        seed=42,
        max_steps_per_epoch=None,
        model=model,
    )
    state.update(changes)
    torch.save(state, folder / "recipe_state.pt")
    return folder / "recipe_state.pt"


def test_resume_state_metadata(capsys, tmp_path):
    """Presence, settings and the model fingerprint of the state, from its metadata: the run's messages."""
    cfg = config.load_config(TINY)
    path = _resume_state(tmp_path / "out" / "step_5", cfg.model)
    resume = ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={path}"]
    capsys.readouterr()
    assert main(["validate", TINY, f"output_dir={tmp_path / 'out'}", *resume]) == 0
    out = capsys.readouterr().out
    assert f"resume state {path}: step 5" in out and "the resumed run continues there" in out, out
    _same_message_from_validate_and_run(capsys, tmp_path, [*resume, "batch_size=8"], "made with a global batch of 16")
    other = cfg.model.copy()
    other.num_layers = 2
    _resume_state(tmp_path / "out" / "step_6", other)
    resume = [
        "resume_from_checkpoint=True",
        f"checkpointer.recipe_checkpoint={tmp_path / 'out/step_6/recipe_state.pt'}",
    ]
    capsys.readouterr()
    assert main(["validate", TINY, f"output_dir={tmp_path / 'out'}", *resume]) != 0
    assert "was written for a different model" in " ".join(capsys.readouterr().err.split())
    missing = [
        "resume_from_checkpoint=True",
        f"checkpointer.recipe_checkpoint={tmp_path / 'out/step_7/recipe_state.pt'}",
    ]
    _same_message_from_validate_and_run(capsys, tmp_path, missing, "does not exist")


def test_template_that_fails_on_a_row_and_the_lengths_of_the_first_examples(capsys, tmp_path):
    """Every row is made into messages when the dataset is built: a template that fails on the data stops
    validate and the run alike before the weights, naming the rows; validate reports the lengths of the
    first examples (the Alpaca text as it is: chat_format plain_text, without Llama 2's [INST] template)."""
    cfg = config.load_config(TINY, [f"output_dir={tmp_path / 'out'}"])
    cfg.dataset = {
        "_component_": "torchtune.datasets.instruct_dataset",
        "source": "json",
        "data_files": asset_path("demo/train.json"),
        "template": "Item {instruction:d}:",  # a number format for the text in the instruction column
        "max_seq_len": 128,
    }
    mine = tmp_path / "mine.yaml"
    OmegaConf.save(cfg, mine, resolve=True)
    capsys.readouterr()
    assert main(["validate", str(mine), "--recipe", "full_finetune_single_device"]) == 1
    err = capsys.readouterr().err
    flat = " ".join(err.split())
    assert "demo/train.json' has rows that cannot be trained on: row 0: Unknown format code 'd'" in flat, err
    assert "(and 2995 more rows)" in flat, err
    with pytest.raises(TuneError) as raised:
        build_recipe(cfg)
    assert err.strip() == format_message(f"Error: {raised.value}").strip()

    capsys.readouterr()  # the lengths of the first examples are reported, cut at max_seq_len
    plain = "dataset.chat_format=plain_text"  # as the config says: kept here, the counts below depend on it
    overrides = [f"output_dir={tmp_path / 'out'}", "dataset.max_seq_len=8", "dataset.train_on_input=True", plain]
    assert main(["validate", TINY, *overrides]) == 0
    out = capsys.readouterr().out
    assert "dataset: 3000 examples, 188 steps per epoch; the first 8 examples are 8 to 8 tokens long" in out, out
    # with the loss on the responses only, the rows whose prompt (40 to 72 tokens) leaves no response token
    # under max_seq_len are left out, and counted
    assert main(["validate", TINY, f"output_dir={tmp_path / 'out'}", "dataset.max_seq_len=60", plain]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "dataset: 1954 examples" in out and "; 1046 rows with nothing to learn left out (1046 cut away" in out, out


def test_output_dir_that_is_a_file(capsys, tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    _same_message_from_validate_and_run(
        capsys, tmp_path, [f"output_dir={tmp_path / 'taken'}"], "output_dir=" + str(tmp_path / "taken") + " is a file"
    )
    _same_message_from_validate_and_run(
        capsys, tmp_path, [f"output_dir={tmp_path / 'taken' / 'run'}"], "which is a file, not a folder"
    )


def test_data_longer_than_the_models_positions(capsys, tmp_path):
    limit = config.load_config(TINY).model.max_seq_len
    _same_message_from_validate_and_run(
        capsys,
        tmp_path,
        [f"dataset.max_seq_len={limit + 1}"],
        f"dataset.max_seq_len={limit + 1} is longer than the model's max_seq_len ({limit}",
    )
