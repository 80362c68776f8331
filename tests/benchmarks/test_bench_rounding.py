"""benchmarks/bench_rounding.py on the tiny model: our variants and torch's step each parameter and the
table lists them (torchao's compiles per shape, seconds each, and torch-optimi is no dependency: the
docs' run covers those)."""

from benchmarks import bench_rounding


def test_tiny_rounding_benchmark_prints_every_variant(capsys):
    variants = ["ours", "ours_inductor", "ours_plain_path", "plain", "plain_fused"]
    assert (
        bench_rounding.main(["--size", "tiny", "--steps", "1", "--warmup", "0", "--variants", ",".join(variants)]) == 0
    )
    out = capsys.readouterr().out
    assert all(f"| {v} |" in out for v in variants), out
