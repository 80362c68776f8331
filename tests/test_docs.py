"""The user docs stay true to the code: their offline commands run, their links resolve, and the recipe
page documents every key the recipe reads.

Offline commands are the fenced blocks tagged ```` ```bash offline ```` (or preceded by an
``<!-- offline -->`` comment), in any page of docs/ and the README. Each block runs as one
``bash -e`` script with the venv's ``bin`` first on PATH, in a fresh temporary folder of its own, so a
block must not depend on another (``tune cp`` and a ``tune validate`` of the copy go in one block). A
block tagged ```` ```bash offline repo ```` runs in the repository root instead. All blocks start at
once, so the slowest one (``tune estimate-memory``) sets the wall time, not their sum.

Printed output: a fenced block preceded by ``<!-- output -->`` is what the nearest offline block above
it prints. Every line of it must be printed, with the same numbers: a line is found by its words (the
text without numbers) and its numbers compared as written, so a figure the docs quote cannot go stale.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINKED_PAGES = sorted(DOCS.glob("*.md")) + [REPO / "README.md"]
OFFLINE_PAGES = LINKED_PAGES  # every page's offline blocks run
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")

_FENCE = re.compile(r"^(```+|~~~+)(.*)$")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`+[^`\n]*`+")


class Block(NamedTuple):
    page: str
    line: int
    info: str
    text: str


def fenced_blocks(path: Path) -> Iterator[Block]:
    """Every fenced code block of ``path``: (page, first line, info string, body). A block directly
    preceded by ``<!-- offline -->`` gets ``offline`` added to its info string."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i].strip())
        if not match:
            i += 1
            continue
        fence, info = match.group(1), match.group(2).strip()
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if previous == "<!-- offline -->" and "offline" not in info.split():
            info = f"{info} offline".strip()
        if previous == "<!-- output -->":
            info = f"{info} output".strip()
        body: List[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j])
            j += 1
        yield Block(str(path.resolve().relative_to(REPO)), i + 1, info, "\n".join(body))
        i = j + 1


def _is_offline(block: Block) -> bool:
    return block.info.split()[:1] == ["bash"] and "offline" in block.info.split()


def offline_blocks() -> List[Block]:
    return [b for path in OFFLINE_PAGES if path.is_file() for b in fenced_blocks(path) if _is_offline(b)]


def output_blocks() -> List[tuple]:
    """(expected output block, the offline block whose output it is) of every page."""
    pairs = []
    for path in OFFLINE_PAGES:
        command = None
        for block in fenced_blocks(path) if path.is_file() else []:
            if _is_offline(block):
                command = block
            elif "output" in block.info.split():
                assert command is not None, f"{block.page}:{block.line}: an output block with no offline block above"
                pairs.append((block, command))
    return pairs


def _subprocess_env() -> dict:
    env = dict(os.environ)
    venv_bin = Path(sys.executable).parent  # .venv/bin when the tests run with the venv's python
    env["PATH"] = os.pathsep.join([str(venv_bin), str(REPO / ".venv" / "bin"), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"  # offline means offline: a command that reaches for the Hub fails here
    env["HF_DATASETS_OFFLINE"] = "1"
    env.pop("TUNE_DEBUG", None)
    return env


def _block_id(block: Block) -> str:
    return f"{block.page}:{block.line}"


@pytest.fixture(scope="module")
def started_blocks(tmp_path_factory) -> Iterator[dict]:
    """Every offline block, started at once as a subprocess in its own folder: {block id: Popen}."""
    env = _subprocess_env()
    procs = {}
    for block in offline_blocks():
        cwd = REPO if "repo" in block.info.split() else tmp_path_factory.mktemp(re.sub(r"\W", "_", block.page))
        procs[_block_id(block)] = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", block.text],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    yield procs
    for proc in procs.values():  # only ours, and only if a test stopped waiting for it
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


_RESULTS: dict = {}


def _finished(procs: dict, block: Block) -> tuple:
    """(returncode, stdout, stderr) of a started block, waited for once and kept for every test that reads it."""
    key = _block_id(block)
    if key not in _RESULTS:
        stdout, stderr = procs[key].communicate(timeout=600)
        _RESULTS[key] = (procs[key].returncode, stdout, stderr)
    return _RESULTS[key]


def test_quickstart_has_offline_commands():
    marked = [b for b in offline_blocks() if b.page == "docs/quickstart.md"]
    commands = "\n".join(b.text for b in marked)
    assert marked, "docs/quickstart.md has no ```bash offline blocks"
    for expected in ("tune ls", "tune validate llama2/7B_full_low_memory", "tune cp llama2/7B_full_low_memory"):
        assert expected in commands


@pytest.mark.parametrize("block", offline_blocks(), ids=_block_id)
def test_offline_command_block_runs(block: Block, started_blocks: dict):
    returncode, stdout, stderr = _finished(started_blocks, block)
    assert returncode == 0, (
        f"{block.page} line {block.line}: the block exited with status {returncode}\n"
        f"--- block ---\n{block.text}\n--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}"
    )


def _words(line: str) -> str:
    return " ".join(_NUMBER.sub(" ", line).split())


@pytest.mark.parametrize("pair", output_blocks(), ids=lambda pair: _block_id(pair[0]))
def test_printed_numbers_are_what_the_command_prints(pair, started_blocks: dict):
    expected, command = pair
    returncode, stdout, stderr = _finished(started_blocks, command)
    assert returncode == 0, stderr[-3000:]
    printed = [line for line in (stdout + stderr).splitlines() if line.strip()]
    for line in (x for x in expected.text.splitlines() if x.strip()):
        found = [p for p in printed if _words(p).startswith(_words(line))]
        assert found, f"{expected.page}:{expected.line}: no printed line reads like {line.strip()!r}"
        want = _NUMBER.findall(line)
        got = _NUMBER.findall(found[0])[: len(want)]
        assert got == want, (
            f"{expected.page}:{expected.line}: the docs say {line.strip()!r}, it printed {found[0].strip()!r}"
        )


def _lines_outside_fences(path: Path) -> Iterator[str]:
    """The page's lines, fenced code blocks left out."""
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _FENCE.match(line.strip())
        if fence is None and match:
            fence = match.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield line


def _prose(path: Path) -> str:
    """The page without fenced code blocks and inline code, where links are not links."""
    return "\n".join(_INLINE_CODE.sub("", line) for line in _lines_outside_fences(path))


def github_anchors(path: Path) -> set:
    """The anchors GitHub makes for the headings of ``path`` (lowercase, punctuation dropped, spaces
    to hyphens, ``-1``, ``-2`` ... for repeats)."""
    anchors: set = set()
    counts: dict = {}
    for line in _prose_with_headings(path):
        slug = re.sub(r"[^\w\- ]", "", line.strip().lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _prose_with_headings(path: Path) -> Iterator[str]:
    for line in _lines_outside_fences(path):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            yield heading.group(1).replace("`", "")


def relative_links(path: Path) -> List[str]:
    links = _LINK.findall(_prose(path))
    return [t for t in links if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t)]  # drop http:, mailto:, ...


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path):
    if not page.is_file():
        pytest.fail(f"{page.relative_to(REPO)} does not exist")
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = page if not file_part else (page.parent / file_part).resolve()
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(REPO) if REPO in dest.parents else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in github_anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(REPO)} has broken links: " + "; ".join(broken)


def test_recipe_page_documents_every_recipe_key():
    from recipes.full_finetune_single_device import RECIPE_KEYS

    text = (DOCS / "recipe.md").read_text(encoding="utf-8")
    table_keys = set(re.findall(r"^\|\s*`([a-z0-9_]+)`\s*\|", text, flags=re.M))
    missing = [k for k in RECIPE_KEYS if k not in table_keys]
    assert not missing, f"docs/recipe.md has no table row for: {', '.join(missing)}"


def test_docs_index_links_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {t.partition("#")[0] for t in relative_links(DOCS / "README.md")}
    pages = {p.name for p in DOCS.glob("*.md") if p.name != "README.md"}
    expected = pages | {"memory.md", "checkpoints.md", "speed.md"}
    assert expected <= linked, f"docs/README.md does not link: {', '.join(sorted(expected - linked))}"
    assert index.strip()


def _tune_ls_pairs(started_blocks: dict) -> List[tuple]:
    """(recipe, config) of each row of `tune ls`, as docs/configs.md's own offline block printed it."""
    block = next(b for b in offline_blocks() if b.page == "docs/configs.md" and b.text.strip() == "tune ls")
    returncode, stdout, stderr = _finished(started_blocks, block)
    assert returncode == 0, stderr[-3000:]
    pairs, recipe = [], None
    for line in stdout.splitlines()[1:]:
        cells = line.split()
        if len(cells) == 2:
            recipe = cells[0]
        pairs.append((recipe, cells[-1]))
    return pairs


def test_configs_page_lists_what_tune_ls_prints(started_blocks: dict):
    pairs = _tune_ls_pairs(started_blocks)
    text = (DOCS / "configs.md").read_text(encoding="utf-8")
    table = re.findall(r"^\|\s*`([\w./-]+)`\s*\|\s*`([\w./-]+)`\s*\|", text, flags=re.M)
    assert table == pairs, (
        "docs/configs.md's config table differs from `tune ls`: add or remove rows (in tune ls's order); "
        f"tune ls: {pairs}; the page: {table}"
    )
    recipes = list(dict.fromkeys(recipe for recipe, _ in pairs))
    listed = re.search(r"Runs a built-in recipe \(([^)]*)\)", text).group(1)
    assert re.findall(r"`([\w-]+)`", listed) == recipes, listed


_GB = re.compile(r"(?<![\d.])(\d+\.\d\d) GB")


def _config_rows(path: Path, configs: set) -> Iterator[tuple]:
    """(config, line) of each table row of ``path`` that states figures of a built-in config: a row whose
    first cell is the config, and the ``... `override` `` rows under it."""
    config = None
    for line in _lines_outside_fences(path):
        cell = line.split("|")[1].strip() if line.startswith("|") and line.count("|") > 2 else None
        if cell is None:
            config = None
            continue
        name = cell.strip("`")
        if name in configs:
            config = name
        elif not cell.startswith("..."):
            config = None
        if config is not None:
            yield config, line


def test_memory_figures_in_docs_tables_are_those_of_the_config_headers():
    """A config's figures in a docs table (its row and the `... override` rows under it) are the figures its
    header states; the headers are compared with `tune estimate-memory` by the config tests
    (tests/recipes/test_llama3_configs.py, test_distributed_configs.py)."""
    from torchtune import _recipe_registry as registry

    headers = {}
    for recipe in registry.get_all_recipes():
        for config in recipe.configs:
            lines = config.path.read_text(encoding="utf-8").splitlines()
            headers[config.name] = " ".join(line for line in lines if line.startswith("#"))
    stale = []
    for page in sorted(DOCS.glob("*.md")) + [REPO / "README.md"]:
        for config, line in _config_rows(page, set(headers)):
            # a header may round to one decimal (40.7 GB of host RAM for the table's 40.69 GB)
            stated = set(re.findall(r"(?<![\d.])(\d+\.\d\d?) GB", headers[config]))
            stale += [
                f"{page.name}: {config}: {x} GB"
                for x in _GB.findall(line)
                if x not in stated and f"{float(x):.1f}" not in stated
            ]
    assert not stale, "figures in docs tables that the config's header does not state (re-run the estimate): " + (
        "; ".join(stale)
    )
