"""Llama 2 chat's prompt format as a prompt template."""

from __future__ import annotations

from typing import List

from torchtune.data import Message, PromptTemplateInterface


class Llama2ChatTemplate(PromptTemplateInterface):
    """Llama 2 chat's format (Meta's reference ``llama`` repository): each user message in ``[INST] ...
    [/INST]``, the system prompt inside the next user message's tags between ``<<SYS>>`` lines; the
    tags are plain text, not special tokens::

        [INST] <<SYS>>
        You are a helpful assistant.
        <</SYS>>

        What should I see in Paris? [/INST] The Louvre ...
    """

    template = {
        "system": ("<<SYS>>\n", "\n<</SYS>>\n\n"),
        "user": ("[INST] ", " [/INST] "),
        "assistant": ("", ""),
        "ipython": ("", ""),
    }

    def __call__(self, messages: List[Message], inference: bool = False) -> List[Message]:
        """The messages with the tags; a system message is folded into the user message that follows."""
        system: List[dict] = []
        formatted = []
        for message in messages:
            if message.role == "system":
                before, after = self.template["system"]
                system = [{"type": "text", "content": before}, *message.content, {"type": "text", "content": after}]
                continue
            content = message.content
            if message.role == "user":
                before, after = self.template["user"]
                content = [{"type": "text", "content": before}, *system, *content, {"type": "text", "content": after}]
                system = []
            formatted.append(
                Message(message.role, content, masked=message.masked, ipython=message.ipython, eot=message.eot)
            )
        return formatted
