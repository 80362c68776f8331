"""torchtune 0.6.1's config helpers at their paths, on this package's override and check code."""

import argparse
import copy

import pytest
from omegaconf import OmegaConf

from torchtune import config
from torchtune._errors import OverrideError
from torchtune.config._errors import ConfigError, InstantiationError
from torchtune.config._parse import TuneRecipeArgumentParser
from torchtune.config._utils import _get_component_from_path, _merge_yaml_and_cli_args, _remove_key_by_dotpath

YAML = "a: 1\nb:\n  _component_: fractions.Fraction\n  numerator: 3\nd: 4\nf: 8\ng: foo\nh: ${g}/bar\n"


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(YAML)
    return p


def test_parser_returns_yaml_keys_and_overrides_then_merge_applies_them(path):
    parser = TuneRecipeArgumentParser("test")
    yaml_args, cli_args = parser.parse_known_args(
        ["--config", str(path), "b.numerator=4", "b=decimal.Decimal", "b.x.y=6", "d=6", "e=7", "~f", "g=baz"]
    )
    assert yaml_args.a == 1 and yaml_args.h == "${g}/bar"  # not interpolated yet
    assert cli_args == ["b.numerator=4", "b=decimal.Decimal", "b.x.y=6", "d=6", "e=7", "~f", "g=baz"]
    cfg = _merge_yaml_and_cli_args(yaml_args, cli_args)
    assert cfg.b._component_ == "decimal.Decimal" and cfg.b.numerator == 4 and cfg.b.x.y == 6
    assert cfg.d == 6 and cfg.e == 7 and "f" not in cfg and cfg.h == "baz/bar"
    with pytest.raises(ValueError, match="Additional flag arguments not supported"):
        parser.parse_known_args(["--config", str(path), "--d", "3"])
    with pytest.raises(ValueError, match="must be in the form of key=value"):
        _merge_yaml_and_cli_args(argparse.Namespace(a=1), ["a"])


def test_remove_key_by_dotpath_as_torchtune():
    base = {"a": 1, "b": {"_component_": 2, "c": 3}, "e": {"f": 1}}
    cfg = copy.deepcopy(base)
    with pytest.raises(OverrideError, match="Removing components from CLI is not supported"):
        _remove_key_by_dotpath(cfg, "b")
    _remove_key_by_dotpath(cfg, "b.c")
    _remove_key_by_dotpath(cfg, "e.f")  # its emptied parent goes too
    assert cfg == {"a": 1, "b": {"_component_": 2}}
    with pytest.raises(TypeError):
        _remove_key_by_dotpath(copy.deepcopy(base), "b.c.d")
    with pytest.raises(KeyError):
        _remove_key_by_dotpath(copy.deepcopy(base), "i")


def test_get_component_from_path_errors():
    assert _get_component_from_path("fractions.Fraction").__name__ == "Fraction"
    with pytest.raises(ValueError, match="Relative imports are not supported"):
        _get_component_from_path(".fractions")
    with pytest.raises(InstantiationError, match="Error loading 'fractions.Nope'"):
        _get_component_from_path("fractions.Nope")


def test_validate_lists_each_problem_as_an_exception():
    cfg = OmegaConf.create(
        {
            "x": {"_component_": "fractions.Fraction", "numerator": 1, "dummy": 3},
            "y": {"_component_": "fractions.Fraction", "dummy": 3},
        }
    )
    with pytest.raises(ConfigError) as info:
        config.validate(cfg)
    assert [str(e) for e in info.value.errors] == ["Fraction got an unexpected keyword argument 'dummy'"] * 2
    assert all(isinstance(e, TypeError) for e in info.value.errors)
    assert "got an unexpected keyword argument 'dummy'" in str(info.value)
    # torchtune's spelling: ConfigError(list of exceptions)
    assert "found the following errors" in str(ConfigError([TypeError("t")]))
