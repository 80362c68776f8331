"""Instruction templates: how one dataset row becomes a prompt string."""

from __future__ import annotations

import importlib
import string
from typing import Any, Mapping, Tuple, Type, Union

from torchtune._errors import TuneError
from torchtune.data._messages import ALPACA_PROMPT_INPUT, ALPACA_PROMPT_NO_INPUT


class InstructTemplate:
    """Turns a row into a prompt (``instruct_dataset(template=...)``: the user message); the response column is
    the assistant's message.

    Subclasses set ``columns`` (fields the prompt needs), ``optional_columns`` (fields it uses when
    present) and ``response_column`` (the text the model learns to write), and implement ``format``.
    Field names are the template's own; ``column_map`` of ``instruct_dataset`` maps them onto a
    dataset's column names. A subclass must build with no arguments to be named by dotted path.
    """

    columns: Tuple[str, ...] = ()
    optional_columns: Tuple[str, ...] = ()
    response_column: str = "output"

    def format(self, sample: Mapping[str, Any]) -> str:
        """The prompt for ``sample`` (keyed by the template's field names)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__


class AlpacaInstructTemplate(InstructTemplate):
    """Stanford Alpaca's two prompts (from ``tatsu-lab/stanford_alpaca``'s ``train.py``): one with the
    ``input`` field when it is non-empty, one without it otherwise."""

    columns = ("instruction",)
    optional_columns = ("input",)
    response_column = "output"

    PROMPT_INPUT = ALPACA_PROMPT_INPUT
    PROMPT_NO_INPUT = ALPACA_PROMPT_NO_INPUT

    def format(self, sample: Mapping[str, Any]) -> str:
        text_input = sample.get("input")
        if text_input is not None and text_input != "":
            return self.PROMPT_INPUT.format(instruction=sample["instruction"], input=text_input)
        return self.PROMPT_NO_INPUT.format(instruction=sample["instruction"])


class FormatInstructTemplate(InstructTemplate):
    """A prompt from a ``str.format`` string whose ``{fields}`` name the columns it needs, e.g.
    ``FormatInstructTemplate("Question: {question}\\nAnswer:", response_column="answer")``."""

    def __init__(self, template: str, response_column: str = "output") -> None:
        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
        except ValueError as err:
            raise TuneError(
                f"The prompt template {template!r} (config key dataset.template) is not a "
                f"valid format string: {err}. Write fields as {{column}} and a literal brace "
                "as {{ or }}."
            ) from err
        if any(name == "" or not name.isidentifier() for name in fields):
            raise TuneError(
                f"The prompt template {template!r} (config key dataset.template) has a field "
                "that is not a column name; write each field as {column_name}."
            )
        self.template = template
        self.columns = tuple(dict.fromkeys(fields))
        self.response_column = response_column

    def format(self, sample: Mapping[str, Any]) -> str:
        return self.template.format(**{name: sample[name] for name in self.columns})

    def __repr__(self) -> str:
        return f"FormatInstructTemplate({self.template!r}, response_column={self.response_column!r})"


TemplateLike = Union[str, InstructTemplate, Type[InstructTemplate]]


def resolve_template(template: TemplateLike) -> InstructTemplate:
    """An ``InstructTemplate`` from an instance, a class, a dotted path to either (config
    ``dataset.template: torchtune.datasets.AlpacaInstructTemplate``), or a format string (any string
    containing ``{``, e.g. ``"Q: {question}\\nA: "``, whose response column is ``output``)."""
    obj: Any = template
    if isinstance(template, str):
        if "{" in template:
            return FormatInstructTemplate(template)
        obj = _import_dotted(template)
    if isinstance(obj, type) and issubclass(obj, InstructTemplate):
        return obj()
    if isinstance(obj, InstructTemplate):
        return obj
    raise TuneError(
        f"dataset.template must name an InstructTemplate (for example "
        f"torchtune.datasets.AlpacaInstructTemplate) or be a format string such as "
        f"'Question: {{question}}\\nAnswer: '; got {template!r}."
    )


def _import_dotted(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise TuneError(
            f"dataset.template '{path}' is not a dotted path such as "
            "torchtune.datasets.AlpacaInstructTemplate (or a format string with {fields})."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise TuneError(
            f"dataset.template '{path}': cannot import module '{module_name}' ({err}). "
            "Check the spelling, or that the module is on PYTHONPATH."
        ) from err
    try:
        return getattr(module, attr)
    except AttributeError as err:
        raise TuneError(f"dataset.template '{path}': module '{module_name}' has no '{attr}'.") from err
