"""Messages and the row -> messages transforms of torchtune.data."""

import pytest

from torchtune import TuneError
from torchtune.data import (
    AlpacaToMessages,
    ChosenRejectedToMessages,
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    ShareGPTToMessages,
    validate_messages,
)
from torchtune.datasets import AlpacaInstructTemplate


def _summary(messages):
    return [(m.role, m.text_content, m.masked, m.eot) for m in messages]


def test_message_content_and_flags():
    m = Message("user", "hi there")
    assert m.content == [{"type": "text", "content": "hi there"}]
    assert (m.masked, m.ipython, m.eot, m.contains_media, m.get_media()) == (False, False, True, False, [])
    assert repr(m) == "Message(role='user', content=['hi there'])"
    pieces = Message(
        "user",
        [{"type": "text", "content": "a"}, {"type": "image", "content": "IMG"}, {"type": "text", "content": "b"}],
    )
    assert (pieces.text_content, pieces.contains_media, pieces.get_media()) == ("ab", True, ["IMG"])
    d = Message.from_dict({"role": "assistant", "content": "x", "masked": True, "eot": False})
    assert (d.role, d.text_content, d.masked, d.ipython, d.eot) == ("assistant", "x", True, False, False)


def test_message_errors_are_tune_and_value_errors():
    with pytest.raises(TuneError, match="Only assistant messages can be tool calls. Found role user"):
        Message("user", "call()", ipython=True)
    with pytest.raises(ValueError, match="Media tokens in tool calls are not supported"):
        Message("assistant", [{"type": "image", "content": "IMG"}], ipython=True)
    with pytest.raises(TuneError, match="string or a list"):
        Message("user", 42)


def test_input_output_to_messages():
    row = {"q": "2+3?", "a": "5"}
    out = InputOutputToMessages(column_map={"input": "q", "output": "a"}, new_system_prompt="be brief")(row)
    assert _summary(out["messages"]) == [
        ("system", "be brief", True, True),
        ("user", "2+3?", True, True),
        ("assistant", "5", False, True),
    ]
    learnt = InputOutputToMessages(train_on_input=True)({"input": "a", "output": "b"})["messages"]
    assert [m.masked for m in learnt] == [False, False]
    with pytest.raises(ValueError, match="Expected a key of 'output'"):
        InputOutputToMessages(column_map={"input": "q"})


def test_alpaca_to_messages_uses_the_alpaca_template_prompts():
    template = AlpacaInstructTemplate()
    for row in (
        {"instruction": "Say hi.", "input": "", "output": "hi"},
        {"instruction": "Add.", "input": "1 2", "output": "3"},
    ):
        user, assistant = AlpacaToMessages(train_on_input=False)(row)["messages"]
        assert user.text_content == template.format(row)
        assert (user.masked, assistant.text_content, assistant.masked) == (True, row["output"], False)
    renamed = AlpacaToMessages(column_map={"instruction": "task", "output": "answer"})({"task": "Go.", "answer": "ok"})
    assert renamed["messages"][0].text_content.endswith("### Instruction:\nGo.\n\n### Response:\n")
    assert renamed["messages"][0].masked is False  # train_on_input defaults to True


def test_sharegpt_and_openai_rows_give_the_same_messages():
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "s"},
            {"from": "human", "value": "u"},
            {"from": "gpt", "value": "a"},
        ]
    }
    openai = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
        ]
    }
    expected = [("system", "s", True, True), ("user", "u", True, True), ("assistant", "a", False, True)]
    assert _summary(ShareGPTToMessages()(sharegpt)["messages"]) == expected
    assert _summary(OpenAIToMessages()(openai)["messages"]) == expected
    replaced = OpenAIToMessages(new_system_prompt="new", train_on_input=True)(openai)["messages"]
    assert _summary(replaced) == [
        ("system", "new", True, True),
        ("user", "u", False, True),
        ("assistant", "a", False, True),
    ]
    with pytest.raises(TuneError, match="ShareGPT message from 'robot'"):
        ShareGPTToMessages()({"conversations": [{"from": "robot", "value": "x"}]})


def test_chosen_rejected_leaves_the_row_unchanged():
    row = {
        "chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}],
        "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "bad"}],
    }
    out = ChosenRejectedToMessages()(row)
    assert _summary(out["chosen"]) == [("user", "q", True, True), ("assistant", "good", False, True)]
    assert _summary(out["rejected"])[1] == ("assistant", "bad", False, True)
    assert "masked" not in row["chosen"][0]


@pytest.mark.parametrize(
    "roles, error",
    [
        (["system", "user", "assistant"], None),
        (["user", "assistant", "user", "assistant"], None),
        (["user"], "at least length 2"),
        (["user", "system"], "System message at index 1"),
        (["user", "user"], "Two consecutive user messages at index 1 and 0"),
        (["assistant", "user"], "Assistant message before expected user message at index 0"),
    ],
)
def test_validate_messages(roles, error):
    messages = [Message(role, "x") for role in roles]
    if error is None:
        validate_messages(messages)
    else:
        with pytest.raises(ValueError, match=error):
            validate_messages(messages)
