"""full_finetune_single_device on each family's shipped tiny config (Qwen3, Qwen2.5, Mistral with a sliding
window, Phi-4 with fused projections): it trains on chat data in the folder's own template, resumes
bit-exactly from a step checkpoint, and the folder it saves loads in transformers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests._helpers.hf_tiny_run import make_tiny_family_run
from tests._helpers.tiny_run import read_losses, run_recipe

transformers = pytest.importorskip("transformers")

# Both optimizer modes; Qwen2.5 differs from Qwen3 only in the biases and norms the parity tests cover.
CASES = [("qwen3", True), ("mistral", True), ("phi4", False)]


@pytest.mark.parametrize("family, optimizer_in_bwd", CASES)
def test_finetune_save_and_exact_resume(tmp_path, family, optimizer_in_bwd):
    config = make_tiny_family_run(tmp_path / "run", family, epochs=2, save_every_n_steps=3)
    full_dir = tmp_path / "full"
    run_recipe(config, output_dir=str(full_dir), optimizer_in_bwd=optimizer_in_bwd)
    losses = read_losses(full_dir)
    assert len(losses) == 8 and losses[-1] < losses[0]
    run_recipe(
        config,
        output_dir=str(tmp_path / "resumed"),
        optimizer_in_bwd=optimizer_in_bwd,
        resume_from_checkpoint=True,
        **{"checkpointer.recipe_checkpoint": str(full_dir / "step_6" / "recipe_state.pt")},
    )
    assert read_losses(tmp_path / "resumed") == losses[6:]
    a = load_file(str(full_dir / "epoch_1" / "model-00001-of-00001.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "epoch_1" / "model-00001-of-00001.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    saved = full_dir / "epoch_1"
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in saved.iterdir()}
    model = transformers.AutoModelForCausalLM.from_pretrained(saved)
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved)
    assert tokenizer.chat_template is not None
    base = load_file(str(tmp_path / "run" / f"tiny_{family}" / "model.safetensors"))
    assert sorted(base) == sorted(a)  # the family's own names, fused where its folder fuses
    assert any(not torch.equal(base[k], a[k]) for k in a)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()
