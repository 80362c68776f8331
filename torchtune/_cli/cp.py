"""``tune cp NAME DEST [--no-clobber]``: copy a built-in recipe or config to edit it."""

from __future__ import annotations

import argparse
import difflib
import shutil
from pathlib import Path

from torchtune import _recipe_registry as registry
from torchtune._errors import TuneError, UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune cp``."""
    parser = subparsers.add_parser(
        "cp",
        allow_abbrev=False,
        help="copy a built-in recipe or config",
        description="Copy a built-in recipe (.py) or config (.yaml) so you can edit it, then run the copy "
        "with `tune run ./my_recipe.py --config ./my_config.yaml`.",
        epilog="examples:\n  tune cp llama2/tiny_full ./my_config.yaml\n  tune cp full_finetune_single_device .\n"
        "A name that is both a recipe and a config (generate) needs a suffix: generate.py or generate.yaml.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", metavar="NAME", help="built-in recipe or config name (see `tune ls`)")
    parser.add_argument("dest", metavar="DEST", help="file to write, or an existing folder to copy into")
    parser.add_argument("--no-clobber", action="store_true", help="leave DEST alone if it exists")
    parser.set_defaults(func=cp_command)
    return parser


def find_source(name: str) -> Path:
    """The built-in file called ``name`` (``generate.py`` / ``generate.yaml`` pick a kind explicitly)."""
    stem = name[:-3] if name.endswith(".py") else name
    recipe = None if name.endswith((".yaml", ".yml")) else registry.get_recipe(stem)
    config = None if name.endswith(".py") else registry.get_config(name)
    if recipe is not None and config is not None:
        raise UsageError(
            f"'{name}' names both a built-in recipe and a built-in config; write '{name}.py' to copy the "
            f"recipe or '{name}.yaml' to copy the config."
        )
    found = recipe or config
    if found is None:
        names = [r.name for r in registry.get_all_recipes()] + [
            c.name for r in registry.get_all_recipes() for c in r.configs
        ]
        close = difflib.get_close_matches(stem, names, n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise UsageError(
            f"'{name}' is not a built-in recipe or config.{hint} Run `tune ls` to see the names; "
            f"choices: {', '.join(names)}."
        )
    if not found.path.is_file():
        raise TuneError(
            f"The built-in '{found.name}' is registered but its file {found.path} is missing "
            "from this installation; reinstall plaintune."
        )
    return found.path


def destination(source: Path, dest: str) -> Path:
    """DEST as a file path: inside DEST when it is a folder; the source's suffix when DEST has none."""
    path = Path(dest).expanduser()
    if path.is_dir():
        return path / source.name
    if not path.suffix:
        path = path.with_suffix(source.suffix)
    return path


def cp_command(args: argparse.Namespace) -> int:
    """Handler of ``tune cp``."""
    source = find_source(args.name)
    target = destination(source, args.dest)
    if target.exists() and args.no_clobber:
        print(f"Not overwriting {target}: it already exists (--no-clobber).")
        return 0
    config = registry.get_config(args.name) if source.suffix in (".yaml", ".yml") else None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if config is not None:  # the copy names its recipe, so `tune validate my.yaml` runs the recipe's checks
            recipe = next(r for r in registry.get_all_recipes() if config in r.configs)
            target.write_text(registry.recipe_header(recipe, config) + source.read_text(encoding="utf-8"), "utf-8")
        else:
            shutil.copyfile(source, target)
    except OSError as exc:
        raise TuneError(f"Cannot copy {source} to {target}: {exc.strerror or exc}.") from exc
    print(f"Copied {source.name} to {target}")
    return 0
