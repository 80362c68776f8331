"""An environment with only the GPU machine's packages, to find a missing wheel on this CPU machine.

``gpu_machine_python(folder)`` lays out a virtual environment (``pyvenv.cfg`` beside ``bin/python``, a
link to the base interpreter) whose site-packages holds links to exactly the packages of
``scripts/gpu_wheels.H200_DISTRIBUTIONS`` with their dependencies (the GPU machine's set, as
``../shared/GPU.md`` lists it) and those of ``WHEELS`` (what the kit carries), taken from this
environment. Everything else installed here (lm-eval, torchao, tensorboard ...) is absent there, so
an import of it fails as it would on the GPU machine, in that Python and every process it starts.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement


def _distribution_names() -> set[str]:
    from scripts.gpu_wheels import H200_DISTRIBUTIONS, WHEELS

    carried = [re.split(r"[=<>]", w)[0] for w in WHEELS["site"]]
    todo, seen = [*H200_DISTRIBUTIONS, *carried], set()
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # e.g. CUDA-only dependencies of torch: absent from this CPU environment too
        seen.add(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def gpu_machine_python(folder: Path) -> Path:
    """The ``bin/python`` of an environment with only the GPU machine's packages (made once per folder)."""
    python = folder / "bin" / "python"
    if python.exists():
        return python
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    wanted = _distribution_names()
    for dist in metadata.distributions(path=[str(ours)]):
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower() not in wanted:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops:
            source = ours / top
            if top.endswith(".pth") or top == ".." or not source.exists():
                continue
            if not (site / top).exists():
                (site / top).symlink_to(source)
    base = Path(sys._base_executable).resolve()  # the interpreter itself, not this environment's link
    (folder / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n")
    python.parent.mkdir(parents=True, exist_ok=True)
    python.symlink_to(base)
    return python
