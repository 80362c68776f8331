"""What a run shows and writes, through the real `tune` command from a directory that is not the
repository: bundled configs and assets resolve from the installed package; metrics go to metrics.jsonl
and, at the same time, to stdout, TensorBoard and Weights & Biases (offline); a validation loss is
logged every eval_every_n_steps and drawn by `tune plot`; the run ends with a summary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._helpers.tiny_run import run_tune
from tests._helpers.wandb_offline import read_offline_run
from torchtune.training.metric_logging import read_metrics

STEPS = 4
LOGGERS = (
    "metric_logger=["
    "{_component_: torchtune.training.metric_logging.StdoutLogger}, "
    "{_component_: torchtune.training.metric_logging.TensorBoardLogger, log_dir: '${output_dir}/tb'}, "
    "{_component_: torchtune.training.metric_logging.WandBLogger, project: tiny, mode: offline, "
    "log_dir: '${output_dir}'}]"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The bundled tiny_full config, 4 steps, validation every 2 steps, all loggers, run from elsewhere."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    out = cwd / "out"
    result = run_tune(
        [
            "run",
            "full_finetune_single_device",
            "--config",
            "llama2/tiny_full",
            f"output_dir={out}",
            f"max_steps_per_epoch={STEPS}",
            "eval_every_n_steps=2",
            "save_every_n_steps=null",
            LOGGERS,
        ],
        cwd=cwd,
        env={"WANDB_SILENT": "true", "WANDB_DISABLE_CODE": "true"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result, read_metrics(out / "logs" / "metrics.jsonl")


def test_bundled_config_runs_from_another_directory(run):
    out, result, rows = run
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert (out / "epoch_0" / "model-00001-of-00001.safetensors").is_file()
    assert "Generating train split" not in result.stderr  # datasets' progress bars are off


def test_validation_loss_every_n_steps_and_at_the_epoch_end(run):
    _, result, rows = run
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    assert [step for step, _ in val] == [2, 4]  # step 4 ends the epoch too: evaluated once
    assert 0 < val[1][1] < val[0][1] < 10  # it learns on the held-out split already
    for step, value in val:  # shown once: by the StdoutLogger, not a second time by the recipe
        assert result.stdout.count(f"Step {step} | val_loss:{value:.6g}") == 1
    assert "validation loss" not in result.stderr[: result.stderr.index("Run summary")]


def test_stdout_tensorboard_and_wandb_get_the_same_metrics(run):
    out, result, rows = run
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    printed = {int(m[1]): float(m[2]) for m in re.finditer(r"^Step (\d+) \| epoch:0 loss:(\S+)", result.stdout, re.M)}
    assert printed == pytest.approx(losses, rel=1e-5)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tb_run,) = (out / "tb").glob("run_0_*")  # torchtune's organize_logs: one folder per run
    events = EventAccumulator(str(tb_run))
    events.Reload()
    value = lambda e: e.tensor_proto.float_val[0]  # noqa: E731 - new-style scalars are tensor summaries
    assert {e.step: value(e) for e in events.Tensors("loss")} == pytest.approx(losses, rel=1e-6)
    assert [e.step for e in events.Tensors("val_loss")] == [2, 4]

    (run_dir,) = (out / "wandb").glob("offline-run-*")
    history, wandb_config = read_offline_run(run_dir)
    assert {h["_step"]: h["loss"] for h in history if "loss" in h} == pytest.approx(losses, rel=1e-6)
    assert [h["_step"] for h in history if "val_loss" in h] == [2, 4]
    assert wandb_config["max_steps_per_epoch"] == STEPS and wandb_config["output_dir"] == str(out)


def test_summary_at_the_end(run):
    out, result, rows = run
    losses = [r["loss"] for r in rows if "loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    summary = result.stderr[result.stderr.index("Run summary") :]
    assert "steps            1 to 4 logged in this session" in summary
    best = min(range(STEPS), key=lambda i: losses[i])
    assert f"loss             final {losses[-1]:.4f} (step 4), best {losses[best]:.4f} (step {best + 1})" in summary
    assert f"validation loss  final {val[-1]:.4f} (step 4)" in summary
    tokens = sum(r["tokens"] for r in rows if "tokens" in r)
    seconds = sum(r["tokens"] / r["tokens_per_second"] for r in rows if "tokens" in r)
    assert f"throughput       {tokens / seconds:,.0f} tokens/s ({tokens:,} tokens)" in summary
    assert re.search(r"peak memory      host peak RSS \d+\.\d\d GB", summary)
    assert re.search(r"wall time        \d+(\.\d)? (s|min)", summary)
    assert f"checkpoint       {out / 'epoch_0'}" in summary
    assert f"metrics          {out / 'logs' / 'metrics.jsonl'} (plot: tune plot {out})" in summary


def test_plot_draws_the_validation_loss(run):
    out, _, _ = run
    result = run_tune(["plot", str(out)])
    assert result.returncode == 0, result.stderr
    assert f"Wrote {out / 'metrics.png'} (loss, val_loss, lr against step)" in result.stdout
    assert (out / "metrics.png").stat().st_size > 10_000


def test_generate_config_runs_from_another_directory(tmp_path):
    result = run_tune(["run", "generate", "--config", "generate", "max_new_tokens=4"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "### Response:" in result.stdout and re.search(r"\[\d tokens in \d", result.stderr)


def test_repo_relative_asset_path_says_why_it_is_missing(tmp_path):
    result = run_tune(
        ["run", "generate", "--config", "generate", "tokenizer.path=torchtune/assets/demo/tokenizer.model"],
        cwd=tmp_path,
    )
    assert result.returncode == 1
    text = " ".join(result.stderr.split())
    assert f"It is a relative path, looked for from the current directory {Path(tmp_path).resolve()}" in text
    assert "write ${asset:demo/tokenizer.model} in the config" in text


def test_saved_folder_is_truthful_and_complete(run):
    """config.json names the dtype written (the bundled base model is bf16, tiny_full trains in fp32);
    the tokenizer files load with AutoTokenizer and encode as the recipe does (BOS, no EOS)."""
    import json

    import torch
    import transformers

    from torchtune import config
    from torchtune.datasets import AlpacaInstructTemplate
    from torchtune.training import build_model

    out, _, _ = run
    folder = out / "epoch_0"
    base = json.loads((registry_asset("demo/base_model") / "config.json").read_text())
    saved = json.loads((folder / "config.json").read_text())
    assert base["torch_dtype"] == "bfloat16" and saved["torch_dtype"] == "float32"
    assert {k: v for k, v in saved.items() if k != "torch_dtype"} == {
        k: v for k, v in base.items() if k != "torch_dtype"
    }
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (folder / name).is_file(), name

    cfg = config.load_config("llama2/tiny_full")
    ours = config.instantiate(cfg.tokenizer)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    template = AlpacaInstructTemplate()
    prompts = [
        template.format({"instruction": "Reverse the letters of the word.", "input": "apple"}),
        template.format({"instruction": "What is 7 plus 5?"}),
        "Plain text, with punctuation; and\nnew lines.",
    ]
    for prompt in prompts:
        assert hf_tokenizer(prompt)["input_ids"] == ours.encode(prompt, add_bos=True, add_eos=False)
    generation = transformers.GenerationConfig.from_pretrained(folder)
    assert (generation.bos_token_id, generation.eos_token_id) == (ours.bos_id, ours.eos_id)

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto").eval()
    assert next(hf_model.parameters()).dtype == torch.float32
    ckpt = cfg.checkpointer.copy()
    ckpt.checkpoint_dir, ckpt.output_dir = str(folder), str(out / "_unused")
    weights = config.instantiate(ckpt).load_checkpoint()["model"]
    model = build_model(cfg.model, device=torch.device("cpu"), dtype=torch.float32, state_dict=weights).eval()
    tokens = torch.tensor([ours.encode(prompts[0], add_bos=True, add_eos=False)])
    with torch.no_grad():
        assert (hf_model(tokens).logits - model(tokens)).abs().max() < 1e-4


def registry_asset(name: str) -> Path:
    from torchtune._assets import asset_path

    return Path(asset_path(name))


def test_shipped_config_run_as_shipped_says_no_warning(run):
    """Noise from our own config (bf16_stochastic_rounding with fp32 weights) teaches users to skip warnings."""
    _, result, _ = run
    noisy = [line for line in result.stderr.splitlines() if "warn" in line.lower() or "has no effect" in line]
    assert not noisy, noisy
