"""Llama3Tokenizer against transformers: the same ids from the tiktoken file and from tokenizer.json on
mixed text with special tokens, the same chat template ids; torchtune's message API and id layout; wrong
files refused."""

import base64

import pytest

from torchtune import TuneError
from torchtune.data import Message
from torchtune.models.llama2 import llama2_tokenizer
from torchtune.models.llama3 import LLAMA3_SPECIAL_TOKENS, Llama3Tokenizer, llama3_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world! What's the time? I'll be there, they've said, we'd go.",
    "Numbers 1234567 and 3.14159; code: def f(x):\n    return x ** 2\n\n\n",
    "  leading spaces, trailing spaces   \t\ttabs\r\nand CRLF\r\n",
    "Ünïcödé, 中文字符, emojis 🙂🚀 and ∑ symbols",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>text after<|end_of_text|>",
    "A <|reserved_special_token_7|> in the middle, and <|python_tag|>print(1)<|eom_id|>",
    "",
]

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a helpful assistant.  "},
        {"role": "user", "content": "\n What is two plus three?"},
        {"role": "assistant", "content": "Two plus three is five.\n"},
        {"role": "user", "content": "And reversed, 'apple'?"},
        {"role": "assistant", "content": "elppa"},
    ],
    [{"role": "user", "content": "Ünïcödé 🙂 12345"}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def hf(llama3_tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(str(llama3_tokenizer_dir))


def _tiny(folder, name="original/tokenizer.model", **kwargs):
    """The tiny files' tokenizer; a tiktoken file takes its special tokens from the tokenizer.json beside it
    (the tiny vocabulary puts them right after its ranks, not at Llama 3's 128000)."""
    if name.endswith("tokenizer.model"):
        kwargs.setdefault("special_tokens_path", str(folder / "tokenizer.json"))
    return llama3_tokenizer(str(folder / name), **kwargs)


@pytest.fixture(scope="module", params=["tiktoken", "tokenizer.json"])
def tok(request, llama3_tokenizer_dir):
    name = "original/tokenizer.model" if request.param == "tiktoken" else "tokenizer.json"
    return _tiny(llama3_tokenizer_dir, name, max_seq_len=64)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(tok, hf, text):
    expected = hf(text, add_special_tokens=False)["input_ids"]
    assert tok.encode(text, add_bos=False, add_eos=False) == expected
    # transformers' post-processor adds BOS, as Llama 3's tokenizer.json does; ours adds BOS/EOS on request
    assert tok.encode(text, add_eos=False) == hf(text)["input_ids"] == [tok.bos_id] + expected
    assert tok.encode(text) == [tok.bos_id] + expected + [tok.eos_id]


def test_special_tokens_in_text_are_single_ids(tok):
    ids = tok.encode("a<|eot_id|>b", add_bos=False, add_eos=False)
    assert tok.eot_id in ids and len(ids) == 3
    assert tok.decode(ids) == "ab" and tok.decode(ids, skip_special_tokens=False) == "a<|eot_id|>b"


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["multi-turn", "unicode-empty-reply"])
def test_chat_format_equals_transformers_chat_template(tok, hf, conversation):
    encoded = tok.message_spans(conversation)
    tokens, is_assistant = encoded.tokens, encoded.is_assistant
    assert tokens == hf.apply_chat_template(conversation, tokenize=True, return_dict=False)
    prompt = tok.message_spans(conversation[:-1], add_generation_prompt=True).tokens
    assert prompt == hf.apply_chat_template(
        conversation[:-1], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    # what is trained: exactly the assistant contents and their closing <|eot_id|>
    trained = [t for t, m in zip(tokens, is_assistant) if m]
    expected = []
    for message in conversation:
        if message["role"] == "assistant":
            expected += tok.encode(message["content"].strip(), add_bos=False, add_eos=False) + [tok.eot_id]
    assert trained == expected
    assert len(is_assistant) == len(tokens) and not is_assistant[0]


def test_both_files_give_the_same_ids(llama3_tokenizer_dir):
    a = _tiny(llama3_tokenizer_dir)
    b = _tiny(llama3_tokenizer_dir, "tokenizer.json")
    text = " ".join(TEXTS) * 20
    assert a.encode(text) == b.encode(text)
    ids = lambda t: (t.vocab_size, t.bos_id, t.eos_id, t.pad_id, t.eot_id)  # noqa: E731
    assert ids(a) == ids(b)
    assert a.decode(a.encode(TEXTS[3])) == TEXTS[3]


def test_released_layout_puts_special_tokens_at_128000(tmp_path):
    """A file with Llama 3's 128000 ranks and torchtune's default special tokens: <|begin_of_text|> is 128000,
    <|eot_id|> 128009, <|image|> 128256 (vocab_size 128257); a text model's 128256 rows hold every text id."""
    ranks = [bytes([b]) for b in range(256)]
    ranks += [bytes([a, b]) for a in range(256) for b in range(256)]
    ranks += [bytes([a, b, c]) for a in range(97, 123) for b in range(97, 123) for c in range(256)]
    ranks = ranks[:128_000]
    assert len(ranks) == 128_000
    path = tmp_path / "tokenizer.model"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    tok = Llama3Tokenizer(path)
    assert (tok.base_vocab_size, tok.vocab_size, tok.text_vocab_size, len(LLAMA3_SPECIAL_TOKENS)) == (
        128_000,
        128_257,
        128_256,
        256,
    )
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.start_header_id, tok.end_header_id, tok.eot_id) == (
        128000,
        128001,
        128004,
        128006,
        128007,
        128009,
    )
    assert (tok.eom_id, tok.python_tag, tok.step_id, tok.image_id) == (128008, 128010, 128005, 128256)
    assert tok.encode("<|reserved_special_token_244|>", add_bos=False, add_eos=False) == [128255]
    assert tok.stop_tokens == [128001, 128009, 128008]


def test_tokenize_messages_is_torchtunes_format_and_mask(llama3_tokenizer_dir):
    """Header, stripped content and <|eot_id|> per message, <|end_of_text|> last; each message's tokens take
    its ``masked`` (header included), BOS and EOS are masked; a tool call gets <|python_tag|> and <|eom_id|>."""
    tok = _tiny(llama3_tokenizer_dir)
    messages = [
        Message("user", " What is two plus three? ", masked=True),
        Message("assistant", "five()", ipython=True, eot=False),
        Message("assistant", "Five."),
    ]
    tokens, mask = tok.tokenize_messages(messages)

    def header(role):
        return [tok.start_header_id, *tok.encode(role, add_bos=False, add_eos=False), tok.end_header_id] + (
            tok.encode("\n\n", add_bos=False, add_eos=False)
        )

    def text(t):
        return tok.encode(t, add_bos=False, add_eos=False)

    user = header("user") + text("What is two plus three?") + [tok.eot_id]
    call = header("assistant") + [tok.python_tag] + text("five()") + [tok.eom_id]
    reply = header("assistant") + text("Five.") + [tok.eot_id]
    assert tokens == [tok.bos_id] + user + call + reply + [tok.eos_id]
    assert mask == [True] + [True] * len(user) + [False] * (len(call) + len(reply)) + [True]
    assert tok.decode(tokens) == "What is two plus three?five()Five."
    # generation: the last message stays open, no EOS
    open_tokens, open_mask = tok.tokenize_messages(messages[:1] + [Message("assistant", "")], add_end_tokens=False)
    assert open_tokens == [tok.bos_id] + user + header("assistant") and len(open_mask) == len(open_tokens)
    sample = tok({"messages": messages, "id": 7})
    assert sample == {"id": 7, "tokens": tokens, "mask": mask}
    short = _tiny(llama3_tokenizer_dir, max_seq_len=10)
    cut, cut_mask = short.tokenize_messages(messages)
    assert cut == tokens[:9] + [tok.eos_id] and cut_mask == mask[:9] + [True]


def test_missing_chat_token_is_a_value_error(llama3_tokenizer_dir):
    with pytest.raises(ValueError, match="<\\|begin_of_text\\|> missing from special_tokens"):
        Llama3Tokenizer(llama3_tokenizer_dir / "original" / "tokenizer.model", special_tokens={"<|end_of_text|>": 1})


# --- wrong files -----------------------------------------------------------------------------------


def test_sentencepiece_file_given_to_llama3_tokenizer(tmp_path):
    from tests._helpers.tokenizer import make_spm_tokenizer

    spm = make_spm_tokenizer(tmp_path)
    with pytest.raises(TuneError) as err:
        llama3_tokenizer(str(spm))
    msg = str(err.value)
    assert "SentencePiece" in msg and "torchtune.models.llama2.llama2_tokenizer" in msg and "tokenizer.path" in msg


def test_llama3_file_given_to_sentencepiece_tokenizer(llama3_tokenizer_dir):
    with pytest.raises(TuneError) as err:
        llama2_tokenizer(str(llama3_tokenizer_dir / "original/tokenizer.model"))
    msg = str(err.value)
    assert "Llama 3.x" in msg and "torchtune.models.llama3.llama3_tokenizer" in msg
    # a tokenizer.json alone says nothing of its family: every Hugging Face folder has one
    with pytest.raises(TuneError) as err:
        llama2_tokenizer(str(llama3_tokenizer_dir / "tokenizer.json"))
    msg = " ".join(str(err.value).split())
    assert "a Hugging Face tokenizer.json, not a SentencePiece model" in msg and "belongs to a Llama 3" not in msg


@pytest.mark.parametrize(
    "family, model_type, name, builder",
    [
        ("qwen3", "qwen3", "Qwen3", "torchtune.models.qwen3.qwen3_tokenizer"),
        ("qwen2_5", "qwen2", "Qwen2 / Qwen2.5", "torchtune.models.qwen2_5.qwen2_5_tokenizer"),
        ("mistral", "mistral", "Mistral", "torchtune.models.mistral.mistral_tokenizer"),
    ],
)
def test_another_familys_tokenizer_json_given_to_llama2s_tokenizer_is_named_by_its_folder(
    tmp_path, family, model_type, name, builder
):
    """A Qwen folder's tokenizer.json with a Llama 2 config was called a Llama 3.x tokenizer."""
    import json

    from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder
    from torchtune.models._hf_family import families

    folder = make_hf_tokenizer_folder(tmp_path / family, family)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(TuneError) as err:
        llama2_tokenizer(str(folder / "tokenizer.json"))
    msg = " ".join(str(err.value).split())
    assert f"it is {name}'s (its folder's config.json says so): set tokenizer._component_={builder}" in msg, msg
    assert "Llama 3" not in msg and any(f.name == name for f in families().values())


def test_folder_missing_and_damaged_files(tmp_path, llama3_tokenizer_dir):
    with pytest.raises(TuneError, match="is a folder.*original/tokenizer.model"):
        llama3_tokenizer(str(llama3_tokenizer_dir))
    with pytest.raises(TuneError, match="does not exist"):
        llama3_tokenizer(str(tmp_path / "nope.model"))
    lines = (llama3_tokenizer_dir / "original" / "tokenizer.model").read_text().splitlines()
    damaged = tmp_path / "damaged.model"
    damaged.write_text("\n".join(lines[:300] + ["Zm9v notanumber"] + lines[301:]))
    with pytest.raises(TuneError, match="Line 301 .* is not '<base64 token> <rank>'"):
        llama3_tokenizer(str(damaged))
    no_bytes = tmp_path / "no_bytes.model"
    no_bytes.write_text("\n".join(lines[1:]))  # byte 0 has no token
    with pytest.raises(TuneError, match="no token for 1 of the 256 single bytes"):
        llama3_tokenizer(str(no_bytes))
    text = tmp_path / "notes.txt"
    text.write_text("just some notes\n")
    with pytest.raises(TuneError, match="not a tokenizer file this library reads"):
        llama3_tokenizer(str(text))


def test_tokenizer_json_without_llama3_special_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    other.pre_tokenizer = pre_tokenizers.ByteLevel()
    path = tmp_path / "tokenizer.json"
    other.save(str(path))
    with pytest.raises(TuneError, match=r"has no <\|begin_of_text\|>.*not a Llama 3 tokenizer"):
        llama3_tokenizer(str(path))
