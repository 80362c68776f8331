"""What a torchtune config needs to run on a CPU in seconds: a tiny Hugging Face folder of its family (random
weights written by transformers, tokenizer files in the formats torchtune's tokenizer builders read) and the
command-line overrides that point the config at it -- only the user's paths and the model's sizes.

The data file holds one alpaca example repeated, 128 times (two steps of the largest global batch a config
makes on two processes): whatever order a ``seed: null`` run draws, every batch is the same, so two runs of
the same job give the same losses.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import torch

REPO = Path(__file__).resolve().parents[2]
DEMO_SENTENCEPIECE = REPO / "torchtune" / "assets" / "demo" / "tokenizer.model"  # vocabulary of 1000
DIMS = {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128}
MAX_SEQ_LEN = 128


@dataclass(frozen=True)
class Family:
    """A family's tiny model: torchtune's component builder with its size arguments, the transformers
    config class of the same model, and the tokenizer kind its configs name."""

    builder: str
    hf_class: str
    tokenizer: str  # sentencepiece | tiktoken | bpe_files
    vocab_size: int
    model_args: Dict[str, Any] = field(default_factory=dict)
    hf_args: Dict[str, Any] = field(default_factory=dict)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
FAMILIES = {
    "llama2": Family(
        "torchtune.models.llama2.llama2", "LlamaConfig", "sentencepiece", 1000, {}, {"rms_norm_eps": 1e-5}
    ),
    "mistral": Family(
        "torchtune.models.mistral.mistral",
        "MistralConfig",
        "sentencepiece",
        1000,
        {},
        {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": None},
    ),
    "gemma": Family(
        "torchtune.models.gemma.gemma",
        "GemmaConfig",
        "sentencepiece",
        1000,
        {"head_dim": 16},
        {"head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    ),
    "gemma2": Family(
        "torchtune.models.gemma2.gemma2",
        "Gemma2Config",
        "sentencepiece",
        1000,
        {"head_dim": 16, "sliding_window_size": 64, "query_pre_attn_scalar": 16},
        {
            "head_dim": 16,
            "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": 64,
            "query_pre_attn_scalar": 16,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
        },
    ),
    "phi3": Family(
        "torchtune.models.phi3.phi3",
        "Phi3Config",
        "sentencepiece",
        32064,
        {},
        {"sliding_window": None, "rms_norm_eps": 1e-5},
    ),
    "llama3": Family(
        "torchtune.models.llama3.llama3",
        "LlamaConfig",
        "tiktoken",
        128256,
        {},
        {"rope_theta": 500000.0, "rms_norm_eps": 1e-5},
    ),
    "llama3_1": Family(
        "torchtune.models.llama3_1.llama3_1",
        "LlamaConfig",
        "tiktoken",
        128256,
        {"scale_factor": 32},
        {
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {**_LLAMA3_ROPE, "original_max_position_embeddings": 8192},
        },
    ),
    "llama3_2": Family(
        "torchtune.models.llama3_2.llama3_2",
        "LlamaConfig",
        "tiktoken",
        128256,
        {"scale_factor": 32},
        {
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "rope_scaling": {**_LLAMA3_ROPE, "original_max_position_embeddings": 8192},
        },
    ),
    "qwen2": Family(
        "torchtune.models.qwen2.qwen2",
        "Qwen2Config",
        "bpe_files",
        151936,
        {"tie_word_embeddings": True, "norm_eps": 1e-6},
        {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0},
    ),
    "qwen2_5": Family(
        "torchtune.models.qwen2.qwen2",
        "Qwen2Config",
        "bpe_files",
        151936,
        {"tie_word_embeddings": True, "norm_eps": 1e-6},
        {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0},
    ),
    "phi4": Family(
        "torchtune.models.phi3.phi3",
        "Phi3Config",
        "bpe_files",
        100352,
        {},
        {"sliding_window": None, "rms_norm_eps": 1e-5},
    ),
}


def family_of(config_name: str) -> str:
    return config_name.split("/")[0]


def _write_weights(folder: Path, family: Family) -> None:
    import transformers

    tie = family.model_args.get("tie_word_embeddings", family.hf_args.get("tie_word_embeddings", False))
    config = getattr(transformers, family.hf_class)(
        vocab_size=family.vocab_size,
        hidden_size=DIMS["embed_dim"],
        intermediate_size=DIMS["intermediate_dim"],
        num_hidden_layers=DIMS["num_layers"],
        num_attention_heads=DIMS["num_heads"],
        num_key_value_heads=DIMS["num_kv_heads"],
        max_position_embeddings=MAX_SEQ_LEN,
        **{"tie_word_embeddings": tie, **family.hf_args},
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    model.save_pretrained(folder, safe_serialization=True)


def _write_meta_weights(folder: Path, family: Family) -> None:
    """``original/consolidated.00.pth`` and ``params.json``: the HF weights in Meta's names and layout."""
    from safetensors.torch import load_file

    from torchtune.models.llama2._convert_weights import hf_to_tune, tune_to_meta

    config = json.loads((folder / "config.json").read_text())
    head_dim = DIMS["embed_dim"] // DIMS["num_heads"]
    hf = load_file(str(folder / "model.safetensors"))
    tune = hf_to_tune(
        hf, num_heads=DIMS["num_heads"], num_kv_heads=DIMS["num_kv_heads"], dim=DIMS["embed_dim"], head_dim=head_dim
    )
    (folder / "original").mkdir(exist_ok=True)
    torch.save(tune_to_meta(tune), folder / "original" / "consolidated.00.pth")
    params = {
        "dim": DIMS["embed_dim"],
        "n_layers": DIMS["num_layers"],
        "n_heads": DIMS["num_heads"],
        "n_kv_heads": DIMS["num_kv_heads"],
        "vocab_size": config["vocab_size"],
        "norm_eps": family.hf_args["rms_norm_eps"],
        "rope_theta": family.hf_args["rope_theta"],
    }
    (folder / "original" / "params.json").write_text(json.dumps(params))


def _write_tokenizer(folder: Path, kind: str) -> List[str]:
    """Tokenizer files in ``folder``; returns the path overrides of torchtune's tokenizer node for them."""
    if kind == "sentencepiece":
        shutil.copyfile(DEMO_SENTENCEPIECE, folder / "tokenizer.model")
        return [f"tokenizer.path={folder / 'tokenizer.model'}"]
    if kind == "tiktoken":
        from tests._helpers.llama3_tokenizer import make_llama3_tokenizer_files

        make_llama3_tokenizer_files(folder)
        return [f"tokenizer.path={folder / 'original' / 'tokenizer.model'}"]
    from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder

    tokenizer_dir = make_hf_tokenizer_folder(folder / "hf_tokenizer", "qwen2_5")
    from tokenizers import Tokenizer

    Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).model.save(str(folder))  # vocab.json, merges.txt
    return [
        f"tokenizer.path={folder / 'vocab.json'}",
        f"tokenizer.merges_file={folder / 'merges.txt'}",
        f"tokenizer.vocab_path={folder / 'vocab.json'}",
        f"tokenizer.merges_path={folder / 'merges.txt'}",
    ]


def make_family_folder(root: Path, family_name: str) -> Dict[str, Any]:
    """The tiny folder of ``family_name`` under ``root`` (made once): its path, tokenizer overrides, data file."""
    folder = Path(root) / family_name
    marker = folder / "kit.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    family = FAMILIES[family_name]
    folder.mkdir(parents=True, exist_ok=True)
    _write_weights(folder, family)
    if family.tokenizer == "tiktoken":
        _write_meta_weights(folder, family)  # torchtune's llama3/8B configs read Meta's format
    tokenizer = _write_tokenizer(folder, family.tokenizer)
    data = folder / "alpaca.json"
    example = {"instruction": "Add two and three.", "input": "", "output": "Two plus three is five."}
    data.write_text(json.dumps([example] * 128))
    kit = {"folder": str(folder), "tokenizer": tokenizer, "data": str(data)}
    marker.write_text(json.dumps(kit))
    return kit


def run_overrides(config_name: str, cfg: Any, root: Path, output_dir: Path) -> List[str]:
    """The overrides that run torchtune's ``config_name`` (loaded as ``cfg``) on its family's tiny folder: the
    user's paths (checkpoint, tokenizer, data, outputs), the model's sizes (the family's component builder),
    two steps, and the CPU (``device=cpu``)."""
    from omegaconf import DictConfig

    family = FAMILIES[family_of(config_name)]
    kit = make_family_folder(root, family_of(config_name))
    tokenizer = [o for o in kit["tokenizer"] if o.split("=")[0].split(".")[1] in cfg.tokenizer]
    node = {"_component_": family.builder, "vocab_size": family.vocab_size, "max_seq_len": MAX_SEQ_LEN}
    model = [f"model={json.dumps({**node, **DIMS, **family.model_args})}"]  # the node whole: sizes only
    meta = str(cfg.checkpointer._component_).endswith("FullModelMetaCheckpointer")
    files = ["~checkpointer.checkpoint_files"] if isinstance(cfg.checkpointer.checkpoint_files, DictConfig) else []
    return [
        f"output_dir={output_dir}",
        f"checkpointer.checkpoint_dir={kit['folder']}" + ("/original" if meta else ""),
        *files,
        f"checkpointer.checkpoint_files=[{'consolidated.00.pth' if meta else 'model.safetensors'}]",
        *tokenizer,
        "dataset.source=json",
        f"dataset.data_files={kit['data']}",
        *model,
        "max_steps_per_epoch=2",
        "epochs=1",
        "device=cpu",
    ]
