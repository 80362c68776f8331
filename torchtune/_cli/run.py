"""``tune run RECIPE --config CONFIG [key=value ...]``: run a built-in or local recipe script."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import runpy
import sys
from pathlib import Path
from types import ModuleType

from torchtune import _recipe_registry as registry
from torchtune._errors import TuneError, UsageError, report_error

EPILOG = """\
RECIPE is a built-in recipe name (see `tune ls`) or a path to a recipe .py file; CONFIG is a built-in
config name or a path to a YAML file. The recipe runs as a script with
    sys.argv = [RECIPE_FILE, "--config", CONFIG_FILE, key=value ...]
so its @config.parse decorator loads the config and applies the overrides.

overrides: key=value (dotted keys, YAML values: optimizer.lr=2e-5), ~key deletes a key,
+key=value adds one, key=pkg.mod.Cls swaps the component of a _component_ node.

Several processes: torchrun's options go between `run` and RECIPE, exactly as torchrun takes them
(--nproc_per_node, --nnodes, --node_rank, --rdzv-backend, --rdzv-endpoint, --rdzv-id, --standalone,
--max-restarts ...; see `torchrun --help`); `tune run` then hands the launch to torch.distributed.run,
which starts the recipe once per process. Only distributed recipes (full_finetune_distributed) take
them; the config is checked once, before any process starts.

examples:
  tune run full_finetune_single_device --config llama2/tiny_full max_steps_per_epoch=4
  tune full_finetune_single_device --config ./my_config.yaml optimizer.lr=2e-5
  tune run --nproc_per_node 2 full_finetune_distributed --config llama2/tiny_full_distributed
  tune run --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id job1 \
      full_finetune_distributed --config llama2/70B_full_distributed
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


def load_recipe_module(path: Path) -> ModuleType:
    """Import the recipe file at ``path`` as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location(f"_tune_validate_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise TuneError(f"Cannot load the recipe file {path} as Python.")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # as `tune run` does: sibling imports of a copied recipe work
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


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
    check_config_header(args.recipe, config_path)
    return run_recipe(recipe_path, ["--config", str(config_path), *args.overrides])


def check_config_header(recipe: str, config_path: Path) -> None:
    """A config copied by ``tune cp`` names its recipe in its first line; running it with another built-in
    recipe would fail on the keys only after that recipe's imports, with a less direct message."""
    named = registry.header_recipe(config_path)
    if named is None or registry.get_recipe(recipe) is None or named == recipe:
        return
    raise UsageError(
        f"{config_path} was copied for the {named} recipe (its '{registry.RECIPE_HEADER}' line), not {recipe}. "
        f"Run it with `tune run {named} --config {config_path}`, or, if you adapted it for {recipe}, change that "
        f"line to '{registry.RECIPE_HEADER} {recipe}'."
    )


def is_launcher_invocation(argv: list[str]) -> bool:
    """True for ``tune run --<torchrun option> ... RECIPE ...`` (``argv`` after ``run``)."""
    return bool(argv) and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--config")


def _fixed_world_size(nnodes: str, nproc_per_node: str) -> int | None:
    """Processes in all, when torchrun's options fix it (``N`` or ``N:N`` nodes, a number per node)."""
    low, _, high = str(nnodes).partition(":")
    try:
        nodes, per_node = int(low), int(nproc_per_node)
        if high and int(high) != nodes:
            return None  # elastic: the number of nodes is known only at rendezvous
    except ValueError:
        return None  # e.g. --nproc_per_node gpu / auto
    return nodes * per_node


def launch_distributed(argv: list[str]) -> int:
    """``tune run TORCHRUN_OPTIONS RECIPE --config CONFIG [key=value ...]``: check, then torchrun.

    The recipe must be a distributed one (module-level ``DISTRIBUTED = True``); the config passes the
    generic checks and the recipe's ``validate_config`` here, once, so a mistake is one message and no
    process is started; a ``batch_size`` that does not split over a fixed number of processes too.
    Then ``torch.distributed.run`` starts the recipe script once per process.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from torchtune.config import load_config, validate
    from torchtune.config._load import missing_config_message, resolve_config_path

    args = torchrun.get_args_parser().parse_args(argv)
    recipe_path = resolve_recipe_path(args.training_script)
    rest = argparse.ArgumentParser(prog="tune run", add_help=False)
    rest.add_argument("--config")
    rest.add_argument("overrides", nargs="*")
    ns = rest.parse_intermixed_args(args.training_script_args)
    module = load_recipe_module(recipe_path)
    if not getattr(module, "DISTRIBUTED", False):
        raise UsageError(
            f"torchrun options ({' '.join(a for a in argv[: argv.index(args.training_script)] if a.startswith('-'))}) "
            f"were given, but the recipe {args.training_script} runs in one process and would train the same model "
            "once per process. Use full_finetune_distributed (same config keys, plus the dist_/fsdp_ ones: start from "
            "`tune cp llama2/tiny_full_distributed .`), or drop the torchrun options."
        )
    if not ns.config:
        name = args.training_script if registry.get_recipe(args.training_script) else None
        raise UsageError(missing_config_message(name))
    config_path = resolve_config_path(ns.config)
    cfg = load_config(str(config_path), ns.overrides)
    validate(cfg, import_components=False)
    check = getattr(module, "validate_config", None)
    if check is not None:
        check(cfg)
    world = _fixed_world_size(args.nnodes, args.nproc_per_node)
    batch_size = cfg.get("batch_size")
    if world is not None and isinstance(batch_size, int) and batch_size % world:
        raise UsageError(
            f"batch_size={batch_size} (the global batch) does not split evenly over {world} processes "
            f"(--nnodes {args.nnodes} x --nproc_per_node {args.nproc_per_node}). Set batch_size to a multiple of "
            f"{world}, or start a number of processes that divides it."
        )
    args.training_script = str(recipe_path)
    args.training_script_args = ["--config", str(config_path), *ns.overrides]
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        failed = sorted(exc.failures.items())
        codes = ", ".join(f"rank {rank}: exit code {f.exitcode}" for rank, f in failed)
        print(f"{len(failed)} process(es) of the run failed ({codes}); their messages are above.", file=sys.stderr)
        return max((f.exitcode for _, f in failed if f.exitcode > 0), default=1)
    return 0
