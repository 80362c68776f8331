"""tune estimate-memory on a packed config: a CUDA target counts FlexAttention and its block mask, and no
s x s mask or additive bias on the device (what the dense-mask path there would hold)."""

from torchtune.config import load_config
from torchtune.modules import attention_flex
from torchtune.training.estimate._memory_estimator import estimate_recipe_memory

OVERRIDES = ["device=cuda", "dtype=bf16", "dataset.packed=True", "optimizer._component_=torch.optim.AdamW"]


def test_packed_config_on_cuda_is_estimated_through_flex_attention(monkeypatch):
    batch, seq = 2, 256
    cfg = load_config("llama2/tiny_full", [*OVERRIDES, "~optimizer.weight_decay"])
    flex = estimate_recipe_memory(cfg, seq_len=seq, batch_size=batch)
    monkeypatch.setattr(attention_flex, "uses_flex_attention", lambda device, model: False)
    dense = estimate_recipe_memory(cfg, seq_len=seq, batch_size=batch)
    assert "FlexAttention" in flex.attention and "memory-efficient" in dense.attention
    # FlexAttention saves what flash attention saves (q, k, v, the output, an fp32 log-sum-exp) and its block
    # mask is a few hundred bytes a row: no more than the dense path, which also saves an additive bias
    assert flex.peak_bytes <= dense.peak_bytes, (dense.peak_bytes, flex.peak_bytes)
