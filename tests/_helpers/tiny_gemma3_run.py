"""A tiny Gemma 3 Hugging Face folder (config.json as transformers writes a Gemma3ForCausalLM, weights
from ``gemma3_tiny`` with deterministic values, the tiny Gemma tokenizer) and the shipped
``gemma3/tiny_full`` config pointed at it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from tests._helpers.gemma3_tokenizer import make_gemma3_tokenizer
from tests._helpers.tiny_run import alpaca_examples
from torchtune import _recipe_registry as registry


def make_tiny_gemma3_folder(folder: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """Write a tiny Gemma 3 folder: the shape of ``gemma3_tiny`` with the tokenizer's vocabulary, weights in
    ``dtype``."""
    from safetensors.torch import save_file

    from torchtune.models.gemma3 import gemma3_tiny, tune_to_hf
    from torchtune.modules.transforms.tokenizers._hf_tokenizer import TokenizerJson

    folder = Path(folder)
    vocab = TokenizerJson(make_gemma3_tokenizer(folder)).vocab_size
    torch.manual_seed(seed)
    model = gemma3_tiny(vocab_size=vocab)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # transformers' initialisation (N(0, 0.02)); the norms' offsets small but not zero
            p.normal_(0.0, 0.1 if name.endswith("scale") else 0.02)
    attn = model.layers[0].attn
    hf = tune_to_hf(
        model.state_dict(), num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim
    )
    save_file({k: v.to(dtype).contiguous() for k, v in hf.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": vocab,
        "hidden_size": attn.embed_dim,
        "intermediate_size": model.layers[0].mlp.w1.out_features,
        "num_hidden_layers": len(model.layers),
        "num_attention_heads": attn.num_heads,
        "num_key_value_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim,
        "query_pre_attn_scalar": 24,
        "sliding_window": 16,
        "sliding_window_pattern": 3,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "max_position_embeddings": model.max_seq_len,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def make_tiny_gemma3_run(tmp_path: Path, num_examples: int = 24, **overrides: Any) -> Path:
    """The shipped ``gemma3/tiny_full`` config pointed at a folder, data and output under ``tmp_path``."""
    tmp_path = Path(tmp_path)
    folder = make_tiny_gemma3_folder(tmp_path / "gemma3_tiny")
    data = tmp_path / "data.json"
    data.write_text(json.dumps(alpaca_examples(num_examples)))
    cfg = OmegaConf.load(registry.get_config("gemma3/tiny_full").path)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    settings = {
        "output_dir": str(tmp_path / "out"),
        "tokenizer.path": str(folder / "tokenizer.json"),
        "checkpointer.checkpoint_dir": str(folder),
        "dataset.data_files": str(data),
        "model.vocab_size": vocab,
        "metric_logger": [],
        "log_peak_memory_stats": False,
        **overrides,
    }
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value, merge=False)
    path = tmp_path / "config.yaml"
    OmegaConf.save(cfg, path)
    return path
