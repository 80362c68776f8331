"""The validation set split over ranks: every N-th example each, and as many forward passes on every
rank (a sharded model's collectives must match), the extra ones not counted. The loss of the split set
equals one process's: tests/recipes/test_full_finetune_distributed.py."""

from types import SimpleNamespace

from omegaconf import OmegaConf

from torchtune.training import build_validation


def five_examples(tokenizer):
    """Example i has i + 2 tokens, so a batch's padded length tells which examples it holds."""
    return [{"tokens": [1] * (i + 2), "labels": [1] * (i + 2)} for i in range(5)]


def _forward_passes(world_size: int, rank: int) -> list:
    node = OmegaConf.create({"_component_": f"{__name__}.five_examples"})
    info = SimpleNamespace(world_size=world_size, rank=rank, is_rank_zero=rank == 0)
    validation = build_validation(node, SimpleNamespace(pad_id=0), batch_size=2, every_n_steps=None, info=info)
    return [(batch["tokens"].shape, counted) for batch, counted in validation.batches()]


def test_each_rank_evaluates_every_nth_example_in_as_many_forward_passes():
    # rank 0: examples 0, 2, 4 in batches [0, 2] and [4]; rank 1: [1, 3], then [1, 3] again, not counted
    assert _forward_passes(2, 0) == [((2, 4), True), ((1, 6), True)]
    assert _forward_passes(2, 1) == [((2, 5), True), ((2, 5), False)]


def test_a_rank_without_examples_runs_the_first_one_without_counting_it():
    assert _forward_passes(8, 4) == [((1, 6), True)]
    assert _forward_passes(8, 6) == [((1, 2), False)]
