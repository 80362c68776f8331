"""``tune cp NAME DEST [-n/--no-clobber] [--make-parents] [--force]``: copy a built-in recipe or config to edit
it, with torchtune's options. A file at DEST that holds something else is not overwritten without ``--force``
(``-n`` leaves any existing file alone; an empty file, or one identical to the copy, is simply written)."""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from torchtune import _recipe_registry as registry
from torchtune._errors import TuneError, UsageError
from torchtune._scope import out_of_scope_message, out_of_scope_name


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune cp``."""
    parser = subparsers.add_parser(
        "cp",
        help="copy a built-in recipe or config",
        usage="tune cp <recipe|config> destination [OPTIONS]",
        description="Copy a built-in recipe (.py) or config (.yaml) so you can edit it, then run the copy "
        "with `tune run ./my_recipe.py --config ./my_config.yaml`.",
        epilog="examples:\n  tune cp llama2/tiny_full ./my_config.yaml\n  tune cp full_finetune_single_device .\n"
        "  tune cp llama2/7B_full ./new_dir/my_config.yaml --make-parents\n"
        "A name that is both a recipe and a config (generate) needs a suffix: generate.py or generate.yaml.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="file", help="built-in recipe or config name (see `tune ls`)")
    parser.add_argument("destination", metavar="destination", help="file to write, or an existing folder to copy into")
    parser.add_argument(
        "-n", "--no-clobber", action="store_true", help="do not overwrite the destination if it already exists"
    )
    parser.add_argument(
        "--make-parents", action="store_true", help="create the destination's missing parent folders (else an error)"
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite a destination file that holds something else than the copy"
    )
    parser.set_defaults(func=cp_command, parser=parser)
    return parser


def find_source(name: str) -> Path:
    """The built-in file called ``name`` (``generate.py`` / ``generate.yaml`` pick a kind explicitly).

    Raises:
        UsageError: the name is ambiguous, unknown (with the closest names), or torchtune's for work
            outside this library's scope.
    """
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
        kind = out_of_scope_name(stem)
        if kind is not None:
            raise UsageError(out_of_scope_message(f"'{name}'", kind))
        names = [r.name for r in registry.get_all_recipes()] + [
            c.name for r in registry.get_all_recipes() for c in r.configs
        ]
        close = difflib.get_close_matches(stem, names, n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise UsageError(f"Invalid file name: {name}. Try `tune ls` to see all available files to copy.{hint}")
    if not found.path.is_file():
        raise TuneError(
            f"The built-in '{found.name}' is registered but its file {found.path} is missing "
            "from this installation; reinstall plaintune."
        )
    return found.path


def destination(source: Path, dest: str) -> str:
    """DEST as a file path, spelled as the user wrote it (``tune cp x .`` reports ``./x.yaml``): inside DEST
    when it is a folder; with the source's suffix otherwise (``my_config`` -> ``my_config.yaml``)."""
    path = Path(dest).expanduser()
    if path.is_dir() or dest.endswith(("/", "\\")):
        return os.path.join(dest, source.name)
    return str(path.with_suffix(source.suffix))


def _copy_text(name: str, source: Path) -> bytes:
    """What the copy holds: the file, and for a config a first line naming its recipe (``tune cp`` header)."""
    config = registry.get_config(name) if source.suffix in (".yaml", ".yml") else None
    if config is None:
        return source.read_bytes()
    # the copy names its recipe, so `tune validate my.yaml` runs the recipe's checks
    recipe = next(r for r in registry.get_all_recipes() if config in r.configs)
    return (registry.recipe_header(recipe, config) + source.read_text(encoding="utf-8")).encode("utf-8")


def cp_command(args: argparse.Namespace) -> int:
    """Handler of ``tune cp``."""
    try:
        source = find_source(args.file)
    except UsageError as exc:
        args.parser.error(str(exc))  # argparse's "tune cp: error: ..." line, as torchtune's
    shown = destination(source, args.destination)
    target = Path(shown)
    if target.exists() and args.no_clobber:
        print(f"File already exists at {target.absolute()}, not overwriting.")
        return 0
    text = _copy_text(args.file, source)
    if target.is_file() and not args.force and target.stat().st_size and target.read_bytes() != text:
        raise UsageError(
            f"{target} exists and holds something else than {source.name}: not overwriting it (your edits would "
            "be lost). Add --force to overwrite it, -n to leave it alone, or copy to another path."
        )
    if args.make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    elif not target.parent.is_dir():
        args.parser.error(
            f"Cannot create regular file: '{target}'. No such file or directory. To create the missing parent "
            "folders, add --make-parents."
        )
    try:
        target.write_bytes(text)
    except OSError as exc:
        raise TuneError(f"Cannot copy {source} to {target}: {exc.strerror or exc}.") from exc
    print(f"Copied file to {shown}")
    return 0
