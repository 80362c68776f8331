"""Text generation with a KV cache, and the two measurements the demo reports.

* :func:`generate` / :func:`generate_batch`: greedy decoding (``temperature=0``) or sampling with
  temperature and top-k from a seeded ``torch.Generator``; each prompt stops at its first stop token.
* :func:`evaluate_exact_match`: generate a response for every example of an instruction data set and
  compare it, whitespace-trimmed, with the expected one.
* :func:`heldout_loss`: the token-weighted mean cross-entropy over a data set's labelled tokens.

Batches are left-padded so that every prompt ends in the same cache slot and one decode step serves
the whole batch. Rotary embeddings depend only on the distance between positions, so the shift that
left padding gives a prompt does not change its attention scores; the padded slots are masked out.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from torchtune._errors import TuneError
from torchtune.modules.common_utils import disable_kv_cache
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

LLAMA2_EOS_ID = 2

Prompt = Union[Sequence[int], torch.Tensor]


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """The next token of each row of ``logits`` (``[b, vocab]``) -> ``Long[b]``.

    ``temperature == 0`` is greedy (argmax). Otherwise the logits are divided by ``temperature``,
    restricted to the ``top_k`` most likely tokens when ``top_k`` is set, and sampled with
    ``generator`` (a seeded ``torch.Generator`` makes the samples reproducible).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth_best = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "kv_cache")]


@contextlib.contextmanager
def _kv_cache(model: nn.Module, batch_size: int, dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """KV caches for one generation call, removed again afterwards.

    A model whose caches the caller has set up (large enough) keeps them, reset. Otherwise caches are
    allocated here and taken down on exit, because a model left with caches would treat its next
    training forward pass as a decoding step.
    """
    caller_caches = [m.kv_cache for m in _attention_modules(model)]
    if model.caches_are_enabled() and all(c is not None and c.batch_size >= batch_size for c in caller_caches):
        model.reset_caches()
        yield
        return
    model.setup_caches(batch_size, dtype=dtype, device=device)
    try:
        yield
    finally:
        for module, cache in zip(_attention_modules(model), caller_caches):
            module.kv_cache = cache
            module.cache_enabled = cache is not None


def _as_token_list(prompt: Prompt) -> list[int]:
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() == 2 and prompt.size(0) == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ValueError(f"a prompt tensor must be 1-d (or [1, s]), got shape {tuple(prompt.shape)}")
        return [int(t) for t in prompt.tolist()]
    return [int(t) for t in prompt]


def _model_dtype_device(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    weight = next(model.parameters())
    return weight.dtype, weight.device


@torch.no_grad()
def generate_batch(
    model: nn.Module,
    prompts: Sequence[Prompt],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    stop_tokens: Optional[Sequence[int]] = (LLAMA2_EOS_ID,),
    pad_id: int = 0,
    generator: Optional[torch.Generator] = None,
    use_cache: bool = True,
    stop_when: Optional[Callable[[int, list[int]], bool]] = None,
) -> list[list[int]]:
    """Continue every prompt of ``prompts``; returns the new tokens of each (the stop token excluded).

    Args:
        model: a ``TransformerDecoder`` (anything with ``setup_caches`` / ``forward(tokens, mask=,
            input_pos=)`` and a ``max_seq_len``).
        prompts: token ids per prompt (lists or 1-d tensors), usually starting with BOS.
        max_new_tokens: most tokens to add to each prompt (fewer when ``max_seq_len`` is reached).
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_k: sample only among the ``top_k`` most likely tokens.
        stop_tokens: a prompt's generation ends at the first of these (Llama2's EOS by default).
        pad_id: token id written into padded slots (never attended to).
        generator: random source for sampling; seed it for reproducible samples.
        use_cache: decode with a KV cache (one token per step); ``False`` recomputes the whole
            sequence every step (slow; the reference the cached path is tested against).
        stop_when: ``stop_when(i, new_tokens)`` is called after each token added to prompt ``i``;
            ``True`` ends that prompt, keeping the tokens so far (stop *strings*, e.g. lm-eval's
            ``until``, which can end inside a token: the caller cuts the decoded text).

    Raises:
        TuneError: a prompt is empty or does not fit in the model's ``max_seq_len``.
    """
    token_lists = [_as_token_list(p) for p in prompts]
    if not token_lists:
        return []
    if any(len(t) == 0 for t in token_lists):
        raise TuneError("Cannot generate from an empty prompt: encode it with the BOS token (add_bos=True).")
    max_seq_len = int(model.max_seq_len)
    longest = max(len(t) for t in token_lists)
    if longest >= max_seq_len:
        raise TuneError(
            f"The prompt has {longest} tokens, but the model reads at most {max_seq_len} "
            f"(its max_seq_len), leaving no room for an answer. Shorten the prompt."
        )
    steps = min(max_new_tokens, max_seq_len - longest)
    dtype, device = _model_dtype_device(model)
    bsz = len(token_lists)
    pad_lens = torch.tensor([longest - len(t) for t in token_lists], device=device)
    tokens = torch.full((bsz, longest), pad_id, dtype=torch.long, device=device)
    for i, ids in enumerate(token_lists):
        tokens[i, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long, device=device)
    stops = torch.tensor(sorted(set(stop_tokens or ())), dtype=torch.long, device=device)
    slots = torch.arange(max_seq_len, device=device)

    def may_attend(query_slots: torch.Tensor, num_keys: int) -> torch.Tensor:
        """Bool ``[b, q, num_keys]``: causal, padded slots hidden (each padded slot sees itself, so
        its softmax row is never empty: an empty row gives NaN, and NaN times a zero weight is NaN)."""
        keys = slots[:num_keys].view(1, 1, -1)
        q = query_slots.view(1, -1, 1)
        real_key = keys >= pad_lens.view(-1, 1, 1)
        return (keys <= q) & (real_key | (keys == q))

    was_training = model.training
    model.eval()
    out: list[list[int]] = [[] for _ in range(bsz)]
    done = torch.zeros(bsz, dtype=torch.bool, device=device)
    if use_cache:
        cache = _kv_cache(model, bsz, dtype, device)
    elif model.caches_are_enabled():  # the caller's caches stay as they are, unused
        cache = disable_kv_cache(model)
    else:
        cache = contextlib.nullcontext()
    try:
        with cache:
            seq = tokens
            prompt_slots = slots[:longest]
            if use_cache:
                logits = model(
                    tokens, mask=may_attend(prompt_slots, max_seq_len), input_pos=prompt_slots.expand(bsz, longest)
                )
            else:
                logits = model(
                    tokens, mask=may_attend(prompt_slots, longest), input_pos=prompt_slots.expand(bsz, longest)
                )
            for step in range(steps):
                next_tokens = sample_next_token(
                    logits[:, -1], temperature=temperature, top_k=top_k, generator=generator
                )
                done = done | torch.isin(next_tokens, stops)
                for i in range(bsz):
                    if not done[i]:
                        out[i].append(int(next_tokens[i]))
                        if stop_when is not None and stop_when(i, out[i]):
                            done[i] = True
                if bool(done.all()) or step == steps - 1:
                    break
                next_tokens = next_tokens.masked_fill(done, pad_id).view(bsz, 1)
                slot = longest + step
                if use_cache:
                    logits = model(
                        next_tokens,
                        mask=may_attend(slots[slot : slot + 1], max_seq_len),
                        input_pos=slots[slot : slot + 1].expand(bsz, 1),
                    )
                else:
                    seq = torch.cat([seq, next_tokens], dim=1)
                    logits = model(
                        seq,
                        mask=may_attend(slots[: slot + 1], slot + 1),
                        input_pos=slots[: slot + 1].expand(bsz, slot + 1),
                    )
    finally:
        model.train(was_training)
    return out


def generate(
    model: nn.Module,
    prompt_tokens: Prompt,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    stop_tokens: Optional[Sequence[int]] = (LLAMA2_EOS_ID,),
    pad_id: int = 0,
    generator: Optional[torch.Generator] = None,
    use_cache: bool = True,
) -> list[int]:
    """Continue one prompt; returns the new tokens (the stop token excluded).

    Arguments as for :func:`generate_batch`, with one prompt (``list[int]`` or a 1-d tensor).
    """
    return generate_batch(
        model,
        [prompt_tokens],
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        stop_tokens=stop_tokens,
        pad_id=pad_id,
        generator=generator,
        use_cache=use_cache,
    )[0]


def evaluate_exact_match(
    model: nn.Module,
    tokenizer: Any,
    examples: Sequence[Mapping[str, Any]],
    template: Any,
    max_new_tokens: int = 16,
    *,
    batch_size: int = 32,
) -> tuple[float, list[tuple[str, str, str]]]:
    """Greedy-decode every example's prompt and compare the answer with the expected response.

    Args:
        model: the model to evaluate (put back in its training mode afterwards).
        tokenizer: a ``SentencePieceTokenizer`` (``encode``, ``decode``, ``eos_id``, ``pad_id``).
        examples: rows such as those of the demo's ``heldout.json`` (``{"instruction", "input",
            "output"}`` for the Alpaca template).
        template: an ``InstructTemplate`` (e.g. ``AlpacaInstructTemplate()``); its ``format(row)`` is the
            prompt and ``row[template.response_column]`` the expected answer.
        max_new_tokens: longest answer generated.
        batch_size: prompts decoded together.

    Returns:
        ``(accuracy, [(prompt, expected, got), ...])``; answers match when equal after stripping
        surrounding whitespace.
    """
    response_column = getattr(template, "response_column", "output")
    prompts = [template.format(row) for row in examples]
    expected = [str(row[response_column]) for row in examples]
    results: list[tuple[str, str, str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        ids = [tokenizer.encode(p, add_bos=True, add_eos=False) for p in chunk]
        stop_tokens = tuple(getattr(tokenizer, "stop_tokens", (tokenizer.eos_id,)))  # Llama 3: EOS and EOT
        outputs = generate_batch(model, ids, max_new_tokens, stop_tokens=stop_tokens, pad_id=tokenizer.pad_id)
        for prompt, want, got in zip(chunk, expected[start : start + batch_size], outputs):
            results.append((prompt, want, tokenizer.decode(got)))
    correct = sum(want.strip() == got.strip() for _, want, got in results)
    return (correct / len(results) if results else 0.0), results


@torch.no_grad()
def heldout_loss(
    model: nn.Module,
    dataset: Sequence[Mapping[str, Any]],
    collate_fn: Optional[Callable[[list], Mapping[str, torch.Tensor]]] = None,
    *,
    batch_size: int = 16,
) -> float:
    """Mean next-token cross-entropy over every labelled token (label != -100) of ``dataset``.

    ``dataset`` items are ``{"tokens", "labels"}`` aligned position by position, as ``SFTDataset``
    gives them; the shift (position ``t`` predicts label ``t + 1``) happens here, as in the recipe.
    Token-weighted, so the value does not depend on ``batch_size``. ``collate_fn`` defaults to
    ``torchtune.datasets.padded_collate``.
    """
    if collate_fn is None:
        from torchtune.datasets import padded_collate as collate_fn
    _, device = _model_dtype_device(model)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, len(dataset), batch_size):
            batch = collate_fn([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
            tokens, labels = batch["tokens"].to(device), batch["labels"].to(device)
            kwargs = {k: batch[k].to(device) for k in ("mask", "input_pos") if k in batch}
            logits = model(tokens, **kwargs)[:, :-1]
            targets = labels[:, 1:]
            total += float(
                F.cross_entropy(
                    logits.reshape(-1, logits.size(-1)).float(),
                    targets.reshape(-1),
                    ignore_index=CROSS_ENTROPY_IGNORE_IDX,
                    reduction="sum",
                )
            )
            count += int((targets != CROSS_ENTROPY_IGNORE_IDX).sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise TuneError("The held-out data set has no labelled tokens to compute a loss on.")
    return total / count
