"""GemmaTokenizer on a tiny SentencePiece model: plain-text chat, BOS per turn, EOS after the answer."""

from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune.data import Message
from torchtune.models.gemma import GemmaTokenizer, gemma_tokenizer


def test_gemma_tokenize_messages(tmp_path):
    tok = gemma_tokenizer(str(make_spm_tokenizer(tmp_path)), prompt_template="torchtune.data.QuestionAnswerTemplate")
    assert isinstance(tok, GemmaTokenizer)
    messages = [Message("user", "Why is the sky blue?", masked=True), Message("assistant", "Rayleigh scattering.")]
    tokens, mask = tok.tokenize_messages(messages)
    user = [
        i
        for p in ("Question:", "Why is the sky blue?", "\n\nAnswer:")
        for i in tok.encode(p, add_bos=False, add_eos=False)
    ]
    answer = tok.encode("Rayleigh scattering.", add_bos=False)  # after "Answer: ": no trim
    assert tokens == [tok.bos_id, *user, *answer] and mask == [True] * (1 + len(user)) + [False] * len(answer)
    assert tok.tokenize_messages(messages, add_eos=False)[0] == tokens[:-1]
