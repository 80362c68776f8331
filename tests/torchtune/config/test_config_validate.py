"""config.validate and the shipped configs."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from torchtune import ConfigError, config
from torchtune import _recipe_registry as registry

RECIPES_DIR = registry.builtin_recipes_dir()
SHIPPED = sorted(RECIPES_DIR.glob("configs/**/*.yaml"))


def test_valid_config_passes():
    cfg = OmegaConf.create(
        {
            "lr": 2e-5,
            "optimizer": {"_component_": "collections.OrderedDict", "anything": 1, "lr": "${lr}"},
            "frac": {"_component_": "fractions.Fraction", "numerator": 1, "denominator": 3},
            "items": [{"_component_": "datetime.timedelta", "days": 1}],
            "plain": {"a": [1, 2]},
        }
    )
    config.validate(cfg)
    config.validate(OmegaConf.to_container(cfg))  # plain dicts too


def test_all_problems_in_one_error():
    cfg = OmegaConf.create(
        {
            "frac": {"_component_": "fractions.Fraction", "numeratorr": 1, "denominator": 3},
            "model": {"_component_": "fractions.NoSuchThing"},
            "nested": {"inner": [{"_component_": "textwrap.TextWrapper", "widht": 1}]},
            "missing_pkg": {"_component_": "no_such_pkg_xyz.Cls"},
            "ref": "${nope}",
            "todo": "???",
        }
    )
    with pytest.raises(ConfigError) as info:
        config.validate(cfg)
    message = str(info.value)
    assert "6 problems" in message
    for key in ("frac:", "model._component_:", "nested.inner.0:", "missing_pkg._component_:", "ref:", "todo:"):
        assert f"  - {key}" in message, key
    assert (
        "'numeratorr' (did you mean 'numerator'?)" in message
        and "'widht' (did you mean 'width'?)" in message
        and "NoSuchThing" in message
    )


def test_validate_does_not_build_anything(tmp_path, monkeypatch):
    (tmp_path / "tt_boom.py").write_text(
        "calls = []\nclass Boom:\n    def __init__(self, x):\n        calls.append(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import tt_boom

    config.validate(OmegaConf.create({"b": {"_component_": "tt_boom.Boom", "x": 1}}))
    assert tt_boom.calls == []


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(RECIPES_DIR)) for p in SHIPPED])
def test_shipped_config_is_valid(path: Path):
    config.validate(config.load_config(str(path)))


@pytest.mark.parametrize("cfg", [c for r in registry.get_all_recipes() for c in r.configs], ids=lambda c: c.name)
def test_registered_config_file_exists(cfg):
    assert cfg.path.is_file(), f"registered config {cfg.name} has no file at {cfg.path}"
    assert config.resolve_config_path(cfg.name) == cfg.path


def test_check_recipe_keys_names_unknown_and_missing_keys():
    from omegaconf import OmegaConf

    from torchtune.config import check_recipe_keys

    cfg = OmegaConf.create({"batch_sizee": 2, "epochs": 1})
    with pytest.raises(ConfigError) as err:
        check_recipe_keys(cfg, ("batch_size", "epochs", "seed"), "my_recipe", "my/config")
    message = str(err.value)
    assert "unknown key 'batch_sizee' (did you mean batch_size?)" in message
    assert "missing key(s) batch_size, seed" in message
    assert "tune cp my/config ." in message
    check_recipe_keys(OmegaConf.create({"batch_size": 1}), ("batch_size",), "r", "c")  # no error


def test_missing_recipe_keys_are_offered_as_overrides_with_a_plus_and_the_shipped_values(tmp_path):
    """A key the config lacks is added on the command line only with '+': the advice says so, and the added
    keys then pass."""
    from omegaconf import OmegaConf

    from torchtune.config import apply_overrides, check_recipe_keys

    shipped = config.load_config("llama2/tiny_full")
    cfg = shipped.copy()
    del cfg["overwrite"], cfg["save_every_n_steps"]
    keys = tuple(shipped.keys())
    with pytest.raises(ConfigError) as err:
        check_recipe_keys(cfg, keys, "full_finetune_single_device", "llama2/tiny_full")
    message = " ".join(str(err.value).split())
    assert "+overwrite=False +save_every_n_steps=50 (the values of llama2/tiny_full)" in message, message
    added = message.split("with one): ")[1].split(" (the values")[0].split()
    check_recipe_keys(apply_overrides(OmegaConf.create(OmegaConf.to_container(cfg)), added), keys, "r", "c")
