"""Generation: the KV-cache path against full recomputation, batching, stopping, sampling, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchtune import TuneError
from torchtune.datasets import AlpacaInstructTemplate, padded_collate
from torchtune.generation import evaluate_exact_match, generate, generate_batch, heldout_loss, sample_next_token
from torchtune.models.llama2 import llama2
from torchtune.modules import disable_kv_cache

DEMO_TOKENIZER = Path(__file__).resolve().parents[2] / "torchtune" / "assets" / "demo" / "tokenizer.model"
PROMPTS = [[1, 5, 7, 9], [1, 3], [1, 8, 8, 8, 8, 8, 12]]


@pytest.fixture(autouse=True)
def one_thread():
    # Decoding a tiny model is hundreds of microsecond-sized matmuls; on a busy 2-core machine a
    # second OpenMP thread only adds waiting (measured: 6x slower), so these tests run on one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = llama2(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=48)
    # Larger-than-default weights give peaked logits, so greedy choices are far from ties.
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    return m.eval()


def _reference_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding the plain way: one full forward pass over the whole sequence per token."""
    seq = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt) :]


def test_cached_greedy_equals_full_recompute(model):
    for prompt in PROMPTS:
        want = _reference_greedy(model, prompt, 12)
        assert generate(model, prompt, 12, stop_tokens=()) == want
        assert generate(model, prompt, 12, stop_tokens=(), use_cache=False) == want
    assert len(set(map(tuple, (generate(model, p, 12, stop_tokens=()) for p in PROMPTS)))) == 3


def test_left_padded_batch_equals_one_by_one(model):
    batch = generate_batch(model, PROMPTS, 12, stop_tokens=())
    assert batch == [generate(model, p, 12, stop_tokens=()) for p in PROMPTS]
    assert generate_batch(model, PROMPTS, 12, stop_tokens=(), use_cache=False) == batch


def test_tensor_prompt_and_caches_removed_afterwards(model):
    out = generate(model, torch.tensor(PROMPTS[0]), 5, stop_tokens=())
    assert out == generate(model, PROMPTS[0], 5, stop_tokens=())
    # A model left with KV caches would treat the next training batch as a decoding step.
    assert not model.caches_are_enabled()
    model.train()
    generate(model, PROMPTS[0], 3)
    assert model.training
    assert model(torch.tensor([PROMPTS[2]])).shape == (1, 7, 64)


def test_caller_caches_are_kept_and_reset(model):
    model.setup_caches(batch_size=4, dtype=torch.float32)
    first = generate(model, PROMPTS[1], 6, stop_tokens=())
    assert model.caches_are_enabled()
    assert generate(model, PROMPTS[1], 6, stop_tokens=()) == first  # reset between calls
    assert generate(model, PROMPTS[1], 6, stop_tokens=(), use_cache=False) == first  # the caches left alone
    assert model.caches_are_enabled()
    with disable_kv_cache(model):  # a plain forward of a model with caches (torchtune's decoder needs a mask else)
        assert first == _reference_greedy(model, PROMPTS[1], 6)


def test_stops_at_the_first_stop_token(model):
    free = generate(model, PROMPTS[0], 10, stop_tokens=())
    assert generate(model, PROMPTS[0], 10, stop_tokens=(free[0],)) == []
    stop = free[3]
    first = free.index(stop)
    assert generate(model, PROMPTS[0], 10, stop_tokens=(stop,)) == free[:first]
    # In a batch, each row stops on its own.
    rows = generate_batch(model, PROMPTS, 10, stop_tokens=(stop,))
    for prompt, row in zip(PROMPTS, rows):
        unstopped = generate(model, prompt, 10, stop_tokens=())
        assert row == (unstopped[: unstopped.index(stop)] if stop in unstopped else unstopped)


def test_stop_when_ends_each_prompt_on_its_own(model):
    """``stop_when`` (lm-eval's stop strings) ends one row, keeping its tokens so far; the others go on."""
    full = generate_batch(model, PROMPTS, 8, stop_tokens=None)
    calls = []

    def stop_when(row: int, new_tokens: list[int]) -> bool:
        calls.append((row, len(new_tokens)))
        return row == 1 and len(new_tokens) == 3

    stopped = generate_batch(model, PROMPTS, 8, stop_tokens=None, stop_when=stop_when)
    assert stopped == [full[0], full[1][:3], full[2]]
    assert (1, 4) not in calls and (0, 8) in calls  # a stopped row is not asked again


def test_max_new_tokens_and_max_seq_len(model):
    assert len(generate(model, PROMPTS[0], 7, stop_tokens=())) == 7
    long_prompt = [1] + [5] * 44  # 45 of 48 positions: room for 3 new tokens
    assert len(generate(model, long_prompt, 10, stop_tokens=())) == 3
    with pytest.raises(TuneError, match="max_seq_len"):
        generate(model, [1] * 48, 4)
    with pytest.raises(TuneError, match="empty prompt"):
        generate(model, [], 4)


def test_top_k_1_sampling_is_greedy_and_sampling_is_seeded(model):
    greedy = generate(model, PROMPTS[0], 10, stop_tokens=())
    g = torch.Generator().manual_seed(7)
    assert generate(model, PROMPTS[0], 10, temperature=1.0, top_k=1, stop_tokens=(), generator=g) == greedy
    samples = []
    for _ in range(2):
        g = torch.Generator().manual_seed(7)
        samples.append(generate(model, PROMPTS[0], 10, temperature=2.0, stop_tokens=(), generator=g))
    assert samples[0] == samples[1]
    assert samples[0] != greedy  # at temperature 2 on a 64-token vocabulary a 10-token match is ~impossible


def test_sample_next_token_top_k_support():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0, 3.0]])
    g = torch.Generator().manual_seed(0)
    draws = {int(sample_next_token(logits, temperature=5.0, top_k=2, generator=g)) for _ in range(200)}
    assert draws == {1, 2}
    assert int(sample_next_token(logits)) == 1
    with pytest.raises(ValueError):
        sample_next_token(logits, temperature=-1.0)


@pytest.fixture
def tokenizer():
    from torchtune.modules.tokenizers import SentencePieceTokenizer

    return SentencePieceTokenizer(DEMO_TOKENIZER)


def test_evaluate_exact_match_matches_generate(tokenizer):
    torch.manual_seed(0)
    m = llama2(
        vocab_size=tokenizer.vocab_size, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=128
    ).eval()
    template = AlpacaInstructTemplate()
    examples = [
        {"instruction": "What is 2 plus 3?", "input": "", "output": "5"},
        {"instruction": "Reverse the letters of the word.", "input": "cat", "output": "tac"},
        {"instruction": "Write the word in capital letters.", "input": "dog", "output": "DOG"},
    ]
    acc, results = evaluate_exact_match(m, tokenizer, examples, template, max_new_tokens=4, batch_size=2)
    assert [(p, e) for p, e, _ in results] == [(template.format(x), x["output"]) for x in examples]
    for prompt, _, got in results:
        ids = tokenizer.encode(prompt, add_bos=True, add_eos=False)
        assert got == tokenizer.decode(generate(m, ids, 4, stop_tokens=(tokenizer.eos_id,)))
    assert acc == sum(e.strip() == g.strip() for _, e, g in results) / 3

    # An example whose expected answer is what the model says counts as correct (after strip()).
    rigged = [dict(examples[0], output=" " + results[0][2] + " "), *examples[1:]]
    acc2, _ = evaluate_exact_match(m, tokenizer, rigged, template, max_new_tokens=4)
    assert acc2 == pytest.approx(acc + (results[0][1].strip() != results[0][2].strip()) / 3)


def test_heldout_loss_is_token_weighted_mean(tokenizer):
    torch.manual_seed(0)
    m = llama2(vocab_size=50, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=32)
    data = [
        {"tokens": [1, 4, 5, 6, 2], "labels": [-100, -100, 5, 6, 2]},
        {"tokens": [1, 7, 2], "labels": [1, 7, 2]},
        {"tokens": [1, 9, 9, 9, 9, 9, 2], "labels": [-100, 9, 9, 9, 9, 9, 2]},
    ]
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in data:
            logits = m(torch.tensor([ex["tokens"]]))[0, :-1]
            targets = torch.tensor(ex["labels"][1:])
            total += float(F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum"))
            count += int((targets != -100).sum())
    want = total / count
    for bs in (1, 2, 3):
        assert heldout_loss(m, data, padded_collate, batch_size=bs) == pytest.approx(want, rel=1e-5)
    assert m.training  # the model's mode is restored
