"""Entry point of the ``tune`` command.

Each subcommand is a module in this package exposing ``add_parser(subparsers)``: it adds its parser
with ``subparsers.add_parser(...)`` and sets ``func=handler`` with ``handler(args) -> int`` (the exit
status). To add a subcommand, write the module and add its name to ``SUBCOMMANDS``; names whose module
is not there (yet) are skipped. Keep subcommand modules cheap to import (no torch at module level):
``tune ls`` and ``--help`` should answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Optional, Sequence

from torchtune import __version__
from torchtune._cli.run import Run  # torchtune's name here: its tests replace Run._run_single_device/_run_distributed
from torchtune._distribution import DISTRIBUTION, warn_if_other_torchtune
from torchtune._errors import TuneError, report_error
from torchtune._quiet import silence_known_noise

SUBCOMMANDS: tuple[str, ...] = (
    "run",
    "ls",
    "cp",
    "cat",
    "validate",
    "download",
    "export",
    "estimate_memory",
    "plot",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``tune`` parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="tune",
        allow_abbrev=False,
        description="Welcome to the torchtune CLI! (plaintune: torchtune's recipes, configs and commands in plain "
        "PyTorch)",
        epilog="Short form: `tune RECIPE --config CONFIG [key=value ...]` is `tune run RECIPE ...`.\n"
        "Set TUNE_DEBUG=1 to see Python tracebacks of errors.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s ({DISTRIBUTION}) {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in SUBCOMMANDS:
        module_name = f"torchtune._cli.{name}"  # a literal: this file also runs as __main__ (runpy)
        if importlib.util.find_spec(module_name) is None:
            continue
        importlib.import_module(module_name).add_parser(subparsers)
    for sub in subparsers.choices.values():
        sub.allow_abbrev = False  # an option is spelled out: `--config-o` is an error, never `--config-only`
    parser.set_defaults(command_names=frozenset(subparsers.choices))
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _is_recipe(arg: str) -> bool:
    from torchtune import _recipe_registry as registry
    from torchtune._scope import out_of_scope_recipe

    # a torchtune recipe this library does not ship goes to `tune run` too, which says so
    return arg.endswith(".py") or registry.get_recipe(arg) is not None or out_of_scope_recipe(arg) is not None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``tune`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    warn_if_other_torchtune()
    silence_known_noise()
    parser = build_parser()
    if argv and argv[0] not in parser.get_default("command_names") and _is_recipe(argv[0]):
        argv = ["run", *argv]  # short form: `tune RECIPE --config ...`
    try:
        if argv[:1] == ["run"] and not {"-h", "--help"} & set(argv[1:2]):
            # torchrun's options and the recipe's arguments: parsed by Run, as torchtune's `tune run` does
            return Run(_subparser(parser, "run"))._run_cmd(argv[1:])
        args, extra = parser.parse_known_args(argv)
        if args.command is None:  # `tune` alone: the help, as torchtune's prints it
            parser.print_help()
            return 0
        if extra:
            if not getattr(args, "accepts_overrides", False) or any(a.startswith("-") for a in extra):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            args.overrides = [*args.overrides, *extra]
        return int(args.func(args) or 0)
    except TuneError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # As torchtune's file run as a script: success returns (no SystemExit), a failure exits with its status.
    status = main()
    if status:
        sys.exit(status)
