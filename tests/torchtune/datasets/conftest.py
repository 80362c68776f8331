"""Fixtures for dataset tests: a tiny tokenizer, offline `datasets`, and a cache under tmp."""

import json

import pytest

from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune.modules.tokenizers import SentencePieceTokenizer

ALPACA_ROWS = [
    {
        "instruction": "Give three tips for staying healthy.",
        "input": "",
        "output": "Eat a balanced diet, exercise regularly and get enough sleep.",
    },
    {
        "instruction": "Translate the following sentence into French.",
        "input": "Hello, how are you?",
        "output": "Bonjour, comment allez-vous?",
    },
    {"instruction": "What is the capital of France?", "input": "", "output": "Paris."},
]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return SentencePieceTokenizer(make_spm_tokenizer(tmp_path_factory.mktemp("spm")))


@pytest.fixture(autouse=True)
def offline_datasets(monkeypatch):
    """No test may reach the network: hub lookups fail at once instead of retrying."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "hf_cache")


@pytest.fixture
def alpaca_rows():
    return [dict(row) for row in ALPACA_ROWS]


@pytest.fixture
def alpaca_json(tmp_path):
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(ALPACA_ROWS))
    return path
