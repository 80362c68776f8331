"""Optimizer steps beyond torch's: optimizer in backward (per parameter or per layer), bf16 stochastic rounding,
bitsandbytes and torchao steps without their per-parameter syncs, low-rank optimizers, and the CPU optimizer
worker of FSDP2 CPU offload. Recipes reach them through ``torchtune.training``."""
