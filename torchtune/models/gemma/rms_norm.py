"""Gemma's RMSNorm at torchtune's path; the module is ``torchtune.modules.GemmaRMSNorm``."""

from torchtune.modules.rms_norm import GemmaRMSNorm

__all__ = ["GemmaRMSNorm"]
