"""The keys a finetune config may leave out (their defaults), torchtune's keys and what each does here."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from torchtune import ConfigError, training
from torchtune.config import load_config
from torchtune.training.setup._recipe_keys import REQUIRED_FINETUNE_KEYS

REPO = Path(__file__).resolve().parents[3]


def _torchtune_shaped(**extra):
    """The tiny config with only the keys torchtune's configs have (none of this library's own)."""
    cfg = load_config("llama2/tiny_full", ["optimizer=torch.optim.AdamW"])
    ours = [k for k in cfg if k not in REQUIRED_FINETUNE_KEYS and k not in ("seed", "shuffle", "metric_logger")]
    for key in ours:
        if key not in ("max_steps_per_epoch", "gradient_accumulation_steps", "resume_from_checkpoint"):
            del cfg[key]
    for key, value in extra.items():
        cfg[key] = value
    return cfg


def _single(cfg):
    from recipes.full_finetune_single_device import validate_config

    validate_config(cfg)
    return cfg


def _distributed(cfg):
    from recipes.full_finetune_distributed import validate_config

    validate_config(cfg)
    return cfg


def test_a_config_without_this_librarys_keys_gets_the_documented_defaults():
    cfg = _single(_torchtune_shaped())
    assert cfg.overwrite is False and cfg.bf16_stochastic_rounding is False and cfg.validation_dataset is None
    assert cfg.optimizer_in_bwd is False and cfg.lr_scheduler is None and cfg.profiler is None
    assert cfg.save_every_n_steps is None and cfg.eval_after_training is None and cfg.liger_kernels is False
    dist = _distributed(_torchtune_shaped())
    assert dist.fsdp_reshard_after_forward is True and dist.global_batch_size is None and dist.async_checkpoint is False


def test_a_required_key_left_out_and_a_typo_are_refused():
    cfg = _torchtune_shaped()
    del cfg["loss"]
    with pytest.raises(ConfigError, match="missing key"):
        _single(cfg)
    with pytest.raises(ConfigError, match=r"unknown key 'optimizer_in_bwdd' \(did you mean optimizer_in_bwd"):
        _single(_torchtune_shaped(optimizer_in_bwdd=True))


def test_later_torchtune_spellings_are_read_as_this_librarys_keys():
    node = OmegaConf.to_container(load_config("llama2/tiny_full").validation_dataset)
    cfg = _single(_torchtune_shaped(dataset_val=node, run_val_every_n_steps=5))
    assert cfg.validation_dataset.data_files.endswith("heldout.json") and cfg.eval_every_n_steps == 5
    assert "dataset_val" not in cfg
    with pytest.raises(ConfigError, match="dataset_val and validation_dataset are the same key"):
        _single(_torchtune_shaped(dataset_val=node, validation_dataset=node))
    assert _distributed(_torchtune_shaped(enable_async_checkpointing=True)).async_checkpoint is True


def test_torchtune_keys_that_do_nothing_here_are_accepted_with_a_line():
    cfg = _distributed(
        _torchtune_shaped(
            tensor_parallel_dim=1,
            tensor_parallel_plan={"_component_": "builtins.dict"},
            custom_sharded_layers=["tok_embeddings", "output"],
            ac_mode="full",
            enable_activation_offloading=True,
            enable_activation_checkpointing=True,
        )
    )
    notes = training.config_notes(cfg, distributed=True)
    assert [n.split(":")[0] for n in notes] == [
        "tensor_parallel_plan",
        "ac_mode / ac_option",
        "custom_sharded_layers ['tok_embeddings', 'output']",
        "enable_activation_offloading",
    ]
    assert training.config_notes(_single(_torchtune_shaped()), distributed=False) == []


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("tensor_parallel_dim", 2, "tensor parallelism is not in this library"),
        ("data_parallel_replicate_dim", 2, "HSDP is not here"),
        ("collate_fn", "my.collate", "this library's collate"),
        ("log_level", "LOUD", "log_level='LOUD'"),
        ("cudnn_deterministic_mode", "sometimes", "cudnn_deterministic_mode='sometimes'"),
    ],
)
def test_values_this_library_cannot_run_are_refused(key, value, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        _distributed(_torchtune_shaped(**{key: value}))


def test_batch_size_is_per_process_and_global_batch_size_an_opt_in():
    settings = training.RunSettings.from_config(_distributed(_torchtune_shaped(batch_size=2)), world_size=4)
    assert settings.batch_size == 8  # the global batch of a micro-step
    cfg = _distributed(_torchtune_shaped(batch_size=None, global_batch_size=8))
    assert training.RunSettings.from_config(cfg, world_size=4).batch_size == 8
    with pytest.raises(ConfigError, match="global_batch_size=8 and batch_size=2 are both set"):
        _distributed(_torchtune_shaped(batch_size=2, global_batch_size=8))


def test_docs_list_every_default():
    text = (REPO / "docs" / "recipe.md").read_text()
    table = text.split("<!-- defaults: FINETUNE_DEFAULTS -->", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| `(.*)` \|$", table, flags=re.M))

    def shown(value):
        return "null" if value is None else "[]" if value == [] else str(value)

    assert rows == {k: shown(v) for k, v in training.FINETUNE_DEFAULTS.items()}
