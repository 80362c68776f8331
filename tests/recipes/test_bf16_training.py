"""bf16 training learns: with stochastic rounding a bf16 run tracks the fp32 run; round-to-nearest does not.

bf16 arithmetic on this CPU is emulated and slow, so the model is small; embed_dim 128 gives the RMSNorm
scales 640 elements, enough for their mean change to be measured within a few percent.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests._helpers.tiny_run import make_tiny_run, read_losses
from tests._helpers.tiny_run import run_recipe as _run
from torchtune.training.metric_logging import read_metrics

EMBED = 512
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(
        tmp_path_factory.mktemp("bf16"),
        num_examples=40,
        model_dims={"embed_dim": EMBED},
        epochs=1,
        batch_size=2,
        max_steps_per_epoch=20,
        lr_scheduler=None,
        **{"optimizer.lr": 2e-5},
    )


def _mean_change(model, base):
    """Mean |w - w0| of the RMSNorm scales and of the attention/MLP projections."""
    changes = {"norm": [], "proj": []}
    for name, param in model.named_parameters():
        group = "norm" if "norm" in name else "proj" if any(k in name for k in PROJECTIONS) else None
        if group:
            start = base[name].to(param.dtype).float()  # a bf16 run starts from the rounded weights
            changes[group].append((param.detach().float() - start).abs().flatten())
    return {group: torch.cat(values).mean().item() for group, values in changes.items()}


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    from torchtune.models.llama2._convert_weights import hf_to_tune

    out = tmp_path_factory.mktemp("runs")
    base = hf_to_tune(
        load_file(str(Path(tiny).parent / "base" / "model.safetensors")), num_heads=4, num_kv_heads=2, dim=EMBED
    )
    results = {}
    for name, overrides in {
        "fp32": {"dtype": "fp32"},
        "stochastic": {"dtype": "bf16", "bf16_stochastic_rounding": True},
        "nearest": {"dtype": "bf16", "bf16_stochastic_rounding": False},
    }.items():
        recipe = _run(tiny, output_dir=str(out / name), **overrides)
        results[name] = {
            "change": _mean_change(recipe._model, base),
            "losses": read_losses(out / name),
            "weights_changed": [r.get("weights_changed") for r in read_metrics(out / name / "logs" / "metrics.jsonl")],
        }
    return results


def test_stochastic_rounding_tracks_fp32_and_nearest_does_not(runs):
    fp32, sr, rtn = runs["fp32"], runs["stochastic"], runs["nearest"]
    assert len(fp32["losses"]) == len(sr["losses"]) == len(rtn["losses"]) == 20
    for group in ("norm", "proj"):
        assert sr["change"][group] == pytest.approx(fp32["change"][group], rel=0.2), (group, runs)
    # round-to-nearest: an Adam step of 2e-5 is below half a bf16 step at |w| ~ 1, the scales never move
    assert rtn["change"]["norm"] == 0.0
    assert rtn["change"]["proj"] < 0.5 * fp32["change"]["proj"]
    gap = lambda run: sum(abs(a - b) for a, b in zip(run["losses"], fp32["losses"])) / 20  # noqa: E731
    print({k: {**v["change"], "loss_gap": gap(v)} for k, v in runs.items()})  # docs/optimizers.md quotes these
    assert gap(sr) < 0.25 * gap(rtn), (gap(sr), gap(rtn))
    assert fp32["losses"][-1] < fp32["losses"][0] and sr["losses"][-1] < sr["losses"][0]


def test_weights_changed_is_logged_and_shows_the_lost_updates(runs):
    fp32, sr, rtn = (runs[k]["weights_changed"] for k in ("fp32", "stochastic", "nearest"))
    assert fp32 == [None] * len(fp32)  # fp32 updates are never lost: not counted (it would copy every weight)
    assert all(0 < r < s < 0.5 for r, s in zip(rtn, sr))  # bf16: a share moves, more of it with rounding


def test_bf16_stochastic_rounding_resumes_exactly(tmp_path):
    config = make_tiny_run(tmp_path, num_examples=12, epochs=1, batch_size=2, dtype="bf16")
    over = {"bf16_stochastic_rounding": True, "optimizer.lr": 1e-4}
    full = tmp_path / "full"
    _run(config, output_dir=str(full), save_every_n_steps=3, **over)
    resumed = tmp_path / "resumed"
    _run(
        config,
        output_dir=str(resumed),
        resume_from_checkpoint=True,
        **over,
        **{"checkpointer.recipe_checkpoint": str(full / "step_3" / "recipe_state.pt")},
    )
    assert read_losses(resumed) == read_losses(full)[3:]  # identical, not just close
    a, b = (
        load_file(str(full / "epoch_0" / "model-00001-of-00001.safetensors")),
        load_file(str(resumed / "epoch_0" / "model-00001-of-00001.safetensors")),
    )
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_resume_needs_the_saved_rounding_stream(tmp_path, monkeypatch):
    """Without the saved stream counters the resumed run draws other bits: the state is what makes it exact."""
    from torchtune.training import StochasticRounding

    config = make_tiny_run(tmp_path, num_examples=12, epochs=1, batch_size=2, dtype="bf16")
    over = {"bf16_stochastic_rounding": True, "optimizer.lr": 1e-4}
    full = tmp_path / "full"
    _run(config, output_dir=str(full), save_every_n_steps=3, **over)
    monkeypatch.setattr(StochasticRounding, "load_state_dict", lambda self, state: None)
    resumed = tmp_path / "resumed"
    _run(
        config,
        output_dir=str(resumed),
        resume_from_checkpoint=True,
        **over,
        **{"checkpointer.recipe_checkpoint": str(full / "step_3" / "recipe_state.pt")},
    )
    a, b = (
        load_file(str(full / "epoch_0" / "model-00001-of-00001.safetensors")),
        load_file(str(resumed / "epoch_0" / "model-00001-of-00001.safetensors")),
    )
    assert any(not torch.equal(a[n], b[n]) for n in a)


def test_flagship_settings_on_cpu_give_the_losses_of_the_plain_path(tmp_path):
    """llama2/7B_full_low_memory's switches on a tiny model (bf16, stochastic rounding, PagedAdamW in
    backward, chunked loss, activation checkpointing and offloading): checkpointing and offloading change
    memory, not the math, so the losses and weights are those of the run without them, bit for bit; and
    they track the fp32 run."""
    flagship = {
        "dtype": "bf16",
        "bf16_stochastic_rounding": True,
        "optimizer_in_bwd": True,
        "optimizer._component_": "bitsandbytes.optim.PagedAdamW",
        "loss": {"_component_": "torchtune.modules.loss.ChunkedCrossEntropyLoss", "num_output_chunks": 8},
        "enable_activation_checkpointing": True,
        "enable_activation_offloading": True,
    }
    config = make_tiny_run(tmp_path, num_examples=16, epochs=1, batch_size=2, max_steps_per_epoch=6)
    _run(config, output_dir=str(tmp_path / "flagship"), **flagship)
    plain = {**flagship, "enable_activation_checkpointing": False, "enable_activation_offloading": False}
    _run(config, output_dir=str(tmp_path / "plain"), **plain)
    _run(config, output_dir=str(tmp_path / "fp32"), **{**plain, "dtype": "fp32"})
    losses = read_losses(tmp_path / "flagship")
    assert len(losses) == 6
    assert losses == read_losses(tmp_path / "plain")
    a = load_file(str(tmp_path / "flagship" / "epoch_0" / "model-00001-of-00001.safetensors"))
    b = load_file(str(tmp_path / "plain" / "epoch_0" / "model-00001-of-00001.safetensors"))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert losses == pytest.approx(read_losses(tmp_path / "fp32"), abs=0.03)
    assert losses[-1] < losses[0] - 0.05


def test_apollo_mini_bf16_updates_land_with_stochastic_rounding(tmp_path):
    """APOLLO-Mini (apollo-torch) on the projections, torch AdamW on the rest: its bf16 updates are rounded
    stochastically too (the step runs on fp32 copies of the one matrix), so the bf16 run tracks fp32 and
    round-to-nearest loses most of the update. A smaller model than above: bf16 is emulated and slow here."""
    pytest.importorskip("apollo_torch")
    from torchtune.models.llama2._convert_weights import hf_to_tune

    embed, steps = 128, 8
    (tmp_path / "run").mkdir()
    config = make_tiny_run(
        tmp_path / "run", num_examples=2 * steps, model_dims={"embed_dim": embed}, epochs=1, batch_size=2
    )
    base = hf_to_tune(
        load_file(str(tmp_path / "run" / "base" / "model.safetensors")), num_heads=4, num_kv_heads=2, dim=embed
    )
    node = {
        "_component_": "apollo_torch.APOLLOAdamW",
        "lr": 2e-5,
        "weight_decay": 0.0,
        "rank": 1,
        "proj": "random",
        "scale_type": "tensor",
        "scale": 128,
        "update_proj_gap": 200,
        "proj_type": "std",
        "rest": {"_component_": "torch.optim.AdamW", "lr": 2e-5, "weight_decay": 0.0},
    }
    runs = {}
    for name, overrides in {
        "fp32": {"dtype": "fp32"},
        "stochastic": {"dtype": "bf16", "bf16_stochastic_rounding": True},
        "nearest": {"dtype": "bf16", "bf16_stochastic_rounding": False},
    }.items():
        out = tmp_path / name
        recipe = _run(config, output_dir=str(out), optimizer=node, lr_scheduler=None, **overrides)
        runs[name] = {"change": _mean_change(recipe._model, base), "losses": read_losses(out)}
    fp32, sr, rtn = runs["fp32"], runs["stochastic"], runs["nearest"]
    assert len(fp32["losses"]) == steps
    assert sr["change"]["proj"] == pytest.approx(fp32["change"]["proj"], rel=0.2), runs
    assert rtn["change"]["proj"] < 0.5 * fp32["change"]["proj"], runs
