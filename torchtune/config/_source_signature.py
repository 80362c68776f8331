"""The signature of a ``_component_`` read from its source file, without importing it.

``tune validate`` checks that a component's keys are arguments of the callable. Importing
``bitsandbytes.optim.PagedAdamW`` to find out takes seconds (bitsandbytes imports torch and its
compiler stack), so the check first reads the Python source with ``ast``: the module file found
through the import system's path search (nothing is executed), then the class's ``__init__`` or the
function's ``def``, following ``from x import y`` re-exports and base classes.

Whenever the source does not say for sure -- a decorator, a dataclass, a metaclass, a name bound
more than once or conditionally, a C extension, a module ``__getattr__`` -- it returns None and the
caller imports the component instead. A problem found this way is confirmed by importing too, so
reading the source can make validation faster, never stricter.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Optional

_MAX_HOPS = 12  # re-exports and base classes followed before giving up
_DEFAULT = object()  # stands for any default value: binding only needs to know there is one


def _module_file(name: str) -> Optional[Path]:
    """The ``.py`` file of module ``name``, found without importing it or its parents."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else sys.modules[parts[0]].__spec__
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if len(parts) == 1:
        origin = spec.origin
        return Path(origin) if origin and origin.endswith(".py") else None
    locations = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], start=1):
        found = None
        for folder in locations:
            package = Path(folder) / part / "__init__.py"
            module = Path(folder) / f"{part}.py"
            if package.is_file():
                found, locations = package, [str(package.parent)]
                break
            if module.is_file() and i == len(parts) - 1:
                found = module
                break
        if found is None:
            return None
        if i == len(parts) - 1:
            return found
    return None


def _keeps_signature(decorator: ast.expr) -> bool:
    """``@checked_by(...)`` (torchtune.config._types) attaches value checks and returns the function itself."""
    call = decorator.func if isinstance(decorator, ast.Call) else None
    return isinstance(call, ast.Name) and call.id == "checked_by"


def _parse(path: Path) -> Optional[ast.Module]:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _bindings(tree: ast.Module, name: str) -> Optional[list]:
    """The top-level statements binding ``name``; None when it may also be bound in a branch or by a
    mechanism the source cannot show (``import *``, a module ``__getattr__``)."""
    found = []
    lazy = False
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found.append(node)
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            if any(alias.name == "*" for alias in node.names):
                return None
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                found.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(name in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} for t in targets):
                found.append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            if any(_binds(inner, name) for inner in ast.walk(node)):
                return None
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            lazy = True
    # A module __getattr__ only answers for names the module does not bind itself.
    return None if not found and lazy else found


def _binds(node: ast.AST, name: str) -> bool:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name or a.name == "*" for a in node.names)
    return isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store)


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def _signature_from_args(args: ast.arguments, drop_first: bool) -> inspect.Signature:
    P = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = []
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        if drop_first and i == 0:
            continue
        kind = P.POSITIONAL_ONLY if i < len(args.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=P.empty if default is None else _DEFAULT))
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=P.empty if default is None else _DEFAULT))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


class _Resolver:
    def __init__(self) -> None:
        self.hops = 0

    def lookup(self, module: str, name: str) -> Optional[tuple[str, ast.AST, bool]]:
        """(module, definition, module is a package) of ``module.name``, following re-exports."""
        self.hops += 1
        if self.hops > _MAX_HOPS:
            return None
        path = _module_file(module)
        tree = _parse(path) if path is not None else None
        if tree is None:
            return None
        bindings = _bindings(tree, name)
        if not bindings or len(bindings) != 1:
            # Not defined here: maybe a submodule (`pkg.sub` named as an attribute) -- not a callable we read.
            return None
        node = bindings[0]
        is_package = path.name == "__init__.py"
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            return self.lookup(_absolute(module, node, is_package), alias.name)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            return module, node, is_package
        return None  # an assignment or `import x`: whatever it holds is only known at run time

    def signature(self, module: str, name: str) -> Optional[inspect.Signature]:
        found = self.lookup(module, name)
        if found is None:
            return None
        where, node, is_package = found
        if isinstance(node, ast.FunctionDef):
            if any(not _keeps_signature(d) for d in node.decorator_list):
                return None
            return _signature_from_args(node.args, drop_first=False)
        return self.class_signature(where, node, is_package)

    def class_signature(self, module: str, node: ast.ClassDef, is_package: bool) -> Optional[inspect.Signature]:
        if node.decorator_list or node.keywords:  # @dataclass, metaclass=...: the real __init__ differs
            return None
        members = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "__new__" in members or any(_binds(m, "__signature__") for m in ast.walk(node)):
            return None
        init = members.get("__init__")
        if init is not None:
            return None if init.decorator_list else _signature_from_args(init.args, drop_first=True)
        if not node.bases:
            return inspect.Signature([])
        base = node.bases[0]  # the first base's __init__ is the one the MRO reaches first
        if len(node.bases) > 1 or not isinstance(base, (ast.Name, ast.Attribute)):
            return None
        target = self._base_target(module, base, is_package)
        if target is None:
            return None
        found = self.lookup(*target)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return self.class_signature(*found)

    def _base_target(self, module: str, base: ast.expr, is_package: bool) -> Optional[tuple[str, str]]:
        """(module, name) a base-class expression refers to in ``module``."""
        if isinstance(base, ast.Name):
            return module, base.id
        dotted = []
        while isinstance(base, ast.Attribute):
            dotted.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            return None
        path = _module_file(module)
        tree = _parse(path) if path is not None else None
        bindings = _bindings(tree, base.id) if tree is not None else None
        if not bindings or len(bindings) != 1 or not isinstance(bindings[0], ast.Import):
            return None
        alias = next(a for a in bindings[0].names if (a.asname or a.name.split(".")[0]) == base.id)
        root = alias.name if alias.asname else base.id
        parts = [root, *reversed(dotted)]
        return ".".join(parts[:-1]), parts[-1]


def source_signature(path: str) -> Optional[inspect.Signature]:
    """The signature of the class or function at the dotted ``path`` (``pkg.mod.Name``), read from source;
    None when the source does not tell it for sure (then import it and ask ``inspect``)."""
    parts = path.split(".")
    if len(parts) < 2 or any(not p.isidentifier() for p in parts):
        return None
    try:
        return _Resolver().signature(".".join(parts[:-1]), parts[-1])
    except (RecursionError, StopIteration, ValueError):
        return None
