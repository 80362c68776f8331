"""APOLLO, APOLLO-Mini and GaLore (their own packages) per parameter: finetune, save, resume bit-exactly in
both optimizer modes, state keyed by parameter name; bad low-rank settings stop before any weight loads."""

import pytest
import torch

from tests._helpers.tiny_run import build_recipe as _recipe
from tests._helpers.tiny_run import make_tiny_run, read_losses

pytest.importorskip("apollo_torch")
pytest.importorskip("galore_torch")

REST = {"_component_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.0}
APOLLO_MINI = {
    "_component_": "apollo_torch.APOLLOAdamW",
    "lr": 1e-3,
    "weight_decay": 0.0,
    "rank": 1,
    "proj": "random",
    "scale_type": "tensor",
    "scale": 128,
    "update_proj_gap": 2,  # a new projection every 2 steps: the resumed run must restore the projector's seed
    "proj_type": "std",
    "rest": REST,
}
APOLLO = {**APOLLO_MINI, "rank": 4, "scale_type": "channel", "scale": 1}
GALORE = {
    "_component_": "galore_torch.GaLoreAdamW",
    "lr": 1e-3,
    "weight_decay": 0.0,
    "rank": 4,
    "update_proj_gap": 2,
    "scale": 0.25,
    "proj_type": "std",
    "rest": REST,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(
        tmp_path_factory.mktemp("lowrank"), num_examples=8, model_dims={"embed_dim": 64}, epochs=1, batch_size=2
    )


def _run_to_end(config, **overrides):
    recipe = _recipe(config, **overrides)
    recipe.train()
    recipe.cleanup()
    return recipe


def _weights(output_dir):
    from safetensors.torch import load_file

    return load_file(str(output_dir / "epoch_0" / "model-00001-of-00001.safetensors"))


@pytest.mark.parametrize(
    "node, dtype, in_bwd",
    [
        pytest.param(APOLLO_MINI, "bf16", True, id="apollo_mini-bf16-in_bwd"),
        pytest.param(APOLLO_MINI, "fp32", False, id="apollo_mini-fp32-standard"),
        pytest.param(APOLLO, "fp32", True, id="apollo-fp32-in_bwd"),
        pytest.param(GALORE, "bf16", False, id="galore-bf16-standard"),
        pytest.param(GALORE, "fp32", True, id="galore-fp32-in_bwd"),
    ],
)
def test_low_rank_finetune_saves_and_resumes_bit_exactly(tiny, tmp_path, node, dtype, in_bwd):
    # 4 steps of batch 2, warm-up 1, saved after step 2; the projection is renewed every 2 steps, so the
    # resumed steps 3-4 need the restored moments, step counts and projector (seed or SVD basis).
    run = {"optimizer": node, "dtype": dtype, "optimizer_in_bwd": in_bwd, "lr_scheduler.num_warmup_steps": 1}
    out = tmp_path / "full"
    recipe = _run_to_end(tiny, output_dir=str(out), save_every_n_steps=2, **run)
    inner = recipe._optimizer.optim_map
    low = [n for n, opt in inner.items() if type(opt).__module__.startswith(("apollo_torch", "galore_torch"))]
    assert low and all(n.endswith(("proj.weight", "w1.weight", "w2.weight", "w3.weight")) for n in low)
    assert "tok_embeddings.weight" not in low and type(inner["tok_embeddings.weight"]) is torch.optim.AdamW

    saved = torch.load(out / "step_2" / "recipe_state.pt", weights_only=True)  # no pickled projector objects
    state = saved["optimizer"]
    assert set(state) == {n for n, _ in recipe._model.named_parameters()}  # keyed by parameter name
    projector = state[low[0]]["state"][0]["projector"]
    assert projector["__projector__"].startswith(node["_component_"].split(".")[0])
    assert projector["rank"] == node["rank"]

    resume = {"resume_from_checkpoint": True, "checkpointer.recipe_checkpoint": str(out / "step_2" / "recipe_state.pt")}
    _run_to_end(tiny, output_dir=str(tmp_path / "res"), **run, **resume)
    assert read_losses(tmp_path / "res") == read_losses(out)[2:]
    final, resumed = _weights(out), _weights(tmp_path / "res")
    assert resumed.keys() == final.keys()
    assert all(torch.equal(w, final[n]) for n, w in resumed.items())
    # the weights moved: a low-rank update that never landed would also resume "exactly"
    from safetensors.torch import load_file

    base = load_file(str(tiny.parent / "base" / "model.safetensors"))
    assert all(not torch.equal(final[n].float(), base[n].float()) for n in final if "norm" not in n)


def _validate(tiny, **overrides):
    from omegaconf import OmegaConf

    from recipes.full_finetune_single_device import validate_config
    from torchtune._errors import ConfigError

    cfg = OmegaConf.load(tiny)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)  # what the recipe runs first, before any weight loads
    return str(err.value)


def test_bad_low_rank_settings_stop_before_any_weight_loads(tiny, monkeypatch):
    # rank above the smaller side of a 64 x 64 projection
    msg = _validate(tiny, optimizer={**APOLLO, "rank": 65})
    assert "optimizer.rank=65" in msg and "at most 64" in msg and "target_modules" in msg
    msg = _validate(tiny, optimizer={**GALORE, "target_modules": ["q_proj", "qkv_proj"]})
    assert "['qkv_proj']" in msg and "match no trainable matrix" in msg and "q_proj" in msg
    msg = _validate(tiny, optimizer={k: v for k, v in APOLLO_MINI.items() if k != "rest"})
    assert "optimizer.rest" in msg and "AdamW8bit" in msg
    msg = _validate(tiny, optimizer={"_component_": "lomo_optim.AdaLomo", "lr": 1e-3})
    assert "fused backward" in msg and "apollo_torch.APOLLOAdamW" in msg
    # the package missing: the pip extra to install
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "apollo_torch" else real_find_spec(name, *a)
    )
    msg = _validate(tiny, optimizer=APOLLO_MINI)
    assert "plaintune[apollo]" in msg and "not installed" in msg
