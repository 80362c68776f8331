"""Our model and tokenizer as an lm-evaluation-harness model: ``TuneLM``, a ``TemplateLM``.

lm-eval asks a model three things: the log-likelihood of a continuation given a context
(multiple-choice tasks such as truthfulqa_mc2), the log-likelihood of a whole text in windows
(perplexity tasks) and a generation up to stop strings. ``TemplateLM`` turns the first into token ids
(context and continuation encoded together and split, so the continuation's first token is the one
it has in running text); this class scores the ids in batches and generates with
``torchtune.generation`` (KV cache, left-padded batches).

Encoding follows what lm-eval's Hugging Face model (``HFLM``) does with a Llama tokenizer, so the
numbers are comparable with published ones: every text starts with BOS, an empty context is BOS
alone, and a text longer than ``max_length`` keeps its last tokens. Nothing is downloaded.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_eval_utils
from lm_eval.api.model import TemplateLM
from torch import nn
from tqdm import tqdm

from torchtune._errors import TuneError
from torchtune.generation import generate_batch

# Continuation positions projected to the vocabulary at once when scoring (bounds the fp32 log-probabilities).
SCORE_CHUNK = 2048
# lm-eval's own default for a task that sets no max_gen_toks (HFLM.max_gen_toks).
DEFAULT_MAX_GEN_TOKS = 256
# Generation keys a task may set that mean nothing more than greedy decoding / sampling with
# temperature and top-k, which is what torchtune.generation does.
_GENERATION_KEYS = {"until", "max_gen_toks", "do_sample", "temperature", "top_k"}


def _special_token_text(tokenizer: Any, token_id: int) -> Optional[str]:
    """The text that ``tokenizer`` reads as ``token_id`` inside a string, or None when no text does.

    Llama 3's tokenizer turns ``<|begin_of_text|>`` in a text into the token; SentencePiece reads ``<s>``
    as three characters, so for Llama 2 there is none (its ``decode`` has no ``skip_special_tokens``).
    """
    if token_id < 0:
        return None
    try:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
    except TypeError:
        return None
    return text or None


class TuneLM(TemplateLM):
    """A torchtune ``TransformerDecoder`` and tokenizer as an lm-eval model.

    Args:
        model: the model, on its device and in its dtype (put in eval mode here).
        tokenizer: a torchtune tokenizer (``encode(text, add_bos=, add_eos=)``, ``decode``, ``bos_id``,
            ``eos_id``, ``pad_id``; Llama 3's also ``stop_tokens``).
        max_seq_length: longest sequence scored or generated from (longer inputs keep their last
            tokens); ``None`` is the model's ``max_seq_len``.
        batch_size: sequences per forward pass.
        seed: seed of the sampler for tasks that sample (greedy tasks never draw from it).

    Raises:
        TuneError: ``max_seq_length`` larger than the model's ``max_seq_len``, or below 2.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        max_seq_length: Optional[int] = None,
        batch_size: int = 8,
        seed: int = 1234,
    ) -> None:
        super().__init__()
        model_max = int(model.max_seq_len)
        if max_seq_length is None:
            max_seq_length = model_max
        if not 2 <= max_seq_length <= model_max:
            raise TuneError(
                f"max_seq_length={max_seq_length} does not fit the model, which reads at most {model_max} tokens "
                f"(its max_seq_len): set max_seq_length to a number from 2 to {model_max}, or null for {model_max}."
            )
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._max_length = int(max_seq_length)
        self._batch_size = int(batch_size)
        weight = next(model.parameters())
        self._device = weight.device
        self._seed = seed
        self._generator = torch.Generator(device=self._device).manual_seed(seed)
        stop_tokens = getattr(tokenizer, "stop_tokens", None) or [tokenizer.eos_id]
        self._stop_tokens = tuple(int(t) for t in stop_tokens)  # Llama 3: EOS and <|eot_id|>
        self._bos_text = _special_token_text(tokenizer, int(tokenizer.bos_id))

    # --- what lm-eval reads ------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self._tokenizer.eos_id)

    @property
    def prefix_token_id(self) -> int:
        # The context of a continuation scored with no context, and the first token of each window of a
        # rolling log-likelihood: BOS, as HFLM uses for a tokenizer that has one.
        bos = int(self._tokenizer.bos_id)
        return bos if bos >= 0 else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return DEFAULT_MAX_GEN_TOKS

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self._tokenizer, "path", type(self._tokenizer).__name__))

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string``: with BOS unless ``add_special_tokens`` is False (as a Llama tokenizer
        in transformers, whose default adds BOS), or it is None and ``string`` already starts with the
        BOS token's text (Llama 3's ``<|begin_of_text|>``, which the tokenizer reads as the token, as
        HFLM does); never EOS."""
        add_bos = add_special_tokens is not False
        if add_special_tokens is None and self._bos_text is not None and string.startswith(self._bos_text):
            add_bos = False
        return self._tokenizer.encode(string, add_bos=add_bos, add_eos=False)

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(tokens))

    # --- scoring -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation tokens), whether every one is the argmax)`` per request.

        Requests run longest first, ``batch_size`` at a time, right-padded: causal attention keeps the
        padding out of every real position. Only the continuation's positions go through the output
        projection, so no ``[batch, seq, vocab]`` logits exist (32000 x 4096 fp32 logits are 0.5 GB a row).
        Sums are taken in float64 (the order of a float32 sum would otherwise show in the 7th digit).
        """
        results: list[Optional[tuple[float, bool]]] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        pad_id = int(self._tokenizer.pad_id)
        with tqdm(total=len(requests), disable=disable_tqdm, desc="Scoring continuations") as pbar:
            for start in range(0, len(order), self._batch_size):
                chunk = order[start : start + self._batch_size]
                rows, conts = [], []
                for i in chunk:
                    _, context, continuation = requests[i]
                    if not context or not continuation:
                        raise ValueError("a scored request needs a non-empty context and continuation")
                    if len(continuation) > self._max_length:
                        raise TuneError(
                            f"A task asks for the likelihood of a {len(continuation)}-token answer, longer than "
                            f"max_seq_length={self._max_length}: raise max_seq_length (up to the model's max_seq_len)."
                        )
                    # The last max_length + 1 tokens; the final one is only predicted, never fed in.
                    rows.append((context + continuation)[-(self._max_length + 1) :][:-1])
                    conts.append(continuation)
                longest = max(len(r) for r in rows)
                tokens = torch.full((len(rows), longest), pad_id, dtype=torch.long, device=self._device)
                for row, ids in enumerate(rows):
                    tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=self._device)
                hidden = self._model(tokens, output_hidden_states=True)
                scores, greedy = self._score_continuations(hidden, rows, conts)
                for i, score, all_greedy in zip(chunk, scores, greedy):
                    results[i] = (score, all_greedy)
                    request_str = requests[i][0]
                    if request_str is not None:  # None: a window of a rolling request, cached per text
                        self.cache_hook.add_partial("loglikelihood", request_str, results[i])
                    pbar.update(1)
        return results  # type: ignore[return-value]

    def _score_continuations(
        self, hidden: torch.Tensor, rows: list[list[int]], conts: list[list[int]]
    ) -> tuple[list[float], list[bool]]:
        """Per row: the summed log-probability of its continuation tokens and whether each is the argmax.

        The continuation positions of every row are gathered and projected together, in pieces of
        ``SCORE_CHUNK`` positions (a 4096-token rolling window of a 32000-token vocabulary is 0.5 GB of
        fp32 log-probabilities a row), and the results come to the host once per batch.
        """
        row_of, position, target = [], [], []
        for row, (ids, cont) in enumerate(zip(rows, conts)):
            row_of += [row] * len(cont)
            position += range(len(ids) - len(cont), len(ids))
            target += cont
        device = hidden.device
        row_of_t = torch.tensor(row_of, dtype=torch.long, device=device)
        position_t = torch.tensor(position, dtype=torch.long, device=device)
        target_t = torch.tensor(target, dtype=torch.long, device=device)
        token_logprob = torch.empty(len(target), dtype=torch.float32, device=device)
        token_greedy = torch.empty(len(target), dtype=torch.bool, device=device)
        for start in range(0, len(target), SCORE_CHUNK):
            piece = slice(start, start + SCORE_CHUNK)
            logprobs = F.log_softmax(self._model.output(hidden[row_of_t[piece], position_t[piece]]).float(), dim=-1)
            token_logprob[piece] = logprobs.gather(-1, target_t[piece].unsqueeze(-1)).squeeze(-1)
            token_greedy[piece] = logprobs.argmax(dim=-1) == target_t[piece]
        scores = torch.zeros(len(rows), dtype=torch.float64, device=device)
        scores.index_add_(0, row_of_t, token_logprob.double())
        misses = torch.zeros(len(rows), dtype=torch.long, device=device)
        misses.index_add_(0, row_of_t, (~token_greedy).long())
        return scores.tolist(), (misses == 0).tolist()

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text, in disjoint windows of ``max_length`` tokens.

        The windows are lm-eval's own (``get_rolling_token_windows``) over ``tok_encode(text)``, which
        starts with BOS, exactly as HFLM scores a text.
        """
        windows: list[tuple[None, list[int], list[int]]] = []
        counts = []
        for (text,) in (req.args for req in requests):
            text_windows = [
                lm_eval_utils.make_disjoint_window(w)
                for w in lm_eval_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            windows.extend((None, context, continuation) for context, continuation in text_windows)
            counts.append(len(text_windows))
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals, pos = [], 0
        for req, count in zip(requests, counts):
            total = sum(score for score, _ in scores[pos : pos + count])
            pos += count
            totals.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", tuple(req.args), total)
        return totals

    # --- generation --------------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each context's continuation, up to the first of its ``until`` strings (cut off), EOS or
        ``max_gen_toks`` tokens. Requests with the same generation settings run in batches, longest
        first; greedy unless the task sets ``do_sample: true``."""
        results: list[Optional[str]] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        with tqdm(total=len(requests), disable=disable_tqdm, desc="Generating") as pbar:
            for indices in groups.values():
                gen_kwargs = dict(requests[indices[0]].args[1])
                until, max_gen_toks, temperature, top_k = self._generation_settings(gen_kwargs)
                max_context = self._max_length - max_gen_toks
                if max_context < 1:
                    raise TuneError(
                        f"The task generates up to {max_gen_toks} tokens (max_gen_toks), which leaves no room for "
                        f"a prompt in max_seq_length={self._max_length}: raise max_seq_length (up to the model's "
                        "max_seq_len)."
                    )
                encoded = {i: self.tok_encode(requests[i].args[0])[-max_context:] for i in indices}
                ordered = sorted(indices, key=lambda i: -len(encoded[i]))
                for start in range(0, len(ordered), self._batch_size):
                    chunk = ordered[start : start + self._batch_size]
                    outputs = generate_batch(
                        self._model,
                        [encoded[i] for i in chunk],
                        max_gen_toks,
                        temperature=temperature,
                        top_k=top_k,
                        stop_tokens=self._stop_tokens,
                        pad_id=int(self._tokenizer.pad_id),
                        generator=self._generator,
                        stop_when=self._stop_at(until) if until else None,
                    )
                    for i, new_tokens in zip(chunk, outputs):
                        text = self.tok_decode(new_tokens)
                        for stop in until:
                            text = text.split(stop)[0]
                        results[i] = text
                        self.cache_hook.add_partial("generate_until", tuple(requests[i].args), text)
                        pbar.update(1)
        return results  # type: ignore[return-value]

    def _stop_at(self, until: list[str]) -> Any:
        """``stop_when`` for ``generate_batch``: a row ends once its text holds one of ``until``."""

        def stop_when(row: int, new_tokens: list[int]) -> bool:
            text = self.tok_decode(new_tokens)
            return any(stop in text for stop in until)

        return stop_when

    def _generation_settings(self, gen_kwargs: dict) -> tuple[list[str], int, float, Optional[int]]:
        """``(until, max_gen_toks, temperature, top_k)`` of a task's ``generation_kwargs``.

        As in transformers' ``generate``, which HFLM calls: greedy unless ``do_sample`` is true;
        sampling defaults to temperature 1.0 and top-k 50.

        Raises:
            TuneError: a setting torchtune's generation does not have (``top_p``, ``num_beams``, ...).
        """
        unknown = sorted(set(gen_kwargs) - _GENERATION_KEYS - {"max_new_tokens"})
        if unknown:
            raise TuneError(
                f"The task's generation_kwargs set {', '.join(unknown)}, which torchtune's generation does not "
                "support (it decodes greedily, or samples with temperature and top_k). Remove them from the task's "
                "YAML (a copy of it, passed in tasks as its path)."
            )
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else [str(u) for u in until]
        until = [u for u in until if u]  # lm-eval ignores an empty stop string too
        max_gen_toks = int(gen_kwargs.get("max_gen_toks", gen_kwargs.get("max_new_tokens", self.max_gen_toks)))
        temperature = float(gen_kwargs.get("temperature", 1.0) or 0.0)
        if not gen_kwargs.get("do_sample", False) or temperature == 0.0:
            return until, max_gen_toks, 0.0, None
        return until, max_gen_toks, temperature, int(gen_kwargs.get("top_k", 50))
