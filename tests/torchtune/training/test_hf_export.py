"""`tune export` of single-device checkpoint folders, and each bad input as one message.

The distributed ``step_N`` (sharded state of a real 2-process run) is exported and scored in
tests/recipes/test_full_finetune_distributed.py, which already has such a run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests._helpers.tiny_run import TINY_DIMS, make_tiny_run, run_recipe
from torchtune._cli.tune import main as tune_main


def _export(capsys, *argv) -> tuple[int, str]:
    """``tune export`` in this process; (exit status, stderr with its line breaks joined)."""
    rc = tune_main(["export", *map(str, argv)])
    return rc, " ".join(capsys.readouterr().err.split())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A single-device run of 3 steps with a step checkpoint at step 2 and the final epoch_0."""
    root = tmp_path_factory.mktemp("single")
    config = make_tiny_run(root, epochs=1, max_steps_per_epoch=3, save_every_n_steps=2)
    run_recipe(config, output_dir=str(root / "out"))
    return root / "out"


def _logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(tokens).logits


def test_single_device_step_exports_to_a_folder_transformers_loads_with_the_models_logits(run, tmp_path, capsys):
    from torchtune.models.llama2 import llama2
    from torchtune.training import FullModelHFCheckpointer

    out = tmp_path / "hf"
    rc, err = _export(capsys, run / "step_2", "--output-dir", out, "--max-shard-size", "40KB")
    assert rc == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    for name in ("tokenizer.model", "tokenizer_config.json", "generation_config.json", "manifest.json"):
        assert (out / name).is_file(), name
    assert not (out / "recipe_state.pt").exists() and not list(tmp_path.glob(".tmp-*"))
    # the run's model at step 2, as our checkpointer reads it into our llama2
    step = FullModelHFCheckpointer(run / "step_2", ["model.safetensors.index.json"], output_dir=tmp_path / "unused")
    ours = llama2(vocab_size=config["vocab_size"], **TINY_DIMS).eval()
    ours.load_state_dict(step.load_checkpoint()["model"])
    tokens = torch.randint(0, config["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(_logits(out, tokens), ours(tokens), atol=1e-5, rtol=0)


def test_meta_format_step_exports_with_the_base_models_config(run, tmp_path, capsys):
    """A Meta-format step folder (consolidated.00.pth, as FullModelMetaCheckpointer writes it) needs
    --base-model-dir for config.json; the export gives the logits of the weights it holds."""
    from torchtune.models.llama2 import llama2
    from torchtune.models.llama2._convert_weights import tune_to_meta
    from torchtune.training import FullModelHFCheckpointer
    from torchtune.utils._checkpointing._manifest import build_manifest

    base = run.parent / "base"
    weights = FullModelHFCheckpointer(
        run / "step_2", ["model.safetensors.index.json"], output_dir=tmp_path / "x"
    ).load_checkpoint()
    folder = tmp_path / "meta" / "step_2"
    folder.mkdir(parents=True)
    torch.save(tune_to_meta(weights["model"]), folder / "consolidated.00.pth")
    (folder / "manifest.json").write_text(json.dumps(build_manifest(folder, step=2, epoch=0, intermediate=True)))
    rc, err = _export(capsys, folder, "--output-dir", tmp_path / "hf")
    assert rc == 2 and "Meta-format checkpoint" in err and "--base-model-dir" in err, err
    rc, err = _export(capsys, folder, "--output-dir", tmp_path / "hf", "--base-model-dir", base)
    assert rc == 0, err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = llama2(vocab_size=config["vocab_size"], **TINY_DIMS).eval()
    ours.load_state_dict(weights["model"])
    tokens = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(_logits(tmp_path / "hf", tokens), ours(tokens), atol=1e-5, rtol=0)


def test_dtype_cast_and_final_epoch_folder(run, tmp_path, capsys):
    out = tmp_path / "bf16"
    rc, err = _export(capsys, run / "epoch_0", "--output-dir", out, "--dtype", "bf16")
    assert rc == 0, err
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]  # under 5GB: one file, no index
    assert not (out / "model.safetensors.index.json").exists()
    tokens = torch.arange(10).unsqueeze(0)
    full = _logits(run / "epoch_0", tokens)
    assert _logits(out, tokens).dtype == torch.bfloat16
    torch.testing.assert_close(_logits(out, tokens).float(), full, atol=0.1, rtol=0.05)


def test_existing_output_is_kept_unless_overwrite(run, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    (tmp_path / ".tmp-hf-12345").mkdir()  # what a killed export to the same folder left
    (tmp_path / ".tmp-other-12345").mkdir()  # not ours: left alone
    rc, err = _export(capsys, run / "epoch_0", "--output-dir", out)
    assert rc == 1 and "already exists" in err and "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    rc, err = _export(capsys, run / "epoch_0", "--output-dir", out, "--overwrite")
    assert rc == 0, err
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-other-12345", "hf"]  # its leftovers removed


def _damaged_copy(run: Path, tmp_path: Path) -> Path:
    folder = Path(shutil.copytree(run / "step_2", tmp_path / "out" / "step_2"))
    data = bytearray((folder / "model-00001-of-00001.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "model-00001-of-00001.safetensors").write_bytes(bytes(data))
    return folder


@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        ("not_a_checkpoint", ["has no manifest.json", "not a checkpoint folder this library wrote"]),
        ("output_dir_of_a_run", ["is a run's output folder", "e.g. the latest", "epoch_0"]),
        ("missing", ["does not exist", "Pass a step_N or epoch_N folder"]),
        ("damaged", ["model-00001-of-00001.safetensors does not match the checksum", "cannot be read"]),
        ("output_inside_checkpoint", ["overlaps the folder it is made from"]),
        ("bad_shard_size", ["--max-shard-size 5 parsecs"]),
    ],
)
def test_bad_inputs_get_one_message_and_write_nothing(run, tmp_path, capsys, case, fragments):
    folder, out, extra = run / "step_2", tmp_path / "hf", []
    if case == "not_a_checkpoint":
        folder = tmp_path / "notes"
        folder.mkdir()
        (folder / "readme.txt").write_text("hello")
    elif case == "output_dir_of_a_run":
        folder = run
    elif case == "missing":
        folder = tmp_path / "nowhere"
    elif case == "damaged":
        folder = _damaged_copy(run, tmp_path)
    elif case == "output_inside_checkpoint":
        out = run / "step_2" / "hf"
    elif case == "bad_shard_size":
        extra = ["--max-shard-size", "5 parsecs"]
    rc, err = _export(capsys, folder, "--output-dir", out, *extra)
    assert rc != 0
    assert err.count("Error:") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists() and not list(out.parent.glob(".tmp-*"))


@pytest.mark.parametrize("family", ["qwen3", "phi4", "gemma3"])
def test_sharded_state_of_each_converter_family_exports_to_its_base_weights(family, tmp_path, capsys):
    """A step folder of sharded state (torchtune names, saved with torch.distributed.checkpoint as the
    distributed recipe saves it) of a family base folder's own weights exports to exactly those weights:
    Qwen3's q/k norms, Phi-4's fused qkv_proj / gate_up_proj, Gemma 3's names and tied embedding."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from torchtune.models._hf_family import detect_family
    from torchtune.training import FullModelHFCheckpointer
    from torchtune.utils._checkpointing._manifest import build_manifest

    if family == "gemma3":
        from tests._helpers.tiny_gemma3_run import make_tiny_gemma3_folder

        base = make_tiny_gemma3_folder(tmp_path / "base")
    else:
        from tests._helpers.hf_tiny_run import make_tiny_family_run

        make_tiny_family_run(tmp_path, family)
        base = tmp_path / f"tiny_{family}"
    model_type = detect_family(json.loads((base / "config.json").read_text()), base / "config.json").model_type
    checkpointer = FullModelHFCheckpointer(base, ["model.safetensors"], model_type, output_dir=tmp_path / "unused")
    step = tmp_path / "run" / "step_1"
    dcp.save(
        {"model": checkpointer.load_checkpoint()["model"]}, checkpoint_id=str(step / "sharded_state"), no_dist=True
    )
    (step / "manifest.json").write_text(json.dumps(build_manifest(step, step=1, epoch=0, intermediate=True)))
    rc, err = _export(capsys, step, "--output-dir", tmp_path / "hf", "--base-model-dir", base)
    assert rc == 0, err
    exported, original = load_file(tmp_path / "hf" / "model.safetensors"), load_file(base / "model.safetensors")
    tied = json.loads((base / "config.json").read_text()).get("tie_word_embeddings", False)
    assert exported.keys() == original.keys() - ({"lm_head.weight"} if tied else set())
    assert all(torch.equal(exported[k], original[k]) for k in exported)
    assert (
        json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"]
        == json.loads((base / "config.json").read_text())["architectures"]
    )
