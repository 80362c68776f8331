"""`tune estimate-memory` for the figure tests: each distinct command once per session, in this process, and
its output kept in ``tests/memory_estimates.json`` for as long as nothing it depends on changes.

An estimate traces a full-size model on fake tensors (about 10 s of CPU each, 2 to 60 s of wall time on a
busy 2-core machine), and the docs and config headers quote figures of 90 commands: too much for every
``make test``. So ``make test-estimates`` (``TUNE_TEST_ESTIMATES=1``) runs each command whose stored output is
stale, with Python's trace hook on, and stores, per command: what it printed, the CPU seconds it took, and
what it depended on:

- the source of every function, method, class body and module body of this repository that ran during the
  estimate, its imports included (``file``, qualified name), each as ``ast.unparse`` gives it with docstrings
  dropped and the classes and functions defined inside it left out but for the decorators and signatures of
  functions (those count where they ran themselves; ``_Stub``): a comment, a docstring, a line moved, a new
  helper or code that did not run changes nothing, any change to code that ran does;
- the config the command names, as YAML reads it (its comments, where the figures are quoted, left out);
- the release of torch, which the Makefile pins (its CPU and CUDA builds trace the same fake tensors). The
  versions of the optional packages an estimate can run (torchao, bitsandbytes, ...; not pinned) are stored
  beside the output but kept out of the key: a new release on the package index would otherwise make every
  stored output stale on a fresh clone at once. After upgrading one of them, run ``make test-estimates``.

Its key is the SHA-256 of all of these with the command. ``make test`` recomputes the key from the stored
dependency list and today's files: an output is used only when the key is the same, that is when the
estimator would run exactly the code it ran then, on the same config and packages. A stale command is run
again (without the trace hook) while the test process has budget left (``TUNE_ESTIMATE_BUDGET_S``, 240 s of
CPU per pytest worker by default); past it the test fails and names ``make test-estimates``, which refreshes the file.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "tests" / "memory_estimates.json"
REFRESH = os.environ.get("TUNE_TEST_ESTIMATES") == "1"
BUDGET_S = float(os.environ.get("TUNE_ESTIMATE_BUDGET_S", "240"))
# ``make test-estimates``: the stale commands run this many traced processes at a time
JOBS = int(os.environ.get("TUNE_ESTIMATE_JOBS") or os.cpu_count() or 1)
# the packages whose code an estimate runs besides torch's (the optimizers it measures, liger's stand-ins)
PACKAGES = ("torch", "torchao", "bitsandbytes", "apollo-torch", "galore-torch", "lomo-optim", "liger-kernel")
_SOURCES = ("torchtune", "recipes")

# a figure as the estimator prints it (two decimals, 1 GB = 1e9 bytes); "X / Y GB" quotes two
_FIGURES = re.compile(r"(?<![\d.])\d+\.\d\d(?:\s*/\s*\d+\.\d\d)*\s*GB")
_NUMBER = re.compile(r"\d+\.\d\d")


def gb_figures(text: str) -> list:
    """Every two-decimal GB figure of ``text`` as written (``"13.48"``), those of ``9.27 / 9.96 GB`` too."""
    return [number for match in _FIGURES.findall(text) for number in _NUMBER.findall(match)]


def command_argv(command: str) -> list:
    """``tune estimate-memory ...`` as the argv of ``torchtune._cli.tune.main`` (without ``tune``)."""
    words = shlex.split(command)
    if words[:2] != ["tune", "estimate-memory"]:
        raise ValueError(f"not a `tune estimate-memory` command: {command!r}")
    return words[1:]


# --- what an estimate depends on ------------------------------------------------------------------------


class _Scopes(ast.NodeVisitor):
    """The function, class and module scopes of one source file: qualified names (``A.f``, the n-th
    definition of a repeated name as ``A.f#n``), their line spans and normalized sources."""

    def __init__(self, tree: ast.Module) -> None:
        self.spans: List[Tuple[int, int, str]] = []  # (first line, last line, qualname), outer ones first
        self.by_start: Dict[Tuple[int, str], str] = {}  # (first line incl. decorators, name) -> qualname
        self.nodes: Dict[str, ast.AST] = {"<module>": tree}
        self._stack: List[str] = []
        self._seen: Dict[str, int] = {}
        self.generic_visit(tree)

    def _scope(self, node) -> None:
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        name = ".".join([*self._stack, node.name])
        self._seen[name] = self._seen.get(name, 0) + 1
        if self._seen[name] > 1:
            name = f"{name}#{self._seen[name]}"
        self.spans.append((start, node.end_lineno, name))
        self.by_start[(start, node.name)] = name
        self.nodes[name] = node
        self._stack.append(node.name)
        self.generic_visit(node)
        self._stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def qualname(self, first_line: int, name: str) -> str:
        """The scope a code object (its ``co_firstlineno``, ``co_name``) runs in: its own definition, or for a
        lambda, comprehension or generator expression the innermost definition around it."""
        if name == "<module>":
            return "<module>"
        found = self.by_start.get((first_line, name))
        if found is not None:
            return found
        inside = [q for start, end, q in self.spans if start <= first_line <= end]
        return inside[-1] if inside else "<module>"


class _Stub(ast.NodeTransformer):
    """A scope's own statements, for its digest. A nested class goes: its body runs where it is defined, so it is
    a scope of its own whenever its definition ran (bases and decorators included). A nested function keeps its
    decorators and signature (evaluated where it is defined) and loses its body (which counts where it runs);
    in a module body an undecorated function goes too (adding a helper to a module changes nothing that ran:
    a function that runs is a scope of its own, its signature included, and default values computed at import
    ran in the module's import, which is traced)."""

    def __init__(self, in_module: bool) -> None:
        self.in_module = in_module

    def visit_ClassDef(self, node):
        return None

    def _function(self, node):
        if self.in_module and not node.decorator_list:
            return None
        node = copy.copy(node)
        node.body = [ast.Expr(ast.Constant(...))]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _function


def _normalized(node: ast.AST) -> str:
    node = copy.deepcopy(node)
    body = list(getattr(node, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            body = body[1:]  # the docstring
    stub = _Stub(in_module=isinstance(node, ast.Module))
    node.body = [kept for kept in map(stub.visit, body) if kept is not None] or [ast.Pass()]
    return ast.unparse(node)


@functools.lru_cache(maxsize=None)
def _scopes(relpath: str) -> Optional[_Scopes]:
    path = REPO / relpath
    if not path.is_file():
        return None
    return _Scopes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))


@functools.lru_cache(maxsize=None)
def _scope_digest(relpath: str, qualname: str) -> Optional[str]:
    scopes = _scopes(relpath)
    node = scopes.nodes.get(qualname) if scopes is not None else None
    if node is None:
        return None
    return hashlib.sha256(_normalized(node).encode()).hexdigest()


def _versions() -> Dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def _config_text(command: str) -> str:
    """The config ``command`` names, as YAML reads it: comments (where its header quotes figures) left out."""
    import yaml

    from torchtune._cli.tune import build_parser
    from torchtune.config._load import resolve_config_path

    args = build_parser().parse_args(command_argv(command))
    loaded = yaml.safe_load(resolve_config_path(args.config).read_text(encoding="utf-8"))
    return json.dumps(loaded, sort_keys=True, default=str)


def key(command: str, dependencies: List[List[str]]) -> Optional[str]:
    """The key of ``command`` run on today's files with the recorded ``dependencies`` ([file, qualname], ...):
    None when one of them no longer exists (the code that ran is gone: stale)."""
    digests = []
    for relpath, qualname in dependencies:
        digest = _scope_digest(relpath, qualname)
        if digest is None:
            return None
        digests.append([relpath, qualname, digest])
    # the release without its build tag: the CPU build (2.13.0+cpu) and the CUDA one trace the same fake tensors
    torch_version = _versions()["torch"].split("+")[0]
    payload = {"command": command, "config": _config_text(command), "torch": torch_version, "code": digests}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _run_here(command: str, trace: bool) -> Tuple[str, float, List[List[str]]]:
    """(what ``command`` printed, its CPU seconds, the scopes of this repository that ran, when ``trace``)."""
    ran: Set[Tuple[str, int, str]] = set()
    roots = tuple(str(REPO / name) + os.sep for name in _SOURCES)

    def hook(frame, event, arg):  # called once per new frame; no line events
        code = frame.f_code
        if code.co_filename.startswith(roots):
            ran.add((code.co_filename, code.co_firstlineno, code.co_name))

    out = io.StringIO()
    started = time.process_time()
    if trace:
        sys.settrace(hook)
        threading.settrace(hook)
    try:
        # imported here, traced when ``trace``: the class bodies and import-time calls of every module count
        from torchtune._cli.tune import main

        with contextlib.redirect_stdout(out):
            returncode = main(command_argv(command))
    finally:
        if trace:
            sys.settrace(None)
            threading.settrace(None)
    seconds = time.process_time() - started
    if returncode != 0:
        raise AssertionError(f"`{command}` exited with {returncode}:\n{out.getvalue()[-3000:]}")
    # every module body of this repository that ran in this process (imports before the hook was on too)
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None) or ""
        if filename.startswith(roots) and filename.endswith(".py"):
            ran.add((filename, 1, "<module>"))
    scopes = set()
    for filename, first_line, name in ran:
        relpath = Path(filename).relative_to(REPO).as_posix()
        found = _scopes(relpath)
        if found is not None:
            scopes.add((relpath, found.qualname(first_line, name)))
    return out.getvalue(), seconds, [list(s) for s in sorted(scopes)]


def _run(command: str, trace: bool) -> Tuple[str, float, List[List[str]]]:
    """``_run_here``; traced, in a new process: an estimate run earlier in this one could have filled a cache
    (a measured optimizer layout, an lru_cache) that lets this one skip code it depends on, which the trace
    would then not see."""
    if not trace:
        return _run_here(command, trace=False)
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        code = (
            "import json, sys\n"
            "from tests._helpers.estimate_memory import _run_here\n"
            "output, seconds, dependencies = _run_here(sys.argv[1], trace=True)\n"
            "json.dump([output, seconds, dependencies], open(sys.argv[2], 'w'))\n"
        )
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        done = subprocess.run(
            [sys.executable, "-c", code, command, str(result)], cwd=REPO, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise AssertionError(f"`{command}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        output, seconds, dependencies = json.loads(result.read_text())
    return output, seconds, dependencies


# --- the stored outputs ----------------------------------------------------------------------------------


class StaleEstimate(AssertionError):
    """A command's stored output is stale and the session's budget for running estimates is spent."""


_spent = [0.0]


@functools.lru_cache(maxsize=None)
def _stored() -> Dict[str, dict]:
    """The stored outputs by command, each entry's dependencies as ``[[file, qualname], ...]``."""
    if not CACHE.is_file():
        return {}
    stored = json.loads(CACHE.read_text(encoding="utf-8"))
    for entry in stored.values():
        entry["dependencies"] = [[f, q] for f, names in sorted(entry["dependencies"].items()) for q in names]
    return stored


def _write(stored: Dict[str, dict]) -> None:
    """One line per command (a refresh changes the lines of the commands it ran), each entry's dependencies
    grouped by file: ``{file: [qualname, ...]}``."""
    lines = []
    for command, entry in sorted(stored.items()):
        by_file: Dict[str, List[str]] = {}
        for relpath, qualname in entry["dependencies"]:
            by_file.setdefault(relpath, []).append(qualname)
        compact = {**entry, "dependencies": {f: sorted(names) for f, names in sorted(by_file.items())}}
        lines.append(f"{json.dumps(command)}: {json.dumps(compact)}")
    CACHE.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def fresh(command: str) -> bool:
    """Whether the stored output of ``command`` was printed by exactly today's code, config and packages."""
    entry = _stored().get(command)
    return entry is not None and key(command, entry["dependencies"]) == entry["key"]


@functools.lru_cache(maxsize=None)
def printed(command: str) -> str:
    """What ``command`` (``tune estimate-memory ...``) prints: the stored output while it is fresh, else the
    command run in this process (and, under ``make test-estimates``, stored), once per session.

    Raises:
        StaleEstimate: stale, and running it would take the session past ``TUNE_ESTIMATE_BUDGET_S``.
    """
    entry = _stored().get(command)
    if entry is not None and key(command, entry["dependencies"]) == entry["key"]:
        return entry["output"]
    expected = entry["cpu_s"] if entry is not None else 20.0
    if not REFRESH and _spent[0] + expected > BUDGET_S:
        raise StaleEstimate(
            f"The stored output of `{command}` ({CACHE.relative_to(REPO)}) is stale: code it ran, its config or a "
            f"package version changed since it was stored ({'no entry' if entry is None else 'another key'}), "
            f"and running it (about {expected:.0f} s of CPU) would take this session past its budget of "
            f"{BUDGET_S:.0f} s of CPU for estimates (TUNE_ESTIMATE_BUDGET_S), {_spent[0]:.0f} s of which are "
            "spent. Run `make test-estimates`: it runs every stale estimate, checks the figures and stores the "
            "outputs; commit tests/memory_estimates.json with the change."
        )
    output, seconds, dependencies = _run(command, trace=REFRESH)
    _spent[0] += seconds
    if REFRESH:
        _store(command, output, seconds, dependencies)
    return output


def _store(command: str, output: str, seconds: float, dependencies: List[List[str]]) -> None:
    stored = _stored()
    stored[command] = {
        "key": key(command, dependencies),
        "cpu_s": round(seconds, 1),  # traced: about twice the plain run's
        "packages": _versions(),  # for the record: only torch's is part of the key
        "output": output,
        "dependencies": dependencies,
    }
    _write(stored)


def refresh(commands: Set[str], jobs: int = JOBS) -> List[str]:
    """Run and store every stale one of ``commands``, traced, ``jobs`` processes at a time (``make
    test-estimates``; each traced run is a process of its own anyway): the stale commands, in order."""
    from concurrent.futures import ThreadPoolExecutor

    stale = sorted(command for command in commands if not fresh(command))
    failed = []

    def run(command: str) -> None:
        try:
            output, seconds, dependencies = _run(command, trace=True)
        except AssertionError as error:  # the others still run and are stored
            failed.append(str(error))
            return
        with lock:
            _store(command, output, seconds, dependencies)

    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(run, stale))
    if failed:
        raise AssertionError(f"{len(failed)} of {len(stale)} stale estimates failed:\n\n" + "\n\n".join(failed))
    return stale


def prune(commands: Set[str]) -> List[str]:
    """Drop the stored outputs of commands no page or config quotes any more (``make test-estimates``)."""
    stored = _stored()
    gone = sorted(set(stored) - commands)
    if gone and REFRESH:
        for command in gone:
            del stored[command]
        _write(stored)
    return gone
