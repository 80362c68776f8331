"""PackedDataset: torchtune's greedy packing by default (its packs, positions and labels), this library's
best-fit packing with ``best_fit=True``; the collate functions of packs."""

import functools

import pytest
import torch

from torchtune import TuneError
from torchtune.datasets import (
    ConcatDataset,
    PackedDataset,
    alpaca_dataset,
    block_causal_mask,
    collate_for,
    packed_collate,
    padded_collate,
)

BOS, EOS = 1, 2


def example(n, start, masked_prompt=0):
    """BOS, n - 2 body tokens counting from `start`, EOS; the first `masked_prompt` labels are -100."""
    tokens = [BOS] + list(range(start, start + n - 2)) + [EOS]
    labels = [-100] * masked_prompt + tokens[masked_prompt:]
    return {"tokens": tokens, "labels": labels}


EXAMPLES = [example(5, 10), example(4, 20, masked_prompt=2), example(6, 30), example(3, 40), example(7, 50)]


def shift(labels):
    """What the recipe does: position t is trained to predict labels[t + 1]."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


def test_greedy_packs_as_torchtune():
    """Examples in order, a new pack when one does not fit; labels as they are (no boundary masking);
    positions count on through the padding."""
    packed = PackedDataset(EXAMPLES, max_seq_len=10, padding_idx=0)
    assert [p["seq_lens"].tolist() for p in packed] == [[5, 4, 1], [6, 3, 1], [7, 3]]
    for p in packed:
        assert p["tokens"].shape == p["labels"].shape == p["input_pos"].shape == (10,)
    assert packed[0]["tokens"].tolist() == [1, 10, 11, 12, 2, 1, 20, 21, 2, 0]
    assert packed[0]["labels"].tolist() == [1, 10, 11, 12, 2, -100, -100, 21, 2, -100]
    assert packed[0]["input_pos"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert packed[2]["input_pos"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert packed.num_examples == 5 and packed.padding_share == pytest.approx(5 / 30)


def test_greedy_split_across_pack_continues_positions():
    packed = PackedDataset(EXAMPLES, max_seq_len=10, split_across_pack=True)
    assert [p["seq_lens"].tolist() for p in packed] == [[5, 4, 1], [5, 3, 2], [5, 5]]
    assert packed[1]["input_pos"].tolist() == [1, 2, 3, 4, 5, 0, 1, 2, 0, 1]  # the split example counts on
    assert [t for p in packed for t in p["tokens"].tolist() if t != 0] == [t for e in EXAMPLES for t in e["tokens"]]


def test_greedy_max_packs_and_a_too_long_example():
    packed = PackedDataset(EXAMPLES, max_seq_len=10, max_packs=2)
    assert len(packed) == 2 and packed.num_examples == 4
    # [5, 4, 1] and [5, 3, 2]: the fifth example starts in the second pack
    assert PackedDataset(EXAMPLES, max_seq_len=10, max_packs=2, split_across_pack=True).num_examples == 5
    with pytest.raises(ValueError, match="Dataset sample is too long"):
        PackedDataset([example(12, 10)], max_seq_len=8)


def test_best_fit_packs_of_exact_length():
    packed = PackedDataset(EXAMPLES, max_seq_len=10, padding_idx=0, best_fit=True)
    assert len(packed) == 3
    assert [p["seq_lens"].tolist() for p in packed] == [[5, 4, 1], [6, 3, 1], [7, 3]]
    assert packed[0]["tokens"].tolist() == [1, 10, 11, 12, 2, 1, 20, 21, 2, 0]
    # First label of each example and all padding labels are ignored; prompt masking is kept.
    assert packed[0]["labels"].tolist() == [-100, 10, 11, 12, 2, -100, -100, 21, 2, -100]
    assert packed[2]["tokens"].tolist()[7:] == [0, 0, 0]


def test_best_fit_input_pos_restarts_per_segment_padding_included():
    packed = PackedDataset(EXAMPLES, max_seq_len=10, best_fit=True)
    assert packed[0]["input_pos"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0]
    assert packed[2]["input_pos"].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]


def segments(pack):
    """The token lists of a pack's segments, the padding segment included."""
    return [chunk.tolist() for chunk in torch.split(pack["tokens"], pack["seq_lens"].tolist())]


@pytest.mark.parametrize("best_fit", [True, False])
def test_total_real_tokens_preserved(best_fit):
    packed = PackedDataset(EXAMPLES, max_seq_len=10, padding_idx=0, best_fit=best_fit)
    real = [seg for p in packed for seg in segments(p) if seg[0] == BOS]
    assert real == [e["tokens"] for e in EXAMPLES]
    assert sum(p["seq_lens"].sum().item() for p in packed) == 10 * len(packed)


def test_best_fit_cuts_a_long_example_keeping_eos():
    packed = PackedDataset([example(12, 10), example(3, 40)], max_seq_len=8, best_fit=True)
    assert packed[0]["tokens"].tolist() == [1, 10, 11, 12, 13, 14, 15, 2]
    assert packed[0]["labels"].tolist() == [-100, 10, 11, 12, 13, 14, 15, 2]
    assert packed[0]["seq_lens"].tolist() == [8]
    assert packed[1]["seq_lens"].tolist() == [3, 5]


def test_best_fit_with_split_across_pack_is_refused():
    with pytest.raises(TuneError, match="best_fit packs whole examples"):
        PackedDataset(EXAMPLES, max_seq_len=10, split_across_pack=True, best_fit=True)


def test_block_causal_mask():
    mask = block_causal_mask([2, 3])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_packed_collate_shapes_and_mask():
    packed = PackedDataset(EXAMPLES, max_seq_len=10)
    batch = packed_collate([packed[0], packed[1]])
    assert batch["tokens"].shape == batch["labels"].shape == batch["input_pos"].shape == (2, 10)
    assert batch["tokens"].dtype == batch["input_pos"].dtype == torch.long
    assert batch["mask"].shape == (2, 10, 10) and batch["mask"].dtype == torch.bool
    assert torch.equal(batch["mask"][0], block_causal_mask([5, 4, 1]))
    # Causal and inside each example: a row never sees the future or another example.
    assert not torch.triu(batch["mask"][1], diagonal=1).any()
    assert not batch["mask"][0][5:9, :5].any()
    assert batch["mask"].diagonal(dim1=1, dim2=2).all()


def test_best_fit_no_target_crosses_an_example_boundary_after_shift():
    packed = PackedDataset(EXAMPLES, max_seq_len=10, best_fit=True)
    batch = packed_collate(list(packed))
    targets = shift(batch["labels"])
    for row, pack in enumerate(packed):
        ends = torch.cumsum(pack["seq_lens"], 0) - 1  # last position of each segment
        assert (targets[row, ends] == -100).all()
        # Every other target is the next token of the same example (or ignored).
        for t in range(9):
            if targets[row, t] != -100:
                assert batch["input_pos"][row, t + 1] == batch["input_pos"][row, t] + 1
                assert targets[row, t] == batch["tokens"][row, t + 1]


def test_greedy_targets_cross_example_boundaries_as_torchtune():
    """torchtune's labels: after the shift the last token (EOS) of an example is trained to predict the BOS
    of the next one in its pack."""
    batch = packed_collate(list(PackedDataset(EXAMPLES, max_seq_len=10)))
    targets = shift(batch["labels"])
    # the pack [6, 3, pad 1]: the EOS ending the first example -> the BOS starting the second
    assert batch["tokens"][1, 5] == 2 and targets[1, 5] == 1


def test_best_fit_packed_targets_match_unpacked_targets():
    packed = packed_collate(list(PackedDataset(EXAMPLES, max_seq_len=10, best_fit=True)))
    unpacked = padded_collate(EXAMPLES)
    packed_targets = [t for t in shift(packed["labels"]).flatten().tolist() if t != -100]
    unpacked_targets = [t for t in shift(unpacked["labels"]).flatten().tolist() if t != -100]
    assert packed_targets == unpacked_targets


def test_collate_for_picks_by_dataset_type():
    assert collate_for(PackedDataset(EXAMPLES, max_seq_len=10)) is packed_collate
    packs = [PackedDataset(EXAMPLES, max_seq_len=10), PackedDataset(EXAMPLES, max_seq_len=10, best_fit=True)]
    assert collate_for(ConcatDataset(packs)) is packed_collate
    collate = collate_for(EXAMPLES, padding_idx=3, ignore_idx=-1)
    assert isinstance(collate, functools.partial) and collate.func is padded_collate
    assert collate(EXAMPLES[:2])["tokens"].tolist()[1][-1] == 3


def test_bad_max_seq_len():
    with pytest.raises(TuneError, match="max_seq_len"):
        PackedDataset(EXAMPLES, max_seq_len=1)


def test_alpaca_packed(tokenizer, alpaca_json, cache_dir):
    plain = alpaca_dataset(tokenizer, source="json", data_files=str(alpaca_json), cache_dir=cache_dir, max_seq_len=320)
    packed = alpaca_dataset(
        tokenizer, source="json", data_files=str(alpaca_json), cache_dir=cache_dir, max_seq_len=320, packed=True
    )
    assert not packed.best_fit
    assert isinstance(packed, PackedDataset)
    assert all(p["tokens"].shape == (320,) for p in packed)
    assert len(packed) < len(plain)  # several examples share a pack
    real = [seg for p in packed for seg in segments(p) if seg[0] == tokenizer.bos_id]
    assert real == [plain[i]["tokens"] for i in range(len(plain))]
    batch = collate_for(packed, padding_idx=tokenizer.pad_id)([packed[0]])
    assert set(batch) == {"tokens", "labels", "input_pos", "mask"}


def test_packed_needs_max_seq_len(tokenizer, alpaca_json, cache_dir):
    with pytest.raises(TuneError, match="dataset.max_seq_len"):
        alpaca_dataset(
            tokenizer, source="json", data_files=str(alpaca_json), cache_dir=cache_dir, max_seq_len=None, packed=True
        )


def test_best_fit_puts_each_example_into_the_fullest_pack_that_holds_it():
    # Greedy packing closes a pack at every example that does not fit: [6], [6, 4], [4, 3] -> 3 packs, 9
    # padding positions.
    examples = [example(6, 10), example(6, 20), example(4, 30), example(4, 40), example(3, 50)]
    assert [p["seq_lens"].tolist() for p in PackedDataset(examples, max_seq_len=10)] == [[6, 4], [6, 4], [4, 3, 3]]
    packed = PackedDataset(examples, max_seq_len=10, best_fit=True)
    assert [p["seq_lens"].tolist() for p in packed] == [[6, 4], [6, 4], [3, 7]]
    # each pack keeps its examples in order: the first holds examples 0 and 2, the second 1 and 3
    assert [seg[1] for seg in segments(packed[0])] == [10, 30]
    assert [seg[1] for seg in segments(packed[1])] == [20, 40]
    assert packed.padding_share == pytest.approx(7 / 30)
    # the least room that still holds it wins, not the first pack with room: 3 joins the 7, not the 5
    packed = PackedDataset([example(5, 10), example(7, 20), example(3, 30)], max_seq_len=10, best_fit=True)
    assert [p["seq_lens"].tolist() for p in packed] == [[5, 5], [7, 3]]
    assert [seg[1] for seg in segments(packed[1])] == [20, 30]


def test_best_fit_max_packs():
    examples = [example(6, 10), example(6, 20), example(4, 30), example(4, 40), example(3, 50)]
    packed = PackedDataset(examples, max_seq_len=10, best_fit=True, max_packs=1)
    assert [p["seq_lens"].tolist() for p in packed] == [[6, 4]] and packed.num_examples == 1  # 4: padding
    assert PackedDataset(examples, max_seq_len=10, best_fit=True, max_packs=2).num_examples == 4


def test_examples_with_nothing_to_learn_are_left_out_and_counted():
    unlabelled = {"tokens": [1, 5, 6, 2], "labels": [-100, -100, -100, -100]}
    for best_fit in (False, True):
        packed = PackedDataset([EXAMPLES[0], unlabelled, EXAMPLES[1]], max_seq_len=10, best_fit=best_fit)
        assert packed.num_examples == 2 and packed.num_dropped == 1
        assert packed.dropped == {"with nothing to learn": 1}
        assert packed[0]["seq_lens"].tolist() == [5, 4, 1]
