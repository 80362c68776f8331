"""`tune download`, in-process with the hub call replaced (tests never touch the network)."""

from pathlib import Path

import pytest

from torchtune._cli import download, tune


def _http_error(cls, status):
    import httpx2 as httpx  # the HTTP client of the installed huggingface_hub

    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
    return cls(f"{status} error", response=response)


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake_snapshot_download(**kwargs):
        seen.append(kwargs)
        Path(kwargs["local_dir"]).mkdir(parents=True, exist_ok=True)
        return kwargs["local_dir"]

    monkeypatch.setattr(download, "snapshot_download", fake_snapshot_download)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return seen


def test_download_passes_arguments(calls, tmp_path, capsys):
    code = tune.main(
        [
            "download",
            "meta-llama/Llama-2-7b-hf",
            "--output-dir",
            str(tmp_path),
            "--hf-token",
            "tok",
            "--ignore-patterns",
            "*.pth",
            "*.bin",
        ]
    )
    assert code == 0
    assert calls == [
        {
            "repo_id": "meta-llama/Llama-2-7b-hf",
            "local_dir": str(tmp_path),
            "token": "tok",
            "ignore_patterns": ["*.pth", "*.bin"],
        }
    ]
    out = capsys.readouterr().out
    assert "Ignoring files matching the following patterns: *.pth, *.bin" in out
    assert "Successfully downloaded model repo and wrote to the following locations:" in out
    assert (tmp_path / "original_repo_id.json").read_text().count("meta-llama/Llama-2-7b-hf") == 1


def test_download_defaults_token_from_env_and_no_ignore(calls, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert tune.main(["download", "org/model", "--output-dir", str(tmp_path)]) == 0
    assert calls[0]["token"] == "from-env" and calls[0]["ignore_patterns"] is None


def test_download_defaults_to_tmp_model_name_as_torchtune(calls):
    assert tune.main(["download", "org/My-Model-7b"]) == 0
    assert calls[0]["local_dir"] == "/tmp/My-Model-7b"


def _failing(monkeypatch, exc):
    def fake(**kwargs):
        raise exc

    monkeypatch.setattr(download, "snapshot_download", fake)


def _errors():
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    return [
        (
            "gated",
            lambda: _http_error(GatedRepoError, 403),
            ["gated repository", "accepting its license", "https://huggingface.co/org/model", "--hf-token", "HF_TOKEN"],
        ),
        (
            "not-found",
            lambda: _http_error(RepositoryNotFoundError, 401),
            ["not found on the Hugging Face Hub", "HF_TOKEN"],
        ),
        ("401", lambda: _http_error(HfHubHTTPError, 401), ["token is missing or invalid", "--hf-token"]),
        ("offline", lambda: LocalEntryNotFoundError("cannot find the requested files"), ["network"]),
        ("connection", lambda: ConnectionError("connection refused"), ["network"]),
    ]


@pytest.mark.parametrize("name, make, fragments", _errors(), ids=[e[0] for e in _errors()])
def test_download_errors_are_one_clear_paragraph(monkeypatch, tmp_path, capsys, name, make, fragments):
    monkeypatch.delenv("TUNE_DEBUG", raising=False)
    _failing(monkeypatch, make())
    with pytest.raises(SystemExit) as info:  # argparse's error line, as torchtune's `tune download`
        tune.main(["download", "org/model", "--output-dir", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "tune download: error: " in err and "Traceback" not in err
    for fragment in fragments:
        assert fragment in " ".join(err.split()), err


def test_kaggle_download_warns_and_lists_files(monkeypatch, tmp_path, capsys):
    (tmp_path / "params.json").write_text("{}")
    monkeypatch.setattr(download, "model_download", lambda handle: str(tmp_path))
    with pytest.warns(UserWarning, match="--output-dir flag is not supported"):
        code = tune.main(["download", "someone/llama-3.2/pytorch/1b", "--source", "kaggle", "--output-dir", "/x"])
    assert code == 0
    assert str(tmp_path / "params.json") in capsys.readouterr().out
    with pytest.warns(UserWarning, match="neither a PyTorch nor a Transformers model"):
        tune.main(["download", "metaresearch/m/jax/1b", "--source", "kaggle"])


def test_llama3_folder_names_its_tokenizer(monkeypatch, tmp_path, capsys):
    def fake_snapshot_download(**kwargs):
        folder = tmp_path / "Llama-3.2-1B"
        (folder / "original").mkdir(parents=True)
        (folder / "original" / "tokenizer.model").write_text("IQ== 0\n")
        return str(folder)

    monkeypatch.setattr(download, "snapshot_download", fake_snapshot_download)
    argv = ["download", "meta-llama/Llama-3.2-1B", "--output-dir", str(tmp_path / "Llama-3.2-1B")]
    assert tune.main(argv + ["--ignore-patterns", "original/consolidated.00.pth"]) == 0
    out = capsys.readouterr().out
    assert f"Its Llama 3 tokenizer is {tmp_path / 'Llama-3.2-1B' / 'original' / 'tokenizer.model'}" in out


def test_llama2_folder_prints_no_tokenizer_hint(calls, tmp_path, capsys):
    assert tune.main(["download", "meta-llama/Llama-2-7b-hf", "--output-dir", str(tmp_path)]) == 0
    assert "Llama 3 tokenizer" not in capsys.readouterr().out
