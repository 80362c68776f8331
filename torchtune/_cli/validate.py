"""``tune validate CONFIG [key=value ...]``: check a config without running anything."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune validate``."""
    parser = subparsers.add_parser(
        "validate",
        help="check a config",
        description="Check a config: YAML syntax, overrides, every _component_ imports and its keys match "
        "the callable's arguments, every ${...} resolves. Nothing is built or downloaded.",
    )
    parser.add_argument("config", metavar="CONFIG", help="built-in config name or path to a YAML file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides to check too")
    parser.set_defaults(func=validate_command, accepts_overrides=True)
    return parser


def validate_command(args: argparse.Namespace) -> int:
    """Handler of ``tune validate``: raises ConfigError (exit 2) listing every problem."""
    from torchtune.config import load_config, validate  # omegaconf and the components: only when used

    validate(load_config(args.config, args.overrides))
    print("Config is well-formed!")
    return 0
