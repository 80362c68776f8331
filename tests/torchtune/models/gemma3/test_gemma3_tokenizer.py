"""gemma3_tokenizer against transformers' AutoTokenizer on a tiny Gemma 3-style folder: ids of mixed text
with Gemma's special tokens (``<bos>`` first), and chat formatting equal to ``apply_chat_template`` with
Gemma 3's template (``model`` turns, the system message folded into the first user turn), labels only on
what the model writes and the ``<end_of_turn>`` that closes it."""

from __future__ import annotations

import pytest

from tests._helpers.gemma3_tokenizer import make_gemma3_tokenizer
from torchtune.models.gemma3 import gemma3_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world! The sky is blue.",
    "  leading spaces, Ünïcödé 🙂 and 12345\n\nnew lines",
    "<start_of_turn>user\nWhat is two plus three?<end_of_turn>\n<start_of_turn>model\n",
    "text<eos>after <bos> done",
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
        {"role": "assistant", "content": " enots "},
    ],
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_tok")
    make_gemma3_tokenizer(path)
    return path


def test_ids_equal_autotokenizer(folder):
    ours = gemma3_tokenizer(str(folder / "tokenizer.json"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert ours.encode(text, add_bos=True, add_eos=False) == theirs(text)["input_ids"], text
    assert ours.encode("hi", add_bos=True, add_eos=False)[0] == theirs.bos_token_id == 2
    assert ours.eos_id == theirs.eos_token_id == 1
    assert ours.vocab_size == len(theirs)


def test_chat_equals_apply_chat_template_with_labels_on_model_turns_only(folder):
    ours = gemma3_tokenizer(str(folder / "tokenizer.json"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    end_of_turn = theirs.convert_tokens_to_ids("<end_of_turn>")
    for chat in CHATS:
        encoded = ours.message_spans(chat)
        tokens, is_assistant = encoded.tokens, encoded.is_assistant
        assert tokens == theirs.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        learnt = [t for t, a in zip(tokens, is_assistant) if a]
        want = []
        for message in chat:
            if message["role"] == "assistant":  # the template strips the content
                want += theirs(message["content"].strip(), add_special_tokens=False)["input_ids"] + [end_of_turn]
        assert learnt == want
        generation = ours.message_spans(chat[:-1], add_generation_prompt=True).tokens
        kwargs = dict(add_generation_prompt=True, tokenize=True, return_dict=True)
        assert generation == theirs.apply_chat_template(chat[:-1], **kwargs)["input_ids"]
