"""Files that ship inside the ``torchtune`` package (``torchtune/assets/``), found wherever it is installed.

Configs name them as ``${asset:demo/tokenizer.model}``: an OmegaConf resolver that turns the name into
the file's absolute path, so a bundled config works from any working directory. Paths relative to a
checkout (``torchtune/assets/demo/...``) only work from the repository root; ``missing_path_hint``
says so when such a path is not found.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

RESOLVER = "asset"


def assets_dir() -> Path:
    """``torchtune/assets`` of the installed package."""
    return Path(__file__).resolve().parent / "assets"


def asset_path(name: str) -> str:
    """Absolute path of the bundled asset ``name`` (``demo/tokenizer.model``), which must exist."""
    path = assets_dir() / str(name).strip().lstrip("/")
    if not path.exists():
        shipped = sorted(p.relative_to(assets_dir()).as_posix() for p in assets_dir().rglob("*") if p.is_file())
        raise ValueError(
            f"there is no bundled asset '{name}' in {assets_dir()}; the bundled files are: {', '.join(shipped)}"
        )
    return str(path)


def register_resolver() -> None:
    """Make ``${asset:NAME}`` resolve in configs (done when the config loader first reads a file)."""
    import omegaconf
    from omegaconf import OmegaConf

    if OmegaConf.has_resolver(RESOLVER):
        return
    # omegaconf 2.4 renamed register_new_resolver (2.1-2.3) back to register_resolver and deprecated the
    # old name; in 2.3 register_resolver is the legacy API that passes every argument as a string.
    major_minor = tuple(int(p) for p in omegaconf.__version__.split(".")[:2])
    register = OmegaConf.register_resolver if major_minor >= (2, 4) else OmegaConf.register_new_resolver
    register(RESOLVER, asset_path)


def missing_path_hint(path: Union[str, os.PathLike]) -> str:
    """A sentence for the error about a missing file or folder ``path``: where a relative path was looked
    for, and, when it names a bundled asset, the ``${asset:...}`` spelling that works from anywhere."""
    path = Path(os.fspath(path))
    if path.is_absolute():
        return ""
    hint = f" It is a relative path, looked for from the current directory {Path.cwd()}."
    parts = path.as_posix().split("/")
    if "assets" in parts:
        name = "/".join(parts[parts.index("assets") + 1 :])
        if name and (assets_dir() / name).exists():
            hint += (
                f" It names a file that ships with torchtune: write ${{{RESOLVER}:{name}}} in the config (it "
                f"resolves to {assets_dir() / name} from any directory), or run from the repository root."
            )
    return hint
