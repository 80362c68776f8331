"""Reading one tensor's rows at a time (``open_weights``), as each rank of a sharded load does: for every
family's layout (q/k permutation with its own head_dim, biases, q/k norms, fused Phi-4 projections, Gemma 3's
multimodal names) every rank's rows equal the same rows of the whole converted state dict, including row
ranges that cut through a head; and a save without any load first puts each tensor into the file it came
from (a resumed run learns the layout from the headers)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.torchtune.models.hf_families.test_hf_parity import CASES, make_hf_folder  # noqa: E402
from torchtune.training import FullModelHFCheckpointer  # noqa: E402
from torchtune.training.distributed._fsdp import _local_rows  # noqa: E402


def _assert_rows_match(reader, full):
    assert reader.shapes == {k: v.shape for k, v in full.items()}
    for key, tensor in full.items():
        # 3 and 5 ranks split 16-, 24- and 32-row heads in the middle of a head
        for world in (1, 3, 5):
            for rank in range(world):
                start, stop = _local_rows(tensor.shape[0], world, rank)
                torch.testing.assert_close(reader.read(key, start, stop), tensor[start:stop], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("case", ["qwen3_untied_bias", "qwen2_5_tied", "mistral_v0_3", "phi4"])
def test_each_ranks_rows_equal_the_converted_tensors(tmp_path, case):
    model_type, config_class, _, extra = CASES[case]
    make_hf_folder(tmp_path / "hf", config_class, extra)
    ckpt = FullModelHFCheckpointer(
        tmp_path / "hf", ["model.safetensors"], model_type=model_type, output_dir=tmp_path / "o"
    )
    full = ckpt.load_checkpoint()["model"]
    _assert_rows_match(ckpt.open_weights(), full)


def test_gemma3_multimodal_rows_equal_the_converted_text_model(tmp_path):
    from tests.torchtune.models.gemma3.test_gemma3_checkpointer import _multimodal

    _multimodal(tmp_path / "hf")
    ckpt = FullModelHFCheckpointer(
        tmp_path / "hf", ["model.safetensors"], model_type="GEMMA3", output_dir=tmp_path / "o"
    )
    full = ckpt.load_checkpoint()["model"]
    assert not any("vision" in k for k in full)
    _assert_rows_match(ckpt.open_weights(), full)


def test_a_save_without_a_load_keeps_the_input_files_and_index(tmp_path):
    _, config_class, _, extra = CASES["qwen2_5_untied"]
    make_hf_folder(tmp_path / "hf", config_class, extra)
    # re-save in several files, as large published folders are
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").save_pretrained(
        tmp_path / "in", max_shard_size="40KB"
    )
    index_name = "model.safetensors.index.json"
    index = json.loads((tmp_path / "in" / index_name).read_text())
    assert len(set(index["weight_map"].values())) > 2
    weights = FullModelHFCheckpointer(tmp_path / "in", index_name, model_type="QWEN2", output_dir=tmp_path / "a")
    state = weights.load_checkpoint()["model"]

    # a resumed run: a fresh checkpointer that never read a weight saves the trained tensors
    fresh = FullModelHFCheckpointer(tmp_path / "in", index_name, model_type="QWEN2", output_dir=tmp_path / "b")
    folder = fresh.save_checkpoint({"model": state}, epoch=0)
    assert json.loads((folder / index_name).read_text())["weight_map"] == index["weight_map"]
