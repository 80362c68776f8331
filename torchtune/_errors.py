"""User-facing errors.

A ``TuneError`` is a mistake the user can fix (a config key, a file, a setting). The command line
prints its message as one paragraph, without a Python traceback unless ``TUNE_DEBUG=1``; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
import textwrap
import traceback


class TuneError(Exception):
    """A problem with the user's input; the message says what is wrong and what to change."""

    exit_code = 1


class TuneValueError(TuneError, ValueError):
    """A ``TuneError`` where torchtune's API raises ``ValueError``: code that catches ``ValueError`` (as
    torchtune's callers and tests do) keeps working, and the command line still prints one paragraph."""


class TuneRuntimeError(TuneError, RuntimeError):
    """A ``TuneError`` where torchtune's API raises ``RuntimeError`` (see ``TuneValueError``)."""


class UsageError(TuneError):
    """A bad command line or config override."""

    exit_code = 2


class ConfigError(UsageError):
    """A config that is malformed, names an unknown key, or has an invalid value.

    ``errors`` holds one exception per problem found (``config.validate`` lists them all), as torchtune's
    ``ConfigError.errors`` does; torchtune's spelling ``ConfigError([exc, ...])`` builds the message from them.
    """

    def __init__(self, message: "str | list[Exception]" = "", errors: "list[Exception] | None" = None) -> None:
        if isinstance(message, list):
            errors = message
            listing = "\n".join(f"{type(e).__name__}: {e}" for e in errors)
            message = f"Config is not well-formed, found the following errors: \n{listing}"
        super().__init__(message)
        self.errors: list[Exception] = list(errors) if errors is not None else []


class OverrideError(ConfigError, ValueError):
    """A command-line override that is not ``key=value`` / ``~key`` / ``+key=value``, or a flag where an
    override belongs. A ValueError too, as torchtune's command-line parsing raises for these."""


def debug_enabled() -> bool:
    """True when ``TUNE_DEBUG`` asks for full tracebacks."""
    return os.environ.get("TUNE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def report_error(exc: TuneError) -> int:
    """Print ``exc`` for a user (one paragraph on stderr) and return its exit status."""
    end_progress_bars()
    if debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(format_message(f"Error: {exc}"), file=sys.stderr)
    return exc.exit_code


def end_progress_bars() -> None:
    """Close the tqdm bars still drawn (a run stopped mid-epoch): a bar's line has no newline until it
    closes, so a message printed now would be glued to its end instead of starting a line."""
    std = sys.modules.get("tqdm.std")  # never imported here: no bar can be live without it
    if std is None:
        return
    for bar in list(getattr(std.tqdm, "_instances", ())):
        bar.close()


def format_message(message: str, width: int = 100) -> str:
    """Wrap ``message`` for a terminal: prose paragraphs are filled, indented lines (lists) kept as lines."""
    blocks = []
    for paragraph in message.strip().split("\n\n"):
        lines = paragraph.splitlines()
        if all(line.startswith(" ") for line in lines):
            blocks.append(
                "\n".join(
                    textwrap.fill(
                        line,
                        width=width,
                        subsequent_indent=" " * (len(line) - len(line.lstrip()) + 2),
                        break_long_words=False,
                        break_on_hyphens=False,
                    )
                    for line in lines
                )
            )
        else:
            blocks.append(
                textwrap.fill(" ".join(paragraph.split()), width=width, break_long_words=False, break_on_hyphens=False)
            )
    return "\n\n".join(blocks)
