"""Every row is checked before training, not only the first ones the recipe tokenizes at set-up: a null
or non-text field at row 5,000 is one error naming the row and column, and is never trained as "None"."""

from __future__ import annotations

import json

import pytest

from torchtune import TuneError
from torchtune.datasets import alpaca_dataset, chat_dataset, instruct_dataset

ROWS = 6000
BAD = 5000


def _alpaca_rows():
    return [{"instruction": f"Repeat {i}.", "input": "", "output": f"Number {i}."} for i in range(ROWS)]


def _write(path, rows):
    path.write_text(json.dumps(rows))
    return str(path)


@pytest.mark.parametrize("field", ["instruction", "output"])
def test_a_null_field_at_row_5000_is_refused(tokenizer, tmp_path, field):
    rows = _alpaca_rows()
    rows[BAD][field] = None
    rows[BAD + 7][field] = None
    data = _write(tmp_path / "nulls.json", rows)
    with pytest.raises(TuneError) as err:
        alpaca_dataset(tokenizer, source="json", data_files=data, cache_dir=str(tmp_path / "c"))
    message = str(err.value)
    assert f"column '{field}' is null in 2 row(s) (row {BAD}, {BAD + 7})" in message
    assert "'None'" in message and "dataset.column_map" in message and data in message


def test_a_null_optional_field_is_left_out_not_written_as_none(tokenizer, tmp_path):
    """Alpaca's input may be null: the row takes the prompt without input, as for an empty input."""
    rows = _alpaca_rows()
    rows[BAD]["input"] = None
    ds = alpaca_dataset(tokenizer, source="json", data_files=_write(tmp_path / "n.json", rows), cache_dir=str(tmp_path))
    text = tokenizer.decode(ds[BAD]["tokens"])
    assert "None" not in text and "### Input:" not in text and f"Repeat {BAD}." in text


def test_a_number_among_texts_at_row_5000_is_refused(tokenizer, tmp_path):
    """JSON lets one row hold a number where the others hold text (``datasets`` then decodes each value)."""
    rows = _alpaca_rows()
    rows[BAD]["output"] = 5
    data = _write(tmp_path / "mixed.json", rows)
    with pytest.raises(TuneError, match=rf"column 'output' is not text \(row {BAD}: 5\) in 1 row\(s\) \(row {BAD}\)"):
        alpaca_dataset(tokenizer, source="json", data_files=data, cache_dir=str(tmp_path / "c"))


def test_format_template_fields_are_checked_too(tokenizer, tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(ROWS)]
    rows[BAD]["question"] = None
    data = _write(tmp_path / "qa.json", rows)
    with pytest.raises(TuneError, match=rf"column 'question' is null in 1 row\(s\) \(row {BAD}\)"):
        instruct_dataset(
            tokenizer, source="json", data_files=data, template="Q: {question}\nA:\n", column_map={"output": "answer"}
        )


def test_csv_values_are_read_as_text(tokenizer, tmp_path):
    """CSV has no types: an answer 3.50 stays "3.50" (its reader would make it the number 3.5)."""
    path = tmp_path / "qa.csv"
    path.write_text('instruction,output\n"Half of 7?",3.50\n"Two?",2\n')
    ds = alpaca_dataset(tokenizer, source="csv", data_files=str(path), cache_dir=str(tmp_path / "c"))
    assert tokenizer.decode(ds[0]["tokens"]).endswith("### Response:\n3.50")


def test_a_null_message_at_row_5000_is_refused(tmp_path, llama3_tokenizer_dir):
    from torchtune.models.llama3 import llama3_tokenizer

    tok = llama3_tokenizer(str(llama3_tokenizer_dir / "original" / "tokenizer.model"))
    rows = [
        {"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": f"{i}"}]}
        for i in range(ROWS)
    ]
    rows[BAD]["messages"][1]["content"] = None
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TuneError, match=rf"row {BAD}: message 1 has content None, not text"):
        chat_dataset(tok, source=str(path), cache_dir=str(tmp_path / "c"))
