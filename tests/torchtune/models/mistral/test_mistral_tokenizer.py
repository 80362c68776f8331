"""mistral_tokenizer: torchtune's MistralTokenizer ([INST] template) for a SentencePiece tokenizer.model, the
folder's own tokenizer and chat template for a tokenizer.json."""

import pytest

from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder
from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune import TuneError
from torchtune.data import Message
from torchtune.models.mistral import MistralChatTemplate, MistralTokenizer, mistral_tokenizer
from torchtune.modules.tokenizers import HFModelTokenizer


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
    return str(make_spm_tokenizer(tmp_path_factory.mktemp("spm")))


def test_inst_template_and_eos(spm_path):
    tok = mistral_tokenizer(spm_path)
    assert isinstance(tok, MistralTokenizer) and isinstance(tok.prompt_template, MistralChatTemplate)
    messages = [Message("user", "Name a colour.", masked=True), Message("assistant", "Blue.")]
    tokens, mask = tok.tokenize_messages(messages)
    user = [i for p in ("[INST]", "Name a colour.", " [/INST]") for i in tok.encode(p, add_bos=False, add_eos=False)]
    answer = tok.encode("Blue.", add_bos=False)  # the user message ends with a space: no trim
    assert tokens == [tok.bos_id, *user, *answer]
    assert mask == [True] * (1 + len(user)) + [False] * len(answer)
    assert tok.tokenize_messages(messages, add_eos=False)[0] == tokens[:-1]
    assert tok({"messages": messages})["tokens"] == tokens
    with pytest.raises(ValueError, match="System prompts are not supported in MistralChatTemplate"):
        tok.tokenize_messages([Message("system", "Be brief."), *messages])


def test_tokenizer_json_gives_the_folders_tokenizer(tmp_path):
    folder = make_hf_tokenizer_folder(tmp_path / "mistral", "mistral")
    tok = mistral_tokenizer(str(folder / "tokenizer.json"), max_seq_len=32)
    assert isinstance(tok, HFModelTokenizer) and tok.max_seq_len == 32
    with pytest.raises(TuneError, match="tokenizer.prompt_template"):
        mistral_tokenizer(str(folder / "tokenizer.json"), prompt_template="torchtune.data.ChatMLTemplate")
