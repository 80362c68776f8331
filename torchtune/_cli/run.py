"""``tune run RECIPE --config CONFIG [key=value ...]``: run a built-in or local recipe script."""

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
        allow_abbrev=False,
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
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from torchtune._quiet import quiet_launcher
    from torchtune.config import load_config, validate
    from torchtune.config._load import missing_config_message, resolve_config_path
    from torchtune.training._launch_report import LAUNCH_REPORT_ENV, read_launch_reports

    args = torchrun.get_args_parser().parse_args(argv)
    recipe_path = resolve_recipe_path(args.training_script)
    rest = argparse.ArgumentParser(prog="tune run", add_help=False, allow_abbrev=False)
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
    launch = _Launch(
        options=argv[: argv.index(args.training_script)],
        recipe=args.training_script,
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
        from torchtune.training._resume import resume_command

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
        from torchtune.training._run_control import stop_message

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
