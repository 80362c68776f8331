"""The ``@config.parse`` decorator that turns a recipe's command line into its config."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from omegaconf import DictConfig

from torchtune import _recipe_registry as registry
from torchtune._errors import TuneError, UsageError, report_error
from torchtune._quiet import silence_known_noise
from torchtune.config._load import load_config, missing_config_message
from torchtune.config._validate import validate

OVERRIDE_HELP = """\
overrides (after --config), applied left to right:
  key=value          set a key; dotted paths (optimizer.lr=2e-5), values typed as YAML
                     (ints, floats such as 2e-5, true/false, null, [1, 2])
  key=pkg.mod.Cls    on a node with _component_: swap the component, keep its other fields
  ~key               delete a key
  +key=value         add a key that is not in the config
set TUNE_DEBUG=1 to see Python tracebacks of errors."""


def _recipe_name(argv0: str) -> str:
    return Path(argv0).stem


def _argument_parser(prog: str, description: Optional[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        allow_abbrev=False,
        epilog=OVERRIDE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", metavar="NAME_OR_PATH", help="built-in config name (see `tune ls`) or path to a YAML file"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser


def parse_args(argv: Sequence[str], prog: str = "recipe", description: Optional[str] = None) -> DictConfig:
    """Parse ``--config NAME_OR_PATH key=value ...`` into the loaded, overridden, validated config."""
    parser = _argument_parser(prog, description)
    args = parser.parse_intermixed_args(list(argv))
    if not args.config:
        raise UsageError(missing_config_message(prog if registry.get_recipe(prog) else None))
    cfg = load_config(args.config, args.overrides)
    validate(cfg)
    return cfg


def parse(recipe_main: Callable[[DictConfig], Any]) -> Callable[..., Any]:
    """Decorate ``recipe_main(cfg)`` so that it reads its config from the command line.

    Called with no argument it parses ``sys.argv[1:]`` (``--config NAME_OR_PATH key=value ...``); with a
    list it parses that list; with a DictConfig it runs on that config directly. A TuneError (from
    parsing or from the recipe) is printed as one paragraph and ends the process with its exit status
    (2 for usage/config errors, 1 otherwise); ``TUNE_DEBUG=1`` adds the traceback.
    """
    description = recipe_main.__doc__ or recipe_main.__globals__.get("__doc__")

    @functools.wraps(recipe_main)
    def wrapper(argv: Union[None, Sequence[str], DictConfig] = None) -> Any:
        silence_known_noise()  # also when the recipe runs as `python recipe.py`, not through `tune`
        try:
            if isinstance(argv, DictConfig):
                cfg = argv
            else:
                prog = _recipe_name(sys.argv[0]) if sys.argv and sys.argv[0] else "recipe"
                cfg = parse_args(sys.argv[1:] if argv is None else argv, prog=prog, description=description)
            return recipe_main(cfg)
        except TuneError as exc:
            sys.exit(report_error(exc))

    return wrapper
