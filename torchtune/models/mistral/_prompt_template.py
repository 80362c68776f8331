"""Mistral Instruct's prompt format (v0.1, v0.2) as a prompt template."""

from __future__ import annotations

from typing import List

from torchtune._errors import TuneValueError
from torchtune.data import Message, PromptTemplateInterface


class MistralChatTemplate(PromptTemplateInterface):
    """Mistral Instruct v0.1 / v0.2's format: each user message in ``[INST] ... [/INST]`` (plain text, not
    special tokens); no system prompt. v0.3's tool-call tags are not covered::

        [INST] What should I see in Paris? [/INST] The Louvre ...

    Raises:
        TuneValueError: a system message.
    """

    template = {
        "system": None,
        "user": ("[INST] ", " [/INST] "),
        "assistant": ("", ""),
        "ipython": ("", ""),
    }

    def __call__(self, messages: List[Message], inference: bool = False) -> List[Message]:
        """The messages with the user tags."""
        formatted = []
        for message in messages:
            if message.role == "system":
                raise TuneValueError(
                    "System prompts are not supported in MistralChatTemplate: Mistral Instruct v0.1/v0.2 have "
                    "none. Drop the system message, or fold it into the first user message."
                )
            before, after = self.template[message.role]
            content = [{"type": "text", "content": before}, *message.content, {"type": "text", "content": after}]
            formatted.append(
                Message(message.role, content, masked=message.masked, ipython=message.ipython, eot=message.eot)
            )
        return formatted
