"""benchmarks/bench_matmul.py measures both layouts in both dtypes and says whether bf16 is native."""

from benchmarks import bench_matmul


def test_tiny_matmul_benchmark_reports_both_layouts_and_dtypes(capsys):
    result = bench_matmul.main(["--m", "8", "--k", "16", "--n", "24", "--repeats", "2"])
    assert set(result) == {"float32", "bfloat16"}
    for layouts in result.values():
        assert set(layouts) == {"forward x @ W.T", "input grad g @ W"}
        assert all(v > 0 for v in layouts.values())
    out = capsys.readouterr().out
    assert "native" in out or "emulated" in out
