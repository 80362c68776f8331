"""The built-in recipes and their configs, as a plain list.

Paths are relative to the installed ``recipes`` package (``recipes/`` in a checkout, ``site-packages/
recipes/`` in a wheel), so ``tune run`` / ``tune cp`` find them wherever plaintune is installed. To
ship a new recipe or config, add one line here and the file under ``recipes/``.
"""

from __future__ import annotations

import importlib.util
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
            _config("llama2/7B_full"),
            _config("llama2/tiny_full"),
            _config("llama3_2/1B_full_single_device"),
            _config("llama3_2/3B_full_single_device"),
            _config("llama3_1/8B_full_low_memory"),
        ],
    ),
    Recipe(
        name="full_finetune_distributed",
        file_path="full_finetune_distributed.py",
        configs=[
            _config("llama2/tiny_full_distributed"),
            _config("llama2/7B_full_distributed"),
            _config("llama2/13B_full_distributed"),
            _config("llama2/70B_full_distributed"),
            _config("llama3_1/8B_full_distributed"),
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


def recipe_for_config(name_or_path: str) -> Optional[Recipe]:
    """The built-in recipe a built-in config belongs to: by name (``llama2/tiny_full``) or by the path of
    its file inside the installed package; None for any other file."""
    config = get_config(str(name_or_path))
    if config is None:
        candidate = Path(str(name_or_path)).expanduser()
        if not candidate.is_file():
            return None
        resolved = candidate.resolve()
        config = next((c for r in _RECIPES for c in r.configs if c.path.resolve() == resolved), None)
        if config is None:
            return None
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
