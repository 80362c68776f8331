"""benchmarks/bench_optimizers.py on a tiny model: runs saved one optimizer per process merge into one
table, a changed setting names its row, and runs of another benchmark are refused."""

import json

import pytest

from benchmarks import bench_optimizers

TINY = ["--steps", "3", "--warmup", "1", "--vocab-size", "256", "--layers", "1", "--dim", "64"]
TINY += ["--batch-size", "1", "--seq-len", "8", "--active-vocab", "64", "--held-out-batches", "1"]


def test_runs_saved_apart_merge_into_one_table(tmp_path, capsys):
    pytest.importorskip("apollo_torch")
    adamw, mini = tmp_path / "adamw.json", tmp_path / "mini.json"
    assert bench_optimizers.main([*TINY, "--optimizers", "adamw", "--json", str(adamw)]) == 0
    changed = ["--set", "apollo_mini.scale=128"]
    assert bench_optimizers.main([*TINY, "--optimizers", "apollo_mini", *changed, "--json", str(mini)]) == 0
    saved = json.loads(mini.read_text())["results"]["apollo_mini scale=128"]
    # the record holds the settings it ran with: the change, and rank-1 tensor scaling (what makes it Mini)
    assert (saved["optimizer"]["scale"], saved["optimizer"]["rank"], saved["optimizer"]["scale_type"]) == (
        128,
        1,
        "tensor",
    )
    capsys.readouterr()
    assert bench_optimizers.main(["--table", str(adamw), str(mini)]) == 0
    rows = {line.rsplit(None, 4)[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["adamw"][2] == "1.000"
    base = json.loads(adamw.read_text())["results"]["adamw"]["held_out_loss"]
    assert rows["apollo_mini scale=128"][3] == f"{saved['held_out_loss'] / base:.3f}"


def test_table_refuses_runs_of_another_benchmark(tmp_path):
    first, other = tmp_path / "a.json", tmp_path / "b.json"
    bench_optimizers.main([*TINY, "--optimizers", "adamw", "--json", str(first)])
    bench_optimizers.main([*TINY, "--optimizers", "adamw", "--lr", "0.01", "--json", str(other)])
    with pytest.raises(SystemExit, match=r"another benchmark .*'lr': \(0.001, 0.01\).*same arguments"):
        bench_optimizers.main(["--table", str(first), str(other)])


def test_set_names_an_optimizer_of_the_run():
    with pytest.raises(SystemExit):  # argparse's error: the message names the expected form
        bench_optimizers.main([*TINY, "--optimizers", "adamw", "--set", "galore.scale=2"])
