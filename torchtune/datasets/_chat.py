"""Chat datasets: conversations (OpenAI ``messages`` or ShareGPT ``conversations``) -> tokens and labels
through the tokenizer's chat format (Llama 3's for ``Llama3Tokenizer``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from torch.utils.data import Dataset

from torchtune._errors import TuneError
from torchtune.config._types import checked_by
from torchtune.datasets._collate import CROSS_ENTROPY_IGNORE_IDX
from torchtune.datasets._loading import describe_source, load_hf_dataset
from torchtune.datasets._rows import CUT_AWAY, EMPTY_REPLY, KeptRows, column_batches, has_targets, truncate

ROLES = ("system", "user", "assistant", "ipython")
# ShareGPT's speaker names -> roles. "ipython" is Llama 3.1's role for tool output.
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
STYLES = ("auto", "openai", "sharegpt")
_COLUMNS = ("messages", "conversations")  # the OpenAI and the ShareGPT column names, looked for in this order
_SHOWN_ERRORS = 5


class ChatTokenizer(Protocol):
    """What a chat dataset needs: a tokenizer with a chat format, i.e. ``tokenize_messages`` (a model
    tokenizer: ``Llama3Tokenizer``, ``Llama2Tokenizer`` with its template, ``HFModelTokenizer``; see
    ``_chat_tokens``)."""

    pad_id: int

    def tokenize_messages(self, messages: Sequence[Any]) -> Tuple[List[int], List[bool]]: ...


class ChatDataset(Dataset):
    """Conversations as ``{"tokens": list[int], "labels": list[int]}``, formatted by the tokenizer.

    Each row holds one conversation, a list of messages in either style:

    - OpenAI: ``{"messages": [{"role": "system" | "user" | "assistant" | "ipython", "content": "..."}]}``;
    - ShareGPT: ``{"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}]}``.

    The column is ``messages`` or ``conversations``, whichever the data has (``conversation_column``
    names another); the style is told from the first message's keys (``conversation_style`` fixes it).
    Every row is checked when the dataset is built, so a malformed conversation stops the run before
    training, with its row number, rather than at the step that reaches it.

    Labels: by default only what the assistant writes is learnt, exactly as the chat template lays it out
    (``tokenizer.message_spans``): each reply from the end of its generation prompt through its
    end-of-turn token (``<|eot_id|>``, ``<|im_end|>``, ``<end_of_turn>`` ...), whitespace included;
    system and user messages, every header and what a template puts after an end-of-turn token are -100
    (``train_on_input=True`` learns every token). Past ``max_seq_len`` tokens (default
    ``tokenizer.max_seq_len``) a conversation is cut, keeping its last token, and that token's label when
    a reply token survives the cut.

    With ``train_on_input=False`` a row with nothing to learn is left out and counted in the log: every
    reply empty (or blank), or, with ``max_seq_len``, the first reply starting past it (finding those
    tokenizes every row once at build time). ``len`` is the number of rows trained on.

    Args:
        tokenizer: a tokenizer with ``tokenize_messages`` (``torchtune.models.llama3.llama3_tokenizer``).
        source: dataset name or builder (``json`` with ``data_files=...``), or the path of one data file.
        conversation_column: the column with the conversations; default ``messages`` or ``conversations``.
        conversation_style: ``auto``, ``openai`` or ``sharegpt``.
        train_on_input: also learn the system/user messages and the headers.
        max_seq_len: longest example in tokens (None: no limit).
        split: the split to load.
        drop_unlabelled: leave out rows with nothing to learn (``PackedDataset`` does it itself, so the
            packed builder passes False).
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``cache_dir``, ...).

    Raises:
        TuneError: a tokenizer without a chat format; no conversation column; a conversation that is not
            a list of messages, a message without its role/content keys, an unknown role, content that is
            not text (null included), or a conversation with no assistant message (nothing to learn) --
            naming the rows; no row with anything to learn.
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        source: str,
        conversation_column: Optional[str] = None,
        conversation_style: str = "auto",
        train_on_input: bool = False,
        max_seq_len: Optional[int] = None,
        split: str = "train",
        drop_unlabelled: bool = True,
        **load_dataset_kwargs: Any,
    ) -> None:
        if not callable(getattr(tokenizer, "tokenize_messages", None)):
            raise TuneError(
                f"dataset._component_ is a chat dataset, which needs a tokenizer with a chat format, but "
                f"{type(tokenizer).__name__} has none. Use the model's tokenizer builder "
                "(tokenizer._component_=torchtune.models.llama3.llama3_tokenizer for Llama 3.x, "
                "torchtune.models.llama2.llama2_tokenizer with its [INST] template for Llama 2), or "
                "instruction data (torchtune.datasets.alpaca_dataset or instruct_dataset)."
            )
        if conversation_style not in STYLES:
            raise TuneError(
                f"dataset.conversation_style={conversation_style!r} is not one of {', '.join(STYLES)}: "
                "'openai' for messages of {role, content}, 'sharegpt' for {from, value}, 'auto' to tell."
            )
        if max_seq_len is None:
            max_seq_len = getattr(tokenizer, "max_seq_len", None)
        if max_seq_len is not None and max_seq_len < 2:
            raise TuneError(f"dataset.max_seq_len must be at least 2, got {max_seq_len}.")
        self._tokenizer = tokenizer
        self.train_on_input = bool(train_on_input)
        self.max_seq_len = max_seq_len
        self.conversation_style = conversation_style
        self._described = describe_source(source, load_dataset_kwargs.get("data_files"))
        self._data = load_hf_dataset(source, split=split, **load_dataset_kwargs)
        self.conversation_column = self._find_column(conversation_column, list(self._data.column_names))
        self._check_all_rows()
        self._kept = KeptRows(len(self._data))
        if drop_unlabelled and not self.train_on_input:
            rows = column_batches(self._data, [self.conversation_column])
            self._kept = KeptRows.scan(rows, len(self._data), self._why_unlabelled, self._described)

    @property
    def dropped(self) -> Dict[str, int]:
        """Rows left out for having nothing to learn, per reason."""
        return self._kept.dropped

    def _why_unlabelled(self, row: Mapping[str, Any]) -> Optional[str]:
        messages = self.to_messages(row[self.conversation_column])
        if not any(m["content"].strip() for m in messages if m["role"] == "assistant"):
            return EMPTY_REPLY
        if self.max_seq_len is not None and not has_targets(self.tokenize_row(row)["labels"]):
            return CUT_AWAY
        return None

    def _find_column(self, column: Optional[str], available: List[str]) -> str:
        if column is not None:
            if column not in available:
                raise TuneError(
                    f"{self._described} has no column '{column}' (config key dataset.conversation_column); its "
                    f"columns are {', '.join(repr(c) for c in available)}."
                )
            return column
        for name in _COLUMNS:
            if name in available:
                return name
        raise TuneError(
            f"{self._described} has no 'messages' (OpenAI style) or 'conversations' (ShareGPT style) column; "
            f"its columns are {', '.join(repr(c) for c in available)}. Name the column that holds the "
            "conversations with dataset.conversation_column=<column> (on the command line "
            "+dataset.conversation_column=<column> when the config has no such key)."
        )

    def _check_all_rows(self) -> None:
        problems: List[str] = []
        count = 0
        for index, row in column_batches(self._data, [self.conversation_column]):
            try:
                self.to_messages(row[self.conversation_column])
            except TuneError as err:
                count += 1
                if len(problems) < _SHOWN_ERRORS:
                    problems.append(f"row {index}: {err}")
        if problems:
            more = f" (and {count - len(problems)} more rows)" if count > len(problems) else ""
            raise TuneError(
                f"{self._described} has malformed conversations in column '{self.conversation_column}': "
                + "; ".join(problems)
                + f"{more}. Each row needs a list of messages, OpenAI style {{role, content}} with roles "
                f"{', '.join(ROLES)}, or ShareGPT style {{from, value}} with from system/human/gpt, and at "
                "least one assistant message. Fix or drop those rows."
            )

    def to_messages(self, conversation: Any) -> List[Dict[str, str]]:
        """``[{"role", "content"}]`` of one row's conversation, in either style; raises ``TuneError``."""
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise TuneError(f"the conversation is {_short(conversation)}, not a non-empty list of messages")
        style = self.conversation_style
        if style == "auto":
            first = conversation[0]
            style = "sharegpt" if isinstance(first, Mapping) and "from" in first and "role" not in first else "openai"
        role_key, content_key = ("from", "value") if style == "sharegpt" else ("role", "content")
        messages = []
        for i, message in enumerate(conversation):
            if not isinstance(message, Mapping) or role_key not in message or content_key not in message:
                raise TuneError(f"message {i} is {_short(message)}, without '{role_key}' and '{content_key}'")
            role, content = message[role_key], message[content_key]
            if style == "sharegpt":
                if role not in SHAREGPT_ROLES:
                    raise TuneError(f"message {i} is from {role!r}; ShareGPT speakers are {', '.join(SHAREGPT_ROLES)}")
                role = SHAREGPT_ROLES[role]
            elif role not in ROLES:
                raise TuneError(f"message {i} has role {role!r}; roles are {', '.join(ROLES)}")
            if not isinstance(content, str):
                raise TuneError(f"message {i} has content {_short(content)}, not text")
            messages.append({"role": role, "content": content})
        if not any(m["role"] == "assistant" for m in messages):
            raise TuneError("the conversation has no assistant message, so there is nothing to learn")
        return messages

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, index: int) -> Dict[str, List[int]]:
        return self.tokenize_row(self._data[self._kept.row(index)])

    def tokenize_row(self, row: Mapping[str, Any]) -> Dict[str, List[int]]:
        """Tokens and labels of one row (see the class docstring)."""
        messages = self.to_messages(row[self.conversation_column])
        tokens, is_assistant = _chat_tokens(self._tokenizer, messages)
        if self.train_on_input:
            labels = list(tokens)
        elif any(m["content"].strip() for m in messages if m["role"] == "assistant"):
            labels = [t if learn else CROSS_ENTROPY_IGNORE_IDX for t, learn in zip(tokens, is_assistant)]
        else:  # only empty replies: nothing to learn, not even to stop
            labels = [CROSS_ENTROPY_IGNORE_IDX] * len(tokens)
        return dict(zip(("tokens", "labels"), truncate(tokens, labels, self.max_seq_len)))


def _chat_tokens(tokenizer: Any, messages: List[Dict[str, str]]) -> Tuple[List[int], List[bool]]:
    """Tokens of one conversation in the tokenizer's chat format, and which of them the model learns.

    Llama 3 and a model folder's own chat template (``HFModelTokenizer``) give the ids of transformers'
    ``apply_chat_template`` and each reply's span from the template's own renders (``message_spans``). Any other model
    tokenizer formats torchtune's way: ``tokenize_messages`` of ``Message`` objects, the non-assistant ones
    masked, learning what its mask leaves unmasked (a turn's own special tokens included).
    """
    if callable(getattr(tokenizer, "message_spans", None)):
        encoded = tokenizer.message_spans(messages)
        return encoded.tokens, encoded.is_assistant
    from torchtune.data import Message

    turns = [Message(m["role"], m["content"], masked=m["role"] != "assistant") for m in messages]
    tokens, mask = tokenizer.tokenize_messages(turns)
    return tokens, [not masked for masked in mask]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_chat_args(key: str, fields: Mapping[str, Any]) -> None:
    # imported here: _instruct imports this module's neighbours, not this one
    from torchtune.datasets._instruct import check_dataset_args

    check_dataset_args(key, fields)


@checked_by(_check_chat_args)
def chat_dataset(
    tokenizer: ChatTokenizer,
    source: str,
    conversation_column: Optional[str] = None,
    conversation_style: str = "auto",
    train_on_input: bool = False,
    max_seq_len: Optional[int] = None,
    packed: bool = False,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Config builder: a ``ChatDataset``, or with ``packed=True`` a ``PackedDataset`` of it (then
    ``max_seq_len`` is required: it is the length of every pack).

    Offline, point it at a local file: ``source: json``, ``data_files: chats.jsonl`` (one conversation
    per line) or the file's path as ``source``.
    """
    if packed and max_seq_len is None and getattr(tokenizer, "max_seq_len", None) is None:
        raise TuneError("dataset.packed=True needs dataset.max_seq_len (the length of each packed sequence).")
    ds = ChatDataset(
        tokenizer,
        source,
        conversation_column=conversation_column,
        conversation_style=conversation_style,
        train_on_input=train_on_input,
        max_seq_len=max_seq_len,
        split=split,
        drop_unlabelled=not packed,  # packing tokenizes every row anyway and leaves those rows out itself
        **load_dataset_kwargs,
    )
    if packed:
        from torchtune.datasets._pack_cache import pack_cache_file
        from torchtune.datasets._packed import PackedDataset

        padding_idx = max(int(tokenizer.pad_id), 0)
        cache_file = pack_cache_file(
            ds._data,
            {
                "conversation_column": ds.conversation_column,
                "conversation_style": ds.conversation_style,
                "train_on_input": ds.train_on_input,
                "max_seq_len": ds.max_seq_len,
            },
            [ds],
            tokenizer,
            max_seq_len=ds.max_seq_len,
            padding_idx=padding_idx,
            split_across_pack=False,
        )
        return PackedDataset(ds, max_seq_len=ds.max_seq_len, padding_idx=padding_idx, cache_file=cache_file)
    return ds
