"""Llama 2's tokenizer: its SentencePiece model, with the ``[INST]`` chat template by default."""

from __future__ import annotations

from typing import Any, Optional

from torchtune.config._types import checked_by
from torchtune.models.llama2._prompt_template import Llama2ChatTemplate
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.transforms import Transform
from torchtune.modules.transforms.tokenizers import ModelTokenizer
from torchtune.modules.transforms.tokenizers._sentencepiece import SentencePieceModelTokenizer

# The default template, one shared instance (it holds no state).
_CHAT_TEMPLATE = Llama2ChatTemplate()


class Llama2Tokenizer(SentencePieceModelTokenizer, ModelTokenizer, Transform):
    """Llama 2's SentencePiece tokenizer. Llama 2 registers no chat tokens: ``[INST]`` and ``<<SYS>>`` are
    text a prompt template adds (``Llama2ChatTemplate`` by default). Messages are tokenized one text
    piece at a time and joined as their text joins; BOS starts each turn, EOS follows each assistant
    message. ``pad_id`` is 0 (Llama 2 has no pad token; padded labels are ignored).

    ``encode(text, add_bos=True, add_eos=True, trim_leading_whitespace=False)`` is what the instruction
    datasets use; it is not affected by the template.

    Args:
        path: the ``tokenizer.model`` (config key ``tokenizer.path``).
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template applied before tokenizing; None for none.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.

    Raises:
        TuneError: the file is missing, a folder, or not a SentencePiece model.
    """

    def __init__(
        self,
        path: str,
        max_seq_len: Optional[int] = None,
        prompt_template: Optional[Any] = _CHAT_TEMPLATE,
        truncation_type: str = "right",
    ) -> None:
        super().__init__(
            path, max_seq_len=max_seq_len, prompt_template=prompt_template, truncation_type=truncation_type
        )


@checked_by(check_tokenizer_args)
def llama2_tokenizer(
    path: str,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = "torchtune.models.llama2.Llama2ChatTemplate",
    truncation_type: str = "right",
) -> Llama2Tokenizer:
    """Llama 2's tokenizer (torchtune's builder).

    Args:
        path: the ``tokenizer.model`` file (config key ``tokenizer.path``).
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None for none (chat data
            is then tokenized as its plain text). The instruction datasets (``alpaca_dataset``,
            ``instruct_dataset``) format their own prompts and are not affected.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
    """
    from torchtune.data._prompt_templates import _get_prompt_template

    template = _get_prompt_template(prompt_template) if prompt_template is not None else None
    return Llama2Tokenizer(path, max_seq_len=max_seq_len, prompt_template=template, truncation_type=truncation_type)
