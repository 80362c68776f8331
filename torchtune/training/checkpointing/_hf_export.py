"""``tune export``: a checkpoint folder of this library -> a Hugging Face model folder.

What it reads (each checked against the folder's ``manifest.json`` before any weight is read):

* a Hugging Face ``step_N`` / ``epoch_N`` of either recipe (safetensors or ``.bin``, with ``config.json``
  and the tokenizer files of the run's input folder): the tensors are already in HF names and layout;
* a distributed ``step_N``: torch.distributed.checkpoint shards in torchtune names, read on this one
  process (:class:`ShardedModelReader`); ``config.json`` and the tokenizer files come from the run's
  input folder (``base_model_dir``), and each tensor goes through its family's converter
  (``torchtune.models._hf_convert``, or the family's own folder class for Gemma 3);
* a Meta-format ``step_N`` / ``epoch_N`` (``consolidated.00.pth``, torchtune names after
  ``meta_to_tune``), with ``config.json`` from ``base_model_dir`` as for the sharded state.

What it writes: safetensors in files of at most ``max_shard_size`` (split by huggingface_hub, with
``model.safetensors.index.json`` when there is more than one), ``config.json`` with ``torch_dtype`` of
the weights written, ``generation_config.json`` and the tokenizer files (``_hf_side_files``), and a
``manifest.json`` of checksums. One HF tensor exists on the host at a time (read, converted, written,
freed), so host memory is a few times the largest tensor, whatever the model's size. The folder is
written as ``.tmp-<name>-<pid>`` beside the destination and renamed into place once complete.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtune._assets import missing_path_hint
from torchtune._errors import TuneError, UsageError
from torchtune.models._hf_family import HFFamily, detect_family
from torchtune.training.checkpointing._hf_side_files import write_hf_side_files
from torchtune.training.distributed._sharded_read import (
    ShardedModelReader,
    check_checkpoint_files,
    holds_only_sharded_weights,
)
from torchtune.utils._checkpointing._atomic import write_folder_atomically
from torchtune.utils._checkpointing._manifest import MANIFEST_NAME, find_latest_checkpoint
from torchtune.utils._checkpointing._streaming_write import _SAFETENSORS_DTYPES, safetensors_order, write_safetensors

log = logging.getLogger("torchtune")

__all__ = ["DEFAULT_MAX_SHARD_SIZE", "EXPORT_DTYPES", "export_hf_folder"]

# huggingface_hub's default, which vLLM and the Hub's own uploads use too.
DEFAULT_MAX_SHARD_SIZE = "5GB"
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_TORCH_DTYPES = {name: dtype for dtype, name in _SAFETENSORS_DTYPES.items()}
_META_WEIGHTS = "consolidated.00.pth"
_BASE_FLAG = "--base-model-dir"
_CHECKPOINT_NAME = re.compile(r"^(step|epoch)_\d+$")

Spec = Tuple[torch.dtype, torch.Size]


@dataclass
class _Source:
    """The HF tensors a checkpoint folder yields: ``specs`` (HF name -> saved dtype and shape) and
    ``tensor(name)``, which reads and converts one of them on the host."""

    what: str
    specs: Dict[str, Spec]
    tensor: Callable[[str], torch.Tensor]
    config: Dict[str, Any]
    side_files_dir: Path


def _read_config(folder: Path, purpose: str) -> Dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise TuneError(f"{path} does not exist; {purpose}")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise TuneError(f"{path} is not valid JSON ({exc}); {purpose}") from exc
    if not isinstance(config, dict):
        raise TuneError(f"{path} is not a JSON object; {purpose}")
    return config


def _weight_files(folder: Path) -> List[str]:
    """The weight files of a HF folder: its index's shards, else its ``*.safetensors`` (else ``*.bin``)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            try:
                weight_map = json.loads((folder / index).read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise TuneError(f"{folder / index} is not a valid index (no weight_map): {exc}.") from exc
            return list(dict.fromkeys(weight_map.values()))
    names = sorted(p.name for p in folder.glob("*.safetensors"))
    return names or sorted(p.name for p in folder.glob("*.bin"))


def _hf_source(folder: Path) -> _Source:
    """A HF-format checkpoint folder: its tensors as they are, one file memory-mapped at a time."""
    from safetensors import safe_open

    from torchtune.utils._checkpointing._safe_load import load_torch_weights

    config = _read_config(folder, "a Hugging Face checkpoint folder needs its config.json.")
    detect_family(config, folder / "config.json")  # a model this library does not implement: refused, named
    files = _weight_files(folder)
    check_checkpoint_files(folder, lambda name: name in files or name == "config.json")
    specs: Dict[str, Spec] = {}
    readers: Dict[str, Callable[[], Any]] = {}
    for name in files:
        path = folder / name
        if name.endswith(".safetensors"):
            handle = safe_open(str(path), framework="pt")
            for key in handle.keys():
                piece = handle.get_slice(key)
                specs[key] = (_TORCH_DTYPES[piece.get_dtype()], torch.Size(piece.get_shape()))
                readers[key] = lambda handle=handle, key=key: handle.get_tensor(key)
        else:
            tensors = load_torch_weights(path)  # memory-mapped: pages are read as each tensor is written
            for key, tensor in tensors.items():
                specs[key] = (tensor.dtype, tensor.shape)
                readers[key] = lambda tensor=tensor: tensor
    return _Source(f"the checkpoint {folder}", specs, lambda key: readers[key](), config, folder)


def _converted_source(
    what: str, tune_specs: Dict[str, Spec], read: Callable[[List[str]], Dict[str, torch.Tensor]], base_dir: Path
) -> _Source:
    """Torchtune-named tensors (sharded state, Meta format) -> HF names and layout of ``base_dir``'s family."""
    from torchtune.models._hf_convert import tune_to_hf_plan, tune_to_hf_tensor

    config = _read_config(
        base_dir,
        f"{_BASE_FLAG} must be the Hugging Face folder the run started from (its checkpointer.checkpoint_dir), "
        "which holds config.json and the tokenizer files.",
    )
    config_path = base_dir / "config.json"
    family = detect_family(config, config_path)
    if family.folder is not None:  # Gemma 3: its own names, norms and config.json forms
        folder = family.folder(config, config_path)
        config = folder.saved_config()

        def plan_of(keys: List[str]) -> Dict[str, List[str]]:
            return {hf: [key] for key, hf in folder.hf_names(keys).items()}

        def convert(hf_key: str, parts: Dict[str, torch.Tensor]) -> torch.Tensor:
            ((key, tensor),) = parts.items()
            return folder.hf_tensor(key, tensor)

    else:
        shape = family.shape(config, config_path)

        def plan_of(keys: List[str]) -> Dict[str, List[str]]:
            return tune_to_hf_plan(keys, fused=family.fused_projections, family=family.name)

        def convert(hf_key: str, parts: Dict[str, torch.Tensor]) -> torch.Tensor:
            return tune_to_hf_tensor(hf_key, parts, shape)

    try:
        plan = plan_of(list(tune_specs))
    except TuneError as exc:
        raise TuneError(
            f"The weights of {what} do not fit the {family.name} model that {config_path} describes: {exc} Pass "
            f"{_BASE_FLAG} the folder this run started from (its checkpointer.checkpoint_dir)."
        ) from exc
    specs: Dict[str, Spec] = {}
    for hf_key, parts in plan.items():
        dtype, first = tune_specs[parts[0]]
        rows = sum(tune_specs[p][1][0] for p in parts)
        specs[hf_key] = (dtype, torch.Size((rows, *first[1:])) if len(parts) > 1 else first)
    _check_fits_base(specs, base_dir, family, what)

    def tensor(hf_key: str) -> torch.Tensor:
        return convert(hf_key, read(plan[hf_key]))

    return _Source(what, specs, tensor, config, base_dir)


def _check_fits_base(specs: Dict[str, Spec], base_dir: Path, family: HFFamily, what: str) -> None:
    """The exported names and shapes against the base folder's own safetensors headers (read without the
    data): a config.json of another size would otherwise make a folder that loads into nonsense."""
    from safetensors import safe_open

    base: Dict[str, Tuple[int, ...]] = {}
    for name in _weight_files(base_dir):
        if name.endswith(".safetensors") and (base_dir / name).is_file():
            with safe_open(str(base_dir / name), framework="pt") as handle:
                for key in handle.keys():
                    base[key] = tuple(handle.get_slice(key).get_shape())
    if not base:
        return  # a base folder without its safetensors (config and tokenizer only): nothing to compare
    missing: List[str] = []
    if family.folder is not None:  # its base may hold more than the text model it saves (a vision tower)
        rename = family.folder(_read_config(base_dir, ""), base_dir / "config.json").hf_name
        base = {rename(k): v for k, v in base.items()}
    else:
        tied = bool(_read_config(base_dir, "").get("tie_word_embeddings", False))
        missing = [k for k in base if k not in specs and not (tied and k == "lm_head.weight")]
    unknown = [k for k in specs if k not in base]
    different = [f"{k}: {tuple(s[1])} vs {base[k]}" for k, s in specs.items() if k in base and tuple(s[1]) != base[k]]
    problems = [
        f"{label}: {', '.join(sorted(names, key=_natural_key)[:4])}{' ...' if len(names) > 4 else ''}"
        for label, names in (
            ("in the checkpoint but not in the base model", unknown),
            ("in the base model but not in the checkpoint", missing),
            ("shapes (checkpoint vs base model)", different),
        )
        if names
    ]
    if problems:
        raise TuneError(
            f"The weights of {what} are not those of the model in {base_dir} ({'; '.join(problems)}). Pass "
            f"{_BASE_FLAG} the folder this run started from (its checkpointer.checkpoint_dir)."
        )


def _meta_source(folder: Path, base_dir: Path) -> _Source:
    from torchtune.models.llama2._convert_weights import meta_to_tune
    from torchtune.utils._checkpointing._safe_load import load_torch_weights

    check_checkpoint_files(folder, lambda name: name == _META_WEIGHTS)
    tensors = meta_to_tune(load_torch_weights(folder / _META_WEIGHTS))  # memory-mapped
    specs = {k: (t.dtype, t.shape) for k, t in tensors.items()}
    return _converted_source(
        f"the Meta-format checkpoint {folder}", specs, lambda names: {n: tensors[n] for n in names}, base_dir
    )


def _sharded_source(folder: Path, base_dir: Path) -> _Source:
    reader = ShardedModelReader(folder)
    return _converted_source(f"the distributed step checkpoint {folder}", reader.specs, reader.read, base_dir)


def _needs_base(folder: Path, kind: str) -> UsageError:
    return UsageError(
        f"{folder} is {kind}: its weights are in torchtune's names and it has no config.json or tokenizer "
        f"files. Pass {_BASE_FLAG} the Hugging Face folder the run started from (the run's "
        "checkpointer.checkpoint_dir): its config.json, tokenizer and generation config go into the export."
    )


def _source(folder: Path, base_dir: Optional[Path]) -> _Source:
    """What ``folder`` holds, checked cheapest first; no weight is read here."""
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise TuneError(
            f"The checkpoint folder {folder} {what}.{missing_path_hint(folder)} Pass a step_N or epoch_N folder "
            "that a run wrote into its output_dir."
        )
    if not (folder / MANIFEST_NAME).is_file():
        latest = find_latest_checkpoint(folder)
        if latest is not None:
            raise TuneError(
                f"{folder} is a run's output folder, not one checkpoint. Pass one of its step_N / epoch_N folders, "
                f"e.g. the latest: {latest}."
            )
        if _CHECKPOINT_NAME.match(folder.name):
            check_checkpoint_files(folder, lambda name: False)  # names the unfinished save and what to use instead
        hint = (
            " It holds config.json and weights already: if it is a Hugging Face folder, load it as it is."
            if (folder / "config.json").is_file() and _weight_files(folder)
            else ""
        )
        raise TuneError(
            f"{folder} has no {MANIFEST_NAME}, so it is not a checkpoint folder this library wrote (every step_N / "
            f"epoch_N folder ends with one), or its save did not finish.{hint} Pass a step_N or epoch_N folder from "
            "a run's output_dir."
        )
    if (folder / "config.json").is_file() and _weight_files(folder):
        if base_dir is not None:
            log.info("%s holds its own config.json and tokenizer files: %s is not needed.", folder, _BASE_FLAG)
        return _hf_source(folder)
    if holds_only_sharded_weights(folder):
        if base_dir is None:
            raise _needs_base(folder, "a step checkpoint of full_finetune_distributed (sharded_state/)")
        return _sharded_source(folder, base_dir)
    if (folder / _META_WEIGHTS).is_file():
        if base_dir is None:
            raise _needs_base(folder, f"a Meta-format checkpoint ({_META_WEIGHTS})")
        return _meta_source(folder, base_dir)
    raise TuneError(
        f"{folder} has a {MANIFEST_NAME} but no model weights this command reads (config.json with .safetensors / "
        f".bin files, sharded_state/ of the distributed recipe, or {_META_WEIGHTS}). Pass a step_N or epoch_N "
        "folder that a run wrote, as it was written."
    )


def _check_destination(output_dir: Path, sources: List[Path], overwrite: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise TuneError(f"--output-dir {output_dir} is a file; pass a folder path.")
    for source in sources:
        src, out = source.resolve(), output_dir.resolve()
        if out == src or src in out.parents or out in src.parents:
            raise TuneError(
                f"--output-dir {output_dir} overlaps the folder it is made from ({source}); writing there could "
                "destroy the checkpoint. Pass a folder outside it."
            )
    if output_dir.exists() and not overwrite:
        raise TuneError(
            f"--output-dir {output_dir} already exists. Pass --overwrite to replace it (it is replaced only once "
            "the new folder is complete), or another --output-dir."
        )


def _natural_key(name: str) -> List[Any]:
    """``layers.2`` before ``layers.10``: shards then hold whole consecutive layers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def export_hf_folder(
    checkpoint_dir: Path,
    output_dir: Path,
    *,
    base_model_dir: Optional[Path] = None,
    dtype: Optional[str] = None,
    max_shard_size: str = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
) -> Path:
    """Write the model of the checkpoint folder ``checkpoint_dir`` as a Hugging Face folder ``output_dir``.

    Args:
        checkpoint_dir: a ``step_N`` / ``epoch_N`` folder that a recipe of this library wrote.
        output_dir: the folder to create; an existing one is replaced only with ``overwrite``.
        base_model_dir: the HF folder the run started from (``checkpointer.checkpoint_dir``), for the
            folders without ``config.json`` (distributed ``step_N``, Meta format).
        dtype: ``bf16`` / ``fp16`` / ``fp32`` to cast floating-point weights to; ``None`` keeps the saved dtype.
        max_shard_size: largest safetensors file (``"5GB"``), as huggingface_hub parses it.
        overwrite: replace an existing ``output_dir``.

    Returns:
        ``output_dir``.

    Raises:
        TuneError: a folder that is not a checkpoint of this library, a missing ``base_model_dir``, a
            damaged file, weights that do not fit ``base_model_dir``, an unknown model family, an
            existing ``output_dir`` without ``overwrite``, or a failed write (nothing is left behind).
    """
    from huggingface_hub import split_state_dict_into_shards_factory

    checkpoint_dir, output_dir = Path(checkpoint_dir).expanduser(), Path(output_dir).expanduser()
    base_dir = Path(base_model_dir).expanduser() if base_model_dir is not None else None
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise UsageError(f"--dtype {dtype} is not one of {', '.join(EXPORT_DTYPES)}.")
    _check_destination(output_dir, [checkpoint_dir] + ([base_dir] if base_dir else []), overwrite)
    if base_dir is not None and not base_dir.is_dir():
        raise TuneError(
            f"{_BASE_FLAG} {base_dir} does not exist.{missing_path_hint(base_dir)} Pass the Hugging Face folder the "
            "run started from (its checkpointer.checkpoint_dir)."
        )
    source = _source(checkpoint_dir, base_dir)
    cast = EXPORT_DTYPES.get(dtype) if dtype else None
    out_specs = {
        name: (cast if cast is not None and d.is_floating_point else d, shape)
        for name, (d, shape) in sorted(source.specs.items(), key=lambda item: _natural_key(item[0]))
    }
    try:
        split = split_state_dict_into_shards_factory(
            out_specs,
            get_storage_size=lambda spec: spec[1].numel() * torch.empty((), dtype=spec[0]).element_size(),
            filename_pattern="model{suffix}.safetensors",
            max_shard_size=max_shard_size,
        )
    except ValueError as exc:
        raise UsageError(f"--max-shard-size {max_shard_size}: {exc} Write it as e.g. 5GB or 500MB.") from exc
    manifest = json.loads((checkpoint_dir / MANIFEST_NAME).read_text())

    def produce(names: List[Tuple[str, torch.dtype, tuple]]):
        for name, out_dtype, _ in names:
            tensor = source.tensor(name).to(out_dtype)  # one HF tensor on the host at a time
            yield tensor
            del tensor

    def write(folder: Path) -> Dict[str, str]:
        hashed = {}
        for filename, names in split.filename_to_tensors.items():
            specs = safetensors_order((n, *out_specs[n]) for n in names)
            hashed[filename] = write_safetensors(folder / filename, specs, produce(specs), {"format": "pt"}).digest
            log.info("Wrote %s (%d tensors)", filename, len(specs))
        if split.is_sharded:
            index = {"metadata": dict(split.metadata), "weight_map": dict(sorted(split.tensor_to_filename.items()))}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        floating = next((d for d, _ in out_specs.values() if d.is_floating_point), None)
        write_hf_side_files(source.side_files_dir, folder, config=source.config, dtype=floating)
        return hashed

    _write_atomically(
        output_dir, write, step=int(manifest.get("step", 0)), epoch=int(manifest.get("epoch", 0)), what=source.what
    )
    return output_dir


def _write_atomically(
    destination: Path, write: Callable[[Path], Dict[str, str]], *, step: int, epoch: int, what: str
) -> None:
    """The checkpoints' atomic write (temporary folder, manifest last, fsync, rename; an existing
    ``destination`` replaced only once the new one is in place), cleaning only this folder's leftovers."""

    def failure(exc: OSError, tmp: Path) -> str:
        return (
            f"Writing the export of {what} to {destination} failed: {exc.strerror or exc} ({exc.filename or tmp}). "
            f"Nothing was left behind. Free space or fix the permissions there, or pass another --output-dir."
        )

    write_folder_atomically(
        destination, write, step=step, epoch=epoch, intermediate=False, own_leftovers_only=True, failure=failure
    )
