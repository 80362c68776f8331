"""benchmarks/bench_step.py on a tiny model: it runs the recipe's step (torchtune.training.TrainStep),
counts like the recipe, and produces the table and the ratios."""

import json

import pytest

from benchmarks import bench_step

TINY = [
    "--vocab-size",
    "256",
    "--num-layers",
    "2",
    "--num-heads",
    "4",
    "--embed-dim",
    "64",
    "--max-seq-len",
    "64",
    "--seq-len",
    "32",
    "--batch-size",
    "2",
    "--threads",
    "1",
]


def test_tiny_benchmark_table_and_ratios(tmp_path, capsys):
    # torchao's AdamW8bit compiles its step on first use (tens of seconds on CPU), so it is left
    # out here; bitsandbytes covers the 8-bit in-backward path.
    out = tmp_path / "bench.json"
    result = bench_step.main(
        [
            *TINY,
            "--steps",
            "3",
            "--warmup",
            "1",
            "--dtype",
            "fp32",
            "--variants",
            "adamw,adamw_bwd,bnb_adamw8bit_bwd",
            "--json",
            str(out),
        ]
    )
    table = capsys.readouterr().out
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == ["adamw", "adamw_bwd", "bnb_adamw8bit_bwd"]
    assert rows["adamw"]["step_ratio"] == rows["adamw"]["tokens_per_s_ratio"] == 1.0
    for name, r in rows.items():
        assert len(r["step_times_s"]) == result["timed_rounds"] == 3
        assert r["step_s_median"] > 0 and r["tokens_per_s_ratio"] > 0
        assert f"| {name} |" in table
        # non-padding tokens: the second row of each batch is a quarter padding
        assert r["tokens"] == [32 + 24] * 3
    assert "step vs adamw" in table and "tokens/s vs adamw" in table
    # the same weights and batches: torch AdamW in backward == standard AdamW, step for step
    assert rows["adamw_bwd"]["losses"] == pytest.approx(rows["adamw"]["losses"], abs=1e-6)
    assert rows["adamw"]["losses"][-1] < rows["adamw"]["losses"][0]


def test_count_is_the_recipes_own():
    cfg = bench_step.bench_config(
        "adamw",
        {
            **bench_step.DEFAULT_MODEL,
            "vocab_size": 64,
            "num_layers": 1,
            "num_heads": 2,
            "num_kv_heads": 2,
            "embed_dim": 16,
        },
        "fp32",
        "cpu",
    )
    from torchtune.training import TrainingData

    batch = bench_step.synthetic_batches(1, 4, 16, 64)[0]
    expected = int((batch["tokens"] != bench_step.PAD_ID).sum())
    recipes_count = TrainingData(dataloader=None, sampler=None, pad_id=bench_step.PAD_ID).num_tokens(batch)
    assert bench_step.count_tokens(batch) == recipes_count == expected < 4 * 16
    step = bench_step.build_step(cfg)
    assert step.model.tok_embeddings.num_embeddings == 64


def test_unknown_variant_is_refused():
    with pytest.raises(SystemExit, match="unknown variant"):
        bench_step.main([*TINY, "--variants", "adamw,sgd"])


def test_logging_variants_only_observe_the_step(tmp_path):
    """The variants that price a logged step's work (row, gradient norm, weight-change count) train
    exactly as the plain in-backward step: they add reads, never a change to the update."""
    observers = ["adamw_bwd_logged", "adamw_bwd_grad_norm", "adamw_bwd_weights_changed"]
    result = bench_step.main(
        [*TINY, "--steps", "2", "--warmup", "1", "--dtype", "fp32", "--variants", ",".join(["adamw_bwd", *observers])]
    )
    rows = {r["variant"]: r for r in result["rows"]}
    for name in observers:
        assert rows[name]["losses"] == rows["adamw_bwd"]["losses"], name
