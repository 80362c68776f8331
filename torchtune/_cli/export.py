"""``tune export CHECKPOINT_DIR --output-dir DIR``: a checkpoint folder of a run -> a Hugging Face folder.

The logic is ``torchtune.training.export_hf_folder`` (``training/_hf_export.py``); this module is its
command line, cheap to import (no torch) so that ``tune --help`` answers at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# Kept here (not imported from training) so that building the parser imports no torch.
DTYPES = ("bf16", "fp16", "fp32")
DEFAULT_MAX_SHARD_SIZE = "5GB"

DESCRIPTION = """\
Turn a checkpoint folder a recipe wrote (step_N or epoch_N, of full_finetune_single_device or
full_finetune_distributed) into a Hugging Face model folder that transformers and vLLM load:
safetensors (several files with model.safetensors.index.json above --max-shard-size), config.json
with the right architectures and torch_dtype, generation_config.json and the tokenizer files of the
run's input folder, and a manifest.json of checksums.

Every file read is checked against the checkpoint's manifest.json first. The output folder is written
as .tmp-<name>-<pid> beside it and renamed into place once complete; an existing one is replaced only
with --overwrite.

Memory: the weights are read, converted and written one tensor at a time (the sharded state of a
distributed step_N is read on this one process, without torchrun or a GPU), so host RAM is about
twice the largest tensor (three times with --dtype), not the model: about 9 GB for Llama 3 70B in
fp32, whose largest tensor is the 4.2 GB embedding (estimated; docs/distributed.md has the measured
ratio). Disk: the exported weights (2 bytes per parameter in bf16)."""

EPILOG = """\
examples:
  tune export /tmp/torchtune/llama2_7B/epoch_0 --output-dir ./llama2-7b-finetuned
  tune export /tmp/torchtune/llama3_1_8B_distributed/step_1000 --output-dir ./llama3-8b-step1000 \\
      --base-model-dir /tmp/Meta-Llama-3.1-8B-Instruct --dtype bf16

A distributed step_N holds torchtune-named shards only: --base-model-dir is the folder the run started
from (its checkpointer.checkpoint_dir), whose config.json and tokenizer go into the export. A Meta-format
(consolidated.00.pth) folder needs it too, pointing at the same model's Hugging Face folder. Folders in
Hugging Face format carry their own. To score a checkpoint, tune run eleuther_eval reads step_N and
epoch_N folders directly (checkpointer.checkpoint_dir=...): no export is needed for that."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune export``."""
    parser = subparsers.add_parser(
        "export",
        allow_abbrev=False,
        help="turn a step_N / epoch_N checkpoint into a Hugging Face folder",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", type=Path, help="a step_N or epoch_N folder")
    parser.add_argument("--output-dir", required=True, type=Path, help="the Hugging Face folder to create")
    parser.add_argument(
        "--base-model-dir",
        type=Path,
        default=None,
        help="the folder the run started from (checkpointer.checkpoint_dir): needed for a distributed step_N "
        "and for Meta-format folders, which have no config.json or tokenizer files",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="cast the floating-point weights to this dtype (default: as saved, i.e. the run's dtype)",
    )
    parser.add_argument(
        "--max-shard-size",
        default=DEFAULT_MAX_SHARD_SIZE,
        metavar="SIZE",
        help=f"largest safetensors file, e.g. 5GB or 500MB (default: {DEFAULT_MAX_SHARD_SIZE}, as huggingface_hub)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --output-dir if it exists")
    parser.set_defaults(func=export_command)
    return parser


def export_command(args: argparse.Namespace) -> int:
    """Handler of ``tune export``."""
    import logging

    from torchtune.training._hf_export import export_hf_folder

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    folder = export_hf_folder(
        args.checkpoint_dir,
        args.output_dir,
        base_model_dir=args.base_model_dir,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
        overwrite=args.overwrite,
    )
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    print(
        f"Exported {args.checkpoint_dir} to {folder} ({len(files)} safetensors file{'s' if len(files) > 1 else ''}). "
        f"Load it with AutoModelForCausalLM.from_pretrained('{folder}') or `vllm serve {folder}`."
    )
    return 0
