"""Instruction datasets: one prompt and one response per row -> a user and an assistant message."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Union

from torchtune.config._types import checked_by
from torchtune.data._messages import InputOutputToMessages, Message
from torchtune.datasets._build import build_sft_dataset, check_dataset_args
from torchtune.datasets._columns import FieldColumns, as_column_map
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._sft import SFTDataset
from torchtune.datasets._templates import InstructTemplate, TemplateLike, resolve_template
from torchtune.modules.transforms import Transform

__all__ = ["TemplateToMessages", "instruct_dataset"]


class TemplateToMessages(Transform):
    """A row as a user message whose text is ``template.format(row)`` (an ``InstructTemplate``: Alpaca's,
    a format string's) and an assistant message with the template's response column.

    Args:
        template: an ``InstructTemplate``, its class or dotted path, or a format string (``resolve_template``).
        column_map: ``{template field: dataset column}``.
        train_on_input: learn the prompt too (else the user message is masked).
        new_system_prompt: a system message put first (masked).
    """

    def __init__(
        self,
        template: TemplateLike,
        column_map: Optional[Mapping[str, str]] = None,
        train_on_input: bool = False,
        new_system_prompt: Optional[str] = None,
    ) -> None:
        self.template: InstructTemplate = resolve_template(template)
        self.column_map = dict(column_map or {})
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt

    def columns(self) -> FieldColumns:
        """The ``RowCheck`` columns of this transform: the template's fields and its response column."""
        return FieldColumns(
            [*self.template.columns, self.template.response_column],
            self.template.optional_columns,
            self.column_map,
            reader=f"template {self.template!r}",
        )

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        column = lambda field: self.column_map.get(field, field)  # noqa: E731
        fields = [*self.template.columns, *self.template.optional_columns]
        prompt = self.template.format({f: sample[column(f)] for f in fields if column(f) in sample})
        messages = [
            Message(role="user", content=prompt, masked=not self.train_on_input),
            Message(role="assistant", content=sample[column(self.template.response_column)], masked=False),
        ]
        if self.new_system_prompt is not None:
            messages.insert(0, Message(role="system", content=self.new_system_prompt, masked=True))
        return {"messages": messages}


@checked_by(check_dataset_args)
def instruct_dataset(
    tokenizer: Any,
    *,
    source: str,
    column_map: Optional[Dict[str, str]] = None,
    train_on_input: bool = False,
    new_system_prompt: Optional[str] = None,
    packed: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    template: Optional[TemplateLike] = None,
    max_seq_len: Optional[int] = None,
    chat_format: str = "tokenizer",
    best_fit: bool = False,
    **load_dataset_kwargs: Any,
) -> Union[SFTDataset, PackedDataset]:
    """Rows with a prompt and a response: by default (torchtune's) the ``input`` column is the user message
    and ``output`` the assistant's (``InputOutputToMessages``); with ``template`` the user message is the
    template filled from the row (``TemplateToMessages``: Alpaca's, a format string such as
    ``"Question: {question}\\nAnswer:\\n"`` whose response column is ``output``, a dotted path). The
    model tokenizer formats the messages (``chat_format``).

    torchtune's arguments, then this library's (not passed to ``datasets.load_dataset``):

    Args:
        tokenizer: the model tokenizer.
        source: dataset name, file builder (``json`` with ``data_files=...``) or the path of one data file.
        column_map: ``{field: column}``: ``{input: question, output: answer}``; with ``template``, its fields.
        train_on_input: also learn the prompt (default False).
        new_system_prompt: a system message put before each row's messages.
        packed: pack examples into sequences of ``max_seq_len`` tokens.
        filter_fn: keeps the rows for which it returns True, before anything else.
        split: the split to load.
        template: the prompt of each row (see above); None: the ``input`` column as it is.
        max_seq_len: longest example; default the tokenizer's ``max_seq_len``. Also the length of a pack.
        chat_format: ``tokenizer`` (torchtune's), ``chat_template`` or ``plain_text``.
        best_fit: with ``packed``, this library's best-fit packing instead of torchtune's greedy one.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``cache_dir`` ...).

    Raises:
        TuneError: unreadable data, missing columns, a null or non-text field in any row, a template that does
            not resolve, no row with anything to learn, or ``packed`` without a ``max_seq_len``.
    """
    columns = as_column_map(column_map)
    if template is not None:
        transform: Any = TemplateToMessages(template, columns, train_on_input, new_system_prompt)
        fields = transform.columns()
        described = repr(transform.template)
    else:
        fields = FieldColumns(["input", "output"], (), columns, reader="torchtune.data.InputOutputToMessages")
        # torchtune's transform needs both keys in a column_map: the ones not given keep their names
        full = {"input": "input", "output": "output", **columns} if columns else None
        transform = InputOutputToMessages(
            train_on_input=train_on_input, column_map=full, new_system_prompt=new_system_prompt
        )
        described = None
    return build_sft_dataset(
        tokenizer,
        transform,
        source=source,
        columns=fields,
        settings={
            "dataset": "instruct",
            "template": described,
            "column_map": columns,
            "train_on_input": train_on_input,
            "new_system_prompt": new_system_prompt,
        },
        chat_format=chat_format,
        max_seq_len=max_seq_len,
        packed=packed,
        best_fit=best_fit,
        filter_fn=filter_fn,
        split=split,
        load_dataset_kwargs=load_dataset_kwargs,
    )
