"""Our recipe against torchtune 0.6.1's full_finetune_single_device: same model, data and settings.

    python3 -m venv /tmp/tt061
    /tmp/tt061/bin/pip install torch==2.13.0 torchtune==0.6.1 torchao==0.11.0   # torchao 0.18 lacks nf4tensor
    .venv/bin/python benchmarks/compare_torchtune.py --tt-python /tmp/tt061/bin/python

Both recipes run their own ``setup()`` and ``train()`` (each in its own process and venv) on the same
random-weight Hugging Face checkpoint, the same SentencePiece tokenizer and the same Alpaca-style JSON
data, with the same model dims, dtype, batch size, optimizer and settings. Every example is longer than
``--seq-len`` so each is cut to exactly that length: both recipes do the same work (``batch x seq``
tokens per step, no padding), whatever their templates. A step's time is recovered from what each
recipe logs: its ``tokens_per_second`` (ours) / ``tokens_per_second_per_gpu`` (torchtune) is its own
token count over its own step time, so the time is the count (recomputed from the same batches, the
recipe's way) over the logged rate. The first ``--skip`` steps are left out; medians are reported.
Runs alternate between the two recipes to share the machine's drift.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
DIMS = dict(vocab_size=32000, num_layers=8, num_heads=16, num_kv_heads=16, embed_dim=1024, max_seq_len=512)
LOSSES = {  # each recipe's own plain and chunked cross-entropy
    "plain": {"ours": "torchtune.modules.loss.CrossEntropyLoss", "torchtune": "torch.nn.CrossEntropyLoss"},
    "chunked": {
        "ours": "torchtune.modules.loss.ChunkedCrossEntropyLoss",
        "torchtune": "torchtune.modules.loss.CEWithChunkedOutputLoss",
    },
}


def prepare(work: Path, seq_len: int, n_examples: int) -> Dict[str, Path]:
    """Checkpoint (random weights), tokenizer and data shared by both recipes."""
    sys.path.insert(0, str(REPO_ROOT))
    from tests._helpers.tiny_run import make_hf_checkpoint
    from tests._helpers.tokenizer import make_spm_tokenizer

    rng = random.Random(0)
    words = [
        "apple",
        "river",
        "stone",
        "cloud",
        "tiger",
        "lemon",
        "piano",
        "candle",
        "orbit",
        "maple",
        "quartz",
        "violet",
        "harbor",
        "meadow",
        "copper",
        "falcon",
    ]
    rows = [
        {
            "instruction": " ".join(rng.choice(words) for _ in range(seq_len)),
            "input": "",
            "output": " ".join(rng.choice(words) for _ in range(8)),
        }
        for _ in range(n_examples)
    ]
    data = work / "data.json"
    data.write_text(json.dumps(rows))
    tokenizer = make_spm_tokenizer(work / "tok", [r["instruction"] for r in rows[:50]], vocab_size=300)
    ckpt = make_hf_checkpoint(work / "base", seed=0, **DIMS)
    return {"data": data, "tokenizer": tokenizer, "checkpoint": ckpt}


def config(impl: str, assets: Dict[str, Path], out: Path, args: argparse.Namespace, in_bwd: bool) -> Dict[str, Any]:
    common = {
        "output_dir": str(out),
        "seed": 0,
        "shuffle": True,
        "resume_from_checkpoint": False,
        "model": {"_component_": "torchtune.models.llama2.llama2", **DIMS},
        "batch_size": args.batch_size,
        "epochs": 1,
        "max_steps_per_epoch": args.steps,
        "gradient_accumulation_steps": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5, "weight_decay": 0.0, "fused": True},
        "optimizer_in_bwd": in_bwd,
        "loss": {"_component_": LOSSES[args.loss][impl]},
        "clip_grad_norm": None,
        "compile": False,
        "device": args.device,
        "dtype": args.dtype,
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
    }
    ckpt = {
        "checkpoint_dir": str(assets["checkpoint"]),
        "checkpoint_files": ["model.safetensors"],
        "recipe_checkpoint": None,
        "output_dir": str(out),
        "model_type": "LLAMA2",
    }
    data = {
        "_component_": "torchtune.datasets.alpaca_dataset",
        "source": "json",
        "data_files": str(assets["data"]),
        "train_on_input": True,
        "packed": False,
        "split": "train",
    }
    if impl == "ours":
        if args.loss == "chunked":
            common["loss"]["num_output_chunks"] = 8
        return {
            **common,
            "tokenizer": {
                "_component_": "torchtune.models.llama2.llama2_tokenizer",
                "path": str(assets["tokenizer"]),
                "max_seq_len": None,
            },
            "dataset": {**data, "max_seq_len": args.seq_len},
            "checkpointer": {"_component_": "torchtune.utils.FullModelHFCheckpointer", **ckpt},
            "lr_scheduler": None,
            "save_every_n_steps": None,
            "keep_last_n_checkpoints": None,
            "metric_logger": {"_component_": "torchtune.utils.metric_logging.DiskLogger", "log_dir": str(out / "logs")},
            "validation_dataset": None,
            "eval_every_n_steps": None,
            "eval_after_training": None,
        }
    return {
        **common,
        "tokenizer": {
            "_component_": "torchtune.models.llama2.llama2_tokenizer",
            "path": str(assets["tokenizer"]),
            "max_seq_len": args.seq_len,
        },
        "dataset": data,
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", **ckpt},
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": str(out / "logs")},
    }


def worker(impl: str, config_path: Path, result_path: Path) -> None:
    """Run one recipe's setup() + train() and write its per-step times (count / logged rate)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(config_path)
    if impl == "ours":
        sys.path.insert(0, str(REPO_ROOT))
        from recipes.full_finetune_single_device import FullFinetuneRecipeSingleDevice
        from torchtune.utils.metric_logging import read_metrics

        recipe = FullFinetuneRecipeSingleDevice(cfg)
        recipe.setup()
        recipe.train()
        recipe.cleanup()
        rates = [row["tokens_per_second"] for row in read_metrics(Path(cfg.output_dir) / "logs" / "metrics.jsonl")]
        # The same batches again, in the run's order: the order depends only on (seed, epoch).
        from torchtune import config, training

        data = training.build_dataloader(
            cfg.dataset,
            config.instantiate(cfg.tokenizer),
            batch_size=cfg.batch_size,
            shuffle=cfg.shuffle,
            seed=recipe.seed,
        )
        data.sampler.set_epoch(0)
        batches = [b for b, _ in zip(data.dataloader, rates)]
        counts = [data.num_tokens(b) for b in batches]
        tokens = [int(b["tokens"].numel()) for b in batches]
    else:
        import importlib.util
        import sysconfig

        import torchtune

        assert "site-packages" in torchtune.__file__, torchtune.__file__
        # torchtune's recipes/__init__.py refuses imports; load the recipe file itself
        path = Path(sysconfig.get_paths()["purelib"]) / "recipes" / "full_finetune_single_device.py"
        spec = importlib.util.spec_from_file_location("tt_full_finetune_single_device", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        FullFinetuneRecipeSingleDevice = module.FullFinetuneRecipeSingleDevice
        recipe = FullFinetuneRecipeSingleDevice(cfg)
        recipe.setup(cfg)
        recipe.train()
        recipe.cleanup()
        text = "\n".join(p.read_text() for p in sorted((Path(cfg.output_dir) / "logs").glob("*.txt")))
        rates = [float(x) for x in re.findall(r"tokens_per_second_per_gpu:([0-9.eE+-]+)", text)]
        recipe._dataloader.sampler.set_epoch(0)
        batches = [b for b, _ in zip(recipe._dataloader, rates)]
        counts = [int((b["labels"] != -100).sum()) for b in batches]  # torchtune 0.6.1's own ignore index
        tokens = [int(b["tokens"].numel()) for b in batches]
    result_path.write_text(json.dumps({"step_s": [c / r for c, r in zip(counts, rates)], "tokens": tokens}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tt-python", default="/tmp/tt061/bin/python", help="python of the torchtune 0.6.1 venv")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--loss", default="plain", choices=sorted(LOSSES))
    parser.add_argument("--modes", default="bwd,std", help="bwd: optimizer in backward; std: standard step")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--worker", choices=["ours", "torchtune"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, Path(args.config), Path(args.result))

    import yaml  # only the orchestrator needs it (pyyaml comes with omegaconf)

    work = Path(tempfile.mkdtemp(prefix="compare_tt_"))
    assets = prepare(work, args.seq_len, n_examples=args.batch_size * (args.steps + 2))
    pythons = {"ours": sys.executable, "torchtune": args.tt_python}
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    results: Dict[str, List[float]] = {}
    run = 0
    for _ in range(args.repeats):
        for mode in args.modes.split(","):
            for impl in ("ours", "torchtune") if run % 2 == 0 else ("torchtune", "ours"):
                run += 1
                out = work / f"run{run}_{impl}_{mode}"
                out.mkdir()
                cfg_path, res_path = out / "config.yaml", out / "result.json"
                cfg_path.write_text(yaml.safe_dump(config(impl, assets, out, args, in_bwd=(mode == "bwd"))))
                print(f"run {run}: {impl} {mode} ...", file=sys.stderr, flush=True)
                proc = subprocess.run(
                    [pythons[impl], __file__, "--worker", impl, "--config", str(cfg_path), "--result", str(res_path)],
                    cwd=str(work),
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if proc.returncode != 0:
                    raise SystemExit(f"{impl} {mode} failed:\n{proc.stderr[-3000:]}")
                res = json.loads(res_path.read_text())
                assert all(t == args.batch_size * args.seq_len for t in res["tokens"]), res["tokens"]
                results.setdefault(f"{impl}_{mode}", []).extend(res["step_s"][args.skip :])
                print(f"  step times: {[round(s, 2) for s in res['step_s']]}", file=sys.stderr, flush=True)
    import shutil

    shutil.rmtree(work, ignore_errors=True)  # a saved 168M checkpoint per run: gigabytes
    tokens = args.batch_size * args.seq_len
    print(
        f"\nLlama2 {DIMS}, {args.dtype} on {args.device}, batch {args.batch_size} x seq {args.seq_len} (no padding), "
        f"AdamW fused, loss {args.loss}, {args.steps} steps per run (first {args.skip} left out), "
        f"{args.repeats} run(s) each\n"
    )
    print("| mode | recipe | step (s, median) | tokens/s | ours vs torchtune 0.6.1 (speed) |\n|---|---|---|---|---|")
    for mode in args.modes.split(","):
        ours, theirs = statistics.median(results[f"ours_{mode}"]), statistics.median(results[f"torchtune_{mode}"])
        label = "optimizer in backward" if mode == "bwd" else "standard"
        print(f"| {label} | ours | {ours:.3f} | {tokens / ours:.1f} | {theirs / ours:.3f}x |")
        print(f"| {label} | torchtune 0.6.1 | {theirs:.3f} | {tokens / theirs:.1f} | |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "step_s": results}, indent=2))


if __name__ == "__main__":
    main()
