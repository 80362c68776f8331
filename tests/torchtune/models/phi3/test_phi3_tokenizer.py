"""Phi3MiniTokenizer: Phi-3's special tokens around SentencePiece text."""

import pytest

from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune.data import Message
from torchtune.models.phi3 import PHI3_SPECIAL_TOKENS, Phi3MiniTokenizer, phi3_mini_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return phi3_mini_tokenizer(str(make_spm_tokenizer(tmp_path_factory.mktemp("spm"))))


def test_phi3_format(tok):
    assert isinstance(tok, Phi3MiniTokenizer) and tok.eos_id == tok.pad_id == PHI3_SPECIAL_TOKENS["<|endoftext|>"]
    assert (tok.vocab_size, tok.text_vocab_size) == (400, 32011)  # the model's table must hold the special ids
    messages = [
        Message("system", "Be brief.", masked=True),
        Message("user", "Hi!", masked=True),
        Message("assistant", "Hello."),
    ]
    tokens, mask = tok.tokenize_messages(messages)
    nl = tok.encode("\n", add_bos=False, add_eos=False)

    def turn(role, text):
        body = tok.encode(text, add_bos=False, add_eos=False, trim_leading_whitespace=True)
        return [PHI3_SPECIAL_TOKENS[role], *nl, *body, PHI3_SPECIAL_TOKENS["<|end|>"], *nl]

    system, user, reply = turn("<|system|>", "Be brief."), turn("<|user|>", "Hi!"), turn("<|assistant|>", "Hello.")
    assert tokens == [tok.bos_id, *system, *user, *reply]
    assert mask == [True] * (1 + len(system) + len(user)) + [False] * len(reply)
    assert tok.tokenize_messages(messages, ignore_system_prompt=True)[0] == [tok.bos_id, *user, *reply]
    assert tok.tokenize_messages(messages, add_eos=True)[0] == [tok.bos_id, *system, *user, *reply, tok.eos_id]
    assert tok.decode(tokens) == "\nBe brief.\n\nHi!\n\nHello.\n"
    assert tok.decode(tokens, skip_special_tokens=False).startswith("<|system|>\nBe brief.<|end|>")
