"""Instruction datasets with a text tokenizer (SentencePieceTokenizer: no chat format, so the messages are
plain text): Alpaca's prompts, labels, truncation, rows with nothing to learn, column maps, templates, local
files and the errors about them."""

import json

import pytest
import torch

from torchtune import TuneError
from torchtune.datasets import (
    AlpacaInstructTemplate,
    FormatInstructTemplate,
    InstructTemplate,
    alpaca_dataset,
    instruct_dataset,
    padded_collate,
)

PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\nGive three tips for staying healthy.\n\n### Response:\n"
)
PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\nTranslate the "
    "following sentence into French.\n\n### Input:\nHello, how are you?\n\n### Response:\n"
)


def test_alpaca_prompts_are_exact(alpaca_rows):
    template = AlpacaInstructTemplate()
    assert template.format(alpaca_rows[0]) == PROMPT_NO_INPUT
    assert template.format({"instruction": alpaca_rows[0]["instruction"]}) == PROMPT_NO_INPUT
    assert template.format(alpaca_rows[1]) == PROMPT_INPUT


def test_tokens_are_prompt_then_response_with_eos(tokenizer, alpaca_json, cache_dir, alpaca_rows):
    ds = alpaca_dataset(tokenizer, source="json", data_files=str(alpaca_json), cache_dir=cache_dir)
    assert len(ds) == 3
    for row, (prompt, item) in zip(alpaca_rows, [(PROMPT_NO_INPUT, ds[0]), (PROMPT_INPUT, ds[1])]):
        prompt_ids = tokenizer.encode(prompt, add_eos=False)
        assert item["tokens"] == tokenizer.encode(prompt + row["output"])
        assert item["tokens"][: len(prompt_ids)] == prompt_ids
        assert item["tokens"][0] == tokenizer.bos_id and item["tokens"][-1] == tokenizer.eos_id
        assert item["labels"] == item["tokens"]  # train_on_input=True by default


def test_train_on_input_false_masks_prompt(tokenizer, alpaca_json, cache_dir):
    ds = alpaca_dataset(
        tokenizer, source="json", data_files=str(alpaca_json), cache_dir=cache_dir, train_on_input=False
    )
    item = ds[1]
    n_prompt = len(tokenizer.encode(PROMPT_INPUT, add_eos=False))
    assert item["labels"][:n_prompt] == [-100] * n_prompt
    assert item["labels"][n_prompt:] == item["tokens"][n_prompt:]
    assert tokenizer.decode(item["labels"][n_prompt:]) == "Bonjour, comment allez-vous?"


# The rows' prompts are 100, 155 and 88 tokens long, their responses 41, 21 and 6 (with EOS).
@pytest.mark.parametrize("train_on_input, max_seq_len", [(True, 20), (False, 110)])
def test_truncation_keeps_final_eos(tokenizer, alpaca_json, cache_dir, train_on_input, max_seq_len):
    kwargs = dict(source="json", data_files=str(alpaca_json), cache_dir=cache_dir, train_on_input=train_on_input)
    full = alpaca_dataset(tokenizer, max_seq_len=None, **kwargs)[0]
    cut = alpaca_dataset(tokenizer, max_seq_len=max_seq_len, **kwargs)
    n = max_seq_len - 1
    assert len(full["tokens"]) > max_seq_len
    assert len(cut[0]["tokens"]) == len(cut[0]["labels"]) == max_seq_len
    assert cut[0]["tokens"][:n] == full["tokens"][:n] and cut[0]["tokens"][-1] == tokenizer.eos_id
    assert cut[0]["labels"][:n] == full["labels"][:n] and cut[0]["labels"][-1] == tokenizer.eos_id
    # without the prompt's labels, a row whose response lies past max_seq_len teaches nothing: left out
    assert len(cut) == (3 if train_on_input else 2)
    assert cut.dropped == ({} if train_on_input else {"cut away by max_seq_len": 1})


def test_rows_with_nothing_to_learn_are_left_out(tokenizer, tmp_path, cache_dir, caplog):
    """An empty or blank response, with the loss on responses only: left out and counted, also when packed
    (by the packer); with train_on_input=True the row still teaches its prompt."""
    rows = [
        {"instruction": "Say hi.", "input": "", "output": "hi"},
        {"instruction": "Say nothing.", "input": "", "output": ""},
        {"instruction": "Say a space.", "input": "", "output": " \n"},
        {"instruction": "Say bye.", "input": "", "output": "bye"},
    ]
    data = _write(tmp_path / "empty.json", rows)
    with caplog.at_level("WARNING", logger="torchtune"):
        ds = alpaca_dataset(tokenizer, source="json", data_files=data, cache_dir=cache_dir, train_on_input=False)
    assert len(ds) == 2 and ds.dropped == {"empty reply": 2}
    assert tokenizer.decode([t for t in ds[1]["labels"] if t != -100]) == "bye"
    assert "2 of 4 rows have nothing to learn and are left out (2 empty reply): rows 1, 2." in caplog.text
    packed = alpaca_dataset(
        tokenizer,
        source="json",
        data_files=data,
        cache_dir=cache_dir,
        train_on_input=False,
        packed=True,
        max_seq_len=256,
    )
    assert packed.num_examples == 2 and packed.dropped == {"empty reply": 2}
    assert len(alpaca_dataset(tokenizer, source="json", data_files=data, cache_dir=cache_dir)) == 4
    with pytest.raises(TuneError, match="has nothing to learn in any row"):
        alpaca_dataset(
            tokenizer, source="json", data_files=_write(tmp_path / "none.json", rows[1:3]), train_on_input=False
        )


def test_padded_collate_pads_tokens_and_labels():
    batch = [{"tokens": [1, 5, 6, 2], "labels": [-100, 5, 6, 2]}, {"tokens": [1, 7], "labels": [1, 7]}]
    out = padded_collate(batch, padding_idx=0, ignore_idx=-100)
    assert out["tokens"].dtype == torch.long and out["labels"].dtype == torch.long
    assert out["tokens"].tolist() == [[1, 5, 6, 2], [1, 7, 0, 0]]
    assert out["labels"].tolist() == [[-100, 5, 6, 2], [1, 7, -100, -100]]
    assert padded_collate(batch, padding_idx=9, ignore_idx=-1)["labels"].tolist()[1] == [1, 7, -1, -1]


def test_batches_from_a_dataloader(tokenizer, alpaca_json, cache_dir):
    ds = alpaca_dataset(tokenizer, source="json", data_files=str(alpaca_json), cache_dir=cache_dir)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=padded_collate)
    batch = next(iter(loader))
    longest = max(len(ds[i]["tokens"]) for i in range(3))
    assert batch["tokens"].shape == batch["labels"].shape == (3, longest)


def _write(path, rows):
    path.write_text(json.dumps(rows))
    return str(path)


def test_missing_columns_error_shows_column_map(tokenizer, tmp_path, cache_dir):
    data = _write(tmp_path / "qa.json", [{"prompt": "Say hi", "answer": "hi"}])
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, source="json", data_files=data, cache_dir=cache_dir)
    message = str(info.value)
    assert "'instruction'" in message and "'output'" in message  # what is missing
    assert "'prompt', 'answer'" in message  # what the dataset has
    assert "dataset.column_map='{instruction: prompt, output: answer}'" in message


def test_column_map_renames_columns(tokenizer, tmp_path, cache_dir):
    data = _write(tmp_path / "qa.json", [{"prompt": "Say hi", "answer": "hi"}])
    ds = alpaca_dataset(
        tokenizer,
        source="json",
        data_files=data,
        cache_dir=cache_dir,
        column_map={"instruction": "prompt", "output": "answer"},
    )
    expected = AlpacaInstructTemplate().format({"instruction": "Say hi"}) + "hi"
    assert ds[0]["tokens"] == tokenizer.encode(expected)
    # The command-line spelling arrives as text.
    ds = alpaca_dataset(
        tokenizer,
        source="json",
        data_files=data,
        cache_dir=cache_dir,
        column_map="{instruction: prompt, output: answer}",
    )
    assert ds[0]["tokens"] == tokenizer.encode(expected)


def test_column_map_with_unknown_field(tokenizer, alpaca_json, cache_dir):
    with pytest.raises(TuneError, match="'question'"):
        alpaca_dataset(
            tokenizer,
            source="json",
            data_files=str(alpaca_json),
            cache_dir=cache_dir,
            column_map={"question": "instruction"},
        )


def test_missing_data_file(tokenizer, tmp_path, cache_dir):
    path = tmp_path / "missing.json"
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, source="json", data_files=str(path), cache_dir=cache_dir)
    assert str(path) in str(info.value) and "dataset.data_files" in str(info.value)


def test_malformed_json(tokenizer, tmp_path, cache_dir):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": \n')
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, source="json", data_files=str(path), cache_dir=cache_dir)
    message = str(info.value)
    assert str(path) in message and "dataset.data_files" in message and "malformed" in message


@pytest.mark.parametrize("content", ["", "\n  \n", "[]"])
def test_empty_file(tokenizer, tmp_path, cache_dir, content):
    path = tmp_path / "empty.json"
    path.write_text(content)
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, source="json", data_files=str(path), cache_dir=cache_dir)
    message = str(info.value)
    assert str(path) in message and "dataset.data_files" in message
    assert "empty" in message or "0 rows" in message


def test_file_builder_without_data_files(tokenizer, cache_dir):
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, source="json", cache_dir=cache_dir)
    # the config has no data_files key: only +dataset.data_files=... adds it
    assert "+dataset.data_files=/path/to/data.json" in " ".join(str(info.value).split())


def test_csv_source(tokenizer, tmp_path, cache_dir):
    path = tmp_path / "data.csv"
    path.write_text('instruction,input,output\n"What is 2+2?",,"4"\n"Add the numbers.","1 and 2","3"\n')
    ds = alpaca_dataset(tokenizer, source="csv", data_files=str(path), cache_dir=cache_dir)
    assert len(ds) == 2
    template = AlpacaInstructTemplate()
    # csv reads the empty input as None: the prompt without input is used.
    assert ds[0]["tokens"] == tokenizer.encode(template.format({"instruction": "What is 2+2?"}) + "4")
    assert ds[1]["tokens"] == tokenizer.encode(
        template.format({"instruction": "Add the numbers.", "input": "1 and 2"}) + "3"
    )


def test_source_may_be_a_file_path(tokenizer, alpaca_json, cache_dir):
    ds = alpaca_dataset(tokenizer, source=str(alpaca_json), cache_dir=cache_dir)
    assert len(ds) == 3
    with pytest.raises(TuneError, match="dataset.source"):
        alpaca_dataset(tokenizer, source=str(alpaca_json.parent / "other.json"), cache_dir=cache_dir)


def test_a_file_as_source_beside_data_files_names_both_not_a_missing_file(tokenizer, alpaca_json, cache_dir):
    """dataset.source=f.jsonl on a config with data_files said no data file exists at f.jsonl, which exists."""
    other = alpaca_json.parent / "other.jsonl"
    other.write_text(alpaca_json.read_text())
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, source=str(other), data_files=str(alpaca_json), cache_dir=cache_dir)
    message = " ".join(str(info.value).split())
    assert f"dataset.source='{other}' names a data file, and dataset.data_files='{alpaca_json}'" in message
    assert "does not exist" not in message and "Couldn't find" not in message
    assert f"dataset.source={other} with ~dataset.data_files" in message
    assert f"dataset.source=json dataset.data_files={other}" in message


def test_hub_name_offline_says_use_local_files(tokenizer, cache_dir):
    with pytest.raises(TuneError) as info:
        alpaca_dataset(tokenizer, cache_dir=cache_dir)
    message = str(info.value)
    assert "tatsu-lab/alpaca" in message and "dataset.source" in message
    assert "network" in message and "dataset.data_files" in message


def test_format_string_template_and_response_column(tokenizer, tmp_path, cache_dir):
    data = _write(tmp_path / "qa.json", [{"question": "Why is the sky blue?", "answer": "Scattering."}])
    template = FormatInstructTemplate("Question: {question}\nAnswer:", response_column="answer")
    ds = instruct_dataset(tokenizer, source="json", template=template, data_files=data, cache_dir=cache_dir)
    assert ds[0]["tokens"] == tokenizer.encode("Question: Why is the sky blue?\nAnswer:Scattering.")
    # A bare format string uses the `output` column, renamed here by column_map.
    ds = instruct_dataset(
        tokenizer,
        source="json",
        template="Question: {question}\n",
        column_map={"output": "answer"},
        data_files=data,
        cache_dir=cache_dir,
    )
    assert ds[0]["tokens"] == tokenizer.encode("Question: Why is the sky blue?\nScattering.")


class ShoutTemplate(InstructTemplate):
    columns = ("text",)
    response_column = "reply"

    def format(self, sample):
        return sample["text"].upper() + "\n"


@pytest.mark.parametrize("template", [ShoutTemplate, ShoutTemplate(), f"{__name__}.ShoutTemplate"])
def test_custom_template_by_class_instance_or_dotted_path(tokenizer, tmp_path, cache_dir, template):
    data = _write(tmp_path / "shout.json", [{"text": "hello", "reply": "world"}])
    ds = instruct_dataset(tokenizer, source="json", template=template, data_files=data, cache_dir=cache_dir)
    assert ds[0]["tokens"] == tokenizer.encode("HELLO\nworld")


def test_bad_dotted_template(tokenizer, alpaca_json, cache_dir):
    with pytest.raises(TuneError, match="dataset.template"):
        instruct_dataset(
            tokenizer,
            source="json",
            template="torchtune.datasets.NoSuchTemplate",
            data_files=str(alpaca_json),
            cache_dir=cache_dir,
        )


def test_rows_are_tokenized_on_access(tokenizer, alpaca_json, cache_dir, alpaca_rows):
    calls = []
    real_encode = tokenizer.encode

    class CountingTokenizer:
        eos_id, pad_id, bos_id = tokenizer.eos_id, tokenizer.pad_id, tokenizer.bos_id

        def encode(self, *args, **kwargs):
            calls.append(args[0])
            return real_encode(*args, **kwargs)

    ds = alpaca_dataset(CountingTokenizer(), source="json", data_files=str(alpaca_json), cache_dir=cache_dir)
    assert len(ds) == 3 and calls == []
    ds[2]
    assert calls == [AlpacaInstructTemplate().format(alpaca_rows[2]), "Paris."]


def test_instruct_dataset_as_torchtune(tokenizer, tmp_path, cache_dir):
    """Without a template: the ``input`` column is the user message, ``output`` the reply; the prompt is not
    learnt by default; ``new_system_prompt`` goes first (never learnt); ``column_map`` may name one column."""
    data = _write(tmp_path / "io.json", [{"question": "Why is the sky blue?", "output": "Scattering."}])
    ds = instruct_dataset(
        tokenizer, source="json", data_files=data, cache_dir=cache_dir, column_map={"input": "question"}
    )
    prompt = tokenizer.encode("Why is the sky blue?", add_eos=False)
    assert ds[0]["tokens"] == prompt + tokenizer.encode("Scattering.", add_bos=False, trim_leading_whitespace=True)
    assert ds[0]["labels"] == [-100] * len(prompt) + ds[0]["tokens"][len(prompt) :]
    ds = instruct_dataset(
        tokenizer,
        source="json",
        data_files=data,
        cache_dir=cache_dir,
        column_map={"input": "question"},
        new_system_prompt="Be brief.",
        train_on_input=True,
    )
    system = tokenizer.encode("Be brief.", add_eos=False)
    assert ds[0]["tokens"][: len(system)] == system
    assert ds[0]["labels"][: len(system)] == [-100] * len(system)
    assert ds[0]["labels"][len(system) :] == ds[0]["tokens"][len(system) :]
    with pytest.raises(TuneError, match="no column.*'input'.*InputOutputToMessages"):
        instruct_dataset(tokenizer, source="json", data_files=data, cache_dir=cache_dir)
