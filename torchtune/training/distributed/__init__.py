"""The distributed recipe's pieces: process group and FSDP2 sharding, launch settings, distributed
checkpoints (torch.distributed.checkpoint), full weights written by rank 0, sharded step folders read on one
process. Imported on first use (``torchtune.training`` loads them lazily)."""
