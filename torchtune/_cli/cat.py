"""``tune cat CONFIG [--sort]``: print a config's keys and values, as torchtune's ``tune cat`` prints them
(the YAML re-dumped with 4-space indents and no comments; ``--sort`` sorts the keys)."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtune import _recipe_registry as registry
from torchtune._errors import UsageError
from torchtune._scope import out_of_scope_message, out_of_scope_name


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune cat``."""
    parser = subparsers.add_parser(
        "cat",
        help="print a config, to see which keys you can override",
        description="Print a built-in config or a YAML file: its keys and values, without the comments, so you see "
        "what `tune run ... key=value` can override.",
        epilog="examples:\n  tune cat llama2/7B_full\n  tune cat llama2/7B_full --sort\n  tune cat ./my_config.yaml\n"
        "`tune ls` lists the built-in configs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config_name", metavar="CONFIG", help="built-in config name or path to a YAML file")
    parser.add_argument("--sort", action="store_true", help="print the keys in sorted order")
    parser.set_defaults(func=cat_command, parser=parser)
    return parser


def format_config(path: Path, sort_keys: bool = False) -> str:
    """The text ``tune cat`` prints for the YAML file ``path`` (empty for an empty file).

    Raises:
        yaml.YAMLError: the file is not YAML.
    """
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not data:
        return ""
    return yaml.dump(data, default_flow_style=False, sort_keys=sort_keys, indent=4, width=80, allow_unicode=True)


def cat_command(args: argparse.Namespace) -> int:
    """Handler of ``tune cat``: a recipe name is answered with a line; an unknown name, a file that is not YAML
    or does not parse are usage errors (exit 2)."""
    import yaml

    name = args.config_name
    if registry.get_recipe(name) is not None:
        print(f"'{name}' is a recipe, not a config. Please use a config name (`tune ls` lists them).")
        return 0
    config = registry.get_config(name)
    if config is not None:
        path = config.path
    else:
        kind = out_of_scope_name(name)
        path = Path(name).expanduser()
        if kind is not None and not path.is_file():
            raise UsageError(out_of_scope_message(f"The config '{name}'", kind))
        if path.suffix.lower() not in (".yaml", ".yml"):
            args.parser.error(
                f"Invalid config format: '{name}'. Must be YAML (.yaml/.yml), or a built-in config name (`tune ls`)."
            )
    if not path.is_file():
        args.parser.error(f"Config '{name}' not found.")
    try:
        print(format_config(path, args.sort), end="")
    except yaml.YAMLError as exc:
        args.parser.error(f"Error parsing YAML file {path}: {exc}")
    return 0
