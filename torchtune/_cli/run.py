"""``tune run [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]``: run a built-in or local recipe script,
as torchtune's ``tune run`` does (its ``Run`` class, with ``_run_single_device`` and ``_run_distributed``)."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import runpy
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

from torchtune import _recipe_registry as registry
from torchtune._errors import TuneError, UsageError, report_error
from torchtune._scope import out_of_scope_message, out_of_scope_name

EPILOG = """\
RECIPE is a built-in recipe name (see `tune ls`) or a path to a recipe .py file; CONFIG is a built-in
config name or a path to a YAML file. The recipe runs as a script with
    sys.argv = [RECIPE_FILE, "--config", CONFIG_FILE, key=value ...]
so its @config.parse decorator loads the config and applies the overrides.

overrides: key=value (dotted keys, YAML values: optimizer.lr=2e-5), ~key deletes a key,
+key=value adds one, key=pkg.mod.Cls swaps the component of a _component_ node.

Several processes: torchrun's options go between `run` and RECIPE, exactly as torchrun takes them
(--nproc_per_node, --nnodes, --node_rank, --rdzv-backend, --rdzv-endpoint, --rdzv-id, --standalone,
--max-restarts ...; see `torchrun --help`), or after RECIPE; `tune run` then hands the launch to
torch.distributed.run, which starts the recipe once per process (standalone, on a free port, unless
--rdzv-endpoint is given, as torchtune's `tune run` does). Only distributed recipes
(full_finetune_distributed) take them; the config is checked once, before any process starts.

examples:
  tune run full_finetune_single_device --config llama2/tiny_full max_steps_per_epoch=4
  tune full_finetune_single_device --config ./my_config.yaml optimizer.lr=2e-5
  tune run --nproc_per_node 2 full_finetune_distributed --config llama2/tiny_full_distributed
  tune run --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id job1 \
      full_finetune_distributed --config llama2/70B_full
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune run`` (its help; ``tune.main`` hands ``tune run ...`` to ``Run``)."""
    parser = subparsers.add_parser(
        "run",
        help="run a recipe with a config",
        usage="tune run [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]",
        description="Run a recipe (built-in or a local .py file) with a config and key=value overrides.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", metavar="RECIPE", help="built-in recipe name or path to a recipe .py file")
    parser.add_argument("--config", metavar="CONFIG", help="built-in config name or path to a YAML file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.set_defaults(func=lambda args: Run(parser)._run_cmd(_argv_of(args)), accepts_overrides=True)
    return parser


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The command line after ``run`` that parsed into ``args`` (``tune.main`` passes that line to ``Run``
    itself; this is for callers of the parser)."""
    return [args.recipe, *(["--config", args.config] if args.config else []), *args.overrides]


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


def _recipe_arguments(recipe_args: list[str]) -> argparse.Namespace:
    """``--config CONFIG`` and the overrides among a recipe's arguments (flags other than --config are refused)."""
    rest = argparse.ArgumentParser(prog="tune run", add_help=False)
    rest.add_argument("--config")
    rest.add_argument("overrides", nargs="*")
    return rest.parse_intermixed_args(recipe_args)


def _config_value(recipe_args: list[str]) -> str | None:
    """The value of ``--config`` (``--config X`` or ``--config=X``) among a recipe's arguments, or None."""
    for i, arg in enumerate(recipe_args):
        if arg == "--config" and i + 1 < len(recipe_args):
            return recipe_args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def parse_run_args(argv: list[str]) -> argparse.Namespace:
    """``tune run``'s arguments (after ``run``) as torchrun's parser reads them, with torchtune's names: the
    recipe in ``recipe``, its arguments in ``recipe_args``, torchrun's options in the other fields, and
    ``launcher`` true when any was given. A torchrun option written after the recipe name is taken as if it
    came before it (a recipe takes no option but --config)."""
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    options = {o: a for a in parser._actions if a.dest != "help" for o in a.option_strings}
    ns = parser.parse_args(argv)
    before = argv[: len(argv) - len(ns.training_script_args) - 1]
    moved, recipe_args, rest = [], [], list(ns.training_script_args)
    while rest:
        arg = rest.pop(0)
        action = options.get(arg.split("=", 1)[0])
        if action is None or arg == "--config":
            recipe_args.append(arg)
            continue
        moved.append(arg)
        if action.nargs != 0 and "=" not in arg and rest:
            moved.append(rest.pop(0))
    if moved:
        ns = parser.parse_args([*before, *moved, ns.training_script, *recipe_args])
    ns.recipe, ns.recipe_args = ns.training_script, list(ns.training_script_args)
    ns.launch_options = [*before, *moved]  # as given, for the resume command a stopped run prints
    ns.launcher = bool(before or moved)
    return ns


class Run:
    """``tune run``, as torchtune's ``Run`` subcommand: ``_run_cmd`` parses the command line, checks that a
    config is given and that torchrun's options go to a recipe that runs on several processes, then calls
    ``_run_single_device`` or ``_run_distributed`` (``is_builtin``: the recipe is a built-in name)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser

    def _run_cmd(self, argv: list[str]) -> int:
        if not any(not a.startswith("-") for a in argv):
            self._parser.error("the following arguments are required: RECIPE (a built-in name or a .py file)")
        args = parse_run_args(argv)
        builtin = registry.get_recipe(args.recipe)
        kind = out_of_scope_name(args.recipe) if builtin is None and not args.recipe.endswith(".py") else None
        if kind is not None:
            raise UsageError(out_of_scope_message(f"The recipe '{args.recipe}'", kind))
        if _config_value(args.recipe_args) is None:
            from torchtune.config._load import missing_config_message

            raise UsageError(
                "The '--config' argument is required. " + missing_config_message(args.recipe if builtin else None)
            )
        if args.launcher:
            if builtin is not None and not builtin.supports_distributed:
                self._parser.error(
                    f"Recipe {args.recipe} does not support distributed training: it runs in one process and would "
                    "train the same model once per process. Use full_finetune_distributed (the same config keys, "
                    "plus the fsdp_ ones: start from `tune cp llama2/tiny_full_distributed .`), or drop the torchrun "
                    "options."
                )
            status = self._run_distributed(args, is_builtin=builtin is not None)
        else:
            status = self._run_single_device(args, is_builtin=builtin is not None)
        return status if isinstance(status, int) else 0

    def _run_single_device(self, args: argparse.Namespace, is_builtin: bool) -> int:
        """Run the recipe in this process: ``sys.argv = [RECIPE_FILE, "--config", CONFIG_FILE, key=value ...]``."""
        from torchtune.config._load import resolve_config_path

        recipe_path = resolve_recipe_path(args.recipe)
        ns = _recipe_arguments(args.recipe_args)
        config_path = resolve_config_path(ns.config)
        check_config_header(args.recipe, config_path)
        return run_recipe(recipe_path, ["--config", str(config_path), *ns.overrides])

    def _run_distributed(self, args: argparse.Namespace, is_builtin: bool) -> int:
        """Check the config once, then start the recipe once per process with torch.distributed.run."""
        return launch_distributed(args)


def launch_distributed(args: argparse.Namespace) -> int:
    """``tune run TORCHRUN_OPTIONS RECIPE --config CONFIG [key=value ...]`` (``args`` from ``parse_run_args``):
    check, then torchrun.

    The recipe must be a distributed one (module-level ``DISTRIBUTED = True``); the config passes the
    generic checks and the recipe's ``validate_config`` here, once, so a mistake is one message and no
    process is started; a ``global_batch_size`` that does not split over a fixed number of processes too.
    Then ``torch.distributed.run`` starts the recipe script once per process.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from torchtune._quiet import quiet_launcher
    from torchtune.config import load_config, validate
    from torchtune.config._load import resolve_config_path
    from torchtune.training.distributed._launch_report import LAUNCH_REPORT_ENV, read_launch_reports

    recipe_path = resolve_recipe_path(args.recipe)
    ns = _recipe_arguments(args.recipe_args)
    module = load_recipe_module(recipe_path)
    if not getattr(module, "DISTRIBUTED", False):
        raise UsageError(
            f"torchrun options were given, but the recipe {args.recipe} runs in one process and would train the "
            "same model once per process. Use full_finetune_distributed (same config keys, plus the dist_/fsdp_ ones: "
            "start from `tune cp llama2/tiny_full_distributed .`), or drop the torchrun options."
        )
    config_path = resolve_config_path(ns.config)
    cfg = load_config(str(config_path), ns.overrides)
    validate(cfg, import_components=False)
    check = getattr(module, "validate_config", None)
    if check is not None:
        check(cfg)
    world = _fixed_world_size(args.nnodes, args.nproc_per_node)
    global_batch = cfg.get("global_batch_size")
    if world is not None and isinstance(global_batch, int) and global_batch % world:
        raise UsageError(
            f"global_batch_size={global_batch} does not split evenly over {world} processes (--nnodes {args.nnodes} "
            f"x --nproc_per_node {args.nproc_per_node}). Set it to a multiple of {world}, start a number of "
            "processes that divides it, or set batch_size (per process) instead."
        )
    if not args.rdzv_endpoint:
        args.standalone = True  # as torchtune: a free port, so that several runs on one machine do not collide
    launch = _Launch(
        options=list(args.launch_options),
        recipe=args.recipe,
        config=ns.config,
        overrides=ns.overrides,
        checkpoints=Path(str(cfg.checkpointer.output_dir)).expanduser(),
    )
    args.training_script = str(recipe_path)
    args.training_script_args = ["--config", str(config_path), *ns.overrides]
    if args.shutdown_timeout is None and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in os.environ:
        # torchrun's default kills the processes 30 s after it forwards a stop signal: too short for the save
        # a stop makes of a large model
        args.shutdown_timeout = STOP_SAVE_TIMEOUT_S
    report_dir = Path(tempfile.mkdtemp(prefix="tune-run-"))
    os.environ[LAUNCH_REPORT_ENV] = str(report_dir)  # torchrun passes it on to every process
    print("Running with torchrun...")
    sys.stdout.flush()
    try:
        with quiet_launcher():
            torchrun.run(args)
    except SignalException as exc:  # this launcher got SIGINT/SIGTERM and forwarded it; the processes ended
        return launch.stopped(signal.Signals(exc.sigval).name, read_launch_reports(report_dir))
    except ChildFailedError as exc:
        return launch.failed(exc.failures, read_launch_reports(report_dir))
    finally:
        os.environ.pop(LAUNCH_REPORT_ENV, None)
        shutil.rmtree(report_dir, ignore_errors=True)
    return 0


# How long the launcher waits, after forwarding SIGINT/SIGTERM, for the processes to finish their step and save
# (torchrun's --shutdown_timeout; then it kills them). `--shutdown_timeout N` or TORCH_ELASTIC_SHUTDOWN_TIMEOUT
# set another.
STOP_SAVE_TIMEOUT_S = 600


@dataclass
class _Launch:
    """What the launcher knows of its run: the command line, and where its checkpoints go."""

    options: List[str]  # torchrun's options, as given
    recipe: str
    config: str
    overrides: List[str]
    checkpoints: Path

    def resume(self, recipe_state: Path) -> str:
        from torchtune.training.run._resume import resume_command

        argv = [self.recipe, "--config", self.config, *self.overrides]
        return resume_command(self.recipe, recipe_state, argv=argv, launch_options=self.options)

    def last_checkpoint(self) -> str:
        """Where to go on from: the newest complete resumable checkpoint and its resume command."""
        from torchtune.utils._checkpointing import RECIPE_STATE_NAME, find_latest_checkpoint

        latest = find_latest_checkpoint(self.checkpoints) if self.checkpoints.is_dir() else None
        if latest is None or not (latest / RECIPE_STATE_NAME).is_file():
            return f"No resumable checkpoint of this run is in {self.checkpoints}."
        return f"The last complete checkpoint is {latest}; resume with:\n  {self.resume(latest / RECIPE_STATE_NAME)}"

    def stopped(self, signal_name: str, reports: Dict[int, Dict[str, Any]]) -> int:
        """The run was stopped by ``signal_name``: rank 0's report says what it saved."""
        from torchtune.training.run._run_control import stop_message

        code = 128 + int(signal.Signals[signal_name])
        report = reports.get(0, {})
        if report.get("event") != "stopped":
            print(
                f"\nStopped by {signal_name} before the processes saved a checkpoint (during set-up, by a second "
                f"signal, or after the launcher's {STOP_SAVE_TIMEOUT_S} s wait). {self.last_checkpoint()}",
                file=sys.stderr,
            )
            return code
        folder = Path(report["folder"])
        from torchtune.utils._checkpointing import RECIPE_STATE_NAME

        resume = self.resume(folder / RECIPE_STATE_NAME) if report.get("resumable") else None
        print(stop_message(report["signal"], int(report["step"]), folder, resume), file=sys.stderr)
        return 128 + int(signal.Signals[report["signal"]])

    def failed(self, failures: Dict[int, Any], reports: Dict[int, Dict[str, Any]]) -> int:
        """Some processes ended with an error or were killed: one message, naming the process that ended first."""
        stop = reports.get(0, {})
        stop_codes = {128 + signal.SIGINT, 128 + signal.SIGTERM}
        if stop.get("event") == "stopped" and all(f.exitcode in stop_codes for f in failures.values()):
            return self.stopped(stop["signal"], reports)  # a signal sent to one process stopped them all
        lost = {rank for rank, r in reports.items() if r.get("event") == "lost_peer"}
        # a process ended by a signal torchrun did not send (torchrun ends the others with SIGTERM)
        killed = {
            rank: f
            for rank, f in failures.items()
            if f.exitcode < 0 and -f.exitcode != signal.SIGTERM and rank not in lost
        }
        if killed:
            names = "; ".join(
                f"Rank {rank} (pid {f.pid}) was killed by {_signal_name(-f.exitcode)}"
                for rank, f in sorted(killed.items())
            )
            others = len(failures) - len(killed)
            print(
                f"\n{names}{_kill_hint(killed)}. The other process{'es were' if others != 1 else ' was'} stopped. "
                f"{self.last_checkpoint()}",
                file=sys.stderr,
            )
            return 1
        if lost and not [rank for rank, f in failures.items() if rank not in lost and f.exitcode > 0]:
            print(
                f"\nThe processes of ranks {', '.join(map(str, sorted(lost)))} lost contact with another process of "
                f"the run, which is gone without a report. {self.last_checkpoint()}",
                file=sys.stderr,
            )
            return 1
        # an error: the process(es) printed it (rank 0 one message for all ranks)
        return max((f.exitcode for f in failures.values() if f.exitcode > 0), default=1)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_hint(killed: Dict[int, Any]) -> str:
    if any(-f.exitcode == signal.SIGKILL for f in killed.values()):
        return " (a `kill -9`, or the kernel's out-of-memory killer: `dmesg` says which)"
    if any(-f.exitcode in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT) for f in killed.values()):
        return " (a crash in native code: run again with TUNE_DEBUG=1 PYTHONFAULTHANDLER=1 to see where)"
    return ""
