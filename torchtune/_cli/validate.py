"""``tune validate CONFIG [--recipe RECIPE] [--config-only] [key=value ...]``: what ``tune run`` would say
before it reads any weight, in about a second.

Three kinds of checks, each with the message ``tune run`` gives (the same functions run):

* generic ones (``torchtune.config.validate``): YAML, overrides, every ``_component_`` exists and its
  keys are arguments of that callable, every ``${...}`` resolves;
* the recipe's own: its module-level ``validate_config(cfg)`` (keys the recipe reads, value ranges,
  settings that conflict, dtype and device spellings), the same function its ``__init__`` runs first;
* the inputs, reading no tensor data (``torchtune.training.check_inputs``, the recipe's set-up up to the
  weights): output_dir, the resume state's metadata, the tokenizer file, the data (columns, template,
  first examples tokenized, steps per epoch), the checkpoint's config.json and safetensors headers
  against the model built on the meta device. ``--config-only`` skips them (weights not downloaded yet).

A built-in config knows its recipe (``torchtune/_recipe_registry.py``), and so does a copy made by
``tune cp`` (its first line, ``# tune-recipe: NAME``) and a torchtune config (the ``tune run ... RECIPE
--config`` command in its top comments); for another YAML file name it with ``--recipe``, or only the
generic checks run (``Config is well-formed!`` on stdout, what was not run on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from torchtune import _recipe_registry as registry
from torchtune._cli.run import load_recipe_module

RECIPE_CHECK = "validate_config"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune validate``."""
    parser = subparsers.add_parser(
        "validate",
        help="check a config",
        description="Check a config without running it: YAML syntax, overrides, every _component_ exists and "
        "its keys match the callable's arguments, every ${...} resolves; then the recipe's own checks "
        "(its validate_config: keys, value ranges, conflicting settings, dtype); then the inputs as `tune run` "
        "reads them before the weights (output_dir, resume state, tokenizer, data head, checkpoint headers "
        "against the model on the meta device), reading no tensor data. A Hub dataset is loaded into the "
        "cache the run then reuses.",
        epilog="A built-in config, or a copy made by `tune cp` (its first line names the recipe), is checked with "
        "its own recipe. For another YAML name the recipe with --recipe (a built-in name or a .py file), e.g.\n"
        "  tune validate ./my_config.yaml --recipe full_finetune_single_device",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", metavar="CONFIG", nargs="?", help="built-in config name or path to a YAML file")
    parser.add_argument(
        "--config", dest="config_option", metavar="CONFIG", help="the same, spelled as `tune run` takes it"
    )
    parser.add_argument(
        "--recipe",
        metavar="RECIPE",
        default=None,
        help="the recipe whose checks to run: a built-in recipe name or a recipe .py file "
        "(default: the recipe of a built-in config)",
    )
    parser.add_argument(
        "--config-only",
        action="store_true",
        help="only the config checks: open no tokenizer, data or checkpoint file (e.g. before downloading them)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides to check too")
    parser.set_defaults(func=validate_command, accepts_overrides=True)
    return parser


def _recipe_path(args: argparse.Namespace) -> tuple[Optional[Path], Optional[str]]:
    """(the recipe file whose checks to run, its name), or (None, None) when no recipe is known."""
    from torchtune._cli.run import resolve_recipe_path

    if args.recipe:
        path = resolve_recipe_path(args.recipe)
        return path, registry.get_recipe(args.recipe).name if registry.get_recipe(args.recipe) else path.name
    recipe = registry.recipe_for_config(args.config)
    if recipe is None:
        return None, None
    return recipe.path, recipe.name


def validate_command(args: argparse.Namespace) -> int:
    """Handler of ``tune validate``: raises ConfigError (exit 2) naming every problem found."""
    from torchtune._errors import UsageError
    from torchtune.config import load_config, validate  # omegaconf: only when used

    if args.config_option and args.config and ("=" in args.config or args.config.startswith("~")):
        args.overrides, args.config = [args.config, *args.overrides], None  # `--config X key=value`: an override
    if args.config and args.config_option:
        raise UsageError(
            f"Two configs given ({args.config} and --config {args.config_option}): `tune validate` checks one. "
            "Pass it once, as `tune validate CONFIG` or `tune validate --config CONFIG`."
        )
    args.config = args.config or args.config_option
    if not args.config:
        raise UsageError("No config given: `tune validate CONFIG [key=value ...]` (a built-in name or a YAML path).")
    cfg = load_config(args.config, args.overrides)
    path, name = _recipe_path(args)  # before the checks: a wrong --recipe is reported first
    validate(cfg, import_components=False)
    if path is None:
        names = ", ".join(r.name for r in registry.get_all_recipes())
        print("Config is well-formed!")  # torchtune's line, alone on stdout
        print(
            "Checked: YAML, overrides, components and their keys. Not run: a recipe's own checks (the keys it reads, "
            "value ranges, conflicting settings, dtype) and those of the input files (tokenizer, data, checkpoint "
            f"headers), because {args.config} is not a built-in config, a copy made by `tune cp`, nor a config whose "
            "comments name its `tune run` recipe. Name its recipe to run them: "
            f"--recipe NAME ({names}) or --recipe path/to/recipe.py.",
            file=sys.stderr,
        )
        return 0
    module = load_recipe_module(path)
    check = getattr(module, RECIPE_CHECK, None)
    if check is None:
        print(
            f"Config is well-formed (generic checks). Not run: recipe checks and input checks, because the recipe "
            f"{path} has no module-level {RECIPE_CHECK}(cfg) function."
        )
        return 0
    check(cfg)
    print(f"Config is well-formed, and passes the checks of the {name} recipe ({RECIPE_CHECK}).")
    from torchtune.training import config_notes

    for note in config_notes(cfg, distributed=bool(getattr(module, "DISTRIBUTED", False))):
        print(f"Note: {note}")
    if args.config_only:
        print("Not run (--config-only): the checks of the tokenizer, data and checkpoint files.")
        return 0
    from torchtune.training import check_inputs

    sys.stdout.flush()  # the line above comes before any message of the input checks
    done = check_inputs(cfg, distributed=bool(getattr(module, "DISTRIBUTED", False)))
    print("Inputs checked as `tune run` reads them before the weights (no tensor data read):")
    for line in done:
        print(f"  - {line}")
    return 0
