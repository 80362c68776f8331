"""The `tune` command through its real console entry point (a subprocess per call)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchtune import _recipe_registry as registry

TUNE = Path(sys.executable).parent / "tune"

RECIPE = '''
"""A tiny recipe for the CLI tests."""
import json
import sys

from omegaconf import OmegaConf

from torchtune import TuneError, config


@config.parse
def recipe_main(cfg):
    print("ARGV", json.dumps(sys.argv))
    print("CFG", json.dumps(OmegaConf.to_container(cfg, resolve=True)))
    if "thing" in cfg:
        print("THING", repr(config.instantiate(cfg.thing)))
    if cfg.get("fail"):
        raise TuneError("the recipe stopped on purpose: set fail=false")
    if cfg.get("crash"):
        raise RuntimeError("a bug in the recipe")
    return cfg.get("exit_code", 0)


if __name__ == "__main__":
    sys.exit(recipe_main())
'''

CONFIG = """\
batch_size: 2
lr: 1.0e-3
fail: false
crash: false
exit_code: 0
thing:
  _component_: fractions.Fraction
  numerator: 1
  denominator: 4
"""


def tune(*args, cwd, debug=False):
    if not TUNE.exists():
        pytest.fail(f"console script {TUNE} is missing: install the package (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k != "TUNE_DEBUG"}
    if debug:
        env["TUNE_DEBUG"] = "1"
    # a guard against a hung command, not a speed check: torch's import alone can take tens of seconds
    # on a loaded 2-core machine
    return subprocess.run([str(TUNE), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "my_recipe.py").write_text(textwrap.dedent(RECIPE))
    (tmp_path / "my_config.yaml").write_text(CONFIG)
    return tmp_path


def _line(stdout, tag):
    import json

    return json.loads(next(line for line in stdout.splitlines() if line.startswith(tag))[len(tag) + 1 :])


def assert_user_error(result, code, *fragments):
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    text = " ".join(result.stderr.split())  # messages are wrapped for the terminal
    for fragment in fragments:
        assert " ".join(fragment.split()) in text, result.stderr


def test_run_passes_resolved_config_and_overrides(files):
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "batch_size=8", "lr=2e-5", "~fail", cwd=files)
    assert result.returncode == 0, result.stderr
    argv = _line(result.stdout, "ARGV")
    assert argv == [
        str(files / "my_recipe.py"),
        "--config",
        str(files / "my_config.yaml"),
        "batch_size=8",
        "lr=2e-5",
        "~fail",
    ]
    cfg = _line(result.stdout, "CFG")
    assert cfg["batch_size"] == 8 and cfg["lr"] == 2e-5 and "fail" not in cfg
    assert "THING Fraction(1, 4)" in result.stdout


def test_short_form_and_component_swap(files):
    result = tune(
        "./my_recipe.py",
        "--config",
        "my_config.yaml",
        "thing=decimal.Decimal",
        "~thing.numerator",
        "~thing.denominator",
        "+thing.value=0.5",
        cwd=files,
    )
    assert result.returncode == 0, result.stderr
    assert "THING Decimal('0.5')" in result.stdout


def test_recipe_exit_status_is_returned(files):
    assert tune("run", "my_recipe.py", "--config", "my_config.yaml", "exit_code=3", cwd=files).returncode == 3


def test_a_new_key_is_added_and_a_misspelled_component_key_refused(files):
    # torchtune's command line: key=value adds a key the config lacks (a recipe's key check names a typo)
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "batch_sizee=4", cwd=files)
    assert result.returncode == 0, result.stderr
    assert _line(result.stdout, "CFG")["batch_sizee"] == 4
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "thing.numeratr=4", cwd=files)
    assert_user_error(result, 2, "got an unexpected keyword argument 'numeratr' (did you mean 'numerator'?)")
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "+batch_size=4", cwd=files)
    assert_user_error(result, 2, "already exists", "write 'batch_size=4'")


def test_recipe_tune_error_exits_1_without_traceback_and_with_it_in_debug(files):
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "fail=true", cwd=files)
    assert_user_error(result, 1, "the recipe stopped on purpose")
    debug = tune("run", "my_recipe.py", "--config", "my_config.yaml", "fail=true", cwd=files, debug=True)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "stopped on purpose" in debug.stderr


def test_a_bug_keeps_its_traceback(files):
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "crash=true", cwd=files)
    assert result.returncode == 1 and "Traceback" in result.stderr and "a bug in the recipe" in result.stderr


def test_run_missing_config_lists_builtins(files):
    result = tune("run", "my_recipe.py", cwd=files)
    assert_user_error(result, 2, "--config", "llama2/7B_full_low_memory", "your own YAML")
    result = tune("run", "full_finetune_single_device", cwd=files)
    if registry.get_recipe("full_finetune_single_device").path.is_file():
        assert_user_error(result, 2, "for full_finetune_single_device", "llama2/tiny_full")


def test_run_bad_recipe_and_bad_config(files):
    assert_user_error(
        tune("run", "full_finetune_single_devic", "--config", "x", cwd=files),
        2,
        "Did you mean 'full_finetune_single_device'",
        "tune ls",
    )
    assert_user_error(tune("run", "nope.py", "--config", "my_config.yaml", cwd=files), 2, "does not exist")
    assert_user_error(
        tune("run", "my_recipe.py", "--config", "llama2/7B_ful", cwd=files),
        2,
        "Did you mean 'llama2/7B_full'",
        "--config ./my_config.yaml",
    )
    (files / "broken.yaml").write_text("a: 1\nb: [1\n")
    assert_user_error(tune("run", "my_recipe.py", "--config", "broken.yaml", cwd=files), 2, "broken.yaml", "line 3")


def test_run_validates_components(files):
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "thing=fractions.Fractoin", cwd=files)
    assert_user_error(result, 2, "thing._component_", "fractions.Fractoin", "Did you mean fractions.Fraction")


def test_argparse_errors_exit_2(files):
    assert tune("run", cwd=files).returncode == 2
    assert tune("no-such-command", cwd=files).returncode == 2
    alone = tune(cwd=files)  # as torchtune's: the help, exit 0
    assert alone.returncode == 0 and "Welcome to the torchtune CLI!" in alone.stdout
    result = tune("ls", "--bogus", cwd=files)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr
    result = tune("run", "my_recipe.py", "--config", "my_config.yaml", "--bogus", cwd=files)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


@pytest.mark.parametrize("command", [[], ["run"], ["ls"], ["cp"], ["validate"], ["download"], ["export"]])
def test_help(files, command):
    result = tune(*command, "--help", cwd=files)
    assert result.returncode == 0 and result.stdout.startswith("usage: tune")


def ls_pairs(stdout: str) -> list:
    """(recipe, config) of each row `tune ls` prints (a blank recipe cell continues the row above)."""
    pairs, recipe = [], None
    for line in stdout.splitlines()[1:]:
        cells = line.split()
        if len(cells) == 2:
            recipe = cells[0]
        pairs.append((recipe, cells[-1]))
    return pairs


def test_ls_lists_recipes_and_configs(files):
    result = tune("ls", cwd=files)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RECIPE", "CONFIG"]
    assert lines[1].split() == ["full_finetune_single_device", "llama2/7B_full_low_memory"]  # the flagship first
    pairs = ls_pairs(result.stdout)
    assert pairs == [(r.name, c.name) for r in registry.get_all_recipes() for c in r.configs]
    # every YAML file shipped under recipes/configs is a config `tune ls` names, and the other way round
    configs_dir = registry.builtin_recipes_dir() / "configs"
    on_disk = sorted(p.relative_to(configs_dir).with_suffix("").as_posix() for p in configs_dir.rglob("*.yaml"))
    assert sorted(config for _, config in pairs) == on_disk


def _a_builtin_config():
    return next((c for r in registry.get_all_recipes() for c in r.configs if c.path.is_file()), None)


def test_cp_copies_a_config_and_respects_no_clobber(files):
    cfg = _a_builtin_config()
    if cfg is None:
        pytest.skip("no built-in config file is written yet")
    recipe = registry.recipe_for_config(cfg.name)
    copied = registry.recipe_header(recipe, cfg) + cfg.path.read_text()  # the copy names its recipe first
    result = tune("cp", cfg.name, "copy", cwd=files)
    assert result.returncode == 0, result.stderr
    assert (files / "copy.yaml").read_text() == copied
    (files / "sub").mkdir()
    assert tune("cp", cfg.name, "sub", cwd=files).returncode == 0
    assert (files / "sub" / cfg.path.name).read_text() == copied
    (files / "copy.yaml").write_text("mine: 1\n")
    result = tune("cp", cfg.name, "copy.yaml", "--no-clobber", cwd=files)
    assert result.returncode == 0 and "not overwriting" in result.stdout
    assert (files / "copy.yaml").read_text() == "mine: 1\n"
    # a file that holds something else is not overwritten without --force
    assert_user_error(tune("cp", cfg.name, "copy.yaml", cwd=files), 2, "not overwriting it", "--force")
    assert (files / "copy.yaml").read_text() == "mine: 1\n"
    assert tune("cp", cfg.name, "copy.yaml", "--force", cwd=files).returncode == 0
    assert (files / "copy.yaml").read_text() == copied
    assert tune("cp", cfg.name, "copy.yaml", cwd=files).returncode == 0  # the same text: written again
    # a missing parent folder needs --make-parents
    result = tune("cp", cfg.name, "new/dir/c.yaml", cwd=files)
    assert result.returncode == 2 and "--make-parents" in result.stderr
    assert tune("cp", cfg.name, "new/dir/c.yaml", "--make-parents", cwd=files).returncode == 0
    assert (files / "new" / "dir" / "c.yaml").read_text() == copied


def test_cp_bad_names(files):
    assert_user_error(tune("cp", "llama2/tiny_ful", "x.yaml", cwd=files), 2, "Did you mean 'llama2/tiny_full'")
    assert_user_error(tune("cp", "generate", "x", cwd=files), 2, "generate.py", "generate.yaml")


def test_validate(files):
    result = tune("validate", "my_config.yaml", cwd=files)
    assert result.returncode == 0 and "Config is well-formed" in result.stdout
    (files / "bad.yaml").write_text(
        textwrap.dedent("""\
        thing:
          _component_: fractions.Fraction
          numeratr: 1
        other:
          _component_: no_such_pkg_xyz.Model
        ref: ${missing}
    """)
    )
    result = tune("validate", "bad.yaml", cwd=files)
    assert_user_error(
        result,
        2,
        "3 problems",
        "  - thing: ",
        "'numeratr' (did you mean 'numerator'?)",
        "  - other._component_: ",
        "no_such_pkg_xyz",
        "  - ref: ",
    )
    result = tune("validate", "my_config.yaml", "thing.denominatorr=2", cwd=files)
    assert_user_error(result, 2, "'denominatorr' (did you mean 'denominator'?)")
    assert_user_error(tune("validate", "nope.yaml", cwd=files), 2, "does not exist")


def test_cp_copies_a_recipe_into_a_folder(files):
    recipe = registry.get_recipe("full_finetune_single_device")
    if not recipe.path.is_file():
        pytest.skip("the recipe file is not written yet")
    (files / "out").mkdir()
    result = tune("cp", "full_finetune_single_device", "out", cwd=files)
    assert result.returncode == 0, result.stderr
    assert (files / "out" / "full_finetune_single_device.py").read_text() == recipe.path.read_text()
    result = tune("cp", "full_finetune_single_device.py", "mine", cwd=files)  # suffix added
    assert result.returncode == 0 and (files / "mine.py").is_file()


def test_cat_prints_a_config_as_torchtune_does(files):
    cfg = _a_builtin_config()
    if cfg is None:
        pytest.skip("no built-in config file is written yet")
    import yaml

    result = tune("cat", cfg.name, cwd=files)
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(cfg.path.read_text())
    assert result.stdout == yaml.dump(data, default_flow_style=False, sort_keys=False, indent=4, width=80)
    assert "#" not in result.stdout.split("\n")[0]  # no comments, first key first
    result = tune("cat", cfg.name, "--sort", cwd=files)
    assert [k for k in yaml.safe_load(result.stdout)] == sorted(data)
    assert "is a recipe, not a config" in tune("cat", "full_finetune_single_device", cwd=files).stdout
    assert tune("cat", "no_such_config", cwd=files).returncode == 2


def test_out_of_scope_torchtune_recipes_and_configs_get_one_paragraph(files):
    for args in (
        ["run", "lora_finetune_single_device", "--config", "llama2/7B_lora_single_device"],
        ["lora_finetune_distributed", "--config", "x"],
        ["cp", "llama3_2/1B_qat_lora", "x.yaml"],
        ["cat", "llama2/7B_lora"],
    ):
        result = tune(*args, cwd=files)
        assert result.returncode == 2 and "Traceback" not in result.stderr, args
        assert "out of this library's scope" in " ".join(result.stderr.split()), args
    (files / "lora.yaml").write_text(
        "model:\n  _component_: torchtune.models.llama2.lora_llama2_7b\n  lora_rank: 8\n"
        "tokenizer:\n  _component_: no_such_package.tokenizer\n"
    )
    result = tune("validate", "lora.yaml", cwd=files)  # one paragraph, before any component is imported
    assert_user_error(result, 2, "model._component_: torchtune.models.llama2.lora_llama2_7b", "LoRA")
    assert "no_such_package" not in result.stderr
