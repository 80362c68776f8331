"""``tune run RECIPE --config CONFIG [key=value ...]``: run a built-in or local recipe script."""

from __future__ import annotations

import argparse
import difflib
import runpy
import sys
from pathlib import Path

from torchtune import _recipe_registry as registry
from torchtune._errors import TuneError, UsageError, report_error

EPILOG = """\
RECIPE is a built-in recipe name (see `tune ls`) or a path to a recipe .py file; CONFIG is a built-in
config name or a path to a YAML file. The recipe runs as a script with
    sys.argv = [RECIPE_FILE, "--config", CONFIG_FILE, key=value ...]
so its @config.parse decorator loads the config and applies the overrides.

overrides: key=value (dotted keys, YAML values: optimizer.lr=2e-5), ~key deletes a key,
+key=value adds one, key=pkg.mod.Cls swaps the component of a _component_ node.

examples:
  tune run full_finetune_single_device --config llama2/tiny_full max_steps_per_epoch=4
  tune full_finetune_single_device --config ./my_config.yaml optimizer.lr=2e-5
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune run``."""
    parser = subparsers.add_parser(
        "run",
        help="run a recipe with a config",
        description="Run a recipe (built-in or a local .py file) with a config and key=value overrides.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", metavar="RECIPE", help="built-in recipe name or path to a recipe .py file")
    parser.add_argument("--config", metavar="CONFIG", help="built-in config name or path to a YAML file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.set_defaults(func=run_command, accepts_overrides=True)
    return parser


def resolve_recipe_path(name_or_path: str) -> Path:
    """A built-in recipe name or an existing ``.py`` path -> the script to run."""
    recipe = registry.get_recipe(name_or_path)
    if recipe is not None:
        if not recipe.path.is_file():
            raise TuneError(
                f"The built-in recipe '{recipe.name}' is registered but its file {recipe.path} is missing "
                "from this installation; reinstall plaintune or pass a path to a recipe .py file."
            )
        return recipe.path
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path.resolve()
    names = [r.name for r in registry.get_all_recipes()]
    close = difflib.get_close_matches(name_or_path, names, n=3)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    what = (
        f"Recipe file '{name_or_path}' does not exist."
        if name_or_path.endswith(".py")
        else f"'{name_or_path}' is neither a built-in recipe nor a recipe file."
    )
    raise UsageError(
        f"{what}{hint} Built-in recipes (see `tune ls`): {', '.join(names)}. To run your own recipe, pass "
        "the path to its .py file (start from a copy: `tune cp full_finetune_single_device ./my_recipe.py`)."
    )


def run_recipe(recipe_path: Path, argv: list[str]) -> int:
    """Run ``recipe_path`` as ``__main__`` with ``sys.argv = [recipe_path, *argv]``; return its exit status."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(recipe_path), *argv]
    sys.path.insert(0, str(recipe_path.parent))  # as `python recipe.py` would: sibling imports work
    try:
        runpy.run_path(str(recipe_path), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except TuneError as exc:  # raised outside the recipe's @config.parse (e.g. at import time)
        return report_error(exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``tune run``."""
    from torchtune.config._load import missing_config_message, resolve_config_path

    recipe_path = resolve_recipe_path(args.recipe)
    if not args.config:
        name = args.recipe if registry.get_recipe(args.recipe) else None
        raise UsageError(missing_config_message(name))
    config_path = resolve_config_path(args.config)
    return run_recipe(recipe_path, ["--config", str(config_path), *args.overrides])
