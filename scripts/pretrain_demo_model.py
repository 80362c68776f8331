"""Pretrain the demo's tiny Llama2 base model and write it in Hugging Face format.

The model (Llama2 architecture: 4 layers, width 256, 4 query heads, 2 key/value heads, 1000-token
vocabulary, 256-token context; 3.7 M parameters) is trained from a seeded random init on the plain-text
corpus of ``scripts/make_demo_data.py`` (sentences such as "7 plus 5 is 12." and "apple backwards is
elppa."). It learns the facts but never sees the Alpaca prompt, so the demo's finetune has something
visible to teach: answer in the instruction format and stop.

Output, in ``torchtune/assets/demo/base_model/`` (what ``FullModelHFCheckpointer`` reads):
``config.json`` (a ``transformers`` ``LlamaConfig``), ``model.safetensors`` (bf16, HF parameter names
and q/k layout) and a copy of ``tokenizer.model``.

Deterministic for a given machine and torch version (fixed seeds, one data order); float rounding
may differ between CPUs, so a rerun elsewhere gives a model of the same quality, not the same bytes.

Usage::

    python scripts/pretrain_demo_model.py                 # 5-10 minutes on 2 idle CPU cores
    python scripts/pretrain_demo_model.py --steps 20 --out-dir /tmp/base_model   # a quick try
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_demo_data  # noqa: E402  (a sibling script, not a package)

from torchtune.generation import generate  # noqa: E402
from torchtune.models.llama2 import llama2, tune_to_hf  # noqa: E402
from torchtune.modules.tokenizers import SentencePieceTokenizer  # noqa: E402

BUNDLE = make_demo_data.DEFAULT_OUT_DIR
# The architecture; config.json spells the same numbers in Hugging Face's names.
ARCH = dict(
    vocab_size=1000,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    embed_dim=256,
    max_seq_len=256,
    intermediate_dim=768,
    norm_eps=1e-5,
    rope_base=10_000,
)
SEED = 0


def hf_config(arch: dict) -> dict:
    """``config.json`` for ``arch``, as ``transformers.LlamaConfig`` writes it."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": arch["vocab_size"],
        "hidden_size": arch["embed_dim"],
        "intermediate_size": arch["intermediate_dim"],
        "num_hidden_layers": arch["num_layers"],
        "num_attention_heads": arch["num_heads"],
        "num_key_value_heads": arch["num_kv_heads"],
        "head_dim": arch["embed_dim"] // arch["num_heads"],
        "max_position_embeddings": arch["max_seq_len"],
        "rms_norm_eps": arch["norm_eps"],
        "rope_theta": float(arch["rope_base"]),
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def _init_weights(model: nn.Module) -> None:
    # GPT-2/Llama-style small init; PyTorch's default N(0, 1) embedding makes a tiny model slow to start.
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)


def token_stream(tokenizer: SentencePieceTokenizer, num_documents: int) -> torch.Tensor:
    """The corpus as one long Long tensor: each document is BOS + text + EOS."""
    ids: list[int] = []
    for doc in make_demo_data.pretraining_corpus(num_documents):
        ids.extend(tokenizer.encode(doc, add_bos=True, add_eos=True))
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def pretrain(
    tokenizer: SentencePieceTokenizer, steps: int, batch_size: int, lr: float, num_documents: int
) -> nn.Module:
    """Train a fresh model on ``steps`` batches of contiguous corpus windows; returns it in fp32."""
    torch.manual_seed(SEED)
    model = llama2(**ARCH)
    _init_weights(model)
    seq_len = ARCH["max_seq_len"]
    stream = token_stream(tokenizer, num_documents)
    windows = stream[: (len(stream) - 1) // seq_len * seq_len + 1]
    num_windows = (len(windows) - 1) // seq_len
    print(
        f"corpus: {len(stream)} tokens, {num_windows} windows of {seq_len}; "
        f"training on {steps * batch_size} windows ({steps * batch_size / num_windows:.2f} epochs)"
    )
    order = torch.randperm(num_windows, generator=torch.Generator().manual_seed(SEED))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95)
    )
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        idx = order[torch.arange(step * batch_size, (step + 1) * batch_size) % num_windows]
        batch = torch.stack([windows[i * seq_len : i * seq_len + seq_len + 1] for i in idx.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 10))
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            print(
                f"step {step:4d}  loss {loss.item():.4f}  lr {optimizer.param_groups[0]['lr']:.2e}  "
                f"{time.perf_counter() - start:6.1f}s",
                flush=True,
            )
    return model


def probe(model: nn.Module, tokenizer: SentencePieceTokenizer) -> None:
    """Print greedy completions of corpus-style sentence starts (what the base model knows)."""
    for text in (
        "7 plus 5 is",
        "13 minus 6 is",
        "apple is spelled",
        "tiger backwards is",
        "house in capitals is",
        "the word piano has",
        "in order, 8 2 5 becomes",
    ):
        ids = tokenizer.encode(text, add_bos=True, add_eos=False)
        print(f"  {text!r} -> {tokenizer.decode(generate(model, ids, 16, stop_tokens=(tokenizer.eos_id,)))!r}")


def save_hf(model: nn.Module, out_dir: Path, tokenizer_path: Path) -> None:
    """Write ``config.json``, bf16 ``model.safetensors`` (HF names) and ``tokenizer.model``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    hf_state = tune_to_hf(state, num_heads=ARCH["num_heads"], num_kv_heads=ARCH["num_kv_heads"], dim=ARCH["embed_dim"])
    hf_state = {k: v.contiguous() for k, v in sorted(hf_state.items())}
    save_file(hf_state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config(ARCH), indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(tokenizer_path, out_dir / "tokenizer.model")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=BUNDLE / "base_model")
    parser.add_argument("--tokenizer", type=Path, default=BUNDLE / "tokenizer.model")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--documents", type=int, default=20000, help="corpus documents to generate")
    args = parser.parse_args(argv)

    tokenizer = SentencePieceTokenizer(args.tokenizer)
    if tokenizer.vocab_size != ARCH["vocab_size"]:
        raise SystemExit(
            f"{args.tokenizer} has {tokenizer.vocab_size} pieces; the model expects "
            f"{ARCH['vocab_size']}. Run scripts/train_demo_tokenizer.py first."
        )
    start = time.perf_counter()
    model = pretrain(tokenizer, args.steps, args.batch_size, args.lr, args.documents)
    print(
        f"pretraining took {time.perf_counter() - start:.0f}s ({sum(p.numel() for p in model.parameters())} parameters)"
    )
    model.eval()
    probe(model, tokenizer)
    save_hf(model, args.out_dir, args.tokenizer)
    for path in sorted(args.out_dir.iterdir()):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
