"""Memory of the phases around the training steps: set-up (loading the weights), the step checkpoint
save and the resume load, run through the recipe's own training-layer and checkpointer code on fake
tensors.

The device is simulated by fake *meta* tensors and the host by fake *CPU* tensors
(``StorageCounter(cpu_is_host=True)``), so a device-to-host copy (``.to("cpu")``) and a host-to-device
copy (an optimizer's ``load_state_dict`` moving its state to the parameter's device) are counted on
the side they land on. Only the bytes of files are not real: while a phase runs, ``_FakeFiles``
stands in for the checkpointer's safetensors writer (``_write_safetensors_file``: it consumes the
converted tensors one at a time, as the streaming writer does), for ``torch.save`` (one device
storage at a time copied to the host, as torch does) and for ``torch.load`` / ``safetensors.torch.load_file``,
and for the kernel's side of memory-mapped files (``FileMappings.holds`` / ``release``). A save writes
a small placeholder file (so manifests and atomic renames run for real) and keeps the structure
(names, shapes, dtypes) of what it was given; a load gives that structure back as fake host tensors,
counted as file pages when memory-mapped (``mmap=True``, safetensors) and as host RAM otherwise, and
pages given back with ``FileMappings.release`` stop counting.

Two deliberate differences from the recipe, both without effect on the figures: the model is built
with random weights on the device and then loaded with ``load_state_dict`` (``build_model``'s
meta-device route cannot run on fake tensors: ``to_empty`` cannot swap fake parameters; both
allocate every weight once on the device, and ``load_state_dict`` copies into them in place), and the
optimizer state of a run in progress is made by one optimizer step per parameter with a zero
gradient, one gradient at a time.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

from torchtune.training.estimate._memory_estimator import (
    GB,
    MemoryEstimate,
    StorageCounter,
    _active,
    _rounded,
    estimate_recipe_memory,
    prepare_estimate,
)
from torchtune.utils._checkpointing._manifest import RECIPE_STATE_NAME, new_hash

__all__ = ["PhaseMemory", "RunMemoryEstimate", "estimate_checkpoint_phases", "estimate_run_memory"]

_PLACEHOLDER = b"plaintune-memory-estimate:"


@dataclasses.dataclass
class PhaseMemory:
    """Peaks of one phase of a run, in bytes."""

    name: str
    device_peak: int
    weights: int  # device bytes of the model's parameters and buffers during the phase
    host_peak: int  # anonymous host RAM (copies, loaded state, pinned memory)
    managed_peak: int  # CUDA managed memory of paged optimizers (host RAM when paged out)
    mapped_peak: int  # file pages of memory-mapped loads (page cache the kernel can drop)
    host_ram_peak: int  # host + managed at their joint peak: the host RAM the phase needs
    device_start: int = 0  # device bytes live when the phase starts and when it ends
    device_end: int = 0

    @property
    def above_weights(self) -> int:
        return self.device_peak - self.weights

    @property
    def transient(self) -> int:
        """Device bytes the phase needs above what is live before and after it (weights, device state)."""
        return self.device_peak - max(self.device_start, self.device_end)


# --- files that keep only their structure -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorSpec:
    shape: tuple
    dtype: torch.dtype


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _to_spec(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return _TensorSpec(tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _to_spec(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_spec(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_spec(v) for v in obj)
    return copy.deepcopy(obj)


def _from_spec(spec: Any) -> Any:
    if isinstance(spec, _TensorSpec):
        return torch.empty(spec.shape, dtype=spec.dtype, device="cpu")
    if isinstance(spec, dict):
        return {k: _from_spec(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_from_spec(v) for v in spec]
    if isinstance(spec, tuple):
        return tuple(_from_spec(v) for v in spec)
    return copy.deepcopy(spec)


class _FakeFiles:
    """Stands in for safetensors and torch.save files while a phase runs (see the module docstring)."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self.specs: list[Any] = []

    # the placeholder names the structure it stands for, so it survives renames (atomic saves)
    def _write_placeholder(self, f: Any, spec: Any) -> str:
        """Write the placeholder; returns its checksum (what the manifest records)."""
        self.specs.append(spec)
        data = _PLACEHOLDER + str(len(self.specs) - 1).encode()
        if hasattr(f, "write"):
            f.write(data)
        else:
            Path(f).write_bytes(data)
        digest = new_hash()
        digest.update(data)
        return digest.hexdigest()

    def _spec_of(self, f: Any) -> Optional[Any]:
        if hasattr(f, "read"):
            return None
        try:
            data = Path(f).read_bytes()[:64]
        except (OSError, TypeError):
            return None
        if not data.startswith(_PLACEHOLDER):
            return None
        return self.specs[int(data[len(_PLACEHOLDER) :])]

    def add_file(self, path: Path, tensors: dict[str, Any]) -> None:
        """A placeholder file at ``path`` holding ``tensors`` (specs or tensors)."""
        self._write_placeholder(path, _to_spec(tensors))

    def write_safetensors_file(self, path: Path, specs: list, tensors: Iterator[torch.Tensor]) -> str:
        # the streaming writer holds one converted host tensor at a time (its bytes are a view of it)
        for t in tensors:
            del t
        return self._write_placeholder(path, {name: _TensorSpec(tuple(shape), dtype) for name, dtype, shape in specs})

    def torch_save(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        # torch.save copies one device storage at a time to the host while writing it
        seen: set[int] = set()
        for t in _tensors(obj):
            key = t.untyped_storage()._cdata
            if key in seen:
                continue
            seen.add(key)
            if t.device.type != "cpu":
                host = t.detach().to("cpu")
                del host
        self._write_placeholder(f, _to_spec(obj))

    def load_file(self, filename: Any, device: Any = "cpu") -> dict[str, torch.Tensor]:
        spec = self._spec_of(filename)
        if spec is None:
            return self._real["load_file"](filename, device=device)
        with self.counter.mapped():  # safetensors maps the file
            return _from_spec(spec)

    def torch_load(self, f: Any, *args: Any, mmap: Optional[bool] = None, **kwargs: Any) -> Any:
        spec = self._spec_of(f)
        if spec is None:
            return self._real["torch_load"](f, *args, mmap=mmap, **kwargs)
        with self.counter.mapped() if mmap else self.counter.host():
            return _from_spec(spec)

    # mapped pages: what the checkpoint code asks the kernel about and gives back (madvise)
    def holds(self, mappings: Any, t: torch.Tensor) -> bool:
        return isinstance(t, torch.Tensor) and self.counter.counts_as(t, "mapped")

    def release(self, mappings: Any, tree: Any) -> None:
        for t in _tensors(tree):
            self.counter.release(t, "mapped")

    @contextlib.contextmanager
    def installed(self) -> Iterator["_FakeFiles"]:
        """Replace the file I/O of the checkpoint code by this object's, for as long as it is inside."""
        import safetensors.torch

        from torchtune.training.checkpointing import _checkpointer
        from torchtune.utils._checkpointing import _checkpoint_utils

        replaced = [
            (safetensors.torch, "load_file", self.load_file),
            (torch, "save", self.torch_save),
            (torch, "load", self.torch_load),
            (_checkpointer, "_write_safetensors_file", self.write_safetensors_file),
            (_checkpoint_utils.FileMappings, "holds", self.holds),
            (_checkpoint_utils.FileMappings, "release", self.release),
        ]
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
        self._real = {"load_file": safetensors.torch.load_file, "torch_load": torch.load}
        for owner, name, value in replaced:
            if isinstance(owner, type):
                value = _bound(value)
            setattr(owner, name, value)
        try:
            yield self
        finally:
            for owner, name, value in originals:
                setattr(owner, name, value)


def _bound(method: Any) -> Any:
    """``method`` (of a _FakeFiles) as a function that takes the patched class's ``self`` first."""

    def function(instance: Any, *args: Any, **kwargs: Any) -> Any:
        return method(instance, *args, **kwargs)

    return function


# --- a checkpoint folder that looks like the config's weights -----------------------------------------


def _hf_config(model: nn.Module, model_type: str = "LLAMA2") -> dict[str, Any]:
    from torchtune.models._hf_config import _model_rope
    from torchtune.models._hf_family import canonical_model_type, families, shape_of_model

    family = families().get(canonical_model_type(model_type) or "")
    if family is not None and family.folder is not None:
        return family.folder.config_json(model)
    if family is not None and family.config_json is not None:
        return family.config_json(shape_of_model(model))

    attn = model.layers[0].attn
    rope = _model_rope(attn.pos_embeddings)
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": attn.embed_dim,
        "intermediate_size": model.layers[0].mlp.w1.out_features,
        "num_attention_heads": attn.num_heads,
        "num_key_value_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim,
        "num_hidden_layers": len(model.layers),
        "max_position_embeddings": model.max_seq_len,
        "vocab_size": model.tok_embeddings.num_embeddings,
        "rope_theta": rope.theta if rope is not None else 10000.0,
        "tie_word_embeddings": "output.weight" not in dict(model.named_parameters()),
    }
    if rope is not None and rope.scaling is not None:
        config["rope_scaling"] = {"rope_type": "llama3", **rope.scaling}
    return config


def write_hf_folder(model: nn.Module, folder: Path, model_type: str = "LLAMA2") -> Path:
    """A Hugging Face folder for ``model`` whose weights are never read: its config.json and a
    ``model.safetensors`` whose header names every weight with its shape and dtype while its data is a
    hole (the file extended to its full size without writing it: a sparse file, no disk used). The
    checkpointer needs its input folder to save, and checks the header against the model before a run
    (a resume reads the saved weights, a fresh run builds its own). Returns the weights file."""
    from torchtune.models._hf_convert import tune_to_hf_plan
    from torchtune.utils._checkpointing._streaming_write import _SAFETENSORS_DTYPES

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_hf_config(model, model_type), indent=2))
    state = model.state_dict()
    header, offset = {}, 0
    for hf_key, keys in sorted(tune_to_hf_plan(state).items()):
        parts = [state[key] for key in keys]  # a fused tensor's parts are stacked along dim 0
        shape = [sum(p.shape[0] for p in parts), *parts[0].shape[1:]]
        size = math.prod(shape) * parts[0].element_size()
        dtype = _SAFETENSORS_DTYPES[parts[0].dtype]
        header[hf_key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    path = folder / "model.safetensors"
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)
    return path


def _write_source_checkpoint(cfg: Any, folder: Path, files: _FakeFiles, dtype: torch.dtype) -> None:
    """config.json and placeholder weight files named as ``cfg.checkpointer`` names them, filled in order
    to equal sizes (as Hugging Face shards a model)."""
    from torchtune import config as tt_config
    from torchtune.models._hf_convert import tune_to_hf_plan
    from torchtune.models._hf_family import canonical_model_type, families
    from torchtune.utils import set_default_dtype

    if not str(cfg.checkpointer._component_).endswith("FullModelHFCheckpointer"):
        from torchtune._errors import TuneError

        raise TuneError(
            f"tune estimate-memory simulates checkpoints of torchtune.training.FullModelHFCheckpointer; "
            f"checkpointer._component_={cfg.checkpointer._component_} is not supported by it. Estimate with the "
            "Hugging Face checkpointer (the memory of a save differs little between the formats), or pass "
            "--steps-only to estimate the training steps alone."
        )
    with torch.device("meta"), set_default_dtype(dtype):
        model = tt_config.instantiate(cfg.model)
    model_type = str(cfg.checkpointer.get("model_type", "LLAMA2"))
    hf_config = _hf_config(model, model_type)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
    tune_sd = model.state_dict()
    family = families().get(canonical_model_type(model_type) or "")
    fused = family is not None and family.fused_projections
    hf = {}
    if family is not None and family.folder is not None:
        plan = {
            hf_key: [key] for key, hf_key in family.folder(hf_config, folder / "config.json").hf_names(tune_sd).items()
        }
    else:
        plan = tune_to_hf_plan(tune_sd, fused=fused)
    for hf_key, parts in plan.items():
        first = tune_sd[parts[0]]  # a fused tensor stacks its parts' rows
        rows = sum(tune_sd[p].shape[0] for p in parts)
        hf[hf_key] = (
            first if len(parts) == 1 else torch.empty((rows, *first.shape[1:]), dtype=first.dtype, device="meta")
        )
    names = list(cfg.checkpointer.checkpoint_files)
    if len(names) == 1 and str(names[0]).endswith(".index.json"):
        names = ["model.safetensors"]
        cfg.checkpointer.checkpoint_files = names
    names = [n if str(n).endswith(".safetensors") else str(n) + ".safetensors" for n in names]
    cfg.checkpointer.checkpoint_files = names
    total = sum(t.numel() * t.element_size() for t in hf.values())
    shards: list[dict[str, Any]] = [{} for _ in names]
    filled = 0
    for key, t in hf.items():
        index = min(int(filled * len(names) / max(total, 1)), len(names) - 1)
        shards[index][key] = t
        filled += t.numel() * t.element_size()
    for name, shard in zip(names, shards):
        files.add_file(folder / name, shard)


# --- the phases ------------------------------------------------------------------------------------------


def _settings(cfg: Any) -> Any:
    from torchtune import training

    return training.RunSettings(
        optimizer_in_bwd=bool(cfg.optimizer_in_bwd),
        batch_size=int(cfg.batch_size),
        gradient_accumulation_steps=int(cfg.gradient_accumulation_steps),
        seed=0,
        max_steps_per_epoch=cfg.max_steps_per_epoch,
        epochs=int(cfg.epochs),
    )


def setup_run(
    cfg: Any, device: torch.device, dtype: torch.dtype, *, simulated: bool = True
) -> tuple[Any, nn.Module, Any]:
    """The recipe's set-up of checkpointer, model and optimizer (with restored state on resume).

    ``simulated``: on fake tensors, where the model is built with random weights and then loaded (see
    the module docstring); otherwise exactly as the recipe: ``build_model(state_dict=...)``.
    """
    from torchtune import training

    settings = _settings(cfg)
    resume = training.resolve_resume(cfg, settings)
    checkpointer = training.build_checkpointer(cfg.checkpointer, resume)
    state_dict = checkpointer.load_checkpoint()["model"]
    model = training.build_model(
        cfg.model,
        device=device,
        dtype=dtype,
        state_dict=None if simulated else state_dict,
        enable_activation_checkpointing=bool(cfg.enable_activation_checkpointing),
    )
    if simulated:
        with warnings.catch_warnings():
            # "copying from a non-meta parameter to a meta parameter is a no-op": meta stands for the device
            warnings.filterwarnings("ignore", message=".*non-meta parameter.*")
            model.load_state_dict(state_dict)  # what build_model(state_dict=...) does after to_empty
    del state_dict
    rounding = None
    if not simulated:
        # the recipe's rounding, its stream continued from the checkpoint: a step after the resume is
        # rounded as the run's own steps were (in backward, by the hooks build_optimizer registers)
        rounding = training.build_stochastic_rounding(
            bool(cfg.get("bf16_stochastic_rounding", False)),
            dtype=dtype,
            seed=cfg.seed if cfg.get("seed") is not None else 0,
            device=device,
            state=resume.stochastic_rounding_state if resume is not None else None,
        )
    optimizer = training.build_optimizer(
        cfg.optimizer,
        model,
        optimizer_in_bwd=bool(cfg.optimizer_in_bwd),
        in_bwd_group=cfg.optimizer_in_bwd_group,
        rounding=rounding,
    )
    if resume is not None:
        training.load_optimizer_state(optimizer, resume.optimizer_state)
        resume.drop_loaded_states()
    return checkpointer, model, optimizer


def _make_optimizer_state(model: nn.Module, optimizer: Any) -> None:
    """One optimizer step per parameter with a zero gradient: the state of a run in progress."""
    inner = getattr(optimizer, "optim_map", None)
    params = dict(model.named_parameters())
    with torch.no_grad(), _unfused(optimizer):
        if inner is not None:
            for name, opt in inner.items():
                p = params[name]
                p.grad = torch.zeros_like(p)
                opt.step()
                p.grad = None
        else:
            for p in params.values():
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def _unfused(optimizer: Any) -> Iterator[None]:
    """torch's fused kernels refuse meta tensors; the unfused step creates the same state tensors (only
    ``step`` sits on the host instead of the device: 4 bytes per parameter)."""
    groups = [g for g in optimizer.param_groups if g.get("fused")]
    for g in groups:
        g["fused"] = False
    try:
        yield
    finally:
        for g in groups:
            g["fused"] = True


def _weights_bytes(model: nn.Module) -> int:

    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage()._cdata] = _rounded(t.untyped_storage().nbytes())
    return sum(seen.values())


def _phase(name: str, counter: Any, weights: int, start: int) -> PhaseMemory:
    return PhaseMemory(
        name=name,
        device_peak=counter.window_peak_bytes("device"),
        weights=weights,
        host_peak=counter.window_peak_bytes("host"),
        managed_peak=counter.window_peak_bytes("managed"),
        mapped_peak=counter.window_peak_bytes("mapped"),
        host_ram_peak=counter.window_peak_bytes("host_ram"),
        device_start=start,
        device_end=counter.current,
    )


def estimate_checkpoint_phases(cfg: Any, dtype: torch.dtype) -> list[PhaseMemory]:
    """Set-up, step checkpoint save and resume load of ``cfg`` (already prepared by the estimator:
    bitsandbytes/torchao optimizers replaced by ``LayoutOptimizer``), on fake tensors."""
    from omegaconf import OmegaConf
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    device = torch.device("meta")  # meta fake tensors stand for the device, CPU ones for the host
    phases: list[PhaseMemory] = []
    with tempfile.TemporaryDirectory(prefix="plaintune-estimate-") as tmp:
        counter = StorageCounter(cpu_is_host=True)
        files = _FakeFiles(counter)
        source, output = Path(tmp) / "weights", Path(tmp) / "output"
        cfg.resume_from_checkpoint = False
        cfg.checkpointer.recipe_checkpoint = None
        cfg.checkpointer.checkpoint_dir = str(source)
        cfg.checkpointer.output_dir = str(output)
        cfg.output_dir = str(output)
        _write_source_checkpoint(cfg, source, files, dtype)
        with (
            FakeTensorMode(allow_non_fake_inputs=True),
            counter,
            _active(counter),
            files.installed(),
            warnings.catch_warnings(),
        ):
            # bitsandbytes deep-copies the state it loads; copying a fake tensor reads its (null) data pointer
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            counter.reset_window()
            start = counter.current
            checkpointer, model, optimizer = setup_run(cfg, device, dtype)
            phases.append(_phase("set-up (load weights)", counter, _weights_bytes(model), start))

            _make_optimizer_state(model, optimizer)
            counter.reset_window()
            start = counter.current
            save_step_checkpoint(checkpointer, model, optimizer, cfg)
            phases.append(_phase("step checkpoint save", counter, _weights_bytes(model), start))
            folder = latest_step_folder(output)
            release(optimizer)
            del checkpointer, model, optimizer
            gc.collect()

            # a new process resumes: nothing of the run above is alive any more
            cfg.resume_from_checkpoint = True
            cfg.checkpointer.recipe_checkpoint = str(folder / RECIPE_STATE_NAME)
            counter.reset_window()
            start = counter.current
            checkpointer, model, optimizer = setup_run(cfg, device, dtype)
            phases.append(_phase("resume load", counter, _weights_bytes(model), start))
            release(optimizer)
            del checkpointer, model, optimizer
            gc.collect()
    return phases


def release(optimizer: Any) -> None:
    """Let the optimizers' state and parameters go: each in-backward hook holds its optimizer and lives on
    its parameter, a cycle only the garbage collector would break."""
    for opt in getattr(optimizer, "optim_map", {"": optimizer}).values():
        opt.state.clear()
        opt.param_groups.clear()


def save_step_checkpoint(checkpointer: Any, model: nn.Module, optimizer: Any, cfg: Any) -> None:
    """What the recipe's ``save_checkpoint(epoch, step_checkpoint=True)`` does."""
    from torchtune import training

    state: dict[str, Any] = {"model": model.state_dict()}
    state.update(
        training.recipe_state(
            optimizer=optimizer,
            lr_scheduler=None,
            progress=training.TrainingProgress(epochs_run=0, global_step=1, steps_run_in_epoch=1),
            settings=_settings(cfg),
            seed=0,
            max_steps_per_epoch=cfg.max_steps_per_epoch,
            model=model,
        )
    )
    checkpointer.save_checkpoint(state, epoch=0, step=1, intermediate=True)
    del state


def latest_step_folder(output: Path) -> Path:
    folders = sorted(p for p in output.iterdir() if p.is_dir() and p.name.startswith("step_"))
    return folders[-1]


@dataclasses.dataclass
class RunMemoryEstimate:
    """The training steps' estimate (split into categories) and the peaks of every phase of the run."""

    steps: MemoryEstimate
    phases: list[Any]  # PhaseMemory, in run order: set-up, training steps, step checkpoint save, resume load

    @property
    def peak_bytes(self) -> int:
        return max(p.device_peak for p in self.phases)

    @property
    def peak_phase(self) -> Any:
        return max(self.phases, key=lambda p: p.device_peak)

    def phase(self, name: str) -> Any:
        return next(p for p in self.phases if p.name.startswith(name))

    def format(self, title: str = "Estimated peak device memory") -> str:
        lines = [self.steps.format(f"{title}, training steps"), ""]
        lines.append("Each phase of the run (estimated on fake tensors):")
        header = ("phase", "device peak", "above weights", "transient", "host RAM", "paged state", "mapped files")
        lines.append(f"  {header[0]:<24}" + "".join(f"{h:>15}" for h in header[1:]))
        for p in self.phases:
            values = (p.device_peak, p.above_weights, p.transient, p.host_ram_peak, p.managed_peak, p.mapped_peak)
            lines.append(f"  {p.name:<24}" + "".join(f"{v / GB:>12.2f} GB" for v in values))
        peak = self.peak_phase
        lines.append(f"  {'whole run (device peak)':<24}{peak.device_peak / GB:>12.2f} GB  (in {peak.name})")
        lines.append(
            "Note: transient = device memory a phase needs above what is live before and after it (weights, "
            "device optimizer state); host RAM = anonymous host memory + paged optimizer state (CUDA managed "
            "memory, in host RAM when paged out), without the process itself (Python, libraries: a few GB); "
            "mapped files = checkpoint files mapped into memory, resident only as they are read and dropped by "
            "the kernel under pressure"
        )
        return "\n".join(lines)


def _steps_phase(estimate: MemoryEstimate) -> Any:
    return PhaseMemory(
        name="training steps",
        device_peak=estimate.peak_bytes,
        weights=estimate.breakdown["weights"],
        host_peak=estimate.host_offload_peak_bytes,
        managed_peak=estimate.paged_optimizer_bytes,
        mapped_peak=0,
        host_ram_peak=estimate.host_bytes_needed,
        device_start=estimate.breakdown["weights"] + estimate.breakdown["optimizer_state"],
        device_end=estimate.breakdown["weights"] + estimate.breakdown["optimizer_state"],
    )


def estimate_run_memory(
    cfg: Any, seq_len: Optional[int] = None, batch_size: Optional[int] = None, steps: int = 2
) -> RunMemoryEstimate:
    """``estimate_recipe_memory`` for the steps, plus the set-up, step checkpoint save and resume load
    phases run through the recipe's checkpointer and training-layer code on fake tensors
    (this module)."""
    step_estimate = estimate_recipe_memory(cfg, seq_len=seq_len, batch_size=batch_size, steps=steps)
    prepared, _, dtype, _ = prepare_estimate(cfg)
    phases = estimate_checkpoint_phases(prepared, dtype)
    setup, save, resume = phases
    return RunMemoryEstimate(steps=step_estimate, phases=[setup, _steps_phase(step_estimate), save, resume])
