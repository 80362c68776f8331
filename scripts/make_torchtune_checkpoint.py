"""Make tests/assets/torchtune_061_checkpoint/ with torchtune 0.6.1's own recipe, and check that a folder this
library wrote loads in torchtune 0.6.1. Runs ONLY in a Python where PyTorch's torchtune 0.6.1 is installed
(never beside this library: same import package), from a folder that is not this repository:

    cd /tmp && /path/to/tt061/bin/python /path/to/repo/scripts/make_torchtune_checkpoint.py /path/to/repo

What it does (all on the CPU, a few seconds):

1. a tiny Llama 2 (1 layer, 16 dims, the demo tokenizer's 1000 tokens) built by torchtune's own builder with
   a fixed seed, written as Llama 2's Hugging Face repositories ship it for torchtune's configs
   (``pytorch_model.bin`` + ``config.json``: the ``.bin`` files that ``--ignore-patterns "*.safetensors"``
   keeps), and an alpaca file of 8 examples;
2. ``tune run full_finetune_single_device`` (torchtune's recipe) for 2 epochs of 2 steps, fp32, torch AdamW:
   torchtune writes ``epoch_0/`` (weights) and ``recipe_state/recipe_state.pt`` (its resume state);
3. copies into the asset folder: ``base/`` (the model trained from), ``epoch_0/`` and ``recipe_state.pt`` as
   torchtune wrote them, the config it ran and ``logits.pt``: torchtune's model with the ``epoch_0`` weights
   (loaded by torchtune's FullModelHFCheckpointer) on fixed tokens, with those tokens.

``--check-ours DIR``: instead, load DIR (an ``epoch_N`` folder this library wrote for the same tiny model,
``tests/torchtune/training/test_torchtune_checkpoint.py`` makes one) with torchtune's FullModelHFCheckpointer
and compare torchtune's logits with ``DIR/logits.pt`` (this library's logits); prints the largest difference.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DIMS = dict(vocab_size=1000, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=64)
INTERMEDIATE = 32
TOKENS = [[1, 306, 626, 263, 124, 29, 450, 2]]


def _torchtune():
    import torchtune

    if not torchtune.__version__.startswith("0.6.1"):
        raise SystemExit(
            f"This script runs in a Python with PyTorch's torchtune 0.6.1 installed (it found {torchtune.__file__}, "
            f"version {torchtune.__version__}). Run it from a folder outside this repository."
        )
    return torchtune


def _model():
    from torchtune.models.llama2 import llama2

    return llama2(**DIMS, intermediate_dim=INTERMEDIATE)


def _hf_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": DIMS["embed_dim"],
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": DIMS["num_heads"],
        "num_key_value_heads": DIMS["num_kv_heads"],
        "num_hidden_layers": DIMS["num_layers"],
        "max_position_embeddings": DIMS["max_seq_len"],
        "vocab_size": DIMS["vocab_size"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _config(base: Path, tokenizer: Path, data: Path, out: Path) -> str:
    model = {"_component_": "torchtune.models.llama2.llama2", **DIMS, "intermediate_dim": INTERMEDIATE}
    cfg = {
        "output_dir": str(out),
        "tokenizer": {
            "_component_": "torchtune.models.llama2.llama2_tokenizer",
            "path": str(tokenizer),
            "max_seq_len": 64,
        },
        "dataset": {"_component_": "torchtune.datasets.alpaca_dataset", "source": "json", "data_files": str(data)},
        "seed": 1234,
        "shuffle": True,
        "model": model,
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(base),
            "checkpoint_files": ["pytorch_model.bin"],
            "recipe_checkpoint": None,
            "output_dir": str(out),
            "model_type": "LLAMA2",
        },
        "resume_from_checkpoint": False,
        "batch_size": 2,
        "epochs": 2,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-3, "fused": False},
        "optimizer_in_bwd": False,
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "max_steps_per_epoch": 2,
        "gradient_accumulation_steps": 1,
        "clip_grad_norm": None,
        "compile": False,
        "device": "cpu",
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "dtype": "fp32",
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": str(out / "logs")},
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
    }
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False)


def _logits(folder: Path, files: list) -> "torch.Tensor":  # noqa: F821
    import torch

    from torchtune.training import FullModelHFCheckpointer

    checkpointer = FullModelHFCheckpointer(
        checkpoint_dir=str(folder), checkpoint_files=files, model_type="LLAMA2", output_dir=tempfile.mkdtemp()
    )
    model = _model()
    model.load_state_dict(checkpointer.load_checkpoint()["model"])
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(TOKENS)).float()


def make(repo: Path) -> None:
    import torch

    from torchtune.models.convert_weights import tune_to_hf

    asset = repo / "tests" / "assets" / "torchtune_061_checkpoint"
    tokenizer = repo / "torchtune" / "assets" / "demo" / "tokenizer.model"
    examples = json.loads((repo / "torchtune" / "assets" / "demo" / "train.json").read_text())[:8]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        base.mkdir()
        torch.manual_seed(0)
        model = _model()
        hf = tune_to_hf(model.state_dict(), num_heads=DIMS["num_heads"], num_kv_heads=DIMS["num_kv_heads"], dim=16)
        torch.save({k: v.contiguous() for k, v in hf.items()}, base / "pytorch_model.bin")
        (base / "config.json").write_text(json.dumps(_hf_config(), indent=2))
        data = tmp / "train.json"
        data.write_text(json.dumps(examples))
        out = tmp / "out"
        config = tmp / "config.yaml"
        config.write_text(_config(base, tokenizer, data, out))
        tune = Path(sys.executable).parent / "tune"
        subprocess.run([str(tune), "run", "full_finetune_single_device", "--config", str(config)], check=True, cwd=tmp)
        if asset.exists():
            shutil.rmtree(asset)
        asset.mkdir(parents=True)
        shutil.copytree(base, asset / "base")
        shutil.copytree(out / "epoch_0", asset / "epoch_0")
        shutil.copyfile(out / "recipe_state" / "recipe_state.pt", asset / "recipe_state.pt")
        shutil.copyfile(out / "logs" / sorted(p.name for p in (out / "logs").iterdir())[0], asset / "log.txt")
        text = config.read_text().replace(str(tmp), "TMP").replace(str(repo), "REPO")
        (asset / "config.yaml").write_text(text)
        files = sorted(p.name for p in (asset / "epoch_0").iterdir() if p.suffix in (".bin", ".safetensors"))
        logits = _logits(asset / "epoch_0", files)
        torch.save({"tokens": torch.tensor(TOKENS), "logits": logits, "files": files}, asset / "logits.pt")
    print(f"wrote {asset}: " + ", ".join(sorted(str(p.relative_to(asset)) for p in asset.rglob("*") if p.is_file())))


def check_ours(folder: Path) -> None:
    import torch

    files = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".safetensors"))
    ours = torch.load(folder / "logits.pt", weights_only=True)
    theirs = _logits(folder, files)
    diff = (theirs - ours["logits"]).abs().max().item()
    print(f"torchtune 0.6.1 loaded {folder} ({', '.join(files)}): largest logit difference to ours {diff:.3g}")
    if diff > 1e-5:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, help="this repository's root")
    parser.add_argument("--check-ours", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    _torchtune()
    if args.check_ours is not None:
        check_ours(args.check_ours)
    else:
        make(args.repo.resolve())
