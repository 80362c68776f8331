"""config.json names the dtype written, under the key the input uses."""

import torch

from torchtune.utils._checkpointing._hf_side_files import model_config


def test_dtype_written_under_the_inputs_key():
    assert model_config({"torch_dtype": "float16", "a": 1}, torch.bfloat16) == {"torch_dtype": "bfloat16", "a": 1}
    assert model_config({"dtype": "float32"}, torch.bfloat16) == {"dtype": "bfloat16"}  # transformers >= 4.56
    assert model_config({}, torch.float32) == {"torch_dtype": "float32"}
    assert model_config({"torch_dtype": "float16"}, None) == {"torch_dtype": "float16"}  # unknown: unchanged
