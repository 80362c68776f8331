"""Prompt templates of torchtune.data: tags around each role's content, and templates named in a config."""

import pytest

from torchtune import ConfigError
from torchtune.data import ChatMLTemplate, Message, PromptTemplate, QuestionAnswerTemplate
from torchtune.data._prompt_templates import _get_prompt_template


def _texts(messages):
    return [(m.role, m.text_content) for m in messages]


def test_prompt_template_puts_tags_around_named_roles_and_keeps_flags():
    template = PromptTemplate({"user": ("Q: ", "\nA: "), "assistant": ("", "!")})
    messages = [
        Message("system", "sys", masked=True),
        Message("user", "why?", masked=True),
        Message("assistant", "because", eot=False),
    ]
    out = template(messages)
    assert _texts(out) == [("system", "sys"), ("user", "Q: why?\nA: "), ("assistant", "because!")]
    assert [(m.masked, m.eot) for m in out] == [(True, True), (True, True), (False, False)]
    assert messages[1].text_content == "why?"  # the input messages are not changed
    assert _texts(QuestionAnswerTemplate()([Message("user", "2+2")])) == [("user", "Question: 2+2\n\nAnswer: ")]


def test_chatml_leaves_an_empty_last_assistant_message_open():
    out = ChatMLTemplate()([Message("user", "hi"), Message("assistant", "")])
    assert _texts(out) == [("user", "<|im_start|>user\nhi<|im_end|>\n"), ("assistant", "<|im_start|>assistant\n")]
    closed = ChatMLTemplate()([Message("user", "hi"), Message("assistant", "yo")])
    assert closed[1].text_content == "<|im_start|>assistant\nyo<|im_end|>\n"


def test_get_prompt_template():
    assert isinstance(_get_prompt_template("torchtune.data.ChatMLTemplate"), ChatMLTemplate)
    custom = _get_prompt_template({"user": ["<", ">"]})
    assert isinstance(custom, PromptTemplate) and custom.template == {"user": ("<", ">")}
    built = ChatMLTemplate()
    assert _get_prompt_template(built) is built
    with pytest.raises(ValueError, match="Prompt template must be a dotpath string or dictionary"):
        _get_prompt_template(["user", "assistant"])
    with pytest.raises(ConfigError, match="tokenizer.prompt_template"):
        _get_prompt_template("torchtune.data.NoSuchTemplate")
