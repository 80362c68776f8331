"""Gemma (1): builders and tokenizer, and the decoder the Gemma generations share (``gemma_decoder``);
Hugging Face folders are read and written by ``torchtune.training.FullModelHFCheckpointer`` through this
family's ``_hf.py`` registration (``checkpointer.model_type: GEMMA``)."""

from torchtune.models.gemma._component_builders import gemma, gemma_decoder, gemma_mlp
from torchtune.models.gemma._model_builders import gemma_2b, gemma_7b
from torchtune.models.gemma._tokenizer import GemmaTokenizer, gemma_tokenizer
from torchtune.models.gemma.gemma_norm_embedding import GemmaNormEmbeddings
from torchtune.models.gemma.rms_norm import GemmaRMSNorm

__all__ = [
    "GemmaTokenizer",
    "GemmaNormEmbeddings",
    "GemmaRMSNorm",
    "gemma",
    "gemma_2b",
    "gemma_7b",
    "gemma_decoder",
    "gemma_mlp",
    "gemma_tokenizer",
]
