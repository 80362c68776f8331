"""Checkpointers: read a model in its published format, hand out torchtune names, write it back the same way.

``FullModelHFCheckpointer`` reads and writes Hugging Face folders (safetensors or ``.bin``, one file or
sharded with an index); ``FullModelMetaCheckpointer`` reads and writes Meta's ``consolidated.00.pth``;
``FullModelTorchTuneCheckpointer`` torchtune's own ``.pt`` of the model's state dict. They take torchtune
0.6.1's arguments and calls. Every save is atomic (see ``_atomic.py``) and carries a ``manifest.json`` that
is verified when the folder is loaded again to resume.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Tuple, Union

import torch
from torch import nn

from torchtune._assets import missing_path_hint
from torchtune._errors import ConfigError, TuneError, TuneValueError
from torchtune.models._hf_config import MODEL_TYPES, HFModelConfig
from torchtune.models._hf_convert import hf_sources, hf_to_tune, tune_to_hf_plan, tune_to_hf_tensor
from torchtune.models._hf_family import (
    canonical_model_type,
    check_shape,
    check_yaml_model_type,
    detect_family,
    families,
    supported_model_types,
)
from torchtune.models.llama2._convert_weights import meta_to_tune, tune_to_meta
from torchtune.training.checkpointing._hf_side_files import write_hf_side_files
from torchtune.training.checkpointing._utils import (
    ADAPTER_CONFIG,
    ADAPTER_CONFIG_FNAME,
    ADAPTER_KEY,
    ADAPTER_MODEL_FNAME,
    MODEL_KEY,
    REPO_ID_FNAME,
    SAFETENSOR_INDEX_FNAME,
    SUFFIXES_TO_NOT_COPY,
    TORCH_INDEX_FNAME,
    FormattedCheckpointFiles,
    ModelType,
    check_outdir_not_in_ckptdir,
    checkpoint_file_names,
    checkpoint_files_in,
    copy_files,
    get_adapter_checkpoint_path,
    get_recipe_checkpoint_path,
    safe_torch_load,
    shard_name,
)
from torchtune.utils._checkpointing._atomic import write_folder_atomically
from torchtune.utils._checkpointing._manifest import (
    MANIFEST_NAME,
    RECIPE_STATE_NAME,
    ChecksumJob,
    check_checksum_mode,
    check_file_sizes,
    verify_checkpoint_files,
)
from torchtune.utils._checkpointing._safe_load import (
    load_recipe_state,
    load_safetensors_weights,
    load_torch_weights,
    safetensors_skeleton,
)
from torchtune.utils._checkpointing._streaming_write import safetensors_order, save_torch, write_safetensors
from torchtune.utils._checkpointing._weight_reader import (
    FileReader,
    StateDictReader,
    WeightReader,
    safetensors_shapes,
)

log = logging.getLogger("torchtune")


def _write_safetensors_file(path: Path, specs: list, tensors: Iterator[torch.Tensor]) -> str:
    """Stream one safetensors file to disk; returns its checksum (a seam the tests use to simulate a full disk)."""
    return write_safetensors(path, specs, tensors, metadata={"format": "pt"}).digest


def _save_torch_file(obj: Any, path: Path) -> str:
    """Write one ``torch.save`` file; returns its checksum (a seam the tests use to simulate a full disk)."""
    return save_torch(obj, path).digest


# What a save needs to know of each tensor before its data: dtype and shape.
TensorSpec = Tuple[torch.dtype, torch.Size]


def _hf_spec(parts: list[TensorSpec]) -> TensorSpec:
    """Dtype and shape of the HF tensor stacked from ``parts`` (rows of each, in order)."""
    dtype, first = parts[0]
    rows = sum(shape[0] for _, shape in parts)
    return dtype, torch.Size((rows, *first[1:])) if len(parts) > 1 else first


def tensor_specs(state_dict: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """``{name: (dtype, shape)}`` of a state dict (what :meth:`write_weights` announces before any data)."""
    return {k: (t.dtype, t.shape) for k, t in state_dict.items()}


def _shorten(items: list[str], limit: int = 20) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def validate_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Check that ``state_dict`` has exactly ``model``'s parameter names and shapes.

    Works on a model built on the meta device. Dtypes are not compared (loading casts).

    Raises:
        TuneError: listing missing keys, unexpected keys and shape mismatches (with both shapes).
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and state_dict[k].shape != v.shape
    ]
    if not (missing or unexpected or mismatched):
        return
    tie_hint = ""
    if "output.weight" in missing:
        tie_hint = (
            " The checkpoint has no output projection (lm_head.weight), as models with tied embeddings "
            "(tie_word_embeddings: true in config.json, as Llama 3.2 1B/3B) have none: build the model with "
            "tied embeddings (the llama3_2 builders, or +model.tie_word_embeddings=True on a component builder that "
            "takes it; the + adds a key the model node lacks), or check that "
            "checkpointer.checkpoint_files lists every file."
        )
    elif "output.weight" in unexpected:
        tie_hint = (
            " The checkpoint has its own output projection (lm_head.weight, tie_word_embeddings: false) but "
            "the model ties it to the token embedding: set model.tie_word_embeddings=False (+model.tie_word_embeddings="
            "False when the model node has no such key), or use the builder for these weights."
        )
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {_shorten(missing)}")
    if unexpected:
        problems.append(f"in the checkpoint but not in the model: {_shorten(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {_shorten(mismatched)}")
    raise TuneError(
        "The checkpoint does not fit the model: " + "; ".join(problems) + ". The model builder in the "
        "config (model._component_) probably does not match the checkpoint's config.json / params.json "
        "(size, vocab_size, heads): choose the builder for these weights, or point "
        "checkpointer.checkpoint_dir at the weights of this model." + tie_hint
    )


class _FullModelCheckpointer:
    """What the checkpointers share: torchtune's constructor arguments and their checks, the recipe-state
    and adapter loading of a resumed run, and the atomic save (weights, adapter, recipe state, side files)."""

    def __init__(
        self,
        checkpoint_dir: Union[str, Path],
        checkpoint_files: Union[str, Sequence[str], Mapping[str, str]],
        model_type: str = "LLAMA2",
        output_dir: Union[str, Path, None] = None,
        adapter_checkpoint: Optional[str] = None,
        recipe_checkpoint: Optional[str] = None,
        resume_from_checkpoint: bool = False,
        should_load_recipe_state: bool = False,
        *,
        verify_checksums: str = "before_load",
    ) -> None:
        self._checkpoint_dir = Path(checkpoint_dir).expanduser()
        if not self._checkpoint_dir.is_dir():
            raise TuneValueError(
                f"The checkpoint folder {self._checkpoint_dir} does not exist."
                f"{missing_path_hint(self._checkpoint_dir)} "
                "Set checkpointer.checkpoint_dir to the folder that holds the model weights "
                "(download them with `tune download`)."
            )
        self.check_config_args(
            "checkpointer",
            {"model_type": model_type, "checkpoint_files": checkpoint_files, "verify_checksums": verify_checksums},
        )
        self._model_type = self._canonical_model_type(model_type)
        if output_dir is None:
            raise TuneValueError(
                "checkpointer.output_dir is not set: set it to the folder where checkpoints should be written."
            )
        self._output_dir = Path(output_dir).expanduser()
        check_outdir_not_in_ckptdir(self._checkpoint_dir, self._output_dir)
        if resume_from_checkpoint:
            log.warning(
                "checkpointer.resume_from_checkpoint is deprecated (as in torchtune): use should_load_recipe_state."
            )
        self._should_load_recipe_state = bool(should_load_recipe_state or resume_from_checkpoint)
        # torchtune's resume through the checkpointer alone: the recipe state, the adapter and the weights
        # come from output_dir. This library's recipes resume through torchtune.training.resolve_resume,
        # which points checkpoint_dir at the folder to resume from; recipe_checkpoint is then only read there.
        self.recipe_checkpoint = recipe_checkpoint
        self._recipe_checkpoint = get_recipe_checkpoint_path(
            self._output_dir, recipe_checkpoint, self._should_load_recipe_state
        )
        self._adapter_checkpoint = get_adapter_checkpoint_path(
            self._output_dir, adapter_checkpoint, self._should_load_recipe_state
        )
        self._checkpoint_files = checkpoint_file_names(checkpoint_files)
        # The folder the weight files are in: checkpoint_dir, or output_dir for torchtune's resume of a
        # full finetune (its checkpoint_files are then relative to output_dir).
        base = (
            self._output_dir
            if self._should_load_recipe_state and self._adapter_checkpoint is None
            else self._checkpoint_dir
        )
        names = self._checkpoint_files
        if (base / MANIFEST_NAME).is_file() and not all((base / name).is_file() for name in names):
            # A folder this library saved holds one model under the names a save writes (Hugging Face:
            # model-0000i-of-0000n with its index), whatever the input's names were: read those.
            names = checkpoint_files_in(base, names)
            log.info("Reading %s from %s (the files its save wrote)", names, base)
        paths = [self._existing_file(name, base) for name in names]
        folders = {p.parent.resolve() for p in paths}
        if len(folders) > 1:
            raise TuneValueError(
                f"checkpointer.checkpoint_files are in {len(folders)} folders "
                f"({', '.join(map(str, sorted(folders)))}); a checkpoint's weight files are read from one folder. "
                "List the files of one checkpoint."
            )
        self._weights_dir = paths[0].parent
        self._weight_file_names = [p.name for p in paths]
        self._verify_checksums = check_checksum_mode(verify_checksums)
        # The background checksum check of the files load_checkpoint read (verify_checksums=background).
        self.checksums: Optional[ChecksumJob] = None
        if self._should_load_recipe_state:
            log.info(
                "Loading the recipe state: weights %s, recipe state %s, adapter %s",
                [str(p) for p in paths],
                self._recipe_checkpoint,
                self._adapter_checkpoint,
            )

    @staticmethod
    def _canonical_model_type(model_type: str) -> Optional[str]:
        return canonical_model_type(model_type)

    @staticmethod
    def check_config_args(key: str, fields: Mapping[str, Any]) -> None:
        """The checks of the arguments that need no file (``config.validate`` runs them before anything is
        built): a known ``model_type``, a way to verify checksums, at least one weight file."""
        model_type = fields.get("model_type", "LLAMA2")
        if canonical_model_type(model_type) is None:
            alias = ""
            if str(model_type).upper() == "LLAMA3_1":
                alias = " (Llama 3.1 is LLAMA3: Llama 3 and 3.1 share one format)"
            raise ConfigError(
                f"{key}.model_type={model_type} is not supported{alias}; use one of {supported_model_types()}."
            )
        _check_common_args(key, fields)

    # --- helpers -----------------------------------------------------------------------------------
    def _existing_file(self, name: Union[str, Path], base: Optional[Path] = None) -> Path:
        base = self._checkpoint_dir if base is None else base
        path = Path(name)
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise TuneValueError(
                f"The checkpoint file {path} does not exist. Check checkpointer.checkpoint_files "
                f"(names relative to {base})."
            )
        return path

    def _verify(self, names: list[str]) -> None:
        """Verify files of our own earlier output (folders that carry manifest.json): sizes now, sums
        now or in the background (``verify_checksums``)."""
        self.checksums = verify_checkpoint_files(self._weights_dir, names, self._verify_checksums)

    def _read(self, load: Callable[[Path], dict[str, torch.Tensor]], path: Path) -> dict[str, torch.Tensor]:
        try:
            return load(path)
        except TuneError:
            if self.checksums is not None:
                self.checksums.check(wait=True)  # a damaged file is better named by its checksum
            raise

    def _finish_load(self, model_sd: dict[str, torch.Tensor]) -> dict[str, Any]:
        """``{"model": model_sd}``, with the adapter (``"adapter"``) and the recipe state of torchtune's
        resume through the checkpointer (``should_load_recipe_state``)."""
        state: dict[str, Any] = {MODEL_KEY: model_sd}
        if self._adapter_checkpoint is not None:
            state[ADAPTER_KEY] = safe_torch_load(self._adapter_checkpoint)
        if self._recipe_checkpoint is not None:
            state.update(load_recipe_state(self._recipe_checkpoint))
        return state

    def _write_side_files(self, folder: Path, dtype: Optional[torch.dtype]) -> None:
        """The files of the input folder a saved folder carries besides its weights (torchtune's
        ``copy_files``: everything but weights, indexes, adapters and hidden files, up to 100 MB each)."""
        copy_files(self._checkpoint_dir, folder, ignore_suffixes=SUFFIXES_TO_NOT_COPY)

    def _write_weight_files(
        self, specs: Mapping[str, TensorSpec], fetch: Callable[[str], torch.Tensor], folder: Path
    ) -> dict[str, str]:
        raise NotImplementedError

    def write_model(self, model_sd: dict[str, torch.Tensor], folder: Path) -> dict[str, str]:
        """Write the weight files (and the side files a save copies) into ``folder`` as a save does, but
        not atomically: for a caller that assembles the folder and publishes it itself. Returns
        ``{name: checksum}`` of the files hashed while writing."""
        return self.write_weights(tensor_specs(model_sd), model_sd.__getitem__, folder)

    def write_weights(
        self, specs: Mapping[str, TensorSpec], fetch: Callable[[str], torch.Tensor], folder: Path
    ) -> dict[str, str]:
        """:meth:`write_model` of tensors that exist only when asked for: ``specs`` gives every torchtune
        name with its dtype and shape, ``fetch(name)`` the tensor, called once per name (the
        distributed recipe gathers each parameter's full tensor there, so its host holds one at a time).
        The Meta and torchtune formats need them all at once (``torch.save`` of one dict); Hugging Face
        folders stream."""
        hashed = self._write_weight_files(specs, fetch, folder)
        self._write_side_files(folder, next((d for d, _ in specs.values() if d.is_floating_point), None))
        return hashed

    def save_weights(
        self, specs: Mapping[str, TensorSpec], fetch: Callable[[str], torch.Tensor], epoch: int, step: int = 0
    ) -> Path:
        """An atomic ``output_dir/epoch_{epoch}`` of the weights alone, from :meth:`write_weights`'s
        ``specs`` and ``fetch``; returns the folder."""
        return write_folder_atomically(
            self._output_dir / f"epoch_{epoch}",
            lambda folder: self.write_weights(specs, fetch, folder),
            step=step,
            epoch=epoch,
            intermediate=False,
        )

    def open_weights(self) -> WeightReader:
        """The weights as a :class:`WeightReader`: names and shapes first, then any tensor's rows on
        demand (a sharded load reads only its shards). This format is one memory-mapped file."""
        return StateDictReader(self.load_checkpoint()[MODEL_KEY])

    def _write_adapter(self, adapter: Mapping[str, torch.Tensor], folder: Path) -> dict[str, str]:
        """``adapter_model.pt`` (torchtune's format, what ``adapter_checkpoint`` loads)."""
        return {f"{ADAPTER_MODEL_FNAME}.pt": _save_torch_file(dict(adapter), folder / f"{ADAPTER_MODEL_FNAME}.pt")}

    def save_checkpoint(
        self,
        state_dict: dict[str, Any],
        epoch: int,
        intermediate_checkpoint: Optional[bool] = None,
        adapter_only: bool = False,
        *,
        step: Optional[int] = None,
        intermediate: Optional[bool] = None,
    ) -> Path:
        """Write ``state_dict`` into one atomic checkpoint folder (with ``manifest.json``); returns the folder.

        The folder holds the weights of ``state_dict["model"]`` in this checkpointer's format, the adapter
        (``"adapter"``, ``"adapter_config"``) when present, the input folder's side files (config.json,
        tokenizer files ...) and, in ``recipe_state.pt``, every other key (optimizer, seed, progress ...).

        Both torchtune's call and this library's are accepted:

        * ``save_checkpoint(sd, epoch, intermediate_checkpoint=False, adapter_only=False)`` (torchtune):
          the folder is ``output_dir/epoch_{epoch}``; ``intermediate_checkpoint=True`` saves the recipe state
          too (into the folder, where torchtune overwrites ``output_dir/recipe_state/recipe_state.pt``), False
          leaves it out; ``adapter_only`` writes the adapter without the model weights.
        * ``save_checkpoint(sd, epoch=..., step=N, intermediate=True)`` (this library's recipes): the folder is
          ``output_dir/step_{N}`` (``intermediate=False``: ``epoch_{epoch}``) and the recipe state is saved
          whenever ``sd`` has keys besides the weights.

        Raises:
            ValueError: no weights under ``"model"`` (and not ``adapter_only``), ``adapter_only`` without an
                adapter, ``intermediate`` without ``step``, or both spellings of "intermediate" at once.
        """
        if intermediate is not None and intermediate_checkpoint is not None:
            raise TuneValueError(
                "save_checkpoint got both intermediate_checkpoint (torchtune's: epoch_N with the recipe state) and "
                "intermediate (this library's: step_N); pass one of them."
            )
        if intermediate and step is None:
            raise TuneValueError("save_checkpoint(intermediate=True) saves into step_N: pass step=N.")
        if not adapter_only and state_dict.get(MODEL_KEY, None) is None:
            raise TuneValueError(f"save_checkpoint needs the model weights under '{MODEL_KEY}'.")
        if adapter_only and ADAPTER_KEY not in state_dict:
            raise TuneValueError(
                "Adapter checkpoint not found in state_dict. Please ensure that the state_dict contains adapter "
                f"weights (under '{ADAPTER_KEY}') when saving with adapter_only=True."
            )
        if intermediate_checkpoint is False:
            recipe_state: dict[str, Any] = {}  # torchtune's final save: the weights alone
        else:
            recipe_state = {k: v for k, v in state_dict.items() if k not in (MODEL_KEY, ADAPTER_KEY, ADAPTER_CONFIG)}
        name = f"step_{step}" if intermediate else f"epoch_{epoch}"
        model_sd = None if adapter_only else state_dict[MODEL_KEY]

        def write_contents(folder: Path) -> dict[str, str]:
            if model_sd is not None:
                hashed = self.write_model(model_sd, folder)
            else:
                hashed = {}
                self._write_side_files(folder, None)
            if ADAPTER_KEY in state_dict:
                hashed.update(self._write_adapter(state_dict[ADAPTER_KEY], folder))
            if ADAPTER_CONFIG in state_dict:
                config_path = folder / f"{ADAPTER_CONFIG_FNAME}.json"
                config_path.write_text(json.dumps(state_dict[ADAPTER_CONFIG], indent=2) + "\n")
            if recipe_state:
                # torch.save moves one storage at a time to the host: device optimizer state needs no
                # device copy, and the host holds one state tensor at a time.
                hashed[RECIPE_STATE_NAME] = _save_torch_file(recipe_state, folder / RECIPE_STATE_NAME)
            return hashed

        return write_folder_atomically(
            self._output_dir / name,
            write_contents,
            step=step if step is not None else 0,
            epoch=epoch,
            intermediate=bool(intermediate),
        )


def _check_common_args(key: str, fields: Mapping[str, Any]) -> None:
    check_checksum_mode(fields.get("verify_checksums", "before_load"), key=f"{key}.verify_checksums")
    files = fields.get("checkpoint_files", ["?"])
    if isinstance(files, (list, tuple)) and not files or isinstance(files, str) and not files.strip():
        raise ConfigError(f"{key}.checkpoint_files is empty: list the weight files to load.")
    if isinstance(files, Mapping):
        try:
            FormattedCheckpointFiles.from_dict(files)
        except ValueError as exc:
            raise ConfigError(f"{key}.checkpoint_files: {exc}") from exc


class FullModelHFCheckpointer(_FullModelCheckpointer):
    """Load and save a Hugging Face model folder (``config.json`` + safetensors or ``.bin`` / ``.pt`` shards).

    ``model_type`` must match what ``config.json`` describes (checked at construction, before any
    weight is read): ``LLAMA2``; ``LLAMA3`` for Llama 3 / 3.1 (``rope_theta`` 500000, ``rope_scaling``
    of type ``llama3``); ``LLAMA3_2`` for the tied Llama 3.2 1B/3B; the other families registered in
    ``torchtune.models._hf_family``. With ``tie_word_embeddings: true``
    the folder has no ``lm_head.weight`` (an ``lm_head.weight`` that is there anyway is dropped, as
    transformers ties over it), the model gets no ``output.weight`` (it uses ``TiedLinear``), and saves
    write no ``lm_head.weight``, as transformers expects of a tied model.

    Args:
        checkpoint_dir: the model folder.
        checkpoint_files: weight file names (in any order: they are numbered in sorted order), a
            ``{filename_format, max_filename}`` mapping (``FormattedCheckpointFiles``), or the name of an
            index (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``) listing the shards.
        model_type: e.g. ``"LLAMA2"``, ``"LLAMA3"``, ``"LLAMA3_2"``, ``"QWEN2"``.
        output_dir: where ``step_N`` / ``epoch_N`` folders are written; must be outside ``checkpoint_dir``.
        adapter_checkpoint: with ``should_load_recipe_state``, adapter weights to load (relative to
            ``output_dir``); by default ``adapter_model.pt`` of the latest ``epoch_N`` if there is one.
        recipe_checkpoint: the recipe state to resume from. This library's recipes read it themselves
            (``torchtune.training.resolve_resume``, relative to ``checkpoint_dir``, which they point at its
            folder); with ``should_load_recipe_state`` the checkpointer loads it (relative to ``output_dir``).
        resume_from_checkpoint: torchtune's deprecated spelling of ``should_load_recipe_state``.
        safe_serialization: write safetensors (True) or ``torch.save`` ``.bin`` files, whatever the input is.
        should_load_recipe_state: torchtune's resume through the checkpointer: ``load_checkpoint`` also returns
            the recipe state (``recipe_checkpoint``; by default ``output_dir/recipe_state/recipe_state.pt``, else
            the ``recipe_state.pt`` of the latest complete ``step_N`` / ``epoch_N``), and the weight files are
            named relative to ``output_dir``.
        verify_checksums: how a folder written by this library (it has ``manifest.json``) is checked
            when loaded. File sizes are always checked first. ``"before_load"``: the checksums
            too, before anything is read. ``"background"``: the sums in a background thread while
            set-up and training go on; the caller checks ``checksums`` (the recipe does so at each
            logged step and before every save, so nothing trained from a damaged file is saved).

    Saves write torchtune's layout: ``model-0000i-of-0000n.safetensors`` (``.bin`` without
    ``safe_serialization``), each tensor in the shard numbered as the input file it came from (input files
    in sorted order), with ``model.safetensors.index.json`` (``pytorch_model.bin.index.json``), and copy
    ``config.json`` (its dtype set to the weights written), the tokenizer files and the input folder's other
    small files, so the output loads with ``from_pretrained``.
    """

    def __init__(
        self,
        checkpoint_dir: Union[str, Path],
        checkpoint_files: Union[str, Sequence[str], Mapping[str, str]],
        model_type: str = "LLAMA2",
        output_dir: Union[str, Path, None] = None,
        adapter_checkpoint: Optional[str] = None,
        recipe_checkpoint: Optional[str] = None,
        resume_from_checkpoint: bool = False,
        safe_serialization: bool = True,
        should_load_recipe_state: bool = False,
        *,
        verify_checksums: str = "before_load",
    ) -> None:
        super().__init__(
            checkpoint_dir,
            checkpoint_files,
            model_type,
            output_dir,
            adapter_checkpoint,
            recipe_checkpoint,
            resume_from_checkpoint,
            should_load_recipe_state,
            verify_checksums=verify_checksums,
        )
        self._safe_serialization = bool(safe_serialization)
        self._index_name: Optional[str] = None
        files = self._weight_file_names
        if len(files) == 1 and files[0].endswith(".index.json"):
            index_path = self._weights_dir / files[0]
            self._index_name = index_path.name
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise TuneValueError(
                    f"{index_path} is not a valid index (no weight_map): {exc}. Check checkpointer.checkpoint_files."
                ) from exc
            files = list(dict.fromkeys(weight_map.values()))
        # sorted, as torchtune numbers them: file i of the input becomes model-0000i-of-0000n of a save
        self._shard_names = sorted(self._existing_file(f, self._weights_dir).name for f in files)
        self._safetensors = all(f.endswith(".safetensors") for f in self._shard_names)
        if not self._safetensors and any(f.endswith(".safetensors") for f in self._shard_names):
            raise TuneValueError("checkpointer.checkpoint_files mixes .safetensors and .bin files; list one format.")
        config_path = self._checkpoint_dir / "config.json"
        if not config_path.is_file():
            raise TuneValueError(
                f"{config_path} does not exist; a Hugging Face checkpoint folder needs its "
                f"config.json. Check checkpointer.checkpoint_dir."
            )
        try:
            config = json.loads(config_path.read_text())
        except ValueError as exc:
            raise TuneValueError(
                f"{config_path} is not valid JSON ({exc}); use the config.json of the weights."
            ) from exc
        if not isinstance(config, dict):
            raise TuneValueError(f"{config_path} is not a JSON object; use the config.json of the weights.")
        self._config = config
        self._config_path = config_path
        # {"repo_id": ...} written by torchtune's download, kept for the adapter config of a PEFT save
        repo_id_path = (self._checkpoint_dir / REPO_ID_FNAME).with_suffix(".json")
        self.repo_id = json.loads(repo_id_path.read_text()).get("repo_id") if repo_id_path.is_file() else None
        if config.get("model_type") is None and not config.get("architectures") and self._model_type in families():
            # a config.json that names no family (older converted folders, torchtune's tests): model_type decides
            self._family = families()[self._model_type]
        else:
            self._family = detect_family(config, config_path)
        if self._family.model_type in MODEL_TYPES:
            # Llama 2 / 3 / 3.2 share model_type "llama": HFModelConfig tells them apart by RoPE and tying
            # (its message names the RoPE settings), and checks the RoPE scaling of the model.
            self._model_config: Optional[HFModelConfig] = HFModelConfig.from_dict(config, config_path)
            if self._model_type in MODEL_TYPES:
                self._model_config.check_model_type(self._model_type)
        else:
            self._model_config = None
        check_yaml_model_type(self._model_type, self._family, config_path)
        self._key_to_file: dict[str, str] = {}
        # A family that converts its own way (Gemma 3) reads and checks config.json itself.
        self._folder: Any = self._family.folder(config, config_path) if self._family.folder is not None else None
        if self._folder is not None:
            self._tied = self._folder.tied
            return
        self._shape = self._family.shape(config, config_path)
        self._tied = self._shape.tie_word_embeddings

    @property
    def _weight_map(self) -> dict[str, str]:
        """``{Hugging Face tensor name: input file it was read from}`` of the last load (torchtune's name)."""
        return self._key_to_file

    def check_model(self, model: nn.Module) -> None:
        """Raise ``TuneError`` if ``model`` differs from ``config.json`` in a way the weight shapes cannot
        show or before any weight is read: sizes, heads, RoPE, norm epsilon, tying, biases, q/k norm,
        sliding window (each named with its config.json key and both values); then the weight files'
        headers against the model (``check_headers``). Works on a meta-device model and reads no weight."""
        if self._folder is not None:
            self._folder.check_model(model)
        else:
            if self._model_config is not None:
                self._model_config.check_model(model)
            check_shape(self._shape, model, self._config_path, self._family)
        self.check_headers(model)

    def check_headers(self, model: nn.Module) -> None:
        """The safetensors headers (names, shapes, dtypes, file sizes) converted to torchtune names as
        ``load_checkpoint`` converts the weights, and checked against ``model`` with the message a load
        gives (``validate_state_dict``). No tensor data is read. ``.bin`` shards have no header to read
        without unpickling: they are checked when loaded.

        Raises:
            TuneError: a truncated or non-float file, or names and shapes that do not fit the model.
        """
        if not self._safetensors:
            return
        # A folder of our own output first against its manifest (sizes only): a truncated file is named
        # with the checkpoint to fall back to, not as a header that does not parse.
        check_file_sizes(self._weights_dir, self._shard_names)
        merged: dict[str, torch.Tensor] = {}
        for name in self._shard_names:
            self._add_shard(merged, name, safetensors_skeleton(self._weights_dir / name))
        validate_state_dict(model, self._to_tune(merged))

    def load_checkpoint(self) -> dict[str, Any]:
        """Read the weights (memory-mapped) and return ``{"model": state_dict in torchtune names, ...recipe state}``."""
        self._verify(self._shard_names + ["config.json"] + ([self._index_name] if self._index_name else []))
        merged: dict[str, torch.Tensor] = {}
        for name in self._shard_names:
            path = self._weights_dir / name
            shard = self._read(load_safetensors_weights if self._safetensors else load_torch_weights, path)
            self._add_shard(merged, name, shard)
        return self._finish_load(self._to_tune(merged))

    def _add_shard(self, merged: dict[str, torch.Tensor], name: str, shard: dict[str, torch.Tensor]) -> None:
        for key, value in shard.items():
            key = self._folder.hf_name(key) if self._folder is not None else key
            merged[key] = value
            self._key_to_file[key] = name

    def _to_tune(self, merged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The HF state dict ``merged`` in torchtune names and layout (also of meta tensors: the header check)."""
        if self._tied and "lm_head.weight" in merged:
            lm_head, embed = merged.pop("lm_head.weight"), merged.get("model.embed_tokens.weight")
            if embed is not None and not lm_head.is_meta and not torch.equal(lm_head, embed):
                log.warning(
                    "%s says tie_word_embeddings: true but lm_head.weight differs from model.embed_tokens.weight; "
                    "using model.embed_tokens.weight for both, as transformers does.",
                    self._checkpoint_dir / "config.json",
                )
            self._key_to_file.pop("lm_head.weight", None)
        if self._folder is not None:
            return self._folder.to_tune(merged)
        try:
            return hf_to_tune(merged, self._shape, fused=self._family.fused_projections, family=self._family.name)
        except RuntimeError as exc:  # q/k un-permutation: the shapes in config.json do not fit the weights
            shape = self._shape
            raise TuneError(
                f"The weights in {self._weights_dir} ({_shorten(self._shard_names)}) do not have the shapes "
                f"that {self._checkpoint_dir / 'config.json'} describes (hidden_size={shape.embed_dim}, "
                f"num_attention_heads={shape.num_heads}, num_key_value_heads={shape.num_kv_heads}, "
                f"head_dim={shape.head_dim}): {exc}. Use the config.json that came with these weights, or "
                "check checkpointer.checkpoint_files."
            ) from exc

    def _stored_shapes(self) -> dict[str, tuple[str, torch.Size]]:
        """``{name as stored: (file, shape)}`` from the files' headers (safetensors) or their memory map
        (``.bin``): no weight is read."""
        found: dict[str, tuple[str, torch.Size]] = {}
        for name in self._shard_names:
            path = self._weights_dir / name
            if self._safetensors:
                shapes = self._read(safetensors_shapes, path)
            else:
                shapes = {k: t.shape for k, t in self._read(load_torch_weights, path).items()}
            found.update({key: (name, shape) for key, shape in shapes.items()})
        return found

    def _saved_name(self, stored: str) -> str:
        return self._folder.hf_name(stored) if self._folder is not None else stored

    def _learn_layout(self, stored: Mapping[str, tuple[str, torch.Size]]) -> None:
        """Which file each tensor of a save goes to: the one it came from (a tied model's ``lm_head``
        has none)."""
        self._key_to_file = {self._saved_name(k): name for k, (name, _) in stored.items()}
        if self._tied:
            self._key_to_file.pop("lm_head.weight", None)

    def open_weights(self) -> WeightReader:
        """The weights as a :class:`WeightReader`: torchtune names and shapes from the files' headers,
        then each tensor's rows (a sharded load's shards) read memory-mapped and converted on demand, so
        no process holds more than its shards and one tensor. Files of our own earlier output are
        checked against their manifest first, as :meth:`load_checkpoint` does."""
        self._verify(self._shard_names + ["config.json"] + ([self._index_name] if self._index_name else []))
        stored = self._stored_shapes()
        self._learn_layout(stored)
        hf_shapes = {k: shape for k, (_, shape) in stored.items()}
        if self._tied:
            # transformers uses the embedding for both; an lm_head.weight in the files is not read
            hf_shapes = {k: v for k, v in hf_shapes.items() if self._saved_name(k) != "lm_head.weight"}
        if self._folder is not None:
            sources = self._folder.sources(hf_shapes)
        else:
            sources = hf_sources(hf_shapes, self._shape, fused=self._family.fused_projections, family=self._family.name)
        on_error = (lambda exc: self.checksums.check(wait=True)) if self.checksums is not None else None
        return FileReader(
            self._weights_dir,
            {key: (stored[source.hf_key][0], source) for key, source in sources.items()},
            hf_shapes,
            load_file=None if self._safetensors else load_torch_weights,
            on_error=on_error,
        )

    def _write_weight_files(
        self, specs: Mapping[str, TensorSpec], fetch: Callable[[str], torch.Tensor], folder: Path
    ) -> dict[str, str]:
        """Write the weights in HF format, one tensor at a time; returns ``{file: checksum}``.

        Each tensor is fetched, moved to the host, converted there (the q/k permutation copies) and
        written before the next one is fetched: a save needs one tensor's worth of extra host memory
        (two for a permuted q/k weight) and no device memory. ``.bin`` shards go through
        ``torch.save``, which needs the whole shard at once: one shard on the host at a time. Each
        tensor goes into the shard numbered as the input file it was read from; after a resume (nothing
        read) the files' headers say which.
        """
        if not self._key_to_file:
            self._learn_layout(self._stored_shapes())
        if self._folder is not None:
            plan = {hf_key: [key] for key, hf_key in self._folder.hf_names(specs).items()}

            def hf_tensor(hf_key: str, parts: list[str]) -> torch.Tensor:
                return self._folder.hf_tensor(parts[0], fetch(parts[0]))

        else:
            plan = tune_to_hf_plan(specs, fused=self._family.fused_projections, family=self._family.name)

            def hf_tensor(hf_key: str, parts: list[str]) -> torch.Tensor:
                return tune_to_hf_tensor(hf_key, {k: fetch(k) for k in parts}, self._shape)

        default_file = self._shard_names[-1]
        by_input: dict[str, dict[str, list[str]]] = {name: {} for name in self._shard_names}
        for hf_key, parts in plan.items():
            by_input[self._key_to_file.get(hf_key, default_file)][hf_key] = parts
        # torchtune's names: the n input files that hold tensors, in sorted order, become model-0000i-of-0000n
        used = [name for name in self._shard_names if by_input[name]]
        suffix = ".safetensors" if self._safe_serialization else ".bin"
        by_file = {shard_name(i, len(used)) + suffix: by_input[name] for i, name in enumerate(used, start=1)}
        weight_map = {hf_key: name for name, tensors in by_file.items() for hf_key in tensors}
        total_size = sum(shape.numel() * torch.empty((), dtype=dtype).element_size() for dtype, shape in specs.values())
        hashed: dict[str, str] = {}
        for name, source in by_file.items():
            if self._safe_serialization:
                specs_in_file = safetensors_order(
                    (k, *_hf_spec([specs[p] for p in parts])) for k, parts in source.items()
                )
                converted = (hf_tensor(k, source[k]) for k, _, _ in specs_in_file)
                hashed[name] = _write_safetensors_file(folder / name, specs_in_file, converted)
            else:
                shard = {k: hf_tensor(k, parts).contiguous() for k, parts in source.items()}
                hashed[name] = _save_torch_file(shard, folder / name)
                del shard
        index_name = SAFETENSOR_INDEX_FNAME if self._safe_serialization else TORCH_INDEX_FNAME
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / index_name).write_text(json.dumps(index, indent=2) + "\n")
        return hashed

    def _write_side_files(self, folder: Path, dtype: Optional[torch.dtype]) -> None:
        """``config.json`` (with ``dtype``, the dtype of the weights written), the tokenizer files and
        ``generation_config.json`` (``_hf_side_files``), then the input folder's other small files."""
        config = self._folder.saved_config() if self._folder is not None else self._config
        write_hf_side_files(self._checkpoint_dir, folder, config=config, dtype=dtype)
        super()._write_side_files(folder, dtype)

    def _write_adapter(self, adapter: Mapping[str, torch.Tensor], folder: Path) -> dict[str, str]:
        """``adapter_model.pt`` and, as torchtune writes for PEFT, ``adapter_model.safetensors`` (``.bin``
        without ``safe_serialization``) of the same tensors. LoRA is outside this library's scope: the tensors
        keep the names the caller gives them (torchtune converts its LoRA names to PEFT's)."""
        hashed = super()._write_adapter(adapter, folder)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter.items()}
        if self._safe_serialization:
            name = f"{ADAPTER_MODEL_FNAME}.safetensors"
            specs = safetensors_order((k, v.dtype, tuple(v.shape)) for k, v in tensors.items())
            hashed[name] = _write_safetensors_file(folder / name, specs, (tensors[k] for k, _, _ in specs))
        else:
            name = f"{ADAPTER_MODEL_FNAME}.bin"
            hashed[name] = _save_torch_file(tensors, folder / name)
        return hashed


def _single_file(checkpoint_files: Union[str, Sequence[str], Mapping[str, str]], why: str) -> list:
    """The one file a single-file checkpointer reads (torchtune's wording, then ``why`` and what to do)."""
    files = checkpoint_file_names(checkpoint_files)
    if len(files) != 1:
        raise TuneValueError(
            f"Currently we only support reading from a single checkpoint file: checkpointer.checkpoint_files "
            f"lists {len(files)} files; {why}"
        )
    return files


class FullModelMetaCheckpointer(_FullModelCheckpointer):
    """Load and save Meta's format (``consolidated.00.pth`` + ``params.json``) of Llama 2 and Llama 3 / 3.1
    (``model_type`` ``LLAMA2`` / ``LLAMA3``; the tied Llama 3.2 is read from its Hugging Face folder).

    Arguments as for :class:`FullModelHFCheckpointer` (without ``safe_serialization``); ``checkpoint_files``
    names the one ``.pth`` file (model-parallel shards ``consolidated.01.pth`` ... of the 13B/70B releases
    are not supported). A save writes the weights under the input's file name (``consolidated.00.pth``,
    what Meta's own code loads; torchtune names it ``model-00001-of-00001.bin``) and copies ``params.json``
    and the tokenizer.
    """

    def __init__(
        self,
        checkpoint_dir: Union[str, Path],
        checkpoint_files: Union[str, Sequence[str], Mapping[str, str]],
        model_type: str = "LLAMA2",
        output_dir: Union[str, Path, None] = None,
        adapter_checkpoint: Optional[str] = None,
        recipe_checkpoint: Optional[str] = None,
        resume_from_checkpoint: bool = False,
        should_load_recipe_state: bool = False,
        *,
        verify_checksums: str = "before_load",
    ) -> None:
        files = _single_file(
            checkpoint_files,
            "the Meta checkpointer reads one consolidated .pth file. Convert model-parallel shards to a single file, "
            "or use the Hugging Face weights with FullModelHFCheckpointer.",
        )
        super().__init__(
            checkpoint_dir,
            files,
            model_type,
            output_dir,
            adapter_checkpoint,
            recipe_checkpoint,
            resume_from_checkpoint,
            should_load_recipe_state,
            verify_checksums=verify_checksums,
        )
        if self._model_type not in MODEL_TYPES:
            raise TuneValueError(
                f"checkpointer.model_type={model_type}: Meta's consolidated.00.pth format holds Llama 2 and "
                "Llama 3 / 3.1 only. Read this model from its Hugging Face folder: set "
                "checkpointer._component_=torchtune.training.FullModelHFCheckpointer."
            )
        if self._model_type == "LLAMA3_2":
            raise TuneValueError(
                "checkpointer.model_type=LLAMA3_2 (tied embeddings) is read from Hugging Face folders only: set "
                "checkpointer._component_=torchtune.training.FullModelHFCheckpointer and "
                "checkpointer.checkpoint_dir to the downloaded folder (config.json + model.safetensors)."
            )
        self._weights_name = self._weight_file_names[0]

    def load_checkpoint(self) -> dict[str, Any]:
        """Read the ``.pth`` (memory-mapped): ``{"model": state_dict in torchtune names, ...recipe state}``."""
        self._verify([self._weights_name, "params.json"])
        sd = self._read(load_torch_weights, self._weights_dir / self._weights_name)
        return self._finish_load(meta_to_tune(sd))

    def _write_weight_files(
        self, specs: Mapping[str, TensorSpec], fetch: Callable[[str], torch.Tensor], folder: Path
    ) -> dict[str, str]:
        # torch.save needs the whole dict at once, and its tensors on the host so that the file
        # loads without a GPU: the weights once in host memory (each moved there on its own; no
        # device copy). The Hugging Face format streams instead.
        meta_sd = {k: v.detach().to("cpu").contiguous() for k, v in tune_to_meta({k: fetch(k) for k in specs}).items()}
        hashed = {self._weights_name: _save_torch_file(meta_sd, folder / self._weights_name)}
        del meta_sd
        return hashed


class FullModelTorchTuneCheckpointer(_FullModelCheckpointer):
    """Load and save torchtune's own format: one ``torch.save`` file of the model's state dict in torchtune's
    parameter names, converted neither way.

    Arguments as for :class:`FullModelMetaCheckpointer`; ``model_type`` may be any of ``ModelType``'s names
    (nothing is converted). A save writes ``epoch_N/model-00001-of-00001.bin`` (torchtune's name) in an
    atomic folder with the input folder's other small files.
    """

    def __init__(
        self,
        checkpoint_dir: Union[str, Path],
        checkpoint_files: Union[str, Sequence[str], Mapping[str, str]],
        model_type: str = "LLAMA2",
        output_dir: Union[str, Path, None] = None,
        adapter_checkpoint: Optional[str] = None,
        recipe_checkpoint: Optional[str] = None,
        resume_from_checkpoint: bool = False,
        should_load_recipe_state: bool = False,
        *,
        verify_checksums: str = "before_load",
    ) -> None:
        files = _single_file(checkpoint_files, "a torchtune-format checkpoint is one .pt / .bin file.")
        super().__init__(
            checkpoint_dir,
            files,
            model_type,
            output_dir,
            adapter_checkpoint,
            recipe_checkpoint,
            resume_from_checkpoint,
            should_load_recipe_state,
            verify_checksums=verify_checksums,
        )
        self._weights_name = self._weight_file_names[0]

    @staticmethod
    def _canonical_model_type(model_type: str) -> Optional[str]:
        return canonical_model_type(model_type) or str(model_type).upper()

    @staticmethod
    def check_config_args(key: str, fields: Mapping[str, Any]) -> None:
        """As the other checkpointers', but ``model_type`` may be any ``ModelType`` name (nothing is converted)."""
        model_type = str(fields.get("model_type", "LLAMA2"))
        if canonical_model_type(model_type) is None and model_type.upper() not in ModelType.__members__:
            raise ConfigError(
                f"{key}.model_type={model_type} is not a model type; use one of {', '.join(ModelType.__members__)}."
            )
        _check_common_args(key, fields)

    def load_checkpoint(self, weights_only: bool = True) -> dict[str, Any]:
        """Read the file (memory-mapped): ``{"model": state_dict, ...}``. ``weights_only=False`` runs the
        file's pickled code (torchtune's switch for quantized models): only for files you trust."""
        self._verify([self._weights_name])
        path = self._weights_dir / self._weights_name
        return self._finish_load(self._read(lambda p: load_torch_weights(p, weights_only=weights_only), path))

    def _write_weight_files(
        self, specs: Mapping[str, TensorSpec], fetch: Callable[[str], torch.Tensor], folder: Path
    ) -> dict[str, str]:
        name = shard_name(1, 1) + ".bin"
        tensors = {k: fetch(k).detach().to("cpu").contiguous() for k in specs}
        return {name: _save_torch_file(tensors, folder / name)}


class Checkpointer(Protocol):
    """What a recipe needs of a checkpointer (torchtune's three and any of a user's own): the weights (and a
    resumed run's state) in, one checkpoint folder out."""

    def load_checkpoint(self, **kwargs: Any) -> dict[str, Any]: ...

    def save_checkpoint(self, state_dict: dict[str, Any], epoch: int, **kwargs: Any) -> Any: ...
