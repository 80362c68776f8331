"""Chat labels against transformers, for every shipped family's real chat template on a tiny tokenizer
folder: the ids equal ``apply_chat_template``'s, and the learnt tokens equal the
``return_assistant_tokens_mask`` of a copy of the template with ``{% generation %}`` around what the
assistant writes (``tests._helpers.chat_templates``). Replies that a text search got wrong are among the
cases: one letter, a role word, code with newlines and tabs, trailing whitespace, Unicode, Qwen3's
reasoning in earlier turns. torchtune's message API on the same tokenizer (``Message(role, content, masked)``,
``tokenize_messages`` -> tokens and mask) gives the same labels."""

from __future__ import annotations

import shutil

import pytest

from tests._helpers.chat_templates import TEMPLATES, marked
from torchtune.data import Message
from torchtune.models.llama3 import llama3_tokenizer
from torchtune.modules.tokenizers import ChatEncoding, HFModelTokenizer

transformers = pytest.importorskip("transformers")

FAMILIES = ["qwen2_5", "qwen3", "gemma3", "mistral", "phi4", "phi4_mini", "llama3"]


def _user(text):
    return {"role": "user", "content": text}


def _assistant(text):
    return {"role": "assistant", "content": text}


CHATS = {
    "one_letter": [_user("Pick a, b or c."), _assistant("a"), _user("And now?"), _assistant("b")],
    "role_words": [
        _user("Say a role."),
        _assistant("model"),
        _user("Another."),
        _assistant("assistant"),
        _user("More."),
        _assistant("user"),
        _user("And?"),
        _assistant("im"),
    ],
    "code": [_user("Write code."), _assistant("def f(x):\n    if x:\n\treturn x\n\n    return 0\n")],
    "trailing_whitespace": [_user("Finish."), _assistant("Done.  \n\n")],
    "leading_whitespace": [_user("Indent."), _assistant("  \n  indented start")],
    "system_multi_turn": [
        {"role": "system", "content": "You are terse."},
        _user("What is 2 + 3?"),
        _assistant("5."),
        _user("Reverse apple."),
        _assistant("elppa"),
    ],
    "unicode": [_user("Say hello in Chinese."), _assistant("你好，世界 🙂🚀")],
    "empty_reply": [_user("Say nothing."), _assistant(""), _user("Now something."), _assistant("ok")],
    "reasoning": [
        _user("Add 2 and 3."),
        _assistant("<think>\nTwo plus three.\n</think>\n\n5"),
        _user("Add 1."),
        _assistant("<think>\nSix.\n</think>\n\n6"),
    ],
    "special_token_text": [_user("Write the end marker."), _assistant("it is <|im_end|> or </s> or <end_of_turn>")],
}


@pytest.fixture(scope="module")
def hf(chat_tokenizer_dir):
    loaded = {}

    def get(family):
        if family not in loaded:
            loaded[family] = transformers.AutoTokenizer.from_pretrained(str(chat_tokenizer_dir(family)))
        return loaded[family]

    return get


def _oracle(theirs, family, chat, add_generation_prompt):
    out = theirs.apply_chat_template(
        chat,
        chat_template=marked(family),
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


@pytest.mark.parametrize("family", FAMILIES)
def test_marked_copy_renders_as_the_real_template(hf, family):
    theirs = hf(family)
    for chat in CHATS.values():
        for gen in (False, True):
            chat_ = chat[:-1] if gen else chat
            kwargs = dict(tokenize=False, add_generation_prompt=gen)
            real = theirs.apply_chat_template(chat_, chat_template=TEMPLATES[family], **kwargs)
            assert theirs.apply_chat_template(chat_, chat_template=marked(family), **kwargs) == real


def _spans(tokenizer, chat, add_generation_prompt=False):
    encoded = tokenizer.message_spans(chat, add_generation_prompt=add_generation_prompt)
    return encoded.tokens, encoded.is_assistant


def _messages(chat, masked=lambda m: m["role"] != "assistant"):
    """torchtune's messages of ``chat``, masked as its dataset transforms mask them by default."""
    return [Message(m["role"], m["content"], masked=masked(m)) for m in chat]


@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_labels_equal_the_assistant_mask_of_transformers(chat_tokenizer_dir, hf, family, name):
    """The template path (``message_spans``) and torchtune's message API (``tokenize_messages`` of messages
    masked but for the assistant's) both give transformers' ids and assistant mask."""
    ours = HFModelTokenizer(chat_tokenizer_dir(family) / "tokenizer.json")
    chat = CHATS[name]
    for gen in (False, True):
        chat_ = chat[:-1] if gen else chat
        expected = _oracle(hf(family), family, chat_, gen)
        assert _spans(ours, chat_, gen) == expected
        tokens, mask = ours.tokenize_messages(_messages(chat_), add_generation_prompt=gen)
        assert (tokens, [not m for m in mask]) == expected


@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("file", ["original/tokenizer.model", "tokenizer.json"])
def test_llama3_tokenizer_equals_transformers(chat_tokenizer_dir, hf, file, name):
    """Our Llama 3 tokenizer formats in code: the same ids and labels as Llama 3's template."""
    folder = chat_tokenizer_dir("llama3")
    # the tiny vocabulary's special tokens follow its ranks: special_tokens_path names them, as torchtune does
    ours = llama3_tokenizer(str(folder / file), special_tokens_path=str(folder / "tokenizer.json"))
    chat = CHATS[name]
    for gen in (False, True):
        chat_ = chat[:-1] if gen else chat
        assert _spans(ours, chat_, gen) == _oracle(hf("llama3"), "llama3", chat_, gen)


def _learnt_text(theirs, tokens, learnt):
    return theirs.decode([t for t, m in zip(tokens, learnt) if m])


def test_what_a_text_search_got_wrong(chat_tokenizer_dir, hf):
    """Readable cases: whitespace in a reply is learnt, a reply equal to header text is learnt where it is,
    the end-of-turn token after trailing whitespace is learnt, Qwen3's earlier turns keep their labels."""
    qwen = HFModelTokenizer(chat_tokenizer_dir("qwen2_5") / "tokenizer.json")
    tokens, learnt = _spans(qwen, CHATS["code"])
    assert _learnt_text(hf("qwen2_5"), tokens, learnt) == CHATS["code"][1]["content"] + "<|im_end|>"
    tokens, learnt = _spans(qwen, CHATS["trailing_whitespace"])
    assert _learnt_text(hf("qwen2_5"), tokens, learnt) == "Done.  \n\n<|im_end|>"
    tokens, learnt = _spans(qwen, CHATS["one_letter"])
    assert _learnt_text(hf("qwen2_5"), tokens, learnt) == "a<|im_end|>b<|im_end|>"
    gemma = HFModelTokenizer(chat_tokenizer_dir("gemma3") / "tokenizer.json")
    chat = CHATS["role_words"][:2]
    tokens, learnt = _spans(gemma, chat)
    assert _learnt_text(hf("gemma3"), tokens, learnt) == "model<end_of_turn>"
    assert hf("gemma3").decode(tokens).count("model") == 2  # the header's and the reply's
    qwen3 = HFModelTokenizer(chat_tokenizer_dir("qwen3") / "tokenizer.json")
    tokens, learnt = _spans(qwen3, CHATS["reasoning"])
    # the earlier turn loses its reasoning (the template drops it) but not its labels; the last turn's
    # <think> block is written by the model, so it is learnt
    assert _learnt_text(hf("qwen3"), tokens, learnt) == "5<|im_end|><think>\nSix.\n</think>\n\n6<|im_end|>"


def test_message_spans_turns_and_replies(chat_tokenizer_dir):
    """Per message: turns split the tokens in order, replies lie in their turns, ``learnt`` trains the
    messages asked for; the template path and Llama 3's code path give the same spans."""
    chat = CHATS["system_multi_turn"]
    folder = chat_tokenizer_dir("llama3")
    from_template = HFModelTokenizer(folder / "tokenizer.json").message_spans(chat)
    tiktoken = llama3_tokenizer(
        str(folder / "original" / "tokenizer.model"), special_tokens_path=str(folder / "tokenizer.json")
    )
    from_code = tiktoken.message_spans(chat)
    assert isinstance(from_template, ChatEncoding) and from_template == from_code
    enc = from_template
    assert enc.turns[0][0] == 0 and enc.turns[-1][1] == len(enc.tokens)
    assert all(enc.turns[i][1] == enc.turns[i + 1][0] for i in range(len(chat) - 1))
    assert [r is not None for r in enc.replies] == [m["role"] == "assistant" for m in chat]
    for turn, reply in zip(enc.turns, enc.replies):
        assert reply is None or turn[0] < reply[0] < reply[1] == turn[1]
    assert enc.learnt([m["role"] == "assistant" for m in chat]) == enc.is_assistant
    assert enc.learnt([True] * len(chat)) == [True] * len(enc.tokens)  # train_on_input: every token
    assert enc.learnt([False] * len(chat)) == [False] * len(enc.tokens)
    assert enc.mask([False] * len(chat)) == [False] * len(enc.tokens)  # torchtune's mask: True = not learnt
    # a trained user message: its whole turn, and nothing of the reply's turn (masked) after it
    user = enc.learnt([i == 1 for i in range(len(chat))])
    assert [t for t in range(len(enc.tokens)) if user[t]] == list(range(*enc.turns[1]))
    index = enc.message_index
    assert index[0] == 0 and index[-1] == len(chat) - 1 and sorted(set(index)) == list(range(len(chat)))

    gemma = HFModelTokenizer(chat_tokenizer_dir("gemma3") / "tokenizer.json").message_spans(chat)
    # Gemma folds the system message into the first user turn: the system's turn ends where the user's
    # content starts; a trailing "\n" after the last <end_of_turn> belongs to no message
    assert gemma.turns[0][1] == gemma.turns[1][0] and gemma.message_index[-1] == -1
    mistral = HFModelTokenizer(chat_tokenizer_dir("mistral") / "tokenizer.json").message_spans(chat)
    assert mistral.turns[0] == (0, 0)  # Mistral v0.3 renders the system message only before a last user turn


def test_generation_blocks_of_a_template_are_its_replies(chat_tokenizer_dir, hf, tmp_path):
    """A folder whose template marks what the assistant writes: those blocks are the labels."""
    folder = tmp_path / "marked"
    shutil.copytree(chat_tokenizer_dir("qwen3"), folder)
    (folder / "chat_template.jinja").write_text(marked("qwen3"))
    ours = HFModelTokenizer(folder / "tokenizer.json")
    plain = HFModelTokenizer(chat_tokenizer_dir("qwen3") / "tokenizer.json")
    for chat in CHATS.values():
        assert _spans(ours, chat) == _oracle(hf("qwen3"), "qwen3", chat, False) == _spans(plain, chat)
    # a template that marks less than the whole reply: the marks decide
    end_inside = "{{- '<|im_end|>' }}\n        {%- endgeneration %}"
    (folder / "chat_template.jinja").write_text(
        marked("qwen3").replace(end_inside, "{%- endgeneration %}{{- '<|im_end|>' }}")
    )
    tokens, learnt = _spans(HFModelTokenizer(folder / "tokenizer.json"), CHATS["one_letter"])
    assert hf("qwen3").decode([t for t, m in zip(tokens, learnt) if m]) == "a<think>\n\n</think>\n\nb"


@pytest.mark.parametrize("family", ["qwen2_5", "gemma3", "mistral", "phi4_mini"])
def test_torchtune_message_masks(chat_tokenizer_dir, family):
    """Per-message masks through torchtune's API: an unmasked user or system message learns its whole turn,
    an unmasked assistant its reply; no mask at all learns every token (train_on_input=True), every mask
    none; a mapping is an unmasked message."""
    ours = HFModelTokenizer(chat_tokenizer_dir(family) / "tokenizer.json")
    chat = CHATS["system_multi_turn"]
    enc = ours.message_spans(chat)
    for unmasked in ([], [0], [1], [2], [1, 2], [3, 4], [0, 1, 2, 3, 4]):
        messages = [Message(m["role"], m["content"], masked=i not in unmasked) for i, m in enumerate(chat)]
        tokens, mask = ours.tokenize_messages(messages)
        assert tokens == enc.tokens
        learnt = {t for t in range(len(tokens)) if not mask[t]}
        expected = set()
        for i in unmasked:
            span = enc.replies[i] or enc.turns[i]
            expected |= set(range(*span))
            if enc.replies[i] is not None and i - 1 in unmasked:  # the header between the two
                expected |= set(range(enc.turns[i][0], enc.replies[i][0]))
        if len(unmasked) == len(chat):
            expected = set(range(len(tokens)))
        assert learnt == expected, unmasked
    assert ours.tokenize_messages(chat) == (enc.tokens, [False] * len(enc.tokens))


def test_model_transform_protocol(chat_tokenizer_dir, hf):
    """``tokenizer({"messages": [...]})`` adds tokens and mask (SFTDataset's model transform); ``inference``
    ends with the generation prompt, an empty last assistant message left out; ``max_seq_len`` cuts with
    ``eos_token`` last."""
    folder = chat_tokenizer_dir("qwen2_5")
    ours = HFModelTokenizer(folder / "tokenizer.json")
    chat = CHATS["system_multi_turn"]
    sample = ours({"messages": _messages(chat), "id": 7})
    assert set(sample) == {"tokens", "mask", "id"}
    assert (sample["tokens"], sample["mask"]) == ours.tokenize_messages(_messages(chat))
    prompt = ours({"messages": _messages(chat[:2]) + [Message("assistant", "")]}, inference=True)
    theirs = hf("qwen2_5").apply_chat_template(chat[:2], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert prompt["tokens"] == theirs
    short = HFModelTokenizer(folder / "tokenizer.json", max_seq_len=20)
    tokens, mask = short.tokenize_messages(_messages(chat))
    full_tokens, full_mask = ours.tokenize_messages(_messages(chat))
    assert len(tokens) == 20 and tokens == full_tokens[:19] + [short.eos_id] and mask == full_mask[:20]
