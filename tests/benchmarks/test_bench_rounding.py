"""benchmarks/bench_rounding.py on the tiny model: our variants and torch's step each parameter and the
table lists them (torchao's compiles per shape, seconds each, and torch-optimi is no dependency: the
docs' run covers those)."""

from benchmarks import bench_rounding


def test_tiny_rounding_benchmark_prints_every_variant(capsys):
    variants = ["ours", "ours_pool", "ours_inductor", "ours_plain_path", "plain", "plain_fused"]
    args = ["--size", "tiny", "--steps", "1", "--warmup", "0", "--variants", ",".join(variants)]
    assert bench_rounding.main(args) == 0
    assert bench_rounding.main([*args, "--torch-op-between"]) == 0
    out = capsys.readouterr().out
    assert all(out.count(f"| {v} |") == 2 for v in variants), out
    assert "one before each parameter" in out
