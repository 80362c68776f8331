"""Every value a user can type wrong, in every kind of key of the shipped configs, is one paragraph naming
the key, from `tune validate` and `tune run` alike, before anything is built: no traceback, exit 2.

The type of a component's argument is checked against the callable's type hints, its range by the
component's own ``check_config_args`` (torchtune.config._types); top-level keys by the recipe's
``validate_config``. `tune validate` runs in-process here (it is what `tune run` runs before its set-up);
two cases go through the real `tune run` to show that its message is the same.
"""

from __future__ import annotations

import pytest

from tests._helpers.tiny_run import run_tune
from torchtune._cli.tune import main

BAD_VALUES = [
    ("llama2/tiny_full", "seed=abc"),
    ("llama2/tiny_full", "checkpointer.model_type=LLAMA9"),
    ("llama2/tiny_full", "loss.num_output_chunks=0"),
    ("llama2/tiny_full", "dataset.max_seq_len=-1"),
    ("llama2/tiny_full", "shuffle=maybe"),
    ("llama2/tiny_full", "compile=3"),
    ("llama2/tiny_full", "enable_activation_checkpointing=2"),
    ("llama2/tiny_full", "bf16_stochastic_rounding=abc"),
    ("llama2/tiny_full", "output_dir=5"),
    ("llama2/tiny_full", "model.num_layers=abc"),
    ("llama2/tiny_full", "model.num_heads=3"),
    ("llama2/tiny_full", "model.num_kv_heads=3"),
    ("llama2/tiny_full", "model.vocab_size=0"),
    ("llama2/tiny_full", "model.max_seq_len=0"),
    ("llama2/tiny_full", "tokenizer.max_seq_len=1"),
    ("llama2/tiny_full", "tokenizer.path=5"),
    ("llama2/tiny_full", "dataset.packed=3"),
    ("llama2/tiny_full", "dataset.train_on_input=abc"),
    ("llama2/tiny_full", "checkpointer.verify_checksums=sometimes"),
    ("llama2/tiny_full", "checkpointer.checkpoint_files=[]"),
    ("llama2/tiny_full", "optimizer.lr=-1"),
    ("llama2/tiny_full", "optimizer.weight_decay=abc"),
    ("llama2/tiny_full", "lr_scheduler.num_warmup_steps=-1"),
    ("llama2/tiny_full", "batch_size=0"),
    ("llama2/tiny_full", "gradient_accumulation_steps=abc"),
    ("llama2/tiny_full", "log_every_n_steps=0"),
    ("llama2/tiny_full", "validation_dataset.max_seq_len=0"),
    ("llama2/tiny_full", "eval_every_n_steps=abc"),
    ("llama2/tiny_full", "resume_from_checkpoint=maybe"),
    ("llama2/tiny_full", "log_peak_memory_stats=3"),
    ("llama3_2/1B_full_single_device", "checkpointer.model_type=LLAMA3_1"),
    ("llama3_2/1B_full_single_device", "tokenizer.max_seq_len=abc"),
    ("llama2/7B_full_single_device", "+optimizer.betas=[2,3]"),
    ("llama2/tiny_full_distributed", "fsdp_cpu_offload=maybe"),
    ("llama2/tiny_full_distributed", "fsdp_reshard_after_forward=3"),
    ("generate", "temperature=-1"),
    ("generate", "top_k=abc"),
    ("generate", "max_new_tokens=0"),
    ("llama2/tiny_eval", "num_fewshot=-1"),
    ("llama2/tiny_eval", "batch_size=0"),
    ("llama2/tiny_eval", "limit=-3"),
    ("llama2/tiny_eval", "seed=abc"),
]


def _validate(capsys, config: str, override: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["validate", config, override])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("config, override", BAD_VALUES)
def test_bad_value_is_one_paragraph_naming_the_key(capsys, config, override):
    rc, err = _validate(capsys, config, override)
    key = override.lstrip("+").split("=", 1)[0]
    assert rc == 2, err
    assert err.startswith("Error: ") and "Traceback" not in err, err
    assert "\n\n" not in err.strip(), err  # one paragraph, not a list of problems
    assert key in " ".join(err.split()), err


@pytest.mark.parametrize("override", ["seed=abc", "loss.num_output_chunks=0"])
def test_tune_run_says_what_validate_says(capsys, tmp_path, override):
    """The two that gave tracebacks from `tune run` (training/seed.py, modules/loss.py)."""
    _, expected = _validate(capsys, "llama2/tiny_full", override)
    result = run_tune(
        ["run", "full_finetune_single_device", "--config", "llama2/tiny_full", f"output_dir={tmp_path}", override]
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().endswith(expected.strip()), result.stderr
