"""Our recipe against torchtune 0.6.1's full_finetune_single_device, side by side in one run.

    python3 -m venv /tmp/tt061
    /tmp/tt061/bin/pip install torch==2.13.0 torchtune==0.6.1 torchao==0.11.0   # torchao 0.18 lacks nf4tensor
    .venv/bin/python benchmarks/compare_torchtune.py --tt-python /tmp/tt061/bin/python --scenario alpaca

Two scenarios, on the same random-weight Hugging Face checkpoint of one Llama2 model (``--size``), one
SentencePiece tokenizer and one Alpaca-format JSON file, each recipe running its own ``setup()`` and
``train()`` in its own process and venv:

- ``identical``: the same work for both. Every example is longer than ``--seq-len``, so each is cut
  to exactly that length (``batch x seq`` tokens per step, no padding), every token is trained on
  (``train_on_input: True``), no packing, no compile, each recipe's plain cross-entropy, fused AdamW
  in backward for both, logging every step (ours as llama2/tiny_full: with memory stats).
- ``alpaca``: Alpaca-like instruction data (lengths drawn like the Alpaca set's: a ~40-token
  template, instructions, inputs in 40% of rows, answers with a long tail), ``train_on_input: False``,
  and each recipe at its best documented settings for it: torchtune with ``dataset.packed: True``,
  ``compile: True`` and its chunked loss; ours with ``dataset.packed: True``, ``compile: True``, its
  chunked loss, ``optimizer_in_bwd_group: layer`` and the label-position selection (always on).
  ``--no-compile`` leaves compile off for both.
- ``lowmem``: the ``7B_full_low_memory`` settings of both (bf16, ``--optimizer``, by default
  bitsandbytes' PagedAdamW, in backward, activation checkpointing and offloading, chunked loss, no
  compile; ours with bf16 stochastic rounding) on Alpaca-like data packed to ``--seq-len``: the
  flagship comparison of ``benchmarks/gpu_proof.py`` (``--size 7b --checkpoint DIR`` on a GPU).
  ``--compile-lowmem`` runs both with ``compile: True``.

``--checkpoint DIR`` uses an existing HF checkpoint of ``--size`` (``benchmarks/gpu_proof.py`` writes a
7B one on the GPU) instead of writing one. ``--tt-pythonpath`` runs torchtune 0.6.1 with the same
Python and that ``PYTHONPATH`` (unpacked wheels; this repository is left off it, since both are
``torchtune``); ``--no-torchtune`` runs our variants only. ``--no-final-save`` makes both recipes'
``save_checkpoint`` a no-op (the end-of-training save is not part of a step; 13.5 GB for 7B).

``--extra NAME:SPEC`` adds a variant of our recipe to the same interleaved runs, to measure what
one of its features costs: SPEC is ``;``-separated config overrides, written and applied as ``tune
run`` overrides (``key=value``, ``+key=value``, ``~key``), and ``env:VAR=value`` environment settings, e.g.
``--extra "no logging:log_every_n_steps=1000"`` or
``--extra "keep freed host memory:env:TUNE_KEEP_FREED_HOST_MEMORY=1"`` (the recipe's opt-in host
allocator setting, docs/recipe.md, ``device``).

A step's time is measured the same way for both: a forward pre-hook on the model records wall and
process CPU time at the start of every step's forward, so step i lasts from its forward to the next
one (loop, data, logging and optimizer included; the epoch-end checkpoint of the last step is not).
"Tokens" are the trained tokens of each step's batch (labels not -100), counted from the recipe's own
batches in the run's order; tokens/s is their sum over the timed steps' total time. The first
``--skip`` steps (compile, warm-up) are left out. Runs alternate between the recipes (ours first in
even repeats), ``--repeats`` times; the table shows the median over repeats of each run's median step,
and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    # the ~168M Llama2 of docs/speed.md
    "168m": dict(vocab_size=32000, num_layers=8, num_heads=16, num_kv_heads=16, embed_dim=1024, max_seq_len=1024),
    # a small one for trying the script out
    "tiny": dict(vocab_size=2048, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=128, max_seq_len=1024),
    # Llama2-7B (torchtune.models.llama2.llama2_7b); the GPU proof's checkpoint, given as --checkpoint
    "7b": dict(vocab_size=32000, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096, max_seq_len=4096),
}
LOSSES = {  # each recipe's own plain and chunked cross-entropy
    "plain": {"ours": "torchtune.modules.loss.CrossEntropyLoss", "torchtune": "torch.nn.CrossEntropyLoss"},
    "chunked": {
        "ours": "torchtune.modules.loss.ChunkedCrossEntropyLoss",
        "torchtune": "torchtune.modules.loss.CEWithChunkedOutputLoss",
    },
}
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request. Instruction: Input: Response: "
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
)


def _words() -> List[str]:
    sys.path.insert(0, str(REPO_ROOT))
    from scripts.make_demo_data import WORDS

    return list(WORDS)


def _text(rng: random.Random, words: List[str], n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(max(1, n)))


def alpaca_like_rows(n: int, seed: int = 0) -> List[Dict[str, str]]:
    """Rows shaped like Alpaca's in Llama2 tokens (one word is one token with the tokenizer below):
    instructions of 5-28 tokens, an input in 40% of rows (4-44 tokens), answers log-normally long
    (median 45 tokens, mean ~64, capped at 400)."""
    rng, words = random.Random(seed), _words()
    rows = []
    for _ in range(n):
        answer = min(400, int(math.exp(rng.gauss(math.log(45), 0.85))))
        rows.append(
            {
                "instruction": _text(rng, words, rng.randint(5, 28)) + ".",
                "input": _text(rng, words, rng.randint(4, 44)) if rng.random() < 0.4 else "",
                "output": _text(rng, words, answer) + ".",
            }
        )
    return rows


def identical_rows(n: int, seq_len: int, seed: int = 0) -> List[Dict[str, str]]:
    """Rows longer than ``seq_len`` tokens, so both recipes cut every one to exactly ``seq_len``."""
    rng, words = random.Random(seed), _words()
    return [{"instruction": _text(rng, words, seq_len), "input": "", "output": _text(rng, words, 8)} for _ in range(n)]


def make_tokenizer(folder: Path, corpus: List[str], vocab_size: int) -> Path:
    """A Llama2-style SentencePiece model of exactly ``vocab_size`` ids: BPE pieces learnt from
    ``corpus`` (each word of it becomes one piece), the rest unused placeholder symbols, so that the
    tokenizer fits the model's embedding table as a real one does."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "corpus.txt"
    text.write_text("\n".join(corpus * 4) + "\n")
    learnt = min(1500, vocab_size // 2)
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        user_defined_symbols=[f"<unused_{i}>" for i in range(vocab_size - learnt)],
    )
    path = folder / "tokenizer.model"
    size = spm.SentencePieceProcessor(model_file=str(path)).vocab_size()
    assert vocab_size - 255 <= size <= vocab_size, f"tokenizer has {size} ids for a {vocab_size}-row model"
    return path


def prepare(work: Path, args: argparse.Namespace) -> Dict[str, Path]:
    """Checkpoint (random weights), tokenizer and data shared by both recipes."""
    sys.path.insert(0, str(REPO_ROOT))
    from tests._helpers.tiny_run import make_hf_checkpoint

    if args.scenario == "lowmem":  # packed: ~100 tokens a row fill (steps + 2) batches of seq_len
        n = max(64, args.batch_size * (args.steps + 2) * args.seq_len // 60)
    else:
        n = args.batch_size * (args.steps + 2) * (8 if args.scenario == "alpaca" else 1)
    rows = identical_rows(n, args.seq_len) if args.scenario == "identical" else alpaca_like_rows(n)
    data = work / "data.json"
    data.write_text(json.dumps(rows))
    corpus = [ALPACA_PROMPT] * 20 + [" ".join(r.values()) for r in rows[:400]]
    tokenizer = make_tokenizer(work / "tok", corpus, SIZES[args.size]["vocab_size"])
    ckpt = Path(args.checkpoint) if args.checkpoint else make_hf_checkpoint(work / "base", seed=0, **SIZES[args.size])
    return {"data": data, "tokenizer": tokenizer, "checkpoint": ckpt}


def config(impl: str, assets: Dict[str, Path], out: Path, args: argparse.Namespace) -> Dict[str, Any]:
    lowmem = args.scenario == "lowmem"
    best = args.scenario in ("alpaca", "lowmem")
    loss = LOSSES["chunked" if best else "plain"][impl]
    optimizer = {"_component_": "torch.optim.AdamW", "lr": 2e-5, "weight_decay": 0.0, "fused": True}
    if lowmem:
        optimizer = {"_component_": args.optimizer, "lr": 2e-5, "weight_decay": 0.0}
    common = {
        "output_dir": str(out),
        "seed": 0,
        "shuffle": True,
        "resume_from_checkpoint": False,
        "model": {"_component_": "torchtune.models.llama2.llama2", **SIZES[args.size]},
        "batch_size": args.batch_size,
        "epochs": 1,
        "max_steps_per_epoch": args.steps,
        "gradient_accumulation_steps": 1,
        "optimizer": optimizer,
        "optimizer_in_bwd": True,
        "loss": {"_component_": loss},
        "clip_grad_norm": None,
        "compile": (args.scenario == "alpaca" and args.compile)
        or (args.scenario == "lowmem" and getattr(args, "compile_lowmem", False)),
        "device": args.device,
        "dtype": args.dtype,
        "enable_activation_checkpointing": lowmem,
        # offloading moves activations from a GPU to the host; torchtune refuses it on a CPU
        "enable_activation_offloading": lowmem and args.device.startswith("cuda"),
        "log_every_n_steps": 1,
        "log_peak_memory_stats": True,  # torchtune 0.6.1 turns it off on CPU itself
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
        "train_on_input": args.scenario != "alpaca",
        "packed": best,
        "split": "train",
    }
    if impl == "ours":
        if best:
            common["loss"]["num_output_chunks"] = 8
        return {
            **common,
            "optimizer_in_bwd_group": "layer" if args.scenario == "alpaca" else "param",
            "optimizer_on_cpu": False,
            "overwrite": False,  # each run has its own folder
            # Rounding is extra work torchtune does not do: on for our best settings only (a no-op in fp32).
            "bf16_stochastic_rounding": best,
            "liger_kernels": False,  # a feature row (--extra) turns it on
            "tokenizer": {
                "_component_": "torchtune.models.llama2.llama2_tokenizer",
                "path": str(assets["tokenizer"]),
                "max_seq_len": None,
            },
            # best-fit packs (this library's, torchtune's greedy packing without it); the Alpaca text as it is,
            # as the other peers render it (torchtune's default wraps it in Llama 2's [INST] template)
            "dataset": {
                **data,
                "max_seq_len": args.seq_len,
                "cache_dir": str(out / "hf_cache"),
                "best_fit": best,
                "chat_format": "plain_text",
            },
            "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", **ckpt},
            "lr_scheduler": None,
            "save_every_n_steps": None,
            "keep_last_n_checkpoints": None,
            "metric_logger": [],
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
        "dataset": {**data, "cache_dir": str(out / "hf_cache")},
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", **ckpt},
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": str(out / "logs")},
    }


def _load_recipe(impl: str, cfg: Any, no_final_save: bool = False) -> Any:
    if impl == "ours":
        sys.path.insert(0, str(REPO_ROOT))
        from recipes.full_finetune_single_device import FullFinetuneRecipeSingleDevice

        recipe = FullFinetuneRecipeSingleDevice(cfg)
        recipe.setup()
        if no_final_save:
            recipe.save_checkpoint = lambda *args, **kwargs: None
        return recipe
    import importlib.util
    import sysconfig

    import torchtune

    home = Path(torchtune.__file__).resolve().parents[1]
    assert home != REPO_ROOT, f"{torchtune.__file__} is this repository's, not torchtune 0.6.1"
    # torchtune's recipes/__init__.py refuses imports; load the recipe file itself (beside the package
    # in an unpacked wheel, else in site-packages)
    path = home / "recipes" / "full_finetune_single_device.py"
    if not path.exists():
        path = Path(sysconfig.get_paths()["purelib"]) / "recipes" / "full_finetune_single_device.py"
    spec = importlib.util.spec_from_file_location("tt_full_finetune_single_device", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recipe = module.FullFinetuneRecipeSingleDevice(cfg)
    recipe.setup(cfg)
    if no_final_save:
        recipe.save_checkpoint = lambda *args, **kwargs: None
    return recipe


def worker(impl: str, config_path: Path, result_path: Path, no_final_save: bool = False) -> None:
    """Run one recipe's setup() + train(); write per-step wall/CPU times, trained and padded tokens, and
    PyTorch's peak allocated/reserved device memory of the whole run (GB = 1e9 bytes) on a GPU."""
    import torch
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(config_path)
    recipe = _load_recipe(impl, cfg, no_final_save)
    model = recipe._model
    loader = recipe._data.dataloader if impl == "ours" else recipe._dataloader
    marks: List[tuple] = []
    model.register_forward_pre_hook(lambda module, args: marks.append((time.perf_counter(), time.process_time())))
    recipe.train()
    peaks = {}
    if torch.cuda.is_available() and str(cfg.device).startswith("cuda"):
        torch.cuda.synchronize()
        peaks = {"peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9}
        peaks["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
    recipe.cleanup()
    loader.sampler.set_epoch(0)  # the same batches again, in the run's order (seed, epoch)
    batches = [b for b, _ in zip(loader, range(len(marks)))]
    trained = [int((b["labels"] != -100).sum()) for b in batches]
    positions = [int(b["tokens"].numel()) for b in batches]
    real = [int((b["tokens"] != 0).sum()) for b in batches]  # both pad with id 0 (the Llama2 tokenizer's pad)
    wall = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
    cpu = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
    result_path.write_text(
        json.dumps({"wall_s": wall, "cpu_s": cpu, "trained": trained, "positions": positions, "real": real, **peaks})
    )


def parse_extra(text: str) -> Dict[str, Any]:
    """``NAME:key=value;~key;env:VAR=value;...`` -> ``{"name", "overrides", "env"}`` (see the module docstring).

    The overrides stay ``key=value`` strings for ``torchtune.config.apply_overrides``, the recipe's own
    command-line grammar (YAML-typed values, ``+key=value`` to add a key, errors for unknown keys)."""
    name, sep, spec = text.partition(":")
    if not sep or not name.strip():
        raise SystemExit(f"--extra {text!r}: expected NAME:key=value[;key=value...] (or env:VAR=value items)")
    overrides: List[str] = []
    env: Dict[str, str] = {}
    for item in filter(None, (i.strip() for i in spec.split(";"))):
        if item.startswith("~"):  # removes a key, as on tune's command line
            overrides.append(item)
            continue
        key, eq, value = item.removeprefix("env:").partition("=")
        if not eq or not key.strip():
            raise SystemExit(f"--extra {text!r}: {item!r} is not key=value")
        if item.startswith("env:"):
            env[key.strip()] = value
        else:
            overrides.append(f"{key.strip()}={value.strip()}")
    return {"name": name.strip(), "overrides": overrides, "env": env}


def our_config(cfg: Dict[str, Any], overrides: List[str]) -> Dict[str, Any]:
    """Our recipe's ``cfg`` with an extra variant's overrides applied as ``tune run`` applies them."""
    from omegaconf import OmegaConf

    from torchtune.config import apply_overrides  # ours: the torchtune worker never gets here

    return OmegaConf.to_container(apply_overrides(OmegaConf.create(cfg), overrides))


def _summary(runs: List[Dict[str, Any]], skip: int) -> Dict[str, float]:
    """Per-run medians of the timed steps, then the median over runs; tokens/s over all timed steps."""
    per_run = []
    for r in runs:
        wall, cpu = r["wall_s"][skip:], r["cpu_s"][skip:]
        trained = r["trained"][skip : skip + len(wall)]
        positions = r["positions"][skip : skip + len(wall)]
        per_run.append(
            {
                "wall": statistics.median(wall),
                "cpu": statistics.median(cpu),
                "tok_s": sum(trained) / sum(wall),
                "tok_cpu_s": sum(trained) / sum(cpu),
                "trained": statistics.median(trained),
                "padding": 1 - sum(r["real"][skip : skip + len(wall)]) / sum(positions),
            }
        )
    peaks = {k: max(r[k] for r in runs) for k in ("peak_allocated_gb", "peak_reserved_gb") if k in runs[0]}
    return {k: statistics.median(p[k] for p in per_run) for k in per_run[0]} | peaks | {"runs": per_run}


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tt-python", default="/tmp/tt061/bin/python", help="python of the torchtune 0.6.1 venv")
    parser.add_argument("--tt-pythonpath", default=None, help="run torchtune with this Python and this PYTHONPATH")
    parser.add_argument("--no-torchtune", dest="torchtune", action="store_false", help="our variants only")
    parser.add_argument("--scenario", default="alpaca", choices=["alpaca", "identical", "lowmem"])
    parser.add_argument("--checkpoint", default=None, help="an existing HF checkpoint of --size (else one is written)")
    parser.add_argument("--optimizer", default="bitsandbytes.optim.PagedAdamW", help="the lowmem scenario's")
    parser.add_argument("--no-final-save", action="store_true", help="skip both recipes' end-of-training save")
    parser.add_argument(
        "--keep-going", action="store_true", help="a failed variant other than ours is reported, not fatal"
    )
    parser.add_argument("--size", default="168m", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (compile, warm-up)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="alpaca scenario without compile for both (compiling a 168M model takes CPU-minutes per run)",
    )
    parser.add_argument(
        "--compile-lowmem", action="store_true", help="lowmem scenario with compile=True for both recipes"
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME:SPEC",
        help="a variant of our recipe run beside the two (config overrides and env:VAR=value; see the docstring)",
    )
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--worker", choices=["ours", "torchtune"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, Path(args.config), Path(args.result), args.no_final_save)

    import shutil

    import yaml  # only the orchestrator needs it (pyyaml comes with omegaconf)

    work = Path(tempfile.mkdtemp(prefix="compare_tt_"))
    assets = prepare(work, args)
    pythons = {"ours": sys.executable, "torchtune": sys.executable if args.tt_pythonpath else args.tt_python}
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # one compile cache for every run: the first run of each recipe pays the cold compile
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
    }
    variants = [{"name": "ours", "impl": "ours", "overrides": [], "env": {}}]
    if args.torchtune:
        tt_env = {"PYTHONPATH": args.tt_pythonpath} if args.tt_pythonpath else {}
        variants.append({"name": "torchtune", "impl": "torchtune", "overrides": [], "env": tt_env})
    variants += [{**parse_extra(text), "impl": "ours"} for text in args.extra]
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        raise SystemExit(f"variant names must differ: {names}")
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in names}
    started = time.perf_counter()
    failed: Dict[str, List[str]] = {}
    for repeat in range(args.repeats):
        # each variant takes each place in the order in turn, so machine drift hits them alike
        shift = repeat % len(variants)
        for index, variant in enumerate(variants[shift:] + variants[:shift]):
            name, impl = variant["name"], variant["impl"]
            if name in failed:
                continue
            out = work / f"run{repeat}_{index}"
            out.mkdir()
            cfg_path, res_path = out / "config.yaml", out / "result.json"
            cfg = config(impl, assets, out, args)
            if variant["overrides"]:
                cfg = our_config(cfg, variant["overrides"])
            cfg_path.write_text(yaml.safe_dump(cfg))
            print(f"repeat {repeat + 1}: {name} ...", file=sys.stderr, flush=True)
            command = [pythons[impl], __file__, "--worker", impl, "--config", str(cfg_path), "--result", str(res_path)]
            proc = subprocess.run(
                command + (["--no-final-save"] if args.no_final_save else []),
                cwd=str(work),
                env={**env, **variant["env"]},
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                if not args.keep_going or name == "ours":
                    raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
                failed[name] = proc.stderr.strip().splitlines()[-3:]  # the others still run and compare
                print(f"  {name} failed: {failed[name]}", file=sys.stderr, flush=True)
                continue
            res = json.loads(res_path.read_text())
            if args.scenario == "identical":
                assert all(p == args.batch_size * args.seq_len for p in res["positions"]), res["positions"]
            runs[name].append(res)
            if args.json_out:  # after every run: a long comparison cut short still has its results
                Path(args.json_out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))
            for d in out.glob("epoch_*"):
                shutil.rmtree(d, ignore_errors=True)  # a 168M checkpoint per run: gigabytes
            print(
                f"  step wall {[round(s, 2) for s in res['wall_s']]}\n  step cpu  {[round(s, 2) for s in res['cpu_s']]}"
                f"\n  trained tokens {res['trained']}",
                file=sys.stderr,
                flush=True,
            )
    shutil.rmtree(work, ignore_errors=True)
    summaries = {name: _summary(runs[name], args.skip) for name in names if runs[name]}
    ours, theirs = summaries["ours"], summaries.get("torchtune")
    dims = SIZES[args.size]
    note = " (no compile)" if args.scenario == "alpaca" and not args.compile else ""
    note = " (compile=True for both)" if args.scenario == "lowmem" and args.compile_lowmem else note
    print(
        f"\nScenario {args.scenario}{note}: Llama2 {dims}, {args.dtype} on {args.device}, batch {args.batch_size} x "
        f"seq {args.seq_len}, {args.steps} steps per run (first {args.skip} left out), {args.repeats} interleaved "
        f"run(s) per variant, {time.perf_counter() - started:.0f}s in all\n"
    )
    print(
        "| recipe | step wall (s) | step CPU (s) | trained tokens/step | padding | trained tokens/s (wall) | "
        "trained tokens/s (CPU) | step CPU vs torchtune | peak allocated (GB) | peak reserved (GB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    for name, s in summaries.items():
        label = {"ours": "ours", "torchtune": "torchtune 0.6.1"}.get(name, f"ours, {name}")
        versus = f"{s['cpu'] / theirs['cpu']:.3f}x" if theirs else "-"
        peaks = " | ".join(f"{s[k]:.2f}" if k in s else "-" for k in ("peak_allocated_gb", "peak_reserved_gb"))
        print(
            f"| {label} | {s['wall']:.3f} | {s['cpu']:.3f} | {s['trained']:.0f} | {100 * s['padding']:.1f}% | "
            f"{s['tok_s']:.1f} | {s['tok_cpu_s']:.1f} | {versus} | {peaks} |"
        )
    if theirs:
        print(
            f"\nours / torchtune: tokens/s {ours['tok_s'] / theirs['tok_s']:.3f}x (wall), "
            f"{ours['tok_cpu_s'] / theirs['tok_cpu_s']:.3f}x (CPU time); "
            f"step time {ours['wall'] / theirs['wall']:.3f}x (wall), {ours['cpu'] / theirs['cpu']:.3f}x (CPU)"
        )
    for name, s in summaries.items():
        per = s["runs"]
        print(
            f"  {name} per run: "
            + ", ".join(f"{p['tok_s']:.1f} tok/s ({p['wall']:.2f}s, {p['cpu']:.2f}s CPU)" for p in per)
        )
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"args": vars(args), "runs": runs, "summaries": summaries, "failed": failed}, indent=2)
        )


if __name__ == "__main__":
    main()
