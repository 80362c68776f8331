"""``tune download REPO_ID --output-dir DIR``: fetch a model repository from the Hugging Face Hub.

Every file of the repository is downloaded unless ``--ignore-patterns`` says otherwise (e.g.
``--ignore-patterns "*.safetensors"`` to keep only the ``.bin`` weights, or
``"original/consolidated.00.pth"`` to skip Meta's copy of the weights in Llama 3.x repositories, whose
``original/`` folder also holds the tiktoken ``tokenizer.model`` the Llama 3 tokenizer reads).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from torchtune._errors import TuneError


def snapshot_download(**kwargs: Any) -> str:
    """``huggingface_hub.snapshot_download``, imported on first use.

    Importing the hub client costs about half a second, which every ``tune`` start-up would pay. The
    command calls it as this module's attribute, so tests replace it with monkeypatch.
    """
    from huggingface_hub import snapshot_download as hub_snapshot_download

    return hub_snapshot_download(**kwargs)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune download``."""
    parser = subparsers.add_parser(
        "download",
        allow_abbrev=False,
        help="download a model from the Hugging Face Hub",
        description="Download a model repository from the Hugging Face Hub into a folder.",
        epilog="examples:\n  tune download meta-llama/Llama-2-7b-hf --output-dir /tmp/Llama-2-7b-hf "
        "--ignore-patterns '*.safetensors'\n  tune download meta-llama/Llama-3.2-1B --output-dir /tmp/Llama-3.2-1B "
        "--ignore-patterns 'original/consolidated.00.pth'\n\nGated models (Llama 2, Llama 3.x) need their "
        "license accepted on the repository page and a token: --hf-token or the HF_TOKEN environment variable.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("repo_id", metavar="REPO_ID", help="Hub repository, e.g. meta-llama/Llama-2-7b-hf")
    parser.add_argument("--output-dir", required=True, type=Path, help="folder to download into")
    parser.add_argument(
        "--hf-token",
        default=None,
        help="Hugging Face access token (default: $HF_TOKEN or the token of `hf auth login`)",
    )
    parser.add_argument(
        "--ignore-patterns",
        nargs="+",
        action="extend",
        default=None,
        metavar="GLOB",
        help="file globs not to download (default: none, every file is downloaded)",
    )
    parser.set_defaults(func=download_command)
    return parser


def _is_network_error(exc: BaseException) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError

    if isinstance(exc, (LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        return True
    # requests / httpx raise their own ConnectError/Timeout classes; match by name to need neither.
    names = {cls.__name__ for cls in type(exc).__mro__}
    return any(n.endswith(("ConnectionError", "ConnectError", "Timeout", "TimeoutException")) for n in names)


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def download_command(args: argparse.Namespace) -> int:
    """Handler of ``tune download``."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    repo = args.repo_id
    token = args.hf_token or os.environ.get("HF_TOKEN") or None
    page = f"https://huggingface.co/{repo}"
    try:
        path = snapshot_download(
            repo_id=repo, local_dir=str(args.output_dir), token=token, ignore_patterns=args.ignore_patterns
        )
    except GatedRepoError as exc:  # before RepositoryNotFoundError: it is a subclass
        raise TuneError(
            f"'{repo}' is a gated repository: accept its license at {page} with your Hugging Face account, "
            "then pass an access token of that account with --hf-token TOKEN or set HF_TOKEN "
            "(tokens: https://huggingface.co/settings/tokens)."
        ) from exc
    except RepositoryNotFoundError as exc:
        raise TuneError(
            f"Cannot access '{repo}': the repository does not exist or your token may not read it (HTTP "
            f"{_status(exc) or 'error'}). Check the name at {page}; for a private or gated repository pass a "
            "valid token with --hf-token TOKEN or set HF_TOKEN."
        ) from exc
    except HfHubHTTPError as exc:
        if _status(exc) in (401, 403):
            raise TuneError(
                f"The Hugging Face Hub refused the download of '{repo}' (HTTP {_status(exc)}): the token is "
                "missing or invalid. Pass a valid token with --hf-token TOKEN or set HF_TOKEN, and accept the "
                f"model's license at {page} if it is gated."
            ) from exc
        if _is_network_error(exc):
            raise _network_error(repo, exc) from exc
        raise TuneError(f"Downloading '{repo}' from the Hugging Face Hub failed: {exc}") from exc
    except Exception as exc:
        if _is_network_error(exc):
            raise _network_error(repo, exc) from exc
        raise
    print(f"Downloaded {repo} to {path}")
    tiktoken_file = Path(path) / "original" / "tokenizer.model"
    if tiktoken_file.is_file():
        # Llama 3.x keeps its tokenizer.model out of the top folder, where configs might look for it.
        print(f"Its Llama 3 tokenizer is {tiktoken_file} (config key tokenizer.path).")
    return 0


def _network_error(repo: str, exc: BaseException) -> TuneError:
    return TuneError(
        f"Cannot reach the Hugging Face Hub to download '{repo}' ({type(exc).__name__}). Check your network "
        "connection and proxy settings (HTTPS_PROXY), and that HF_HUB_OFFLINE is not set, then retry."
    )
