"""A tiny Llama2-shaped SentencePiece model, trained once per session."""

import pytest

from tests._helpers.tokenizer import make_spm_tokenizer


@pytest.fixture(scope="session")
def spm_model_path(tmp_path_factory):
    return make_spm_tokenizer(tmp_path_factory.mktemp("spm"))
