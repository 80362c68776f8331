"""full_finetune_distributed on the tiny Gemma 3 through the real `tune run --nproc_per_node 2` (gloo,
CPU): two processes train what one process trains (local and global layers, tied embeddings sharded by
FSDP2), and the epoch folder is a Gemma 3 folder with the trained weights."""

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tests._helpers.tiny_gemma3_run import make_tiny_gemma3_run
from tests._helpers.tiny_run import read_losses, run_recipe, run_tune

DIST_KEYS = {
    "dist_backend": None,
    "fsdp_cpu_offload": False,
    "fsdp_reshard_after_forward": True,
    "fsdp_param_dtype": None,
    "fsdp_reduce_dtype": None,
    "async_checkpoint": False,
}


def test_two_processes_train_what_one_process_trains(tmp_path):
    from recipes.full_finetune_distributed import RECIPE_KEYS

    single = make_tiny_gemma3_run(tmp_path, num_examples=48, max_steps_per_epoch=6, save_every_n_steps=None)
    cfg = OmegaConf.load(single)
    for key in [k for k in cfg if k not in RECIPE_KEYS]:
        cfg.pop(key)  # the single-device recipe's own keys
    cfg.update(DIST_KEYS)
    dist = tmp_path / "dist.yaml"
    OmegaConf.save(cfg, dist)
    args = ["run", "--standalone", "--nproc_per_node", "2", "full_finetune_distributed", "--config", str(dist)]
    result = run_tune([*args, f"output_dir={tmp_path / 'dist'}"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    run_recipe(single, output_dir=str(tmp_path / "single"))
    losses = read_losses(tmp_path / "dist")
    assert len(losses) == 6 and losses == pytest.approx(
        read_losses(tmp_path / "single"), abs=1e-4, rel=0
    )  # reduction order across ranks
    a = load_file(str(tmp_path / "dist" / "epoch_0" / "model.safetensors"))
    b = load_file(str(tmp_path / "single" / "epoch_0" / "model.safetensors"))
    assert "lm_head.weight" not in a and a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-4, rtol=0, msg=name)
