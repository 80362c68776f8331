"""benchmarks/bench_export.py on a tiny model: the export runs in its child, the sizes and peaks come out,
and the folders are removed."""

import json

from benchmarks import bench_export

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


def test_tiny_export_benchmark(tmp_path, capsys):
    out = tmp_path / "bench.json"
    result = bench_export.main([*TINY, "--dir", str(tmp_path), "--json", str(out)])
    assert json.loads(out.read_text())["export_peak_rss_bytes"] == result["export_peak_rss_bytes"]
    # 256 x 64 embedding and output, one layer: the exported files hold every weight (plus headers)
    assert result["largest_tensor_bytes"] == 256 * 64 * 4
    assert result["model_bytes"] <= result["exported_bytes"] < result["model_bytes"] + 10_000
    assert result["export_peak_rss_bytes"] > 0 and result["imports_peak_rss_bytes"] > 0
    assert "| model (fp32) |" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [out]
