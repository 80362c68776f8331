"""The base tokenizers of torchtune.modules.transforms.tokenizers on tiny files made here: SentencePiece,
tiktoken, tokenizer.json (BOS/EOS from the folder's configs) and GPT-2-format vocab.json + merges.txt."""

import json

import pytest

from tests._helpers.bpe_files import make_bpe_files
from tests._helpers.llama3_tokenizer import train_bpe_ranks, write_tiktoken_file
from tests._helpers.tokenizer import make_spm_tokenizer
from torchtune import TuneError
from torchtune.models.llama3._tokenizer import CL100K_PATTERN
from torchtune.modules.tokenizers import SentencePieceTokenizer
from torchtune.modules.transforms.tokenizers import (
    GPT2BaseTokenizer,
    HuggingFaceBaseTokenizer,
    SentencePieceBaseTokenizer,
    TikTokenBaseTokenizer,
    parse_hf_tokenizer_json,
)
from torchtune.modules.transforms.tokenizers._gpt2 import GPT2_PATTERN


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
    return make_spm_tokenizer(tmp_path_factory.mktemp("spm"))


def test_sentencepiece_base_ids_and_trim(spm_path):
    tok = SentencePieceBaseTokenizer(spm_path)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size, tok.encodes_whitespace) == (1, 2, -1, 400, True)
    body = tok.encode("Hello world", add_bos=False, add_eos=False)
    assert tok.encode("Hello world") == [1, *body, 2] and tok.decode([1, *body, 2]) == "Hello world"
    prompt, response = "### Response:\n", "The capital of France is Paris."
    joined = tok.encode(prompt + response)
    assert tok.encode(prompt, add_eos=False) + tok.encode(response, add_bos=False) != joined
    trimmed = tok.encode(response, add_bos=False, trim_leading_whitespace=True)
    assert tok.encode(prompt, add_eos=False) + trimmed == joined
    # another prefix gives the same continuation where it does not merge with the text
    assert tok.encode(response, add_bos=False, trim_leading_whitespace=True, prefix="\n\n") == trimmed
    ours = SentencePieceTokenizer(spm_path, max_seq_len=8)
    assert (ours.pad_id, ours.max_seq_len) == (0, 8) and ours.decode(joined + [0, -100]) == prompt + response


@pytest.fixture(scope="module")
def tiktoken_path(tmp_path_factory):
    corpus = ["I can see the sun. But even if I cannot see the sun, I know that it exists."] * 3
    return write_tiktoken_file(train_bpe_ranks(corpus, num_merges=40), tmp_path_factory.mktemp("tt") / "t.model")


def test_tiktoken_base(tiktoken_path):
    special = {"<|begin|>": 1000, "<|end|>": 1001}
    tok = TikTokenBaseTokenizer(
        str(tiktoken_path), "t", CL100K_PATTERN, bos_id=1000, eos_id=1001, special_tokens=special
    )
    assert (tok.base_vocab_size, tok.vocab_size) == (291, 1002)  # 256 bytes + 35 merges (the corpus ran out)
    text = "I can see the sun."
    ids = tok.encode(text, add_bos=False, add_eos=False)
    assert tok.encode(text) == [1000, *ids, 1001] and tok.decode(ids) == text
    assert tok.decode([*ids, 1001, *ids]) == text  # stops at EOS
    assert tok.decode([*ids, 1001, *ids], truncate_at_eos=False) == text + "<|end|>" + text
    # a special token's text is text by default; recognised on request (as Llama 3's tokenizer does)
    assert 1001 not in tok.encode("a<|end|>b", add_bos=False, add_eos=False)
    recognising = TikTokenBaseTokenizer(
        str(tiktoken_path), "t", CL100K_PATTERN, 1000, 1001, special, special_tokens_in_text=True
    )
    assert recognising.encode("a<|end|>b", add_bos=False, add_eos=False)[1] == 1001
    assert list(tok._split_long_repetitions("aaaa  bbbbbb", 3)) == ["aaa", "a  bbb", "bbb"]


def test_tiktoken_base_refuses_a_file_without_every_byte(tmp_path):
    path = tmp_path / "t.model"
    write_tiktoken_file({bytes([b]): b for b in range(1, 256)}, path)
    with pytest.raises(TuneError, match="no token for 1 of the 256 single bytes"):
        TikTokenBaseTokenizer(str(path), "t", CL100K_PATTERN, 0, 1, {})


def test_huggingface_base_takes_bos_and_eos_from_the_folder(llama3_tokenizer_dir, tmp_path):
    tokenizer_json = str(llama3_tokenizer_dir / "tokenizer.json")
    special = parse_hf_tokenizer_json(tokenizer_json)
    bos, eos = special["<|begin_of_text|>"], special["<|end_of_text|>"]
    tok = HuggingFaceBaseTokenizer(
        tokenizer_json, tokenizer_config_json_path=str(llama3_tokenizer_dir / "tokenizer_config.json")
    )
    assert (tok.bos_id, tok.eos_id, tok.hf_adds_bos, tok.hf_adds_eos) == (bos, eos, True, False)
    ids = tok.encode("Hello world")
    assert ids[0] == bos and ids[1] != bos and ids[-1] == eos  # BOS from the post-processor, not twice
    assert tok.decode(ids) == "Hello world"
    generation = tmp_path / "generation_config.json"
    generation.write_text(json.dumps({"bos_token_id": 7, "eos_token_id": 8}))
    from_generation = HuggingFaceBaseTokenizer(tokenizer_json, generation_config_path=str(generation))
    assert (from_generation.bos_id, from_generation.eos_id) == (7, 8)
    with pytest.raises(ValueError, match="At least one of tokenizer_config_json_path or generation_config_path"):
        HuggingFaceBaseTokenizer(tokenizer_json)


def test_gpt2_base_and_a_broken_merges_file(tmp_path):
    vocab, merges = make_bpe_files(tmp_path, GPT2_PATTERN)
    tok = GPT2BaseTokenizer(str(vocab), str(merges), unk_id=0, bos_id=1, eos_id=2, pad_id=3)
    ids = tok.encode("Hello world!", add_bos=False, add_eos=False)
    assert tok.encode("Hello world!") == [1, *ids, 2]
    assert "".join(tok.decode(ids)).replace("Ġ", " ") == "Hello world!"  # vocabulary entries, as torchtune's
    assert tok.vocab_size == len(json.loads(vocab.read_text()))
    merges.write_text("#version: 0.2\nthree words here\n")
    with pytest.raises(TuneError, match="Line 2 of the merges file"):
        GPT2BaseTokenizer(str(vocab), str(merges))


def test_parse_hf_tokenizer_json(llama3_tokenizer_dir, tmp_path):
    special = parse_hf_tokenizer_json(str(llama3_tokenizer_dir / "tokenizer.json"))
    assert special["<|eot_id|>"] == special["<|begin_of_text|>"] + 9
    not_json = tmp_path / "vocab.json"
    not_json.write_text(json.dumps({"a": 0}))
    with pytest.raises(TuneError, match="no 'added_tokens' list"):
        parse_hf_tokenizer_json(str(not_json))
