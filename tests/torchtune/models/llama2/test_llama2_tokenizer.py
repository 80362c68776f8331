"""Llama2Tokenizer: torchtune's message API on a tiny SentencePiece model; the [INST] template by default;
plain text (prompt_template=None) tokenizes as the joined text does."""

import pytest

from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune.data import Message
from torchtune.models.llama2 import Llama2ChatTemplate, Llama2Tokenizer, llama2_tokenizer


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
    return str(make_spm_tokenizer(tmp_path_factory.mktemp("spm")))


def _conversation():
    return [
        Message("system", "Answer briefly.", masked=True),
        Message("user", "What is the capital of France?", masked=True),
        Message("assistant", "Paris."),
        Message("user", "And of Italy?", masked=True),
        Message("assistant", "Rome."),
    ]


def test_default_template_is_inst(spm_path):
    tok = llama2_tokenizer(spm_path)
    assert isinstance(tok, Llama2Tokenizer) and isinstance(tok.prompt_template, Llama2ChatTemplate)
    assert (tok.pad_id, tok.stop_tokens) == (0, [tok.eos_id])
    templated = Llama2ChatTemplate()(_conversation())
    assert [m.text_content for m in templated] == [
        "[INST] <<SYS>>\nAnswer briefly.\n<</SYS>>\n\nWhat is the capital of France? [/INST] ",
        "Paris.",
        "[INST] And of Italy? [/INST] ",
        "Rome.",
    ]
    tokens, mask = tok.tokenize_messages(_conversation())
    # a turn's first message is encoded a text piece at a time, each with SentencePiece's word-start space
    # (trailing spaces dropped), as torchtune does: BOS + the user's pieces (masked), the answer + EOS (learnt)
    pieces = ["[INST]", "<<SYS>>\n", "Answer briefly.", "\n<</SYS>>\n\n", "What is the capital of France?", " [/INST]"]
    first = [tok.bos_id] + [i for p in pieces for i in tok.encode(p, add_bos=False, add_eos=False)]
    answer = tok.encode("Paris.", add_bos=False)
    assert tokens[: len(first) + len(answer)] == first + answer
    assert mask[: len(first) + len(answer)] == [True] * len(first) + [False] * len(answer)
    assert tokens.count(tok.bos_id) == 2 and tokens.count(tok.eos_id) == 2 and tokens[-1] == tok.eos_id
    assert mask[-1] is False and len(mask) == len(tokens)


def test_without_template_messages_join_like_their_text(spm_path):
    tok = llama2_tokenizer(spm_path, prompt_template=None)
    messages = [
        Message("user", "### Instruction:\nName a colour.\n\n### Response:\n", masked=True),
        Message("assistant", "Blue."),
    ]
    tokens, mask = tok.tokenize_messages(messages)
    assert tokens == tok.encode("### Instruction:\nName a colour.\n\n### Response:\nBlue.")
    n_prompt = len(tok.encode(messages[0].text_content, add_eos=False))
    assert mask == [True] * n_prompt + [False] * (len(tokens) - n_prompt)
    assert tok.tokenize_messages(messages, add_start_tokens=False, add_end_tokens=False)[0] == tokens[1:-1]
    sample = tok({"messages": messages}, inference=True)
    assert sample["tokens"] == tokens[:-1] and len(sample["mask"]) == len(tokens) - 1
    short = llama2_tokenizer(spm_path, prompt_template=None, max_seq_len=6)
    cut, cut_mask = short.tokenize_messages(messages)
    assert cut == tokens[:5] + [tok.eos_id] and len(cut_mask) == 6
    left = llama2_tokenizer(spm_path, prompt_template=None, max_seq_len=6, truncation_type="left")
    assert left.tokenize_messages(messages)[0] == tokens[-6:]


def test_custom_template_from_a_mapping(spm_path):
    tok = llama2_tokenizer(spm_path, prompt_template={"user": ["Q: ", "\nA: "]})
    tokens, _ = tok.tokenize_messages([Message("user", "Why?", masked=True), Message("assistant", "Because.")])
    user = [i for p in ("Q:", "Why?", "\nA:") for i in tok.encode(p, add_bos=False, add_eos=False)]
    assert tokens == [tok.bos_id, *user, *tok.encode("Because.", add_bos=False)]
