"""Tiny Llama 3-style tokenizer files for tests, made here: a tiktoken BPE file trained on a small
corpus with Llama 3's split pattern, and the matching Hugging Face tokenizer (``tokenizer.json`` +
``tokenizer_config.json`` with Llama 3 Instruct's chat template), built by transformers' own tiktoken
converter so that it is an independent implementation to compare with."""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, Optional

from tests._helpers.chat_templates import TEMPLATES
from tests._helpers.tokenizer import DEFAULT_CORPUS

LLAMA3_CHAT_TEMPLATE = TEMPLATES["llama3"]

CHAT_CORPUS = (
    "You are a helpful assistant. Answer briefly and politely.",
    "What is two plus three? Two plus three is five.",
    "Name a colour of the sky. The sky is blue during the day.",
    "Reverse the word apple: elppa. Reverse the word stone: enots.",
    "Thanks! You're welcome; it's my pleasure, and I'll help again.",
    "Ünïcödé text, emojis 🙂 and numbers 12345 678 are handled byte by byte.",
)


def train_bpe_ranks(corpus: Iterable[str], num_merges: int = 300) -> Dict[bytes, int]:
    """Byte-level BPE ranks: the 256 bytes, then the most frequent adjacent pair inside the pre-tokenized
    pieces, merged ``num_merges`` times (ties broken by first occurrence, so the result is deterministic)."""
    import regex

    from torchtune.models.llama3 import LLAMA3_SPLIT_PATTERN

    ranks = {bytes([b]): b for b in range(256)}
    pieces = [piece for text in corpus for piece in regex.findall(LLAMA3_SPLIT_PATTERN, text)]
    words = [[bytes([b]) for b in piece.encode()] for piece in pieces]
    for _ in range(num_merges):
        stats: Counter = Counter()
        for word in words:
            stats.update(zip(word[:-1], word[1:]))
        if not stats:
            break
        best = max(stats, key=lambda pair: stats[pair])  # max keeps the first of equal counts
        merged = best[0] + best[1]
        ranks[merged] = len(ranks)
        new_words = []
        for word in words:
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words.append(out)
        words = new_words
    return ranks


def write_tiktoken_file(ranks: Dict[bytes, int], path: Path) -> Path:
    """Write ``ranks`` in tiktoken's format: ``<base64 token> <rank>`` per line."""
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token, rank in sorted(ranks.items(), key=lambda x: x[1])]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def make_llama3_tokenizer_files(folder: Path, corpus: Optional[Iterable[str]] = None, num_merges: int = 300) -> Path:
    """Write ``original/tokenizer.model`` (tiktoken), ``tokenizer.json`` and ``tokenizer_config.json`` into
    ``folder`` as a Llama 3.x hub folder has them; returns ``folder``."""
    corpus = list(corpus) if corpus is not None else [*DEFAULT_CORPUS, *CHAT_CORPUS]
    tiktoken_path = write_tiktoken_file(train_bpe_ranks(corpus, num_merges), folder / "original" / "tokenizer.model")
    hf = hf_tokenizer_from_tiktoken(tiktoken_path)
    hf.save_pretrained(str(folder))
    # save_pretrained writes what transformers needs; tokenizer.json is the file our tokenizer reads.
    assert (folder / "tokenizer.json").is_file()
    return folder


def hf_tokenizer_from_tiktoken(tiktoken_path: Path):
    """A transformers tokenizer for the tiktoken file, through transformers' TikTokenConverter, with Llama
    3's special tokens and chat template."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from torchtune.models.llama3 import LLAMA3_SPECIAL_TOKENS, LLAMA3_SPLIT_PATTERN

    backend = TikTokenConverter(
        vocab_file=str(tiktoken_path), pattern=LLAMA3_SPLIT_PATTERN, extra_special_tokens=LLAMA3_SPECIAL_TOKENS
    ).converted()
    # As in Llama 3's tokenizer.json: the post-processor puts <|begin_of_text|> in front.
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        chat_template=LLAMA3_CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
    )
