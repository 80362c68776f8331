"""A tiny Hugging Face folder of each Llama-shaped family, in the sizes of its shipped ``tiny_full`` config:
random weights written by transformers itself, the family's tiny tokenizer files and a chat data file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List

import torch
from omegaconf import OmegaConf

from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder
from torchtune import _recipe_registry as registry

# family -> (transformers config class, config.json values beyond the tiny config's model sizes)
HF_CLASSES = {
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
    "qwen2_5": ("Qwen2Config", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {"sliding_window": 32, "tie_word_embeddings": False}),
    "phi4": ("Phi3Config", {"sliding_window": None, "tie_word_embeddings": False}),
}


def chat_rows(n: int, system: bool) -> List[Dict[str, Any]]:
    words = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle"]
    rows = []
    for i in range(n):
        a, b, w = i % 7 + 1, (3 * i) % 5 + 2, words[i % len(words)]
        messages = [{"role": "system", "content": "You are a helpful assistant."}] if system and i % 3 == 0 else []
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


def make_tiny_family_folder(
    folder: Path, family: str, num_examples: int = 16, dtype: torch.dtype = torch.float32
) -> Path:
    """A Hugging Face folder of ``family`` in the sizes of its shipped ``tiny_full`` config: random weights
    (seed 0) that transformers writes in ``dtype``, the family's tiny tokenizer files and ``chats.jsonl``."""
    import tempfile

    import transformers

    folder = Path(folder)
    m = OmegaConf.load(registry.get_config(f"{family}/tiny_full").path).model
    config_class, extra = HF_CLASSES[family]
    hf_config = getattr(transformers, config_class)(
        vocab_size=m.vocab_size,
        hidden_size=m.embed_dim,
        intermediate_size=m.intermediate_dim,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        max_position_embeddings=m.max_seq_len,
        rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_base,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config).to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = make_hf_tokenizer_folder(Path(tmp) / "tokenizer", family)
        for f in tokenizer_dir.iterdir():
            shutil.copyfile(f, folder / f.name)
    data = folder / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(num_examples, system=family != "mistral")))
    return folder


def make_tiny_family_run(tmp_path: Path, family: str, num_examples: int = 16, **overrides: Any) -> Path:
    """The shipped ``<family>/tiny_full`` config pointed at a folder made here; returns the config path."""
    tmp_path = Path(tmp_path)
    cfg = OmegaConf.load(registry.get_config(f"{family}/tiny_full").path)
    folder = make_tiny_family_folder(tmp_path / f"tiny_{family}", family, num_examples)
    data = folder / "chats.jsonl"
    cfg.output_dir = str(tmp_path / "out")
    cfg.checkpointer.checkpoint_dir = str(folder)
    cfg.tokenizer.path = str(folder / "tokenizer.json")
    cfg.dataset.data_files = str(data)
    cfg.metric_logger = {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": "${output_dir}/logs"}
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    path = tmp_path / "config.yaml"
    OmegaConf.save(cfg, path)
    return path
