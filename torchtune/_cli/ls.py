"""``tune ls``: the built-in recipes and their configs."""

from __future__ import annotations

import argparse

from torchtune import _recipe_registry as registry


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune ls``."""
    parser = subparsers.add_parser(
        "ls",
        allow_abbrev=False,
        help="list built-in recipes and configs",
        description="List the built-in recipes and their configs (names for `tune run` and `tune cp`).",
    )
    parser.set_defaults(func=ls_command)
    return parser


def format_table() -> str:
    """The recipe/config table ``tune ls`` prints."""
    rows = [("RECIPE", "CONFIG")]
    for recipe in registry.get_all_recipes():
        configs = [c.name for c in recipe.configs] or ["-"]
        rows.append((recipe.name, configs[0]))
        rows.extend(("", name) for name in configs[1:])
    width = max(len(r[0]) for r in rows) + 3
    return "\n".join(f"{a:<{width}}{b}".rstrip() for a, b in rows)


def ls_command(args: argparse.Namespace) -> int:
    """Handler of ``tune ls``."""
    print(format_table())
    return 0
