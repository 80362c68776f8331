"""config.json names the dtype written, under the key the input uses."""

import torch

from torchtune.training.checkpointing._hf_side_files import model_config


def test_dtype_written_under_the_inputs_key():
    assert model_config({"torch_dtype": "float16", "a": 1}, torch.bfloat16) == {"torch_dtype": "bfloat16", "a": 1}
    assert model_config({"dtype": "float32"}, torch.bfloat16) == {"dtype": "bfloat16"}  # transformers >= 4.56
    assert model_config({}, torch.float32) == {"torch_dtype": "float32"}
    assert model_config({"torch_dtype": "float16"}, None) == {"torch_dtype": "float16"}  # unknown: unchanged


def test_tokenizer_side_files_carried_over(llama3_tokenizer_dir, tmp_path):
    """A Llama 3 folder as transformers writes it: the saved folder loads with AutoTokenizer and encodes,
    and formats chats, exactly as the input folder does; our tokenizer's tiktoken file comes along."""
    import transformers

    from torchtune.training.checkpointing._hf_side_files import write_hf_side_files

    out = tmp_path / "saved"
    out.mkdir()
    write_hf_side_files(llama3_tokenizer_dir, out, config={"model_type": "llama"}, dtype=torch.bfloat16)
    assert (out / "original" / "tokenizer.model").read_bytes() == (
        llama3_tokenizer_dir / "original" / "tokenizer.model"
    ).read_bytes()
    source = transformers.AutoTokenizer.from_pretrained(str(llama3_tokenizer_dir))
    saved = transformers.AutoTokenizer.from_pretrained(str(out))
    assert source.chat_template, "the fixture folder has a chat template"
    for text in ["Hello there, how are you?", "Plain text; with\nnew lines."]:
        assert saved(text)["input_ids"] == source(text)["input_ids"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 plus 5?"}]
    assert saved.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == source.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )


def test_special_tokens_map_uses_transformers_keys(tmp_path):
    """Written from a bare SentencePiece folder (the demo bundle): the keys transformers writes and reads."""
    import json
    import shutil

    from torchtune._assets import asset_path
    from torchtune.training.checkpointing._hf_side_files import write_hf_side_files

    source = tmp_path / "in"
    source.mkdir()
    shutil.copyfile(asset_path("demo/tokenizer.model"), source / "tokenizer.model")
    out = tmp_path / "out"
    out.mkdir()
    write_hf_side_files(source, out, config={}, dtype=torch.float32)
    special = json.loads((out / "special_tokens_map.json").read_text())
    assert set(special) == {"bos_token", "eos_token", "unk_token"}
