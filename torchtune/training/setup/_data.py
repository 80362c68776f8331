"""The data a recipe trains on: dataset, resumable sampler, batches."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch.utils.data import DataLoader

from torchtune import config
from torchtune._errors import TuneError
from torchtune.datasets import PackedDataset, collate_for
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX
from torchtune.training.setup._sampler import ResumableSampler

log = logging.getLogger("torchtune")

__all__ = ["TrainingData", "build_dataloader", "check_data_head", "num_tokens", "padding_id", "pin_batches"]

# Examples tokenized at set-up: enough to meet a template or row that does not fit, in milliseconds.
HEAD_EXAMPLES = 8


def padding_id(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad id, else 0 (a SentencePiece model may have none)."""
    pad = getattr(tokenizer, "pad_id", None)
    return pad if pad is not None and pad >= 0 else 0


@dataclasses.dataclass
class TrainingData:
    """What the loop needs from the data: the loader, its sampler (to position it) and the pad id."""

    dataloader: DataLoader
    sampler: ResumableSampler
    pad_id: int
    head: str = ""  # the token lengths of the first examples (check_data_head), for tune validate's report

    @property
    def packed(self) -> bool:
        """Whether the batches are packs (``dataset.packed: True``)."""
        return isinstance(self.dataloader.dataset, PackedDataset)

    def num_tokens(self, batch: Dict[str, torch.Tensor]) -> int:
        """Non-padding tokens of a batch (see :func:`num_tokens`)."""
        return num_tokens(batch, self.pad_id)

    def steps_per_epoch(self, *, batch_size: int, gradient_accumulation_steps: int, max_steps: Optional[int]) -> int:
        """Optimizer steps in one epoch: whole groups of ``gradient_accumulation_steps`` batches, at most
        ``max_steps`` (``max_steps_per_epoch``). ``batch_size`` (the global one) only words the error.

        Raises:
            TuneError: the data holds less than one step.
        """
        ga = gradient_accumulation_steps
        steps = len(self.dataloader) // ga
        if max_steps is not None:
            steps = min(steps, max_steps)
        if steps < 1:
            raise TuneError(
                f"The dataset has {len(self.dataloader.dataset)} examples, fewer than one optimizer step needs "
                f"(batch_size={batch_size} x gradient_accumulation_steps={ga}). Lower batch_size or use a larger "
                "dataset."
            )
        return steps

    def steps(self, gradient_accumulation_steps: int) -> Iterator[List[Dict[str, torch.Tensor]]]:
        """The host batches of each optimizer step, ``gradient_accumulation_steps`` micro-batches at a
        time (an incomplete last group is left out), so a step's label tokens can be counted before its
        first forward."""
        batches = iter(self.dataloader)
        while len(micro := list(itertools.islice(batches, gradient_accumulation_steps))) == gradient_accumulation_steps:
            yield micro


def pin_batches(device: Optional[torch.device]) -> bool:
    """Whether the loader puts its batches in pinned host memory for a run on ``device``: on CUDA, where a
    copy from pageable memory first waits for everything queued on the stream (CUDA's rule for pageable
    host-to-device copies) and a pinned one is queued like a kernel (``non_blocking=True``)."""
    return device is not None and torch.device(device).type == "cuda"


def num_tokens(batch: Dict[str, torch.Tensor], pad_id: int) -> int:
    """Non-padding tokens of a batch, counted on the host before it moves (no device sync): the count
    behind the ``tokens_per_second`` a recipe logs."""
    return int(batch["tokens"].ne(pad_id).sum())


def check_data_head(dataset: Any, key: str = "dataset", examples: int = HEAD_EXAMPLES) -> str:
    """Tokenize the first ``examples`` examples as the first steps will, so that a template that does not render
    or a row that does not tokenize stops set-up before any weight is read; log and return their token lengths,
    and how many rows the dataset left out for having nothing to learn.

    Every row's fields (null or non-text values) and labels were already checked when the dataset was built
    (``torchtune.datasets``): this is only the first steps' tokenization, done early.

    Raises:
        TuneError: naming the example, ``key`` and the error.
    """
    lengths = []
    count = min(examples, len(dataset))
    for index in range(count):
        try:
            lengths.append(len(dataset[index]["tokens"]))
        except TuneError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's row or template; the run would fail at its first step
            raise TuneError(
                f"Example {index} of {key} could not be tokenized: {type(exc).__name__}: {exc}. Check that "
                f"{key}.template (or the dataset's template) fits the rows, {key}.column_map, and that example "
                "in the data file."
            ) from exc
    if not lengths:
        return ""
    head = f"the first {count} examples are {min(lengths)} to {max(lengths)} tokens long"
    if getattr(dataset, "max_seq_len", None) is not None:
        head += f" (max_seq_len {dataset.max_seq_len})"
    dropped = getattr(dataset, "dropped", None) or {}
    if dropped:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items()))
        head += f"; {sum(dropped.values())} rows with nothing to learn left out ({why})"
    log.info("%s: %s", key, head)
    return head


def build_dataloader(
    cfg_dataset: Any,
    tokenizer: Any,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    info: Any = None,
    device: Optional[torch.device] = None,
) -> TrainingData:
    """The dataset of ``cfg_dataset`` in batches of ``batch_size``, in a seeded order that can resume.

    The order depends only on ``(seed, epoch)`` (``ResumableSampler``); padded examples get
    ``CROSS_ENTROPY_IGNORE_IDX`` labels, packed ones a block-causal mask. With ``info`` (the
    ``DistributedInfo`` of several ranks), this rank's loader yields its share of that order in per-rank
    batches of ``batch_size``. ``device``: the run's device; on CUDA the batches come in pinned host memory
    (``pin_batches``), so the step's copies to the device neither wait for the GPU nor block the host.

    Raises:
        TuneError: the dataset has no examples, or its first examples do not tokenize (``check_data_head``).
    """
    dataset = config.instantiate(cfg_dataset, tokenizer)
    if len(dataset) == 0:
        raise TuneError(
            f"The dataset ({cfg_dataset._component_}, source {cfg_dataset.get('source')}) has no "
            "examples. Check dataset.source / dataset.data_files and dataset.split."
        )
    head = check_data_head(dataset, "dataset")
    pad_id = padding_id(tokenizer)
    world, rank = (info.world_size, info.rank) if info is not None else (1, 0)
    sampler = ResumableSampler(len(dataset), shuffle=bool(shuffle), seed=seed, num_replicas=world, rank=rank)
    dataloader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_for(dataset, padding_idx=pad_id, ignore_idx=CROSS_ENTROPY_IGNORE_IDX),
        pin_memory=pin_batches(device),
    )
    log.info("Dataset: %d examples, %d batches per epoch", len(dataset), len(dataloader))
    return TrainingData(dataloader=dataloader, sampler=sampler, pad_id=pad_id, head=head)
