"""``tune plot`` and ``torchtune.utils.plotting.plot_metrics``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchtune import TuneError
from torchtune.utils import plotting

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_metrics(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run_rows() -> list[dict]:
    rows = [{"step": s, "epoch": 0, "loss": 3.0 / s, "lr": 1e-3 * min(1.0, s / 5)} for s in range(1, 21)]
    rows.insert(10, {"step": 10, "heldout_loss": 0.5})  # an evaluation row without loss or lr
    return rows


def test_plot_metrics_writes_png(tmp_path):
    metrics = _write_metrics(tmp_path / "run" / "logs" / "metrics.jsonl", _run_rows())
    out = plotting.plot_metrics(metrics, tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_series_keeps_the_last_value_of_a_relogged_step():
    # A resumed run appends to metrics.jsonl and logs the steps after its checkpoint again.
    rows = [
        {"step": 1, "loss": 4.0},
        {"step": 2, "loss": 3.0},
        {"step": 2, "loss": 2.5},
        {"step": 3, "lr": 0.1},
        {"step": 3, "loss": True},
    ]
    assert plotting._series(rows, "loss") == ([1, 2], [4.0, 2.5])
    assert plotting._series(rows, "lr") == ([3], [0.1])


def test_plot_metrics_errors(tmp_path):
    with pytest.raises(TuneError, match="does not exist"):
        plotting.plot_metrics(tmp_path / "nope.jsonl", tmp_path / "x.png")
    empty = _write_metrics(tmp_path / "m.jsonl", [{"step": 1, "tokens_per_second": 5.0}])
    with pytest.raises(TuneError, match="no 'loss' values"):
        plotting.plot_metrics(empty, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_missing_matplotlib_gives_install_hint(tmp_path, monkeypatch):
    metrics = _write_metrics(tmp_path / "m.jsonl", _run_rows())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(TuneError, match="pip install matplotlib"):
        plotting.plot_metrics(metrics, tmp_path / "x.png")


def _tune() -> str:
    tune = Path(sys.executable).with_name("tune")
    assert tune.is_file(), f"the tune console script is not installed next to {sys.executable}"
    return str(tune)


def test_tune_plot_command(tmp_path):
    run_dir = tmp_path / "run"
    _write_metrics(run_dir / "logs" / "metrics.jsonl", _run_rows())
    out = tmp_path / "elsewhere.png"
    result = subprocess.run(
        [_tune(), "plot", str(run_dir), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert f"Wrote {out}" in result.stdout

    result = subprocess.run([_tune(), "plot", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_tune_plot_default_output_and_accepted_paths(tmp_path, capsys):
    from torchtune._cli.tune import main

    run_dir = tmp_path / "run"
    metrics = _write_metrics(run_dir / "logs" / "metrics.jsonl", _run_rows())
    for given in (run_dir, run_dir / "logs", metrics):
        assert main(["plot", str(given)]) == 0
        assert (run_dir / "metrics.png").read_bytes()[:8] == PNG_MAGIC
        (run_dir / "metrics.png").unlink()
    assert main(["plot", str(tmp_path)]) == 1  # a folder without logs/metrics.jsonl
    assert "holds no logs/metrics.jsonl" in " ".join(capsys.readouterr().err.split())  # wrapped at any width
