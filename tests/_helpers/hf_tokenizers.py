# ruff: noqa: E501  (chat templates kept one template line per source line, as the hub files have them)
"""Tiny tokenizer folders in the shape of the Qwen, Mistral and Phi-4 hub folders, trained here with the
``tokenizers`` library (never downloaded): ``tokenizer.json`` + ``tokenizer_config.json`` (+ the chat
template file transformers writes), saved by transformers' ``PreTrainedTokenizerFast`` so that
``AutoTokenizer`` reads them as it reads the real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from tests._helpers.llama3_tokenizer import CHAT_CORPUS
from tests._helpers.tokenizer import DEFAULT_CORPUS

# Qwen2's pre-tokenizer pattern (tokenizer.json of Qwen2.5 / Qwen3).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5-Instruct's chat template without its tool-calling branches.
QWEN2_5_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Qwen3's chat template without tools: the last assistant turn gets an empty <think> block, earlier ones
# lose theirs (so a rendered history is not a prefix of the next turn's).
QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    '    {%- if ns.multi_step_tool and message.role == "user" %}\n'
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = message.content %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}"
)

# Mistral-7B-Instruct-v0.3's template (system message folded into the last user turn left out).
MISTRAL_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {{- '[INST] ' + message['content'] + '[/INST]' }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- ' ' + message['content'] + eos_token }}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
)

# Phi-4's template.
PHI4_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}"
    "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)

FAMILIES: Dict[str, dict] = {
    "qwen2_5": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        added=[],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template=QWEN2_5_TEMPLATE,
    ),
    "qwen3": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        added=["<think>", "</think>"],  # added tokens that are not special, as in Qwen3's tokenizer.json
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template=QWEN3_TEMPLATE,
    ),
    "mistral": dict(
        kind="metaspace",
        specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        added=[],
        eos="</s>",
        pad=None,
        bos="<s>",
        template=MISTRAL_TEMPLATE,
    ),
    "phi4": dict(
        kind="bytelevel",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"],
        added=[],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template=PHI4_TEMPLATE,
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
