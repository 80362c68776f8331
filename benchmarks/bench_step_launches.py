"""What one training step asks of a GPU, counted on a CPU: ours and torchtune 0.6.1's, for the same job.

    .venv/bin/python benchmarks/bench_step_launches.py --config llama2/7B_full_low_memory \\
        --seq-len 2048 --batch-size 2 --packed both --torchtune-python /work/tt/tt061/bin/python

For each of unpacked and packed batches (``--packed``: no, yes, both), one unlogged and one logged training
step of our recipe on ``--config`` (``torchtune.training.estimate._step_launches``), and, with
``--torchtune-python`` (a venv with torchtune 0.6.1), of torchtune 0.6.1's recipe on its own config of the
same name (read from that venv's installed ``recipes/configs``; ``--torchtune-config`` names another), run in
that venv from a folder outside this repository. Both run on the CUDA code path with the device played by
``meta`` tensors (``torchtune/training/estimate/_launch_counter.py`` says how each op maps to kernel launches,
syncs and copies), after one warm-up step that makes the optimizer state; batch ``--batch-size`` x
``--seq-len`` tokens, every token labelled; packed rows hold Alpaca-like examples (~136 tokens). The table
gives per step: kernel launches by kind, host syncs, host-to-device copies (pageable, pinned), prefetches of
paged optimizer state, optimizer launches per parameter, and the host time of the optimizer step per
parameter (Python around the ops, measured here on the CPU with the counter's own dispatch time left out:
compare it between rows of one run only).

torchtune's step is its recipe's: ``_setup_model``, ``_setup_optimizer`` and ``_loss_step`` of its
``FullFinetuneRecipeSingleDevice`` called on an instance set up for the config (no weights are loaded), its
collate (``padded_collate_sft``; ``padded_collate_packed``, whose block mask is built on CUDA by
``create_block_mask``), and the body of its ``train()`` loop written out here (batch to device, token count,
loss times tokens, backward with the in-backward steps, ``running_loss.item()``, the progress bar's and the
disk logger's formatting of device tensors). It is counted with torchtune's CUDA paths switched on: CUDA
streams for activation offloading and FlexAttention for packed batches (compiled, counted as its kernels).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
COUNTER_FILE = REPO_ROOT / "torchtune" / "training" / "estimate" / "_launch_counter.py"
KERNELS_FILE = REPO_ROOT / "torchtune" / "training" / "estimate" / "_attention_kernels.py"


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --- ours ----------------------------------------------------------------------------------------------


def count_ours(config: str, overrides: List[str], seq_len: int, batch_size: int, packed: bool) -> Dict[str, Any]:
    sys.path.insert(0, str(REPO_ROOT))
    from torchtune.config._load import load_config
    from torchtune.training.estimate._step_launches import count_step_launches

    cfg = load_config(config, [f"batch_size={batch_size}", f"dataset.packed={packed}", *overrides])
    result = count_step_launches(cfg, seq_len=seq_len, batch_size=batch_size, packed=packed)
    return {
        "unlogged": result.unlogged.as_dict(),
        "logged": result.logged.as_dict(),
        "parameters": result.parameters,
        "notes": result.notes,
    }


# --- torchtune 0.6.1, in its own venv ----------------------------------------------------------------------


@contextlib.contextmanager
def _cuda_as_available(lc: Any) -> Any:
    """While torchtune is imported: CUDA reads as an sm90 device, so its CUDA-only paths (FlexAttention for
    packed batches) are the ones switched on, as on the GPU this count stands for."""
    import torch

    saved = torch.cuda.is_available, torch.cuda.get_device_capability
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.get_device_capability = saved


def _tt_config(name: str) -> Path:
    import sysconfig

    import torchtune

    for base in (Path(torchtune.__file__).resolve().parents[1], Path(sysconfig.get_paths()["purelib"])):
        path = base / "recipes" / "configs" / f"{name}.yaml"
        if path.exists():
            return path
    raise SystemExit(f"torchtune's config {name} is not in its installed recipes/configs")


def count_torchtune(config: str, seq_len: int, batch_size: int, packed: bool) -> Dict[str, Any]:
    """torchtune 0.6.1's step on its own ``config`` (run in its venv: ``--worker torchtune``)."""
    lc = _load(COUNTER_FILE, "tt_launch_counter")
    kernels = _load(KERNELS_FILE, "tt_attention_kernels")
    import torch
    from omegaconf import OmegaConf

    with _cuda_as_available(lc):
        import torchtune
        from torchtune import config as tt_config
        from torchtune import training
        from torchtune.data import padded_collate_packed, padded_collate_sft
        from torchtune.modules import attention_utils

    assert Path(torchtune.__file__).resolve().parents[1] != REPO_ROOT, "this is our torchtune, not 0.6.1's"
    cfg = OmegaConf.load(_tt_config(config))
    cfg.batch_size = batch_size
    cfg.dataset.packed = packed
    recipe_path = Path(_tt_config(config)).parents[2] / "full_finetune_single_device.py"
    recipe_module = _load(recipe_path, "tt_full_finetune_single_device")
    attention_utils.compile_friendly_flex_attention = lambda q, k, v, block_mask: kernels.flex_attention_as_compiled(
        q, k, v, block_mask
    )
    make_block_mask = attention_utils.create_block_causal_mask_flex
    # its device="cuda" would initialise CUDA before any op: the counter's device instead
    attention_utils.create_block_causal_mask_flex = lambda *args, **kwargs: make_block_mask(
        *lc.mapped_device(args), **lc.mapped_device(kwargs)
    )
    sdpa = kernels._TargetAttention(torch.nn.functional.scaled_dot_product_attention)
    counter = lc.LaunchCounter()
    notes: List[str] = []
    saved_sdpa, saved_load = torch.nn.functional.scaled_dot_product_attention, torch.nn.Module.load_state_dict
    torch.nn.functional.scaled_dot_product_attention = sdpa
    # the allocator's counters, read on the host (no device work): nothing to count, and meta has none
    saved_stats = training.get_memory_stats, training.log_memory_stats
    training.get_memory_stats, training.log_memory_stats = (lambda *a, **k: {}), (lambda *a, **k: None)
    try:
        with lc.counting(counter), lc.simulated_bitsandbytes(), lc.simulated_cuda_streams():
            recipe = object.__new__(recipe_module.FullFinetuneRecipeSingleDevice)
            recipe._device = lc.DEVICE
            recipe._dtype = training.get_dtype(cfg.dtype, device=torch.device("cpu"))
            recipe._optimizer_in_bwd = bool(cfg.optimizer_in_bwd)
            torch.nn.Module.load_state_dict = lambda self, *args, **kwargs: None  # no weights
            # torchtune 0.6.1's recipe's own set-up methods, by name (this repository's recipe has methods of
            # these names too, which nothing outside it may call)
            setup_model, setup_optimizer = getattr(recipe, "_setup_model"), getattr(recipe, "_setup_optimizer")  # noqa: B009
            model = setup_model(
                cfg_model=cfg.model,
                enable_activation_checkpointing=bool(cfg.enable_activation_checkpointing),
                enable_activation_offloading=bool(cfg.get("enable_activation_offloading", False)),
                compile_model=False,
                model_state_dict={},
            )
            torch.nn.Module.load_state_dict = saved_load
            recipe._model = model
            recipe._optimizer = setup_optimizer(cfg.optimizer, optimizer_in_bwd=recipe._optimizer_in_bwd)
            recipe._loss_fn = tt_config.instantiate(cfg.loss)
            if recipe._loss_fn.__class__.__name__ == "CEWithChunkedOutputLoss":
                model.set_num_output_chunks(recipe._loss_fn.num_output_chunks)
            recipe.ignore_labels_cache = torch.full(
                (batch_size, 1), recipe._loss_fn.ignore_index, device=recipe._device
            )
            if bool(cfg.get("compile", False)):
                notes.append("compile=True: counted as the eager step")
            vocab = model.tok_embeddings.num_embeddings
            packs = _packs(batch_size, seq_len, vocab, packed)
            counts = []
            for index in range(3):
                logged = index == 2
                counter.reset()
                if packed:
                    batch = padded_collate_packed(packs)  # the block mask is made here, on the device
                else:
                    batch = padded_collate_sft(packs, padding_idx=0, ignore_idx=recipe._loss_fn.ignore_index)
                _tt_loop_body(recipe, batch, index + 1, int(cfg.get("log_every_n_steps", 1)) if logged else None)
                counts.append(counter.count())
    finally:
        training.get_memory_stats, training.log_memory_stats = saved_stats
        torch.nn.functional.scaled_dot_product_attention = saved_sdpa
        torch.nn.Module.load_state_dict = saved_load
    parameters = len([p for p in model.parameters() if p.requires_grad])
    return {"unlogged": counts[1].as_dict(), "logged": counts[2].as_dict(), "parameters": parameters, "notes": notes}


def _tt_loop_body(recipe: Any, batch: Dict[str, Any], global_step: int, log_every: Optional[int]) -> None:
    """torchtune 0.6.1's ``train()`` body for one step of one micro-batch with optimizer in backward (no LR
    schedule, no profiler); ``log_every`` None: a step that its ``log_every_n_steps`` does not log."""
    import time

    from torchtune import utils

    t0 = time.perf_counter()
    utils.batch_to_device(batch, recipe._device)
    current_num_tokens = (batch["labels"] != recipe._loss_fn.ignore_index).sum()
    num_tokens = current_num_tokens
    current_loss = recipe._loss_step(batch) * current_num_tokens
    running_loss = current_loss
    current_loss.backward()
    loss_to_log = running_loss.item() / num_tokens  # every step, logged or not
    description = f"1|{global_step}|Loss: {loss_to_log}"  # the progress bar's, every step
    if log_every is not None and global_step % log_every == 0:
        time_per_step = time.perf_counter() - t0
        log_dict = {"loss": loss_to_log, "lr": 0.0, "tokens_per_second_per_gpu": num_tokens / time_per_step}
        # DiskLogger.log_dict writes f"{name}:{data}" of each value
        description += "".join(f"Step {global_step} | {name}:{data}\n" for name, data in log_dict.items())
    del description


def _packs(batch_size: int, seq_len: int, vocab: int, packed: bool) -> List[Dict[str, Any]]:
    """The packs of ``synthetic_batch`` (the same rows for both recipes), as torchtune's datasets give them."""
    import random

    import torch

    rng = random.Random(0)
    packs = []
    for _ in range(batch_size):
        tokens = [rng.randrange(1, vocab) for _ in range(seq_len)]
        if not packed:
            packs.append({"tokens": tokens, "labels": list(tokens)})
            continue
        lengths, left = [], seq_len
        while left > 0:
            n = min(left, max(8, int(rng.lognormvariate(4.7, 0.6))))
            lengths.append(n)
            left -= n
        packs.append(
            {
                "tokens": torch.tensor(tokens),
                "labels": torch.tensor(tokens),
                "input_pos": torch.tensor([i for n in lengths for i in range(n)]),
                "seq_lens": torch.tensor(lengths),
            }
        )
    return packs


# --- the table ---------------------------------------------------------------------------------------------


KINDS = ("optimizer", "rounding", "attention", "norm", "copy", "other")


def table(rows: List[tuple]) -> str:
    lines = [
        "| recipe | batch | step | launches | optimizer | rounding | attention | norm | copy | other | host syncs "
        "| H2D pageable | H2D pinned | paged prefetches | optimizer launches / param | host us / param |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe, batch, step, c in rows:
        per = c["optimizer_launches"] / max(c["optimizer_params"], 1)
        us = 1e6 * c["optimizer_host_s"] / max(c["optimizer_params"], 1)
        lines.append(
            f"| {recipe} | {batch} | {step} | {c['total']} | "
            + " | ".join(str(c["launches"][k]) for k in KINDS)
            + f" | {c['syncs']} | {c['h2d_pageable']} | {c['h2d_pinned']} | {c['prefetches']} | {per:.1f} | {us:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="llama2/7B_full_low_memory")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--packed", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--torchtune-python", default=None, help="python of a venv with torchtune 0.6.1")
    parser.add_argument("--torchtune-config", default=None, help="torchtune's config (default: --config)")
    parser.add_argument("--json", dest="json_out", default=None)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of our config")
    parser.add_argument("--worker", choices=["torchtune"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--pack", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = count_torchtune(args.config, args.seq_len, args.batch_size, args.pack == "yes")
        Path(args.result).write_text(json.dumps(result))
        return 0
    modes = {"no": [False], "yes": [True], "both": [False, True]}[args.packed]
    results: Dict[str, Any] = {}
    rows = []
    for packed in modes:
        label = "packed" if packed else "unpacked"
        print(f"counting ours ({label}) ...", file=sys.stderr, flush=True)
        ours = count_ours(args.config, args.overrides, args.seq_len, args.batch_size, packed)
        results[f"ours_{label}"] = ours
        rows += [("ours", label, "unlogged", ours["unlogged"]), ("ours", label, "logged", ours["logged"])]
        if args.torchtune_python:
            print(f"counting torchtune 0.6.1 ({label}) ...", file=sys.stderr, flush=True)
            theirs = _run_torchtune(args, packed)
            results[f"torchtune_{label}"] = theirs
            rows += [
                ("torchtune 0.6.1", label, "unlogged", theirs["unlogged"]),
                ("torchtune 0.6.1", label, "logged", theirs["logged"]),
            ]
    print(
        f"\n{args.config}, batch {args.batch_size} x {args.seq_len} tokens, one step after a warm-up step, on the "
        "CUDA code path with meta tensors as the device (counted, not timed on a GPU)\n"
    )
    print(table(rows))
    for name, result in results.items():
        for note in result.get("notes", []):
            print(f"note ({name}): {note}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


def _run_torchtune(args: argparse.Namespace, packed: bool) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="launches_tt_") as work:
        result = Path(work) / "result.json"
        command = [
            args.torchtune_python,
            str(Path(__file__).resolve()),
            "--worker",
            "torchtune",
            "--config",
            args.torchtune_config or args.config,
            "--seq-len",
            str(args.seq_len),
            "--batch-size",
            str(args.batch_size),
            "--pack",
            "yes" if packed else "no",
            "--result",
            str(result),
        ]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # torchtune 0.6.1's own, not ours
        proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"torchtune 0.6.1's count failed:\n{proc.stderr[-4000:]}")
        return json.loads(result.read_text())


if __name__ == "__main__":
    sys.exit(main())
