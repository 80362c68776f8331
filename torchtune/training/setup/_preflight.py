"""The part of a recipe's set-up that reads no tensor data, as one call: what ``tune validate`` runs.

The steps are the recipe's own functions, in the recipe's order (cheapest first), so each problem gets the
message ``tune run`` gives: output_dir, the resume state's metadata, tokenizer, data (columns, template,
first examples tokenized, steps per epoch), validation data, the checkpointer with its config.json and
safetensors headers against the model built on the meta device, the tokenizer against the embedding table,
the resume state's model fingerprint. Nothing is built on a device and no weight, optimizer state or
checksum is read: a 7B checkpoint costs the reading of its headers.
"""

from __future__ import annotations

from typing import Any, List

import torch

from torchtune import config, utils
from torchtune.training.distributed._settings import check_resume_is_sharded
from torchtune.training.run._output_dir import check_output_dir
from torchtune.training.run._resume import RunSettings, build_checkpointer, resolve_resume
from torchtune.training.run._validation import build_validation
from torchtune.training.setup._data import build_dataloader
from torchtune.training.setup._model import (
    check_model_fits,
)

__all__ = ["check_inputs"]


def check_inputs(cfg: Any, *, distributed: bool = False) -> List[str]:
    """Run the set-up checks of ``cfg`` that read no tensor data; the parts a config has no node for are
    skipped (a generate config has no dataset). Returns one line per part checked, for the user.

    ``distributed``: the checks of ``full_finetune_distributed``, whose resume must come from its own sharded
    folders and whose checkpointer reads the base model folder (the shards hold the resumed weights).

    Raises:
        TuneError: the first problem, with the message the recipe's set-up gives.
    """
    done: List[str] = []
    training_run = "dataset" in cfg and "batch_size" in cfg
    settings = RunSettings.from_config(cfg) if training_run else None
    resume = None
    if training_run:
        done.append(f"output_dir {cfg.output_dir}: {check_output_dir(cfg)}")
        resume = resolve_resume(cfg, settings, checksums=False)
        if distributed:
            check_resume_is_sharded(resume)
        if resume is not None:
            done.append(f"resume state {resume.recipe_state_path}: step {resume.progress.global_step}, same settings")
    tokenizer = None
    if "tokenizer" in cfg:
        tokenizer = config.instantiate(cfg.tokenizer)
        done.append(f"tokenizer {cfg.tokenizer.get('path', cfg.tokenizer[config.COMPONENT_KEY])}: loads")
    if training_run:
        data = build_dataloader(
            cfg.dataset, tokenizer, batch_size=settings.batch_size, shuffle=cfg.shuffle, seed=settings.seed or 0
        )
        steps = data.steps_per_epoch(
            batch_size=settings.batch_size,
            gradient_accumulation_steps=settings.gradient_accumulation_steps,
            max_steps=resume.max_steps_per_epoch if resume is not None else settings.max_steps_per_epoch,
        )
        done.append(f"dataset: {len(data.dataloader.dataset)} examples, {steps} steps per epoch; {data.head}")
        validation = build_validation(
            cfg.get("validation_dataset"),
            tokenizer,
            batch_size=settings.batch_size,
            every_n_steps=cfg.get("eval_every_n_steps"),
        )
        if validation is not None:
            done.append("validation_dataset: its first examples tokenize")
    if "checkpointer" in cfg and "model" in cfg:
        # as each recipe builds it: the distributed one reads the base folder, its resumed weights are shards
        checkpointer = build_checkpointer(cfg.checkpointer, None if distributed else resume)
        # The dtype only names the skeleton's tensors: no device is asked whether it supports it.
        dtype = utils.get_dtype(cfg.get("dtype", "fp32"), torch.device("cpu"))
        skeleton = check_model_fits(cfg, checkpointer, tokenizer, dtype=dtype, resume=resume)
        where = resume.checkpoint_dir if resume is not None else cfg.checkpointer.checkpoint_dir
        done.append(
            f"checkpoint {where}: its config and tensor headers fit the model "
            f"({sum(p.numel() for p in skeleton.parameters()) / 1e6:.1f}M parameters)"
        )
    return done
