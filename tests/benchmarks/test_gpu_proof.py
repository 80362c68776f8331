"""benchmarks/gpu_proof.py on the CPU: its plan for the H200 machine, its refusals, the learn check's
verdict, and its smoke run (every phase, each in fresh processes) in an environment holding only the
GPU machine's packages plus the carried wheels, so a wheel the kit needs but does not carry fails here."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_memory_check, gpu_proof
from tests._helpers.gpu_machine import gpu_machine_python

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_python(tmp_path_factory):
    return gpu_machine_python(tmp_path_factory.mktemp("gpu_machine_env"))


def test_plan_for_the_h200_says_the_run_fits(capsys):
    assert gpu_proof.main(["--plan", "--target", "h200"]) == 0
    printed = capsys.readouterr().out
    assert "The run fits." in printed and "DOES NOT FIT" not in printed
    need = gpu_proof.needs(gpu_proof.Settings(_args()), list(gpu_proof.PHASES), REPO_ROOT / ".gpu_carry")
    # the bounds of the issue: disk below 60 GB, host RAM below 110 GiB, under 8 minutes, below 60 MiB carried
    assert 27 < need["disk_gb"] < 60  # 7B source checkpoint + 8-bit step checkpoint
    assert 54 / 1.074 < need["host_ram_gib"] < 110  # PagedAdamW's managed fp32 moments are 54 GB
    assert need["minutes"] < 8 and need["carry_mib"] < 60


def test_plan_and_run_on_a_machine_without_a_gpu_say_so(tmp_path):
    """It crashed in torch.cuda ("Torch not compiled with CUDA enabled") instead of saying there is no GPU."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for args in (["--plan"], ["--phases", "step", "--json", str(tmp_path / "r.json")]):
        result = subprocess.run(
            [sys.executable, "benchmarks/gpu_proof.py", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=gpu_proof.REPO_ROOT,
            timeout=300,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 1 and "Traceback" not in output, output[-3000:]
        assert "this machine has no CUDA GPU (PyTorch" in output and "--plan --target h200" in output


def test_plan_refuses_a_machine_that_lacks_room():
    need = gpu_proof.needs(gpu_proof.Settings(_args()), ["resume"], REPO_ROOT / ".gpu_carry")
    small = {"disk_gb": 20.0, "host_ram_gib": 200.0, "device_gb": 200.0, "minutes": 8.0, "carry_mib": 64.0}
    (problem,) = gpu_proof.check_plan(need, small, "the test machine")
    assert "GB of disk" in problem and "20.0" in problem


def test_unknown_phase_is_refused():
    with pytest.raises(SystemExit, match="unknown"):
        gpu_proof.main(["--phases", "step,speed", "--smoke"])


def test_leave_gb_with_a_paged_optimizer_is_refused():
    with pytest.raises(SystemExit, match="refused: a paged optimizer's state is CUDA managed memory"):
        gpu_memory_check.main(["--leave-gb", "16", "--optimizer", "bitsandbytes.optim.PagedAdamW8bit"])


def test_learn_verdict_fails_a_run_whose_updates_round_away():
    torch.manual_seed(0)
    delta = {"w": torch.randn(1000) * 1e-4}
    losses = [3.0] * 5 + [2.0] * 5
    runs = {
        "fp32": {"losses": losses, "deltas": delta},
        "bf16_rounding": {"losses": losses, "deltas": {"w": delta["w"] * 1.05}},
    }
    (fp32, rounded) = gpu_proof.learn_rows(runs)
    assert fp32["signed_mean_update"] == pytest.approx(1.0)
    assert rounded["within_bounds"] and rounded["signed_mean_update"] == pytest.approx(1.05)
    runs["bf16_rounding"] = {"losses": [3.0] * 10, "deltas": {"w": torch.zeros(1000)}}  # nothing learnt
    rounded = gpu_proof.learn_rows(runs)[1]
    assert not rounded["within_bounds"] and rounded["signed_mean_update"] == 0.0


def test_kit_imports_with_only_the_gpu_machines_packages(gpu_python):
    """Every module the kit and its phases import, lazily ones included, in the GPU machine's package set."""
    modules = [
        "benchmarks.gpu_proof",
        "benchmarks.gpu_memory_check",
        "benchmarks.compare_torchtune",
        "recipes.full_finetune_single_device",
        "torchtune._cli.tune",
        "torchtune.training.estimate._checkpoint_memory",
        "torchtune.datasets",
        "torchtune.models.llama2",
        "tests._helpers.tiny_run",
        "tests.conftest",
        "bitsandbytes.optim",
        "omegaconf",
        "yaml",
        "datasets",
        "sentencepiece",
        "safetensors.torch",
        "psutil",
    ]
    modules += [f"tests.gpu.{p.stem}" for p in sorted((REPO_ROOT / "tests" / "gpu").glob("test_*.py"))]
    # a test module that skips itself at import (lm_eval's, an optional extra) is fine: pytest reports the skip
    code = (
        "import importlib, sys, _pytest.outcomes as o\n"
        "for m in sys.argv[1:]:\n"
        "    try: importlib.import_module(m)\n"
        "    except o.Skipped: pass\n"
        "print('ok')"
    )
    proc = subprocess.run(
        [str(gpu_python), "-c", code, *modules],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    # and the environment really lacks what the GPU machine lacks
    proc = subprocess.run([str(gpu_python), "-c", "import torchao"], capture_output=True, text=True)
    assert "No module named 'torchao'" in proc.stderr


def test_smoke_run_every_phase_in_fresh_processes(gpu_python, tmp_path):
    out = tmp_path / "proof.json"
    command = [str(gpu_python), str(REPO_ROOT / "benchmarks" / "gpu_proof.py"), "--smoke", "--json", str(out)]
    command += ["--carry", str(tmp_path / "no_carry"), "--budget-s", "800"]  # torchtune 0.6.1 is not carried here
    proc = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    phases = result["phases"]
    assert list(phases) == list(gpu_proof.PHASES)
    assert all(p["status"] == "ok" for p in phases.values()), phases
    steps = [r for r in phases["step"]["rows"] if r["phase"] == "training steps"]
    assert steps and all(r["tokens_per_second"] > 0 and r["estimated_device_peak_gb"] > 0 for r in steps)
    resumed = {r["phase"]: r for r in phases["resume"]["rows"]}
    assert resumed["resume load"]["note"] == "in a new process"
    assert resumed["resume load"]["estimated_device_peak_gb"] > 0  # the train process's estimate, reused
    assert resumed["resume load"]["host_peak_mapped_files_gb"] >= 0
    compare = {r["item"]: r for r in phases["compare"]["rows"]}
    assert compare["ours"]["tokens_per_second"] > 0
    assert compare["torchtune 0.6.1"]["note"].startswith("skipped: torchtune not importable")
    learn = {r["item"]: r for r in phases["learn"]["rows"]}
    assert len(learn["bf16 + stochastic rounding"]["losses"]) == 20
    (pytest_row,) = phases["pytest"]["rows"]
    assert pytest_row["tests"] > 0 and pytest_row["skipped"] == pytest_row["tests"]  # no CUDA here
    assert "not measured: what paging costs" in proc.stdout


def _args():
    return gpu_proof.argparse.Namespace(smoke=False, device="cuda", learn_steps=None)


def test_launches_phase_counts_the_tiny_step_on_the_cpu(tmp_path):
    """The launches phase's worker on a CPU (no GPU to profile): the counted rows of the tiny config."""
    import argparse

    out = tmp_path / "launches.json"
    gpu_proof.worker_launches(argparse.Namespace(smoke=True, device="cpu", out=str(out)))
    rows = {r["item"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {f"counted: {b}, {s}" for b in ("unpacked", "packed") for s in ("unlogged", "logged")}
    assert rows["counted: unpacked, unlogged"]["host_syncs"] == 0 and rows["counted: packed, logged"]["host_syncs"] == 1
    assert all(r["launches"] > 0 for r in rows.values())


def test_launches_is_a_phase_to_name_not_a_default_one():
    assert "launches" not in gpu_proof.PHASES and "launches" in gpu_proof.OPTIONAL_PHASES
    need = gpu_proof.needs(gpu_proof.Settings(_args()), ["compare", "launches"], REPO_ROOT / ".gpu_carry")
    assert need["minutes"] < 8
