"""Qwen2Tokenizer / Qwen2_5Tokenizer from vocab.json + merges.txt: the same ids as transformers' Qwen2
tokenizer on the same files, ChatML as torchtune formats it, Qwen2.5's tool calls; a tokenizer.json gives
the folder's tokenizer."""

import json

import pytest

from tests._helpers.bpe_files import make_bpe_files
from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder
from torchtune import TuneError
from torchtune.data import ChatMLTemplate, Message
from torchtune.models.qwen2 import Qwen2Tokenizer, qwen2_tokenizer
from torchtune.models.qwen2._tokenizer import PRETOKENIZE_REGEX
from torchtune.models.qwen2_5 import Qwen2_5Tokenizer, qwen2_5_tokenizer
from torchtune.modules.tokenizers import HFModelTokenizer

transformers = pytest.importorskip("transformers")
SPECIAL = {"<|endoftext|>": 5000, "<|im_start|>": 5001, "<|im_end|>": 5002, "<tool_call>": 5003, "</tool_call>": 5004}
TEXTS = [
    "Hello world! What's 2+3? It's five.",
    "Numbers 1234567 and code:\n    return x ** 2\n\n\n",
    "  tabs\tand CRLF\r\n Ünïcödé 🙂 and e\u0301 (NFC)",
    "<|im_start|>user\nHi<|im_end|>",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_bpe_files(tmp_path_factory.mktemp("qwen"), PRETOKENIZE_REGEX)


@pytest.fixture(scope="module")
def tok(files):
    return Qwen2Tokenizer(str(files[0]), str(files[1]), special_tokens=SPECIAL)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(files, tok, text):
    vocab = json.loads(files[0].read_text())
    merges = [tuple(line.split()) for line in files[1].read_text().splitlines()[1:] if line]
    hf = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
    hf.add_special_tokens({"additional_special_tokens": list(SPECIAL)})
    ids = tok.encode(text, add_bos=False, add_eos=False)
    expected = hf.encode(text, add_special_tokens=False)
    # transformers gives the added tokens ids after the vocabulary; ours are the model's fixed ids
    added = {hf.convert_tokens_to_ids(t): i for t, i in SPECIAL.items()}
    assert ids == [added.get(i, i) for i in expected]
    assert tok.decode(ids) == hf.decode(expected)
    assert tok.encode(text, add_bos=False) == ids + [tok.eos_id]


def test_chatml_format_and_mask(files, tok):
    messages = [
        Message("system", "Be brief.", masked=True),
        Message("user", "Hi!", masked=True),
        Message("assistant", "Hello."),
    ]
    tokens, mask = tok.tokenize_messages(messages)
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello."
    assert tokens == tok.encode(text, add_bos=False) and tok.decode(tokens) == text + "<|im_end|>"
    n_prompt = len(tok.encode(text.split("<|im_start|>assistant")[0], add_bos=False, add_eos=False))
    assert mask == [True] * n_prompt + [False] * (len(tokens) - n_prompt)
    assert tok.tokenize_messages(messages, add_eos=False)[0] == tokens[:-1]
    chatml = Qwen2Tokenizer(str(files[0]), str(files[1]), special_tokens=SPECIAL, prompt_template=ChatMLTemplate())
    with pytest.raises(ValueError, match="ChatMLTemplate"):
        chatml.tokenize_messages(messages)


def test_qwen2_5_tool_calls(files):
    tok = qwen2_5_tokenizer(str(files[0]), merges_file=str(files[1]))
    assert isinstance(tok, Qwen2_5Tokenizer) and (tok.eos_id, tok.pad_id) == (151645, 151643)
    messages = [
        Message("user", "Weather?", masked=True),
        Message("assistant", "get_weather()", ipython=True),
        Message("ipython", "sunny", masked=True),
        Message("ipython", "22C", masked=True),
        Message("assistant", "Sunny, 22C."),
    ]
    tokens, _ = tok.tokenize_messages(messages)
    assert tok.decode(tokens) == (
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\nget_weather()\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny, 22C.<|im_end|>"
    )


def test_builders_read_torchtunes_files_or_a_tokenizer_json(files, tmp_path):
    tok = qwen2_tokenizer(str(files[0]), str(files[1]), max_seq_len=8)
    assert isinstance(tok, Qwen2Tokenizer) and tok.im_end_id == 151645 and tok.max_seq_len == 8
    folder = make_hf_tokenizer_folder(tmp_path / "qwen", "qwen2_5")
    assert isinstance(qwen2_5_tokenizer(str(folder / "tokenizer.json")), HFModelTokenizer)
    with pytest.raises(TuneError, match="tokenizer.eos_token is set"):  # the folder's config sets it
        qwen2_5_tokenizer(str(folder / "tokenizer.json"), eos_token="<|endoftext|>")
    assert qwen2_tokenizer(str(files[0]), str(files[1]), eos_token="<|endoftext|>").eos_id == 151643
    with pytest.raises(TuneError, match="needs tokenizer.merges_file"):
        qwen2_5_tokenizer(str(files[0]))
