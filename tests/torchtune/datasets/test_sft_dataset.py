"""SFTDataset and the builders on it, on local files: torchtune's lazy behaviour without a row check, the
builders' every-row check, ``filter_fn``, ``chat_format`` (torchtune's tokenizer format by default, plain
text, the chat template), and grammar / samsum / slimorca / ConcatDataset."""

from __future__ import annotations

import json

import pytest

from torchtune import TuneError
from torchtune._errors import ConfigError
from torchtune.data import AlpacaToMessages, Message, OpenAIToMessages
from torchtune.datasets import (
    AlpacaInstructTemplate,
    ConcatDataset,
    PackedDataset,
    SFTDataset,
    alpaca_dataset,
    chat_dataset,
    grammar_dataset,
    samsum_dataset,
    slimorca_dataset,
)
from torchtune.datasets._build import check_dataset_args
from torchtune.models.llama2 import llama2_tokenizer


def _write(path, rows):
    path.write_text(json.dumps(rows))
    return str(path)


@pytest.fixture(scope="module")
def llama2(tokenizer):
    """Llama 2's model tokenizer on the tiny SentencePiece model: its [INST] template by default."""
    return llama2_tokenizer(str(tokenizer.path))


def test_sft_dataset_is_lazy_without_a_row_check(llama2, tmp_path):
    """torchtune's SFTDataset: a conversation out of order fails when the row is read, not when the dataset
    is built; the builders check every row first and name it."""
    rows = [{"messages": [{"role": "user", "content": "Hi."}, {"role": "system", "content": "Be brief."}]}]
    data = _write(tmp_path / "bad.json", rows)
    ds = SFTDataset(
        source="json", data_files=data, message_transform=OpenAIToMessages(), model_transform=llama2, split="train"
    )
    assert len(ds) == 1
    with pytest.raises(ValueError, match="system messages must come first"):
        ds[0]
    rows[0]["messages"].append({"role": "assistant", "content": "Hello."})
    with pytest.raises(TuneError, match=r"bad2.json' has rows that cannot be trained on: row 0: System message"):
        chat_dataset(llama2, source="json", data_files=_write(tmp_path / "bad2.json", rows))


def test_sft_dataset_labels_from_the_mask_and_its_max_seq_len(llama2, alpaca_json, alpaca_rows):
    """labels are the tokens where the mask is False; max_seq_len (not passed to load_dataset) cuts keeping
    the last token."""
    transform = AlpacaToMessages(train_on_input=False)
    ds = SFTDataset(source=str(alpaca_json), message_transform=transform, model_transform=llama2)
    item = ds[0]
    assert set(item) >= {"tokens", "mask", "labels"}
    assert item["labels"] == [-100 if m else t for t, m in zip(item["tokens"], item["mask"])]
    cut = SFTDataset(source=str(alpaca_json), message_transform=transform, model_transform=llama2, max_seq_len=30)[0]
    assert len(cut["tokens"]) == 30 and cut["tokens"] == item["tokens"][:29] + item["tokens"][-1:]


def test_alpaca_with_a_model_tokenizer_uses_its_prompt_template(llama2, tokenizer, alpaca_json, alpaca_rows):
    """torchtune's default: the Alpaca prompt is a user message, so Llama 2's [INST] template wraps it;
    ``chat_format: plain_text`` gives the text as it is (what ``prompt_template: null`` gives)."""
    ds = alpaca_dataset(llama2, source=str(alpaca_json), train_on_input=False)
    prompt = AlpacaInstructTemplate().format(alpaca_rows[0])
    messages = [Message("user", prompt, masked=True), Message("assistant", alpaca_rows[0]["output"])]
    tokens, mask = llama2.tokenize_messages(messages)
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == [-100 if m else t for t, m in zip(tokens, mask)]
    assert llama2.decode(tokens).startswith("[INST] Below is an instruction")
    plain = alpaca_dataset(llama2, source=str(alpaca_json), chat_format="plain_text")
    assert plain[0]["tokens"] == tokenizer.encode(prompt + alpaca_rows[0]["output"])
    no_template = llama2_tokenizer(str(tokenizer.path), prompt_template=None)
    assert alpaca_dataset(no_template, source=str(alpaca_json))[0]["tokens"] == plain[0]["tokens"]


def test_chat_format_choices(llama2, alpaca_json):
    with pytest.raises(TuneError, match="chat_format=chat_template renders a model's chat template"):
        alpaca_dataset(llama2, source=str(alpaca_json), chat_format="chat_template")
    with pytest.raises(TuneError, match="chat_format='jinja' is not one of tokenizer, chat_template, plain_text"):
        alpaca_dataset(llama2, source=str(alpaca_json), chat_format="jinja")
    with pytest.raises(ConfigError, match="dataset.chat_format='jinja'"):
        check_dataset_args("dataset", {"source": "json", "chat_format": "jinja"})


def test_filter_fn_keeps_the_rows_it_accepts(tokenizer, alpaca_json):
    ds = alpaca_dataset(tokenizer, source=str(alpaca_json), filter_fn=lambda row: row["input"] == "")
    assert len(ds) == 2 and tokenizer.decode(ds[1]["tokens"]).endswith("Paris.")


def test_grammar_and_samsum(tokenizer, tmp_path):
    grammar = _write(tmp_path / "g.json", [{"input": "She go home.", "output": "She goes home."}])
    item = grammar_dataset(tokenizer, source="json", data_files=grammar)[0]
    prompt = tokenizer.encode("She go home.", add_eos=False)
    assert item["labels"] == [-100] * len(prompt) + item["tokens"][len(prompt) :]
    dialogue = {"id": "1", "dialogue": "A: hi. B: hello.", "summary": "They greet."}
    item = samsum_dataset(tokenizer, source="json", data_files=_write(tmp_path / "s.json", [dialogue]))[0]
    assert tokenizer.decode(item["tokens"]) == "A: hi. B: hello.They greet."
    with pytest.raises(TuneError, match="no column.*'summary'"):
        samsum_dataset(tokenizer, source="json", data_files=grammar)


def test_slimorca_reads_sharegpt_conversations(llama2, tmp_path):
    rows = [{"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Hello."}]}]
    ds = slimorca_dataset(llama2, source="json", data_files=_write(tmp_path / "o.json", rows), train_on_input=True)
    tokens, _ = llama2.tokenize_messages([Message("user", "Hi."), Message("assistant", "Hello.")])
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == tokens


def test_concat_dataset(tokenizer, alpaca_json):
    one = alpaca_dataset(tokenizer, source=str(alpaca_json))
    both = ConcatDataset([one, alpaca_dataset(tokenizer, source=str(alpaca_json), train_on_input=False)])
    assert len(both) == 6 and not both.packed
    assert both[3]["tokens"] == one[0]["tokens"] and both[3]["labels"][0] == -100
    assert both[6] is None  # past the end, as torchtune's
    packed = alpaca_dataset(tokenizer, source=str(alpaca_json), packed=True, max_seq_len=256)
    assert isinstance(packed, PackedDataset) and ConcatDataset([packed, packed]).packed
    with pytest.raises(TuneError, match="mix of packed and non-packed"):
        ConcatDataset([one, packed])
