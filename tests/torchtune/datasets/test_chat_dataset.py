"""chat_dataset with the Llama 3 tokenizer: by default as torchtune formats (the tokenizer's
``tokenize_messages``), with ``chat_format: chat_template`` exactly as transformers' Llama 3 chat template
(loss on what the assistant writes), truncation, packing, malformed rows named; alpaca with the Llama 3
tokenizer."""

import json

import pytest

from torchtune import TuneError
from torchtune.data import Message
from torchtune.datasets import PackedDataset, alpaca_dataset, chat_dataset
from torchtune.models.llama3 import llama3_tokenizer

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is two plus three?"},
        {"role": "assistant", "content": "Two plus three is five."},
        {"role": "user", "content": "Reverse the word apple."},
        {"role": "assistant", "content": " elppa\n"},
    ],
    [{"role": "user", "content": "Name a colour of the sky."}, {"role": "assistant", "content": "Blue."}],
]
SHAREGPT_SPEAKER = {"system": "system", "user": "human", "assistant": "gpt"}


@pytest.fixture(scope="module")
def tok(llama3_tokenizer_dir):
    return llama3_tokenizer(
        str(llama3_tokenizer_dir / "original" / "tokenizer.model"),
        special_tokens_path=str(llama3_tokenizer_dir / "tokenizer.json"),
    )


@pytest.fixture(scope="module")
def hf(llama3_tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(str(llama3_tokenizer_dir))


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def openai_file(tmp_path):
    return _jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in CONVERSATIONS])


@pytest.fixture
def sharegpt_file(tmp_path):
    rows = [
        {"conversations": [{"from": SHAREGPT_SPEAKER[m["role"]], "value": m["content"]} for m in c]}
        for c in CONVERSATIONS
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(rows))
    return path


def _assistant_ids(tok, conversation):
    ids = []
    for m in conversation:
        if m["role"] == "assistant":
            ids += tok.encode(m["content"].strip(), add_bos=False, add_eos=False) + [tok.eot_id]
    return ids


@pytest.mark.parametrize("style", ["openai", "sharegpt"])
def test_tokens_equal_transformers_chat_template_and_labels_are_assistant_turns(
    tok, hf, openai_file, sharegpt_file, tmp_path, style
):
    path = openai_file if style == "openai" else sharegpt_file
    ds = chat_dataset(tok, source=str(path), chat_format="chat_template", cache_dir=str(tmp_path / "cache"))
    assert len(ds) == 2
    for conversation, item in zip(CONVERSATIONS, (ds[0], ds[1])):
        assert item["tokens"] == hf.apply_chat_template(conversation, tokenize=True, return_dict=False)
        assert len(item["labels"]) == len(item["tokens"])
        assert [t for t in item["labels"] if t != -100] == _assistant_ids(tok, conversation)
        # each learnt token is the token at that position
        assert all(lab in (-100, t) for lab, t in zip(item["labels"], item["tokens"]))
    assert item["labels"][-1] == tok.eot_id and item["tokens"][0] == tok.bos_id


def test_by_default_as_torchtune_formats(tok, openai_file, sharegpt_file, tmp_path):
    """torchtune's chat_dataset: the tokenizer's tokenize_messages of the messages, masked but for the
    assistant's (Llama 3: each assistant turn learnt with its header, <|end_of_text|> appended, not learnt)."""
    for path in (openai_file, sharegpt_file):
        ds = chat_dataset(tok, source=str(path), cache_dir=str(tmp_path / "cache"))
        for conversation, item in zip(CONVERSATIONS, (ds[0], ds[1])):
            messages = [Message(m["role"], m["content"], masked=m["role"] != "assistant") for m in conversation]
            tokens, mask = tok.tokenize_messages(messages)
            assert item["tokens"] == tokens and tokens[-1] == tok.eos_id
            assert item["labels"] == [-100 if m else t for t, m in zip(tokens, mask)]
            assert tok.decode([t for t in item["labels"] if t != -100], skip_special_tokens=False).startswith(
                "<|start_header_id|>assistant<|end_header_id|>"
            )


def test_train_on_input_learns_everything(tok, openai_file, tmp_path):
    ds = chat_dataset(
        tok, source=str(openai_file), train_on_input=True, chat_format="chat_template", cache_dir=str(tmp_path / "c")
    )
    assert ds[0]["labels"] == ds[0]["tokens"]
    # torchtune's format learns every token but <|begin_of_text|> and the <|end_of_text|> it appends
    ds = chat_dataset(tok, source=str(openai_file), train_on_input=True, cache_dir=str(tmp_path / "c"))
    assert ds[0]["labels"] == [-100] + ds[0]["tokens"][1:-1] + [-100]


def test_truncation_keeps_the_closing_eot(tok, openai_file, tmp_path):
    kwargs = dict(source=str(openai_file), chat_format="chat_template")
    full = chat_dataset(tok, **kwargs, cache_dir=str(tmp_path / "c1"))[0]
    # the first reply is tokens 47-55 of 83: at 50 tokens three of its tokens survive, and the final
    # <|eot_id|> keeps its label
    cut = chat_dataset(tok, **kwargs, max_seq_len=50, cache_dir=str(tmp_path / "c2"))
    assert len(cut) == 2 and len(cut[0]["tokens"]) == 50
    assert cut[0]["tokens"] == full["tokens"][:49] + [tok.eot_id]
    assert cut[0]["labels"] == full["labels"][:49] + [tok.eot_id]


def test_rows_cut_before_their_reply_are_left_out_and_counted(tok, openai_file, tmp_path, caplog):
    """At 32 tokens the first conversation (reply at 47) keeps nothing of its reply: it would only teach the
    model to end its turn in the middle of the question, so it is left out and counted. The second (reply
    at 30) keeps its first reply token, and its final token's label."""
    kwargs = dict(source=str(openai_file), chat_format="chat_template")
    with caplog.at_level("WARNING", logger="torchtune"):
        ds = chat_dataset(tok, **kwargs, max_seq_len=32, cache_dir=str(tmp_path / "c"))
    assert len(ds) == 1 and ds.dropped == {"cut away by max_seq_len": 1}
    full = chat_dataset(tok, **kwargs, cache_dir=str(tmp_path / "c"))[1]
    assert ds[0]["tokens"] == full["tokens"][:31] + full["tokens"][-1:]
    assert [i for i, t in enumerate(ds[0]["labels"]) if t != -100] == [30, 31]
    assert (
        "1 of 2 rows have nothing to learn and are left out (1 cut away by max_seq_len): rows 0. A larger"
        in caplog.text
    )
    with pytest.raises(TuneError, match="has nothing to learn in any row .*Raise dataset.max_seq_len"):
        chat_dataset(tok, **kwargs, max_seq_len=31, cache_dir=str(tmp_path / "c"))
    with caplog.at_level("WARNING", logger="torchtune"):
        packed = chat_dataset(tok, **kwargs, max_seq_len=32, packed=True, cache_dir=str(tmp_path / "p"))
    assert packed.num_examples == 1 and packed.num_dropped == 1 and packed.dropped == {"with nothing to learn": 1}
    assert "Packed dataset: 1 examples have nothing to learn and are left out" in caplog.text
    # train_on_input=True learns the prompt too: nothing is left out
    learn_all = chat_dataset(tok, **kwargs, max_seq_len=20, train_on_input=True, cache_dir=str(tmp_path))
    assert len(learn_all) == 2 and learn_all[0]["labels"] == learn_all[0]["tokens"]


def test_packed(tok, openai_file, tmp_path):
    ds = chat_dataset(tok, source=str(openai_file), packed=True, max_seq_len=128, cache_dir=str(tmp_path / "c"))
    assert isinstance(ds, PackedDataset) and len(ds) == 1
    pack = ds[0]
    assert pack["tokens"].shape == (128,) and int(pack["tokens"][-1]) == tok.pad_id
    lengths = [
        len(chat_dataset(tok, source=str(openai_file), cache_dir=str(tmp_path / "d"))[i]["tokens"]) for i in (0, 1)
    ]
    assert pack["seq_lens"].tolist() == [*lengths, 128 - sum(lengths)]


def test_needs_a_tokenizer_with_a_chat_format(tokenizer, openai_file, tmp_path):
    with pytest.raises(TuneError, match="needs a tokenizer with a chat format.*llama3_tokenizer.*alpaca_dataset"):
        chat_dataset(tokenizer, source=str(openai_file), cache_dir=str(tmp_path / "c"))


def test_missing_column_and_style(tok, tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", [{"dialog": CONVERSATIONS[1]}])
    with pytest.raises(TuneError, match="no 'messages'.*'conversations'.*'dialog'.*dataset.conversation_column"):
        chat_dataset(tok, source=str(path), cache_dir=str(tmp_path / "c"))
    ds = chat_dataset(tok, source=str(path), conversation_column="dialog", cache_dir=str(tmp_path / "c"))
    assert len(ds) == 1
    with pytest.raises(TuneError, match="no column 'chat'"):
        chat_dataset(tok, source=str(path), conversation_column="chat", cache_dir=str(tmp_path / "c"))
    with pytest.raises(TuneError, match="conversation_style='chatml' is not one of auto, openai, sharegpt"):
        chat_dataset(tok, source=str(path), conversation_style="chatml", cache_dir=str(tmp_path / "c"))


def test_malformed_rows_are_listed_before_training(tok, tmp_path):
    rows = [
        {"messages": CONVERSATIONS[1]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "x"}]},
        {"messages": []},
    ]
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TuneError) as err:
        chat_dataset(tok, source=str(path), cache_dir=str(tmp_path / "c"))
    msg = str(err.value)
    assert "row 1: message 1 has role 'bot'" in msg
    assert "row 2: the conversation has no assistant message" in msg
    assert "row 3: message 0 has content None, not text" in msg
    assert "row 4: the conversation is [], not a non-empty list" in msg
    assert "row 0" not in msg and str(path) in msg


def test_unknown_sharegpt_speaker(tok, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "a"}, {"from": "bard", "value": "b"}]}]))
    with pytest.raises(TuneError, match="row 0: message 1 is from 'bard'"):
        chat_dataset(tok, source=str(path), cache_dir=str(tmp_path / "c"))


def test_alpaca_with_the_llama3_tokenizer(tok, hf, alpaca_json, alpaca_rows, tmp_path):
    """As torchtune: the Alpaca prompt is a user message in Llama 3's chat format; as plain text with
    ``chat_format: plain_text``: the prompt and output as they are, <|begin_of_text|> and <|end_of_text|>."""
    from torchtune.datasets import AlpacaInstructTemplate

    kwargs = dict(source="json", data_files=str(alpaca_json), train_on_input=False, cache_dir=str(tmp_path))
    ds = alpaca_dataset(tok, **kwargs)
    prompt = AlpacaInstructTemplate().format(alpaca_rows[0])
    messages = [Message("user", prompt, masked=True), Message("assistant", alpaca_rows[0]["output"])]
    tokens, mask = tok.tokenize_messages(messages)
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == [-100 if m else t for t, m in zip(tokens, mask)]
    ds = alpaca_dataset(tok, **kwargs, chat_format="plain_text")
    for row, i in zip(alpaca_rows, range(len(ds))):
        prompt = AlpacaInstructTemplate().format(row)
        item = ds[i]
        assert item["tokens"] == hf(prompt + row["output"])["input_ids"] + [tok.eos_id]
        n_prompt = len(hf(prompt)["input_ids"])
        assert item["labels"] == [-100] * n_prompt + item["tokens"][n_prompt:]
        assert tok.decode(item["labels"][n_prompt:]) == row["output"]


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_a_model_folders_tokenizer_learns_what_its_template_says_the_assistant_writes(
    chat_tokenizer_dir, openai_file, tmp_path, family
):
    """HFModelTokenizer through torchtune's message API (the default) gives the labels of the chat template
    path: each reply and its end-of-turn token; train_on_input=True learns every token."""
    from torchtune.modules.tokenizers import HFModelTokenizer

    tok = HFModelTokenizer(chat_tokenizer_dir(family) / "tokenizer.json")
    kwargs = dict(source=str(openai_file), cache_dir=str(tmp_path / "c"))
    default, template = chat_dataset(tok, **kwargs), chat_dataset(tok, **kwargs, chat_format="chat_template")
    for i, conversation in enumerate(CONVERSATIONS):
        encoded = tok.message_spans(conversation)
        expected = [t if learnt else -100 for t, learnt in zip(encoded.tokens, encoded.is_assistant)]
        assert default[i]["tokens"] == template[i]["tokens"] == encoded.tokens
        assert default[i]["labels"] == template[i]["labels"] == expected
    everything = chat_dataset(tok, **kwargs, train_on_input=True)[0]
    assert everything["labels"] == everything["tokens"]
