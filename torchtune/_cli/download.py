"""``tune download REPO_ID [--output-dir DIR] [--source huggingface|kaggle]``: fetch a model repository from the
Hugging Face Hub (default) or the Kaggle Model Hub, with torchtune's options.

The Hub's files go to ``--output-dir``, by default ``/tmp/<model name>`` as with torchtune (``/tmp/Llama-2-7b-hf``
for ``meta-llama/Llama-2-7b-hf``, the folder torchtune's configs read). Every file of the repository is
downloaded unless ``--ignore-patterns`` says otherwise (e.g. ``--ignore-patterns "*.safetensors"`` to keep
only the ``.bin`` weights, or ``"original/consolidated.00.pth"`` to skip Meta's copy of the weights in Llama
3.x repositories, whose ``original/`` folder also holds the tiktoken ``tokenizer.model`` the Llama 3
tokenizer reads). Kaggle downloads go to kagglehub's cache (``pip install kagglehub``).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any, Optional

from torchtune._errors import TuneError


def snapshot_download(**kwargs: Any) -> str:
    """``huggingface_hub.snapshot_download``, imported on first use.

    Importing the hub client costs about half a second, which every ``tune`` start-up would pay. The
    command calls it as this module's attribute, so tests replace it with monkeypatch.
    """
    from huggingface_hub import snapshot_download as hub_snapshot_download

    return hub_snapshot_download(**kwargs)


def model_download(handle: str) -> str:
    """``kagglehub.model_download``, imported on first use (kagglehub is optional: ``pip install kagglehub``)."""
    return _kagglehub().model_download(handle)


def set_kaggle_credentials(username: Optional[str], api_key: Optional[str]) -> None:
    """``kagglehub.auth.set_kaggle_credentials``, imported on first use."""
    _kagglehub()
    from kagglehub.auth import set_kaggle_credentials as kaggle_set_credentials

    kaggle_set_credentials(username, api_key)


def _kagglehub() -> Any:
    try:
        import kagglehub
    except ImportError as exc:
        raise TuneError(
            "tune download --source kaggle needs the kagglehub package, which is not installed: "
            "pip install kagglehub (or pip install 'plaintune[kaggle]')."
        ) from exc
    return kagglehub


# torchtune's download writes the repository id next to the files (its checkpointers read it back).
REPO_ID_FILE = "original_repo_id.json"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune download``."""
    parser = subparsers.add_parser(
        "download",
        help="download a model from the Hugging Face Hub or the Kaggle Model Hub",
        usage="tune download <repo-id> [OPTIONS]",
        description="Download a model repository from the Hugging Face Hub (or the Kaggle Model Hub) into a folder.",
        epilog="examples:\n  tune download meta-llama/Llama-2-7b-hf --ignore-patterns '*.safetensors'    "
        "# into /tmp/Llama-2-7b-hf\n  tune download meta-llama/Llama-3.2-1B --output-dir /tmp/Llama-3.2-1B "
        "--ignore-patterns 'original/consolidated.00.pth'\n  tune download metaresearch/llama-3.2/pytorch/1b "
        "--source kaggle\n\nGated models (Llama 2, Llama 3.x) need their license accepted on the repository page "
        "and a token: --hf-token or the HF_TOKEN environment variable.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "repo_id", metavar="repo_id", help="Hub repository (meta-llama/Llama-2-7b-hf) or Kaggle model handle"
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="folder to download into (default: /tmp/<model name>)"
    )
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
        help="file globs not to download (default: none, every file is downloaded); Hugging Face Hub only",
    )
    parser.add_argument(
        "--source",
        default="huggingface",
        choices=["huggingface", "kaggle"],
        help="the hub to download from (default: huggingface)",
    )
    parser.add_argument("--kaggle-username", default=None, help="Kaggle user name (default: $KAGGLE_USERNAME)")
    parser.add_argument("--kaggle-api-key", default=None, help="Kaggle API key (default: $KAGGLE_KEY)")
    parser.set_defaults(func=download_command, parser=parser)
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
    """Handler of ``tune download``: a failed download is one ``tune download: error:`` paragraph (exit 2)."""
    if args.source == "kaggle":
        return _download_from_kaggle(args)
    return _download_from_huggingface(args)


def _download_from_huggingface(args: argparse.Namespace) -> int:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    repo = args.repo_id
    output_dir = args.output_dir if args.output_dir is not None else Path("/tmp") / repo.split("/")[-1]
    token = args.hf_token or os.environ.get("HF_TOKEN") or None
    page = f"https://huggingface.co/{repo}"
    error = args.parser.error
    if args.ignore_patterns:
        print(f"Ignoring files matching the following patterns: {', '.join(args.ignore_patterns)}")
    try:
        path = snapshot_download(
            repo_id=repo, local_dir=str(output_dir), token=token, ignore_patterns=args.ignore_patterns
        )
    except GatedRepoError:  # before RepositoryNotFoundError: it is a subclass
        if token:
            error(
                "It looks like you are trying to access a gated repository. Please ensure you have access to the "
                f"repository. Accept its license at {page} with the Hugging Face account of the token passed."
            )
        error(
            "It looks like you are trying to access a gated repository. Please ensure you have access to the "
            "repository and have provided the proper Hugging Face API token with --hf-token TOKEN or HF_TOKEN (or "
            f"`hf auth login`), after accepting its license at {page} (tokens: https://huggingface.co/settings/tokens)."
        )
    except RepositoryNotFoundError as exc:
        error(
            f"Repository '{repo}' not found on the Hugging Face Hub (HTTP {_status(exc) or 'error'}): it does not "
            f"exist or your token may not read it. Check the name at {page}; for a private or gated repository pass "
            "a valid token with --hf-token TOKEN or set HF_TOKEN."
        )
    except HfHubHTTPError as exc:
        if _status(exc) in (401, 403):
            error(
                f"The Hugging Face Hub refused the download of '{repo}' (HTTP {_status(exc)}): the token is missing "
                "or invalid. Pass a valid token with --hf-token TOKEN or set HF_TOKEN, and accept the model's license "
                f"at {page} if it is gated."
            )
        if _is_network_error(exc):
            error(_network_error(repo, exc))
        error(f"Failed to download {repo} from the Hugging Face Hub: {exc}")
    except Exception as exc:
        if _is_network_error(exc):
            error(_network_error(repo, exc))
        raise
    with open(Path(path) / REPO_ID_FILE, "w", encoding="utf-8") as f:
        json.dump({"repo_id": repo}, f, indent=4)
    _print_files(path)
    tiktoken_file = Path(path) / "original" / "tokenizer.model"
    if tiktoken_file.is_file():
        # Llama 3.x keeps its tokenizer.model out of the top folder, where configs might look for it.
        print(f"Its Llama 3 tokenizer is {tiktoken_file} (config key tokenizer.path).")
    return 0


def _print_files(folder: Any) -> None:
    print("Successfully downloaded model repo and wrote to the following locations:")
    for item in sorted(Path(folder).iterdir()):
        print(item)


def _network_error(repo: str, exc: BaseException) -> str:
    return (
        f"Cannot reach the Hugging Face Hub to download '{repo}' ({type(exc).__name__}). Check your network "
        "connection and proxy settings (HTTPS_PROXY), and that HF_HUB_OFFLINE is not set, then retry."
    )


def _check_kaggle_handle(handle: str, error: Any) -> None:
    """Warn about a model that is not Meta's PyTorch release nor a Transformers one (it may not load here)."""
    parts = handle.split("/")
    if len(parts) < 4 or not all(parts[:4]):
        error(
            f"'{handle}' is not a Kaggle model handle: write OWNER/MODEL/FRAMEWORK/VARIATION, "
            "e.g. metaresearch/llama-3.2/pytorch/1b."
        )
    owner, framework = parts[0], parts[2].lower()
    if framework == "pytorch" and owner != "metaresearch":
        warnings.warn(
            f"{handle} is a PyTorch model not published by Meta (metaresearch): its files may not be compatible "
            "with torchtune's checkpointers.",
            stacklevel=2,
        )
    if framework not in ("pytorch", "transformers"):
        warnings.warn(
            f"{handle} is neither a PyTorch nor a Transformers model, so its files may not be compatible with "
            "torchtune's checkpointers.",
            stacklevel=2,
        )


def _download_from_kaggle(args: argparse.Namespace) -> int:
    handle = args.repo_id
    error = args.parser.error
    _check_kaggle_handle(handle, error)
    if args.kaggle_username or args.kaggle_api_key:
        print(
            "TIP: you can avoid passing in the --kaggle-username and --kaggle-api-key arguments by setting the "
            "environment variables KAGGLE_USERNAME and KAGGLE_KEY. For more details, see "
            "https://github.com/Kaggle/kagglehub/blob/main/README.md#authenticate"
        )
        try:
            set_kaggle_credentials(
                args.kaggle_username or os.environ.get("KAGGLE_USERNAME"),
                args.kaggle_api_key or os.environ.get("KAGGLE_KEY"),
            )
        except Exception as exc:  # noqa: BLE001 - public models download without credentials
            warnings.warn(f"Failed to set Kaggle credentials with error: '{exc}'. Trying without them.", stacklevel=2)
    if args.output_dir is not None:
        warnings.warn(
            "--output-dir flag is not supported for Kaggle model downloads: kagglehub's cache is used.", stacklevel=2
        )
    if args.ignore_patterns:
        warnings.warn(
            "--ignore-patterns flag is not supported for Kaggle model downloads: every file is downloaded.",
            stacklevel=2,
        )
    try:
        path = model_download(handle)
    except TuneError:
        raise
    except Exception as exc:
        status = _status(exc)
        if status in (401, 403):
            error(
                "It looks like you are trying to access a gated model. Please ensure you have access to the model "
                "and have provided the proper Kaggle credentials with --kaggle-username and --kaggle-api-key. You "
                "can also set these to environment variables (KAGGLE_USERNAME, KAGGLE_KEY): "
                "https://github.com/Kaggle/kagglehub/blob/main/README.md#authenticate."
            )
        if status == 404:
            error(f"'{handle}' not found on the Kaggle Model Hub.")
        error(f"Failed to download {handle} from the Kaggle Model Hub: {exc}")
    _print_files(path)
    return 0
