"""Messages, the unit of the message layer, and the transforms that turn dataset rows into them.

A ``Message`` is one turn of a conversation: a role, its content (text, or a list of text and image
pieces) and flags the model tokenizer reads (``masked``: left out of the loss; ``ipython``: a tool call;
``eot``: the turn ends here). The ``*ToMessages`` transforms map one row of a dataset to
``{"messages": [Message, ...]}``; a model tokenizer then turns those into ``tokens`` and ``mask``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Union

from torchtune._errors import TuneValueError
from torchtune.data._utils import format_content_with_images, load_image
from torchtune.modules.transforms import Transform

Role = Literal["system", "user", "assistant", "ipython"]
"""Who wrote a message: the system prompt, the user, the model, or a tool's output (``ipython``)."""

ROLES = ("system", "user", "assistant", "ipython")

# ShareGPT's speakers; ``user`` and ``assistant`` are accepted too, as many ShareGPT-style files use them.
_SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant"}


class Message:
    """One message of a conversation.

    Args:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"ipython"`` (a tool's output).
        content: the text, or a list of pieces ``{"type": "text" | "image", "content": ...}`` (an image as
            a ``PIL.Image.Image``); a string becomes one text piece.
        masked: leave the message's tokens out of the loss.
        ipython: the message is a tool call (only an assistant writes one).
        eot: the turn ends after this message (False for all but the last of consecutive assistant tool
            calls, and for tool outputs).

    Raises:
        TuneValueError: a tool call from a role other than assistant, an image in a tool call, or content
            that is neither a string nor a list.
    """

    def __init__(
        self,
        role: Role,
        content: Union[str, List[Dict[str, Any]]],
        masked: bool = False,
        ipython: bool = False,
        eot: bool = True,
    ) -> None:
        self.role = role
        if isinstance(content, str):
            content = [{"type": "text", "content": content}]
        elif not isinstance(content, list):
            raise TuneValueError(
                f"Message content must be a string or a list of {{'type', 'content'}} pieces, got "
                f"{type(content).__name__}: {content!r}"
            )
        self.content: List[Dict[str, Any]] = content
        self.masked = masked
        self.ipython = ipython
        self.eot = eot
        if ipython and self.contains_media:
            raise TuneValueError(
                f"Media tokens in tool calls are not supported. Both are set in message: {self.text_content}"
            )
        if ipython and role != "assistant":
            raise TuneValueError(
                f"Only assistant messages can be tool calls. Found role {role} in message: {self.text_content}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Message":
        """A message from ``{"role", "content"}`` and, optionally, ``masked``, ``ipython``, ``eot``."""
        return cls(
            role=d["role"],
            content=d["content"],
            masked=d.get("masked", False),
            ipython=d.get("ipython", False),
            eot=d.get("eot", True),
        )

    def get_media(self) -> List[Any]:
        """The images of the content, in order."""
        return [piece["content"] for piece in self.content if piece["type"] == "image"]

    @property
    def contains_media(self) -> bool:
        """Whether the content holds an image."""
        return any(piece["type"] == "image" for piece in self.content)

    @property
    def text_content(self) -> str:
        """The text pieces of the content, joined."""
        return "".join(piece["content"] for piece in self.content if piece["type"] == "text")

    def __repr__(self) -> str:
        return f"Message(role='{self.role}', content={[piece['content'] for piece in self.content]!r})"


def _checked_column_map(column_map: Optional[Mapping[str, str]], required: List[str]) -> Optional[Dict[str, str]]:
    """``column_map`` as a dict, after checking it names every one of ``required``."""
    if not column_map:
        return None
    for key in required:
        if key not in column_map:
            raise TuneValueError(
                f"Expected a key of '{key}' in column_map but found {list(column_map)}. column_map maps the "
                f"names this transform reads ({', '.join(required)}) to the dataset's columns."
            )
    return dict(column_map)


def _system_message(text: str) -> Message:
    return Message(role="system", content=text, masked=True, eot=True)


class InputOutputToMessages(Transform):
    """A row with an ``input`` (the prompt) and an ``output`` (the response) column as a user message and
    an assistant message.

    Args:
        train_on_input: learn the prompt too (else the user message is masked).
        column_map: the dataset's columns for ``input`` and ``output`` (both required when given) and,
            for images, ``image``.
        new_system_prompt: a system message put first.
        image_dir: folder that a row's relative image path is taken from.

    Raises:
        TuneValueError: ``column_map`` lacks ``input`` or ``output``, or ``image_dir`` is given while
            ``column_map`` names no ``image`` column.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Optional[Dict[str, str]] = None,
        new_system_prompt: Optional[str] = None,
        image_dir: Optional[Path] = None,
    ) -> None:
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.column_map = _checked_column_map(column_map, ["input", "output"]) or {
            "input": "input",
            "output": "output",
            "image": "image",
        }
        if image_dir is not None and "image" not in self.column_map:
            raise TuneValueError(
                f"image_dir is specified as {image_dir} but 'image' is not in column_map. "
                "Please specify an 'image' key in column_map."
            )
        self.image_dir = image_dir

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        prompt = sample[self.column_map["input"]]
        image_column = self.column_map.get("image")
        if image_column is not None and image_column in sample:
            image = sample[image_column]
            if isinstance(image, (str, Path)):
                path = Path(image)
                if self.image_dir is not None:
                    path = Path(self.image_dir) / path
                image = load_image(path)
            content: Union[str, List[Dict[str, Any]]] = [
                {"type": "image", "content": image},
                {"type": "text", "content": prompt},
            ]
        else:
            content = prompt
        messages = [
            Message(role="user", content=content, masked=not self.train_on_input, eot=True),
            Message(role="assistant", content=sample[self.column_map["output"]], masked=False, eot=True),
        ]
        if self.new_system_prompt is not None:
            messages.insert(0, _system_message(self.new_system_prompt))
        return {"messages": messages}


class ChosenRejectedToMessages(Transform):
    """A preference row: ``chosen`` and ``rejected`` conversations (lists of ``{"role", "content"}``) as
    ``{"chosen": [Message, ...], "rejected": [Message, ...]}``.

    Args:
        train_on_input: learn the non-assistant messages too.
        column_map: the dataset's columns for ``chosen`` and ``rejected`` (both required when given).
        new_system_prompt: a system message put first, replacing the conversations' own.

    Raises:
        TuneValueError: ``column_map`` lacks ``chosen`` or ``rejected``.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Optional[Dict[str, str]] = None,
        new_system_prompt: Optional[str] = None,
    ) -> None:
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self._column_map = _checked_column_map(column_map, ["chosen", "rejected"]) or {
            "chosen": "chosen",
            "rejected": "rejected",
        }

    def _convert(self, conversation: List[Mapping[str, Any]]) -> List[Message]:
        messages = [] if self.new_system_prompt is None else [_system_message(self.new_system_prompt)]
        for message in conversation:
            if message["role"] == "system" and self.new_system_prompt is not None:
                continue
            masked = message["role"] != "assistant" and not self.train_on_input
            messages.append(Message.from_dict({**message, "masked": masked}))
        return messages

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        return {
            "chosen": self._convert(sample[self._column_map["chosen"]]),
            "rejected": self._convert(sample[self._column_map["rejected"]]),
        }


class ShareGPTToMessages(Transform):
    """A ShareGPT row, ``{"conversations": [{"from": "system" | "human" | "gpt", "value": text}, ...]}``, as
    messages (``human`` is the user, ``gpt`` the assistant).

    Args:
        train_on_input: learn the system and user messages too (never for a row with an image).
        column_map: the dataset's column for ``conversations`` (required when given) and, for images,
            ``image``.
        new_system_prompt: a system message put first, replacing the row's own.
        image_dir: folder that a row's relative image path is taken from.
        image_tag: the text in the first user message that marks where the row's image goes; ``None``
            puts the image before that message's text.

    Raises:
        TuneValueError: ``column_map`` lacks ``conversations``; a speaker that is not system, human or gpt.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Optional[Dict[str, str]] = None,
        new_system_prompt: Optional[str] = None,
        image_dir: Optional[Path] = None,
        image_tag: Optional[str] = "<image>",
    ) -> None:
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self._column_map = _checked_column_map(column_map, ["conversations"]) or {
            "conversations": "conversations",
            "image": "image",
        }
        self.image_dir = image_dir
        self.image_tag = image_tag

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        messages = [] if self.new_system_prompt is None else [_system_message(self.new_system_prompt)]
        image_column = self._column_map.get("image")
        multimodal = image_column is not None and image_column in sample
        image_placed = False
        for turn in sample[self._column_map["conversations"]]:
            speaker = turn["from"]
            if speaker not in _SHAREGPT_ROLES:
                raise TuneValueError(
                    f"ShareGPT message from {speaker!r}: the speakers are system, human and gpt "
                    f"(user and assistant are accepted too). Message: {turn!r}"
                )
            role = _SHAREGPT_ROLES[speaker]
            if role == "system" and self.new_system_prompt is not None:
                continue
            content: Union[str, List[Dict[str, Any]]] = turn["value"]
            if role == "user" and multimodal and not image_placed:
                path = sample[image_column]
                if self.image_dir is not None:
                    path = Path(self.image_dir) / path
                image = load_image(path)
                if self.image_tag is None:
                    content = [{"type": "image", "content": image}, {"type": "text", "content": content}]
                else:
                    content = format_content_with_images(content, image_tag=self.image_tag, images=[image])
                image_placed = True
            masked = role != "assistant" and (not self.train_on_input or multimodal)
            messages.append(Message(role=role, content=content, masked=masked))
        return {"messages": messages}


class OpenAIToMessages(Transform):
    """An OpenAI chat-completion row, ``{"messages": [{"role", "content"}, ...]}``, as messages; a content
    list may hold ``{"type": "text", "text": ...}`` and ``{"type": "image_url", "image_url": {"url": ...}}``.

    Args:
        train_on_input: learn the system and user messages too.
        column_map: the dataset's column for ``messages`` (required when given).
        new_system_prompt: a system message put first, replacing the row's own.

    Raises:
        TuneValueError: ``column_map`` lacks ``messages``.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Optional[Dict[str, str]] = None,
        new_system_prompt: Optional[str] = None,
    ) -> None:
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self._column_map = _checked_column_map(column_map, ["messages"]) or {"messages": "messages"}

    def _convert_from_openai_content(self, content: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """OpenAI content pieces as message content pieces (images loaded); other piece types are dropped."""
        pieces = []
        for piece in content:
            if piece["type"] == "text":
                pieces.append({"type": "text", "content": piece["text"]})
            elif piece["type"] == "image_url":
                pieces.append({"type": "image", "content": load_image(piece["image_url"]["url"])})
        return pieces

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        messages = [] if self.new_system_prompt is None else [_system_message(self.new_system_prompt)]
        for message in sample[self._column_map["messages"]]:
            role = message["role"]
            if role == "system" and self.new_system_prompt is not None:
                continue
            content = message["content"]
            if isinstance(content, list):
                content = self._convert_from_openai_content(content)
            masked = role != "assistant" and not self.train_on_input
            messages.append(Message(role=role, content=content, masked=masked))
        return {"messages": messages}


# Stanford Alpaca's two prompts (tatsu-lab/stanford_alpaca's train.py), defined once: the instruction datasets'
# AlpacaInstructTemplate formats with these too.
ALPACA_PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)


class AlpacaToMessages(Transform):
    """An Alpaca row (``instruction``, optional ``input``, ``output``) as a user message in Stanford
    Alpaca's prompt format (with the ``### Input:`` section only when ``input`` is not empty) and an
    assistant message with the output.

    Args:
        train_on_input: learn the prompt too.
        column_map: the dataset's columns for ``instruction``, ``input`` and ``output`` (each optional).
    """

    def __init__(self, train_on_input: bool = True, column_map: Optional[Dict[str, str]] = None) -> None:
        self.train_on_input = train_on_input
        self.column_map = column_map
        self.template = {"prompt_input": ALPACA_PROMPT_INPUT, "prompt_no_input": ALPACA_PROMPT_NO_INPUT}

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        columns = self.column_map or {}
        instruction = sample[columns.get("instruction", "instruction")]
        given = sample.get(columns.get("input", "input"))
        if given:
            prompt = self.template["prompt_input"].format(instruction=instruction, input=given)
        else:
            prompt = self.template["prompt_no_input"].format(instruction=instruction)
        return {
            "messages": [
                Message(role="user", content=prompt, masked=not self.train_on_input, eot=True),
                Message(role="assistant", content=sample[columns.get("output", "output")], masked=False, eot=True),
            ]
        }


def validate_messages(messages: List[Message]) -> None:
    """Check that ``messages`` are a conversation: at least two messages, a system message only first, no
    two user messages in a row, and an assistant message only after a user message.

    Raises:
        TuneValueError: the first rule broken, with the message index.
    """
    if len(messages) < 2:
        raise TuneValueError(f"Messages must be at least length 2, but got {len(messages)} messages")
    previous = "assistant"
    for i, message in enumerate(messages):
        if message.role == "assistant" and previous != "user":
            raise TuneValueError(f"Assistant message before expected user message at index {i} in messages")
        if message.role == "user" and previous == "user":
            raise TuneValueError(f"Two consecutive user messages at index {i} and {i - 1} in messages")
        if message.role == "system" and i > 0:
            raise TuneValueError(f"System message at index {i} in messages, but system messages must come first")
        previous = message.role
