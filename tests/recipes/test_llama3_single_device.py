"""full_finetune_single_device on a tiny Llama 3.2-shaped model (tied embeddings, llama3 RoPE) and a chat
file: both optimizer modes agree and learn, the tie holds through training and saving, resume is
bit-exact, the real `tune` command gives the same losses; a tokenizer of another vocabulary is refused."""

import pytest
import torch
from safetensors.torch import load_file

from tests._helpers.tiny_llama3_run import make_tiny_llama3_run
from tests._helpers.tiny_run import build_recipe, read_losses, run_recipe, run_tune
from torchtune import TuneError
from torchtune.modules import TiedLinear


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, llama3_tokenizer_dir):
    return make_tiny_llama3_run(tmp_path_factory.mktemp("tiny_llama3"), llama3_tokenizer_dir)


def _final(output_dir):
    return load_file(str(output_dir / "epoch_1" / "model-00001-of-00001.safetensors"))


def test_both_optimizer_modes_train_the_tied_model_alike(tiny, tmp_path):
    bwd = run_recipe(tiny, output_dir=str(tmp_path / "bwd"), optimizer_in_bwd=True)
    run_recipe(tiny, output_dir=str(tmp_path / "std"), optimizer_in_bwd=False)
    # one optimizer for the one tied tensor; output still reads it
    assert isinstance(bwd._model.output, TiedLinear)
    assert bwd._model.output.weight is bwd._model.tok_embeddings.weight
    assert "tok_embeddings.weight" in bwd._optimizer.optim_map and len(bwd._optimizer.optim_map) == len(
        list(bwd._model.parameters())
    )
    losses_bwd, losses_std = read_losses(tmp_path / "bwd"), read_losses(tmp_path / "std")
    assert len(losses_bwd) == 12
    assert losses_bwd == pytest.approx(losses_std, abs=1e-6)
    assert losses_bwd[0] == pytest.approx(6.70, abs=0.1)  # ln(812): the tied output starts uniform
    assert losses_bwd[-1] < losses_bwd[0] - 1.5
    a, b = _final(tmp_path / "bwd"), _final(tmp_path / "std")
    assert "lm_head.weight" not in a and a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)
    base = load_file(str(tiny.parent / "base" / "model.safetensors"))
    assert not torch.equal(a["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    saved = sorted(p.name for p in (tmp_path / "bwd" / "epoch_1").iterdir())
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model-00001-of-00001.safetensors"} <= set(saved)


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
def test_exact_resume(tiny, tmp_path, optimizer_in_bwd):
    full_dir = tmp_path / "full"
    run_recipe(tiny, output_dir=str(full_dir), optimizer_in_bwd=optimizer_in_bwd, save_every_n_steps=4)
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


def test_tune_command_gives_the_in_process_losses(tiny, tmp_path):
    out = tmp_path / "cli"
    args = [
        "full_finetune_single_device",
        "--config",
        str(tiny),
        f"output_dir={out}",
        "epochs=1",
        "max_steps_per_epoch=3",
    ]
    proc = run_tune(args)
    assert proc.returncode == 0, proc.stderr
    run_recipe(tiny, output_dir=str(tmp_path / "inproc"), epochs=1, max_steps_per_epoch=3)
    assert read_losses(out) == read_losses(tmp_path / "inproc") and len(read_losses(out)) == 3


def test_model_type_mismatch_is_refused_before_loading(tiny, tmp_path):
    with pytest.raises(TuneError, match="checkpointer.model_type=LLAMA3 does not match.*model_type=LLAMA3_2"):
        build_recipe(tiny, output_dir=str(tmp_path / "o"), **{"checkpointer.model_type": "LLAMA3"})
