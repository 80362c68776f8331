"""Every memory figure the docs and the config headers quote is what `tune estimate-memory` prints today.

A figure is a two-decimal GB value (``13.91 GB``, ``9.27 / 9.96 GB``), the estimator's own format; a
value rounded further (``13.5 GB``, ``about 54 GB``) is prose, not checked, so quote what the estimator
printed with its two decimals. Each figure is tied to the command that prints it:

- in docs/*.md and README.md, by ``<!-- estimate: tune estimate-memory ARGS -->`` lines directly above
  the block it is in (a paragraph, list item or table: the lines up to the next blank line). A block
  may have several; each of its figures must be printed by one of them. Figures that are not estimator
  output (measured on a GPU or a CPU, arithmetic, a past estimate) are listed in a
  ``<!-- not estimated: WHY, with the figures -->`` line above their block instead, which says what they are;
- in a config header (the comment lines that open a recipes/configs YAML), by the header's own
  ``#   tune estimate-memory ARGS`` lines: every figure of the header must be printed by one of them.

``test_every_figure_names_its_command`` checks that every figure of every page and every config (new ones too)
is tied to a command or listed as not estimated, that each command parses and that its config takes its
overrides. ``test_figures_are_what_the_estimator_prints`` finds each figure of a block among the GB figures its
commands printed. The 90 distinct commands are full-size estimates (about 10 s of CPU each), so what each
printed is stored in ``tests/memory_estimates.json`` with the key of the code, config and packages it ran on
(``tests/_helpers/estimate_memory.py``): ``make test`` uses a stored output while its key holds, runs a stale
command again within a budget of CPU seconds, and otherwise fails naming ``make test-estimates``, which runs
every stale command, stores its output and checks the figures (docs/memory.md, "How the figures are checked").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, NamedTuple

import pytest

from tests._helpers.estimate_memory import REFRESH, command_argv, fresh, gb_figures, printed, prune, refresh

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
CONFIGS = sorted((REPO / "recipes" / "configs").rglob("*.yaml"))

_FENCE = re.compile(r"^(```+|~~~+)")
_ESTIMATE = re.compile(r"^<!--\s*estimate:\s*(tune estimate-memory\s.*?)\s*-->$")
_NOT_ESTIMATED = re.compile(r"^<!--\s*not estimated:\s*(.*?)\s*-->$")
_HEADER_COMMAND = re.compile(r"^#\s+(tune estimate-memory\s.*?)\s*$")


class Block(NamedTuple):
    where: str  # page:line or the config's path
    figures: List[str]  # two-decimal GB figures as written
    commands: List[str]  # the estimate commands that print them
    exempt: List[str]  # figures listed as not estimated


def _page_blocks(path: Path) -> Iterator[Block]:
    """The blocks of a page that quote figures: lines up to a blank line, code fences left out (a
    fenced command's output is compared with what it prints by tests/test_docs.py)."""
    name = str(path.relative_to(REPO))
    commands: List[str] = []
    exempt: List[str] = []
    figures: List[str] = []
    start = 0
    fence = None

    def flush() -> Iterator[Block]:
        if figures:
            yield Block(f"{name}:{start}", list(figures), list(commands), list(exempt))

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        fenced = _FENCE.match(stripped)
        if fenced:
            fence = fenced.group(1)
            continue
        if not stripped:
            yield from flush()
            commands, exempt, figures = [], [], []
            continue
        estimate, not_estimated = _ESTIMATE.match(stripped), _NOT_ESTIMATED.match(stripped)
        if estimate:
            commands.append(estimate.group(1))
        elif not_estimated:
            exempt += re.findall(r"\d+\.\d\d", not_estimated.group(1))
        else:
            if not figures:
                start = number
            figures += gb_figures(line)
    yield from flush()


def _header(path: Path) -> List[str]:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _config_block(path: Path) -> Block:
    header = _header(path)
    commands = [m.group(1) for m in map(_HEADER_COMMAND.match, header) if m]
    figures = [f for line in header if not _HEADER_COMMAND.match(line) for f in gb_figures(line)]
    return Block(str(path.relative_to(REPO)), figures, commands, [])


def figure_blocks() -> List[Block]:
    """Every block of the docs and every config header that quotes a figure."""
    blocks = [b for page in PAGES for b in _page_blocks(page)]
    blocks += [b for b in map(_config_block, CONFIGS) if b.figures]
    return blocks


def _estimated(block: Block) -> List[str]:
    return [f for f in block.figures if f not in block.exempt]


def test_every_figure_names_its_command():
    from torchtune._cli.tune import build_parser
    from torchtune.config import load_config

    parser = build_parser()
    loose, commands = [], {}
    for block in figure_blocks():
        figures = _estimated(block)
        if figures and not block.commands:
            loose.append(f"{block.where}: {', '.join(figures)} GB")
        commands.update(dict.fromkeys(block.commands, block.where))
    for command, where in commands.items():
        args = parser.parse_args(command_argv(command))
        assert args.command == "estimate-memory", (where, command)
        load_config(args.config, args.overrides)  # the config exists and takes the overrides
    assert not loose, (
        "memory figures with no command that prints them: put `<!-- estimate: tune estimate-memory ... -->` "
        "above the block (or `#   tune estimate-memory ...` in a config header) for each command they come "
        "from, or say what they are in `<!-- not estimated: ... -->`: " + "; ".join(loose)
    )


_CHECKED = [b for b in figure_blocks() if b.commands and _estimated(b)]


@pytest.fixture(scope="module", autouse=True)
def _refreshed():
    """Under ``make test-estimates``, every stale quoted command is run first, several processes at a time
    (``TUNE_ESTIMATE_JOBS``, default: one per core); the tests then read the stored outputs."""
    if REFRESH:
        refresh({command for block in _CHECKED for command in block.commands})


@pytest.mark.parametrize("block", _CHECKED, ids=lambda b: b.where)
def test_figures_are_what_the_estimator_prints(block: Block):
    printed_figures = {f for command in block.commands for f in gb_figures(printed(command))}
    stale = [f for f in _estimated(block) if f not in printed_figures]
    assert not stale, (
        f"{block.where}: {', '.join(stale)} GB is not what the estimator prints now; re-run "
        + " / ".join(f"`{c}`" for c in block.commands)
        + " and quote its figures. It printed:\n"
        + "\n".join(f"$ {c}\n{printed(c)}" for c in block.commands)
    )


def test_every_stored_output_is_quoted_and_fresh():
    """tests/memory_estimates.json holds the outputs of the quoted commands only (``make test-estimates``
    drops the others); after ``make test-estimates`` every one is fresh. (The config tests' commands,
    tests/recipes/test_*_configs.py, are quoted by the docs too.)"""
    quoted = {command for block in _CHECKED for command in block.commands}
    unused = prune(quoted)
    assert REFRESH or not unused, f"stored outputs of commands nothing quotes: {unused}; run `make test-estimates`"
    if REFRESH:
        assert all(fresh(command) for command in quoted)
