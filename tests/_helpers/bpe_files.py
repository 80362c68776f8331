"""Tiny GPT-2-format byte-level BPE files (``vocab.json`` + ``merges.txt``, as Qwen's and Phi-4's folders
hold them), trained here with the ``tokenizers`` library on a small corpus: never downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Tuple

from tests._helpers.llama3_tokenizer import CHAT_CORPUS
from tests._helpers.tokenizer import DEFAULT_CORPUS


def make_bpe_files(
    folder: Path, pattern: str, corpus: Optional[Iterable[str]] = None, vocab_size: int = 600
) -> Tuple[Path, Path]:
    """Train a byte-level BPE whose pre-tokenizer splits with ``pattern`` and write ``vocab.json`` and
    ``merges.txt`` into ``folder``; returns their paths. Deterministic for a given corpus."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    lines = list(corpus) if corpus is not None else [*DEFAULT_CORPUS, *CHAT_CORPUS]
    tokenizer.train_from_iterator(lines * 3, trainer=trainer)
    vocab, merges = tokenizer.model.save(str(folder))
    return Path(vocab), Path(merges)
