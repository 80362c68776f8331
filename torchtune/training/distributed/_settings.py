"""The distributed recipe's own settings: the checks of its FSDP and launch keys (no process group:
``tune validate`` and ``tune run --nproc_per_node`` run them before any process starts), each rank's batch
(``batch_size`` per process, or a share of ``global_batch_size``), and which checkpoints it resumes from."""

from __future__ import annotations

import logging
from typing import Any

from torchtune import config, utils
from torchtune._errors import ConfigError, TuneError
from torchtune.training.setup._checks import positive_int

log = logging.getLogger("torchtune")

__all__ = ["check_distributed_settings", "check_resume_is_sharded", "local_batch_size"]


def check_distributed_settings(cfg: Any) -> None:
    """The keys only the distributed recipe reads, and the optimizers that cannot step sharded parameters.

    Raises:
        ConfigError: naming the key to change.
    """
    from torchtune.training.distributed._fsdp import backend_for_device
    from torchtune.training.optim._stochastic_rounding import check_stochastic_rounding

    check_stochastic_rounding(cfg, sharded=True)  # each rank rounds its own shard: elementwise updates only
    device = utils.parse_device(cfg.device)
    try:
        backend_for_device(device.type, cfg.dist_backend)
    except TuneError as exc:
        raise ConfigError(str(exc)) from exc
    if device.index is not None:
        raise ConfigError(
            f"device={cfg.device} names a GPU index; each process takes the GPU of its local rank. Set "
            f"device={device.type}."
        )
    if cfg.fsdp_param_dtype is not None:
        utils.dtype_name(cfg.fsdp_param_dtype)  # bf16 or fp32 in any spelling
    if cfg.fsdp_reduce_dtype is not None and cfg.fsdp_reduce_dtype != "fp32":
        raise ConfigError(
            f"fsdp_reduce_dtype={cfg.fsdp_reduce_dtype!r}: use null (reduce gradients in the parameters' dtype) or "
            "fp32 (sum the ranks' gradients in fp32: more exact with bf16, twice the communication)."
        )
    if not isinstance(cfg.async_checkpoint, bool):
        raise ConfigError(
            f"async_checkpoint={cfg.async_checkpoint!r}: use True (step checkpoints are written in the background "
            "while training goes on) or False (training waits for each save)."
        )
    reshard = cfg.fsdp_reshard_after_forward
    if not isinstance(reshard, bool):
        raise ConfigError(
            f"fsdp_reshard_after_forward={reshard!r}: use True (free each layer's gathered weights after its forward: "
            "least memory) or False (keep them until backward: one all-gather less per layer)."
        )
    component = str(cfg.optimizer.get(config.COMPONENT_KEY, ""))
    if component.startswith("bitsandbytes."):
        raise ConfigError(
            f"optimizer._component_={component}: bitsandbytes optimizers cannot step FSDP2's sharded (DTensor) "
            "parameters, and stepping each rank's shard alone would quantize other blocks than one process does, "
            "so the run would not be the same. Use torchao.optim.AdamW8bit (its 8-bit state is sharded with the "
            "parameters) or torch.optim.AdamW, e.g. optimizer._component_=torchao.optim.AdamW8bit."
        )
    if component.startswith("torchao.") and "4bit" in component:
        raise ConfigError(
            f"optimizer._component_={component}: torchao's 4-bit AdamW fails on FSDP2's sharded (DTensor) "
            "parameters with this PyTorch (its compiled 4-bit step does not take DTensor shards). Use "
            "torchao.optim.AdamW8bit (twice the state of 4-bit, a quarter of fp32 AdamW's), e.g. "
            "optimizer._component_=torchao.optim.AdamW8bit."
        )


def local_batch_size(cfg: Any, info: Any) -> int:
    """Each rank's batch (``info``: the ``DistributedInfo``): ``batch_size``, as in torchtune (per process), or
    the rank's share of ``global_batch_size`` when that is set (the same global batch on any number of
    processes, so a run can resume on another world size); logs the split.

    Raises:
        RankErrors: a global batch that does not split evenly over the ranks (rank 0 prints it).
    """
    from torchtune.training.distributed._fsdp import RankErrors

    world = info.world_size
    global_batch = cfg.get("global_batch_size")
    if global_batch is None:
        local = positive_int(cfg, "batch_size")
        global_batch = local * world
    else:
        if global_batch % world:
            raise RankErrors(
                f"global_batch_size={global_batch} does not split evenly over {world} processes. Set it to a multiple "
                f"of {world} (e.g. {world * max(1, global_batch // world)}), start a number of processes that divides "
                "it, or set batch_size (per process) instead. A resumed run keeps the global batch it was saved with.",
                quiet=not info.is_rank_zero,
            )
        local = global_batch // world
    ga = positive_int(cfg, "gradient_accumulation_steps")
    log.info(
        "batch: %d per rank x %d rank%s = global batch %d%s",
        local,
        world,
        "" if world == 1 else "s",
        global_batch,
        f"; x {ga} accumulation steps = {global_batch * ga} examples per optimizer step" if ga > 1 else "",
    )
    return local


def check_resume_is_sharded(resume: Any) -> None:
    """A resume (a ``ResumePlan``, or None) of the distributed recipe must come from its own folders.

    Raises:
        TuneError: the recipe state was written by the single-device recipe (full optimizer state).
    """
    from torchtune.training.distributed._checkpoint import SHARDED_STATE_MARKER

    if resume is not None and resume.optimizer_state != SHARDED_STATE_MARKER:
        raise TuneError(
            f"{resume.recipe_state_path} was written by the single-device recipe, whose checkpoints hold "
            "the full optimizer state in one file; this recipe resumes from its own step_N / epoch_N folders "
            "(sharded state). Point checkpointer.recipe_checkpoint at the recipe_state.pt of a step_N or epoch_N "
            "folder of a full_finetune_distributed run, resume this one with full_finetune_single_device, or "
            f"start from its weights (checkpointer.checkpoint_dir={resume.checkpoint_dir}, "
            "resume_from_checkpoint=False)."
        )
