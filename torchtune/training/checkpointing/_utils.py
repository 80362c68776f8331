"""torchtune's checkpoint vocabulary: the keys of a recipe's state dict, the file names a save writes, the
model types, and the path helpers its checkpointers (and their tests) use.

The key constants name what ``load_checkpoint`` returns and ``save_checkpoint`` takes besides the weights
(``MODEL_KEY``): the recipe state of a resumable save. The file names are those a save writes into
``output_dir/epoch_N`` (``model-0000i-of-0000n`` shards with an index, ``adapter_model.*``); this library
writes them into an atomic folder with a ``manifest.json`` (``torchtune.utils._checkpointing._atomic``).
"""

from __future__ import annotations

import os
import re
import shutil
import string
import warnings
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from torchtune._errors import TuneError, TuneValueError
from torchtune.utils._checkpointing._manifest import MANIFEST_NAME, RECIPE_STATE_NAME, find_latest_checkpoint
from torchtune.utils._checkpointing._safe_load import load_safetensors_weights, load_torch_weights

# --- keys of the state dict a checkpointer loads and saves --------------------------------------------
MODEL_KEY = "model"
OPT_KEY = "optimizer"
SEED_KEY = "seed"
EPOCHS_KEY = "epochs_run"  # epochs finished so far
TOTAL_EPOCHS_KEY = "total_epochs"
MAX_STEPS_KEY = "max_steps_per_epoch"
STEPS_KEY = "steps_run"
RNG_KEY = "rng_state"
DATALOADER_KEY = "dataloader"
ADAPTER_KEY = "adapter"  # adapter (LoRA) weights
ADAPTER_CONFIG = "adapter_config"

# --- file names of a save ------------------------------------------------------------------------------
ADAPTER_CONFIG_FNAME = "adapter_config"
ADAPTER_MODEL_FNAME = "adapter_model"
SAFETENSOR_INDEX_FNAME = "model.safetensors.index.json"
TORCH_INDEX_FNAME = "pytorch_model.bin.index.json"
SHARD_FNAME = "model-{cpt_idx}-of-{num_shards}"
RECIPE_STATE_DIRNAME = "recipe_state"
REPO_ID_FNAME = "original_repo_id"
# What a save does not copy from the input folder: weights, their indexes, adapters (and this library's
# manifest, which describes the input folder, not the new one).
SUFFIXES_TO_NOT_COPY = [
    ".pt",
    ".pth",
    ".bin",
    ".safetensors",
    SAFETENSOR_INDEX_FNAME,
    TORCH_INDEX_FNAME,
    ADAPTER_CONFIG_FNAME,
    ADAPTER_MODEL_FNAME,
    MANIFEST_NAME,
]


def shard_name(index: int, count: int) -> str:
    """``model-0000{index}-of-0000{count}`` (no suffix), the name of a save's ``index``-th weight file (from 1)."""
    return SHARD_FNAME.format(cpt_idx=str(index).zfill(5), num_shards=str(count).zfill(5))


class ModelType(Enum):
    """The model families a checkpointer's ``model_type`` names (torchtune's spelling: ``ModelType["LLAMA2"]``).

    The Hugging Face checkpointer converts the families this library implements (``LLAMA2``, ``LLAMA3``,
    ``LLAMA3_2``, ``MISTRAL``, ``PHI3_MINI`` / ``PHI4``, ``QWEN2``, ``QWEN3``, ``GEMMA3``); the others are
    torchtune's names, accepted by ``FullModelTorchTuneCheckpointer``, which converts nothing.
    """

    GEMMA = "gemma"
    GEMMA2 = "gemma2"
    GEMMA3 = "gemma3"
    LLAMA2 = "llama2"
    LLAMA3 = "llama3"
    LLAMA3_2 = "llama3_2"
    LLAMA3_VISION = "llama3_vision"
    MISTRAL = "mistral"
    PHI3_MINI = "phi3_mini"
    PHI4 = "phi4"
    REWARD = "reward"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"
    CLIP_TEXT = "clip_text"
    T5_ENCODER = "t5_encoder"


class FormattedCheckpointFiles:
    """A list of numbered file names given as a format and the last number.

    ``FormattedCheckpointFiles("model-{}-of-{}.safetensors", "00003")`` stands for
    ``model-00001-of-00003.safetensors`` ... ``model-00003-of-00003.safetensors``: the form
    ``checkpointer.checkpoint_files`` may take (``{filename_format: ..., max_filename: ...}``) for a model
    of many shards.

    Args:
        filename_format: a format string with exactly two ``{}`` fields (the number, the last number).
        max_filename: the last number as a string; its width (leading zeros) is the width of every number.

    Raises:
        ValueError: the format does not have exactly two fields.
    """

    def __init__(self, filename_format: str, max_filename: str) -> None:
        self.filename_format = filename_format
        self.max_filename = max_filename
        self._validate_filename_format()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FormattedCheckpointFiles":
        """From ``{"filename_format": ..., "max_filename": ...}`` (``checkpointer.checkpoint_files`` in YAML).

        Raises:
            ValueError: a key is missing, or ``max_filename`` is not a string (YAML reads ``00003`` as a
                number: quote it).
        """
        if "filename_format" not in d or "max_filename" not in d:
            raise TuneValueError(
                "Must pass 'filename_format' and 'max_filename' keys to generate checkpoint filenames: "
                f"checkpointer.checkpoint_files is {dict(d)!r}; give e.g. "
                "{filename_format: model-{}-of-{}.safetensors, max_filename: '00004'}."
            )
        if not isinstance(d["max_filename"], str):
            raise TuneValueError(
                f"`max_filename` must be a string, but found {type(d['max_filename'])} instead "
                f"({d['max_filename']!r}): YAML reads an unquoted 00004 as a number, so quote it ('00004')."
            )
        return cls(filename_format=d["filename_format"], max_filename=d["max_filename"])

    def _validate_filename_format(self) -> None:
        fields = [f for _, f, _, _ in string.Formatter().parse(self.filename_format) if f is not None]
        if len(fields) != 2:
            raise TuneValueError(
                f"Filename format string must have exactly two placeholders, e.g. 'file_{{}}_of_{{}}.pth'; "
                f"{self.filename_format!r} has {len(fields)}."
            )

    def build_checkpoint_filenames(self) -> List[str]:
        """The file names, numbered from 1 to ``max_filename`` with its width."""
        width = len(self.max_filename)
        return [
            self.filename_format.format(str(i).zfill(width), self.max_filename)
            for i in range(1, int(self.max_filename) + 1)
        ]


def checkpoint_file_names(checkpoint_files: Any) -> List[str]:
    """``checkpointer.checkpoint_files`` as a list of names: a name, a list, or a ``FormattedCheckpointFiles``
    mapping."""
    if isinstance(checkpoint_files, FormattedCheckpointFiles):
        return checkpoint_files.build_checkpoint_filenames()
    if isinstance(checkpoint_files, Mapping):
        return FormattedCheckpointFiles.from_dict(checkpoint_files).build_checkpoint_filenames()
    if isinstance(checkpoint_files, (str, Path)):
        return [str(checkpoint_files)]
    return [str(f) for f in checkpoint_files]


def get_path(input_dir: Path, filename: str, missing_ok: bool = False) -> Path:
    """``input_dir / filename``, checking that the folder exists and (unless ``missing_ok``) the file too.

    Raises:
        ValueError: ``input_dir`` is no folder, or the file is missing.
    """
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise TuneValueError(f"{input_dir} is not a valid directory. Check checkpointer.checkpoint_dir.")
    path = input_dir / filename
    if not missing_ok and not path.is_file():
        raise TuneValueError(
            f"No file with name: {filename} found in {input_dir}. Check checkpointer.checkpoint_files (names "
            "relative to the folder)."
        )
    return path


def safe_torch_load(checkpoint_path: Union[Path, str], weights_only: bool = True, mmap: bool = True) -> Dict[str, Any]:
    """Load a checkpoint file on the CPU: ``.safetensors`` through safetensors, anything else through
    ``torch.load`` (memory-mapped with ``mmap``; ``weights_only=True`` runs no pickled code).

    Raises:
        ValueError: the file is missing, truncated or not a checkpoint ("Unable to load checkpoint from ...").
    """
    path = Path(checkpoint_path)
    try:
        if path.suffix == ".safetensors":
            return load_safetensors_weights(path)
        return load_torch_weights(path, weights_only=weights_only, mmap=mmap)
    except (TuneError, OSError) as exc:
        raise TuneValueError(f"Unable to load checkpoint from {path}. {exc}") from exc


class ClassifierStateError(TuneError, AssertionError):
    """``update_state_dict_for_classifier`` found no ``output.weight`` (torchtune raises AssertionError)."""


def update_state_dict_for_classifier(
    state_dict: Dict[str, torch.Tensor],
    model_named_parameters: Iterable[Tuple[str, torch.nn.Parameter]],
    force_override: bool = False,
) -> None:
    """Make a language model's ``state_dict`` loadable into a classifier of the same body, in place.

    The classifier's ``output.weight`` has ``num_classes`` rows where the language model's has the vocabulary:
    when the row counts differ (or ``force_override``), the state dict takes the model's own (freshly
    initialised) ``output.weight``. An ``output.bias`` in the state dict is dropped with a warning.

    Raises:
        AssertionError: ``output.weight`` is missing from ``state_dict`` or from the model's parameters.
    """
    output_weight = dict(model_named_parameters).get("output.weight")
    if "output.weight" not in state_dict:
        raise ClassifierStateError("Expected output.weight in state_dict, but it wasn't found.")
    if output_weight is None:
        raise ClassifierStateError("Expected output.weight in model_named_parameters, but it wasn't found.")
    if "output.bias" in state_dict:
        warnings.warn("Found output.bias in state dict - this will not be used!", stacklevel=2)
        state_dict.pop("output.bias")
    if force_override or state_dict["output.weight"].shape[0] != output_weight.shape[0]:
        state_dict["output.weight"] = output_weight


def get_largest_iter_folder(dir: Union[str, Path], pattern: str = r"^epoch_(\d+)") -> Optional[str]:
    """The name of the sub-folder of ``dir`` whose name matches ``pattern`` with the largest number."""
    regex = re.compile(pattern)
    found = [(int(m.group(1)), name) for name in os.listdir(dir) if (m := regex.match(name))]
    return max(found)[1] if found else None


def copy_files(
    input_dir: Union[str, Path],
    output_dir: Union[str, Path],
    *,
    ignore_suffixes: Optional[Sequence[str]] = None,
    max_file_size_mb: int = 100,
) -> None:
    """Copy the files of ``input_dir`` (sub-folders too) that a saved model folder carries besides its weights.

    Skipped: names starting with ``.`` (``.cache/``, ``.git``), names ending with one of ``ignore_suffixes``,
    files over ``max_file_size_mb``, and files the output already has (a save writes ``config.json`` and the
    tokenizer files itself first).
    """
    input_dir, output_dir = Path(input_dir), Path(output_dir)
    limit = max_file_size_mb * 1024 * 1024
    for root, dirs, files in os.walk(input_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        target = output_dir / Path(root).relative_to(input_dir)
        for name in files:
            if name.startswith(".") or (ignore_suffixes and any(name.endswith(s) for s in ignore_suffixes)):
                continue
            source = Path(root) / name
            if source.stat().st_size > limit or (target / name).exists():
                continue
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def get_recipe_checkpoint_path(
    output_dir: Path, recipe_checkpoint: Optional[str] = None, should_load_recipe_state: bool = False
) -> Optional[Path]:
    """The recipe state a checkpointer with ``should_load_recipe_state`` loads (``None`` without it).

    ``recipe_checkpoint`` is relative to ``output_dir`` (or absolute). Without it: torchtune's
    ``output_dir/recipe_state/recipe_state.pt`` if there is one, else the ``recipe_state.pt`` of this
    library's latest complete checkpoint folder in ``output_dir`` (``step_N`` / ``epoch_N``).

    Raises:
        ValueError: there is no such file.
    """
    if not should_load_recipe_state:
        return None
    output_dir = Path(output_dir)
    if recipe_checkpoint:
        path = output_dir / recipe_checkpoint
    else:
        path = output_dir / RECIPE_STATE_DIRNAME / RECIPE_STATE_NAME
        latest = find_latest_checkpoint(output_dir)
        if not path.is_file() and latest is not None:
            path = latest / RECIPE_STATE_NAME
    if not path.is_file():
        raise TuneValueError(
            "If should_load_recipe_state is True, recipe_checkpoint file must be provided: "
            f"{path} does not exist. Set checkpointer.recipe_checkpoint to the recipe_state.pt of the run to "
            "resume (relative to checkpointer.output_dir), or should_load_recipe_state=False."
        )
    return path


def get_adapter_checkpoint_path(
    output_dir: Path,
    adapter_checkpoint: Optional[str] = None,
    should_load_recipe_state: bool = False,
    pattern: str = r"^epoch_(\d+)",
) -> Optional[Path]:
    """The adapter weights a resumed run loads: ``output_dir/adapter_checkpoint``, else
    ``adapter_model.pt`` of the latest folder matching ``pattern`` if it has one; ``None`` when not resuming."""
    if not should_load_recipe_state:
        return None
    output_dir = Path(output_dir)
    if adapter_checkpoint:
        return output_dir / adapter_checkpoint
    latest = get_largest_iter_folder(output_dir, pattern=pattern) if output_dir.is_dir() else None
    if latest is None:
        return None
    path = output_dir / latest / f"{ADAPTER_MODEL_FNAME}.pt"
    return path if path.is_file() else None


def get_model_checkpoint_path(
    checkpoint_files: Union[List[str], Dict[str, str]],
    checkpoint_dir: Union[str, Path],
    output_dir: Union[str, Path],
    should_load_recipe_state: bool,
    has_adapter_checkpoint: bool,
) -> List[Path]:
    """The weight files to load, sorted, each checked to exist.

    They are in ``checkpoint_dir``, except when a full finetune resumes (``should_load_recipe_state`` and no
    adapter): then they are named relative to ``output_dir``. ``checkpoint_files`` is a list of names or a
    ``{filename_format, max_filename}`` mapping (``FormattedCheckpointFiles``).

    Raises:
        ValueError: a file is missing.
    """
    names = checkpoint_file_names(checkpoint_files)
    folder = output_dir if should_load_recipe_state and not has_adapter_checkpoint else checkpoint_dir
    return sorted(get_path(Path(folder), name) for name in names)


def check_outdir_not_in_ckptdir(ckpt_dir: Path, out_dir: Path) -> bool:
    """Refuse an output folder equal to or inside the checkpoint folder (saves would mix with, and later be
    copied along with, the input weights). Returns True when they are apart.

    Raises:
        ValueError: ``out_dir`` is ``ckpt_dir`` or inside it.
    """
    ckpt, out = Path(ckpt_dir).resolve(), Path(out_dir).resolve()
    if out == ckpt or ckpt in out.parents:
        raise TuneValueError(
            "The output directory cannot be the same as or a subdirectory of the checkpoint directory. "
            f"Found checkpointer.checkpoint_dir={ckpt_dir} and checkpointer.output_dir={out_dir}: set "
            "checkpointer.output_dir to a folder outside the checkpoint folder."
        )
    return True


def checkpoint_files_in(folder: Path, configured: Sequence[str]) -> List[str]:
    """The weight files to read from ``folder``, a checkpoint folder a save wrote: the ``configured`` names
    when all are there (this library's Meta saves keep their input's name), else the folder's index
    (Hugging Face saves are ``model-0000i-of-0000n`` shards with an index), else its numbered shards."""
    folder = Path(folder)
    if configured and all((folder / Path(name).name).is_file() for name in configured):
        return [Path(name).name for name in configured]
    for index in (SAFETENSOR_INDEX_FNAME, TORCH_INDEX_FNAME):
        if (folder / index).is_file():
            return [index]
    pattern = re.compile(r"^model-\d{5}-of-\d{5}\.(safetensors|bin)$")
    shards = sorted(p.name for p in folder.iterdir() if pattern.match(p.name))
    return shards or list(configured)
