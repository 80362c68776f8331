"""One command that proves the 16 GB claim on a GPU: every phase in a fresh process, one JSON, one table.

    # on the H200 machine of ../shared/GPU.md, from the repository root (.gpu_carry from scripts/gpu_wheels.py):
    PYTHONPATH=$PWD:$PWD/.gpu_carry/site python3 benchmarks/gpu_proof.py --json gpu_proof.json
    python benchmarks/gpu_proof.py --plan --target h200     # what the run needs, checked against that machine
    python benchmarks/gpu_proof.py --smoke                   # every phase on a tiny model on the CPU

Phases (``--phases`` picks some; each runs in its own process(es), so no phase inherits another's memory,
in particular bitsandbytes' paged buffers, which it never frees):

1. ``step``: a Llama2-7B low-memory step (``llama2/7B_full_low_memory``: bf16, optimizer in backward with
   the shipped ``bitsandbytes.optim.PagedAdamW``, activation checkpointing and offloading, chunked loss) at
   batch 2 x 512 and 2 x 2048 tokens: PyTorch's peak allocated and reserved memory (the 16 GB claim is
   about those plus the CUDA context), tokens/s, beside ``tune estimate-memory``'s figure
   (``benchmarks/gpu_memory_check.py --stage train --no-save``).
2. ``resume``: set-up, steps and a step checkpoint save with ``PagedAdamW8bit`` (its checkpoint, 27 GB,
   fits the disk; PagedAdamW's, 67 GB, does not), then the resume load and one more step in a NEW process:
   each phase's peaks, host RSS and the part of it that is memory-mapped checkpoint files, beside the
   estimate (``gpu_memory_check.py --stage train`` then ``--stage resume``).
3. ``compare``: our recipe against torchtune 0.6.1's, same random-weight 7B HF checkpoint (written by this
   script on the machine's disk, deleted at the end), tokenizer, Alpaca-like data packed to 2048 tokens and
   low-memory settings, each run in a fresh process: median step time, trained tokens/s, peaks; plus our
   recipe with ``bf16_stochastic_rounding=False`` and with ``enable_activation_offloading=False``
   (``benchmarks/compare_torchtune.py --scenario lowmem``); ``--speed-rows`` adds our recipe with
   liger-kernel (``liger_kernels=True`` and ``LigerLinearCrossEntropyLoss``; liger-kernel must be among
   the carried wheels, else that row alone fails) and a second run of both recipes with ``compile=True``
   (compile on and off on the same machine; ~220 s more: with every phase the run then needs more than
   its 8 minutes, so run it as ``--phases compare --speed-rows``).
   torchtune 0.6.1 runs from ``.gpu_carry/tt061`` (unpacked wheels); where it cannot be imported the row
   says so and the rest runs.
4. ``learn``: a small Llama2, 200 steps, in fp32, in bf16 with stochastic rounding and in bf16 without,
   each from the same weights on the same batches: the loss curves and the signed mean update (how far
   each run moved the weights along the fp32 run's direction, as a fraction of the fp32 run's movement),
   with the bounds bf16 + stochastic rounding must meet (``LEARN_BOUNDS``).
5. ``pytest``: ``pytest -m gpu tests/gpu``.
6. ``launches`` (only when named in ``--phases``): one unlogged and one logged step of
   ``llama2/7B_full_low_memory`` at 2 x 2048 tokens, unpacked and packed, as ``bench_step_launches.py``
   counts it on meta tensors and as the GPU runs it under ``torch.profiler`` (kernel launch calls, host
   waits): the check of the counter's figures (docs/speed.md) on the first lent GPU.

Not measured: what paging costs on a real 16 GB card. Paged state is CUDA managed memory; squeezing the
card with a ballast would ask for more managed memory than the card has free, which can hang the GPU
(``gpu_memory_check.py`` refuses ``--leave-gb`` with a paged optimizer), so the figures are PyTorch's
peaks with the card uncapped, and the driver's figure includes managed state resident on the card.

``--budget-s`` (default 480) stops cleanly before that wall-clock budget: a phase that cannot start in
time is marked skipped, a running one is stopped, and the JSON (written after every phase) keeps what
was measured. Before anything runs, the needs of the chosen phases (disk, host RAM, device memory,
minutes, carried wheels with the tree) are checked against this machine (``--plan`` only prints them;
``--target h200`` checks them against the H200 machine's recorded facts instead).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without install

PHASES = ("step", "resume", "compare", "learn", "pytest")
# run only when named in --phases (the default run must fit its 8 minutes)
OPTIONAL_PHASES = ("launches",)
GB, GIB, MIB = 1e9, float(1 << 30), float(1 << 20)
# seconds each phase took (or is expected to take) on the H200 of ../shared/GPU.md; the plan's minutes
EXPECTED_S = {"step": 70, "resume": 100, "compare": 150, "learn": 30, "pytest": 100, "launches": 120}
# --speed-rows: the liger row and both recipes with compile=True (~37 s a 7B run, as compare's took, and
# compile's warm-up, ~60 s a recipe)
SPEED_ROWS_S = 220
# the machines a --plan can be checked against: what they have, with margins (GPU.md: 64 GB of disk,
# 125 GiB of RAM, 143,771 MiB of device memory, 64 MiB carried with the tree)
TARGETS = {
    "h200": {
        "disk_gb": 60.0,
        "host_ram_gib": 110.0,
        "device_gb": 140.0,
        "minutes": 8.0,
        "carry_mib": 60.0,
        "python": "3.12",
    }
}
PAGED, PAGED_8BIT = "bitsandbytes.optim.PagedAdamW", "bitsandbytes.optim.PagedAdamW8bit"
# one small Llama2 for the GPU run and the CPU smoke run alike (the bounds below were set on it)
# the feature row of liger-kernel: its kernels and its loss (which takes no num_output_chunks)
LIGER_LOSS = "loss._component_=torchtune.modules.loss.LigerLinearCrossEntropyLoss;~loss.num_output_chunks"
LEARN_DIMS = dict(vocab_size=1024, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=128, max_seq_len=128)
LEARN_LR = 5e-5  # most Adam updates (~lr) are below half a bf16 step of weights ~0.03: plain bf16 drops them
# bf16 with stochastic rounding against fp32 after the learn phase's steps. Measured on a CPU, 200 steps:
# bf16 + rounding 0.996 and 0.7% of the drop; bf16 without rounding 0.12 and 87% (loss 7.08 -> 6.40 in fp32)
LEARN_BOUNDS = {"signed_mean_update": (0.8, 1.25), "final_loss_gap_of_drop": 0.15}


def _python_env(carry: Path) -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + ([str(carry / "site")] if (carry / "site").is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(parts + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class PhaseStopped(Exception):
    """A phase's process did not finish inside the budget, or failed."""


def _run(command: list[str], *, budget: Budget, env: dict, log: Path, cwd: Optional[Path] = None) -> str:
    """Run one fresh process inside the budget; its output goes to ``log``. Returns stdout."""
    timeout = budget.left() - 5  # leave time to write the JSON
    if timeout <= 5:
        raise PhaseStopped("stopped: budget spent before this process could start")
    # its own process group: a phase's own children (compare's recipe runs) are stopped with it
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=str(cwd or REPO_ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        log.write_text(f"$ {' '.join(command)}\n{stdout}\n{stderr}")
        raise PhaseStopped(f"stopped: budget (--budget-s) ran out in {Path(command[1]).name}") from None
    log.write_text(f"$ {' '.join(command)}\n{stdout}\n{stderr}")
    if proc.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        raise PhaseStopped(f"failed (exit {proc.returncode}, log {log}): " + " | ".join(tail))
    return stdout


class Settings:
    """What the phases run on: the 7B on a GPU, or a tiny model on the CPU (``--smoke``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.smoke = args.smoke
        self.device = "cpu" if args.smoke else args.device
        self.model = "tiny" if args.smoke else "7b"
        self.dtype = "fp32" if args.smoke else "bf16"
        gpu = self.device.startswith("cuda")
        # bitsandbytes' paged optimizers need CUDA; the CPU smoke run uses torch's AdamW in their place
        self.paged = PAGED if gpu else "torch.optim.AdamW"
        self.paged_8bit = PAGED_8BIT if gpu else "torch.optim.AdamW"
        self.seq_lens = (512, 2048) if not args.smoke else (32,)  # the smoke run: fewest processes
        self.steps = 4 if not args.smoke else 2
        self.learn_steps = args.learn_steps or (200 if not args.smoke else 20)
        self.speed_rows = bool(getattr(args, "speed_rows", False))


# --------------------------------------------------------------------------------------------------
# the needs of a run
# --------------------------------------------------------------------------------------------------
def _parameter_count(model: str) -> int:
    import torch

    from torchtune.models.llama2 import llama2_7b, llama2_tiny

    with torch.device("meta"):
        return sum(p.numel() for p in (llama2_7b() if model == "7b" else llama2_tiny()).parameters())


def needs(settings: Settings, phases: list[str], carry: Path) -> dict[str, float]:
    """Upper bounds of what the phases need, from the parameter count (seconds to compute, no estimator run):
    disk for the source checkpoint plus the 8-bit step checkpoint; host RAM for PagedAdamW's managed state
    (fp32 moments: 8 bytes a parameter) plus a loaded checkpoint and 8 GB of process; device memory for
    the weights, that managed state (resident on the card when it fits) and 3 GB of activations,
    temporaries and context; minutes as the H200 took them; the carried folder with the tree."""
    from scripts.gpu_wheels import folder_bytes, tree_bytes

    n = _parameter_count(settings.model)
    weights = n * (2 if settings.dtype == "bf16" else 4)
    paged32, paged8 = n * 8, n * 2
    speed_rows = settings.speed_rows and "compare" in phases
    disk = (weights if "compare" in phases else 0) + (weights + paged8 if "resume" in phases else 0) + 1 * GB
    carried = folder_bytes(carry) if carry.is_dir() else 0
    return {
        "disk_gb": disk / GB,
        "host_ram_gib": (paged32 + weights + 8 * GB) / GIB,
        "device_gb": (weights + paged32 + 3 * GB) / GB,
        "minutes": (sum(EXPECTED_S[p] for p in phases) + (SPEED_ROWS_S if speed_rows else 0)) / 60,
        "carry_mib": (carried + tree_bytes()) / MIB,
        "carried_folder_mib": carried / MIB,
    }


def machine(work: Path, device: str) -> dict[str, float]:
    """This machine's free disk under ``work``, total RAM and the device's total memory."""
    import psutil
    import torch

    have = {"disk_gb": shutil.disk_usage(work).free / GB, "host_ram_gib": psutil.virtual_memory().total / GIB}
    have["device_gb"] = float("inf")
    if device.startswith("cuda"):
        # no GPU: 0 GB of device memory, which check_plan reports in words instead of a CUDA error
        available = torch.cuda.is_available()
        have["device_gb"] = torch.cuda.get_device_properties(torch.device(device)).total_memory / GB if available else 0
    return have


def _no_gpu_reason() -> str:
    import torch

    what = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, but sees none"
    return (
        f"this machine has no CUDA GPU (PyTorch {torch.__version__} is {what}): the proof runs on a GPU. Here, "
        "`--plan --target h200` checks the plan against that machine and `--smoke` runs every phase "
        "on a tiny model on the CPU."
    )


def check_plan(need: dict[str, float], have: dict[str, float], where: str) -> list[str]:
    """Lines saying what does not fit (empty when everything does)."""
    names = {"disk_gb": "GB of disk", "host_ram_gib": "GiB of host RAM", "device_gb": "GB of device memory"}
    names.update({"minutes": "minutes", "carry_mib": "MiB carried with the tree"})
    if have.get("device_gb") == 0 and where == "this machine":
        return [_no_gpu_reason()]
    return [
        f"{where} lacks {names[k]}: the run needs {need[k]:.1f}, it has {have[k]:.1f}"
        for k in names
        if k in have and need[k] > have[k]
    ]


def format_plan(need: dict[str, float], have: dict[str, float], where: str) -> str:
    from scripts.gpu_wheels import WHEELS

    wheels = ", ".join(w for folder in WHEELS.values() for w in folder)
    lines = [f"Needs of the run, against {where}:"]
    for key, label in [
        ("disk_gb", "disk (GB)"),
        ("host_ram_gib", "host RAM (GiB)"),
        ("device_gb", "device memory (GB)"),
        ("minutes", "minutes"),
        ("carry_mib", "carried + tree (MiB)"),
    ]:
        limit = have.get(key)
        verdict = "-" if limit is None else ("fits" if need[key] <= limit else "DOES NOT FIT")
        shown = "-" if limit is None else f"{limit:.1f}"
        lines.append(f"  {label:<24}{need[key]:>10.1f}   available {shown:>8}   {verdict}")
    lines.append(f"  wheels: {wheels} ({need['carried_folder_mib']:.1f} MiB unpacked in .gpu_carry)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# phases (each one or more fresh processes)
# --------------------------------------------------------------------------------------------------
def _memory_check(
    settings: Settings, optimizer: str, seq_len: int, work: Path, stage: str, *extra: str
) -> tuple[list[str], Path]:
    out = work / f"{stage}.jsonl"
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_memory_check.py"), "--model", settings.model]
    command += ["--device", settings.device, "--dtype", settings.dtype, "--optimizer", optimizer]
    command += ["--seq-len", str(seq_len), "--steps", str(settings.steps), "--stage", stage]
    command += ["--output-dir", str(work), "--json", str(out), *extra]
    return command, out


def phase_step(settings: Settings, work: Path, budget: Budget, env: dict) -> list[dict]:
    rows = []
    for seq_len in settings.seq_lens:
        folder = work / f"step_{seq_len}"
        command, out = _memory_check(settings, settings.paged, seq_len, folder, "train", "--no-save")
        folder.mkdir(parents=True, exist_ok=True)
        _run(command, budget=budget, env=env, log=work / f"step_{seq_len}.log")
        for r in map(json.loads, out.read_text().splitlines()):
            rows.append({**r, "item": f"{r['phase']}, 2 x {seq_len} tokens"})
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def phase_resume(settings: Settings, work: Path, budget: Budget, env: dict) -> list[dict]:
    folder = work / "resume"
    folder.mkdir(parents=True, exist_ok=True)
    seq_len = settings.seq_lens[-1]
    rows = []
    try:
        for stage in ("train", "resume"):  # the resume in a new process, as a real one
            command, out = _memory_check(settings, settings.paged_8bit, seq_len, folder, stage)
            _run(command, budget=budget, env=env, log=work / f"resume_{stage}.log")
            rows += [
                {**r, "item": f"{r['phase']} ({stage} process)"} for r in map(json.loads, out.read_text().splitlines())
            ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _torchtune_path(carry: Path, env: dict, work: Path) -> tuple[Optional[str], str]:
    """PYTHONPATH for torchtune 0.6.1 (unpacked wheels, without this repository), or None and why not."""
    parts = [str(carry / "tt061"), str(carry / "site")]
    # torchtune's recipes/__init__.py refuses imports: compare_torchtune.py loads the recipe file itself
    probe = (
        "import pathlib, torchtune, torchao; home = pathlib.Path(torchtune.__file__).parents[1]; "
        "assert (home / 'recipes' / 'full_finetune_single_device.py').exists(), 'no recipes folder'; "
        "print(torchtune.__version__)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "PYTHONPATH": os.pathsep.join(parts)},
        cwd=str(work),  # not the repository: its torchtune would win
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not proc.stdout.strip().startswith("0.6.1"):
        why = (proc.stderr.strip().splitlines() or ["no torchtune 0.6.1 there"])[-1]
        return None, f"skipped: torchtune not importable from {carry / 'tt061'} ({why})"
    return os.pathsep.join(parts), "torchtune 0.6.1"


def phase_compare(settings: Settings, work: Path, budget: Budget, env: dict, carry: Path) -> list[dict]:
    ckpt = work / "checkpoint"
    _run(
        [sys.executable, __file__, "--worker", "checkpoint", "--device", settings.device, "--model", settings.model]
        + (["--smoke"] if settings.smoke else [])
        + ["--out", str(ckpt)],
        budget=budget,
        env=env,
        log=work / "checkpoint.log",
    )
    tt_path, tt_note = _torchtune_path(carry, env, work)
    out = work / "compare.json"
    seq_len = settings.seq_lens[-1] * (1 if not settings.smoke else 2)
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "compare_torchtune.py"), "--scenario", "lowmem"]
    command += ["--size", settings.model, "--checkpoint", str(ckpt), "--device", settings.device]
    command += ["--dtype", "bf16", "--optimizer", settings.paged, "--seq-len", str(seq_len), "--batch-size", "2"]
    command += ["--steps", str(6 if not settings.smoke else 3), "--skip", str(2 if not settings.smoke else 1)]
    command += ["--repeats", "1", "--no-final-save", "--no-compile", "--keep-going", "--json", str(out)]
    if not settings.smoke:  # feature-off rows (each a 7B run); the smoke run checks the path with ours alone
        command += ["--extra", "bf16_stochastic_rounding=False:bf16_stochastic_rounding=False"]
        command += ["--extra", "enable_activation_offloading=False:enable_activation_offloading=False"]
    if not settings.smoke and settings.speed_rows:
        command += ["--extra", f"liger_kernels=True + liger loss:liger_kernels=True;{LIGER_LOSS}"]
    command += ["--tt-pythonpath", tt_path] if tt_path else ["--no-torchtune"]
    # compile off, then (--speed-rows) both recipes again with compile=True: the same checkpoint and data
    runs = [("", command)]
    if not settings.smoke and settings.speed_rows:
        compiled = [c for c in command if c != "--no-compile"]
        extras = {i for i, c in enumerate(compiled) if c == "--extra"}
        compiled = [c for i, c in enumerate(compiled) if i not in extras and i - 1 not in extras]
        compiled[compiled.index(str(out))] = str(work / "compare_compiled.json")
        runs.append((", compile=True", compiled + ["--compile-lowmem"]))
    rows = []
    try:
        for suffix, run in runs:
            log = work / f"compare{suffix.replace(', ', '_').replace('=', '_')}.log"
            _run(run, budget=budget, env=env, log=log, cwd=work)
            rows += _compare_rows(json.loads(Path(run[run.index("--json") + 1]).read_text()), suffix)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    if tt_path is None:
        rows.append({"item": "torchtune 0.6.1", "note": tt_note})
    return rows


def _compare_rows(compared: dict, suffix: str) -> list[dict]:
    """Table rows of one ``compare_torchtune.py`` run (``suffix``: what the run set for both recipes)."""
    rows = []
    for name, s in compared["summaries"].items():
        label = {"ours": "ours", "torchtune": "torchtune 0.6.1"}.get(name, f"ours, {name}")
        rows.append(
            {
                "item": label + suffix,
                "tokens_per_second": s["tok_s"],
                "median_step_s": s["wall"],
                **{f"torch_{k}": s[k] for k in ("peak_allocated_gb", "peak_reserved_gb") if k in s},
            }
        )
    for name, tail in compared.get("failed", {}).items():
        label = {"torchtune": "torchtune 0.6.1"}.get(name, f"ours, {name}")
        rows.append({"item": label + suffix, "note": "failed: " + " | ".join(tail)})
    return rows


def phase_launches(settings: Settings, work: Path, budget: Budget, env: dict) -> list[dict]:
    out = work / "launches.json"
    command = [sys.executable, __file__, "--worker", "launches", "--device", settings.device, "--out", str(out)]
    _run(command + (["--smoke"] if settings.smoke else []), budget=budget, env=env, log=work / "launches.log")
    return json.loads(out.read_text())


# what the profiler calls each thing it sees: a kernel launch (runtime or driver API: Triton launches through
# the driver), a host wait for the device, a copy call
_LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
)
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def worker_launches(args: argparse.Namespace) -> None:
    """One unlogged and one logged step of ``llama2/7B_full_low_memory`` at 2 x 2048 tokens, unpacked and packed:
    counted on meta tensors (``benchmarks/bench_step_launches.py``'s counter), and on a GPU run for real under
    ``torch.profiler`` (kernel launch calls, device kernels, host waits, copies), so the counter's figures are
    checked against the GPU's. The smoke run counts the tiny config only."""
    import torch

    from torchtune.config import load_config
    from torchtune.training.estimate._step_launches import count_step_launches

    smoke = args.smoke
    name, seq_len = ("llama2/tiny_full", 64) if smoke else ("llama2/7B_full_low_memory", 2048)
    overrides = ["dtype=bf16", "bf16_stochastic_rounding=True", "device=cuda"] if smoke else []
    rows = []
    for packed in (False, True):
        cfg = load_config(name, [*overrides, f"dataset.packed={packed}", "batch_size=2"])
        counted = count_step_launches(cfg, seq_len=seq_len, batch_size=2, packed=packed)
        batch = "packed" if packed else "unpacked"
        for step, c in (("unlogged", counted.unlogged), ("logged", counted.logged)):
            rows.append(
                {
                    "item": f"counted: {batch}, {step}",
                    "launches": float(c.total),
                    "host_syncs": float(c.syncs),
                    "note": f"H2D pageable {c.h2d_pageable}, pinned {c.h2d_pinned}",
                }
            )
        if args.device.startswith("cuda") and torch.cuda.is_available():
            for step, figures in _profiled_step(cfg, seq_len, packed).items():
                rows.append({"item": f"profiled: {batch}, {step}", **figures})
    Path(args.out).write_text(json.dumps(rows))


def _profiled_step(cfg: Any, seq_len: int, packed: bool) -> dict[str, dict]:
    """The recipe's loop body on the GPU (random weights): two warm-up steps (state, compiled kernels), then one
    unlogged and one logged step, each under ``torch.profiler``."""
    import torch
    from omegaconf import OmegaConf
    from torch.profiler import ProfilerActivity, profile

    from torchtune import training
    from torchtune.training.estimate._step_launches import _HostData, _loop_body, synthetic_batch

    device = torch.device("cuda")
    grad_norm, changes = training.GradNormTracker(), training.WeightChangeTracker()
    step = training.TrainStep.from_config(
        cfg, device=device, dtype=torch.bfloat16, compile_model=False, grad_norm=grad_norm, weight_changes=changes
    )
    batch, _ = synthetic_batch(2, seq_len, step.model.tok_embeddings.num_embeddings, packed=packed)
    batch = {k: v.pin_memory() for k, v in batch.items()}  # as the loader pins them on CUDA
    metrics = training.StepMetrics(
        OmegaConf.create({"log_every_n_steps": 1, "log_peak_memory_stats": True}),
        device=device,
        grad_norm=grad_norm,
        weight_changes=changes,
    )
    metrics.data, metrics.logger = _HostData(), training.MetricLoggers([], path=None)
    guard = training.NonFiniteLossGuard(device)
    for index in range(2):
        _loop_body(step, batch, metrics, guard, global_step=index + 1, logged=index == 1)
    torch.cuda.synchronize()
    out = {}
    for index, logged in ((3, False), (4, True)):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _loop_body(step, batch, metrics, guard, global_step=index, logged=logged)
            torch.cuda.synchronize()
        events = prof.events()
        calls = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        launches = sum(e.name in _LAUNCH_CALLS for e in calls)
        syncs = sum(e.name in _SYNC_CALLS for e in calls) - 1  # the measurement's own synchronize
        copies = sum(e.name.startswith("cudaMemcpy") for e in calls)
        out["logged" if logged else "unlogged"] = {
            "launches": float(launches),
            "host_syncs": float(syncs),
            "note": f"{len(kernels)} device activities (kernels, copies, memsets); {copies} copy calls",
        }
    return out


def phase_learn(settings: Settings, work: Path, budget: Budget, env: dict) -> list[dict]:
    import torch

    runs = {}
    # bf16 without rounding shows the check can fail (its updates round away); left out of the smoke run
    for variant in ("fp32", "bf16_rounding") + (("bf16",) if not settings.smoke else ()):
        out = work / f"learn_{variant}.pt"
        command = [sys.executable, __file__, "--worker", "learn", "--variant", variant, "--device", settings.device]
        command += ["--learn-steps", str(settings.learn_steps), "--out", str(out)] + (
            ["--smoke"] if settings.smoke else []
        )
        _run(command, budget=budget, env=env, log=work / f"learn_{variant}.log")
        runs[variant] = torch.load(out)
        out.unlink()
    return learn_rows(runs)


def learn_rows(runs: dict[str, dict]) -> list[dict]:
    """Each run's loss curve summary and signed mean update against the fp32 run, with the verdict."""
    import torch

    ref = runs["fp32"]
    ref_delta = torch.cat([d.flatten() for d in ref["deltas"].values()])
    direction = torch.sign(ref_delta)
    drop = ref["losses"][0] - _tail(ref["losses"])
    rows = []
    for variant, run in runs.items():
        delta = torch.cat([run["deltas"][k].flatten() for k in ref["deltas"]])
        signed = float((delta * direction).mean() / ref_delta.abs().mean())
        gap = (_tail(run["losses"]) - _tail(ref["losses"])) / drop if drop > 0 else float("inf")
        row = {
            "item": {"fp32": "fp32", "bf16_rounding": "bf16 + stochastic rounding", "bf16": "bf16, no rounding"}[
                variant
            ],
            "first_loss": run["losses"][0],
            "final_loss": _tail(run["losses"]),
            "losses": run["losses"],
            "signed_mean_update": signed,
            "final_loss_gap_of_drop": gap,
        }
        if variant == "bf16_rounding":
            low, high = LEARN_BOUNDS["signed_mean_update"]
            row["within_bounds"] = bool(low <= signed <= high and gap <= LEARN_BOUNDS["final_loss_gap_of_drop"])
            row["bounds"] = LEARN_BOUNDS
        rows.append(row)
    return rows


def _tail(losses: list[float]) -> float:
    """The mean of the last tenth of a loss curve (one batch's loss is noisy)."""
    return statistics.fmean(losses[-max(1, len(losses) // 10) :])


def phase_pytest(settings: Settings, work: Path, budget: Budget, env: dict) -> list[dict]:
    python = Path(sys.executable)
    if not (python.parent / "tune").exists():
        # tests run the real `tune` beside sys.executable: a folder with a link to this Python and a
        # three-line `tune` (the GPU machine's Python has no install of this project)
        bin_dir = work / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        link = bin_dir / "python3"
        if not link.exists():
            link.symlink_to(python.resolve())
            if sys.prefix != sys.base_prefix:  # a virtual environment: the link must find its packages too
                shutil.copy(Path(sys.prefix) / "pyvenv.cfg", work / "pyvenv.cfg")
                (work / "lib").symlink_to(Path(sys.prefix) / "lib")
        (bin_dir / "tune").write_text(f"#!{link}\nimport sys\nfrom torchtune._cli.tune import main\nsys.exit(main())\n")
        (bin_dir / "tune").chmod(0o755)
        python = link
    report = work / "pytest.xml"
    command = [str(python), "-m", "pytest", "-q", "-rs", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider"]
    try:
        _run(command + [f"--junitxml={report}"], budget=budget, env=env, log=work / "pytest.log")
        status = None
    except PhaseStopped as exc:
        if not report.exists():
            raise
        status = str(exc)  # failures: the counts below say which
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    row = {"item": "pytest -m gpu tests/gpu", **counts, "failed": failed, "seconds": float(suite.get("time", 0))}
    if status:
        row["note"] = status
    return [row]


# --------------------------------------------------------------------------------------------------
# workers (run in their own process by the phases above)
# --------------------------------------------------------------------------------------------------
def worker_checkpoint(args: argparse.Namespace) -> None:
    """A random-weight HF checkpoint (config.json + model.safetensors), built on the device: 13.5 GB for 7B."""
    import torch
    from safetensors.torch import save_file

    from benchmarks.compare_torchtune import SIZES  # the model compare_torchtune.py builds for --size
    from torchtune.models.llama2 import llama2
    from torchtune.models.llama2._convert_weights import tune_to_hf
    from torchtune.training.estimate._checkpoint_memory import write_hf_folder

    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no 27 GB fp32 copy of 7B first
    with torch.device(device):
        model = llama2(**SIZES[args.model])
    attn = model.layers[0].attn
    out = Path(args.out)
    write_hf_folder(model, out)  # config.json (and a header-only weights file, replaced below)
    hf = tune_to_hf(
        model.state_dict(),
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        dim=attn.embed_dim,
        head_dim=attn.head_dim,
    )
    save_file({k: v.contiguous().cpu() for k, v in hf.items()}, str(out / "model.safetensors"))


def worker_learn(args: argparse.Namespace) -> None:
    """One learn run: the same fp32 weights and batches for every variant, ``--learn-steps`` steps of the
    flagship step (optimizer in backward, chunked loss), torch AdamW at ``LEARN_LR``."""
    import torch

    from torchtune.config import load_config
    from torchtune.models.llama2 import llama2
    from torchtune.training import TrainStep

    dims = LEARN_DIMS
    device = torch.device(args.device)
    torch.manual_seed(0)
    initial = {k: v.clone() for k, v in llama2(**dims).state_dict().items()}  # fp32, on the CPU
    dtype = torch.float32 if args.variant == "fp32" else torch.bfloat16
    overrides = ["model._component_=torchtune.models.llama2.llama2", "compile=False", f"device={device.type}"]
    overrides += [f"+model.{k}={v}" for k, v in dims.items()]
    overrides += ["optimizer._component_=torch.optim.AdamW", f"optimizer.lr={LEARN_LR}", "seed=0"]
    overrides += ["enable_activation_offloading=False", "enable_activation_checkpointing=False"]
    overrides += [f"bf16_stochastic_rounding={args.variant == 'bf16_rounding'}"]
    cfg = load_config("llama2/7B_full_low_memory", overrides)
    step = TrainStep.from_config(cfg, device=device, dtype=dtype, state_dict=initial)
    # a fixed set of sequences to learn by heart, the same batches in the same order for every variant
    generator = torch.Generator().manual_seed(1)
    seq_len, batch_size, batches = dims["max_seq_len"] // 2, 8, 4
    data = torch.randint(0, dims["vocab_size"], (batches, batch_size, seq_len), generator=generator)
    losses = []
    for i in range(args.learn_steps):
        tokens = data[i % batches]
        losses.append(float(step({"tokens": tokens, "labels": tokens.roll(-1, dims=1)})))
    final = step.model.state_dict()
    deltas = {k: final[k].float().cpu() - initial[k] for k in initial}
    torch.save({"losses": losses, "deltas": deltas}, args.out)


# --------------------------------------------------------------------------------------------------
def _table(results: dict[str, Any]) -> str:
    columns = [
        ("estimated_device_peak_gb", "estimate", ".2f"),
        ("torch_peak_allocated_gb", "allocated", ".2f"),
        ("torch_peak_reserved_gb", "reserved", ".2f"),
        ("driver_peak_in_use_gb", "driver", ".2f"),
        ("estimated_host_ram_gb", "est. host", ".2f"),
        ("host_peak_rss_gb", "host RSS", ".2f"),
        ("host_peak_mapped_files_gb", "mapped", ".2f"),
        ("tokens_per_second", "tokens/s", ".0f"),
        ("launches", "launches", ".0f"),
        ("host_syncs", "syncs", ".0f"),
    ]
    lines = [
        "GPU proof (GB = 1e9 bytes; device: PyTorch's peaks, driver = NVML incl. context and resident managed "
        "memory; host RSS with, apart, its memory-mapped file pages)",
        f"  {'phase':<8}{'what':<46}" + "".join(f"{label:>11}" for _, label, _ in columns) + "  note",
    ]
    for name, phase in results["phases"].items():
        if not phase.get("rows"):
            lines.append(f"  {name:<8}{'':<46}{phase['status']}")
            continue
        for r in phase["rows"]:
            cells = "".join(
                f"{r[k]:>11{fmt}}" if isinstance(r.get(k), float) else f"{'-':>11}" for k, _, fmt in columns
            )
            note = r.get("note", "")
            if name == "learn":
                note = (
                    f"loss {r['first_loss']:.3f} -> {r['final_loss']:.3f}, signed mean update "
                    f"{r['signed_mean_update']:.3f}"
                    + (f", within bounds: {r['within_bounds']}" if "within_bounds" in r else "")
                )
            elif name == "pytest":
                note = f"{r['tests']} tests, {r['failures']} failed, {r['errors']} errors, {r['skipped']} skipped"
            elif "median_step_s" in r:
                note = f"median step {r['median_step_s']:.3f} s"
            lines.append(f"  {name:<8}{r['item'][:45]:<46}{cells}  {note}")
        if phase["status"] != "ok":
            lines.append(f"  {name:<8}{'':<46}{phase['status']}")
    lines.append(
        "  not measured: what paging costs on a real 16 GB card (no ballast with paged state: it can hang the GPU)"
    )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated, of {', '.join(PHASES)} (default: all) and {', '.join(OPTIONAL_PHASES)}",
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop cleanly before this many seconds")
    parser.add_argument("--json", default="gpu_proof.json", help="where the results go (written after every phase)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="every phase on a tiny model on the CPU")
    parser.add_argument("--work-dir", default=None, help="local disk for checkpoints (default: a temp dir, deleted)")
    parser.add_argument("--carry", default=str(REPO_ROOT / ".gpu_carry"), help="the folder of scripts/gpu_wheels.py")
    parser.add_argument("--plan", action="store_true", help="print the needs and whether they fit, run nothing")
    parser.add_argument("--target", choices=sorted(TARGETS), default=None, help="check the plan against this machine")
    parser.add_argument(
        "--speed-rows",
        action="store_true",
        help="compare: also ours with liger-kernel, and both recipes again with compile=True",
    )
    parser.add_argument("--learn-steps", type=int, default=None, help="steps of the learn phase (200; smoke: 20)")
    parser.add_argument("--worker", choices=["checkpoint", "learn", "launches"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=["fp32", "bf16_rounding", "bf16"], help=argparse.SUPPRESS)
    parser.add_argument("--model", default="7b", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "checkpoint":
        worker_checkpoint(args)
        return 0
    if args.worker == "learn":
        worker_learn(args)
        return 0
    if args.worker == "launches":
        worker_launches(args)
        return 0

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES + OPTIONAL_PHASES]
    if unknown:
        raise SystemExit(
            f"--phases {args.phases}: unknown {unknown}; choose from {', '.join(PHASES + OPTIONAL_PHASES)}"
        )
    settings = Settings(args)
    carry = Path(args.carry)
    need = needs(settings, phases, carry)
    if args.plan or args.target:
        have, where = (TARGETS[args.target], f"the {args.target} machine") if args.target else ({}, "")
        if not args.target:
            have, where = machine(Path(args.work_dir or tempfile.gettempdir()), settings.device), "this machine"
        print(format_plan(need, have, where))
        problems = check_plan(need, have, where)
        for line in problems:
            print(line)
        if args.plan:
            print("The run fits." if not problems else "The run does not fit.")
            return 1 if problems else 0
        if problems:
            raise SystemExit(problems[0])

    budget = Budget(args.budget_s)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="gpu-proof-"))
    work.mkdir(parents=True, exist_ok=True)
    have = machine(work, settings.device)
    print(format_plan({**need, "carry_mib": 0.0}, have, "this machine"), file=sys.stderr, flush=True)
    problems = check_plan({**need, "carry_mib": 0.0}, have, "this machine")
    if problems:
        no_gpu = have.get("device_gb") == 0
        raise SystemExit(problems[0] + ("" if no_gpu else "; run on a larger machine or pick fewer --phases."))
    env = _python_env(carry)
    results: dict[str, Any] = {
        "args": vars(args),
        "device": settings.device,
        "model": settings.model,
        "needs": need,
        "phases": {},
    }
    json_path = Path(args.json)
    started = time.monotonic()
    try:
        for name in phases:
            entry: dict[str, Any] = {"status": "ok"}
            if budget.left() < EXPECTED_S[name] * (0.05 if settings.smoke else 0.5):
                entry["status"] = f"skipped: budget ({budget.left():.0f} s left, ~{EXPECTED_S[name]} s needed)"
            else:
                start = time.monotonic()
                print(f"[gpu_proof] {name} ...", file=sys.stderr, flush=True)
                try:
                    if name == "compare":
                        entry["rows"] = phase_compare(settings, work, budget, env, carry)
                    else:
                        entry["rows"] = globals()[f"phase_{name}"](settings, work, budget, env)
                except PhaseStopped as exc:
                    entry["status"] = str(exc)
                entry["seconds"] = time.monotonic() - start
            results["phases"][name] = entry
            results["seconds"] = time.monotonic() - started
            json_path.write_text(json.dumps(results, indent=2))
    finally:
        logs = json_path.parent / f"{json_path.stem}_logs"  # each process's output, kept beside the JSON
        logs.mkdir(parents=True, exist_ok=True)
        for log in work.glob("*.log"):
            shutil.copy(log, logs / log.name)
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)  # the 7B checkpoints: tens of GB of the machine's disk
    print(_table(results))
    print(f"\n{time.monotonic() - started:.0f} s in all; JSON: {json_path}")
    return 0 if all(p["status"] == "ok" for p in results["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
