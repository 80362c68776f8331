"""Chat datasets: one conversation per row (OpenAI ``messages`` or ShareGPT ``conversations``) -> messages,
formatted by the model tokenizer."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Union

from torchtune._errors import TuneError, TuneValueError
from torchtune.config._types import checked_by
from torchtune.data._messages import _SHAREGPT_ROLES, ROLES, OpenAIToMessages, ShareGPTToMessages
from torchtune.datasets._build import build_sft_dataset, check_dataset_args
from torchtune.datasets._model_transform import has_chat_format
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._rows import TextColumns
from torchtune.datasets._sft import SFTDataset
from torchtune.modules.transforms import Transform

__all__ = ["ConversationToMessages", "chat_dataset"]

STYLES = ("auto", "openai", "sharegpt")
_COLUMNS = ("messages", "conversations")  # the OpenAI and the ShareGPT column names, looked for in this order
_ADVICE = (
    "Each row needs a list of messages, OpenAI style {role, content} with roles "
    + ", ".join(ROLES)
    + ", or ShareGPT style {from, value} with from system/human/gpt, and at least one assistant message, "
    "after a user message. Fix or drop those rows."
)


class ConversationToMessages(Transform):
    """One row's conversation as messages, through torchtune's ``OpenAIToMessages`` (``{role, content}``)
    or ``ShareGPTToMessages`` (``{from, value}``), after checking that it is one: a non-empty list of
    messages with their keys, known roles or speakers, text content, and an assistant message. A row that
    is not gets a ``TuneValueError`` that says what is wrong with it, which the dataset's row check lists by
    row number.

    Args:
        column: the column with the conversations; None: ``messages``, else ``conversations``, whichever
            the data has (``resolve_column``).
        style: ``openai``, ``sharegpt``, or ``auto`` (told per row from the first message's keys).
        train_on_input: learn the system and user messages too.
        new_system_prompt: a system message put first, replacing the row's own.
    """

    def __init__(
        self,
        column: Optional[str] = None,
        style: str = "auto",
        train_on_input: bool = False,
        new_system_prompt: Optional[str] = None,
    ) -> None:
        if style not in STYLES:
            raise TuneValueError(
                f"Unsupported conversation style: dataset.conversation_style={style!r} is not one of "
                f"{', '.join(STYLES)}: 'openai' for messages of {{role, content}}, 'sharegpt' for {{from, value}}, "
                "'auto' to tell them apart."
            )
        self.column = column
        self.style = style
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt

    def resolve_column(self, available: List[str], described: str) -> TextColumns:
        """Set ``column`` from the data's columns (the ``RowCheck.columns`` of a chat dataset); the
        conversations are checked row by row, so no column must hold text.

        Raises:
            TuneError: the column is not there (naming the columns there are).
        """
        if self.column is not None:
            if self.column not in available:
                raise TuneError(
                    f"{described} has no column '{self.column}' (config key dataset.conversation_column); its "
                    f"columns are {', '.join(repr(c) for c in available)}."
                )
            return TextColumns()
        found = next((name for name in _COLUMNS if name in available), None)
        if found is None:
            raise TuneError(
                f"{described} has no 'messages' (OpenAI style) or 'conversations' (ShareGPT style) column; "
                f"its columns are {', '.join(repr(c) for c in available)}. Name the column that holds the "
                "conversations with dataset.conversation_column=<column> (on the command line "
                "+dataset.conversation_column=<column> when the config has no such key)."
            )
        self.column = found
        return TextColumns()

    def _style(self, conversation: List[Any]) -> str:
        if self.style != "auto":
            return self.style
        first = conversation[0]
        return "sharegpt" if isinstance(first, Mapping) and "from" in first and "role" not in first else "openai"

    def check(self, conversation: Any) -> str:
        """The style of ``conversation`` after checking it (class docstring); raises ``TuneValueError``."""
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise TuneValueError(f"the conversation is {_short(conversation)}, not a non-empty list of messages")
        style = self._style(conversation)
        role_key, content_key = ("from", "value") if style == "sharegpt" else ("role", "content")
        roles = []
        for i, message in enumerate(conversation):
            if not isinstance(message, Mapping) or role_key not in message or content_key not in message:
                raise TuneValueError(f"message {i} is {_short(message)}, without '{role_key}' and '{content_key}'")
            role, content = message[role_key], message[content_key]
            if style == "sharegpt":
                if role not in _SHAREGPT_ROLES:
                    raise TuneValueError(
                        f"message {i} is from {role!r}; ShareGPT speakers are {', '.join(_SHAREGPT_ROLES)}"
                    )
                role = _SHAREGPT_ROLES[role]
            elif role not in ROLES:
                raise TuneValueError(f"message {i} has role {role!r}; roles are {', '.join(ROLES)}")
            if not _is_text(content, style):
                raise TuneValueError(f"message {i} has content {_short(content)}, not text")
            roles.append(role)
        if "assistant" not in roles:
            raise TuneValueError("the conversation has no assistant message, so there is nothing to learn")
        return style

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        column = self.column
        if column is None:  # not resolved against the data's columns: this row's
            column = next((name for name in _COLUMNS if name in sample), _COLUMNS[0])
        style = self.check(sample[column])
        if style == "sharegpt":
            transform: Transform = ShareGPTToMessages(
                train_on_input=self.train_on_input,
                column_map={"conversations": column},
                new_system_prompt=self.new_system_prompt,
            )
        else:
            transform = OpenAIToMessages(
                train_on_input=self.train_on_input,
                column_map={"messages": column},
                new_system_prompt=self.new_system_prompt,
            )
        return transform(sample)


def _is_text(content: Any, style: str) -> bool:
    """A string, or (OpenAI style) a list of ``{"type": "text", "text": str}`` pieces."""
    if isinstance(content, str):
        return True
    return (
        style == "openai"
        and isinstance(content, list)
        and all(isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@checked_by(check_dataset_args)
def chat_dataset(
    tokenizer: Any,
    *,
    source: str,
    conversation_column: Optional[str] = None,
    conversation_style: str = "auto",
    train_on_input: bool = False,
    new_system_prompt: Optional[str] = None,
    packed: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    max_seq_len: Optional[int] = None,
    chat_format: str = "tokenizer",
    best_fit: bool = False,
    **load_dataset_kwargs: Any,
) -> Union[SFTDataset, PackedDataset]:
    """Conversations, one per row, formatted by the model tokenizer (``chat_format``): OpenAI style
    ``{"messages": [{"role", "content"}]}`` or ShareGPT style ``{"conversations": [{"from", "value"}]}``.
    By default only the assistant messages are learnt (the others are masked).

    torchtune requires ``conversation_column`` and ``conversation_style``; here they default to the
    ``messages`` or ``conversations`` column and the style each row's first message shows. Every row is
    checked when the dataset is built: a malformed conversation stops the run before the first step, naming
    its row.

    torchtune's arguments, then this library's (not passed to ``datasets.load_dataset``):

    Args:
        tokenizer: the model tokenizer (a chat format: ``tokenize_messages``).
        source: dataset name, file builder (``json`` with ``data_files=...``) or the path of one data file.
        conversation_column: the column with the conversations.
        conversation_style: ``openai``, ``sharegpt`` or ``auto``.
        train_on_input: also learn the system and user messages.
        new_system_prompt: a system message put first, replacing each row's own.
        packed: pack examples into sequences of ``max_seq_len`` tokens.
        filter_fn: keeps the rows for which it returns True, before anything else.
        split: the split to load.
        max_seq_len: longest example; default the tokenizer's ``max_seq_len``. Also the length of a pack.
        chat_format: ``tokenizer`` (torchtune's), ``chat_template`` (the labels of transformers' chat template:
            for Llama 3 the reply and its ``<|eot_id|>``, not its header) or ``plain_text``.
        best_fit: with ``packed``, this library's best-fit packing instead of torchtune's greedy one.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``cache_dir`` ...).

    Raises:
        TuneError: a tokenizer without a chat format (with ``chat_format: tokenizer``); no conversation
            column; malformed conversations (naming the rows); no row with anything to learn; ``packed``
            without a ``max_seq_len``.
    """
    if chat_format == "tokenizer" and not has_chat_format(tokenizer):
        raise TuneError(
            f"dataset._component_ is a chat dataset, which needs a tokenizer with a chat format, but "
            f"{type(tokenizer).__name__} has none. Use the model's tokenizer builder "
            "(tokenizer._component_=torchtune.models.llama3.llama3_tokenizer for Llama 3.x, "
            "torchtune.models.llama2.llama2_tokenizer with its [INST] template for Llama 2), "
            "dataset.chat_format=plain_text for the texts joined as they are, or instruction data "
            "(torchtune.datasets.alpaca_dataset or instruct_dataset)."
        )
    transform = ConversationToMessages(conversation_column, conversation_style, train_on_input, new_system_prompt)
    return build_sft_dataset(
        tokenizer,
        transform,
        source=source,
        columns=transform.resolve_column,
        settings={
            "dataset": "chat",
            "conversation_column": conversation_column,
            "conversation_style": conversation_style,
            "train_on_input": train_on_input,
            "new_system_prompt": new_system_prompt,
        },
        chat_format=chat_format,
        max_seq_len=max_seq_len,
        packed=packed,
        best_fit=best_fit,
        filter_fn=filter_fn,
        split=split,
        advice=_ADVICE,
        load_dataset_kwargs=load_dataset_kwargs,
    )
