"""A tiny Llama 3.2-shaped run: a Hugging Face folder of a tied, llama3-RoPE model with deterministic
weights (config.json as the hub writes it), a Llama 3 tokenizer, a chat file, and a recipe config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List

import torch
from omegaconf import OmegaConf

from tests._helpers.tiny_run import base_config

# Llama 3.2's structure at toy size: grouped-query heads, tied embeddings, RoPE scaled by 32 around a
# 32-token "original context", so the scaling acts on these short sequences too.
TINY_LLAMA3_DIMS = dict(
    num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=128, intermediate_dim=64, old_context_len=32
)


def chat_examples(n: int) -> List[Dict[str, Any]]:
    """Deterministic conversations in OpenAI style, some with a system message and two turns."""
    words = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle"]
    rows = []
    for i in range(n):
        a, b, w = i % 7 + 1, (3 * i) % 5 + 2, words[i % len(words)]
        messages = [{"role": "system", "content": "You are a helpful assistant."}] if i % 3 == 0 else []
        messages += [
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
        ]
        if i % 2:
            messages += [
                {"role": "user", "content": f"Reverse the word {w}."},
                {"role": "assistant", "content": w[::-1]},
            ]
        rows.append({"messages": messages})
    return rows


def make_llama3_hf_checkpoint(folder: Path, vocab_size: int, seed: int = 0, **dims: Any) -> Path:
    """Write a tiny tied Llama 3.2 in Hugging Face format, config.json with rope_theta + rope_scaling."""
    from safetensors.torch import save_file

    from torchtune.models.llama2._convert_weights import tune_to_hf
    from torchtune.models.llama3_2 import llama3_2

    d = {**TINY_LLAMA3_DIMS, **dims}
    torch.manual_seed(seed)
    model = llama3_2(vocab_size=vocab_size, scale_factor=32, **d)
    with torch.no_grad():
        # transformers' initialisation: with nn.Embedding's N(0, 1) the tied output would start with
        # logits of a few hundred.
        for name, p in model.named_parameters():
            if not name.endswith("scale"):
                p.normal_(0.0, 0.02)
    hf = tune_to_hf(model.state_dict(), num_heads=d["num_heads"], num_kv_heads=d["num_kv_heads"], dim=d["embed_dim"])
    assert "lm_head.weight" not in hf
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in hf.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d["embed_dim"],
        "intermediate_size": d["intermediate_dim"],
        "num_attention_heads": d["num_heads"],
        "num_key_value_heads": d["num_kv_heads"],
        "num_hidden_layers": d["num_layers"],
        "max_position_embeddings": d["max_seq_len"],
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": d["old_context_len"],
            "rope_type": "llama3",
        },
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def make_tiny_llama3_run(tmp_path: Path, tokenizer_dir: Path, num_examples: int = 24, **overrides: Any) -> Path:
    """Checkpoint (with the tokenizer files beside it, as on the hub), chat data and a config under
    ``tmp_path``; returns the config path. ``overrides`` are dotted keys set on the config."""
    from torchtune.models.llama3 import llama3_tokenizer

    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in chat_examples(num_examples)))
    tokenizer_file = tokenizer_dir / "original" / "tokenizer.model"
    # the tiny vocabulary's special tokens follow its ranks: torchtune's special_tokens_path names them
    vocab = llama3_tokenizer(str(tokenizer_file), special_tokens_path=str(tokenizer_dir / "tokenizer.json")).vocab_size
    ckpt = make_llama3_hf_checkpoint(tmp_path / "base", vocab_size=vocab)
    (ckpt / "original").mkdir()
    shutil.copyfile(tokenizer_file, ckpt / "original" / "tokenizer.model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, ckpt / name)
    cfg = OmegaConf.create(base_config(tmp_path, ckpt, ckpt / "original" / "tokenizer.model", data, vocab))
    cfg.tokenizer._component_ = "torchtune.models.llama3.llama3_tokenizer"
    cfg.tokenizer.special_tokens_path = str(ckpt / "tokenizer.json")
    cfg.dataset = {
        "_component_": "torchtune.datasets.chat_dataset",
        "source": "json",
        "data_files": str(data),
        "train_on_input": False,
        "max_seq_len": 96,
        "packed": False,
    }
    cfg.model = {"_component_": "torchtune.models.llama3_2.llama3_2", "vocab_size": vocab, **TINY_LLAMA3_DIMS}
    cfg.checkpointer.model_type = "LLAMA3_2"
    cfg.loss = {"_component_": "torchtune.modules.loss.ChunkedCrossEntropyLoss", "num_output_chunks": 4}
    cfg.optimizer.lr = 1e-2  # few answer tokens per batch: a visible drop within 12 steps
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    path = tmp_path / "config.yaml"
    OmegaConf.save(cfg, path)
    return path
