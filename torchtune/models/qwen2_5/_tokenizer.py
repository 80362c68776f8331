"""Qwen2.5's tokenizer: Qwen2's, with Qwen2.5's special tokens and its tool-call format."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from torchtune.config._types import checked_by
from torchtune.data import Message
from torchtune.models.qwen2._tokenizer import (
    DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE,
    ENDOFTEXT,
    IM_END,
    QWEN2_SPECIAL_TOKENS,
    Qwen2Tokenizer,
    build_qwen_tokenizer,
)
from torchtune.modules.tokenizers._checks import check_tokenizer_args

QWEN2_5_SPECIAL_TOKENS: Dict[str, int] = {
    **QWEN2_SPECIAL_TOKENS,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
}


class Qwen2_5Tokenizer(Qwen2Tokenizer):  # noqa: N801
    """Qwen2.5's tokenizer: ``Qwen2Tokenizer`` with Qwen2.5's special tokens and its tool calls. An
    assistant tool call (``ipython=True``) is wrapped in ``<tool_call>\\n ... \\n</tool_call>``; tool outputs
    (role ``ipython``) go into one user turn, each in ``<tool_response>\\n ... \\n</tool_response>``.

    Args: as ``Qwen2Tokenizer``, with ``special_tokens`` defaulting to ``QWEN2_5_SPECIAL_TOKENS``.
    """

    def __init__(
        self,
        path: str,
        merges_file: str,
        special_tokens: Dict[str, int] = QWEN2_5_SPECIAL_TOKENS,
        max_seq_len: Optional[int] = None,
        *,
        prompt_template: Optional[Any] = None,
        errors: str = "replace",
        unk_token: Optional[str] = None,
        bos_token: Optional[str] = None,
        eos_token: str = IM_END,
        pad_token: Optional[str] = ENDOFTEXT,
        bpe_cache_size: int = DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE,
        truncation_type: str = "right",
    ) -> None:
        super().__init__(
            path,
            merges_file,
            special_tokens,
            max_seq_len,
            prompt_template=prompt_template,
            errors=errors,
            unk_token=unk_token,
            bos_token=bos_token,
            eos_token=eos_token,
            pad_token=pad_token,
            bpe_cache_size=bpe_cache_size,
            truncation_type=truncation_type,
        )
        self.tool_call_start_id = self._special_id("<tool_call>", "tool calls")
        self.tool_call_end_id = self._special_id("</tool_call>", "tool calls")

    def _text(self, text: str) -> List[int]:
        return self.encode(text, add_bos=False, add_eos=False)

    def _message_ids(self, messages: List[Message], i: int) -> List[int]:
        message = messages[i]
        if message.role == "ipython":
            first = i == 0 or messages[i - 1].role != "ipython"
            last = i == len(messages) - 1 or messages[i + 1].role != "ipython"
            ids = (
                (self._start("user") + self._text("<tool_response>\n")) if first else self._text("\n<tool_response>\n")
            )
            ids += self._body(message) + self._text("\n</tool_response>")
            return ids + (self._end() if last else [])
        ids = self._start(message.role)
        tool_call = message.role == "assistant" and message.ipython
        if tool_call:
            ids += [self.tool_call_start_id] + self._text("\n")
        ids += self._body(message)
        if tool_call:
            ids += self._text("\n") + [self.tool_call_end_id]
        if message.role != "assistant" or i != len(messages) - 1:
            ids += self._end()
        return ids


@checked_by(check_tokenizer_args)
def qwen2_5_tokenizer(
    path: str,
    merges_file: Optional[str] = None,
    special_tokens_path: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
    *,
    errors: str = "replace",
    unk_token: Optional[str] = None,
    bos_token: Optional[str] = None,
    eos_token: str = IM_END,
    pad_token: Optional[str] = ENDOFTEXT,
    bpe_cache_size: int = DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE,
) -> Any:
    """Qwen2.5's tokenizer (torchtune's builder).

    Args:
        path: the ``vocab.json`` (with ``merges_file``: a ``Qwen2_5Tokenizer``), or a model folder's
            ``tokenizer.json`` (an ``HFModelTokenizer``: the folder's special tokens and chat template, e.g.
            Qwen2.5 Instruct's default system prompt).
        merges_file: the ``merges.txt``.
        special_tokens_path: a ``tokenizer.json`` whose ``added_tokens`` give the special tokens; None for
            ``QWEN2_5_SPECIAL_TOKENS``.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
        errors, unk_token, bos_token, eos_token, pad_token, bpe_cache_size: ``Qwen2_5Tokenizer``'s (torchtune
            passes them as ``**kwargs``).
    """
    options = dict(
        errors=errors,
        unk_token=unk_token,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        bpe_cache_size=bpe_cache_size,
    )
    return build_qwen_tokenizer(
        Qwen2_5Tokenizer,
        QWEN2_5_SPECIAL_TOKENS,
        "qwen2_5_tokenizer",
        path,
        merges_file,
        special_tokens_path,
        max_seq_len,
        prompt_template,
        truncation_type,
        options,
    )
