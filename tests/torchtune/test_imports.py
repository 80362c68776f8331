"""Every torchtune module imports on its own, and torchtune modules import each other without cycles.

The cycle check reads the source (``ast``), so it sees imports inside functions too: moving an import
into a function is the usual way to hide a cycle from the interpreter, and the modules stay tangled
all the same (neither can be understood, tested or moved without the other). Imports under
``if TYPE_CHECKING:`` never run and are left out. Importing a submodule also runs its package's
``__init__``, but that parent edge is not counted: Python expects packages to import their own
submodules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torchtune

PACKAGE_DIR = Path(torchtune.__file__).parent
Edges = Dict[str, List[Tuple[str, int]]]


def module_files(package_dir: Path = PACKAGE_DIR) -> Dict[str, Tuple[Path, bool]]:
    """``{dotted module name: (file, is_package)}`` for every module under ``package_dir``."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(nodes: Iterable[ast.AST]) -> Iterator[ast.stmt]:
    """Every import statement in ``nodes`` and below them (functions and classes included) that can run."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse)
        else:
            yield from _import_nodes(ast.iter_child_nodes(node))


def import_edges(modules: Dict[str, Tuple[Path, bool]]) -> Edges:
    """``{module: [(imported module, line), ...]}`` restricted to the modules in ``modules``."""
    edges: Edges = {}
    for name, (path, is_package) in modules.items():
        out: List[Tuple[str, int]] = []
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                out += [(alias.name, node.lineno) for alias in node.names if alias.name in modules]
                continue
            if node.level:  # relative: from . import x / from ..a import b
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:  # from pkg import submodule
                    out.append((submodule, node.lineno))
                elif source in modules:
                    out.append((source, node.lineno))
        edges[name] = out
    return edges


def find_cycle(edges: Edges) -> Optional[List[Tuple[str, int]]]:
    """One import cycle as ``[(module, line of its import of the next one), ...]``, or None."""
    done: set = set()
    path: List[Tuple[str, int]] = []
    on_path: Dict[str, int] = {}

    def visit(module: str) -> Optional[List[Tuple[str, int]]]:
        on_path[module] = len(path)
        for target, line in sorted(edges.get(module, [])):
            path.append((module, line))
            if target in on_path:
                return path[on_path[target] :]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
            path.pop()
        del on_path[module]
        done.add(module)
        return None

    for module in sorted(edges):
        if module not in done:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def _describe(cycle: List[Tuple[str, int]]) -> str:
    hops = [f"{module} (line {line})" for module, line in cycle]
    return " -> ".join(hops + [cycle[0][0]])


def test_no_import_cycles_among_torchtune_modules():
    modules = module_files()
    assert "torchtune.config._load" in modules and "torchtune.datasets._collate" in modules
    cycle = find_cycle(import_edges(modules))
    assert cycle is None, f"import cycle: {_describe(cycle)}"


def test_cycle_finder_sees_imports_inside_functions(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.a import f\n")
    (package / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (package / "b.py").write_text(
        textwrap.dedent(
            """\
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from pkg.c import Never

            def g():
                from . import a  # a lazy import still ties b to a

                return a
            """
        )
    )
    (package / "c.py").write_text("import pkg.b\n")
    edges = import_edges(module_files(package))
    assert sorted(edges["pkg.b"]) == [("pkg.a", 7)]  # the TYPE_CHECKING import is left out
    assert edges["pkg.c"] == [("pkg.b", 1)]
    assert find_cycle(edges) == [("pkg.a", 1), ("pkg.b", 7)]
    assert _describe(find_cycle(edges)) == "pkg.a (line 1) -> pkg.b (line 7) -> pkg.a"
    (package / "b.py").write_text("def g():\n    return 1\n")
    assert find_cycle(import_edges(module_files(package))) is None


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(module_files())
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
