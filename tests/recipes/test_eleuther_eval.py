"""`tune run eleuther_eval`: the tiny config on the bundled offline tasks, checkpoints in both formats and
a step checkpoint of a run, and each bad input as one clear message."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval")

from tests._helpers.tiny_run import REPO_ROOT, TUNE  # noqa: E402
from torchtune._assets import asset_path  # noqa: E402
from torchtune._cli.tune import main as tune_main  # noqa: E402
from torchtune._errors import TuneError  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _tune_in_process(capsys, *argv):
    """``tune`` in this process (no interpreter start-up); returns (exit status, stdout, stderr)."""
    rc = tune_main(["run", "eleuther_eval", "--config", "llama2/tiny_eval", *argv])
    out = capsys.readouterr()
    return rc, out.out, " ".join(out.err.split())


def test_tiny_eval_through_tune_prints_table_and_writes_json(tmp_path):
    # results_file: null and the bundled weights (inside the package): eval_results.json in the working directory
    results = tmp_path / "eval_results.json"
    cmd = [TUNE, "run", "eleuther_eval", "--config", "llama2/tiny_eval", "limit=8"]
    run = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "|demo_mc |" in run.stdout and "acc_norm" in run.stdout and "exact_match" in run.stdout
    data = json.loads(results.read_text())
    assert data["settings"]["tasks"] == ["demo_mc", "demo_gen"] and data["settings"]["limit"] == 8
    assert data["checkpoint_dir"] == asset_path("demo/base_model")
    assert data["n-samples"]["demo_mc"] == {"original": 40, "effective": 8}
    acc = data["results"]["demo_mc"]["acc,none"]
    assert acc * 8 == pytest.approx(round(acc * 8)) and f"{acc:.4f}"[:3] in run.stdout


def _meta_folder(tmp_path):
    """The demo base model in Meta's format (consolidated.00.pth + params.json)."""
    from torchtune.models.llama2._convert_weights import tune_to_meta
    from torchtune.training import FullModelHFCheckpointer

    hf = FullModelHFCheckpointer(asset_path("demo/base_model"), ["model.safetensors"], output_dir=tmp_path / "x")
    folder = tmp_path / "meta"
    folder.mkdir()
    torch.save(tune_to_meta(hf.load_checkpoint()["model"]), folder / "consolidated.00.pth")
    (folder / "params.json").write_text(json.dumps({"dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2}))
    return folder


def test_meta_format_and_step_checkpoint_score_like_the_hf_folder(tmp_path, capsys, monkeypatch):
    """The same weights read from a Meta folder and from a run's step_N folder (with its recipe_state.pt
    and manifest) give the scores of the HF folder."""
    from torchtune.training import FullModelHFCheckpointer

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    hf = FullModelHFCheckpointer(asset_path("demo/base_model"), ["model.safetensors"], output_dir=tmp_path / "run")
    step = hf.save_checkpoint({"model": hf.load_checkpoint()["model"], "seed": 1}, epoch=0, step=3, intermediate=True)
    assert (step / "recipe_state.pt").is_file()
    scores = {}
    cases = {
        "hf": [],
        "step": [f"checkpointer.checkpoint_dir={step}"],
        "meta": [
            "checkpointer._component_=torchtune.training.FullModelMetaCheckpointer",
            f"checkpointer.checkpoint_dir={_meta_folder(tmp_path)}",
            "checkpointer.checkpoint_files=[consolidated.00.pth]",
        ],
    }
    for name, overrides in cases.items():
        # results_file: null writes next to the checkpoint scored (the step case); the others are told where
        out = step / "eval_results.json" if name == "step" else tmp_path / f"{name}.json"
        where = [] if name == "step" else [f"results_file={out}"]
        rc, _, err = _tune_in_process(capsys, "tasks=[demo_mc]", "limit=12", *where, *overrides)
        assert rc == 0, err
        scores[name] = json.loads(out.read_text())["results"]["demo_mc"]
    # the scores with the mode of the checkpoint files beside them: the umask's, not mkstemp's 0600
    umask = os.umask(0)
    os.umask(umask)
    modes = {
        stat.S_IMODE((step / f).stat().st_mode)
        for f in ("eval_results.json", "model-00001-of-00001.safetensors", "recipe_state.pt")
    }
    assert modes == {0o666 & ~umask}, (oct(umask), sorted(map(oct, modes)))
    for name in ("step", "meta"):
        for metric in ("acc,none", "acc_norm,none"):
            assert scores[name][metric] == pytest.approx(scores["hf"][metric], abs=1e-6), (name, metric)


def test_task_yaml_by_path(tmp_path, capsys, monkeypatch):
    """A task YAML of one's own (here: demo_mc renamed, 2-shot) is given by its path."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    bundled = os.path.join(asset_path("demo/eval"), "demo_mc.yaml")
    text = open(bundled, encoding="utf-8").read().replace("task: demo_mc", "task: my_mc")
    text = text.replace("!function demo_eval.load", "!function " + "demo_eval_copy.load")
    (tmp_path / "my_mc.yaml").write_text(text)
    (tmp_path / "demo_eval_copy.py").write_text(
        open(os.path.join(asset_path("demo/eval"), "demo_eval.py"), encoding="utf-8").read()
    )
    (tmp_path / "demo_eval.json").write_bytes(open(asset_path("demo/eval/demo_eval.json"), "rb").read())
    out = tmp_path / "r.json"
    rc, stdout, err = _tune_in_process(
        capsys, f"tasks=[{tmp_path / 'my_mc.yaml'}]", "limit=4", "num_fewshot=2", f"results_file={out}"
    )
    assert rc == 0, err
    data = json.loads(out.read_text())
    assert "my_mc" in data["results"] and data["n-shot"]["my_mc"] == 2 and "my_mc" in stdout


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["tasks=[demo_mcc]"], ["'demo_mcc' is not an lm-eval task", "Did you mean demo_mc"]),
        (["tasks=[truthfulqa_mc2]", "limit=2"], ["needs to download its data set", "tasks=[demo_mc]"]),
        (["tasks=[/no/such/task.yaml]"], ["The task file /no/such/task.yaml (in tasks) does not exist"]),
        (["tasks=[]"], ["tasks must list lm-eval task names"]),
        (["limit=1.5"], ["limit of 1 or more counts examples and must be whole"]),
        (["max_seq_length=512"], ["max_seq_length=512 does not fit the model, which reads at most 256"]),
        (["+batch_sizee=2"], ["unknown key 'batch_sizee' (did you mean batch_size?)"]),
        (["results_file=/proc/no/scores.json"], ["results_file=/proc/no/scores.json cannot be written"]),
    ],
    ids=[
        "unknown-task",
        "offline-download",
        "missing-yaml",
        "no-tasks",
        "fractional-limit",
        "too-long",
        "typo",
        "unwritable-results",
    ],
)
def test_bad_inputs_get_one_clear_message(overrides, fragments, tmp_path, capsys, monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    rc, _, err = _tune_in_process(capsys, f"results_file={tmp_path / 'r.json'}", *overrides)  # later ones win
    assert rc in (1, 2) and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    assert not (tmp_path / "r.json").exists()


def test_missing_lm_eval_prints_the_install_command(monkeypatch):
    from torchtune import evaluation

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    with pytest.raises(TuneError) as err:
        evaluation.import_lm_eval()
    assert str(err.value).endswith('pip install "lm-eval>=0.4.13,<0.5"')
    # The same range as the `eval` extra that `pip install "plaintune[eval]"` installs.
    assert '"lm-eval>=0.4.13,<0.5"' in (REPO_ROOT / "pyproject.toml").read_text()


def test_eval_after_training_scores_the_final_model_like_eleuther_eval(tmp_path, capsys, monkeypatch):
    """The finetune's eval_after_training writes the final epoch folder's eval_results.json and logs the
    scores; eleuther_eval on that folder gives the same numbers."""
    from omegaconf import OmegaConf

    from tests._helpers.tiny_run import build_recipe, make_tiny_run
    from torchtune.training.metric_logging import read_metrics

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    node = {"tasks": ["demo_mc"], "limit": 8, "num_fewshot": None, "batch_size": 4, "max_seq_length": None}
    config_path = make_tiny_run(tmp_path, eval_after_training=node, max_steps_per_epoch=2, batch_size=4)
    recipe = build_recipe(config_path)
    recipe.train()
    results = recipe.evaluate()
    recipe.cleanup()
    final = max((tmp_path / "out").glob("epoch_*"))
    saved = json.loads((final / "eval_results.json").read_text())
    acc = results["results"]["demo_mc"]["acc,none"]
    assert saved["results"]["demo_mc"]["acc,none"] == acc and saved["settings"]["limit"] == 8
    logged = [row for row in read_metrics(tmp_path / "out" / "logs" / "metrics.jsonl") if "eval/demo_mc/acc" in row]
    assert logged and logged[-1]["eval/demo_mc/acc"] == acc and logged[-1]["step"] == recipe.global_step
    assert "|demo_mc|" in capsys.readouterr().out.replace(" ", "")

    cfg = OmegaConf.load(config_path)
    out = tmp_path / "again.json"
    rc = tune_main(
        [
            "run",
            "eleuther_eval",
            "--config",
            "llama2/tiny_eval",
            f"checkpointer.checkpoint_dir={final}",
            f"tokenizer.path={cfg.tokenizer.path}",
            *(f"model.{k}={v}" for k, v in cfg.model.items() if k != "_component_"),
            *([] if "intermediate_dim" in cfg.model else ["~model.intermediate_dim"]),
            "tasks=[demo_mc]",
            "limit=8",
            f"results_file={out}",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    again = json.loads(out.read_text())["results"]["demo_mc"]
    assert again["acc,none"] == pytest.approx(acc, abs=1e-6)
    assert again["acc_norm,none"] == pytest.approx(results["results"]["demo_mc"]["acc_norm,none"], abs=1e-6)


@pytest.mark.parametrize(
    "node, fragment",
    [
        ({"tasks": ["demo_mc"]}, "eval_after_training must be null (no eval) or a mapping of exactly tasks, limit"),
        (
            {"tasks": ["demo_mc"], "limit": 0, "num_fewshot": None, "batch_size": 4, "max_seq_length": None},
            "eval_after_training.limit must be a number of examples",
        ),
    ],
)
def test_eval_after_training_is_checked_at_start(tmp_path, node, fragment):
    from omegaconf import OmegaConf

    from recipes.full_finetune_single_device import validate_config
    from tests._helpers.tiny_run import make_tiny_run

    cfg = OmegaConf.load(make_tiny_run(tmp_path, eval_after_training=node))
    with pytest.raises(TuneError) as err:
        validate_config(cfg)
    assert fragment in str(err.value)


def test_unknown_eval_task_stops_the_finetune_before_training(tmp_path, monkeypatch):
    from tests._helpers.tiny_run import build_recipe, make_tiny_run

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    node = {"tasks": ["demo_mcq"], "limit": None, "num_fewshot": None, "batch_size": 4, "max_seq_length": None}
    with pytest.raises(TuneError, match="Did you mean demo_mc"):
        build_recipe(make_tiny_run(tmp_path, eval_after_training=node))
    assert not (tmp_path / "out" / "logs").exists()  # nothing was started
