"""The full_finetune_single_device recipe: in-backward == standard, exact resume, CLI run."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests._helpers.tiny_run import make_tiny_run, read_losses, run_tune
from tests._helpers.tiny_run import run_recipe as _run


def _final_weights(output_dir: Path) -> dict:
    epochs = sorted(Path(output_dir).glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))
    return load_file(str(epochs[-1] / "model-00001-of-00001.safetensors"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("tiny"))


def test_in_backward_matches_standard_adamw(tiny, tmp_path):
    a = _run(tiny, output_dir=str(tmp_path / "bwd"), optimizer_in_bwd=True)
    b = _run(tiny, output_dir=str(tmp_path / "std"), optimizer_in_bwd=False)
    losses_a, losses_b = read_losses(tmp_path / "bwd"), read_losses(tmp_path / "std")
    assert len(losses_a) == len(losses_b) == 12
    assert losses_a == pytest.approx(losses_b, abs=1e-6)
    assert losses_a[-1] < losses_a[0]
    wa, wb = _final_weights(tmp_path / "bwd"), _final_weights(tmp_path / "std")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0, msg=name)
    assert a.global_step == b.global_step == 12


def test_lr_logged_is_the_cosine_schedule(tiny, tmp_path):
    from torchtune.training.metric_logging import read_metrics

    _run(tiny, output_dir=str(tmp_path / "o"), epochs=1)
    lrs = [row["lr"] for row in read_metrics(tmp_path / "o" / "logs" / "metrics.jsonl")]
    # torchtune's warm-up over 2 steps, from LR 0, then a half cosine over the remaining 4 of the (one-epoch) run
    peak = 1e-3
    cosine = [0.5 * (1 + math.cos(math.pi * k / 4)) * peak for k in range(1, 4)]
    assert lrs == pytest.approx([0.0, peak / 2, peak, *cosine], abs=1e-12)


def test_lr_warmup_from_zero_false_is_one_step_ahead(tiny, tmp_path):
    from torchtune.training.metric_logging import read_metrics

    _run(tiny, output_dir=str(tmp_path / "o"), epochs=1, **{"lr_scheduler.warmup_from_zero": False})
    lrs = [row["lr"] for row in read_metrics(tmp_path / "o" / "logs" / "metrics.jsonl")]
    peak = 1e-3
    cosine = [0.5 * (1 + math.cos(math.pi * k / 4)) * peak for k in range(1, 4)]
    assert lrs == pytest.approx([peak / 3, 2 * peak / 3, peak, *cosine], abs=1e-12)


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
@pytest.mark.parametrize("resume_from", ["step_4", "step_8", "epoch_0"])
def test_exact_resume(tiny, tmp_path, optimizer_in_bwd, resume_from):
    full_dir = tmp_path / "full"
    _run(tiny, output_dir=str(full_dir), optimizer_in_bwd=optimizer_in_bwd, save_every_n_steps=4)
    full_losses = read_losses(full_dir)
    assert (full_dir / resume_from / "recipe_state.pt").exists()

    resumed_dir = tmp_path / "resumed"
    recipe = _run(
        tiny,
        output_dir=str(resumed_dir),
        optimizer_in_bwd=optimizer_in_bwd,
        resume_from_checkpoint=True,
        **{"checkpointer.recipe_checkpoint": str(full_dir / resume_from / "recipe_state.pt")},
    )
    start = {"step_4": 4, "step_8": 8, "epoch_0": 6}[resume_from]
    assert read_losses(resumed_dir) == full_losses[start:]  # identical, not just close
    assert recipe.global_step == 12
    wa, wb = _final_weights(full_dir), _final_weights(resumed_dir)
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_gradient_accumulation_2_x_batch_2_is_the_step_of_batch_4(tiny, tmp_path):
    # The micro-batches of a step hold different numbers of label tokens (the examples differ in
    # length), so only a token-weighted accumulation gives the step of the batch of 4.
    std = dict(optimizer_in_bwd=False, epochs=1)
    _run(tiny, output_dir=str(tmp_path / "ga"), gradient_accumulation_steps=2, batch_size=2, **std)
    _run(tiny, output_dir=str(tmp_path / "b4"), gradient_accumulation_steps=1, batch_size=4, **std)
    losses_ga, losses_b4 = read_losses(tmp_path / "ga"), read_losses(tmp_path / "b4")
    assert len(losses_ga) == len(losses_b4) == 6
    assert losses_ga == pytest.approx(losses_b4, abs=2e-6)
    wa, wb = _final_weights(tmp_path / "ga"), _final_weights(tmp_path / "b4")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=2e-6, rtol=0, msg=name)


def test_clipping_clips_the_update_to_max_norm(tiny, tmp_path):
    """One SGD step: the clipped update is the unclipped one times max_norm / grad_norm, and the logged
    grad_norm is the norm before clipping (above max_norm)."""
    from torchtune.training.metric_logging import read_metrics

    one_sgd_step = {
        "optimizer_in_bwd": False,
        "epochs": 1,
        "max_steps_per_epoch": 1,
        "lr_scheduler": None,
        "optimizer": {"_component_": "torch.optim.SGD", "lr": 10.0},  # updates far above fp32's resolution
    }
    base = load_file(str(Path(tiny).parent / "base" / "model.safetensors"))
    _run(tiny, output_dir=str(tmp_path / "free"), **one_sgd_step)
    _run(tiny, output_dir=str(tmp_path / "clip"), clip_grad_norm=0.05, **one_sgd_step)
    (free,) = read_metrics(tmp_path / "free" / "logs" / "metrics.jsonl")
    (clip,) = read_metrics(tmp_path / "clip" / "logs" / "metrics.jsonl")
    assert clip["grad_norm"] == pytest.approx(free["grad_norm"], rel=1e-6)
    assert clip["grad_norm"] > 0.05 * 10  # the gradient was well above the limit...
    factor = 0.05 / (free["grad_norm"] + 1e-6)  # ...so clip_grad_norm_ scales it by this
    wf, wc = _final_weights(tmp_path / "free"), _final_weights(tmp_path / "clip")
    for name in base:
        torch.testing.assert_close(wc[name] - base[name], (wf[name] - base[name]) * factor, rtol=1e-3, atol=1e-6)


def test_grad_norm_is_logged_in_both_modes_and_agrees(tiny, tmp_path):
    from torchtune.training.metric_logging import read_metrics

    _run(tiny, output_dir=str(tmp_path / "a"), optimizer_in_bwd=True, epochs=1)
    _run(tiny, output_dir=str(tmp_path / "b"), optimizer_in_bwd=False, epochs=1)
    ga = [r["grad_norm"] for r in read_metrics(tmp_path / "a" / "logs" / "metrics.jsonl")]
    gb = [r["grad_norm"] for r in read_metrics(tmp_path / "b" / "logs" / "metrics.jsonl")]
    assert ga == pytest.approx(gb, rel=1e-4)
    assert all(g > 0 for g in ga)


def test_cli_run_logs_per_step_losses(tiny, tmp_path):
    out = tmp_path / "cli"
    proc = run_tune(
        [
            "full_finetune_single_device",
            "--config",
            str(tiny),
            f"output_dir={out}",
            "epochs=1",
            "max_steps_per_epoch=3",
            "seed=7",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    in_process_dir = tmp_path / "inproc"
    _run(tiny, output_dir=str(in_process_dir), epochs=1, max_steps_per_epoch=3, seed=7)
    cli_losses = read_losses(out)
    assert len(cli_losses) == 3
    assert cli_losses == read_losses(in_process_dir)
    assert (out / "epoch_0" / "model-00001-of-00001.safetensors").exists()
    assert (out / "epoch_0" / "config.json").exists()


def test_head_count_mismatch_with_config_json_is_an_error(tmp_path):
    # Same hidden size, other split into heads: every shape matches, only the heads differ.
    import json

    from torchtune import TuneError

    config_path = make_tiny_run(tmp_path)
    hf_config = tmp_path / "base" / "config.json"
    data = json.loads(hf_config.read_text())
    data.update(num_attention_heads=8, num_key_value_heads=4)
    hf_config.write_text(json.dumps(data))
    with pytest.raises(TuneError, match="num_attention_heads=8"):
        _run(config_path, output_dir=str(tmp_path / "o"))
