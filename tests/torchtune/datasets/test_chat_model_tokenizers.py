"""chat_dataset with a torchtune model tokenizer (no transformers chat template): the tokenizer's own format,
with what its mask leaves unmasked learnt; Llama 2's [INST] template as the example."""

import json

from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune.data import Message
from torchtune.datasets import chat_dataset
from torchtune.models.llama2 import llama2_tokenizer

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
]


def test_llama2_chat_uses_its_template_and_mask(tmp_path):
    tok = llama2_tokenizer(str(make_spm_tokenizer(tmp_path / "spm")))
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    row = chat_dataset(tok, source=str(data), cache_dir=str(tmp_path / "cache"))[0]
    messages = [Message(m["role"], m["content"], masked=m["role"] != "assistant") for m in CONVERSATION]
    tokens, mask = tok.tokenize_messages(messages)
    assert row["tokens"] == tokens
    assert row["labels"] == [-100 if m else t for t, m in zip(tokens, mask)]
    # learnt: the answer and the EOS after it
    assert [t for t in row["labels"] if t != -100] == tok.encode("Paris.", add_bos=False)
    everything = chat_dataset(tok, source=str(data), train_on_input=True, cache_dir=str(tmp_path / "cache"))[0]
    assert everything["labels"] == tokens
