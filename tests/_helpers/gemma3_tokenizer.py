"""A tiny Gemma 3-style tokenizer made here: a byte-fallback BPE trained on a small corpus with the
``tokenizers`` library, laid out as Gemma 3's ``tokenizer.json`` is (spaces as ``▁``, ``<bos>`` put
before each text by the post-processor, Gemma's special tokens at their ids), and a
``tokenizer_config.json`` with Gemma 3's chat template (google/gemma-3-*-it)."""

from __future__ import annotations

import json
from pathlib import Path

from tests._helpers.chat_templates import TEMPLATES
from tests._helpers.llama3_tokenizer import CHAT_CORPUS
from tests._helpers.tokenizer import DEFAULT_CORPUS

GEMMA3_CHAT_TEMPLATE = TEMPLATES["gemma3"]

# Gemma 3's first special tokens, at their ids (0-4), then the turn markers.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"]


def make_gemma3_tokenizer(folder: Path, vocab_size: int = 400) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder``; returns the tokenizer.json path."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + len(byte_tokens), special_tokens=SPECIALS + byte_tokens, show_progress=False
    )
    corpus = [line.replace(" ", "▁") for line in (*DEFAULT_CORPUS, *CHAT_CORPUS, "model user system")]
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)]
    )
    path = folder / "tokenizer.json"
    tok.save(str(path))
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": GEMMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000_000_000_019_884_624_838_656,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return path
