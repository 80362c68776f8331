"""Resuming a stopped run: what to load, from where, and where to continue.

This module owns resume. ``resolve_resume(cfg, settings)`` reads ``resume_from_checkpoint`` and
``checkpointer.recipe_checkpoint``, loads and checks the recipe state, and returns a
``ResumePlan``: the folder to take the weights from (the one holding ``recipe_state.pt``, not the
base model), the optimizer / scheduler / RNG states and the position to continue from.
``recipe_state(...)`` writes the dict that a later ``resolve_resume`` reads back.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.optim import Optimizer

from torchtune import config
from torchtune._errors import ConfigError, TuneError
from torchtune.training.setup._model import model_fingerprint
from torchtune.utils import get_rng_state, set_rng_state, set_seed
from torchtune.utils._checkpointing import RECIPE_STATE_NAME, load_recipe_state
from torchtune.utils._checkpointing._manifest import (
    ChecksumJob,
    check_checksums,
    check_file_sizes,
    verify_checkpoint_files,
)

log = logging.getLogger("torchtune")

__all__ = [
    "RECIPE_STATE_NAME",
    "ResumePlan",
    "RunSettings",
    "TrainingProgress",
    "build_checkpointer",
    "check_loaded_checksums",
    "recipe_state",
    "resolve_resume",
    "resume_command",
    "seed_or_restore",
]

RECIPE_STATE_VERSION = 1
_REQUIRED = (
    "optimizer",
    "optimizer_in_bwd",
    "seed",
    "epochs_run",
    "total_epochs",
    "max_steps_per_epoch",
    "global_step",
    "steps_run_in_epoch",
    "batch_size",
    "gradient_accumulation_steps",
    "rng_state",
)


@dataclasses.dataclass
class TrainingProgress:
    """Where a run is: finished epochs, optimizer steps in all, steps into the current epoch."""

    epochs_run: int = 0
    global_step: int = 0
    steps_run_in_epoch: int = 0


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The settings of this run that decide whether (and how) a checkpoint can be continued.

    ``seed`` is the config's value (``None``: draw one).
    """

    optimizer_in_bwd: bool
    batch_size: int
    gradient_accumulation_steps: int
    seed: Optional[int]
    max_steps_per_epoch: Optional[int]
    epochs: int

    @classmethod
    def from_config(cls, cfg: Any, world_size: int = 1) -> "RunSettings":
        """The settings of a recipe config (its values checked by ``check_loop_keys``) on ``world_size``
        processes. ``batch_size`` here is the global batch (the examples of one micro-step on all
        processes): the config's ``batch_size`` (per process) times ``world_size``, or its
        ``global_batch_size``."""
        from torchtune.training.setup._checks import positive_int

        global_batch = cfg.get("global_batch_size")
        return cls(
            optimizer_in_bwd=bool(cfg.optimizer_in_bwd),
            batch_size=global_batch if global_batch is not None else positive_int(cfg, "batch_size") * world_size,
            gradient_accumulation_steps=positive_int(cfg, "gradient_accumulation_steps"),
            seed=cfg.seed,
            max_steps_per_epoch=positive_int(cfg, "max_steps_per_epoch", allow_none=True),
            epochs=positive_int(cfg, "epochs"),
        )


@dataclasses.dataclass
class ResumePlan:
    """What a resumed run loads, and where it continues. Made by :func:`resolve_resume`."""

    recipe_state_path: Path
    state: Dict[str, Any]
    # The background checksum check of recipe_state.pt (checkpointer.verify_checksums=background).
    checksums: Optional[ChecksumJob] = None

    @property
    def checkpoint_dir(self) -> Path:
        """The folder the weights come from: the checkpoint next to ``recipe_state.pt``."""
        return self.recipe_state_path.parent

    @property
    def progress(self) -> TrainingProgress:
        s = self.state
        return TrainingProgress(int(s["epochs_run"]), int(s["global_step"]), int(s["steps_run_in_epoch"]))

    @property
    def seed(self) -> int:
        return int(self.state["seed"])

    @property
    def max_steps_per_epoch(self) -> Optional[int]:
        return self.state["max_steps_per_epoch"]

    @property
    def optimizer_state(self) -> Dict[str, Any]:
        return self.state["optimizer"]

    @property
    def lr_scheduler_state(self) -> Optional[Dict[str, Any]]:
        return self.state.get("lr_scheduler")

    @property
    def rng_state(self) -> Dict[str, Any]:
        return self.state["rng_state"]

    @property
    def stochastic_rounding_state(self) -> Optional[Dict[str, Any]]:
        """The rounding stream's position (``None``: the run was saved without stochastic rounding)."""
        return self.state.get("stochastic_rounding")

    def drop_loaded_states(self) -> None:
        """Forget the loaded optimizer and scheduler states once they have been restored."""
        self.state.pop("optimizer", None)
        self.state.pop("lr_scheduler", None)

    def check_model(self, model: nn.Module) -> None:
        """Refuse a model whose parameter names or shapes differ from the checkpoint's."""
        saved = self.state.get("model_fingerprint")
        if saved is not None and saved != model_fingerprint(model):
            raise TuneError(
                f"The recipe checkpoint {self.recipe_state_path} was written for a different model (its "
                "parameter names or shapes differ from this config's model, or, for Qwen and Phi models, it was "
                "saved before their RoPE took Hugging Face's channel layout). Resume with the model config it was "
                "trained with; a Qwen/Phi step checkpoint of an older release cannot be resumed: start from its "
                "epoch folder (Hugging Face format, converted on load) instead."
            )


def seed_or_restore(
    resume: Optional[ResumePlan], *, seed: Optional[int], settings: RunSettings
) -> Tuple[int, TrainingProgress, Optional[int]]:
    """Seed the run (``seed``; None draws one), or, resuming, restore the checkpoint's seed and RNG state.
    Returns ``(seed, progress, max_steps_per_epoch)``: a resumed run continues its position and keeps
    the epoch length it was saved with."""
    # Every rank seeds alike (the distributed recipe agrees on one seed first): its ranks draw what one
    # process would, so the run is the single-process run with the same global batch.
    if resume is None:
        return set_seed(seed, offset_by_rank=False), TrainingProgress(), settings.max_steps_per_epoch
    restored = set_seed(resume.seed, offset_by_rank=False)
    set_rng_state(resume.rng_state)
    return restored, resume.progress, resume.max_steps_per_epoch


def _recipe_state_path(cfg: Any, recipe_checkpoint: Any) -> Path:
    path = Path(str(recipe_checkpoint)).expanduser()
    if not path.is_absolute() and not path.exists():
        path = Path(str(cfg.checkpointer.checkpoint_dir)) / path  # relative to the weights, as torchtune has it
    if not path.is_file():
        raise TuneError(_missing_recipe_state_message(recipe_checkpoint, path))
    return path.resolve()


def _missing_recipe_state_message(recipe_checkpoint: Any, path: Path) -> str:
    """Why ``path`` is not there, and which ``step_N`` to resume from instead."""
    folder = path.parent if path.name == RECIPE_STATE_NAME or path.suffix else path
    final = folder.is_dir() and folder.name.startswith("epoch_") and not (folder / RECIPE_STATE_NAME).exists()
    if not final:
        return (
            f"checkpointer.recipe_checkpoint={recipe_checkpoint} does not exist (looked for {path}). Point it "
            f"at the {RECIPE_STATE_NAME} inside a checkpoint folder of the run to resume."
        )
    steps = [p.parent for p in folder.parent.glob(f"step_*/{RECIPE_STATE_NAME}") if p.parent.name[5:].isdigit()]
    latest = max(steps, key=lambda f: int(f.name[5:])) if steps else None
    instead = (
        f"resume from a step_N instead: checkpointer.recipe_checkpoint={latest / RECIPE_STATE_NAME}"
        if latest is not None
        else f"no step_N of the run with a {RECIPE_STATE_NAME} is left in {folder.parent}"
    )
    return (
        f"checkpointer.recipe_checkpoint={recipe_checkpoint} points into {folder}, a final checkpoint: the run's "
        f"last save keeps only the weights (no {RECIPE_STATE_NAME}), so there is nothing to resume there; {instead}. "
        f"To train on from the final weights, start a new run with checkpointer.checkpoint_dir={folder} "
        "(resume_from_checkpoint=False) and another output_dir."
    )


def check_resume_keys(cfg: Any) -> None:
    """``resume_from_checkpoint`` and ``checkpointer.recipe_checkpoint`` agree: both set, or neither.
    Reads no file, so ``tune validate`` runs it too.

    Raises:
        ConfigError: naming both keys and the two ways to make them agree.
    """
    resume = bool(cfg.resume_from_checkpoint)
    recipe_checkpoint = cfg.checkpointer.get("recipe_checkpoint")
    if not resume and recipe_checkpoint:
        raise ConfigError(
            f"checkpointer.recipe_checkpoint={recipe_checkpoint} is set but resume_from_checkpoint is False, "
            "so it would be ignored. Set resume_from_checkpoint=True to continue that run, or "
            "checkpointer.recipe_checkpoint=null to start a new one."
        )
    if resume and not recipe_checkpoint:
        raise ConfigError(
            f"resume_from_checkpoint=True needs checkpointer.recipe_checkpoint: the path of the {RECIPE_STATE_NAME} "
            "saved by the run to resume (e.g. checkpointer.recipe_checkpoint=OUTPUT_DIR/step_100/"
            f"{RECIPE_STATE_NAME})."
        )


def resolve_resume(cfg: Any, settings: RunSettings, *, checksums: bool = True) -> Optional[ResumePlan]:
    """The resume plan of ``cfg``, or ``None`` for a new run.

    The recipe state is memory-mapped: its metadata (settings, position, fingerprint) is read, its tensors
    are not until used. ``checksums=False`` checks the file's size but not its checksum (which reads every
    byte): ``tune validate`` reads no tensor data.

    Raises:
        ConfigError: ``resume_from_checkpoint`` and ``checkpointer.recipe_checkpoint`` disagree.
        TuneError: the recipe state is missing, damaged, not a recipe state, or was written with an
            ``optimizer_in_bwd`` / ``batch_size`` / ``gradient_accumulation_steps`` that differs from
            this run's (the saved optimizer state or data position would mean something else).
    """
    check_resume_keys(cfg)
    if not cfg.resume_from_checkpoint:
        return None
    path = _recipe_state_path(cfg, cfg.checkpointer.get("recipe_checkpoint"))
    # The checkpointer's own key (its default when absent): the recipe state is checked like the weights.
    if checksums:
        job = verify_checkpoint_files(path.parent, [path.name], cfg.checkpointer.get("verify_checksums", "before_load"))
    else:
        job = None
        check_file_sizes(path.parent, [path.name])
    try:
        state = load_recipe_state(path)
    except TuneError:
        if job is not None:
            job.check(wait=True)  # a damaged file is better named by its checksum
        raise
    if _TORCHTUNE_STATE_KEYS <= set(state) and "global_step" not in state:
        raise TuneError(torchtune_state_refusal(path, state))
    missing = [k for k in _REQUIRED if k not in state]
    if "model" in state or missing:
        raise TuneError(
            f"{path} is not a resumable recipe state (it lacks {', '.join(missing) or 'the recipe keys'}); it was "
            "not written by this recipe, or by a final, non-resumable save. Point checkpointer.recipe_checkpoint at "
            f"a {RECIPE_STATE_NAME} from a step or epoch folder."
        )
    _check_settings(state, settings)
    return ResumePlan(recipe_state_path=path, state=state, checksums=job)


# The keys of the recipe_state.pt torchtune 0.6.1's full-finetune recipes write (besides the optimizer's).
_TORCHTUNE_STATE_KEYS = {"seed", "epochs_run", "total_epochs", "max_steps_per_epoch", "optimizer"}


def torchtune_state_refusal(path: Path, state: Dict[str, Any]) -> str:
    """Why a ``recipe_state.pt`` torchtune wrote is not resumed here, and how to continue from its weights."""
    done, total = state.get("epochs_run"), state.get("total_epochs")
    folder = path.parent.parent / f"epoch_{done - 1}" if isinstance(done, int) and done > 0 else None
    weights = str(folder) if folder is not None and folder.is_dir() else "its last epoch_N folder"
    return (
        f"{path} was written by torchtune (after {done} of {total} epochs): it holds the optimizer state and the "
        "finished epochs, but not what a resume here continues from: the position in the data order (torchtune's "
        "sampler orders the examples otherwise than this library's), the RNG states, the step count and the batch "
        "settings, and no LR schedule state. So it is not resumed. To go on from that run here, start a new run "
        f"from its weights (checkpointer.checkpoint_dir={weights} resume_from_checkpoint=False "
        "checkpointer.recipe_checkpoint=null, with the epochs left), the optimizer starting afresh; or resume it "
        "with torchtune."
    )


def check_loaded_checksums(resume: Optional[ResumePlan], checkpointer: Any, *, wait: bool = False) -> None:
    """Raise if a background checksum check of what set-up loaded (``recipe_state.pt``, the weights)
    found a damaged file; ``wait=True`` waits for the checks to finish (before a save).

    Raises:
        TuneError: naming the damaged file and the checkpoint to fall back to.
    """
    check_checksums(
        resume.checksums if resume is not None else None, getattr(checkpointer, "checksums", None), wait=wait
    )


def _check_settings(state: Dict[str, Any], settings: RunSettings) -> None:
    if bool(state["optimizer_in_bwd"]) != settings.optimizer_in_bwd:
        saved = bool(state["optimizer_in_bwd"])
        raise TuneError(
            f"The recipe checkpoint was made with optimizer_in_bwd={saved} but this run has "
            f"optimizer_in_bwd={settings.optimizer_in_bwd}; the optimizer state cannot be carried across. "
            f"Resume with optimizer_in_bwd={saved}."
        )
    if state["batch_size"] != settings.batch_size:
        saved, ours = state["batch_size"], settings.batch_size
        raise TuneError(
            f"The recipe checkpoint was made with a global batch of {saved} (batch_size x processes), this run "
            f"has {ours}: the saved position inside the epoch would point at other data. Resume with a batch_size "
            f"that times the number of processes makes {saved}, or set global_batch_size={saved} (distributed)."
        )
    key = "gradient_accumulation_steps"
    if state[key] != settings.gradient_accumulation_steps:
        saved, ours = state[key], settings.gradient_accumulation_steps
        raise TuneError(
            f"The recipe checkpoint was made with {key}={saved}, this run has {key}={ours}: the saved "
            f"position inside the epoch would point at other data. Resume with {key}={saved}."
        )
    if settings.seed is not None and state["seed"] != settings.seed:
        log.warning(
            "seed=%s differs from the checkpoint's seed=%s; using the checkpoint's so the data order continues.",
            settings.seed,
            state["seed"],
        )
    if state["max_steps_per_epoch"] != settings.max_steps_per_epoch:
        log.warning(
            "max_steps_per_epoch=%s differs from the checkpoint's %s; using the checkpoint's.",
            settings.max_steps_per_epoch,
            state["max_steps_per_epoch"],
        )
    if state["total_epochs"] != settings.epochs:
        log.warning(
            "epochs=%s differs from the checkpoint's %s; training to %s epochs, and the LR schedule continues "
            "with the new total.",
            settings.epochs,
            state["total_epochs"],
            settings.epochs,
        )


def sync_paged_optimizer_state(optimizer: Any) -> None:
    """Wait for the device before a paged optimizer's state is read from the host.

    bitsandbytes' paged state is CUDA managed memory that its kernels update asynchronously; a host
    read (``state_dict`` then the checkpointer's copy) must not start before the last step's kernels
    finish. An explicit sync says so here, instead of relying on some unrelated ``.item()`` having
    synced before the save. Costs nothing measurable at a save; a no-op for other optimizers.
    """
    members = getattr(optimizer, "optim_map", None)
    optimizers = members.values() if isinstance(members, dict) else [optimizer]
    if any(getattr(opt, "is_paged", False) for opt in optimizers) and torch.cuda.is_available():
        torch.cuda.synchronize()


def build_checkpointer(cfg_checkpointer: Any, resume: Optional[ResumePlan]) -> Any:
    """The checkpointer of ``cfg_checkpointer``; a resumed run reads its weights from the resumed folder."""
    if resume is None:
        return config.instantiate(cfg_checkpointer)
    # A checkpoint folder holds the weights (in the input format) next to recipe_state.pt; the checkpointer
    # reads them under the names the save wrote.
    return config.instantiate(cfg_checkpointer, checkpoint_dir=str(resume.checkpoint_dir))


def recipe_state(
    *,
    optimizer: Optimizer,
    lr_scheduler: Any,
    progress: TrainingProgress,
    settings: RunSettings,
    seed: int,
    max_steps_per_epoch: Optional[int],
    model: nn.Module,
    stochastic_rounding: Any = None,
    optimizer_state: Any = None,
) -> Dict[str, Any]:
    """Everything besides the weights that an exact resume needs, as :func:`resolve_resume` reads it.

    ``stochastic_rounding``: the run's ``StochasticRounding`` (its random stream continues on resume).
    ``optimizer_state`` replaces ``optimizer.state_dict()`` where the state is saved elsewhere (the
    distributed recipe writes it sharded with torch.distributed.checkpoint and records where).
    """
    if optimizer_state is None:
        sync_paged_optimizer_state(optimizer)
    return {
        "recipe_state_version": RECIPE_STATE_VERSION,
        "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
        "optimizer_in_bwd": settings.optimizer_in_bwd,
        "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
        "seed": seed,
        "epochs_run": progress.epochs_run,
        "total_epochs": settings.epochs,
        "max_steps_per_epoch": max_steps_per_epoch,
        "global_step": progress.global_step,
        "steps_run_in_epoch": progress.steps_run_in_epoch,
        "batch_size": settings.batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "rng_state": get_rng_state(),
        "model_fingerprint": model_fingerprint(model),
        "stochastic_rounding": stochastic_rounding.state_dict() if stochastic_rounding is not None else None,
    }


def resume_command(
    recipe: str, recipe_checkpoint: Path, argv: Optional[Sequence[str]] = None, launch_options: Sequence[str] = ()
) -> str:
    """The ``tune run`` command line that resumes this run (``argv``: this process's, by default).

    ``recipe`` is the built-in recipe's name; a copy of the recipe run as a script (``tune cp``)
    resumes with the copy. ``launch_options``: the torchrun options the run was started with
    (``--nproc_per_node 2`` ...), written between ``run`` and the recipe as they were given.
    """
    argv = list(sys.argv if argv is None else argv)
    script, args = (argv[0] if argv else ""), argv[1:]
    config_path = None
    if "--config" in args[:-1]:
        i = args.index("--config")
        config_path = args[i + 1]
        del args[i : i + 2]
    elif any(a.startswith("--config=") for a in args):
        config_path = next(a for a in args if a.startswith("--config=")).split("=", 1)[1]
        args = [a for a in args if not a.startswith("--config=")]
    overrides = [a for a in args if not a.startswith(("resume_from_checkpoint=", "checkpointer.recipe_checkpoint="))]
    from torchtune import _recipe_registry

    builtin = _recipe_registry.get_recipe(recipe)
    is_copy = script.endswith(".py") and builtin is not None and Path(script).resolve() != builtin.path.resolve()
    parts = [
        "tune",
        "run",
        *launch_options,
        script if is_copy else recipe,
        "--config",
        config_path or "CONFIG",
        *overrides,
        "resume_from_checkpoint=True",
        f"checkpointer.recipe_checkpoint={recipe_checkpoint}",
    ]
    return " ".join(shlex.quote(p) for p in parts)
