"""The model fingerprint a recipe state carries: what a resume compares before loading any optimizer state."""

import hashlib

from torchtune.models.llama2 import llama2
from torchtune.models.qwen2_5 import qwen2_5
from torchtune.training import model_fingerprint

TINY = dict(vocab_size=64, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16, intermediate_dim=32, max_seq_len=32)


def _shapes_only(model) -> str:
    shapes = sorted((n, tuple(p.shape)) for n, p in model.named_parameters())
    return hashlib.sha256(repr(shapes).encode()).hexdigest()[:16]


def test_llama_fingerprint_is_unchanged_so_its_older_checkpoints_still_resume():
    model = llama2(**TINY)
    assert model_fingerprint(model) == _shapes_only(model)


def test_a_rope_layout_change_alone_changes_the_fingerprint():
    """Qwen's RoPE now pairs channel i with i + dim/2 (Hugging Face's layout): same parameter names and shapes as
    before, other numbers. A step checkpoint saved with the interleaved layout must be refused, not resumed."""
    model = qwen2_5(**TINY)
    halves = model_fingerprint(model)
    for module in model.modules():
        if hasattr(module, "interleaved"):
            module.interleaved = True
    assert model_fingerprint(model) == _shapes_only(model) != halves
