"""Each family's tokenizer against transformers' ``AutoTokenizer`` on the same tiny folder: ids of mixed
text with special tokens, and chat formatting equal to ``apply_chat_template`` with labels only on what
the assistant writes."""

from __future__ import annotations

import json

import pytest

from tests._helpers.chat_templates import marked
from tests._helpers.hf_tokenizers import FAMILIES, make_hf_tokenizer_folder
from torchtune._errors import TuneError
from torchtune.data import Message
from torchtune.modules.tokenizers import HFModelTokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world! The sky is blue.",
    "  leading spaces, Ünïcödé 🙂 and 12345\n\nnew lines",
    "<|im_start|>user\nWhat is two plus three?<|im_end|>",
    "[INST] Reverse the word apple [/INST] elppa</s>",
    "text<|endoftext|>after <think>hm</think> done",
]
CHATS = [
    [
        {"role": "user", "content": "What is two plus three?"},
        {"role": "assistant", "content": "Two plus three is five."},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a colour of the sky."},
        {"role": "assistant", "content": "The sky is blue."},
        {"role": "user", "content": "Reverse the word stone."},
        {"role": "assistant", "content": "enots"},
    ],
]


@pytest.fixture(params=sorted(FAMILIES))
def folder(request, chat_tokenizer_dir):
    return request.param, chat_tokenizer_dir(request.param)


def test_ids_equal_autotokenizer(folder):
    family, path = folder
    ours = HFModelTokenizer(path / "tokenizer.json")
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    for text in TEXTS:
        assert ours.encode(text, add_bos=True, add_eos=False) == theirs(text)["input_ids"], text
        assert ours.decode(ours.encode(text, add_bos=False, add_eos=False), skip_special_tokens=False) == theirs.decode(
            theirs(text, add_special_tokens=False)["input_ids"]
        )
    assert ours.eos_id == theirs.eos_token_id
    assert ours.vocab_size == len(theirs)
    # Mistral's post-processor puts <s> first; Phi-4-mini's tokenizer_config.json names <|endoftext|> as BOS
    assert (ours.bos_id is not None) == (family in ("mistral", "phi4_mini"))


def test_alpaca_example_equals_autotokenizer_on_the_joined_text(folder, tmp_path):
    """With ``chat_format: plain_text`` an instruction dataset encodes prompt and response apart; joined they
    are the ids of the joined text, without the word-start marker a SentencePiece-style tokenizer (Mistral)
    puts before a text's start. By default (torchtune's) the prompt is a user message in the folder's chat
    template."""
    from torchtune.datasets import AlpacaInstructTemplate, alpaca_dataset

    family, path = folder
    ours = HFModelTokenizer(path / "tokenizer.json")
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    rows = [
        {"instruction": "Reverse the word stone.", "input": "", "output": "The word reversed is enots."},
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "\nFive"},
    ]
    data = tmp_path / f"{family}_alpaca.json"
    data.write_text(json.dumps(rows))
    kwargs = dict(source="json", data_files=str(data), train_on_input=False, cache_dir=str(tmp_path / "cache"))
    dataset = alpaca_dataset(ours, **kwargs, chat_format="plain_text")
    chats = alpaca_dataset(ours, **kwargs)
    for i, row in enumerate(rows):
        prompt = AlpacaInstructTemplate().format(row)
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]
        assert chats[i]["tokens"] == theirs.apply_chat_template(chat, tokenize=True, return_dict=False)
        expected = theirs(prompt + row["output"])["input_ids"] + [theirs.eos_token_id]
        assert dataset[i]["tokens"] == expected, (family, row["output"])
        prompt_len = len(theirs(prompt)["input_ids"])
        assert dataset[i]["labels"][prompt_len:] == expected[prompt_len:]
    if family == "mistral":  # encoded alone, a text starts with the marker
        assert ours.encode("Five", add_bos=False, add_eos=False) != ours.encode(
            "Five", add_bos=False, add_eos=False, trim_leading_whitespace=True
        )


def test_chat_equals_apply_chat_template_with_labels_on_assistant_only(folder):
    """The ids of apply_chat_template, and the labels of its assistant mask on the template marked with
    {% generation %} (the per-case comparison for every family is tests/torchtune/modules/tokenizers/
    test_chat_labels.py)."""
    family, path = folder
    ours = HFModelTokenizer(path / "tokenizer.json")
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    for chat in CHATS:
        encoded = ours.message_spans(chat)
        tokens, is_assistant = encoded.tokens, encoded.is_assistant
        # torchtune's message API, the non-assistant messages masked: the same labels
        messages = [Message(m["role"], m["content"], masked=m["role"] != "assistant") for m in chat]
        assert ours.tokenize_messages(messages) == (tokens, [not learnt for learnt in is_assistant])
        expected = theirs.apply_chat_template(
            chat, chat_template=marked(family), return_dict=True, return_assistant_tokens_mask=True
        )
        assert tokens == theirs.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        assert tokens == expected["input_ids"] and is_assistant == [bool(m) for m in expected["assistant_masks"]]
        assert not is_assistant[0]
        generation = ours.message_spans(chat[:-1], add_generation_prompt=True).tokens
        kwargs = dict(add_generation_prompt=True, tokenize=True, return_dict=True)
        assert generation == theirs.apply_chat_template(chat[:-1], **kwargs)["input_ids"]


def test_template_error_names_line(tmp_path):
    path = make_hf_tokenizer_folder(tmp_path / "m", "mistral")
    tok = HFModelTokenizer(path / "tokenizer.json")
    with pytest.raises(TuneError, match=r"conversation roles must alternate.*line \d+ of the template"):
        tok.tokenize_messages([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])


def test_missing_or_unreadable_tokenizer_json(tmp_path):
    with pytest.raises(TuneError, match="tokenizer.path.*does not exist"):
        HFModelTokenizer(tmp_path / "nothing" / "tokenizer.json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(TuneError, match="could not be read as a Hugging Face tokenizer.json"):
        HFModelTokenizer(bad / "tokenizer.json")
