"""`tune validate` runs the recipe's own checks (validate_config) without building anything, finding the
recipe of a built-in config itself and that of another file through --recipe."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from tests._helpers.tiny_run import run_tune
from torchtune import _recipe_registry as registry
from torchtune.config._source_signature import source_signature


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_builtin_config_gets_its_recipe_checks():
    result = run_tune(["validate", "llama2/7B_full_low_memory", "--config-only"])
    assert result.returncode == 0, result.stderr
    assert "passes the checks of the full_finetune_single_device recipe (validate_config)" in result.stdout
    assert "Not run (--config-only)" in result.stdout
    # without --config-only the files are checked too, and the 7B weights are not downloaded here
    result = run_tune(["validate", "llama2/7B_full_low_memory"])
    assert result.returncode == 1 and "passes the checks of the full_finetune_single_device recipe" in result.stdout
    assert "The tokenizer file '/tmp/Llama-2-7b-hf/tokenizer.model' (config key tokenizer.path)" in _flat(result.stderr)
    result = run_tune(["validate", "llama2/7B_full_low_memory", "gradient_accumulation_steps=4"])
    assert result.returncode == 2
    assert "gradient_accumulation_steps=4 cannot be used with optimizer_in_bwd=True" in _flat(result.stderr)


@pytest.mark.parametrize(
    "override, message",
    [
        ("dtype=fp-16", "dtype=fp-16 is not supported: fp16 training needs a gradient scaler"),
        ("dtype=half", "dtype=half (fp16) is not supported"),
        ("dtype=int8", "dtype='int8' is not a dtype this recipe trains in. Set dtype=bf16 (also spelled bfloat16)"),
        ("device=gpu", "device='gpu' is not a device name PyTorch knows"),
        ("eval_every_n_steps=10", "eval_every_n_steps=10 is set but validation_dataset is null"),
        ("checkpointer.recipe_checkpoint=/x/recipe_state.pt", "is set but resume_from_checkpoint is False"),
        ("metric_logger=[3]", "metric_logger.0 is 3, not a logger"),
        ("+batch_sizee=2", "unknown key 'batch_sizee' (did you mean batch_size?)"),
        ("save_every_n_steps=0", "save_every_n_steps must be a whole number of at least 1 or null, got 0"),
    ],
)
def test_recipe_checks_refuse(override, message):
    result = run_tune(["validate", "llama2/7B_full_single_device", override])
    assert result.returncode == 2, result.stdout
    assert message in _flat(result.stderr)


@pytest.mark.parametrize("spelling", ["bf16", "bfloat16", "BF16", "torch.bfloat16", "fp32", "float32"])
def test_dtype_spellings_accepted(spelling):
    result = run_tune(["validate", "llama2/7B_full_single_device", "--config-only", f"dtype={spelling}"])
    assert result.returncode == 0, result.stderr


def _shipped_configs():
    """(recipe, YAML) for every file under recipes/configs: registered ones with their recipe, the
    others (recipes/configs/NAME.yaml) with the recipe of that name."""
    pairs = [(r, c.path) for r in registry.get_all_recipes() for c in r.configs]
    registered = {path.resolve() for _, path in pairs}
    for path in sorted((registry.builtin_recipes_dir() / "configs").rglob("*.yaml")):
        if path.resolve() not in registered:
            recipe = registry.get_recipe(path.stem)
            assert recipe is not None, f"{path} is shipped but belongs to no recipe"
            pairs.append((recipe, path))
    return pairs


def test_own_yaml_needs_recipe_option(tmp_path):
    mine = tmp_path / "mine.yaml"
    text = registry.get_config("llama2/tiny_full").path.read_text() + "batch_sizee: 2\n"
    # without its comments (whose launch line names the recipe, as torchtune's configs do), no recipe is known
    mine.write_text("\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n")
    result = run_tune(["validate", str(mine)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # the generic checks cannot know the recipe's keys
    assert result.stdout == "Config is well-formed!\n"  # torchtune's line; what was not run goes to stderr
    assert "Not run: a recipe's own checks" in _flat(result.stderr) and "--recipe NAME" in result.stderr
    (tmp_path / "commented.yaml").write_text(text)  # the launch line in its comments names the recipe
    result = run_tune(["validate", str(tmp_path / "commented.yaml")], cwd=tmp_path)
    assert result.returncode == 2 and "unknown key 'batch_sizee' (did you mean batch_size?)" in _flat(result.stderr)
    result = run_tune(["validate", str(mine), "--recipe", "full_finetune_single_device"], cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown key 'batch_sizee' (did you mean batch_size?)" in _flat(result.stderr)
    copy = tmp_path / "my_recipe.py"  # a copied recipe file works as --recipe too
    copy.write_text(registry.get_recipe("full_finetune_single_device").path.read_text())
    result = run_tune(["validate", str(mine), "--recipe", str(copy)], cwd=tmp_path)
    assert result.returncode == 2 and "batch_sizee" in result.stderr
    result = run_tune(["validate", str(mine), "--recipe", "full_finetune_single_devise"], cwd=tmp_path)
    assert result.returncode == 2 and "Did you mean 'full_finetune_single_device'" in _flat(result.stderr)


def test_generate_recipe_checks():
    assert run_tune(["validate", "generate"]).returncode == 0
    result = run_tune(["validate", "generate", "top_k=0"])
    assert result.returncode == 2 and "top_k must be a whole number of at least 1, or null, got 0" in result.stderr
    result = run_tune(["validate", "generate", "prompt="])
    assert result.returncode == 2 and "prompt is empty" in result.stderr


def test_validate_imports_no_optional_package_and_builds_nothing():
    """bitsandbytes' import alone takes seconds (it loads torch's compiler stack): the 7B config's
    PagedAdamW is checked against its source instead. No model is built: no 7B-sized allocation."""
    code = (
        "import json, sys, time\n"
        # VmHWM, the peak of this process's own memory: getrusage's ru_maxrss keeps the peak of the
        # process before exec, which for a child of pytest is the (large) pytest process's
        "def peak_rss_mb():\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "    return int(line.split()[1]) / 1024\n"
        "start = time.perf_counter()\n"
        "from torchtune._cli.tune import main\n"
        "rc = main(['validate', 'llama2/7B_full_low_memory', '--config-only'])\n"
        "print(json.dumps({'rc': rc, 'bnb': 'bitsandbytes' in sys.modules, 'torchao': 'torchao' in sys.modules,\n"
        "    'rss_mb': peak_rss_mb(), 's': time.perf_counter() - start}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0 and not report["bnb"] and not report["torchao"], report
    assert report["rss_mb"] < 1500, report  # torch itself is ~400 MB; 7B bf16 weights would be 13.5 GB


COMPONENTS = [
    "bitsandbytes.optim.PagedAdamW",
    "bitsandbytes.optim.PagedAdamW8bit",
    "torchao.optim.AdamW8bit",
    "torchtune.models.llama2.llama2_7b",
    "torchtune.datasets.alpaca_dataset",
    "torchtune.training.FullModelHFCheckpointer",
    "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
    "torchtune.modules.loss.ChunkedCrossEntropyLoss",
    "torchtune.training.metric_logging.WandBLogger",
]


def _shape(signature):
    return [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in signature.parameters.values()]


@pytest.mark.parametrize("path", COMPONENTS)
def test_source_signature_equals_the_imported_one(path):
    from torchtune.config import import_component

    signature = source_signature(path)
    assert signature is not None, f"{path}: the source reader gave up"
    assert _shape(signature) == _shape(inspect.signature(import_component(path)))


def test_source_signature_gives_up_where_the_source_does_not_tell(tmp_path, monkeypatch):
    (tmp_path / "tt_src_pkg").mkdir()
    (tmp_path / "tt_src_pkg" / "__init__.py").write_text(
        "import dataclasses\n"
        "from .star import *\n"
        "@dataclasses.dataclass\nclass Data:\n    x: int = 1\n"
        "def deco(f):\n    return f\n"
        "@deco\ndef wrapped(a, b=2):\n    return a\n"
        "try:\n    from fast import thing\nexcept ImportError:\n    def thing(a):\n        return a\n"
    )
    (tmp_path / "tt_src_pkg" / "star.py").write_text("def hidden(a):\n    return a\n")
    (tmp_path / "tt_src_pkg" / "plain.py").write_text("def plain(a, /, c, *, b=2, **kw):\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert source_signature("tt_src_pkg.Data") is None  # a dataclass's __init__ comes from its fields
    assert source_signature("tt_src_pkg.wrapped") is None  # a decorator may change the signature
    assert source_signature("tt_src_pkg.thing") is None  # bound in a try/except
    assert source_signature("tt_src_pkg.hidden") is None  # only reachable through `import *`
    P = inspect.Parameter
    assert _shape(source_signature("tt_src_pkg.plain.plain")) == [
        ("a", P.POSITIONAL_ONLY, True),
        ("c", P.POSITIONAL_OR_KEYWORD, True),
        ("b", P.KEYWORD_ONLY, False),
        ("kw", P.VAR_KEYWORD, True),
    ]
    assert "tt_src_pkg" not in sys.modules  # read, never imported


def test_source_signature_is_confirmed_by_importing(tmp_path):
    """The source says Thing takes (a); at import time another module widens it. tune validate
    accepts what the imported class accepts: reading the source never makes validation stricter."""
    (tmp_path / "tt_src_base.py").write_text("class Base:\n    def __init__(self, a):\n        self.a = a\n")
    (tmp_path / "tt_src_patch.py").write_text(
        "import tt_src_base\n\ndef _init(self, a, extra=1):\n    self.a = a\n\ntt_src_base.Base.__init__ = _init\n"
    )
    (tmp_path / "tt_src_thing.py").write_text(
        "import tt_src_patch  # noqa\nfrom tt_src_base import Base\n\nclass Thing(Base):\n    pass\n"
    )
    (tmp_path / "c.yaml").write_text("thing:\n  _component_: tt_src_thing.Thing\n  a: 1\n  extra: 2\n")
    result = run_tune(
        ["validate", "c.yaml"],
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)},
    )
    assert result.returncode == 0, result.stderr
    (tmp_path / "c.yaml").write_text("thing:\n  _component_: tt_src_thing.Thing\n  a: 1\n  extr: 2\n")
    result = run_tune(
        ["validate", "c.yaml"],
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)},
    )
    assert result.returncode == 2 and "'extr' (did you mean 'extra'?)" in _flat(result.stderr)


def test_copied_config_names_its_recipe(tmp_path):
    """`tune cp` writes the recipe into the copy's first line: validate checks a typo without --recipe, and
    `tune run` with another built-in recipe says which one the copy is for."""
    assert run_tune(["cp", "llama2/tiny_full", str(tmp_path / "my.yaml")]).returncode == 0
    copy = tmp_path / "my.yaml"
    assert copy.read_text().startswith("# tune-recipe: full_finetune_single_device ")
    assert registry.recipe_for_config(str(copy)).name == "full_finetune_single_device"
    copy.write_text(copy.read_text().replace("batch_size:", "batch_sizee:"))
    result = run_tune(["validate", str(copy)], cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown key 'batch_sizee' (did you mean batch_size?)" in _flat(result.stderr)
    result = run_tune(["run", "generate", "--config", str(copy)], cwd=tmp_path)
    assert result.returncode == 2 and "was copied for the full_finetune_single_device recipe" in _flat(result.stderr)


def test_validate_does_no_work_beyond_the_checks(tmp_path):
    """`tune validate` on the tiny config imports nothing heavy beyond torch itself and `datasets` (the data
    check loads the data as the run does): no FSDP/DTensor or distributed checkpointing (a second of CPU, for
    a single-device recipe), no compiler (a meta-device normal_ imports it: the model's skeleton skips its
    initialisers), no lm-eval, transformers or optimizer packages. Measured on work done (modules
    imported), not on time."""
    heavy = [
        "torch.distributed.fsdp",
        "torch.distributed.tensor",
        "torch.distributed.checkpoint",
        "torch._dynamo",
        "lm_eval",
        "transformers",
        "bitsandbytes",
        "torchao",
    ]
    code = (
        "import json, sys\n"
        "from torchtune._cli.tune import main\n"
        f"rc = main(['validate', 'llama2/tiny_full', 'output_dir={tmp_path}'])\n"
        f"print(json.dumps({{'rc': rc, 'imported': [m for m in {heavy!r} if m in sys.modules]}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"rc": 0, "imported": []}, report
    assert "Inputs checked" in out.stdout and "tensor headers fit the model" in out.stdout, out.stdout


def test_config_given_as_tune_run_takes_it_is_the_config_and_no_option_is_abbreviated(capsys):
    """`tune validate --config X` was `--config-only` (argparse's prefix matching): X unchecked without a word."""
    import argparse

    from torchtune._cli.tune import build_parser, main

    assert main(["validate", "--config", "llama2/7B_full_low_memory", "gradient_accumulation_steps=4"]) == 2
    assert "gradient_accumulation_steps=4 cannot be used with optimizer_in_bwd=True" in _flat(capsys.readouterr().err)
    assert main(["validate", "--config", "llama2/7B_full_single_device", "--config-only"]) == 0
    assert "passes the checks of the full_finetune_single_device recipe" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["validate", "llama2/7B_full", "--config-o"])  # no prefix of --config-only stands for it
    assert "unrecognized arguments: --config-o" in capsys.readouterr().err
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert parser.allow_abbrev is False
    assert {name: p.allow_abbrev for name, p in subparsers.choices.items()} == dict.fromkeys(subparsers.choices, False)
