"""Llama 3's feed-forward width rule: Llama2's (torchtune's ``torchtune.models.llama3._model_utils``)."""

from torchtune.models.llama2._model_utils import scale_hidden_dim_for_mlp

__all__ = ["scale_hidden_dim_for_mlp"]
