"""config.instantiate: dotted-path import, nesting, interpolation, kwargs precedence."""

import inspect
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from torchtune import ConfigError, config

HELPERS = """
class Model:
    def __init__(self, dim, layers=1, act=None, extra=None):
        self.dim, self.layers, self.act, self.extra = dim, layers, act, extra

class Act:
    def __init__(self, slope=0.1):
        self.slope = slope

def optimizer(params, lr=1e-3, betas=(0.9, 0.99), **kwargs):
    return {"params": params, "lr": lr, "betas": betas, **kwargs}

NOT_CALLABLE = 3

class _Unhashable:
    __hash__ = None  # e.g. a dataclass with eq=True

    def __call__(self, x=1):
        return x

UNHASHABLE = _Unhashable()
"""


@pytest.fixture(autouse=True)
def helpers(tmp_path, monkeypatch):
    (tmp_path / "tt_helpers.py").write_text(textwrap.dedent(HELPERS))
    (tmp_path / "tt_broken.py").write_text("import not_a_real_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("tt_helpers", "tt_broken"):
        sys.modules.pop(name, None)


def test_instantiate_builds_nested_components_first():
    cfg = OmegaConf.create(
        {
            "model": {
                "_component_": "tt_helpers.Model",
                "dim": 8,
                "act": {"_component_": "tt_helpers.Act", "slope": 0.2},
                "extra": {"plain": [1, {"_component_": "tt_helpers.Act"}], "n": {"k": 1}},
            },
        }
    )
    model = config.instantiate(cfg.model)
    assert model.dim == 8 and model.layers == 1
    assert model.act.slope == 0.2
    # plain containers come as python dicts/lists; components inside them are built too
    assert isinstance(model.extra, dict) and model.extra["n"] == {"k": 1}
    assert model.extra["plain"][0] == 1 and model.extra["plain"][1].slope == 0.1


def test_instantiate_resolves_interpolations():
    cfg = OmegaConf.create(
        {
            "dim": 16,
            "model": {"_component_": "tt_helpers.Model", "dim": "${dim}", "layers": "${oc.select:missing_key,3}"},
        }
    )
    model = config.instantiate(cfg.model)
    assert model.dim == 16 and model.layers == 3


def test_kwargs_win_and_args_are_positional():
    cfg = OmegaConf.create({"optimizer": {"_component_": "tt_helpers.optimizer", "lr": 2e-5, "betas": [0.5, 0.6]}})
    out = config.instantiate(cfg.optimizer, ["p1", "p2"], lr=0.1, foreach=False)
    assert out == {"params": ["p1", "p2"], "lr": 0.1, "betas": [0.5, 0.6], "foreach": False}
    assert cfg.optimizer.lr == 2e-5  # the config is not changed


def test_instantiate_plain_dict_and_stdlib():
    assert config.instantiate({"_component_": "fractions.Fraction", "numerator": 3, "denominator": 4}) == 0.75
    assert config.instantiate(None) is None


def test_missing_component_key():
    cfg = OmegaConf.create({"dataset": {"source": "x"}})
    with pytest.raises(ConfigError, match="'dataset' has no _component_"):
        config.instantiate(cfg.dataset)


def test_bad_fields_name_the_key():
    cfg = OmegaConf.create({"model": {"_component_": "tt_helpers.Model", "dimm": 8}})
    with pytest.raises(ConfigError) as info:
        config.instantiate(cfg.model)
    message = str(info.value)
    assert "'model'" in message and "'dimm' (did you mean 'dim'?)" in message
    assert "dim, layers, act, extra" in message


def test_missing_required_argument_is_reported_at_build_time():
    cfg = OmegaConf.create({"model": {"_component_": "tt_helpers.Model", "layers": 2}})
    with pytest.raises(ConfigError, match="missing a required argument: 'dim'"):
        config.instantiate(cfg.model)
    assert config.instantiate(cfg.model, dim=3).dim == 3  # supplied by the recipe


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("tt_helpers.Modell", "'tt_helpers' has no attribute 'Modell'. Did you mean tt_helpers.Model"),
        ("no_such_pkg_xyz.Thing", "no module named 'no_such_pkg_xyz'"),
        ("tt_broken.Thing", "needs 'not_a_real_dependency_xyz', which is not installed"),
        ("not a path", "not a dotted Python path"),
        ("tt_helpers.NOT_CALLABLE", "is not callable"),
    ],
)
def test_unimportable_component_names_key_and_path(path, fragment):
    cfg = OmegaConf.create({"model": {"_component_": path}})
    with pytest.raises(ConfigError) as info:
        config.instantiate(cfg.model)
    assert fragment in str(info.value)
    assert "model" in str(info.value)


def test_unresolvable_interpolation():
    cfg = OmegaConf.create({"model": {"_component_": "tt_helpers.Model", "dim": "${nope}"}})
    with pytest.raises(ConfigError, match="model"):
        config.instantiate(cfg.model)


def test_import_component_follows_attributes():
    from collections import OrderedDict

    assert config.import_component("collections.OrderedDict.fromkeys") == OrderedDict.fromkeys


@pytest.fixture
def signature_calls(monkeypatch):
    """The objects ``inspect.signature`` is asked about while the test runs."""
    calls = []
    real = inspect.signature

    def counting(obj, *args, **kwargs):
        calls.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting)
    return calls


def test_signature_is_inspected_once_per_component(signature_calls):
    import tt_helpers

    cfg = OmegaConf.create(
        {"model": {"_component_": "tt_helpers.Model", "dim": 8, "act": {"_component_": "tt_helpers.Act"}}}
    )
    config.validate(cfg)
    for _ in range(3):
        model = config.instantiate(cfg.model)
    assert model.dim == 8 and model.act.slope == 0.1
    assert signature_calls.count(tt_helpers.Model) == 1 and signature_calls.count(tt_helpers.Act) == 1
    with pytest.raises(ConfigError, match="'dimm' \\(did you mean 'dim'\\?\\)"):  # the cached signature still checks
        config.instantiate(OmegaConf.create({"_component_": "tt_helpers.Model", "dimm": 1}))
    assert signature_calls.count(tt_helpers.Model) == 1


def test_unhashable_callable_is_checked_without_the_cache(signature_calls):
    import tt_helpers

    cfg = OmegaConf.create({"_component_": "tt_helpers.UNHASHABLE", "x": 3})
    assert config.instantiate(cfg) == 3 and config.instantiate(cfg) == 3
    assert signature_calls.count(tt_helpers.UNHASHABLE) == 2
    with pytest.raises(ConfigError, match="unexpected keyword argument 'y'"):
        config.instantiate(OmegaConf.create({"_component_": "tt_helpers.UNHASHABLE", "y": 3}))
    with pytest.raises(ConfigError, match="unexpected keyword argument 'y'"):
        config.validate(OmegaConf.create({"n": {"_component_": "tt_helpers.UNHASHABLE", "y": 3}}))
