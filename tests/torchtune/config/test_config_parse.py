"""Loading configs, key=value overrides and the @config.parse decorator."""

import re
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from torchtune import ConfigError, UsageError, config
from torchtune.config._overrides import parse_override_value

YAML = """\
# a tiny config
seed: 7
batch_size: 2
lr: 1.0e-3
dtype: bf16
optimizer:
  _component_: collections.OrderedDict
  lr: ${lr}
  weight_decay: 0.01
dataset:
  source: tatsu-lab/alpaca
  columns: [instruction, output]
layers:
  - {dim: 4}
  - {dim: 8}
"""


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(YAML)
    return path


def test_load_config_reads_yaml_with_floats(cfg_path):
    cfg = config.load_config(str(cfg_path))
    assert isinstance(cfg, DictConfig)
    assert cfg.seed == 7 and cfg.lr == pytest.approx(1e-3)
    assert cfg.optimizer.lr == pytest.approx(1e-3)  # interpolation


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4", 4),
        ("2e-5", 2e-5),
        ("-1E3", -1000.0),
        ("1.5", 1.5),
        ("true", True),
        ("False", False),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ("{a: 1}", {"a": 1}),
        ("hello", "hello"),
        ("'4'", "4"),
        ("", ""),
        (".inf", float("inf")),
        ("a: b: c", "a: b: c"),
    ],
)
def test_override_values_are_typed_as_yaml(text, expected):
    value = parse_override_value(text)
    assert value == expected and type(value) is type(expected)


def test_yaml_file_2e_minus_5_is_a_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 2e-5\nsteps: 1e3\nname: 2e\n")
    cfg = config.load_config(str(path))
    assert cfg.lr == 2e-5 and isinstance(cfg.lr, float)
    assert cfg.steps == 1000.0 and cfg.name == "2e"


def test_overrides_set_typed_values(cfg_path):
    cfg = config.load_config(
        str(cfg_path),
        [
            "batch_size=8",
            "lr=2e-5",
            "dtype=null",
            "dataset.columns=[a, b, c]",
            "layers.1.dim=16",
            "optimizer.weight_decay=0",
            "dataset.source=my/data",
        ],
    )
    assert cfg.batch_size == 8
    assert cfg.lr == 2e-5 and isinstance(cfg.lr, float)
    assert cfg.optimizer.lr == 2e-5  # the interpolation follows the override
    assert cfg.dtype is None
    assert list(cfg.dataset.columns) == ["a", "b", "c"]
    assert cfg.layers[1].dim == 16
    assert cfg.optimizer.weight_decay == 0 and cfg.dataset.source == "my/data"


def test_tilde_deletes_keys(cfg_path):
    cfg = config.load_config(str(cfg_path), ["~seed", "~optimizer.weight_decay", "~layers.0"])
    assert "seed" not in cfg
    assert list(cfg.optimizer.keys()) == ["_component_", "lr"]
    assert len(cfg.layers) == 1 and cfg.layers[0].dim == 8


def test_component_swap_keeps_other_fields(cfg_path):
    cfg = config.load_config(str(cfg_path), ["optimizer=builtins.dict"])
    assert cfg.optimizer._component_ == "builtins.dict"
    assert cfg.optimizer.weight_decay == 0.01
    assert OmegaConf.to_container(cfg.optimizer)["lr"] == "${lr}"


def test_plus_adds_a_new_key(cfg_path):
    cfg = config.load_config(str(cfg_path), ["+optimizer.momentum=0.9", "+profiler.enabled=true"])
    assert cfg.optimizer.momentum == 0.9 and cfg.profiler.enabled is True
    with pytest.raises(ConfigError, match="already exists"):
        config.load_config(str(cfg_path), ["+seed=1"])


def test_overrides_apply_in_order(cfg_path):
    cfg = config.load_config(str(cfg_path), ["seed=1", "~seed", "+seed=3"])
    assert cfg.seed == 3


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("~optimizer.weight_decy", "'optimizer.weight_decay'"),
        ("~batch_sizee", "'batch_size'"),
        ("~optimiser.lr", "'optimizer.lr'"),
    ],
)
def test_deleting_an_unknown_key_names_it_and_suggests(cfg_path, override, suggestion):
    with pytest.raises(ConfigError) as info:
        config.load_config(str(cfg_path), [override])
    message = str(info.value)
    key = override.lstrip("~").split("=")[0]
    assert f"'{key}'" in message and "not in the config" in message
    assert f"Did you mean {suggestion}" in message
    assert str(cfg_path) in message


def test_key_value_adds_a_key_as_torchtune_does(cfg_path):
    cfg = config.load_config(
        str(cfg_path), ["batch_sizee=4", "optimizer.momentum=0.9", "profiler.enabled=true", "max_filename=00030"]
    )
    assert cfg.batch_sizee == 4 and cfg.batch_size == 2  # a typo is added: the recipe's key check names it
    assert cfg.optimizer.momentum == 0.9 and cfg.profiler.enabled is True
    assert cfg.max_filename == "00030"  # not octal 24: torchtune keeps checkpoint numbers as text


def test_none_is_null_as_on_torchtunes_command_line(cfg_path):
    cfg = config.load_config(str(cfg_path), ["seed=None", "dtype=null"])
    assert cfg.seed is None and cfg.dtype is None


def test_a_misspelled_added_key_is_named_by_the_recipe_key_check(cfg_path):
    cfg = config.load_config(str(cfg_path), ["batch_sizee=4"])
    with pytest.raises(ConfigError, match=r"unknown key 'batch_sizee' \(did you mean batch_size\?\)"):
        config.check_recipe_keys(cfg, list(OmegaConf.load(cfg_path).keys()), "tiny", "tiny")


def test_plus_on_an_existing_key_says_which_spelling_sets_it(cfg_path):
    with pytest.raises(ConfigError) as info:
        config.load_config(str(cfg_path), ["+batch_size=4"])
    assert "already exists" in str(info.value) and "write 'batch_size=4'" in str(info.value)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("seed", "Command-line overrides must be in the form of key=value"),
        ("seed.x=1", "is a value (7), not a section"),
        ("dataset=3", "is a section"),
        ("a..b=1", "not a valid dotted key"),
        ("~seed=1", "takes no value"),
        ("layers.5.dim=1", "not in the config"),
    ],
)
def test_malformed_overrides(cfg_path, override, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        config.load_config(str(cfg_path), [override])


def test_section_can_be_replaced_by_mapping_or_null(cfg_path):
    cfg = config.load_config(str(cfg_path), ["dataset={source: x}", "optimizer=null"])
    assert OmegaConf.to_container(cfg.dataset) == {"source": "x"} and cfg.optimizer is None


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError) as info:
        config.load_config(str(path))
    assert str(path) in str(info.value) and "line 3" in str(info.value)


def test_duplicate_key_is_an_error(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'a'.*|line 3.*duplicate"):
        config.load_config(str(path))


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        config.load_config(str(path))


def test_resolve_config_path(tmp_path, cfg_path):
    assert config.resolve_config_path(str(cfg_path)) == cfg_path.resolve()
    with pytest.raises(ConfigError) as info:
        config.resolve_config_path("llama2/7B_ful")
    message = str(info.value)
    assert "Did you mean 'llama2/7B_full'" in message and "llama2/tiny_full" in message
    assert "--config ./my_config.yaml" in message
    with pytest.raises(ConfigError, match="does not exist"):
        config.resolve_config_path(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="is a folder"):
        config.resolve_config_path(str(tmp_path))


def test_builtin_name_resolves_inside_recipes_package():
    import recipes

    expected = Path(recipes.__file__).parent.resolve() / "configs" / "llama2" / "tiny_full.yaml"
    if not expected.is_file():
        pytest.skip("llama2/tiny_full.yaml is not written yet")
    assert config.resolve_config_path("llama2/tiny_full") == expected


@config.parse
def _echo_recipe(cfg: DictConfig) -> DictConfig:
    """Returns its config (a recipe for the tests)."""
    return cfg


def test_parse_decorator_loads_and_overrides(cfg_path):
    cfg = _echo_recipe(["--config", str(cfg_path), "lr=2e-5", "~seed"])
    assert cfg.lr == 2e-5 and "seed" not in cfg
    # overrides before --config work too
    cfg = _echo_recipe(["batch_size=3", "--config", str(cfg_path), "dtype=fp32"])
    assert cfg.batch_size == 3 and cfg.dtype == "fp32"


def test_parse_decorator_passes_a_dictconfig_through(cfg_path):
    cfg = OmegaConf.create({"a": 1})
    assert _echo_recipe(cfg) is cfg


def test_parse_decorator_exits_with_error_code_and_no_traceback(cfg_path, capsys, monkeypatch):
    monkeypatch.delenv("TUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        _echo_recipe(["--config", str(cfg_path), "~batch_sizee"])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Did you mean 'batch_size'" in err and "Traceback" not in err


def test_parse_decorator_missing_config_lists_builtins(capsys):
    with pytest.raises(SystemExit) as info:
        _echo_recipe([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--config" in err and "llama2/7B_full_low_memory" in err and "path" in err


def test_parse_decorator_runs_validate(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("thing:\n  _component_: fractions.Fraction\n  numeratorr: 1\n")
    with pytest.raises(SystemExit) as info:
        _echo_recipe(["--config", str(path)])
    assert info.value.code == 2


def test_parse_decorator_help(capsys):
    with pytest.raises(SystemExit) as info:
        _echo_recipe(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and "~key" in out and "Returns its config" in out


def test_parse_decorator_catches_errors_raised_by_the_recipe(cfg_path, capsys):
    @config.parse
    def failing(cfg):
        raise UsageError("gradient_accumulation_steps must be 1 with optimizer_in_bwd=True")

    with pytest.raises(SystemExit) as info:
        failing(["--config", str(cfg_path)])
    assert info.value.code == 2
    assert "gradient_accumulation_steps" in capsys.readouterr().err


# --- loading goes through OmegaConf's own YAML reading -------------------------------------------

RICH_YAML = """\
lr: 2e-5
warmup: 1E3
ratio: .5
big: 1_000
flag: yes
none: ~
day: 2024-01-01
name: 2e
ref: ${lr}
nested: {a: [1, {b: null}]}
"""


def test_config_file_reads_as_omegaconf_load_does(tmp_path):
    path = tmp_path / "rich.yaml"
    path.write_text(RICH_YAML)
    cfg = config.load_config(str(path))
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(OmegaConf.load(path))
    assert OmegaConf.to_container(cfg) == {
        "lr": 2e-5,
        "warmup": 1000.0,
        "ratio": 0.5,
        "big": 1000,
        "flag": True,
        "none": None,
        "day": "2024-01-01",  # a date stays text (SafeLoader alone would build a datetime.date)
        "name": "2e",
        "ref": "${lr}",
        "nested": {"a": [1, {"b": None}]},
    }
    assert isinstance(cfg.lr, float) and cfg.ref == 2e-5


def test_duplicate_key_message_names_key_line_and_file(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("model:\n  dim: 8\n  layers: 2\n  dim: 16\n")
    with pytest.raises(ConfigError) as info:
        config.load_config(str(path))
    message = str(info.value)
    assert str(path) in message and "duplicate key 'dim' at line 4, column 3" in message
    assert "Remove or rename one of them" in message


@pytest.mark.parametrize(
    "text, holds",
    [("- 1\n- 2\n", "a list"), ("3\n", "a single value"), ("true\n", "a single value"), ("hello\n", "'hello'")],
)
def test_top_level_that_is_not_a_mapping_is_refused(tmp_path, text, holds):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load_config(str(path))
    message = str(info.value)
    assert str(path) in message and "must be a YAML mapping" in message and holds in message


def test_single_key_and_empty_configs_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed:\n")  # one key holding null: a mapping, unlike the bare string "seed"
    assert OmegaConf.to_container(config.load_config(str(path))) == {"seed": None}
    path.write_text("# only a comment\n")
    assert OmegaConf.to_container(config.load_config(str(path))) == {}


@pytest.mark.parametrize(
    "text, fragment",
    [("x: !!set {a}\n", "(key 'x'): Value 'set' is not a supported primitive type"), (b"a: \xff\n", "not UTF-8")],
)
def test_unloadable_file_is_a_config_error(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as info:
        config.load_config(str(path))
    assert str(path) in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("${lr}", "${lr}"),  # an interpolation, resolved when read
        ("2024-01-01", "2024-01-01"),
        ("~", None),
        ("a=b", "a=b"),
        ("1_000", 1000),
        ("[1, {a: 2e-5}]", [1, {"a": 2e-5}]),
        ("  spaced  ", "spaced"),
    ],
)
def test_override_values_are_typed_as_omegaconf_does(text, expected):
    value = parse_override_value(text)
    assert value == expected and type(value) is type(expected)
    assert value == OmegaConf.to_container(OmegaConf.from_dotlist([f"k={text}"]))["k"]


def test_interpolation_override_follows_its_target(cfg_path):
    cfg = config.load_config(str(cfg_path), ["dataset.source=${dtype}", "dtype=fp32"])
    assert cfg.dataset.source == "fp32"


@pytest.mark.parametrize(
    "override, fragment",
    [("lr={a: 1, a: 2}", "found duplicate key a"), ("lr=!!set {a}", "Value 'set' is not a supported primitive type")],
)
def test_override_value_omegaconf_cannot_hold_is_a_config_error(cfg_path, override, fragment):
    with pytest.raises(ConfigError) as info:
        config.load_config(str(cfg_path), [override])
    assert f"Override '{override}' cannot be applied: {fragment}." in str(info.value)
