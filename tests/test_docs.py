"""The user docs stay true to the code: their offline commands run, their links resolve, and the recipe
page documents every key the recipe reads.

Offline commands are the fenced blocks tagged ```` ```bash offline ```` (or preceded by an
``<!-- offline -->`` comment) in the pages listed in ``OFFLINE_PAGES``. Each block runs as one
``bash -e`` script with the venv's ``bin`` first on PATH, in a fresh temporary folder of its own, so a
block must not depend on another (``tune cp`` and a ``tune validate`` of the copy go in one block). A
block tagged ```` ```bash offline repo ```` runs in the repository root instead. All blocks start at
once, so the slowest one (``tune estimate-memory``) sets the wall time, not their sum.
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
# Pages whose offline blocks run here; other pages' authors opt in by adding theirs.
OFFLINE_PAGES = ("quickstart.md", "configs.md")
LINKED_PAGES = sorted(DOCS.glob("*.md")) + [REPO / "README.md"]

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
        body: List[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j])
            j += 1
        yield Block(path.name, i + 1, info, "\n".join(body))
        i = j + 1


def offline_blocks() -> List[Block]:
    blocks = []
    for name in OFFLINE_PAGES:
        path = DOCS / name
        if path.is_file():
            blocks += [b for b in fenced_blocks(path) if b.info.split()[:1] == ["bash"] and "offline" in b.info.split()]
    return blocks


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
        cwd = REPO if "repo" in block.info.split() else tmp_path_factory.mktemp(block.page.replace(".md", ""))
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


def test_quickstart_has_offline_commands():
    marked = [b for b in offline_blocks() if b.page == "quickstart.md"]
    commands = "\n".join(b.text for b in marked)
    assert marked, "docs/quickstart.md has no ```bash offline blocks"
    for expected in ("tune ls", "tune validate llama2/7B_full_low_memory", "tune cp llama2/7B_full_low_memory"):
        assert expected in commands


@pytest.mark.parametrize("block", offline_blocks(), ids=_block_id)
def test_offline_command_block_runs(block: Block, started_blocks: dict):
    proc = started_blocks[_block_id(block)]
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, (
        f"{block.page} line {block.line}: the block exited with status {proc.returncode}\n"
        f"--- block ---\n{block.text}\n--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}"
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
    table_keys = set(re.findall(r"^\|\s*`([a-z_]+)`\s*\|", text, flags=re.M))
    missing = [k for k in RECIPE_KEYS if k not in table_keys]
    assert not missing, f"docs/recipe.md has no table row for: {', '.join(missing)}"


def test_docs_index_links_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {t.partition("#")[0] for t in relative_links(DOCS / "README.md")}
    pages = {p.name for p in DOCS.glob("*.md") if p.name != "README.md"}
    expected = pages | {"memory.md", "checkpoints.md", "speed.md"}
    assert expected <= linked, f"docs/README.md does not link: {', '.join(sorted(expected - linked))}"
    assert index.strip()
