"""Collate functions of torchtune.data, and the recipes' collate functions built on them."""

import pytest
import torch

from torchtune.data import (
    CROSS_ENTROPY_IGNORE_IDX,
    left_pad_sequence,
    padded_collate,
    padded_collate_dpo,
    padded_collate_packed,
    padded_collate_sft,
    truncate,
)
from torchtune.datasets import packed_collate
from torchtune.datasets import padded_collate as recipe_padded_collate


def test_padded_collate_sft_pads_to_the_longest_of_tokens_and_labels():
    batch = [{"tokens": [1, 2, 3], "labels": [4, 5]}, {"tokens": [6], "labels": [7, 8, 9, 10]}]
    out = padded_collate_sft(batch, padding_idx=-1)
    assert out["tokens"].tolist() == [[1, 2, 3, -1], [6, -1, -1, -1]]
    assert out["labels"].tolist() == [[4, 5, -100, -100], [7, 8, 9, 10]]
    assert out["tokens"].dtype == out["labels"].dtype == torch.long
    assert recipe_padded_collate is padded_collate_sft and CROSS_ENTROPY_IGNORE_IDX == -100


def test_left_pad_sequence_and_generic_padded_collate():
    seqs = [torch.tensor([1, 2]), torch.tensor([3, 4, 5])]
    assert left_pad_sequence(seqs, batch_first=True, padding_value=9).tolist() == [[9, 1, 2], [3, 4, 5]]
    assert left_pad_sequence(seqs).tolist() == [[0, 3], [1, 4], [2, 5]]
    batch = [{"tokens": [1], "ids": [2, 3], "label": 0}, {"tokens": [4, 5], "ids": [6], "label": 1}]
    out = padded_collate(
        batch, pad_direction="left", keys_to_pad=["tokens", "ids"], padding_idx={"tokens": 0, "ids": -1}
    )
    assert out["tokens"].tolist() == [[0, 1], [4, 5]] and out["ids"].tolist() == [[2, 3], [-1, 6]]
    assert out["label"].tolist() == [0, 1]
    for bad in (
        dict(pad_direction="up", keys_to_pad=["tokens"], padding_idx=0),
        dict(pad_direction="left", keys_to_pad=[], padding_idx=0),
        dict(pad_direction="left", keys_to_pad=["tokens"], padding_idx={"ids": 0}),
        dict(pad_direction="left", keys_to_pad=["nope"], padding_idx=0),
    ):
        with pytest.raises(ValueError):
            padded_collate(batch, **bad)


def test_packed_collate_masks_attention_inside_each_sample():
    packs = [
        {"tokens": [1, 2, 3, 4], "labels": [5, 6, 7, 8], "input_pos": [0, 1, 0, 0], "seq_lens": [2, 1, 1]},
        {"tokens": torch.tensor([9, 9, 9, 9]), "labels": [1, 1, 1, 1], "input_pos": [0, 1, 2, 3], "seq_lens": [4]},
    ]
    ours, theirs = packed_collate(packs), padded_collate_packed(packs)  # on CPU both are Bool[b, s, s]
    expected_first = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert ours["mask"].dtype == torch.bool and ours["mask"][0].int().tolist() == expected_first
    assert ours["mask"][1].int().tolist() == torch.ones(4, 4).tril().int().tolist()
    for key in ("tokens", "labels", "input_pos", "mask"):
        assert torch.equal(ours[key], theirs[key])


def test_dpo_collate_stacks_chosen_then_rejected():
    batch = [
        {"chosen_input_ids": [1, 2], "chosen_labels": [3, 4], "rejected_input_ids": [5], "rejected_labels": [6]},
        {
            "chosen_input_ids": [7],
            "chosen_labels": [8],
            "rejected_input_ids": [9, 10, 11],
            "rejected_labels": [12, 13, 14],
        },
    ]
    ids, labels = padded_collate_dpo(batch)
    assert ids.tolist() == [[1, 2, 0], [7, 0, 0], [5, 0, 0], [9, 10, 11]]
    assert labels.tolist() == [[3, 4, -100], [8, -100, -100], [6, -100, -100], [12, 13, 14]]


def test_truncate_sets_the_last_kept_item():
    assert truncate([1, 2, 3, 4], 3) == [1, 2, 3]
    assert truncate([1, 2, 3, 4], 3, eos_id=9) == [1, 2, 9]
    assert truncate([1, 2, 9], 5, eos_id=9) == [1, 2, 9]
    assert truncate([True, False, False], 2, eos_id=True) == [True, True]
    assert truncate([], 2, eos_id=9) == []
