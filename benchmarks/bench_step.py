"""Time the recipe's real training step with each optimizer setting, in one process, round-robin.

    .venv/bin/python benchmarks/bench_step.py                      # the table in docs/speed.md
    .venv/bin/python benchmarks/bench_step.py --steps 5 --json /tmp/bench.json
    .venv/bin/python benchmarks/bench_step.py --variants adamw,adamw_bwd,adamw_unfused,adamw_bwd_unfused

Every variant is a ``torchtune.training.TrainStep`` built from a recipe config (random weights): the
model set-up, optimizer-in-backward hooks, loss and label shift the recipe's ``train()`` runs. The
variants start from identical weights, see identical synthetic batches (with padding), and are
interleaved round-robin (the starting variant rotates every round) so that drift in machine load hits
all of them alike. Tokens are counted with ``torchtune.training.num_tokens`` (non-padding tokens), the
count behind the ``tokens_per_second`` the recipe logs. Reported: median step time, median tokens/s and
their ratio to the standard ``adamw`` variant.

dtype ``auto`` means bf16 where the CPU multiplies bf16 natively (oneDNN bf16: AVX512-BF16 / AMX) or
on CUDA, else fp32: without native support PyTorch's bf16 CPU matmuls run 5-60x slower than fp32
(measured, see docs/speed.md) and one step of the default model would take minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from torchtune import training, utils  # noqa: E402
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX  # noqa: E402

PAD_ID = 0

# name -> what the variant sets: the optimizer config and optimizer_in_bwd, and optionally
#   group:   optimizer_in_bwd_group ("param" unless given)
#   loss:    the loss node (default: --loss)
#   select:  select_label_positions of the step (default True, as the recipe)
#   logged:  "all": after each step do what the recipe's logged step does: read the loss and the
#            gradient norm (armed before the step, added in the hooks), read the memory stats, write
#            the row; "grad_norm": only the gradient norm (armed, summed in the hooks, read);
#            "weights_changed": only the weight-change count (armed, counted in the hooks, read), which
#            the recipe logs for bf16/fp16 weights: in fp32 it measures the count at twice bf16's bytes
# torch AdamW is fused in both modes: on CPU (and CUDA) the fused kernel is one pass over
# param/grad/state, several times faster than the default per-tensor loop on CPU (see docs/speed.md),
# and the comparison is only fair with the same kernel in both modes. The *_unfused variants measure
# that choice; the adamw_bwd_* ones measure one recipe feature each against adamw_bwd.
_FUSED = {"_component_": "torch.optim.AdamW", "fused": True}
_CHUNKED = "torchtune.modules.loss.ChunkedCrossEntropyLoss"
VARIANTS: Dict[str, Dict[str, Any]] = {
    "adamw": {"optimizer": _FUSED, "in_bwd": False},
    "adamw_bwd": {"optimizer": _FUSED, "in_bwd": True},
    "bnb_adamw8bit_bwd": {"optimizer": {"_component_": "bitsandbytes.optim.AdamW8bit"}, "in_bwd": True},
    "ao_adamw8bit_bwd": {"optimizer": {"_component_": "torchao.optim.AdamW8bit"}, "in_bwd": True},
    "adamw_unfused": {"optimizer": {"_component_": "torch.optim.AdamW"}, "in_bwd": False},
    "adamw_bwd_unfused": {"optimizer": {"_component_": "torch.optim.AdamW"}, "in_bwd": True},
    "adamw_bwd_layer": {"optimizer": _FUSED, "in_bwd": True, "group": "layer"},
    # bf16: what stochastic rounding costs (every other variant rounds, as the shipped bf16 configs do)
    "adamw_bwd_layer_nearest": {"optimizer": _FUSED, "in_bwd": True, "group": "layer", "rounding": False},
    "adamw_bwd_no_select": {"optimizer": _FUSED, "in_bwd": True, "select": False},
    "adamw_bwd_logged": {"optimizer": _FUSED, "in_bwd": True, "logged": "all"},
    "adamw_bwd_grad_norm": {"optimizer": _FUSED, "in_bwd": True, "logged": "grad_norm"},
    "adamw_bwd_weights_changed": {"optimizer": _FUSED, "in_bwd": True, "logged": "weights_changed"},
    "adamw_bwd_chunked1": {
        "optimizer": _FUSED,
        "in_bwd": True,
        "loss": {"_component_": _CHUNKED, "num_output_chunks": 1},
    },
    "adamw_bwd_chunked8": {
        "optimizer": _FUSED,
        "in_bwd": True,
        "loss": {"_component_": _CHUNKED, "num_output_chunks": 8},
    },
    "adamw_bwd_chunked8_rows1": {  # chunks of any size (min_chunk_rows: 1): what 8 small chunks cost
        "optimizer": _FUSED,
        "in_bwd": True,
        "loss": {"_component_": _CHUNKED, "num_output_chunks": 8, "min_chunk_rows": 1},
    },
    "adamw_bwd_vocab8": {  # the vocabulary cut into 8 slices instead of the rows
        "optimizer": _FUSED,
        "in_bwd": True,
        "loss": {"_component_": "torchtune.modules.loss.VocabChunkedCrossEntropyLoss", "num_output_chunks": 8},
    },
    "adamw_bwd_chunked32": {
        "optimizer": _FUSED,
        "in_bwd": True,
        "loss": {"_component_": _CHUNKED, "num_output_chunks": 32},
    },
}
DEFAULT_VARIANTS = ("adamw", "adamw_bwd", "bnb_adamw8bit_bwd", "ao_adamw8bit_bwd")
BASELINE = "adamw"

# The mid-size Llama2 of the issue: ~170M parameters (134M of them in the embedding and output).
DEFAULT_MODEL = dict(vocab_size=32000, num_layers=8, num_heads=16, num_kv_heads=16, embed_dim=1024, max_seq_len=512)


def count_tokens(batch: Dict[str, torch.Tensor]) -> int:
    """Non-padding tokens of ``batch``: the recipe's own count, the one its logged tokens/s uses."""
    return training.num_tokens(batch, PAD_ID)


def resolve_dtype(dtype: str, device: str) -> str:
    """``bf16``/``fp32`` as given; ``auto``: bf16 on CUDA or a CPU with native bf16 matmul, else fp32."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bf16"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def bench_config(
    variant: str,
    model: Dict[str, Any],
    dtype: str,
    device: str,
    lr: float = 2e-5,
    loss: str = "torchtune.modules.loss.CrossEntropyLoss",
    compile_model: bool = False,
) -> DictConfig:
    """A recipe config for ``variant``: the keys a training step reads (data/checkpoint keys unused)."""
    spec = VARIANTS[variant]
    return OmegaConf.create(
        {
            "output_dir": "/tmp/bench_step_unused",
            "tokenizer": None,
            "dataset": None,
            "seed": 0,
            "shuffle": False,
            "model": {"_component_": "torchtune.models.llama2.llama2", **model},
            "checkpointer": None,
            "resume_from_checkpoint": False,
            "overwrite": False,
            "batch_size": 1,
            "epochs": 1,
            "max_steps_per_epoch": None,
            "gradient_accumulation_steps": 1,
            "optimizer": {**spec["optimizer"], "lr": lr, "weight_decay": 0.0},
            "optimizer_in_bwd": spec["in_bwd"],
            "optimizer_in_bwd_group": spec.get("group", "param"),
            "lr_scheduler": None,
            "loss": spec.get("loss", {"_component_": loss}),
            "clip_grad_norm": None,
            "compile": compile_model,
            "liger_kernels": False,
            "device": device,
            "dtype": dtype,
            "bf16_stochastic_rounding": dtype == "bf16" and spec.get("rounding", True),  # as the bf16 configs
            "enable_activation_checkpointing": False,
            "enable_activation_offloading": False,
            "save_every_n_steps": None,
            "keep_last_n_checkpoints": None,
            "metric_logger": None,
            "log_every_n_steps": 1,
            "log_peak_memory_stats": False,
        }
    )


def build_step(
    cfg: DictConfig, weights_seed: int = 0, grad_norm: Any = None, weight_changes: Any = None
) -> training.TrainStep:
    """The recipe's training step for ``cfg``, on random weights (the same for every variant)."""
    device = utils.get_device(cfg.device)
    torch.manual_seed(weights_seed)  # every variant starts from the same weights
    return training.TrainStep.from_config(
        cfg,
        device=device,
        dtype=utils.get_dtype(cfg.dtype, device),
        grad_norm=grad_norm,
        weight_changes=weight_changes,
    )


class LoggedStep:
    """A step followed by what the recipe does on a logged step (``log_every_n_steps: 1`` and
    ``log_peak_memory_stats: True``, as in llama2/tiny_full): the gradient norm (and, for bf16 weights,
    the weight-change count) is armed before the step and fed by the hooks, then the loss and the
    norm are read (the syncs), the memory stats read and the row written to a metrics.jsonl."""

    def __init__(self, cfg: DictConfig, log_dir: Path, what: str = "all") -> None:
        from torchtune.training import memory
        from torchtune.training.metric_logging import DiskLogger

        self.memory, self.what = memory, what
        self.grad_norm = training.GradNormTracker()
        # as the recipe: weights_changed is counted for low-precision weights only
        counted = (what == "all" and cfg.dtype != "fp32") or what == "weights_changed"
        self.weight_changes = training.WeightChangeTracker() if counted else None
        self.step = build_step(cfg, grad_norm=self.grad_norm, weight_changes=self.weight_changes)
        self.logger = DiskLogger(log_dir=str(log_dir))
        self.count = 0

    def __call__(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if self.what != "weights_changed":
            self.grad_norm.arm(self.step.device)
        if self.weight_changes is not None:
            self.weight_changes.arm(self.step.device)
        loss = self.step(batch)
        self.count += 1
        if self.what == "grad_norm":
            self.grad_norm.pop()
            return loss
        if self.what == "weights_changed":
            self.weight_changes.pop()
            return loss
        payload = {"loss": loss.item(), "grad_norm": self.grad_norm.pop()}
        if self.weight_changes is not None:
            payload["weights_changed"] = self.weight_changes.pop()
        payload.update(self.memory.get_memory_stats(self.step.device, reset_stats=False))
        self.logger.log_dict(payload, step=self.count)
        return loss


def build_variant(name: str, cfg: DictConfig, log_dir: Path) -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
    """The callable a variant times: the recipe's ``TrainStep`` as ``VARIANTS[name]`` sets it up."""
    spec = VARIANTS[name]
    if spec.get("logged"):
        return LoggedStep(cfg, log_dir, spec["logged"])
    step = build_step(cfg)
    step.select_label_positions = spec.get("select", True)
    return step


def synthetic_batches(
    n: int, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0
) -> List[Dict[str, torch.Tensor]]:
    """``n`` right-padded batches like ``padded_collate`` makes: row ``i`` is ``seq_len`` long minus
    ``i/batch_size`` of it in padding (the first row is full), so non-padding counting matters."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        tokens = torch.randint(1, vocab_size, (batch_size, seq_len), generator=gen)
        labels = tokens.clone()
        for row in range(batch_size):
            length = seq_len - (seq_len * row) // (2 * batch_size)
            tokens[row, length:] = PAD_ID
            labels[row, length:] = CROSS_ENTROPY_IGNORE_IDX
        batches.append({"tokens": tokens, "labels": labels})
    return batches


def _sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def run_benchmark(
    variants: Sequence[str],
    *,
    steps: int,
    warmup: int,
    batch_size: int,
    seq_len: int,
    device: str = "cpu",
    dtype: str = "auto",
    model: Optional[Dict[str, Any]] = None,
    loss: str = "torchtune.modules.loss.CrossEntropyLoss",
    compile_model: bool = False,
    budget_s: Optional[float] = None,
    log: Callable[[str], None] = print,
) -> Dict[str, Any]:
    """Time ``warmup + steps`` training steps of every variant, interleaved; returns the results.

    ``budget_s``: stop the timed rounds early (after at least one) when the next round would end
    past this many seconds from the start; the result says how many rounds ran.
    """
    start = time.perf_counter()
    model = {**DEFAULT_MODEL, **(model or {})}
    dtype = resolve_dtype(dtype, device)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    train_steps = {}
    for name in variants:
        t0 = time.perf_counter()
        cfg = bench_config(name, model, dtype, device, loss=loss, compile_model=compile_model)
        train_steps[name] = build_variant(name, cfg, Path(tempfile.mkdtemp(prefix=f"bench_{name}_")))
        log(f"built {name} in {time.perf_counter() - t0:.1f}s")
    first = next(iter(train_steps.values()))
    n_params = sum(p.numel() for p in getattr(first, "step", first).model.parameters())
    batches = synthetic_batches(warmup + steps, batch_size, seq_len, model["vocab_size"])
    sync = _sync(device)
    times: Dict[str, List[float]] = {name: [] for name in variants}
    cpu_times: Dict[str, List[float]] = {name: [] for name in variants}
    tokens: Dict[str, List[int]] = {name: [] for name in variants}
    losses: Dict[str, List[float]] = {name: [] for name in variants}
    order = list(variants)
    budget_cut = False
    for i, batch in enumerate(batches):
        round_start = time.perf_counter()
        rotated = order[i % len(order) :] + order[: i % len(order)]
        this_round = []
        for name in rotated:
            n_tokens = count_tokens(batch)
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            loss_value = train_steps[name](batch)
            sync()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            this_round.append(f"{name} {elapsed:.2f}s")
            if i >= warmup:
                times[name].append(elapsed)
                cpu_times[name].append(cpu)
                tokens[name].append(n_tokens)
                losses[name].append(float(loss_value))
        log(f"round {i + 1}/{len(batches)}{' (warm-up)' if i < warmup else ''}: " + ", ".join(this_round))
        now = time.perf_counter()
        if (
            budget_s is not None
            and i >= warmup
            and i + 1 < len(batches)
            and now + (now - round_start) - start > budget_s
        ):
            budget_cut = True
            log(f"stopping after {i + 1 - warmup} timed round(s): the next would pass --budget-s {budget_s:g}")
            break
    rows = []
    for name in variants:
        step_s = statistics.median(times[name])
        tps = statistics.median(t / s for t, s in zip(tokens[name], times[name]))
        rows.append(
            {
                "variant": name,
                "optimizer": VARIANTS[name]["optimizer"]["_component_"],
                "fused": bool(VARIANTS[name]["optimizer"].get("fused", False)),
                "optimizer_in_bwd": VARIANTS[name]["in_bwd"],
                "step_s_median": step_s,
                "step_s_min": min(times[name]),
                "tokens_per_s_median": tps,
                "cpu_s_median": statistics.median(cpu_times[name]),
                "step_times_s": times[name],
                "cpu_times_s": cpu_times[name],
                "tokens": tokens[name],
                "losses": losses[name],
            }
        )
    base = next((r for r in rows if r["variant"] == BASELINE), rows[0])
    for r in rows:
        r["step_ratio"] = r["step_s_median"] / base["step_s_median"]
        r["tokens_per_s_ratio"] = r["tokens_per_s_median"] / base["tokens_per_s_median"]
        r["cpu_ratio"] = r["cpu_s_median"] / base["cpu_s_median"]
    return {
        "baseline": base["variant"],
        "device": device,
        "dtype": dtype,
        "model": model,
        "parameters": n_params,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "steps": steps,
        "timed_rounds": len(times[variants[0]]),
        "budget_cut": budget_cut,
        "warmup": warmup,
        "loss": loss,
        "compile": compile_model,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rows": rows,
    }


def format_table(result: Dict[str, Any]) -> str:
    """A Markdown table of the results (the one pasted into docs/speed.md)."""
    b = result["baseline"]
    lines = [
        f"| variant | optimizer | in backward | step (s, median) | tokens/s (median) | "
        f"step vs {b} | tokens/s vs {b} | CPU time/step (s) | CPU time vs {b} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        opt = r["optimizer"] + (" (fused)" if r["fused"] else "")
        lines.append(
            f"| {r['variant']} | {opt} | {'yes' if r['optimizer_in_bwd'] else 'no'} | "
            f"{r['step_s_median']:.3f} | {r['tokens_per_s_median']:.1f} | "
            f"{r['step_ratio']:.3f}x | {r['tokens_per_s_ratio']:.3f}x | "
            f"{r['cpu_s_median']:.3f} | {r['cpu_ratio']:.3f}x |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant (median over these)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per variant first")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument(
        "--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, from: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--loss", default="torchtune.modules.loss.CrossEntropyLoss")
    parser.add_argument("--compile", action="store_true", help="compile each decoder layer (recipe's compile: True)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=280,
        help="stop timed rounds early so the run ends within this many seconds (0: no limit)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", dest="json_out", help="also write the results to this JSON file")
    group = parser.add_argument_group("model size (defaults: the ~170M Llama2 of docs/speed.md)")
    for key in ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "embed_dim", "max_seq_len"):
        group.add_argument("--" + key.replace("_", "-"), type=int, dest=key, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cpu":
        training.memory.reuse_freed_host_memory_if_asked()  # as the recipe does for a CPU run
    model = {k: getattr(args, k) for k in DEFAULT_MODEL if getattr(args, k) is not None}
    if "num_heads" in model and "num_kv_heads" not in model:
        model["num_kv_heads"] = model["num_heads"]
    t0 = time.perf_counter()
    result = run_benchmark(
        [v for v in args.variants.split(",") if v],
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        device=args.device,
        dtype=args.dtype,
        model=model,
        loss=args.loss,
        compile_model=args.compile,
        budget_s=args.budget_s or None,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    result["wall_s"] = time.perf_counter() - t0
    print(
        f"\n{result['parameters'] / 1e6:.1f}M-parameter Llama2, {result['dtype']} on {result['device']}, "
        f"batch {result['batch_size']} x seq {result['seq_len']}, {result['timed_rounds']} timed steps "
        f"(+{result['warmup']} warm-up) per variant, {result['threads']} threads, torch {result['torch']}, "
        f"{result['wall_s']:.0f}s in all"
        + (f"; only {result['timed_rounds']} timed round(s) fitted in --budget-s" if result["budget_cut"] else "")
        + "\n"
    )
    print(format_table(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
