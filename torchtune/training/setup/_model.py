"""Building the model a recipe trains: on its device, in its dtype, with weights, checkpointing, compile."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import warnings
from typing import Any, Dict, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torchtune import config
from torchtune._errors import TuneError
from torchtune.training.activations import set_activation_checkpointing
from torchtune.training.checkpointing import validate_state_dict
from torchtune.training.setup import _compile
from torchtune.utils import set_default_dtype

log = logging.getLogger("torchtune")

__all__ = [
    "build_model",
    "check_model_matches_checkpoint",
    "check_sequences_fit_model",
    "check_tokenizer_fits_model",
    "model_fingerprint",
]

# In-place initialisers (nn.init.normal_, Tensor.uniform_, ...): on the meta device they have nothing to fill.
_INITIALISERS = frozenset(
    {getattr(nn.init, n) for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")}
    | {torch.Tensor.normal_, torch.Tensor.uniform_}
)


class _SkipMetaInit(TorchFunctionMode):
    """Skip the initialisers of meta tensors: they hold no values, and a meta ``normal_`` alone imports torch's
    compiler stack (torch._dynamo: 0.8 s of CPU), which a set-up check or a model about to get its weights
    never needs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def _build_on_meta(cfg_model: Any, dtype: Optional[torch.dtype] = None) -> nn.Module:
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(set_default_dtype(dtype))
        stack.enter_context(torch.device("meta"))
        stack.enter_context(_SkipMetaInit())
        return config.instantiate(cfg_model)


def build_model(
    cfg_model: Any,
    *,
    device: torch.device,
    dtype: torch.dtype,
    state_dict: Optional[Dict[str, torch.Tensor]] = None,
    enable_activation_checkpointing: bool = False,
    compile_model: bool = False,
    liger_kernels: bool = False,
) -> nn.Module:
    """The model of ``cfg_model`` on ``device`` in ``dtype``, with ``state_dict``'s weights.

    ``state_dict=None`` gives the builder's random initialisation (memory estimates, benchmarks).
    With weights, the model is built on the meta device first: that skips a random initialisation
    the weights would overwrite, and ``to_empty`` then allocates every weight once, in its final
    dtype, on the device. Activation checkpointing wraps each decoder layer; ``compile_model``
    compiles each decoder layer in place, so parameter names (and so checkpoints and optimizer
    state keys) stay the same and in-backward hooks sit on the same parameters. ``liger_kernels``
    replaces the RMSNorms, rotary embeddings and SiLU-gated feed-forward blocks by liger-kernel's
    (``torchtune.modules._liger``; same parameters) before both.

    Raises:
        TuneError: the weights do not fit the model (names and shapes are listed).
    """
    if state_dict is None:
        with set_default_dtype(dtype), device:
            model = config.instantiate(cfg_model)
    else:
        model = _build_on_meta(cfg_model, dtype)
        model.to_empty(device=device)
        validate_state_dict(model, state_dict)
        model.load_state_dict(state_dict)
        model.init_buffers(device)
    if liger_kernels:
        from torchtune.modules._liger import apply_liger_kernels

        log.info("liger-kernel modules: %s", apply_liger_kernels(model))
    if enable_activation_checkpointing:
        from torchtune.modules import TransformerDecoderLayer

        set_activation_checkpointing(model, {TransformerDecoderLayer})
    if compile_model:
        _compile.compile_model(model, verbose=False)
    log.info(
        "Model %s: %.1fM parameters, %s on %s",
        getattr(cfg_model, config.COMPONENT_KEY, type(model).__name__),
        sum(p.numel() for p in model.parameters()) / 1e6,
        dtype,
        device,
    )
    return model


def model_skeleton(cfg_model: Any, *, dtype: torch.dtype) -> nn.Module:
    """The model of ``cfg_model`` on the meta device: its parameter names, shapes and config without any
    memory, to check the checkpoint and tokenizer against before the weights are read."""
    return _build_on_meta(cfg_model, dtype)


def check_model_matches_checkpoint(model: Any, checkpointer: Any) -> None:
    """The checkpoint's config (config.json) vs the model: sizes, heads, RoPE, tying, biases, q/k norm,
    sliding window.

    A mismatch (same hidden size, other split into heads; other RoPE scaling) converts q/k weights
    wrongly, or turns positions differently, without any shape error, so it is caught here.
    ``model`` may be the model's config node (``cfg.model``): it is then built on the meta device
    (no memory, no initialisation), so the check runs before any weight is read.
    Checkpointers that know no such config (Meta format) have no ``check_model``.

    Raises:
        TuneError: naming both values and the key to change.
    """
    check_model = getattr(checkpointer, "check_model", None)
    if check_model is None:
        return
    if not isinstance(model, nn.Module):
        model = _build_on_meta(model)
    check_model(model)


def check_tokenizer_fits_model(tokenizer: Any, model: nn.Module, cfg_tokenizer: Any) -> None:
    """The tokenizer's ids must fit the embedding table: an id past the table would crash training.

    A table larger than the tokenizer is normal (Qwen2.5 and Qwen3 have 151,936 rows for about 151,665
    tokens; many models reserve rows) and gets one informational line.

    Raises:
        TuneError: naming the tokenizer file and both sizes.
    """
    vocab_size = model.tok_embeddings.num_embeddings
    source = cfg_tokenizer.get("path", cfg_tokenizer.get(config.COMPONENT_KEY))
    # Ids only an image produces (Llama 3's <|image|> = 128256 after a text model's 128256 rows) never reach
    # a text model: the tokenizer says how many ids a text-only sample can hold where that differs.
    tokens = getattr(tokenizer, "text_vocab_size", tokenizer.vocab_size)
    if tokens > vocab_size:
        raise TuneError(
            f"The tokenizer ({source}) has {tokens} tokens but the model's embedding table has "
            f"{vocab_size} rows: token ids past the table would crash training, so the tokenizer does not belong "
            "to this model. Use the tokenizer that belongs to the checkpoint (tokenizer.path and "
            "tokenizer._component_), or a model builder whose vocab_size is at least the tokenizer's."
        )
    if vocab_size > tokens:
        log.info(
            "The model's embedding table has %d rows for the tokenizer's %d tokens (%s); the extra rows are never "
            "looked up, as in the published checkpoint.",
            vocab_size,
            tokens,
            source,
        )


def check_model_fits(
    cfg: Any, checkpointer: Any, tokenizer: Any, *, dtype: torch.dtype, resume: Any = None
) -> nn.Module:
    """Before any weight is read: the shapes of the model of ``cfg.model`` (built on the meta device, no
    memory) against the checkpoint's config, the tokenizer of ``cfg.tokenizer`` (None: no tokenizer to check),
    the data's ``max_seq_len`` against the model's positions and, on a resume, the recipe state's fingerprint.
    Returns that meta-device model.

    Raises:
        TuneError: from :func:`check_model_matches_checkpoint`, :func:`check_tokenizer_fits_model`,
            :func:`check_sequences_fit_model` or
            ``ResumePlan.check_model``, each naming what to change.
    """
    skeleton = model_skeleton(cfg.model, dtype=dtype)
    check_model_matches_checkpoint(skeleton, checkpointer)
    if tokenizer is not None:
        check_tokenizer_fits_model(tokenizer, skeleton, cfg.tokenizer)
    check_sequences_fit_model(cfg, skeleton)
    if resume is not None:
        resume.check_model(skeleton)
    return skeleton


def _dataset_nodes(node: Any) -> list:
    if node is None:
        return []
    return list(node) if not hasattr(node, "get") else [node]


def check_sequences_fit_model(cfg: Any, model: nn.Module) -> None:
    """The longest sequence the config lets through (each ``dataset`` / ``validation_dataset`` node's
    ``max_seq_len``, else ``tokenizer.max_seq_len``) must fit the model's positions (``model.max_seq_len``):
    a longer batch would stop the run at the step that meets it, maybe hours in.

    Raises:
        TuneError: naming the key, both lengths and what to set.
    """
    limit = getattr(model, "max_seq_len", None)
    if not isinstance(limit, int):
        return
    tokenizer_len = cfg.tokenizer.get("max_seq_len") if cfg.get("tokenizer") is not None else None
    for key in ("dataset", "validation_dataset"):
        nodes = _dataset_nodes(cfg.get(key))
        for i, node in enumerate(nodes):
            where = key if len(nodes) == 1 else f"{key}.{i}"
            length, name = node.get("max_seq_len"), f"{where}.max_seq_len"
            if length is None:
                length, name = tokenizer_len, "tokenizer.max_seq_len"
            if isinstance(length, int) and length > limit:
                raise TuneError(
                    f"{name}={length} is longer than the model's max_seq_len ({limit}, the positions its RoPE "
                    f"covers): the first batch that long would stop the run at that step. Set {name}={limit} (or "
                    "less), or a model with more positions."
                )


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the parameter names and shapes, and of RoPE's channel layout where it is Hugging Face's
    halves (``interleaved=False``: Qwen, Phi): tells whether a checkpoint is for this model. The same weights
    rotated in the other layout would train silently wrong, so a Qwen/Phi step checkpoint saved while those
    builders used the interleaved layout is refused here rather than resumed."""
    shapes = sorted((n, tuple(p.shape)) for n, p in model.named_parameters())
    halves = any(getattr(m, "interleaved", True) is False for m in model.modules())
    key = repr(shapes) + (" rope:halves" if halves else "")  # unchanged for the interleaved (Llama) models
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def disable_dropout(model: nn.Module) -> None:
    """Set the probability of every ``nn.Dropout`` in ``model`` to 0 (with a warning for each that had one)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p != 0:
            warnings.warn(f"Found Dropout with value {module.p} in module {module}. Setting to zero.", stacklevel=2)
            module.p = 0
