"""`make setup` chooses the torch build from two variables: what `make -n` would run."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _setup_commands(*variables: str) -> list:
    # -B: print the recipe even though the stamp is up to date; -n: print, run nothing.
    result = subprocess.run(
        ["make", "-n", "-B", "setup", *variables], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.splitlines()


def _torch_install(lines: list) -> str:
    (line,) = [line for line in lines if re.search(r"pip install .*\"torch==", line) and "-e " not in line]
    return line


def test_default_installs_the_pinned_torch_from_pips_configured_index():
    lines = _setup_commands()
    line = _torch_install(lines)
    assert '"torch==2.13.0"' in line and "--index-url" not in line
    (project,) = [line for line in lines if "-e " in line]
    assert '"torch==2.13.0"' in project and '".[dev]"' in project  # the same pin: nothing replaces that torch
    assert any("import torch; print('Installed torch'" in line for line in lines)  # says which build it got


def test_torch_index_picks_another_cuda_variant():
    line = _torch_install(_setup_commands("TORCH_INDEX=file:///srv/wheels/cu126"))
    assert line.endswith('--index-url file:///srv/wheels/cu126 "torch==2.13.0"')


def test_torch_version_changes_both_pins():
    lines = _setup_commands("TORCH_VERSION=2.12.1")
    assert '"torch==2.12.1"' in _torch_install(lines)
    assert all("2.13.0" not in line for line in lines)


def test_setup_removes_the_old_distribution_name():
    assert any("pip uninstall --quiet --yes torchtune" in line for line in _setup_commands())
