"""full_finetune_distributed on each Llama-shaped family's shipped tiny config (Qwen3, Qwen2.5, Mistral with a
sliding window shorter than the sequence, Phi-4 with fused projections) through the real
`tune run --nproc_per_node 2` (gloo, CPU, FSDP2): two processes train what one process trains, write a
sharded step checkpoint, and a 2-process resume from it continues bit-exactly.

Two launches per family (the run and its resume) are the fewest that show all three; they are the suite's
most expensive tests, so each run is 3 steps and the resume 1."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests._helpers.hf_tiny_run import make_tiny_family_run
from tests._helpers.tiny_run import distributed_config, read_losses, run_recipe, run_tune

pytest.importorskip("transformers")

# 3 steps of a global batch of 4 (2 per rank), a step checkpoint after the second.
RUN = dict(epochs=1, max_steps_per_epoch=3, save_every_n_steps=2)
# Both optimizer modes across the families; the shipped tiny configs step in backward.
CASES = [("qwen3", True), ("qwen2_5", False), ("mistral", True), ("phi4", False)]


def _tune_dist(config, out, *extra: str):
    args = ["run", "--standalone", "--nproc_per_node", "2", "full_finetune_distributed", "--config", str(config)]
    result = run_tune([*args, f"output_dir={out}", *extra], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.mark.parametrize("family, optimizer_in_bwd", CASES)
def test_two_processes_train_save_and_resume_what_one_process_trains(tmp_path, family, optimizer_in_bwd):
    single = make_tiny_family_run(tmp_path / "run", family, optimizer_in_bwd=optimizer_in_bwd, **RUN)
    dist = distributed_config(single, tmp_path / "dist.yaml")

    _tune_dist(dist, tmp_path / "dist")
    run_recipe(single, output_dir=str(tmp_path / "single"))
    losses = read_losses(tmp_path / "dist")
    assert len(losses) == 3 and losses == pytest.approx(
        read_losses(tmp_path / "single"), abs=1e-5, rel=0
    )  # reduction order across ranks
    assert (tmp_path / "dist" / "step_2" / "sharded_state" / "__1_0.distcp").is_file()

    state = tmp_path / "dist" / "step_2" / "recipe_state.pt"
    _tune_dist(dist, tmp_path / "resumed", "resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={state}")
    # the same two ranks reduce in the same order: the resumed step is the uninterrupted one, bit for bit
    assert read_losses(tmp_path / "resumed") == losses[2:]
    a = load_file(str(tmp_path / "dist" / "epoch_0" / "model-00001-of-00001.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "epoch_0" / "model-00001-of-00001.safetensors"))
    base = load_file(str(tmp_path / "run" / f"tiny_{family}" / "model.safetensors"))
    assert sorted(a) == sorted(b) == sorted(base)  # the family's own names, fused where its folder fuses
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(base[k], a[k]) for k in a)
