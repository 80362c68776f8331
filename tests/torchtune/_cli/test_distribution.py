"""The distribution's own name, install hints that name the missing package, and the warning about
PyTorch's torchtune installed in the same environment -- through the real `tune` command."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtune._distribution import DISTRIBUTION, install_hint

TUNE = Path(sys.executable).parent / "tune"


def _tune(*args, env=None, cwd=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([str(TUNE), *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120)


def test_this_checkout_is_installed_as_plaintune():
    assert DISTRIBUTION == "plaintune"
    assert importlib.metadata.distribution("plaintune").version == "0.1.0"
    result = _tune("--version")
    assert result.returncode == 0 and result.stdout.strip() == "tune (plaintune) 0.1.0"


def test_install_hints_name_the_missing_package():
    assert install_hint("bitsandbytes.optim") == "pip install bitsandbytes"
    assert install_hint("yaml") == "pip install PyYAML"
    assert install_hint("lm_eval.tasks") == "pip install lm-eval"


def test_validate_names_the_missing_package(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("opt:\n  _component_: tt_missing_pkg_xyz.optim.Thing\n")
    result = _tune("validate", str(config))
    assert result.returncode == 2
    text = " ".join(result.stderr.split())
    assert "pip install tt_missing_pkg_xyz" in text and "torchtune[" not in text


def _fake_pytorch_torchtune(folder: Path) -> Path:
    """The metadata pip writes for PyTorch's torchtune (what importlib.metadata finds), in ``folder``."""
    info = folder / "torchtune-0.6.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchtune\nVersion: 0.6.1\n")
    return folder


@pytest.mark.parametrize("command", [["ls"], ["validate", "generate"]])
def test_pytorch_torchtune_in_the_same_environment_is_reported(tmp_path, command):
    site = _fake_pytorch_torchtune(tmp_path / "site")
    result = _tune(
        *command, env={"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    )
    assert result.returncode == 0, result.stderr  # a warning, the command still runs
    text = " ".join(result.stderr.split())
    assert "the distribution 'torchtune' 0.6.1 is installed in this Python environment" in text
    assert "separate virtual environments" in text and "pip uninstall torchtune" in text


def test_no_warning_without_it():
    result = _tune("ls")
    assert result.returncode == 0 and "Warning" not in result.stderr
