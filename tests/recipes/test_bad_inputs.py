"""Every bad input gets one clear paragraph naming the key or file, a non-zero exit, no traceback.

Each case is a real `tune` command line. To keep the suite fast they run one after another in ONE
Python process through `torchtune._cli.tune.main` (the console script's entry point), by a small
driver that records each exit status and stderr; a case that escapes as an uncaught exception is
recorded with its traceback. That process has bitsandbytes and torchao made uninstallable by a
`sitecustomize.py` on its PYTHONPATH. One case also runs through the installed `tune` script itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._helpers.tiny_run import REPO_ROOT, TUNE, make_hf_checkpoint, make_tiny_run

DRIVER = '''
"""Run `tune` command lines (a JSON list of cases) in this process; write rc and stderr of each."""
import contextlib, io, json, logging, os, sys, traceback

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.__stderr__)
from torchtune._cli.tune import main

results = {}
for case in json.load(open(sys.argv[1])):
    saved_env, err = dict(os.environ), io.StringIO()
    os.environ.update(case.get("env", {}))
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(case["argv"])
            except BaseException:  # what the console script would show as a crash
                traceback.print_exc()
                rc = "uncaught"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    results[case["name"]] = {"rc": rc, "stderr": err.getvalue()}
json.dump(results, open(sys.argv[2], "w"))
'''

# Makes the optional optimizer packages look uninstalled, as `import` would report it.
SITECUSTOMIZE = """
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("bitsandbytes", "torchao"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

# name: (overrides, exit status, substrings the message must contain).  {T} is the fixture folder.
CASES = {
    "checkpoint_dir_missing": (
        ["checkpointer.checkpoint_dir={T}/no_such_dir"],
        1,
        ["{T}/no_such_dir", "checkpointer.checkpoint_dir"],
    ),
    "checkpoint_file_missing": (
        ["checkpointer.checkpoint_files=[nope.safetensors]"],
        1,
        ["{T}/base/nope.safetensors", "checkpointer.checkpoint_files"],
    ),
    "checkpoint_shapes_vs_builder": (
        ["model.embed_dim=64"],
        1,
        # caught from config.json before any weight is read
        ["does not fit {T}/base/config.json", "hidden_size: config.json 32, model 64", "model._component_"],
    ),
    "config_json_vs_weights": (
        ["checkpointer.checkpoint_dir={T}/bad_config_json"],
        1,
        ["{T}/bad_config_json/config.json", "hidden_size: config.json 64, model 32", "checkpointer.checkpoint_dir"],
    ),
    "tokenizer_bigger_than_vocab": (
        ["checkpointer.checkpoint_dir={T}/vocab_100", "model.vocab_size=100"],
        1,
        ["{T}/tok/tokenizer.model", "400 tokens", "embedding table has 100 rows", "tokenizer.path"],
    ),
    "dataset_missing": (["dataset.data_files={T}/missing.json"], 1, ["{T}/missing.json", "dataset.data_files"]),
    "dataset_malformed": (
        ["dataset.data_files={T}/malformed.json"],
        1,
        ["{T}/malformed.json", "dataset.data_files", "malformed"],
    ),
    "dataset_without_columns": (
        ["dataset.data_files={T}/wrong_columns.json"],
        1,
        ["{T}/wrong_columns.json", "'instruction', 'output'", "dataset.column_map"],
    ),
    "dataset_empty_list": (
        ["dataset.data_files={T}/empty.json"],
        1,
        ["{T}/empty.json", "dataset.data_files", "0 rows"],
    ),
    "dataset_empty_file": (
        ["dataset.data_files={T}/zero_bytes.json"],
        1,
        ["{T}/zero_bytes.json", "dataset.data_files", "is empty"],
    ),
    "resume_without_recipe_checkpoint": (["resume_from_checkpoint=True"], 2, ["checkpointer.recipe_checkpoint"]),
    "resume_recipe_checkpoint_missing": (
        ["resume_from_checkpoint=True", "checkpointer.recipe_checkpoint={T}/prev/step_9/recipe_state.pt"],
        1,
        ["{T}/prev/step_9/recipe_state.pt", "checkpointer.recipe_checkpoint"],
    ),
    "resume_other_model": (
        ["resume_from_checkpoint=True", "checkpointer.recipe_checkpoint={R}", "model.num_layers=3"],
        1,
        ["does not fit", "num_hidden_layers: config.json 2, model 3", "model._component_"],
    ),
    "resume_other_optimizer_in_bwd": (
        ["resume_from_checkpoint=True", "checkpointer.recipe_checkpoint={R}", "optimizer_in_bwd=False"],
        1,
        ["optimizer_in_bwd=True", "optimizer_in_bwd=False"],
    ),
    "output_dir_inside_checkpoint_dir": (
        ["output_dir={T}/base/out"],
        1,
        ["checkpointer.output_dir={T}/base/out", "checkpointer.checkpoint_dir={T}/base"],
    ),
    "device_cuda_on_cpu_machine": (["device=cuda"], 1, ["device=cuda", "device=cpu"]),
    "device_cuda_7": (["device=cuda:7"], 1, ["device=cuda:7"]),
    "bitsandbytes_not_installed": (
        ["optimizer._component_=bitsandbytes.optim.PagedAdamW"],
        2,
        ["optimizer._component_", "bitsandbytes", "pip install bitsandbytes"],
    ),
    "torchao_not_installed": (
        ["optimizer._component_=torchao.optim.AdamW8bit"],
        2,
        ["optimizer._component_", "torchao", "pip install torchao"],
    ),
    "batch_size_zero": (["batch_size=0"], 2, ["batch_size", "got 0"]),
    "negative_lr": (["optimizer.lr=-1e-3"], 2, ["optimizer.lr", "-0.001"]),
    "max_steps_per_epoch_zero": (["max_steps_per_epoch=0"], 2, ["max_steps_per_epoch", "got 0"]),
}


def _fill(text: str, folder: Path) -> str:
    return text.replace("{T}", str(folder)).replace("{R}", str(folder / "prev" / "step_1" / "recipe_state.pt"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny run, plus the bad files the cases point at."""
    folder = tmp_path_factory.mktemp("bad_inputs")
    make_tiny_run(folder)
    make_hf_checkpoint(folder / "vocab_100", vocab_size=100)  # fits model.vocab_size=100, not the tokenizer
    shutil.copytree(folder / "base", folder / "bad_config_json")
    config = json.loads((folder / "base" / "config.json").read_text())
    (folder / "bad_config_json" / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    (folder / "malformed.json").write_text('[{"instruction": "Add.", "output": ]')
    (folder / "wrong_columns.json").write_text(json.dumps([{"question": "q", "answer": "a"}] * 4))
    (folder / "empty.json").write_text("[]")
    (folder / "zero_bytes.json").write_text("")
    return folder


@pytest.fixture(scope="module")
def results(folder) -> dict:
    """Run every case in one driver process; returns {name: {"rc", "stderr"}}."""
    base = [
        "run",
        "full_finetune_single_device",
        "--config",
        str(folder / "config.yaml"),
        f"output_dir={folder / 'out'}",
    ]
    cases = [  # first a good 2-step run: its step_1 is the checkpoint the resume cases use
        {
            "name": "good_run",
            "argv": base
            + [f"output_dir={folder / 'prev'}", "epochs=1", "max_steps_per_epoch=2", "save_every_n_steps=1"],
        },
        *(
            {"name": name, "argv": base + [_fill(o, folder) for o in overrides]}
            for name, (overrides, _, _) in CASES.items()
        ),
        {"name": "debug_shows_traceback", "argv": base + ["device=cuda"], "env": {"TUNE_DEBUG": "1"}},
    ]
    (folder / "cases.json").write_text(json.dumps(cases))
    (folder / "driver.py").write_text(DRIVER)
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # the device cases are about a machine without a GPU: hide any GPU this one has
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.pop("TUNE_DEBUG", None)
    # The installed `tune` script itself, on one case, alongside the driver (both mostly import time).
    script = subprocess.Popen(
        [TUNE, *base, "device=cuda"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    )
    try:
        proc = subprocess.run(
            [sys.executable, str(folder / "driver.py"), str(folder / "cases.json"), str(folder / "results.json")],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            cwd=REPO_ROOT,
        )
        script_stderr = script.communicate(timeout=300)[1]
    finally:
        if script.poll() is None:
            script.kill()
    assert proc.returncode == 0, proc.stderr[-5000:]
    results = json.loads((folder / "results.json").read_text())
    assert results["good_run"]["rc"] == 0, results["good_run"]["stderr"][-3000:]
    results["installed_tune_script"] = {"rc": script.returncode, "stderr": script_stderr}
    return results


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_clear_error(results, folder, name):
    _, rc, needles = CASES[name]
    result = results[name]
    stderr = result["stderr"]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert result["rc"] == rc, stderr[-3000:]
    message = stderr[stderr.index("Error:") :]  # what precedes it is progress output of the dataset loader
    flat = " ".join(message.split())
    for needle in needles:
        assert _fill(needle, folder) in flat, flat


def test_debug_env_adds_the_traceback(results):
    stderr = results["debug_shows_traceback"]["stderr"]
    assert "Traceback" in stderr and "Error: device=cuda" in stderr


def test_installed_tune_script_prints_one_paragraph(results):
    rc, stderr = results["installed_tune_script"]["rc"], results["installed_tune_script"]["stderr"]
    assert rc == 1, stderr
    assert "Traceback" not in stderr
    message = stderr[stderr.index("Error:") :].strip()
    assert message.startswith("Error: device=cuda was asked for") and "\n\n" not in message, stderr
