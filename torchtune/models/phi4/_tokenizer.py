"""Phi-4's tokenizer: its ``vocab.json`` + ``merges.txt`` with Phi-4's special tokens, or a model folder's
``tokenizer.json``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchtune._errors import TuneError
from torchtune.config._types import checked_by
from torchtune.data import Message, truncate
from torchtune.models._tokenizer_files import folder_tokenizer, is_hf_tokenizer_json
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.transforms import Transform
from torchtune.modules.transforms.tokenizers import GPT2BaseTokenizer, ModelTokenizer

# Phi-4's special tokens: 100256-100351, <|endofprompt|> at 100276 and dummies filling the rest.
PHI4_SPECIAL_TOKENS: Dict[str, int] = {
    "<|dummy_0|>": 100256,
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|dummy_1|>": 100261,
    "<|dummy_2|>": 100262,
    "<|dummy_3|>": 100263,
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    "<|im_sep|>": 100266,
    "<|endofprompt|>": 100276,
}
PHI4_SPECIAL_TOKENS.update(
    {f"<|dummy_{4 + n}|>": i for n, i in enumerate(i for i in range(100267, 100352) if i != 100276)}
)
_FIRST_SPECIAL, _LAST_SPECIAL = 100_256, 100_351


class Phi4Tokenizer(ModelTokenizer, Transform):
    """Phi-4's tokenizer: GPT-2-style byte-level BPE for text, Phi-4's special tokens for the chat format::

        <|im_start|>system<|im_sep|>{content}<|im_end|><|im_start|>user<|im_sep|>{content}<|im_end|>
        <|im_start|>assistant<|im_sep|>{content}

    (each content without trailing spaces; the assistant's ``<|im_end|>`` only with ``add_eos``). BOS is
    ``<|endoftext|>``, EOS ``<|im_end|>``, padding ``<|dummy_85|>``.

    Args:
        merges_path: the ``merges.txt``.
        vocab_path: the ``vocab.json``.
        special_tokens: ``{text: id}``; None for ``PHI4_SPECIAL_TOKENS``.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template applied before tokenizing; None for none.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.
    """

    def __init__(
        self,
        merges_path: Optional[str] = None,
        vocab_path: Optional[str] = None,
        special_tokens: Optional[Dict[str, int]] = None,
        max_seq_len: Optional[int] = None,
        prompt_template: Optional[Any] = None,
        truncation_type: str = "right",
    ) -> None:
        self.special_tokens = dict(special_tokens or PHI4_SPECIAL_TOKENS)
        self.eos_id = self.special_tokens["<|im_end|>"]
        self.bos_id = self.special_tokens["<|endoftext|>"]
        self.pad_id = self.special_tokens["<|dummy_85|>"]
        self.stop_tokens = [self.eos_id]
        self.max_seq_len = max_seq_len
        self.prompt_template = prompt_template
        self.truncation_type = truncation_type
        self.path = vocab_path
        self.tokenizer_model = GPT2BaseTokenizer(
            vocab_path, merges_path, self.eos_id, self.bos_id, self.eos_id, self.pad_id
        )

    @property
    def vocab_size(self) -> int:
        """Entries of ``vocab.json`` (the special tokens follow them)."""
        return self.tokenizer_model.vocab_size

    @property
    def text_vocab_size(self) -> int:
        """One past the highest id a sample can hold (the special tokens follow ``vocab.json``)."""
        return max([self.vocab_size, *(i + 1 for i in self.special_tokens.values())])

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True, **_: Any) -> List[int]:
        """Token ids of ``text``, BOS / EOS around them on request (other keywords change nothing)."""
        return self.tokenizer_model.encode(text, add_bos=add_bos, add_eos=add_eos)

    def decode(self, ids: List[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (special tokens left out with ``skip_special_tokens``). torchtune's returns
        the list of vocabulary entries instead; this returns the text, as ``BaseTokenizer`` says."""
        names = {i: t for t, i in self.special_tokens.items()}
        pieces, run = [], []
        for i in (int(i) for i in ids):
            if _FIRST_SPECIAL <= i <= _LAST_SPECIAL:
                pieces.append(self.tokenizer_model._bpe.decode(run))
                run = []
                if not skip_special_tokens:
                    pieces.append(names.get(i, ""))
            else:
                run.append(i)
        return "".join(pieces) + self.tokenizer_model._bpe.decode(run)

    def _tokenize_header(self, role: str) -> List[int]:
        im_start, im_sep = self.special_tokens["<|im_start|>"], self.special_tokens["<|im_sep|>"]
        return [im_start] + self.encode(role, add_bos=False, add_eos=False) + [im_sep]

    def tokenize_messages(
        self, messages: List[Message], *, add_eos: bool = False, ignore_system_prompt: bool = False
    ) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of the conversation in Phi-4's format (class docstring); each token's mask is
        its message's ``masked``. ``ignore_system_prompt`` leaves system messages out.

        Raises:
            TuneError: content that is not text.
        """
        if self.prompt_template:
            messages = self.prompt_template(messages)
        tokens: List[int] = []
        mask: List[bool] = []
        masked = False
        for message in messages:
            if ignore_system_prompt and message.role == "system":
                continue
            masked = message.masked
            ids = self._tokenize_header(message.role)
            for piece in message.content:
                if piece["type"] != "text":
                    raise TuneError(f"Unsupported message content type: {piece['type']} (Phi-4 reads text only).")
                ids += self.encode(piece["content"].rstrip(" "), add_bos=False, add_eos=False)
            if message.role != "assistant" or add_eos:
                ids.append(self.special_tokens["<|im_end|>"])
            tokens += ids
            mask += [masked] * len(ids)
            if self.max_seq_len and len(tokens) >= self.max_seq_len and self.truncation_type == "right":
                break
        if self.max_seq_len and len(tokens) >= self.max_seq_len:
            tokens = truncate(tokens, self.max_seq_len, self.eos_id if add_eos else None, self.truncation_type)
            mask = truncate(mask, self.max_seq_len, masked if add_eos else None, self.truncation_type)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask``."""
        messages = sample.pop("messages")
        sample["tokens"], sample["mask"] = self.tokenize_messages(messages)
        return sample


@checked_by(check_tokenizer_args)
def phi4_tokenizer(
    vocab_path: Optional[str] = None,
    merges_path: Optional[str] = None,
    special_tokens_path: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
    path: Optional[str] = None,
) -> Any:
    """Phi-4's tokenizer (torchtune's builder, and this library's ``path``).

    Args:
        vocab_path: the ``vocab.json``; with ``merges_path``, a ``Phi4Tokenizer``.
        merges_path: the ``merges.txt``.
        special_tokens_path: a ``tokenizer.json`` whose ``added_tokens`` give the special tokens; None for
            ``PHI4_SPECIAL_TOKENS``.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
        path: a model folder's ``tokenizer.json`` instead (an ``HFModelTokenizer``: the folder's special
            tokens and chat template, Phi-4-mini's included).

    Raises:
        TuneError: neither ``path`` nor ``vocab_path`` and ``merges_path``, or both kinds.
    """
    if path is not None and (vocab_path is not None or merges_path is not None):
        raise TuneError(
            "tokenizer.path and tokenizer.vocab_path / merges_path are both set: give the model folder's "
            "tokenizer.json as tokenizer.path, or its vocab.json and merges.txt, not both."
        )
    if path is None and vocab_path is not None and merges_path is None and is_hf_tokenizer_json(vocab_path):
        path = vocab_path
    if path is not None:
        return folder_tokenizer(path, max_seq_len, prompt_template, None, "phi4_tokenizer")
    if vocab_path is None or merges_path is None:
        raise TuneError(
            "phi4_tokenizer needs the model's tokenizer files: tokenizer.vocab_path and tokenizer.merges_path "
            "(vocab.json and merges.txt), or tokenizer.path (its tokenizer.json)."
        )
    from torchtune.data._prompt_templates import _get_prompt_template
    from torchtune.modules.transforms.tokenizers import parse_hf_tokenizer_json

    return Phi4Tokenizer(
        vocab_path=vocab_path,
        merges_path=merges_path,
        special_tokens=parse_hf_tokenizer_json(special_tokens_path) if special_tokens_path is not None else None,
        max_seq_len=max_seq_len,
        prompt_template=_get_prompt_template(prompt_template) if prompt_template is not None else None,
        truncation_type=truncation_type,
    )
