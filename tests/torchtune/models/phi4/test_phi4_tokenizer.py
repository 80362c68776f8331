"""phi4_tokenizer: torchtune's Phi4Tokenizer from vocab.json + merges.txt; a tokenizer.json gives the folder's."""

import pytest

from tests._helpers.bpe_files import make_bpe_files
from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder
from torchtune import TuneError
from torchtune.data import Message
from torchtune.models.phi4 import PHI4_SPECIAL_TOKENS, Phi4Tokenizer, phi4_tokenizer
from torchtune.modules.tokenizers import HFModelTokenizer
from torchtune.modules.transforms.tokenizers._gpt2 import GPT2_PATTERN


def test_phi4_format_from_vocab_and_merges(tmp_path):
    vocab, merges = make_bpe_files(tmp_path, GPT2_PATTERN)
    tok = phi4_tokenizer(vocab_path=str(vocab), merges_path=str(merges))
    assert isinstance(tok, Phi4Tokenizer) and (tok.bos_id, tok.eos_id, tok.pad_id) == (100257, 100265, 100349)
    assert tok.text_vocab_size == 100352  # the model's table must hold the special ids
    messages = [Message("user", "Hi there!  ", masked=True), Message("assistant", "Hello.")]
    tokens, mask = tok.tokenize_messages(messages, add_eos=True)
    im_start, im_sep, im_end = (PHI4_SPECIAL_TOKENS[t] for t in ("<|im_start|>", "<|im_sep|>", "<|im_end|>"))

    def text(t):
        return tok.encode(t, add_bos=False, add_eos=False)

    user = [im_start, *text("user"), im_sep, *text("Hi there!"), im_end]
    reply = [im_start, *text("assistant"), im_sep, *text("Hello."), im_end]
    assert tokens == user + reply and mask == [True] * len(user) + [False] * len(reply)
    assert tok.tokenize_messages(messages)[0] == user + reply[:-1]  # add_eos defaults to False
    assert tok.decode(tokens) == "userHi there!assistantHello."  # the roles are text, the tags special


def test_phi4_tokenizer_json_and_bad_arguments(tmp_path):
    folder = make_hf_tokenizer_folder(tmp_path / "phi4", "phi4")
    assert isinstance(phi4_tokenizer(path=str(folder / "tokenizer.json")), HFModelTokenizer)
    assert isinstance(phi4_tokenizer(str(folder / "tokenizer.json")), HFModelTokenizer)
    with pytest.raises(TuneError, match="vocab_path and tokenizer.merges_path"):
        phi4_tokenizer()
