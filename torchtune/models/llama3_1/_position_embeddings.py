"""Llama 3.1's scaled RoPE at torchtune's path; the module is ``torchtune.modules.Llama3ScaledRoPE``."""

from torchtune.modules.position_embeddings import Llama3ScaledRoPE

__all__ = ["Llama3ScaledRoPE"]
