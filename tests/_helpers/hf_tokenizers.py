"""Tiny tokenizer folders in the shape of the Qwen, Mistral, Phi-4 and Phi-4-mini hub folders, trained here
with the ``tokenizers`` library (never downloaded): ``tokenizer.json`` + ``tokenizer_config.json`` (+ the
chat template file transformers writes), saved by transformers' ``PreTrainedTokenizerFast`` so that
``AutoTokenizer`` reads them as it reads the real ones. The chat templates are the hub files'
(``tests._helpers.chat_templates``)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from tests._helpers.chat_templates import TEMPLATES
from tests._helpers.llama3_tokenizer import CHAT_CORPUS
from tests._helpers.tokenizer import DEFAULT_CORPUS

# Qwen2's pre-tokenizer pattern (tokenizer.json of Qwen2.5 / Qwen3).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

FAMILIES: Dict[str, dict] = {
    "qwen2_5": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        added=[],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template=TEMPLATES["qwen2_5"],
    ),
    "qwen3": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        added=["<think>", "</think>"],  # added tokens that are not special, as in Qwen3's tokenizer.json
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template=TEMPLATES["qwen3"],
    ),
    "mistral": dict(
        kind="metaspace",
        specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        added=[],
        eos="</s>",
        pad=None,
        bos="<s>",
        template=TEMPLATES["mistral"],
    ),
    "phi4": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"],
        added=[],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template=TEMPLATES["phi4"],
    ),
    "phi4_mini": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>"],
        added=[],
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        bos="<|endoftext|>",
        template=TEMPLATES["phi4_mini"],
    ),
}


def _corpus() -> List[str]:
    return [*DEFAULT_CORPUS, *CHAT_CORPUS]


def make_hf_tokenizer_folder(folder: Path, family: str, vocab_size: int = 400) -> Path:
    """Train a tiny tokenizer of ``family``'s kind and write it as the family's hub folder does."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    if spec["kind"] == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=spec["specials"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator(_corpus(), trainer)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:  # SentencePiece-style BPE with byte fallback, as Mistral's tokenizer.json
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1)]
        )
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=spec["specials"] + byte_tokens)
        tok.train_from_iterator(_corpus(), trainer)
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
        )
    if spec["added"]:
        tok.add_tokens(spec["added"])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        unk_token="<unk>" if spec["kind"] == "metaspace" else None,
        chat_template=spec["template"],
        model_input_names=["input_ids", "attention_mask"],
    )
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(folder))
    return folder
