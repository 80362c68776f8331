"""The tokenizer/model check: only ids past the embedding table are refused; a larger table is a note."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from torchtune._errors import TuneError
from torchtune.models.llama2 import llama2_tiny
from torchtune.training import check_tokenizer_fits_model

CFG = {"path": "/models/x/tokenizer.json"}


def test_tokenizer_with_ids_past_the_table_is_refused():
    model = llama2_tiny(vocab_size=100)
    with pytest.raises(TuneError, match=r"has 101 tokens but the model's embedding table has 100 rows"):
        check_tokenizer_fits_model(SimpleNamespace(vocab_size=101), model, CFG)


def test_larger_table_is_one_informational_line(caplog):
    """Qwen2.5 / Qwen3: 151,936 rows for about 151,665 tokens; here 4x the tokenizer, still fine."""
    model = llama2_tiny(vocab_size=400)
    with caplog.at_level(logging.INFO, logger="torchtune"):
        check_tokenizer_fits_model(SimpleNamespace(vocab_size=100), model, CFG)
    notes = [r for r in caplog.records if "embedding table has 400 rows" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    check_tokenizer_fits_model(SimpleNamespace(vocab_size=400), model, CFG)
