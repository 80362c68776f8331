"""The checkpointers as torchtune 0.6.1 calls them: its constructor arguments, file names, keys and helpers."""

import json

import pytest
import torch
from safetensors.torch import load_file

from torchtune import training
from torchtune._errors import TuneError
from torchtune.models.llama2 import llama2
from torchtune.models.llama2._convert_weights import tune_to_hf
from torchtune.training.checkpointing import (
    ADAPTER_KEY,
    MODEL_KEY,
    FormattedCheckpointFiles,
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    FullModelTorchTuneCheckpointer,
)
from torchtune.training.checkpointing._utils import check_outdir_not_in_ckptdir, get_path, safe_torch_load

DIM, HEADS, KV_HEADS = 32, 4, 2


def _model(seed=0, num_layers=2):
    torch.manual_seed(seed)
    return llama2(
        vocab_size=64, num_layers=num_layers, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, max_seq_len=32
    )


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def hf_pt_shards(tmp_path):
    """A Llama folder as torchtune's tests write one: HF names in two torch.save files, a minimal config.json."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    hf = tune_to_hf(_model().state_dict(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM)
    first = {k: v for k, v in hf.items() if ".layers.1." not in k}
    torch.save(first, folder / "shard_b.pt")  # sorted after shard_a: it becomes the second output file
    torch.save({k: v for k, v in hf.items() if k not in first}, folder / "shard_a.pt")
    (folder / "config.json").write_text(
        json.dumps({"hidden_size": DIM, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS})
    )
    (folder / "README.md").write_text("side file")
    return folder, hf


def test_hf_shards_are_numbered_in_sorted_order_with_an_index(tmp_path, hf_pt_shards):
    folder, hf = hf_pt_shards
    ckpt = FullModelHFCheckpointer(folder, ["shard_b.pt", "shard_a.pt"], "LLAMA2", tmp_path / "out")
    sd = ckpt.load_checkpoint()
    assert _equal(sd[MODEL_KEY], _model().state_dict())
    assert set(ckpt._weight_map) == set(hf)  # torchtune's name for what file each tensor came from
    saved = ckpt.save_checkpoint(sd, epoch=0)
    assert saved == tmp_path / "out" / "epoch_0"
    first, second = (
        load_file(saved / "model-00001-of-00002.safetensors"),
        load_file(saved / "model-00002-of-00002.safetensors"),
    )
    assert all(".layers.1." in k for k in first) and not any(".layers.1." in k for k in second)
    index = json.loads((saved / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(hf) and index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in hf.values()
    )
    assert (saved / "README.md").read_text() == "side file"  # the input folder's other files come along
    assert (saved / "manifest.json").is_file()  # written atomically, as every save
    # the saved folder is read back under the names its save wrote, whatever checkpoint_files says
    again = FullModelHFCheckpointer(saved, ["shard_b.pt", "shard_a.pt"], "LLAMA2", tmp_path / "o2").load_checkpoint()
    assert _equal(again[MODEL_KEY], sd[MODEL_KEY])


def test_save_checkpoint_takes_torchtunes_and_this_librarys_arguments(tmp_path, hf_pt_shards):
    folder, _ = hf_pt_shards
    ckpt = FullModelHFCheckpointer(folder, ["shard_a.pt", "shard_b.pt"], "LLAMA2", tmp_path / "out")
    sd = {**ckpt.load_checkpoint(), "optimizer": {"x": torch.ones(2)}, "seed": 3}
    # torchtune: intermediate_checkpoint=True keeps the recipe state (in the epoch folder), False drops it
    assert (ckpt.save_checkpoint(sd, epoch=1, intermediate_checkpoint=True) / "recipe_state.pt").is_file()
    assert not (ckpt.save_checkpoint(sd, 2, False) / "recipe_state.pt").exists()
    # this library: step folders, recipe state whenever given
    step = ckpt.save_checkpoint(sd, epoch=0, step=5, intermediate=True)
    assert step.name == "step_5" and torch.load(step / "recipe_state.pt", weights_only=True)["seed"] == 3
    with pytest.raises(ValueError, match="pass one of them"):
        ckpt.save_checkpoint(sd, epoch=0, intermediate_checkpoint=True, intermediate=True)
    with pytest.raises(ValueError, match="pass step=N"):
        ckpt.save_checkpoint(sd, epoch=0, intermediate=True)


def test_adapter_only_saves_the_adapter_and_the_side_files(tmp_path, hf_pt_shards):
    folder, _ = hf_pt_shards
    ckpt = FullModelHFCheckpointer(folder, ["shard_a.pt", "shard_b.pt"], "LLAMA2", tmp_path / "out")
    sd = ckpt.load_checkpoint()
    with pytest.raises(ValueError, match="Adapter checkpoint not found in state_dict"):
        ckpt.save_checkpoint(sd, epoch=0, adapter_only=True)
    adapter = {"layers.0.attn.q_proj.lora_a.weight": torch.ones(2, DIM)}
    saved = ckpt.save_checkpoint({**sd, ADAPTER_KEY: adapter, "adapter_config": {"r": 2}}, epoch=0, adapter_only=True)
    assert not list(saved.glob("model-*"))
    assert _equal(safe_torch_load(saved / "adapter_model.pt"), adapter)
    assert _equal(safe_torch_load(saved / "adapter_model.safetensors"), adapter)
    assert json.loads((saved / "adapter_config.json").read_text()) == {"r": 2}
    assert (saved / "config.json").is_file()


def test_should_load_recipe_state_resumes_through_the_checkpointer(tmp_path, hf_pt_shards):
    folder, _ = hf_pt_shards
    out = tmp_path / "out"
    ckpt = FullModelHFCheckpointer(folder, ["shard_a.pt", "shard_b.pt"], "LLAMA2", out)
    sd = ckpt.load_checkpoint()
    ckpt.save_checkpoint({**sd, "seed": 7, "epochs_run": 1}, epoch=0, step=4, intermediate=True)
    # torchtune's resume: weights named relative to output_dir; the recipe state found in the latest folder
    resumed = FullModelHFCheckpointer(
        folder, ["step_4/model.safetensors.index.json"], "LLAMA2", out, should_load_recipe_state=True
    )
    state = resumed.load_checkpoint()
    assert _equal(state[MODEL_KEY], sd[MODEL_KEY])
    assert (state["seed"], state[training.EPOCHS_KEY]) == (7, 1)
    with pytest.raises(ValueError, match="recipe_checkpoint file must be provided"):
        FullModelHFCheckpointer(
            folder,
            ["step_4/model.safetensors.index.json"],
            "LLAMA2",
            out,
            recipe_checkpoint="nope.pt",
            should_load_recipe_state=True,
        )


def test_torchtune_format_round_trip(tmp_path):
    folder = tmp_path / "tt"
    folder.mkdir()
    weights = _model(1).state_dict()
    torch.save(weights, folder / "model.pt")
    ckpt = FullModelTorchTuneCheckpointer(folder, ["model.pt"], "GEMMA2", tmp_path / "out")  # nothing converted
    assert _equal(ckpt.load_checkpoint()[MODEL_KEY], weights)
    saved = ckpt.save_checkpoint({MODEL_KEY: weights}, epoch=3)
    assert sorted(p.name for p in saved.iterdir()) == ["manifest.json", "model-00001-of-00001.bin"]
    reread = FullModelTorchTuneCheckpointer(saved, ["model.pt"], "LLAMA2", tmp_path / "o2").load_checkpoint()
    assert _equal(reread[MODEL_KEY], weights)
    with pytest.raises(ValueError, match="single checkpoint file"):
        FullModelTorchTuneCheckpointer(folder, ["model.pt", "other.pt"], "LLAMA2", tmp_path / "out")
    with pytest.raises(TuneError, match="not a model type"):
        FullModelTorchTuneCheckpointer(folder, ["model.pt"], "NOPE", tmp_path / "out")


def test_meta_checkpointer_takes_one_file(tmp_path):
    with pytest.raises(ValueError, match="single checkpoint file"):
        FullModelMetaCheckpointer(tmp_path, ["a.pth", "b.pth"], "LLAMA2", tmp_path / "out")


def test_formatted_checkpoint_files_as_checkpoint_files(tmp_path, hf_pt_shards):
    folder, _ = hf_pt_shards
    (folder / "shard_a.pt").rename(folder / "part_1_of_2.pt")
    (folder / "shard_b.pt").rename(folder / "part_2_of_2.pt")
    files = {"filename_format": "part_{}_of_{}.pt", "max_filename": "2"}
    sd = FullModelHFCheckpointer(folder, files, "LLAMA2", tmp_path / "out").load_checkpoint()
    assert _equal(sd[MODEL_KEY], _model().state_dict())
    assert FormattedCheckpointFiles("m-{}-{}.bin", "003").build_checkpoint_filenames() == [
        "m-001-003.bin",
        "m-002-003.bin",
        "m-003-003.bin",
    ]
    with pytest.raises(ValueError, match="must be a string"):
        FormattedCheckpointFiles.from_dict({"filename_format": "m-{}-{}.bin", "max_filename": 3})


def test_path_helpers_raise_value_errors_that_are_tune_errors(tmp_path):
    with pytest.raises(ValueError, match="Unable to load checkpoint from") as missing:
        safe_torch_load(tmp_path / "missing.pt")
    assert isinstance(missing.value, TuneError)
    with pytest.raises(ValueError, match="No file with name: x.pt"):
        get_path(tmp_path, "x.pt")
    assert check_outdir_not_in_ckptdir(tmp_path / "a", tmp_path / "b")
    with pytest.raises(ValueError, match="cannot be the same as or a subdirectory"):
        check_outdir_not_in_ckptdir(tmp_path, tmp_path / "inside")
