"""The committed demo bundle (torchtune/assets/demo): present, small, loadable, reproducible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "torchtune" / "assets" / "demo"
SCRIPTS = REPO / "scripts"
BASE = BUNDLE / "base_model"
# The architecture of recipes/configs/generate.yaml (and of the demo's finetune config).
ARCH = dict(
    vocab_size=1000, num_layers=4, num_heads=4, num_kv_heads=2, embed_dim=256, max_seq_len=256, intermediate_dim=768
)
FILES = [
    "README.md",
    "train.json",
    "heldout.json",
    "tokenizer.model",
    "base_model/config.json",
    "base_model/model.safetensors",
    "base_model/tokenizer.model",
]


def _load_script(name: str):
    sys.path.insert(0, str(SCRIPTS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(SCRIPTS))


def test_bundle_files_exist_and_are_small():
    for name in FILES:
        assert (BUNDLE / name).is_file(), f"missing demo asset {name}"
    total = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    assert total < 12 * 2**20, f"demo bundle is {total / 2**20:.1f} MiB"
    assert (BASE / "tokenizer.model").read_bytes() == (BUNDLE / "tokenizer.model").read_bytes()


def test_data_files_are_alpaca_and_disjoint():
    train = json.loads((BUNDLE / "train.json").read_text())
    heldout = json.loads((BUNDLE / "heldout.json").read_text())
    assert len(train) == 3000 and len(heldout) == 200
    for row in train + heldout:
        assert set(row) == {"instruction", "input", "output"}
        assert all(isinstance(v, str) for v in row.values()) and row["output"]
    keys = lambda rows: {(r["instruction"], r["input"]) for r in rows}  # noqa: E731
    assert len(keys(train)) == len(train) and len(keys(heldout)) == len(heldout)
    assert not keys(train) & keys(heldout)


def test_data_generator_reproduces_committed_files(tmp_path):
    make_demo_data = _load_script("make_demo_data")
    make_demo_data.main(["--out-dir", str(tmp_path)])
    for name in ("train.json", "heldout.json"):
        assert (tmp_path / name).read_bytes() == (BUNDLE / name).read_bytes(), name
    # Answers are right: spot-check every task through its own definition.
    for row in json.loads((tmp_path / "heldout.json").read_text()):
        ins, inp, out = row["instruction"], row["input"], row["output"]
        if ins.startswith("What is"):
            a, b = ins[len("What is ") : -1].split(" plus ")
            assert int(out) == int(a) + int(b)
        elif ins.startswith("Reverse"):
            assert out == inp[::-1]
        elif ins.startswith("Sort the numbers"):
            assert out.split() == sorted(inp.split(), key=int)
    corpus = make_demo_data.pretraining_corpus(50)
    assert corpus == make_demo_data.pretraining_corpus(50)
    assert not any("### " in doc or "\n" in doc for doc in corpus)  # never the instruction format


def test_tokenizer_script_reproduces_committed_tokenizer(tmp_path):
    train_demo_tokenizer = _load_script("train_demo_tokenizer")
    train_demo_tokenizer.train_tokenizer(tmp_path / "tokenizer.model")
    assert (tmp_path / "tokenizer.model").read_bytes() == (BUNDLE / "tokenizer.model").read_bytes()


def test_tokenizer_is_llama2_like():
    from torchtune.models.llama2 import llama2_tokenizer

    tok = llama2_tokenizer(str(BUNDLE / "tokenizer.model"))
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.spm_model.pad_id(), tok.spm_model.unk_id()) == (
        1000,
        1,
        2,
        -1,
        0,
    )
    ids = tok.encode("What is 17 plus 5?")
    assert ids[0] == 1 and ids[-1] == 2
    assert [tok.spm_model.IdToPiece(i) for i in ids[3:6]] == ["▁", "1", "7"]  # one piece per digit
    assert tok.decode(tok.encode("### Response:\nZebra 42")) == "### Response:\nZebra 42"
    assert tok.decode(tok.encode("é∑")) == "é∑"  # byte fallback: nothing is <unk>


def test_base_model_loads_through_the_hf_checkpointer(tmp_path):
    from torchtune.models.llama2 import llama2
    from torchtune.training import FullModelHFCheckpointer

    config = json.loads((BASE / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
        config["vocab_size"],
        config["max_position_embeddings"],
    ) == (256, 4, 4, 2, 768, 1000, 256)
    checkpointer = FullModelHFCheckpointer(
        checkpoint_dir=BASE, checkpoint_files=["model.safetensors"], output_dir=tmp_path
    )
    state = checkpointer.load_checkpoint()["model"]
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    model = llama2(**ARCH)
    model.load_state_dict(state, strict=True)
    n_params = sum(p.numel() for p in model.parameters())
    assert 3_000_000 < n_params < 5_000_000

    # Round trip: what a finetune saves (epoch_0, HF format) loads back to the same tensors.
    saved = checkpointer.save_checkpoint({"model": model.state_dict()}, epoch=0)
    assert (saved / "config.json").is_file() and (saved / "tokenizer.model").is_file()
    again = FullModelHFCheckpointer(
        checkpoint_dir=saved, checkpoint_files=["model.safetensors"], output_dir=tmp_path / "again"
    ).load_checkpoint()["model"]
    assert again.keys() == state.keys()
    for key, tensor in state.items():
        assert torch.equal(again[key], tensor), key


def test_generate_recipe_runs_on_the_bundle(tmp_path):
    tune = Path(sys.executable).with_name("tune")
    result = subprocess.run(
        [
            str(tune),
            "run",
            "generate",
            "--config",
            "generate",
            "max_new_tokens=4",
            f"checkpointer.output_dir={tmp_path}",
            "instruction_template=null",
            "prompt=7 plus 5 is",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("7 plus 5 is")
    assert "tokens in" in result.stderr


def test_generate_recipe_rejects_bad_values(capsys, monkeypatch):
    from recipes.generate import recipe_main

    monkeypatch.chdir(REPO)
    for override, key in (
        ("top_k=0", "top_k"),
        ("temperature=-1", "temperature"),
        ("max_new_tokens=0", "max_new_tokens"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            recipe_main(["--config", "generate", override])
        assert exit_info.value.code == 2
        assert key in capsys.readouterr().err


def test_matches_transformers_llama(tmp_path):
    """The bundle is a real Hugging Face checkpoint: transformers computes the same logits."""
    transformers = pytest.importorskip("transformers")
    from torchtune.models.llama2 import llama2
    from torchtune.training import FullModelHFCheckpointer

    state = FullModelHFCheckpointer(
        checkpoint_dir=BASE, checkpoint_files=["model.safetensors"], output_dir=tmp_path
    ).load_checkpoint()["model"]
    ours = llama2(**ARCH)
    ours.load_state_dict({k: v.float() for k, v in state.items()})
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(BASE), torch_dtype=torch.float32)
    tokens = torch.tensor([[1, 400, 17, 5, 99, 3, 250, 2]])
    with torch.no_grad():
        want = theirs(tokens).logits
        got = ours.eval()(tokens)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_eval_task_script_reproduces_committed_questions(tmp_path):
    """The bundled lm-eval tasks' questions (eval/demo_eval.json): regenerated byte for byte, each with the
    right answer among four distinct choices."""
    make_task = _load_script("make_demo_eval_task")
    make_task.main(["--out", str(tmp_path / "demo_eval.json")])
    committed = BUNDLE / "eval" / "demo_eval.json"
    assert (tmp_path / "demo_eval.json").read_bytes() == committed.read_bytes()
    data = json.loads(committed.read_text())
    assert len(data["test"]) == 40 and len(data["train"]) == 8
    for q in data["test"] + data["train"]:
        assert len(set(q["choices"])) == 4 and q["choices"][q["label"]] == q["output"]
        assert q["prompt"].endswith("### Response:\n")
    assert {q["task"] for q in data["test"]} == set(make_task.TASK_PREFIXES)
