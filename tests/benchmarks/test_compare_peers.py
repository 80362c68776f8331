"""benchmarks/compare_peers.py's pieces that run without the peers' venvs: the dtype it picks (and says
why), the whole-epoch summary, and our side of the comparison's config."""

import argparse
import json

import pytest

from benchmarks import compare_peers


def test_dtype_auto_says_why():
    assert compare_peers.resolve_dtype("auto", "cuda") == ("bf16", "auto: CUDA")
    dtype, why = compare_peers.resolve_dtype("auto", "cpu")
    assert dtype in ("bf16", "fp32") and why.startswith("auto")
    assert compare_peers.resolve_dtype("fp32", "cpu") == ("fp32", "as asked (--dtype)")


def test_summary_is_trained_tokens_over_the_whole_epoch():
    runs = [
        {"setup_s": 2.0, "epoch_wall_s": 10.0, "epoch_cpu_s": 5.0, "steps": 2, "trained": [30, 70],
         "positions": [100, 100], "real": [90, 100]},
        {"setup_s": 4.0, "epoch_wall_s": 20.0, "epoch_cpu_s": 5.0, "steps": 2, "trained": [30, 70],
         "positions": [100, 100], "real": [90, 100]},
        {"setup_s": 3.0, "epoch_wall_s": 12.5, "epoch_cpu_s": 4.0, "steps": 2, "trained": [30, 70],
         "positions": [100, 100], "real": [90, 100]},
    ]  # fmt: skip
    s = compare_peers.summarize(runs)
    assert s["tok_s"] == pytest.approx(100 / 12.5)  # the median run, not the mean of steps
    assert s["tok_cpu_s"] == pytest.approx(100 / 5.0)
    assert s["padding"] == pytest.approx(0.05)
    assert s["setup_s"] == 3.0


def test_our_config_runs_a_whole_epoch_with_the_best_settings(tmp_path):
    args = argparse.Namespace(size="tiny", batch_size=4, seq_len=512, device="cpu", dtype="fp32", compile=False)
    assets = {"data": tmp_path / "d.json", "tokenizer": tmp_path / "t.model", "checkpoint": tmp_path / "ckpt"}
    cfg = compare_peers.recipe_config("ours", assets, tmp_path / "out", args)
    assert cfg["max_steps_per_epoch"] is None and cfg["epochs"] == 1
    assert cfg["dataset"]["packed"] is True and cfg["dataset"]["train_on_input"] is False
    assert cfg["optimizer_in_bwd"] is True and cfg["optimizer_in_bwd_group"] == "layer"
    assert cfg["loss"] == {"_component_": "torchtune.modules.loss.VocabChunkedCrossEntropyLoss", "num_output_chunks": 8}
    assert compare_peers.recipe_config("torchtune", assets, tmp_path / "tt", args)["loss"]["_component_"].endswith(
        "CEWithChunkedOutputLoss"
    )


def test_variants_of_ours_join_the_peers_with_their_overrides_and_environment():
    plan = compare_peers.run_plan(
        ["ours", "trl"], ["glibc malloc default:env:GLIBC_TUNABLES=glibc.malloc.tcache_count=7", "no sr:a.b=False"]
    )
    assert [(r["name"], r["impl"], r["label"]) for r in plan] == [
        ("ours", "ours", "ours"),
        ("trl", "trl", "trl"),
        ("glibc malloc default", "ours", "ours, glibc malloc default"),
        ("no sr", "ours", "ours, no sr"),
    ]
    assert plan[2]["env"] == {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"} and plan[2]["overrides"] == []
    assert plan[3]["overrides"] == ["a.b=False"] and plan[3]["env"] == {}
    with pytest.raises(SystemExit, match="own name"):
        compare_peers.run_plan(["ours", "trl"], ["trl:seed=1"])


def test_profile_summary_is_the_median_run_of_per_step_medians_and_epoch_totals():
    def run(scale):
        phase = {"wall": [scale * 1.0, scale * 3.0, scale * 2.0], "cpu": [scale * 2.0, scale * 2.0, scale * 8.0]}
        return {"profile": {p: phase for p in (*compare_peers.PHASES, "step")}, "profile_timestamps": 30, "steps": 3}

    s = compare_peers.summarize_profile([run(1.0), run(10.0), run(2.0)])
    assert s["forward"] == {"step_wall_s": 4.0, "step_cpu_s": 4.0, "epoch_wall_s": 12.0, "epoch_cpu_s": 24.0}
    assert s["timestamps"] == {"per_step": 10.0}
    assert compare_peers.summarize_profile([run(1.0), {}]) is None  # a run without a profile: no table


def test_ours_and_a_variant_run_end_to_end_with_the_profile(tmp_path, capsys):
    """The real worker on the tiny model: every step profiled (the hooks found the recipe's loss and
    optimizer), and a variant's environment reaches its process (here: no profile)."""
    out = tmp_path / "result.json"
    argv = ["--peers", "ours", "--size", "tiny", "--examples", "8", "--batch-size", "2", "--seq-len", "128"]
    argv += ["--repeats", "1", "--dtype", "fp32", "--variant", "unprofiled:env:COMPARE_PEERS_PROFILE=0"]
    compare_peers.main(argv + ["--json", str(out)])
    result = json.loads(out.read_text())
    ours, unprofiled = result["runs"]["ours"][0], result["runs"]["unprofiled"][0]
    assert "profile" not in unprofiled and list(result["profile"]) == ["ours"]
    profile = ours["profile"]
    assert len(profile["step"]["wall"]) == ours["steps"] > 1
    # the step hooks cover the epoch: the gaps between them (the loop's own bookkeeping) are small beside it, also
    # on a loaded machine, where they are not below any fixed number of milliseconds
    assert sum(profile["step"]["wall"]) == pytest.approx(ours["epoch_wall_s"], rel=0.05, abs=1e-3)
    for phase in ("forward", "loss", "backward", "optimizer", "data"):
        assert all(t > 0 for t in profile[phase]["wall"][:-1]), phase  # the last step fetches no batch
    assert "| ours | " in capsys.readouterr().out
