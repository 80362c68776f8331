"""Train tiny SentencePiece models for tests, shaped like Llama2's ``tokenizer.model``.

Llama2's model: BPE, byte fallback, ``unk=0, bos=1, eos=2, pad=-1``, identity normalization, no
whitespace squashing, digits split. A model trained here with the same settings behaves the same way
at the junction of separately encoded texts (the dummy-prefix ``▁``), which is what the tokenizer and
dataset tests check. Training takes well under a second on the default corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Union

DEFAULT_CORPUS: tuple[str, ...] = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
    "Below is an instruction that describes a task, paired with an input that provides further context.",
    "### Instruction:",
    "### Input:",
    "### Response:",
    "Give three tips for staying healthy.",
    "Eat a balanced diet and make sure to include plenty of fruits and vegetables.",
    "Exercise regularly to keep your body active and strong.",
    "Get enough sleep and maintain a consistent sleep schedule.",
    "What is the capital of France? The capital of France is Paris.",
    "Translate the following sentence into French: Hello, how are you?",
    "Summarize the text below in one sentence.",
    "The quick brown fox jumps over the lazy dog.",
    "Answer: 42 is the answer to life, the universe and everything.",
    "Write a short poem about the sea and the sky.",
    "List the numbers from 1 to 10: 1 2 3 4 5 6 7 8 9 10.",
    "A language model predicts the next token from the tokens before it.",
    "Fine-tuning adapts a pretrained model to a new task with a small dataset.",
    "Question: Why is the sky blue? Answer: Because of Rayleigh scattering.",
    "Hello world! This is a test of the tokenizer, with punctuation; and symbols (like these).",
)


def make_spm_tokenizer(
    tmp_dir: Union[str, Path],
    corpus_lines: Optional[Iterable[str]] = None,
    *,
    vocab_size: int = 400,
    model_type: str = "bpe",
    name: str = "tokenizer",
) -> Path:
    """Train a SentencePiece model on ``corpus_lines`` (default: a small English corpus) into
    ``tmp_dir/<name>.model`` with Llama2's special ids, and return the model's path."""
    import sentencepiece as spm

    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    lines = list(DEFAULT_CORPUS if corpus_lines is None else corpus_lines)
    # Repeat the corpus so that merges have counts to work with; training stays deterministic.
    corpus = tmp_dir / f"{name}_corpus.txt"
    corpus.write_text("\n".join(lines * 4) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_dir / name),
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return tmp_dir / f"{name}.model"
