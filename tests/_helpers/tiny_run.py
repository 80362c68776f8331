"""Everything a recipe run needs, made small and local: a Hugging Face-format checkpoint of a
tiny Llama2 with deterministic weights, a SentencePiece tokenizer, an Alpaca-style JSON dataset,
and a config that points at them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch
from omegaconf import OmegaConf

from tests._helpers.tokenizer import make_spm_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
TUNE = str(Path(sys.executable).parent / "tune")

# Small enough that a CPU step takes milliseconds; grouped-query so that path is exercised too.
TINY_DIMS = dict(num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=128)


def alpaca_examples(n: int) -> List[Dict[str, str]]:
    """Deterministic instruction examples (half with an input field)."""
    words = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle"]
    rows = []
    for i in range(n):
        a, b = i % 7 + 1, (3 * i) % 5 + 2
        if i % 2:
            rows.append({"instruction": "Add the two numbers.", "input": f"{a} and {b}", "output": f"{a + b}"})
        else:
            w = words[i % len(words)]
            rows.append({"instruction": f"Reverse the word {w}.", "input": "", "output": w[::-1]})
    return rows


def make_hf_checkpoint(folder: Path, vocab_size: int, seed: int = 0, **dims: Any) -> Path:
    """Write a tiny Llama2 in Hugging Face format (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    from torchtune.models.llama2 import llama2
    from torchtune.models.llama2._convert_weights import tune_to_hf

    d = {**TINY_DIMS, **dims}
    torch.manual_seed(seed)
    model = llama2(vocab_size=vocab_size, **d)
    head_dim = d["embed_dim"] // d["num_heads"]
    hf = tune_to_hf(
        model.state_dict(),
        num_heads=d["num_heads"],
        num_kv_heads=d["num_kv_heads"],
        dim=d["embed_dim"],
        head_dim=head_dim,
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in hf.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d["embed_dim"],
        "intermediate_size": model.layers[0].mlp.w1.out_features,
        "num_attention_heads": d["num_heads"],
        "num_key_value_heads": d["num_kv_heads"],
        "num_hidden_layers": d["num_layers"],
        "max_position_embeddings": d["max_seq_len"],
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def make_tiny_run(
    tmp_path: Path, num_examples: int = 24, model_dims: Optional[Dict[str, int]] = None, **overrides: Any
) -> Path:
    """Create checkpoint, tokenizer and data under ``tmp_path`` and return a config path.

    ``model_dims`` change the tiny model's size (checkpoint and config alike); ``overrides`` are
    dotted keys set on the config (e.g. ``optimizer_in_bwd=False``).
    """
    dims = {**TINY_DIMS, **(model_dims or {})}
    tmp_path = Path(tmp_path)
    data = tmp_path / "data.json"
    rows = alpaca_examples(num_examples)
    data.write_text(json.dumps(rows))
    corpus = [f"{r['instruction']} {r['input']} {r['output']}" for r in rows]
    tokenizer = make_spm_tokenizer(
        tmp_path / "tok", None if num_examples == 0 else list(corpus) + _template_lines(), vocab_size=400
    )
    import sentencepiece as spm

    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer)).vocab_size()
    ckpt = make_hf_checkpoint(tmp_path / "base", vocab_size=vocab, **dims)
    (ckpt / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    cfg = OmegaConf.create(base_config(tmp_path, ckpt, tokenizer, data, vocab))
    cfg.model.update(dims)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    path = tmp_path / "config.yaml"
    OmegaConf.save(cfg, path)
    return path


def _template_lines() -> List[str]:
    from tests._helpers.tokenizer import DEFAULT_CORPUS

    return list(DEFAULT_CORPUS)


def base_config(tmp_path: Path, ckpt: Path, tokenizer: Path, data: Path, vocab: int) -> Dict[str, Any]:
    return {
        "output_dir": str(tmp_path / "out"),
        "tokenizer": {
            "_component_": "torchtune.models.llama2.llama2_tokenizer",
            "path": str(tokenizer),
            "max_seq_len": None,
        },
        "dataset": {
            "_component_": "torchtune.datasets.alpaca_dataset",
            "source": "json",
            "data_files": str(data),
            "train_on_input": True,
            "max_seq_len": 96,
            "packed": False,
            # the Alpaca text as it is, as the tiny tokenizer was trained on (without it Llama 2's [INST]
            # template would wrap the prompt: torchtune's default)
            "chat_format": "plain_text",
        },
        "seed": 1234,
        "shuffle": True,
        "model": {"_component_": "torchtune.models.llama2.llama2", "vocab_size": vocab, **TINY_DIMS},
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(ckpt),
            "checkpoint_files": ["model.safetensors"],
            "recipe_checkpoint": None,
            "output_dir": "${output_dir}",
            "model_type": "LLAMA2",
            "verify_checksums": "background",  # as the shipped configs
        },
        "resume_from_checkpoint": False,
        "overwrite": False,
        "batch_size": 4,
        "epochs": 2,
        "max_steps_per_epoch": None,
        "gradient_accumulation_steps": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.01},
        "optimizer_in_bwd": True,
        "optimizer_in_bwd_group": "param",
        "optimizer_on_cpu": False,
        "lr_scheduler": {
            "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
            "num_warmup_steps": 2,
        },
        "loss": {"_component_": "torchtune.modules.loss.CrossEntropyLoss"},
        "clip_grad_norm": None,
        "compile": False,
        "liger_kernels": False,
        "device": "cpu",
        "dtype": "fp32",
        "bf16_stochastic_rounding": True,  # as the bf16 configs; no effect with fp32
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "save_every_n_steps": None,
        "keep_last_n_checkpoints": None,
        "metric_logger": {
            "_component_": "torchtune.training.metric_logging.DiskLogger",
            "log_dir": "${output_dir}/logs",
        },
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
        "validation_dataset": None,
        "eval_every_n_steps": None,
        "eval_after_training": None,
    }


def run_tune(
    args: Sequence[str], *, env: Optional[Dict[str, str]] = None, timeout: float = 300, cwd: Optional[Path] = None
) -> subprocess.CompletedProcess:
    """Run the real ``tune`` console script."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [TUNE, *args], capture_output=True, text=True, env=full_env, timeout=timeout, cwd=str(cwd or REPO_ROOT)
    )


def read_losses(output_dir: Path) -> List[float]:
    from torchtune.training.metric_logging import read_metrics

    return [row["loss"] for row in read_metrics(Path(output_dir) / "logs" / "metrics.jsonl") if "loss" in row]


def build_recipe(config: Any, **overrides: Any):
    """A set-up ``FullFinetuneRecipeSingleDevice`` from a config path or DictConfig plus dotted overrides."""
    from recipes.full_finetune_single_device import FullFinetuneRecipeSingleDevice

    cfg = OmegaConf.load(config) if isinstance(config, (str, Path)) else config.copy()
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    recipe = FullFinetuneRecipeSingleDevice(cfg)
    recipe.setup()
    return recipe


def run_recipe(config: Any, **overrides: Any):
    """Set up, train and clean up a recipe in this process; returns it for inspection."""
    recipe = build_recipe(config, **overrides)
    try:
        recipe.train()
    finally:
        recipe.cleanup()
    return recipe


# The distributed recipe's own keys, set so that it trains exactly what the single-device recipe trains.
DIST_KEYS = {
    "dist_backend": None,
    "fsdp_cpu_offload": False,
    "fsdp_reshard_after_forward": True,
    "fsdp_param_dtype": None,
    "fsdp_reduce_dtype": None,
    "async_checkpoint": False,
}


def distributed_config(single: Path, path: Path) -> Path:
    """The single-device config ``single`` as a full_finetune_distributed config written to ``path``: the
    keys only the single-device recipe reads (eval_after_training settings aside) dropped, DIST_KEYS added,
    its ``batch_size`` made the ``global_batch_size`` (the same batch however many processes run it)."""
    from recipes.full_finetune_distributed import RECIPE_KEYS

    cfg = OmegaConf.load(single)
    for key in [k for k in cfg if k not in RECIPE_KEYS]:
        cfg.pop(key)
    cfg.update(DIST_KEYS)
    # the single-device batch as the global batch, split over the processes (batch_size is per process)
    cfg.global_batch_size, cfg.batch_size = cfg.batch_size, None
    OmegaConf.save(cfg, path)
    return path
