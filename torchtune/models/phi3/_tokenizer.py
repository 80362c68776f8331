"""Phi-3 mini's tokenizer: its SentencePiece ``tokenizer.model`` with Phi-3's special tokens, or a model
folder's ``tokenizer.json``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchtune._errors import TuneError, TuneValueError
from torchtune.config._types import checked_by
from torchtune.data import Message, truncate
from torchtune.models._tokenizer_files import folder_tokenizer, is_hf_tokenizer_json
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.transforms import Transform
from torchtune.modules.transforms.tokenizers import ModelTokenizer
from torchtune.modules.transforms.tokenizers._sentencepiece import SentencePieceTokenizer

# Phi-3's added tokens, after the 32000 pieces of its SentencePiece model (up to 32064 in the embedding).
PHI3_SPECIAL_TOKENS: Dict[str, int] = {
    "<|endoftext|>": 32000,
    "<|assistant|>": 32001,
    "<|placeholder1|>": 32002,
    "<|placeholder2|>": 32003,
    "<|placeholder3|>": 32004,
    "<|placeholder4|>": 32005,
    "<|system|>": 32006,
    "<|end|>": 32007,
    "<|placeholder5|>": 32008,
    "<|placeholder6|>": 32009,
    "<|user|>": 32010,
}
_ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
_FIRST_ADDED, _LAST_ADDED = 32_000, 32_064


class Phi3MiniTokenizer(SentencePieceTokenizer, ModelTokenizer, Transform):
    """Phi-3 mini's tokenizer: SentencePiece for text, Phi-3's special tokens for the chat format::

        <s><|system|>\\n{content}<|end|>\\n<|user|>\\n{content}<|end|>\\n<|assistant|>\\n{content}<|end|>\\n

    (each content without its trailing spaces); with ``add_eos``, ``<|endoftext|>`` after each assistant
    message and ``<s>`` before the next turn. EOS and padding are ``<|endoftext|>``.

    Args:
        path: the ``tokenizer.model`` (config key ``tokenizer.path``).
        special_tokens: ``{text: id}``; None for ``PHI3_SPECIAL_TOKENS``.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template applied before tokenizing; None for none.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.
    """

    def __init__(
        self,
        path: str,
        special_tokens: Optional[Dict[str, int]] = None,
        max_seq_len: Optional[int] = None,
        prompt_template: Optional[Any] = None,
        truncation_type: str = "right",
    ) -> None:
        super().__init__(path, max_seq_len=max_seq_len)
        self.special_tokens = dict(special_tokens if special_tokens is not None else PHI3_SPECIAL_TOKENS)
        missing = [t for t in ("<|endoftext|>", "<|end|>", *_ROLE_TOKENS.values()) if t not in self.special_tokens]
        if missing:
            raise TuneValueError(f"{', '.join(missing)} missing from special_tokens: Phi-3's chat format needs them.")
        self.eos_id = self.special_tokens["<|endoftext|>"]
        self.pad_id = self.special_tokens["<|endoftext|>"]
        self.stop_tokens = [self.eos_id]
        self.prompt_template = prompt_template
        self.truncation_type = truncation_type
        self._special_text = {i: t for t, i in self.special_tokens.items()}

    @property
    def text_vocab_size(self) -> int:
        """One past the highest id a sample can hold: ``vocab_size`` counts only the SentencePiece pieces
        (torchtune's), the special tokens come after them."""
        return max([self.vocab_size, *(i + 1 for i in self.special_tokens.values())])

    def decode(self, ids: List[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; Phi-3's added ids (32000-32064) are left out, or written as their text with
        ``skip_special_tokens=False``."""
        pieces, run = [], []
        for i in (int(i) for i in ids):
            if _FIRST_ADDED <= i <= _LAST_ADDED or i in self._special_text:
                pieces.append(super().decode(run))
                run = []
                if not skip_special_tokens:
                    pieces.append(self._special_text.get(i, ""))
            else:
                run.append(i)
        return "".join(pieces) + super().decode(run)

    def tokenize_messages(
        self, messages: List[Message], *, add_eos: bool = False, ignore_system_prompt: bool = False
    ) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of the conversation in Phi-3's format (class docstring); each token's mask is
        its message's ``masked``. ``ignore_system_prompt`` leaves system messages out.

        Raises:
            TuneError: a role other than system, user and assistant, or content that is not text.
        """
        if self.prompt_template is not None:
            messages = self.prompt_template(messages)
        newline = self.encode("\n", add_bos=False, add_eos=False)
        tokens: List[int] = []
        mask: List[bool] = []
        turn_starts = True
        masked = False
        for message in messages:
            if ignore_system_prompt and message.role == "system":
                continue
            if message.role not in _ROLE_TOKENS:
                raise TuneError(
                    f"Unknown role '{message.role}' for message: '{message.text_content}'; Phi-3's roles are system, "
                    "user and assistant."
                )
            masked = message.masked
            ids = [self.bos_id] if turn_starts else []
            ids += [self.special_tokens[_ROLE_TOKENS[message.role]]] + newline
            for piece in message.content:
                if piece["type"] != "text":
                    raise TuneError(f"Unsupported message content type: {piece['type']} (Phi-3 reads text only).")
                # The leading space is always trimmed, as Phi-3's Hugging Face tokenizer does.
                ids += self.encode(
                    piece["content"].rstrip(" "), add_bos=False, add_eos=False, trim_leading_whitespace=True
                )
            ids += [self.special_tokens["<|end|>"]] + newline
            turn_starts = message.role == "assistant" and add_eos
            if turn_starts:
                ids.append(self.eos_id)
            tokens += ids
            mask += [masked] * len(ids)
            if self.max_seq_len and len(tokens) >= self.max_seq_len and self.truncation_type == "right":
                break
        if self.max_seq_len and len(tokens) >= self.max_seq_len:
            end = self.eos_id if add_eos else None
            tokens = truncate(tokens, self.max_seq_len, end, self.truncation_type)
            mask = truncate(mask, self.max_seq_len, masked if add_eos else None, self.truncation_type)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask``."""
        messages = sample.pop("messages")
        sample["tokens"], sample["mask"] = self.tokenize_messages(messages)
        return sample


@checked_by(check_tokenizer_args)
def phi3_mini_tokenizer(
    path: str,
    special_tokens_path: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
) -> Any:
    """Phi-3 mini's tokenizer (torchtune's builder).

    Args:
        path: the SentencePiece ``tokenizer.model`` (a ``Phi3MiniTokenizer``), or a model folder's
            ``tokenizer.json`` (an ``HFModelTokenizer``: the folder's special tokens and chat template).
        special_tokens_path: a ``tokenizer.json`` whose ``added_tokens`` give the special tokens; None for
            ``PHI3_SPECIAL_TOKENS``.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
    """
    if is_hf_tokenizer_json(path):
        return folder_tokenizer(path, max_seq_len, prompt_template, None, "phi3_mini_tokenizer")
    from torchtune.data._prompt_templates import _get_prompt_template
    from torchtune.modules.transforms.tokenizers import parse_hf_tokenizer_json

    return Phi3MiniTokenizer(
        path,
        special_tokens=parse_hf_tokenizer_json(special_tokens_path) if special_tokens_path is not None else None,
        max_seq_len=max_seq_len,
        prompt_template=_get_prompt_template(prompt_template) if prompt_template is not None else None,
        truncation_type=truncation_type,
    )
