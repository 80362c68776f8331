"""Free text: TextCompletionDataset / text_completion_dataset on local files, its cut to max_seq_len (ours,
keeping EOS) or the tokenizer's (torchtune's), packing across packs, null rows refused; the hub defaults of
cnn_dailymail and wikitext."""

from __future__ import annotations

import json

import pytest

from torchtune import TuneError
from torchtune.datasets import (
    PackedDataset,
    TextCompletionDataset,
    cnn_dailymail_articles_dataset,
    text_completion_dataset,
    wikitext_dataset,
)
from torchtune.modules.tokenizers import SentencePieceTokenizer

LINES = ["The river runs past the old stone mill.", "A tiger sleeps under the lemon tree.", "Clouds gather."]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n")
    return path


def test_every_token_is_learnt(tokenizer, text_file):
    ds = text_completion_dataset(tokenizer, source=str(text_file))
    assert len(ds) == 3
    for line, i in zip(LINES, range(3)):
        assert ds[i]["tokens"] == ds[i]["labels"] == tokenizer.encode(line)
    assert TextCompletionDataset(tokenizer, str(text_file), add_eos=False)[0]["tokens"] == tokenizer.encode(
        LINES[0], add_eos=False
    )


def test_cut_to_max_seq_len(tokenizer, text_file):
    full = tokenizer.encode(LINES[0])
    ours = text_completion_dataset(tokenizer, source=str(text_file), max_seq_len=5)[0]
    assert ours["tokens"] == full[:4] + [tokenizer.eos_id]  # this library's cut keeps EOS
    theirs = SentencePieceTokenizer(tokenizer.path, max_seq_len=5)
    assert text_completion_dataset(theirs, source=str(text_file))[0]["tokens"] == full[:4]  # torchtune's: max - 1


def test_packed_across_packs(tokenizer, text_file):
    """Each text is at most max_seq_len (32) tokens; the texts run on from pack to pack."""
    every = [t for line in LINES for t in tokenizer.encode(line)]
    assert all(len(tokenizer.encode(line)) <= 32 for line in LINES) and len(every) > 32
    ds = text_completion_dataset(tokenizer, source=str(text_file), packed=True, max_seq_len=32)
    assert isinstance(ds, PackedDataset) and ds.split_across_pack and len(ds) > 1
    flat = [t for i in range(len(ds)) for t in ds[i]["tokens"].tolist()]
    assert flat[: len(every)] == every and set(flat[len(every) :]) <= {tokenizer.pad_id}


def test_null_text_is_refused(tokenizer, tmp_path):
    path = tmp_path / "pages.json"
    path.write_text(json.dumps([{"page": "One."}, {"page": None}]))
    with pytest.raises(TuneError, match=r"column 'page' is null in 1 row\(s\) \(row 1\)"):
        text_completion_dataset(tokenizer, source="json", data_files=str(path), column="page")
    with pytest.raises(TuneError, match="has no column 'text'.*'page'"):
        text_completion_dataset(tokenizer, source="json", data_files=str(path))


def test_hub_builders_keep_their_sources(tokenizer, monkeypatch):
    """cnn_dailymail and wikitext name their hub datasets (nothing is downloaded here: the loader records
    what it is asked for); their max_seq_len cuts the text and is not passed to load_dataset."""
    import torchtune.datasets._text_completion as module

    calls = []

    def load(source, **kwargs):
        calls.append((source, kwargs))
        return [{"article": LINES[0], "page": LINES[1]}]

    monkeypatch.setattr(module, "load_dataset", load)
    article = cnn_dailymail_articles_dataset(tokenizer, max_seq_len=4)[0]
    page = wikitext_dataset(tokenizer)[0]
    assert calls == [
        ("ccdv/cnn_dailymail", {"split": "train", "name": "3.0.0"}),
        ("EleutherAI/wikitext_document_level", {"split": "train", "name": "wikitext-103-v1"}),
    ]
    assert len(article["tokens"]) == 4 and page["tokens"] == tokenizer.encode(LINES[1])
