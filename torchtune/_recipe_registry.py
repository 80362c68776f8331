"""The built-in recipes and their configs, as a plain list.

Paths are relative to the installed ``recipes`` package (``recipes/`` in a checkout, ``site-packages/
recipes/`` in a wheel), so ``tune run`` / ``tune cp`` find them wherever plaintune is installed. To
ship a new recipe or config, add one line here and the file under ``recipes/``.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from torchtune._errors import TuneError


@dataclass(frozen=True)
class Config:
    """A built-in config: ``name`` as typed on the command line, ``file_path`` inside ``recipes/``."""

    name: str
    file_path: str

    @property
    def path(self) -> Path:
        """Absolute path of the YAML file (it may not exist in a broken install)."""
        return builtin_recipes_dir() / self.file_path


@dataclass(frozen=True)
class Recipe:
    """A built-in recipe: ``name`` as typed after ``tune run``, ``file_path`` inside ``recipes/``."""

    name: str
    file_path: str
    configs: list[Config] = field(default_factory=list)
    supports_distributed: bool = False  # torchtune's field: `tune run` passes torchrun's options only to these

    @property
    def path(self) -> Path:
        """Absolute path of the recipe script."""
        return builtin_recipes_dir() / self.file_path


def _config(name: str) -> Config:
    # Convention: the config called "llama2/7B_full" lives at recipes/configs/llama2/7B_full.yaml.
    return Config(name=name, file_path=f"configs/{name}.yaml")


_RECIPES: list[Recipe] = [
    Recipe(
        name="full_finetune_single_device",
        file_path="full_finetune_single_device.py",
        configs=[
            _config("llama2/7B_full_low_memory"),
            _config("llama2/7B_full_16gb_apollo_mini"),
            _config("llama2/7B_full_16gb_cpu_optimizer"),
            _config("llama2/7B_full_single_device"),
            _config("llama2/tiny_full"),
            _config("llama3_2/1B_full_single_device"),
            _config("llama3_2/3B_full_single_device"),
            _config("llama3_1/8B_full_low_memory"),
            _config("qwen3/0.6B_full_single_device"),
            _config("qwen3/1.7B_full_single_device"),
            _config("qwen3/4B_full_single_device"),
            _config("qwen3/tiny_full"),
            _config("qwen2_5/0.5B_full_single_device"),
            _config("qwen2_5/1.5B_full_single_device"),
            _config("qwen2_5/3B_full_single_device"),
            _config("qwen2_5/tiny_full"),
            _config("mistral/tiny_full"),
            _config("phi4/mini_full_single_device"),
            _config("phi4/tiny_full"),
            _config("gemma3/1B_full_single_device"),
            _config("gemma3/4B_full_single_device"),
            _config("gemma3/tiny_full"),
        ],
    ),
    Recipe(
        name="full_finetune_distributed",
        file_path="full_finetune_distributed.py",
        supports_distributed=True,
        configs=[
            _config("llama2/tiny_full_distributed"),
            _config("llama2/7B_full"),
            _config("llama2/13B_full"),
            _config("llama2/70B_full"),
            _config("llama3_1/8B_full"),
            _config("llama3_1/8B_full_16gb"),
            _config("qwen3/8B_full_16gb"),
            _config("qwen3/8B_full"),
            _config("qwen3/14B_full"),
            _config("qwen3/32B_full"),
            _config("qwen2_5/7B_full"),
            _config("qwen2_5/14B_full"),
            _config("qwen2_5/32B_full"),
            _config("mistral/7B_full"),
            _config("phi4/14B_full"),
            _config("gemma3/12B_full"),
            _config("gemma3/27B_full"),
        ],
    ),
    Recipe(name="generate", file_path="generate.py", configs=[_config("generate")]),
    Recipe(
        name="eleuther_eval",
        file_path="eleuther_eval.py",
        configs=[_config("llama2/7B_eval"), _config("llama2/tiny_eval"), _config("llama3_2/1B_eval")],
    ),
]


def get_all_recipes() -> list[Recipe]:
    """Every built-in recipe, in the order ``tune ls`` shows them."""
    return list(_RECIPES)


def get_recipe(name: str) -> Optional[Recipe]:
    """The built-in recipe called ``name``, or None."""
    return next((r for r in _RECIPES if r.name == name), None)


def get_config(name: str) -> Optional[Config]:
    """The built-in config called ``name`` (with or without ``.yaml``), or None."""
    if name.endswith((".yaml", ".yml")):
        name = name.rsplit(".", 1)[0]
    return next((c for r in _RECIPES for c in r.configs if c.name == name), None)


# The first line `tune cp` writes into a copied config: the recipe it belongs to, so `tune validate` and
# `tune run` check the copy as they check the built-in (a typo in a key fails without --recipe).
RECIPE_HEADER = "# tune-recipe:"
_HEADER_LINES = 5  # the header is looked for in the first lines only: nothing else is read


def recipe_header(recipe: Recipe, config: Config) -> str:
    """The header line ``tune cp`` writes into a copy of ``config``."""
    return (
        f"{RECIPE_HEADER} {recipe.name}  (copied from {config.name} by tune cp: tune validate and tune run check "
        "this file with that recipe's checks)\n"
    )


def header_recipe(path: Path) -> Optional[str]:
    """The recipe name a ``tune cp`` header in the YAML file ``path`` names, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [f.readline() for _ in range(_HEADER_LINES)]
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        if line.startswith(RECIPE_HEADER):
            words = line[len(RECIPE_HEADER) :].split()
            return words[0] if words else None
    return None


_LAUNCH_LINE = re.compile(r"^#\s*tune run (.*?)(\S+) --config\b")
_COMMENT_LINES = 60  # torchtune's configs name their launch command in the comments at their top


def launch_line_recipe(path: Path) -> Optional[str]:
    """The recipe of the ``tune run ... RECIPE --config ...`` command in the comments at the top of the YAML
    file ``path`` (torchtune's configs each say how to launch them), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            for _ in range(_COMMENT_LINES):
                line = f.readline()
                if line.strip() and not line.lstrip().startswith("#"):
                    return None  # past the comments at the top
                match = _LAUNCH_LINE.match(line.strip())
                if match:
                    return match.group(2)
    except (OSError, UnicodeDecodeError):
        return None
    return None


def recipe_for_config(name_or_path: str) -> Optional[Recipe]:
    """The built-in recipe of a config: a built-in one by name (``llama2/tiny_full``) or by the path of its
    file inside the installed package, a copy by the recipe its ``tune cp`` header names, a torchtune config
    by the recipe of the launch command in its top comments; None otherwise."""
    config = get_config(str(name_or_path))
    if config is None:
        candidate = Path(str(name_or_path)).expanduser()
        if not candidate.is_file():
            return None
        resolved = candidate.resolve()
        config = next((c for r in _RECIPES for c in r.configs if c.path.resolve() == resolved), None)
        if config is None:
            # a `tune cp` copy names its recipe in its first line; a torchtune config in its launch command
            name = header_recipe(candidate) or launch_line_recipe(candidate)
            return get_recipe(name) if name else None
    return next(r for r in _RECIPES if config in r.configs)


def builtin_recipes_dir() -> Path:
    """Folder of the installed ``recipes`` package, found without importing anything heavy."""
    spec = importlib.util.find_spec("recipes")
    if spec is None or not spec.submodule_search_locations:
        raise TuneError(
            "The 'recipes' package that ships the built-in recipes and configs is not installed "
            "alongside torchtune; reinstall plaintune (pip install -e . in a checkout)."
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve()
