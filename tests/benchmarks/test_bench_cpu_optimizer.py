"""benchmarks/bench_cpu_optimizer.py's smoke mode: our rows and torch's fused AdamW step a tiny parameter and the
table lists them at one thread and at two (torchao compiles its step, seconds; DeepSpeed lives in its own venv:
the docs' run covers those)."""

from benchmarks import bench_cpu_optimizer


def test_smoke_run_prints_every_row_at_each_thread_count(capsys):
    rows = [*bench_cpu_optimizer.OURS, "torch AdamW fused fp32"]
    assert bench_cpu_optimizer.main(["--smoke", "--threads", "2", "--only", ",".join(rows)]) == 0
    out = capsys.readouterr().out
    assert "| 1 thread: M params per CPU-second (wall M params/s) | 2 threads: M params/s (CPU s a step) |" in out
    for row in rows:
        (line,) = [x for x in out.splitlines() if x.startswith(f"| {row} |")]
        assert len(line.split("|")) == 6, line  # the row, two thread counts, the ratio column
