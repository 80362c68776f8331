import pytest

from torchtune import TuneError
from torchtune.modules.tokenizers import SentencePieceTokenizer


@pytest.fixture(scope="module")
def tokenizer(spm_model_path):
    return SentencePieceTokenizer(spm_model_path)


def test_special_ids_like_llama2(tokenizer):
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)
    assert tokenizer.spm_model.pad_id() == -1
    assert tokenizer.pad_id == 0  # documented fallback for models without a pad token
    assert tokenizer.vocab_size == 400


def test_encode_adds_bos_and_eos(tokenizer):
    body = tokenizer.encode("Hello world", add_bos=False, add_eos=False)
    assert body and tokenizer.bos_id not in body and tokenizer.eos_id not in body
    assert tokenizer.encode("Hello world") == [1] + body + [2]
    assert tokenizer.encode("Hello world", add_eos=False) == [1] + body
    assert tokenizer.encode("Hello world", add_bos=False) == body + [2]


@pytest.mark.parametrize(
    "text",
    [
        "Hello world",
        "Give three tips for staying healthy.\n\n1. Eat well",
        "unseen wörds and 日本 bytes",
        "  leading spaces",
    ],
)
def test_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_decode_skips_special_and_ignore_ids(tokenizer):
    ids = tokenizer.encode("The quick brown fox")
    assert tokenizer.decode(ids + [tokenizer.pad_id, -100]) == "The quick brown fox"


def test_separate_encoding_without_trim_inserts_space_token(tokenizer):
    # Why trim_leading_whitespace exists: the dummy prefix differs from the in-context tokens.
    prompt, response = "### Response:\n", "The capital"
    joined = tokenizer.encode(prompt + response)
    naive = tokenizer.encode(prompt, add_eos=False) + tokenizer.encode(response, add_bos=False)
    assert naive != joined
    assert tokenizer.decode(naive) == "### Response:\n The capital"


@pytest.mark.parametrize(
    "prompt, response",
    [
        ("### Response:\n", "The capital of France is Paris."),
        ("Below is an instruction.\n\n### Instruction:\n", "Give three tips\nfor staying healthy."),
        ("Answer:", " 42 is the answer"),  # boundary before the response's own space
        ("Question: Why?\n", " Because"),
        ("Q\n", "\nTwo newlines"),
        ("x\n", "日本 and ü"),
    ],
)
def test_prompt_and_trimmed_response_join_like_the_joined_text(tokenizer, prompt, response):
    separate = tokenizer.encode(prompt, add_eos=False) + tokenizer.encode(
        response, add_bos=False, trim_leading_whitespace=True
    )
    assert separate == tokenizer.encode(prompt + response)


def test_trim_keeps_text(tokenizer):
    ids = tokenizer.encode("Hello", add_bos=False, add_eos=False, trim_leading_whitespace=True)
    assert tokenizer.decode(ids) == "Hello"
    assert ids != tokenizer.encode("Hello", add_bos=False, add_eos=False)


def test_missing_file_names_path_and_key(tmp_path):
    path = tmp_path / "nope" / "tokenizer.model"
    with pytest.raises(TuneError) as info:
        SentencePieceTokenizer(path)
    message = str(info.value)
    assert str(path) in message and "tokenizer.path" in message and "tune download" in message


def test_invalid_file_names_path_and_key(tmp_path):
    path = tmp_path / "tokenizer.model"
    path.write_text("this is not a sentencepiece model")
    with pytest.raises(TuneError) as info:
        SentencePieceTokenizer(path)
    message = str(info.value)
    assert str(path) in message and "tokenizer.path" in message and "not a valid SentencePiece" in message


def test_folder_points_at_model_inside(spm_model_path):
    folder = spm_model_path.parent
    with pytest.raises(TuneError, match="is a folder") as info:
        SentencePieceTokenizer(folder)
    assert f"tokenizer.path={folder / 'tokenizer.model'}" in str(info.value)
