"""benchmarks/bench_loss.py on a tiny shape: the three losses run, and the counted memory ranks them as
their designs say (the counts are deterministic: storages created by the losses' ops)."""

import json

from benchmarks import bench_loss


def test_tiny_loss_benchmark_counts_less_memory_for_the_vocab_slices(tmp_path, capsys):
    out = tmp_path / "loss.json"
    result = bench_loss.main(
        ["--rows", "256", "--dim", "32", "--vocab", "2000", "--chunks", "8", "--repeats", "2", "--json", str(out)]
    )
    assert set(result) == {"plain", "rows", "vocab"}
    # 256 rows x 2000 fp32 logits are 2.05 MB; one vocabulary slice of them 0.26 MB; the weight gradient
    # (2000 x 32 x 4 = 0.26 MB) and the input gradient are in every figure
    plain, rows, vocab = (result[n]["peak_bytes"] for n in ("plain", "rows", "vocab"))
    assert plain > 2 * 2.05e6  # the logits and their fp32 log-probabilities at once
    assert vocab < 1.5e6 < rows < plain  # two row chunks of 128 rows hold 1 MB of logits each
    assert json.loads(out.read_text())["results"]["vocab"]["peak_bytes"] == vocab
    assert "vocab" in capsys.readouterr().out
