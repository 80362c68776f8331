"""benchmarks/bench_checkpoint.py on a tiny model: both variants save and load bit for bit, and the
table and ratios come out."""

import json

from benchmarks import bench_checkpoint

TINY = [
    "--vocab-size",
    "256",
    "--num-layers",
    "1",
    "--num-heads",
    "4",
    "--embed-dim",
    "64",
    "--intermediate-dim",
    "128",
]


def test_tiny_checkpoint_benchmark(tmp_path, capsys):
    out = tmp_path / "bench.json"
    result = bench_checkpoint.main([*TINY, "--repeats", "2", "--dir", str(tmp_path), "--json", str(out)])
    assert json.loads(out.read_text())["ratios"] == result["ratios"]
    assert set(result["ratios"]) == {
        "save ours / plain",
        "save ours / plain+fsync",
        "load ours / plain",
        "save ours / plain (cpu)",
        "load ours / plain (cpu)",
    }
    assert all(len(v) == 2 for v in result["all"].values())  # every operation timed in each repeat
    # ours holds the same tensors plus manifest and config: a little larger than the plain files
    assert result["bytes"]["plain"] < result["bytes"]["ours"] < 1.1 * result["bytes"]["plain"] + 10_000
    assert "| save ours |" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [out]  # the checkpoints were removed
