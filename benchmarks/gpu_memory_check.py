"""Measure a whole low-memory 7B run on a real GPU under a real memory cap, beside the estimate.

The phases of ``tune estimate-memory``, for real, in one process, with random weights built straight on
the GPU (nothing is downloaded):

1. set-up: Llama2-7B in bf16 with the ``llama2/7B_full_low_memory`` settings (optimizer in backward,
   activation checkpointing and offloading, chunked loss; ``torchtune.training.TrainStep.from_config``);
2. training steps: ``--steps`` steps of ``--batch-size`` x ``--seq-len`` tokens, tokens/s after the first;
3. step checkpoint save through the config's checkpointer (HF safetensors + ``recipe_state.pt``);
4. resume load as a new run does it (``resolve_resume``, the checkpointer, ``build_model`` with the
   saved weights, ``load_optimizer_state``), after everything of the first run is freed;
5. one more training step on the resumed run.

``--stage train`` runs phases 1-3 (``--no-save``: 1-2) and ``--stage resume`` phases 4-5 from the
``--output-dir`` of a train stage, so that the resume is a new process, as a real resume is:
bitsandbytes never frees a paged optimizer's buffers, so a resume in the same process still holds the
first run's paged state (``benchmarks/gpu_proof.py`` runs the stages so).

``--leave-gb N`` fills the card with a ballast allocation up to all but N GB (1 GB = 1e9 bytes), so the
CUDA context and PyTorch's allocations compete for those N GB. It is refused with a paged optimizer:
paged state is CUDA managed memory, and asking for more managed memory than the card has free can hang
the GPU; with one, run uncapped and read PyTorch's peaks (the 16 GB claim is about those and the
context). What paging costs on a real 16 GB card is not measured by this script.
For each phase it prints PyTorch's peak allocated/reserved memory (without the ballast), the driver's
peak of device memory in use (NVML, sampled in a thread by ``torchtune.training.memory.DeviceMemoryPeak``;
without the ballast, with the CUDA context and any managed memory resident on the card), the host's
peak RSS and, apart, the peak of it that is memory-mapped files (checkpoint pages the kernel can drop;
each sampled the same way, so the two peaks may fall at different moments) and the estimate of
``tune estimate-memory`` for the phase; one JSON line per phase follows (``--json`` also writes them to
a file).

    python benchmarks/gpu_memory_check.py --optimizer bitsandbytes.optim.PagedAdamW8bit   # 7B, 2 x 2048
    python benchmarks/gpu_memory_check.py --optimizer torch.optim.AdamW --model tiny --leave-gb 4
    python benchmarks/gpu_memory_check.py --model tiny --device cpu --steps 2 --seq-len 32   # CPU smoke test

Disk: the step checkpoint of 7B with PagedAdamW is 13.5 GB of weights + 54 GB of optimizer state
(``--optimizer bitsandbytes.optim.PagedAdamW8bit``: 13.7 GB of state); host RAM: the paged state plus a
few GB. The script checks the free disk space of ``--output-dir`` first.

Running it on a machine without network access: ``scripts/gpu_wheels.py`` unpacks what the GPU
machine of ``../shared/GPU.md`` lacks (omegaconf, bitsandbytes trimmed to its CPU and CUDA 13
libraries, datasets and its dependencies) into ``.gpu_carry/site``, for ``PYTHONPATH``:

    PYTHONPATH=$PWD:$PWD/.gpu_carry/site python3 benchmarks/gpu_memory_check.py --optimizer torch.optim.AdamW

Without nvidia-ml-py the driver's figure comes from ``torch.cuda.mem_get_info`` (the same number, read
differently).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

MODELS = {"7b": "torchtune.models.llama2.llama2_7b", "tiny": "torchtune.models.llama2.llama2_tiny"}
GB = 1e9


def _load_recipe_config(args: argparse.Namespace, output_dir: Path) -> Any:
    try:
        from omegaconf import OmegaConf  # noqa: F401

        from torchtune.config import load_config
    except ImportError as exc:
        raise SystemExit(f"{exc}: carry omegaconf/safetensors/tqdm as wheels, see the top of {__file__}.") from exc
    overrides = [
        f"model._component_={MODELS[args.model]}",
        f"device={args.device}",
        f"dtype={args.dtype}",
        f"optimizer._component_={args.optimizer}",
        f"batch_size={args.batch_size}",
        f"output_dir={output_dir}",
        "compile=False",
    ]
    return load_config("llama2/7B_full_low_memory", overrides)


class _Phase:
    """Peaks of one phase: PyTorch's counters, the driver's in-use memory and the host RSS, sampled."""

    def __init__(self, name: str, device: torch.device, ballast_bytes: int) -> None:
        from torchtune.training import memory

        self.name, self.device, self.ballast = name, device, ballast_bytes
        self.cuda = device.type == "cuda"
        self._rss = memory.DeviceMemoryPeak(device, interval_s=0.01, read=_rss_bytes, source="host RSS")
        self._mapped = memory.DeviceMemoryPeak(device, interval_s=0.01, read=_mapped_bytes, source="RssFile")
        self._driver = memory.DeviceMemoryPeak(device, interval_s=0.002) if self.cuda else None  # a measurement: fine
        self.result: dict[str, Any] = {"phase": name}

    def __enter__(self) -> "_Phase":
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._driver.start()
        self._rss.start()
        self._mapped.start()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.result["seconds"] = time.perf_counter() - self._start
        self._rss.stop()
        self._mapped.stop()
        self.result["host_peak_rss_gb"] = self._rss.peak_bytes / GB
        # file pages (a memory-mapped checkpoint): counted in RSS, but the kernel drops them under pressure
        self.result["host_peak_mapped_files_gb"] = self._mapped.peak_bytes / GB
        if self.cuda:
            self._driver.stop()
            stats = torch.cuda.memory_stats(self.device)
            self.result["torch_peak_allocated_gb"] = (stats["allocated_bytes.all.peak"] - self.ballast) / GB
            self.result["torch_peak_reserved_gb"] = (stats["reserved_bytes.all.peak"] - self.ballast) / GB
            self.result["driver_peak_in_use_gb"] = (self._driver.peak_bytes - self.ballast) / GB
            self.result["driver_source"] = self._driver.source


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _mapped_bytes() -> int:
    """The file-backed part of the RSS (Linux ``RssFile``); 0 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def is_paged_optimizer(component: str) -> bool:
    """bitsandbytes' paged optimizers (``PagedAdamW``, ``PagedAdamW8bit``, ``PagedLion`` ...) by name."""
    return component.rsplit(".", 1)[-1].startswith("Paged")


def _check_args(args: argparse.Namespace) -> None:
    if args.leave_gb is not None and is_paged_optimizer(args.optimizer):
        raise SystemExit(
            f"--leave-gb {args.leave_gb:g} with --optimizer {args.optimizer} is refused: a paged optimizer's state is "
            "CUDA managed memory, and asking for more managed memory than a ballast leaves free can hang the GPU; "
            "run without --leave-gb (PyTorch's peaks are the figures to read) or with a non-paged optimizer."
        )
    if args.stage == "resume" and args.output_dir is None:
        raise SystemExit("--stage resume reads the step checkpoint of a --stage train run: pass its --output-dir.")


def _ballast(device: torch.device, leave_gb: Optional[float]) -> tuple[Optional[torch.Tensor], int]:
    """All but ``leave_gb`` of the card's free memory, taken by one allocation (after the CUDA context)."""
    if leave_gb is None or device.type != "cuda":
        return None, 0
    torch.cuda.init()
    torch.empty(1, device=device)  # the context exists before free memory is read
    free, total = torch.cuda.mem_get_info(device)
    used_before = total - free  # the CUDA context (and anything else on the card)
    size = int(free - (leave_gb * GB - used_before))
    if size <= 0:
        return None, 0
    return torch.empty(size, dtype=torch.uint8, device=device), size


def _check_disk(output_dir: Path, need_bytes: int) -> None:
    free = shutil.disk_usage(output_dir).free
    if free < need_bytes * 1.05:
        raise SystemExit(
            f"{output_dir} has {free / GB:.1f} GB free; the step checkpoint needs about {need_bytes / GB:.1f} GB. "
            "Pass --output-dir on a larger disk, or --optimizer bitsandbytes.optim.PagedAdamW8bit (a quarter "
            "of the optimizer state)."
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> list[dict]:
    """Run the check (all phases, or one ``--stage``); returns one result dict per phase (also printed)."""
    _check_args(args)
    from torchtune.training import memory

    if args.device.startswith("cuda"):
        memory.set_cuda_alloc_conf()  # before the first CUDA allocation, as the recipe does
    from torchtune import utils

    device = utils.get_device(args.device)
    ballast, ballast_bytes = _ballast(device, args.leave_gb)
    work = Path(args.output_dir or tempfile.mkdtemp(prefix="gpu-memory-check-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = _load_recipe_config(args, work / "output")
    dtype = utils.get_dtype(cfg.dtype, device)
    estimates: dict[str, dict[str, float]] = {}
    saved = work / "estimates.json"  # the train stage's, reused by the resume stage (same settings)
    if args.estimate and args.stage == "resume" and saved.exists():
        estimates = json.loads(saved.read_text())
    elif args.estimate:
        from torchtune.training.estimate._checkpoint_memory import estimate_run_memory

        run_estimate = estimate_run_memory(cfg, seq_len=args.seq_len, batch_size=args.batch_size)
        estimates = {
            p.name: {"estimated_device_peak_gb": p.device_peak / GB, "estimated_host_ram_gb": p.host_ram_peak / GB}
            for p in run_estimate.phases
        }
        saved.write_text(json.dumps(estimates))
        if args.stage != "resume" and args.save:
            # fail before minutes of training if the step checkpoint cannot be written (checked again, exactly, later)
            breakdown = run_estimate.steps.breakdown
            _check_disk(
                work, breakdown["weights"] + breakdown["optimizer_state"] + run_estimate.steps.paged_optimizer_bytes
            )

    results: list[dict] = []
    generator = torch.Generator().manual_seed(0 if args.stage != "resume" else 1)

    def batch(vocab: int, seq_len: int) -> dict[str, torch.Tensor]:
        shape = (args.batch_size, seq_len)
        return {
            "tokens": torch.randint(0, vocab, shape, generator=generator),
            "labels": torch.randint(0, vocab, shape, generator=generator),
        }

    if args.stage in ("all", "train"):
        seq_len = _train(args, cfg, work, device, dtype, ballast_bytes, batch, results)
    if args.stage in ("all", "resume"):
        seq_len = _resume(args, cfg, work, device, dtype, ballast_bytes, batch, results)

    common = {
        "model": args.model,
        "device": str(device),
        "optimizer": args.optimizer,
        "batch_size": args.batch_size,
        "seq_len": seq_len,
        "leave_gb": args.leave_gb,
        "ballast_gb": ballast_bytes / GB,
    }
    for r in results:
        estimate = estimates.get(r["phase"]) or estimates.get("training steps" if r["phase"] == "one more step" else "")
        r.update(estimate or {})
        r.update(common)
    print(_table(results))
    for r in results:
        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in results))
    del ballast
    if args.output_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return results


def _train(
    args: argparse.Namespace,
    cfg: Any,
    work: Path,
    device: torch.device,
    dtype: torch.dtype,
    ballast_bytes: int,
    batch: Any,
    results: list,
) -> int:
    """Set-up, training steps and (unless ``--no-save``) the step checkpoint save; returns the sequence length."""
    from torchtune import training
    from torchtune.training.estimate import _checkpoint_memory as phases_code

    with _Phase("set-up (load weights)", device, ballast_bytes) as phase:
        step = training.TrainStep.from_config(cfg, device=device, dtype=dtype)
        phase.result["note"] = "random weights built on the device (no file read)"
    results.append(phase.result)
    model = step.model
    seq_len = min(args.seq_len, model.max_seq_len)
    vocab = model.tok_embeddings.num_embeddings
    data = batch(vocab, seq_len)

    with _Phase("training steps", device, ballast_bytes) as phase:
        losses, start = [], None
        for i in range(args.steps):
            if i == 1:  # the first step warms up kernels and allocates the optimizer state
                _sync(device)
                start = time.perf_counter()
            losses.append(step(data))  # kept on the device: no host sync inside the timed steps
        _sync(device)
        if start is not None:
            tokens = args.batch_size * seq_len * (args.steps - 1)
            phase.result["tokens_per_second"] = tokens / (time.perf_counter() - start)
        phase.result["last_loss"] = float(losses[-1])
    results.append(phase.result)
    if not args.save:
        return seq_len

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = sum(
        v.numel() * v.element_size()
        for opt in getattr(step.optimizer, "optim_map", {"": step.optimizer}).values()
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    source = work / "source"
    phases_code.write_hf_folder(model, source)  # config.json + a header-only weights file: the checkpointer's input
    _point_checkpointer_at(cfg, work)
    _check_disk(work, weights + state_bytes)
    checkpointer = training.build_checkpointer(cfg.checkpointer, None)

    with _Phase("step checkpoint save", device, ballast_bytes) as phase:
        phases_code.save_step_checkpoint(checkpointer, model, step.optimizer, cfg)
    results.append(phase.result)

    phases_code.release(step.optimizer)
    del step, model, checkpointer, data
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return seq_len


def _point_checkpointer_at(cfg: Any, work: Path) -> None:
    cfg.checkpointer.checkpoint_dir = str(work / "source")
    cfg.checkpointer.checkpoint_files = ["model.safetensors"]
    cfg.checkpointer.output_dir = str(work / "output")


def _resume(
    args: argparse.Namespace,
    cfg: Any,
    work: Path,
    device: torch.device,
    dtype: torch.dtype,
    ballast_bytes: int,
    batch: Any,
    results: list,
) -> int:
    """Resume load (as a new run does it) from the latest step checkpoint under ``work``, then one step."""
    from torchtune import config, training
    from torchtune.training.estimate import _checkpoint_memory as phases_code

    _point_checkpointer_at(cfg, work)
    folder = phases_code.latest_step_folder(work / "output")
    cfg.resume_from_checkpoint = True
    cfg.checkpointer.recipe_checkpoint = str(folder / training.RECIPE_STATE_NAME)
    with _Phase("resume load", device, ballast_bytes) as phase:
        checkpointer, model, optimizer = phases_code.setup_run(cfg, device, dtype, simulated=False)
        if args.stage == "resume":
            phase.result["note"] = "in a new process"
    results.append(phase.result)
    seq_len = min(args.seq_len, model.max_seq_len)

    resumed = training.TrainStep(
        model,
        optimizer,
        config.instantiate(cfg.loss),
        device=device,
        activations_ctx=training.get_act_offloading_ctx_manager(model, bool(cfg.enable_activation_offloading)),
        clip_grad_norm=cfg.clip_grad_norm,
    )
    with _Phase("one more step", device, ballast_bytes) as phase:
        phase.result["last_loss"] = float(resumed(batch(model.tok_embeddings.num_embeddings, seq_len)))
    results.append(phase.result)
    return seq_len


def _table(results: list[dict]) -> str:
    columns = [
        ("estimated_device_peak_gb", "estimate"),
        ("torch_peak_allocated_gb", "torch alloc"),
        ("torch_peak_reserved_gb", "torch reserved"),
        ("driver_peak_in_use_gb", "driver (NVML)"),
        ("estimated_host_ram_gb", "est. host RAM"),
        ("host_peak_rss_gb", "host RSS"),
        ("host_peak_mapped_files_gb", "of it mapped"),
    ]
    lines = ["Peak memory per phase (GB = 1e9 bytes; device figures without the ballast, driver's with the context):"]
    lines.append(f"  {'phase':<24}" + "".join(f"{label:>16}" for _, label in columns) + f"{'tokens/s':>12}")
    for r in results:
        cells = "".join(f"{r[key]:>16.2f}" if key in r else f"{'-':>16}" for key, _ in columns)
        tps = f"{r['tokens_per_second']:>12.0f}" if "tokens_per_second" in r else f"{'':>12}"
        lines.append(f"  {r['phase']:<24}{cells}{tps}")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--optimizer", default="bitsandbytes.optim.PagedAdamW")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8, help="training steps (the first is not timed)")
    parser.add_argument(
        "--leave-gb",
        type=float,
        default=None,
        help="fill the GPU with a ballast allocation up to all but this many GB (1e9); refused with a paged optimizer",
    )
    parser.add_argument("--output-dir", default=None, help="where the step checkpoint goes (default: a temp dir)")
    parser.add_argument(
        "--stage",
        choices=["all", "train", "resume"],
        default="all",
        help="train: set-up, steps, save; resume: resume load and one step from --output-dir (a new process)",
    )
    parser.add_argument("--no-save", dest="save", action="store_false", help="train stage without the step checkpoint")
    parser.add_argument("--no-estimate", dest="estimate", action="store_false", help="skip tune estimate-memory")
    parser.add_argument("--json", default=None, help="also write the JSON lines to this file")
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
