"""Gemma's tokenizer: its SentencePiece ``tokenizer.model``, or a model folder's ``tokenizer.json``."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from torchtune.config._types import checked_by
from torchtune.data import Message
from torchtune.models._tokenizer_files import folder_tokenizer, is_hf_tokenizer_json
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.transforms import Transform
from torchtune.modules.transforms.tokenizers import ModelTokenizer
from torchtune.modules.transforms.tokenizers._sentencepiece import SentencePieceModelTokenizer


class GemmaTokenizer(SentencePieceModelTokenizer, ModelTokenizer, Transform):
    """Gemma's SentencePiece tokenizer. Messages are tokenized one text piece at a time and joined as their
    text joins, after the prompt template if any; BOS starts each turn, EOS follows each assistant message.

    Args:
        path: the ``tokenizer.model`` (config key ``tokenizer.path``).
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template applied before tokenizing; None for none.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.
    """

    def tokenize_messages(self, messages: List[Message], *, add_eos: bool = True) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of the (templated) messages (mask True = not learnt); ``add_eos=False`` leaves
        out the EOS after assistant messages."""
        return self._tokenize(messages, True, add_eos)


@checked_by(check_tokenizer_args)
def gemma_tokenizer(
    path: str,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
) -> Any:
    """Gemma's tokenizer (torchtune's builder).

    Args:
        path: the SentencePiece ``tokenizer.model`` (a ``GemmaTokenizer``), or a model folder's
            ``tokenizer.json`` (an ``HFModelTokenizer``: the folder's special tokens and chat template).
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
    """
    if is_hf_tokenizer_json(path):
        return folder_tokenizer(path, max_seq_len, prompt_template, None, "gemma_tokenizer")
    from torchtune.data._prompt_templates import _get_prompt_template

    template = _get_prompt_template(prompt_template) if prompt_template is not None else None
    return GemmaTokenizer(path, max_seq_len=max_seq_len, prompt_template=template, truncation_type=truncation_type)
