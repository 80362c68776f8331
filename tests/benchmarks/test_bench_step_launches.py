"""benchmarks/bench_step_launches.py on the tiny config: our step is counted on the CUDA code path and the
table lists every kind."""

import json

from benchmarks import bench_step_launches


def test_tiny_config_counts_and_table(tmp_path, capsys):
    out = tmp_path / "counts.json"
    args = ["--config", "llama2/tiny_full", "--seq-len", "64", "--batch-size", "2", "--packed", "both"]
    assert bench_step_launches.main([*args, "--json", str(out), "dtype=bf16", "bf16_stochastic_rounding=True"]) == 0
    printed = capsys.readouterr().out
    assert "| ours | unpacked | unlogged |" in printed and "| ours | packed | logged |" in printed
    results = json.loads(out.read_text())["results"]
    for name in ("ours_unpacked", "ours_packed"):
        unlogged, logged = results[name]["unlogged"], results[name]["logged"]
        assert unlogged["total"] > 0 and unlogged["optimizer_params"] == results[name]["parameters"]
        assert logged["syncs"] >= 1  # a logged step reads its metrics
