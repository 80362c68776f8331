"""What the family tokenizer builders share: telling torchtune's tokenizer files from a Hugging Face model
folder's ``tokenizer.json``, and the folder's tokenizer for the latter.

torchtune's builders read the files a model was released with (a SentencePiece ``tokenizer.model``, a
``vocab.json`` with its ``merges.txt``) and format chats with the family's own code and an optional prompt
template. This library also reads a model folder's ``tokenizer.json`` (``HFModelTokenizer``), whose chats
are formatted by the folder's own chat template, as transformers formats them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from torchtune._errors import TuneError
from torchtune.modules.transforms.tokenizers._format import HF_TOKENIZER_JSON, sniff_tokenizer_format


def is_hf_tokenizer_json(path: str) -> bool:
    """Whether ``path`` is a model folder, or a file that is a Hugging Face ``tokenizer.json`` (a missing
    file counts as one when it is named so, so that its loader names what is missing)."""
    given = Path(path).expanduser()
    if given.is_dir():
        return True
    if not given.is_file():
        return given.name == "tokenizer.json"
    return sniff_tokenizer_format(given) == HF_TOKENIZER_JSON


def folder_tokenizer(
    path: str,
    max_seq_len: Optional[int],
    prompt_template: Any,
    default_template: Optional[str],
    builder: str,
) -> Any:
    """The ``HFModelTokenizer`` of the model folder of ``path`` (a ``tokenizer.json``).

    Raises:
        TuneError: a ``prompt_template`` other than the builder's default: the folder's chat template
            formats chats, and a second template would be silently ignored.
    """
    from torchtune.modules.tokenizers import HFModelTokenizer

    if prompt_template is not None and prompt_template != default_template:
        raise TuneError(
            f"tokenizer.prompt_template={prompt_template!r} is set, but tokenizer.path={path} is a Hugging Face "
            f"tokenizer.json, whose folder's own chat template formats conversations ({builder} uses a prompt "
            "template only with the model's original tokenizer files). Remove tokenizer.prompt_template, or "
            "point tokenizer.path at the original tokenizer files."
        )
    return HFModelTokenizer(path, max_seq_len=max_seq_len)
