"""The pack cache: built once per (data, tokenizer, max_seq_len), read back identical, never stale."""

import json
import logging

import pytest
import torch

from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune.datasets import PackedDataset, alpaca_dataset
from torchtune.modules.tokenizers import SentencePieceTokenizer

ROWS = [
    {"instruction": f"Name {n} things that are {c}.", "input": "", "output": f"Here are {n} {c} things: a, b, c."}
    for n, c in [("two", "red"), ("three", "blue"), ("four", "green"), ("five", "round"), ("six", "soft")]
] * 4


def _packed(tokenizer, data, cache_dir, **kwargs):
    return alpaca_dataset(
        tokenizer,
        source="json",
        data_files=str(data),
        cache_dir=cache_dir,
        train_on_input=False,
        packed=True,
        **{"max_seq_len": 128, **kwargs},
    )


def _same(a: PackedDataset, b: PackedDataset) -> None:
    assert len(a) == len(b) and a.num_examples == b.num_examples
    for i in range(len(a)):
        for key in ("tokens", "labels", "input_pos", "seq_lens"):
            assert torch.equal(a[i][key], b[i][key]), (i, key)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(ROWS))
    return path


def test_packs_are_cached_next_to_the_dataset_and_read_back_identical(tokenizer, data, cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="torchtune")
    first = _packed(tokenizer, data, cache_dir)
    assert first.cache_file is not None and first.cache_file.is_file()
    assert str(first.cache_file).startswith(cache_dir)  # beside the Arrow files of `datasets`
    assert "cached in" in caplog.text
    caplog.clear()
    again = _packed(tokenizer, data, cache_dir)
    assert again.cache_file == first.cache_file
    assert "read from the cache" in caplog.text
    _same(first, again)
    assert again.num_examples == len(ROWS)
    assert 0 < again.padding_share < 1 and again.padding_share == first.padding_share
    # the cache holds the packs: a different list of examples under the same file gives those back
    assert torch.equal(PackedDataset([], max_seq_len=128, cache_file=first.cache_file)[0]["tokens"], first[0]["tokens"])


def test_the_cache_key_follows_data_tokenizer_and_settings(tokenizer, data, cache_dir, tmp_path):
    base = _packed(tokenizer, data, cache_dir).cache_file
    assert _packed(tokenizer, data, cache_dir, max_seq_len=96).cache_file != base
    assert _packed(tokenizer, data, cache_dir, best_fit=True).cache_file != base  # other packs
    assert _packed(tokenizer, data, cache_dir, chat_format="plain_text").cache_file != base  # a setting
    assert (
        alpaca_dataset(
            tokenizer, source="json", data_files=str(data), cache_dir=cache_dir, max_seq_len=128, packed=True
        ).cache_file
        != base
    )  # train_on_input=True: other labels
    other_tok = SentencePieceTokenizer(make_spm_tokenizer(tmp_path / "tok2", vocab_size=450))
    assert _packed(other_tok, data, cache_dir).cache_file != base
    data.write_text(json.dumps(ROWS[:7]))  # the data changed: a new key, and packs of the new data
    changed = _packed(tokenizer, data, cache_dir)
    assert changed.cache_file != base and changed.num_examples == 7


def test_a_damaged_cache_file_is_rebuilt(tokenizer, data, cache_dir):
    first = _packed(tokenizer, data, cache_dir)
    first.cache_file.write_bytes(b"not a torch file")
    again = _packed(tokenizer, data, cache_dir)
    _same(first, again)
    assert torch.load(again.cache_file, weights_only=True)["format"] == 3


def test_padding_share_counts_pad_positions():
    examples = [{"tokens": [1, 5, 6, 2], "labels": [1, 5, 6, 2]}] * 3  # 4 tokens each
    packed = PackedDataset(examples, max_seq_len=10)  # [4, 4, pad 2], [4, pad 6]
    assert packed.padding_share == pytest.approx(8 / 20)
    assert packed.num_examples == 3
    assert packed.cache_file is None


def test_best_fit_packs_are_cached_too(tokenizer, data, cache_dir):
    first = _packed(tokenizer, data, cache_dir, best_fit=True, max_seq_len=256)
    again = _packed(tokenizer, data, cache_dir, best_fit=True, max_seq_len=256)
    assert again.cache_file == first.cache_file and again.best_fit
    _same(first, again)
    assert first[0]["labels"][0] == -100  # best fit's labels: the first of every example ignored
