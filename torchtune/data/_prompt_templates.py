"""Prompt templates: text put around each message's content, by role, before a model tokenizer tokenizes
it (as ordinary text, never as special tokens). A model's own tokens (Llama 3's headers, Qwen's
``<|im_start|>``) are the tokenizer's business; a template adds words such as ``[INST]`` or ``Question:``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple, Union

from torchtune._errors import TuneValueError
from torchtune.data._messages import Message, Role

_TemplateType = Union[str, Dict[Role, Tuple[str, str]]]
"""What a tokenizer builder's ``prompt_template`` takes: the dotted path of a template class, or
``{role: (text before, text after)}``."""


class PromptTemplateInterface(Protocol):
    """A prompt template: ``template`` maps a role to the text put before and after its content, and
    calling it formats a conversation (``inference=True`` when the last message is to be generated)."""

    template: Dict[Role, Tuple[str, str]]

    def __call__(self, messages: List[Message], inference: bool = False) -> List[Message]:
        """The messages with the template's text around their content."""
        ...


def _with_tags(message: Message, before: Optional[str], after: Optional[str]) -> Message:
    """A copy of ``message`` (same flags) with ``before`` / ``after`` as extra text pieces around its content."""
    content = list(message.content)
    if before:
        content.insert(0, {"type": "text", "content": before})
    if after:
        content.append({"type": "text", "content": after})
    return Message(role=message.role, content=content, masked=message.masked, ipython=message.ipython, eot=message.eot)


class PromptTemplate(PromptTemplateInterface):
    """A template from ``{role: (text before, text after)}``; roles it does not name are left as they are.

    Example: ``PromptTemplate({"user": ("Question: ", "\\n\\nAnswer: ")})``. Text around an assistant
    message is learnt with it; put what must precede the answer but not be learnt after the user message.

    Args:
        template: the tags per role; an empty string adds nothing.
    """

    def __init__(self, template: Dict[Role, Tuple[str, str]]) -> None:
        self.template = template

    def __call__(self, messages: List[Message], inference: bool = False) -> List[Message]:
        """New messages with each role's tags around the content."""
        return [_with_tags(message, *(self.template.get(message.role) or (None, None))) for message in messages]


class ChatMLTemplate(PromptTemplateInterface):
    """OpenAI's Chat Markup Language as text: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message. A
    final assistant message with no text gets only its opening tag, so generation continues from there."""

    template = {
        "system": ("<|im_start|>system\n", "<|im_end|>\n"),
        "user": ("<|im_start|>user\n", "<|im_end|>\n"),
        "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
        "ipython": ("", ""),
    }

    def __call__(self, messages: List[Message], inference: bool = False) -> List[Message]:
        """New messages in ChatML."""
        formatted = []
        for i, message in enumerate(messages):
            before, after = self.template[message.role]
            to_generate = message.role == "assistant" and i == len(messages) - 1 and not message.text_content
            formatted.append(_with_tags(message, before, None if to_generate else after))
        return formatted


GrammarErrorCorrectionTemplate = partial(
    PromptTemplate, template={"user": ("Correct this to standard English: ", "\n---\nCorrected: ")}
)
GrammarErrorCorrectionTemplate.__doc__ = """Grammar correction::

    Correct this to standard English: {user message}
    ---
    Corrected: {assistant message}
"""

SummarizeTemplate = partial(PromptTemplate, template={"user": ("Summarize this dialogue:\n", "\n---\nSummary:\n")})
SummarizeTemplate.__doc__ = """Dialogue summarisation::

    Summarize this dialogue:
    {user message}
    ---
    Summary:
    {assistant message}
"""

QuestionAnswerTemplate = partial(PromptTemplate, template={"user": ("Question: ", "\n\nAnswer: ")})
QuestionAnswerTemplate.__doc__ = """Question answering::

    Question: {user message}

    Answer: {assistant message}
"""


def _get_prompt_template(prompt_template: Any) -> PromptTemplateInterface:
    """The template a tokenizer builder's ``prompt_template`` names.

    Args:
        prompt_template: the dotted path of a template class (built with no arguments), a mapping
            ``{role: (before, after)}`` (a ``PromptTemplate``), or a template object (returned as it is).

    Raises:
        TuneValueError: anything else.
        ConfigError: a dotted path that does not import.
    """
    if isinstance(prompt_template, str):
        from torchtune.config import import_component

        return import_component(prompt_template, key="tokenizer.prompt_template")()
    if isinstance(prompt_template, Mapping):
        return PromptTemplate({role: tuple(tags) for role, tags in prompt_template.items()})
    if callable(prompt_template) and not isinstance(prompt_template, type):
        return prompt_template
    raise TuneValueError(
        f"Prompt template must be a dotpath string or dictionary with custom template, got "
        f"{type(prompt_template).__name__}: {prompt_template!r}. For example "
        "prompt_template: torchtune.models.llama2.Llama2ChatTemplate, or {user: ['Question: ', '\\n\\nAnswer: ']}."
    )
