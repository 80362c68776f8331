"""Messages that used to mislead, through the real `tune` command: the column_map hint, a file that
does not parse, and a known bitsandbytes line that is not about anything a recipe does."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests._helpers.tiny_run import make_tiny_run, run_tune


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("messages")
    return folder, make_tiny_run(folder, num_examples=8)


def _run(config, *overrides):
    return run_tune(["run", "full_finetune_single_device", "--config", str(config), *overrides])


@pytest.mark.parametrize(
    "columns, expected",
    [
        # `input` is read by the template's optional field, so it is no candidate for `output`.
        (["instruction", "input", "response"], "{output: response}"),
        (["question", "context", "answer"], "{instruction: question, output: answer}"),
        (["instruction", "input", "zzz"], "{output: zzz}"),
    ],
)
def test_column_map_hint_names_a_column_the_file_has(tiny, columns, expected):
    folder, config = tiny
    data = folder / f"cols_{'_'.join(columns)}.json"
    data.write_text(json.dumps([dict(zip(columns, ["Add.", "1 and 2", "3"]))] * 4))
    result = _run(config, f"dataset.data_files={data}")
    assert result.returncode == 1
    text = _flat(result.stderr)
    assert f"+dataset.column_map='{expected}'" in text, text
    assert "output: input" not in text


def test_file_that_does_not_parse_gives_one_message(tiny):
    folder, config = tiny
    bad = folder / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": \n')
    result = _run(config, f"dataset.data_files={bad}")
    assert result.returncode == 1
    assert result.stderr.count("Error:") == 1
    assert "Failed to load JSON" not in result.stderr  # datasets' own log line, twice before its exception
    assert "Generating train split" not in result.stderr  # its progress bar
    text = _flat(result.stderr)
    assert f"Could not load the data file(s) '{bad}' (config key dataset.data_files)" in text
    assert "JSON parse error" in text


RECIPE = '''
"""Logs what bitsandbytes logs on import on a CPU with AVX512-BF16 but no `kernels` package, and one
other warning of the same logger, which must still show."""
import logging
import sys

from torchtune import config

@config.parse
def main(cfg):
    log = logging.getLogger("bitsandbytes.backends.cpu.ops")
    log.warning(
        "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
        "`pip install kernels` and the kernels >= 0.11.1", ModuleNotFoundError("No module named 'kernels'"))
    log.warning("another bitsandbytes warning")
    return 0

if __name__ == "__main__":
    sys.exit(main())
'''


def test_known_bitsandbytes_cpu_line_is_silenced_and_nothing_else(tmp_path):
    (tmp_path / "r.py").write_text(textwrap.dedent(RECIPE))
    (tmp_path / "c.yaml").write_text("x: 1\n")
    result = run_tune(["run", "r.py", "--config", "c.yaml"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "gemm_4bit_forward" not in result.stderr
    assert "another bitsandbytes warning" in result.stderr
