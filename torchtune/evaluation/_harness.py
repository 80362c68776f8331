"""Running lm-evaluation-harness tasks on a torchtune model: finding lm-eval, resolving the tasks a
config names, running them, and writing the results.

lm-eval is optional (``pip install "plaintune[eval]"``); it is imported when an eval runs, never when
torchtune is imported.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import functools
import importlib.metadata
import json
import logging
import math
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from omegaconf import ListConfig, OmegaConf

from torchtune._assets import asset_path
from torchtune._errors import ConfigError, TuneError

log = logging.getLogger("torchtune")

# The versions the tests run on; pyproject.toml's `eval` extra asks for the same range.
LM_EVAL_RANGE = (">=0.4.13", "<0.5")
INSTALL_COMMAND = f'pip install "lm-eval{",".join(LM_EVAL_RANGE)}"'
# The tasks that ship with torchtune (torchtune/assets/demo/eval/): offline, on the demo data.
BUNDLED_TASKS_DIR = "demo/eval"


def import_lm_eval() -> Any:
    """The ``lm_eval`` module, or a ``TuneError`` with the one command that installs it.

    Raises:
        TuneError: lm-eval is not installed, or is older than the tested range.
    """
    try:
        import lm_eval
    except ImportError as exc:
        raise TuneError(
            f"Evaluating needs EleutherAI's lm-evaluation-harness, which is not installed: {INSTALL_COMMAND}"
        ) from exc
    version = importlib.metadata.version("lm-eval")
    major_minor_patch = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    if major_minor_patch < (0, 4, 13):
        raise TuneError(f"lm-eval {version} is older than the versions torchtune is tested with: {INSTALL_COMMAND}")
    if major_minor_patch >= (0, 5):
        log.warning("lm-eval %s is newer than the versions torchtune is tested with (%s).", version, INSTALL_COMMAND)
    return lm_eval


# --------------------------------------------------------------------------------------------------
# settings


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and how: the ``tasks``, ``limit``, ``num_fewshot``, ``batch_size`` and
    ``max_seq_length`` keys of a config (the eval recipe's top level, or the finetune recipe's
    ``eval_after_training`` node)."""

    tasks: tuple[str, ...]
    limit: Optional[float] = None
    num_fewshot: Optional[int] = None
    batch_size: int = 8
    max_seq_length: Optional[int] = None
    seed: int = 1234

    def as_dict(self) -> dict[str, Any]:
        return {
            "tasks": list(self.tasks),
            "limit": self.limit,
            "num_fewshot": self.num_fewshot,
            "batch_size": self.batch_size,
            "max_seq_length": self.max_seq_length,
            "seed": self.seed,
        }


def _whole(value: Any, key: str, minimum: int, allow_none: bool) -> Optional[int]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        none = ", or null" if allow_none else ""
        raise ConfigError(f"{key} must be a whole number of at least {minimum}{none}; got {value!r}.")
    return value


def eval_settings(node: Any, prefix: str = "", seed: int = 1234) -> EvalSettings:
    """Check and read the eval keys of ``node`` (``prefix`` names the node in messages, e.g.
    ``"eval_after_training."``). Needs no lm-eval: ``tune validate`` runs it.

    Raises:
        ConfigError: naming the key and what it must be.
    """
    tasks = node.tasks
    if isinstance(tasks, str):
        tasks = [tasks]
    if isinstance(tasks, (ListConfig, list, tuple)):
        tasks = list(OmegaConf.to_container(tasks) if isinstance(tasks, ListConfig) else tasks)
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise ConfigError(
            f"{prefix}tasks must list lm-eval task names or paths of task YAML files, e.g. "
            f"{prefix}tasks=[truthfulqa_mc2] or {prefix}tasks=[demo_mc]; got {node.tasks!r}."
        )
    limit = node.limit
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0:
            raise ConfigError(
                f"{prefix}limit must be a number of examples per task (e.g. 100), a fraction of each task below 1 "
                f"(e.g. 0.1), or null for all; got {limit!r}."
            )
        if limit >= 1 and not float(limit).is_integer():
            raise ConfigError(f"{prefix}limit of 1 or more counts examples and must be whole; got {limit!r}.")
    return EvalSettings(
        tasks=tuple(t.strip() for t in tasks),
        limit=limit,
        num_fewshot=_whole(node.num_fewshot, f"{prefix}num_fewshot", 0, allow_none=True),
        batch_size=_whole(node.batch_size, f"{prefix}batch_size", 1, allow_none=False),
        max_seq_length=_whole(node.max_seq_length, f"{prefix}max_seq_length", 2, allow_none=True),
        seed=seed,
    )


# --------------------------------------------------------------------------------------------------
# tasks


@dataclass
class ResolvedTasks:
    """The tasks of a config as lm-eval loads them: ``specs`` (names, and YAML files as absolute
    paths) and a ``task_manager`` that indexes them."""

    specs: list[str]
    task_manager: Any
    include_paths: list[str] = field(default_factory=list)


def _looks_like_path(task: str) -> bool:
    return task.endswith((".yaml", ".yml")) or os.sep in task or "/" in task


def resolve_tasks(tasks: Sequence[str]) -> ResolvedTasks:
    """Check that every task exists and say how lm-eval finds it.

    A name is an lm-eval task, group or tag (shell-style wildcards as in lm-eval's ``--tasks``, e.g.
    ``mmlu_*``), or one of the bundled offline tasks (``demo_mc``, ``demo_gen``); a path is a task YAML
    file, whose folder is also indexed (for its ``include:`` files and groups). Only the bundled and
    given folders are indexed when they hold every task asked for; lm-eval's full index (thousands of
    tasks, ~10-20 s to build) only when a name needs it.

    Raises:
        TuneError: a missing YAML file, or an unknown name (with the closest known names).
    """
    include = [str(asset_path(BUNDLED_TASKS_DIR))]
    specs: list[str] = []
    names: list[str] = []
    for task in tasks:
        if _looks_like_path(task):
            path = Path(task).expanduser()
            if not path.is_file():
                raise TuneError(
                    f"The task file {path} (in tasks) does not exist. Give an lm-eval task name (e.g. "
                    "truthfulqa_mc2) or the path of a task YAML file."
                )
            path = path.resolve()
            if str(path.parent) not in include:
                include.append(str(path.parent))
            specs.append(str(path))
        else:
            names.append(task)
            specs.append(task)
    manager = _task_manager(tuple(include), include_defaults=False)
    if any(not _known(name, manager.all_tasks) for name in names):
        manager = _task_manager(tuple(include), include_defaults=True)  # with lm-eval's own tasks
    expanded: list[str] = []
    for spec in specs:
        if spec in names and any(c in spec for c in "*?["):
            matches = sorted(fnmatch.filter(manager.all_tasks, spec))
            if not matches:
                raise TuneError(f"tasks: no lm-eval task matches {spec!r}. {_known_hint(spec, manager.all_tasks)}")
            expanded.extend(matches)
        elif spec in names and spec not in manager.all_tasks:
            raise TuneError(f"tasks: {spec!r} is not an lm-eval task. {_known_hint(spec, manager.all_tasks)}")
        else:
            expanded.append(spec)
    return ResolvedTasks(specs=expanded, task_manager=manager, include_paths=include)


@functools.lru_cache(maxsize=4)
def _task_manager(include: tuple[str, ...], include_defaults: bool) -> Any:
    """lm-eval's index of the task YAMLs under ``include`` (and its own, with ``include_defaults``).
    Kept for the process: the full index takes 10-20 s to build and the YAML files do not change under
    a running eval (the finetune checks its tasks at start-up and runs them at the end)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include), include_defaults=include_defaults)


def _known(name: str, known: Sequence[str]) -> bool:
    if any(c in name for c in "*?["):
        return bool(fnmatch.filter(known, name))
    return name in set(known)


def _known_hint(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.6)
    if not close:
        return "`lm-eval ls tasks` lists every task; a task YAML file can be given by its path."
    return "Did you mean " + ", ".join(close) + "? (`lm-eval ls tasks` lists every task.)"


# --------------------------------------------------------------------------------------------------
# running


def _needs_network(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a failed download: offline mode or no connection."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kind = type(exc)
        text = f"{kind.__module__}.{kind.__name__} {exc}"
        if isinstance(exc, (ConnectionError, TimeoutError)) or any(
            word in text
            for word in ("OfflineModeIsEnabled", "LocalEntryNotFoundError", "Couldn't reach", "ConnectTimeout")
        ):
            return True
        if kind.__module__.split(".")[0] in {"requests", "urllib3", "httpx", "httpcore"} and (
            "Connect" in kind.__name__ or "Timeout" in kind.__name__
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _DropCustomDatasetHint(logging.Filter):
    """lm-eval warns on every task with a ``custom_dataset`` loader (the bundled tasks) that such loaders
    can take ``--metadata`` arguments: an lm-eval command-line flag these recipes do not have."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


def _quiet_git_hash() -> Optional[str]:
    """What lm-eval's ``get_git_commit_hash`` returns (``git describe --always`` in the working directory),
    with git's stderr captured: lm-eval's own call lets git print "fatal: not a git repository" on every
    evaluation run outside a git checkout."""
    import subprocess

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


@contextlib.contextmanager
def _git_hash_without_stderr(lm_eval: Any) -> Iterator[None]:
    """Inside: ``lm_eval.simple_evaluate`` records the git hash through ``_quiet_git_hash`` (lm-eval 0.4 imports
    ``get_git_commit_hash`` into its evaluator module and calls it there, once, at the end of a run)."""
    evaluator = getattr(lm_eval, "evaluator", None)
    own = getattr(evaluator, "get_git_commit_hash", None)
    if own is None:
        yield
        return
    evaluator.get_git_commit_hash = _quiet_git_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = own


def run_tasks(
    lm: Any, tasks: ResolvedTasks, settings: EvalSettings, *, reporting: bool = True
) -> Optional[dict[str, Any]]:
    """Run ``tasks`` on ``lm`` (an lm-eval ``LM``) with lm-eval's ``simple_evaluate``; returns its results.

    ``reporting=False`` on the processes of a torchrun world other than the one that reports: they run
    the same requests (a sharded model needs every rank in each forward), and lm-eval returns None there
    (it aggregates only where ``LOCAL_RANK`` is 0), so None is returned.

    Raises:
        TuneError: a task's data set must be downloaded and the Hugging Face Hub cannot be reached.
    """
    lm_eval = import_lm_eval()
    limit = settings.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    task_logger, hint_filter = logging.getLogger("lm_eval.api.task"), _DropCustomDatasetHint()
    task_logger.addFilter(hint_filter)
    # lm-eval logs a dozen INFO lines per task (seeds, splits, request counts) around the progress bars;
    # its warnings stay. A level the user set on its logger is kept.
    quieted = [lg for lg in (logging.getLogger("lm_eval"), logging.getLogger("lm-eval")) if lg.level == logging.NOTSET]
    for lg in quieted:
        lg.setLevel(logging.WARNING)
    try:
        with _git_hash_without_stderr(lm_eval):
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=list(tasks.specs),
                num_fewshot=settings.num_fewshot,
                limit=limit,
                task_manager=tasks.task_manager,
                log_samples=False,
                random_seed=settings.seed,
                numpy_random_seed=settings.seed,
                torch_random_seed=settings.seed,
                fewshot_random_seed=settings.seed,
            )
    except Exception as exc:
        if _needs_network(exc):
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TuneError(
                f"A task in tasks={list(settings.tasks)} needs to download its data set and the Hugging Face Hub "
                f"cannot be reached ({first_line}): run it once with network access to cache the data, or "
                "evaluate on a local task such as tasks=[demo_mc]."
            ) from exc
        raise
    finally:
        task_logger.removeFilter(hint_filter)
        for lg in quieted:
            lg.setLevel(logging.NOTSET)
    if results is None and reporting:
        raise TuneError("lm-eval returned no results (this process is not rank 0).")
    return results


def results_table(results: dict[str, Any]) -> str:
    """lm-eval's own markdown table of ``results`` (and of its groups, when there are any)."""
    from lm_eval.utils import make_table

    table = make_table(results)
    if results.get("groups"):
        table += "\n" + make_table(results, "groups")
    return table


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _finite(value: Any) -> Any:
    """NaN/inf (lm-eval's stderr of one example) as null: valid JSON for every reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def check_writable(path: Path, key: str = "results_file") -> Path:
    """Make sure ``path`` can be written before an eval of minutes or hours runs; returns it expanded.

    Raises:
        TuneError: naming ``key``, the path and the reason.
    """
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=f".{path.name}.", dir=path.parent):
            pass
    except OSError as exc:
        raise TuneError(
            f"{key}={path} cannot be written ({exc.strerror or exc}): set {key} to a file in a folder you can write to."
        ) from exc
    if path.is_dir():
        raise TuneError(f"{key}={path} is a folder: set {key} to a file name, e.g. {path / 'eval_results.json'}.")
    return path


def write_results(results: dict[str, Any], path: Path, extra: Optional[dict[str, Any]] = None) -> Path:
    """Write ``results`` (lm-eval's ``results``, ``groups``, ``versions``, ``n-shot``, ``n-samples`` and
    ``config``) and ``extra`` as JSON to ``path``, atomically (a reader never sees half a file)."""
    keep = ("results", "groups", "group_subtasks", "versions", "n-shot", "higher_is_better", "n-samples", "config")
    payload: dict[str, Any] = dict(extra or {})
    payload.update({k: results[k] for k in keep if k in results})
    text = json.dumps(_finite(json.loads(json.dumps(payload, default=_jsonable))), indent=2, sort_keys=False)
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    # A plain exclusive open, not mkstemp: mkstemp creates 0600 files, open() the umask's mode, which is
    # what the checkpoint files beside the results get (a reader of the checkpoint can read its scores).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def results_path(results_file: Any, checkpoint_dir: Any) -> Path:
    """Where an eval writes its scores: ``results_file``, or (null) ``eval_results.json`` next to the
    checkpoint it scores. The bundled demo weights lie inside the installed package, which is no place
    for a user's files: their scores go to ``eval_results.json`` in the working directory."""
    if results_file is not None:
        return Path(str(results_file)).expanduser()
    folder = Path(str(checkpoint_dir)).expanduser().resolve()
    package = Path(__file__).resolve().parents[1]
    if folder == package or package in folder.parents:
        return Path.cwd() / "eval_results.json"
    return folder / "eval_results.json"


def build_lm(model: Any, tokenizer: Any, settings: EvalSettings) -> Any:
    """``TuneLM`` over ``model`` and ``tokenizer`` with the batch size and sequence length of ``settings``."""
    import_lm_eval()
    from torchtune.evaluation._lm import TuneLM

    return TuneLM(
        model, tokenizer, max_seq_length=settings.max_seq_length, batch_size=settings.batch_size, seed=settings.seed
    )


def primary_scores(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` of ``results`` without the stderr entries (what a summary prints)."""
    scores: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            if "," not in key or "_stderr" in key or not isinstance(value, (int, float)):
                continue
            scores.setdefault(task, {})[key.split(",")[0]] = float(value)
    return scores


def score_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per primary score of ``after`` (a results file's content) against ``before``: both values and
    whether the change is one at all. Over a task of n questions an accuracy has a standard error (lm-eval
    reports it); a difference within two standard errors of the two runs combined is what a re-draw of the
    questions would give as often as not, so it is called no clear change rather than a gain or a loss."""
    lines = []
    old_scores, new_scores = primary_scores(before), primary_scores(after)
    for task, metrics in new_scores.items():
        n = after.get("results", {}).get(task, {}).get("sample_len")
        for metric, value in metrics.items():
            old = old_scores.get(task, {}).get(metric)
            head = f"lm-eval {task:8s} {metric:11s} {'-' if old is None else f'{old:.3f}'} -> {value:.3f}"
            if old is None:
                lines.append(head)
                continue
            errors = [_stderr(r, task, metric) for r in (before, after)]
            if any(e is None for e in errors):
                lines.append(head)
                continue
            band = 2 * math.sqrt(sum(e * e for e in errors))
            questions = f" over {n} questions" if n else ""
            if abs(value - old) > band:
                verdict = f"{'up' if value > old else 'down'} by more than two standard errors (+-{band:.3f})"
            else:
                verdict = f"no clear change: within two standard errors (+-{band:.3f}){questions}"
            lines.append(f"{head}  {verdict}")
    return lines


def _stderr(results: dict[str, Any], task: str, metric: str) -> Optional[float]:
    for key, value in results.get("results", {}).get(task, {}).items():
        if key.split(",")[0] == f"{metric}_stderr" and isinstance(value, (int, float)):
            return float(value)
    return None


__all__ = [
    "BUNDLED_TASKS_DIR",
    "EvalSettings",
    "INSTALL_COMMAND",
    "ResolvedTasks",
    "build_lm",
    "check_writable",
    "eval_settings",
    "import_lm_eval",
    "primary_scores",
    "results_path",
    "resolve_tasks",
    "results_table",
    "run_tasks",
    "score_changes",
    "write_results",
]
