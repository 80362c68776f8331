"""benchmarks/bench_modules.py on small shapes: every case timed, RMSNorm and RoPE against their composite formulas."""

from benchmarks import bench_modules


def test_small_module_benchmark_compares_with_the_composites(capsys):
    results = bench_modules.main(
        ["--batch-size", "2", "--seq-len", "16", "--heads", "2", "--head-dim", "8", "--dim", "32", "--repeats", "1"]
    )
    out = capsys.readouterr().out
    assert set(results) == {"RoPE (q), composite", "RoPE (q), ours", "RMSNorm, composite", "RMSNorm, ours"}
    assert "| RoPE (q), ours |" in out and "output bitwise, gradient bitwise" in out  # the C kernel's bits
    assert "| RMSNorm, ours |" in out and "output bitwise" in out  # the forward is the composite's bits
    # no fp32 copy of the input saved for backward
    assert results["RMSNorm, ours"]["saved_mb"] < results["RMSNorm, composite"]["saved_mb"]
