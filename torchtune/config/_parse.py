"""The ``@config.parse`` decorator that turns a recipe's command line into its config."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, Sequence, Union

from omegaconf import DictConfig, OmegaConf

from torchtune import _recipe_registry as registry
from torchtune._errors import ConfigError, OverrideError, TuneError, UsageError, report_error
from torchtune._quiet import silence_known_noise
from torchtune.config._load import config_file, load_yaml_file, missing_config_message
from torchtune.config._utils import _merge_yaml_and_cli_args
from torchtune.config._validate import validate

OVERRIDE_HELP = """\
overrides (before or after --config), applied left to right, as torchtune's:
  key=value          set a key, or add it; dotted paths (optimizer.lr=2e-5), values typed as YAML
                     (ints, floats such as 2e-5, true/false, null or None, [1, 2])
  key=pkg.mod.Cls    on a node with _component_: swap the component, keep its other fields
  ~key               delete a key
  +key=value         add a key that is not in the config (an error if it is there)
a misspelled key is reported by the recipe's key check and the component checks.
set TUNE_DEBUG=1 to see Python tracebacks of errors."""


def _recipe_name(argv0: str) -> str:
    return Path(argv0).stem


class TuneRecipeArgumentParser(argparse.ArgumentParser):
    """torchtune's recipe argument parser: ``--config NAME_OR_PATH`` and ``key=value`` overrides.

    ``parse_known_args`` loads the config and returns its top-level keys as the namespace (values not
    resolved: ``${...}`` stays as written) and the overrides, in order, as the unknown arguments; a flag
    other than ``--config`` is an error. ``_merge_yaml_and_cli_args`` then applies the overrides.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        super().add_argument(
            "--config",
            type=str,
            metavar="NAME_OR_PATH",
            help="built-in config name (see `tune ls`) or path to a YAML file",
            required=True,
        )

    config_path: Optional[str] = None  # the --config value parse_known_args read, named in override errors
    # The paragraph given when --config is missing (the recipe's built-in configs), instead of argparse's line.
    missing_config: Optional[str] = None

    def error(self, message: str) -> NoReturn:
        if self.missing_config and "--config" in message and "required" in message:
            raise UsageError(self.missing_config)
        super().error(message)

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> tuple[Any, list[str]]:
        namespace, overrides = super().parse_known_args(args, namespace)
        flags = [arg for arg in overrides if arg.startswith("--")]
        if flags:
            raise OverrideError(
                f"Additional flag arguments not supported: {flags}. Please use --config or key=value overrides "
                "(e.g. batch_size=4, ~key to delete a key)."
            )
        cfg = load_yaml_file(config_file(namespace.config))
        if "config" in cfg:
            raise ConfigError("A config file cannot have a top-level key named 'config' (it is the --config option).")
        self.set_defaults(**OmegaConf.to_container(cfg, resolve=False))
        namespace, overrides = super().parse_known_args(args, None)
        self.config_path = namespace.config
        del namespace.config
        return namespace, overrides


def _argument_parser(prog: str, description: Optional[str]) -> TuneRecipeArgumentParser:
    return TuneRecipeArgumentParser(
        prog=prog,
        description=description,
        allow_abbrev=False,
        epilog=OVERRIDE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def parse_args(argv: Sequence[str], prog: str = "recipe", description: Optional[str] = None) -> DictConfig:
    """Parse ``--config NAME_OR_PATH key=value ...`` into the loaded, overridden, validated config."""
    parser = _argument_parser(prog, description)
    parser.missing_config = missing_config_message(prog if registry.get_recipe(prog) else None)
    yaml_args, cli_args = parser.parse_known_args(list(argv))
    cfg = _merge_yaml_and_cli_args(yaml_args, cli_args, source=parser.config_path)
    validate(cfg)
    return cfg


def parse(recipe_main: Callable[[DictConfig], Any]) -> Callable[..., Any]:
    """Decorate ``recipe_main(cfg)`` so that it reads its config from the command line.

    Called with no argument it parses ``sys.argv[1:]`` (``--config NAME_OR_PATH key=value ...``) and, as
    torchtune's decorator does, ends the process with ``sys.exit`` (the int ``recipe_main`` returns, else
    0); with a list it parses that list and returns what the recipe returns; with a DictConfig it runs on
    that config directly. A TuneError (from parsing or from the recipe) is printed as one paragraph and ends
    the process with its
    exit status (2 for usage/config errors, 1 otherwise); ``TUNE_DEBUG=1`` adds the traceback.
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
            result = recipe_main(cfg)
        except TuneError as exc:
            sys.exit(report_error(exc))
        if argv is None:  # the exit status: an int the recipe returns, else 0 (a returned value is not one)
            sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)
        return result

    return wrapper
