"""torchtune.training alone builds the step a recipe runs, and the layering holds.

The training step here is assembled from torchtune.training's public functions only (this file does
not import ``recipes``); its first losses must be those the real ``tune`` command logs.
"""

import ast
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests._helpers.tiny_run import REPO_ROOT, make_tiny_run, read_losses, run_tune
from torchtune import config, training, utils


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("layer"))


def _first_losses_from_the_training_layer(config_path: Path, steps: int, **overrides) -> list:
    cfg = OmegaConf.load(config_path)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    settings = training.RunSettings(
        optimizer_in_bwd=cfg.optimizer_in_bwd,
        batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        seed=cfg.seed,
        max_steps_per_epoch=cfg.max_steps_per_epoch,
        epochs=cfg.epochs,
    )
    assert training.resolve_resume(cfg, settings) is None
    seed = utils.set_seed(cfg.seed)
    device, dtype = torch.device(cfg.device), utils.get_dtype(cfg.dtype, torch.device(cfg.device))
    checkpointer = training.build_checkpointer(cfg.checkpointer, None)
    model = training.build_model(
        cfg.model, device=device, dtype=dtype, state_dict=checkpointer.load_checkpoint()["model"]
    )
    tokenizer = config.instantiate(cfg.tokenizer)
    grad_norm = training.GradNormTracker()
    optimizer = training.build_optimizer(
        cfg.optimizer, model, optimizer_in_bwd=settings.optimizer_in_bwd, grad_norm=grad_norm
    )
    loss_fn = config.instantiate(cfg.loss)
    data = training.build_dataloader(
        cfg.dataset, tokenizer, batch_size=settings.batch_size, shuffle=cfg.shuffle, seed=seed
    )
    scheduler = training.build_lr_scheduler(
        cfg.lr_scheduler, optimizer, num_training_steps=cfg.epochs * len(data.dataloader)
    )
    data.sampler.set_epoch(0)
    losses, norms = [], []
    for batch, _ in zip(data.dataloader, range(steps)):
        grad_norm.arm(device)
        losses.append(float(training.forward_backward(model, loss_fn, batch, device=device)))
        training.step_optimizer(optimizer, model.parameters(), grad_norm=grad_norm)
        scheduler.step()
        norms.append(grad_norm.pop())
    assert all(p.grad is None for p in model.parameters())  # consumed (in backward) or zeroed (standard)
    return losses, norms


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
def test_training_layer_alone_gives_the_recipes_first_losses(tiny, tmp_path, optimizer_in_bwd):
    losses, norms = _first_losses_from_the_training_layer(tiny, 3, optimizer_in_bwd=optimizer_in_bwd)
    out = tmp_path / "recipe"
    proc = run_tune(
        [
            "run",
            "full_finetune_single_device",
            "--config",
            str(tiny),
            f"output_dir={out}",
            "epochs=1",
            "max_steps_per_epoch=3",
            f"optimizer_in_bwd={optimizer_in_bwd}",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert losses == read_losses(out)  # the same steps, bit for bit
    from torchtune.training.metric_logging import read_metrics

    logged_norms = [row["grad_norm"] for row in read_metrics(out / "logs" / "metrics.jsonl")]
    assert norms == pytest.approx(logged_norms, rel=1e-6)


def test_train_step_from_config_is_the_same_step(tiny):
    cfg = OmegaConf.load(tiny)
    cfg.lr_scheduler = None
    torch.manual_seed(0)
    step = training.TrainStep.from_config(cfg, device=torch.device("cpu"), dtype=torch.float32)
    batch = {"tokens": torch.randint(1, 300, (2, 16)), "labels": torch.randint(1, 300, (2, 16))}
    first = step(batch)
    assert torch.isfinite(first) and first.ndim == 0
    assert float(step(batch)) < float(first)  # the optimizer stepped (in backward) between the calls
    assert isinstance(step.optimizer, utils.OptimInBackwardWrapper)


# --- layering: arrows point down, and only recipes call recipes' private methods ----------------------


def _python_files(*folders: str):
    for folder in folders:
        yield from (REPO_ROOT / folder).rglob("*.py")


def _recipe_private_methods() -> set:
    names = set()
    for path in _python_files("recipes"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names |= {
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef)
                    and item.name.startswith("_")
                    and not item.name.startswith("__")
                }
    return names


def test_nothing_in_the_library_imports_recipes():
    offenders = []
    for path in _python_files("torchtune"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "recipes" for a in node.names):
                offenders.append(str(path.relative_to(REPO_ROOT)))
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "recipes":
                offenders.append(str(path.relative_to(REPO_ROOT)))
    assert offenders == []


def test_no_code_outside_recipes_and_tests_calls_a_recipes_private_method():
    private = _recipe_private_methods()
    assert {"_setup_optimizer", "_stop_and_exit"} <= private  # the check sees the recipe's methods
    offenders = []
    for path in _python_files("torchtune", "benchmarks", "scripts"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} .{node.attr}")
    assert offenders == []
