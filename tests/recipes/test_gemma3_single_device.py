"""full_finetune_single_device on the shipped gemma3/tiny_full config (a tiny Gemma 3 folder with local
and global layers, sequences longer than the window, tied embeddings): both optimizer modes train
alike, resume is bit-exact in both, the saved folder loads in transformers with our logits, and the
standard mode runs through the real `tune` command."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests._helpers.tiny_gemma3_run import make_tiny_gemma3_run
from tests._helpers.tiny_run import read_losses, run_recipe, run_tune
from torchtune.modules import TiedLinear


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_gemma3_run(tmp_path_factory.mktemp("tiny_gemma3"), num_examples=48)


def _final(output_dir):
    return load_file(str(output_dir / "epoch_0" / "model-00001-of-00001.safetensors"))


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """One full run per optimizer mode (12 steps, step_N checkpoints every 4): {optimizer_in_bwd: (recipe, output_dir)};
    the standard mode through the real `tune` command (recipe None)."""
    bwd_dir, std_dir = tmp_path_factory.mktemp("run_bwd"), tmp_path_factory.mktemp("run_std")
    proc = run_tune(
        ["full_finetune_single_device", "--config", str(tiny), f"output_dir={std_dir}", "optimizer_in_bwd=False"]
    )
    assert proc.returncode == 0, proc.stderr
    return {True: (run_recipe(tiny, output_dir=str(bwd_dir), optimizer_in_bwd=True), bwd_dir), False: (None, std_dir)}


def test_both_optimizer_modes_train_alike_and_the_saved_folder_loads_in_transformers(runs):
    (bwd, bwd_dir), (_, std_dir) = runs[True], runs[False]
    assert isinstance(bwd._model.output, TiedLinear)
    losses_bwd, losses_std = read_losses(bwd_dir), read_losses(std_dir)
    assert len(losses_bwd) == 12
    assert losses_bwd == pytest.approx(losses_std, abs=1e-5)
    assert losses_bwd[-1] < losses_bwd[0] - 0.5
    a, b = _final(bwd_dir), _final(std_dir)
    assert "lm_head.weight" not in a and a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0, msg=name)

    transformers = pytest.importorskip("transformers")
    folder = bwd_dir / "epoch_0"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens = torch.randint(0, hf.config.vocab_size, (2, 40))  # longer than the 16-token window
    model = bwd._model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
def test_exact_resume(tiny, runs, tmp_path, optimizer_in_bwd):
    full_dir = runs[optimizer_in_bwd][1]
    resumed_dir = tmp_path / "resumed"
    recipe = run_recipe(
        tiny,
        output_dir=str(resumed_dir),
        optimizer_in_bwd=optimizer_in_bwd,
        resume_from_checkpoint=True,
        **{"checkpointer.recipe_checkpoint": str(full_dir / "step_8" / "recipe_state.pt")},
    )
    assert recipe._model.output.weight is recipe._model.tok_embeddings.weight  # loading did not untie
    assert read_losses(resumed_dir) == read_losses(full_dir)[8:]
    a, b = _final(full_dir), _final(resumed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
