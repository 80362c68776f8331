"""torchtune's ``torchtune.models.convert_weights``: Meta / Hugging Face <-> torchtune names of the Llama-shaped
checkpoints, with torchtune's signatures (the implementation is ``torchtune.models.llama2._convert_weights``)."""

from __future__ import annotations

from typing import Dict

from torchtune.models.llama2._convert_weights import _rename, hf_to_tune, meta_to_tune, tune_to_hf, tune_to_meta

__all__ = ["get_mapped_key", "hf_to_tune", "meta_to_tune", "tune_to_hf", "tune_to_meta"]


def get_mapped_key(key: str, mapping_dict: Dict[str, str]) -> str:
    """``key`` renamed by ``mapping_dict``, whose keys may hold ``{}`` for a layer number
    (``"model.layers.{}.mlp.w1.weight"``).

    Raises:
        Exception: ``key`` is in no entry of ``mapping_dict`` (torchtune raises a plain ``Exception`` too).
    """
    new_key = _rename(key, mapping_dict)
    if new_key is None:
        raise Exception(  # noqa: TRY002 - torchtune's type, which its callers catch
            f'Error converting the state dict. Found unexpected key: "{key}". '
            "Please make sure you're loading a checkpoint with the right format."
        )
    return new_key
