"""`tune estimate-memory` run in this process, each distinct command once per test session.

An estimate traces a full-size model on fake tensors (seconds to a minute each on a 2-core machine), and
the docs and config headers quote figures of about fifty commands: running each once, in the process
that is already running the tests, keeps the check to the estimator's own work (no new interpreter, no
second torch import, no command run twice by two tests)."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex

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


@functools.lru_cache(maxsize=None)
def _printed(argv: tuple) -> str:
    from torchtune._cli.tune import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        returncode = main(list(argv))
    if returncode != 0:
        raise AssertionError(f"`tune {' '.join(argv)}` exited with {returncode}:\n{out.getvalue()[-3000:]}")
    return out.getvalue()


def printed(command: str) -> str:
    """What ``command`` (``tune estimate-memory ...``) prints; run once per session, in this process."""
    return _printed(tuple(command_argv(command)))
