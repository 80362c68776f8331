"""full_finetune_distributed through the real `tune run --nproc_per_node 2` (gloo, CPU, tiny model).

Two processes must train exactly what one process trains with the same global batch and seed (both
optimizer modes; with ``seed: null`` the ranks share rank 0's drawn seed), resume on 2 or 1 processes
with the losses of the uninterrupted run, survive a rank killed mid-save, write a final folder that
transformers loads, and refuse bad launches with one message each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests._helpers.tiny_run import TUNE, make_tiny_run, read_losses, run_tune
from tests._helpers.tiny_run import run_recipe as run_single_device

DIST_KEYS = {
    "dist_backend": None,
    "fsdp_cpu_offload": False,
    "fsdp_reshard_after_forward": True,
    "fsdp_param_dtype": None,
    "fsdp_reduce_dtype": None,
    "async_checkpoint": False,
}
# 24 examples, global batch 4: 3 steps per epoch (capped), 2 epochs; step checkpoints every 2 steps.
RUN = dict(max_steps_per_epoch=3, save_every_n_steps=2)
NPROC = ["--standalone", "--nproc_per_node", "2"]


def _overrides(**kv) -> list:
    return [f"{k}={'null' if v is None else v}" for k, v in kv.items()]


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """(single-device config, distributed config): the same run, the second with the FSDP keys."""
    root = tmp_path_factory.mktemp("dist")
    single = make_tiny_run(root, **RUN)
    from recipes.full_finetune_distributed import RECIPE_KEYS

    cfg = OmegaConf.load(single)
    for key in [k for k in cfg if k not in RECIPE_KEYS]:
        cfg.pop(key)  # the single-device recipe's own keys (eval_after_training, ...)
    cfg.update(DIST_KEYS)
    dist = root / "dist.yaml"
    OmegaConf.save(cfg, dist)
    return single, dist


def _tune_dist(config: Path, out: Path, *extra: str, nproc: bool = True, timeout: float = 300):
    args = ["run", *(NPROC if nproc else []), "full_finetune_distributed", "--config", str(config)]
    return run_tune([*args, f"output_dir={out}", *extra], timeout=timeout)


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def _drawn_seed(run: Path) -> int:
    """The seed a ``seed: null`` run drew, as its step checkpoint records it."""
    return int(torch.load(run / "step_2" / "recipe_state.pt", weights_only=False)["seed"])


@pytest.fixture(scope="module")
def base_run(configs, tmp_path_factory):
    """The uninterrupted 2-process run (optimizer in backward, step checkpoints written in the background,
    ``seed: null`` with shuffling on, as the shipped large configs run) and its single-device twin with
    the seed that run drew. Were the seed drawn per rank, the ranks' slices of their own shuffles would
    overlap and no one-process run would see the same batches."""
    single, dist = configs
    root = tmp_path_factory.mktemp("base")
    _ok(_tune_dist(dist, root / "dist", "async_checkpoint=True", "seed=null"))  # its step checkpoints resume below
    run_single_device(single, output_dir=str(root / "single"), seed=_drawn_seed(root / "dist"))
    return root


def test_two_processes_train_what_one_process_trains_in_backward(base_run):
    dist, single = read_losses(base_run / "dist"), read_losses(base_run / "single")
    assert len(dist) == len(single) == 6
    assert dist == pytest.approx(single, abs=1e-5, rel=0)
    assert dist[-1] < dist[0]
    # what a user gets: a step checkpoint of shards, a resumable epoch folder with the full weights too
    assert sorted(p.name for p in (base_run / "dist").glob("*_*")) == ["epoch_0", "epoch_1", "step_2", "step_4"]
    assert (base_run / "dist" / "step_2" / "sharded_state" / "__1_0.distcp").is_file()
    assert (base_run / "dist" / "epoch_0" / "model.safetensors").is_file()
    assert not (base_run / "dist" / "epoch_1" / "recipe_state.pt").exists()  # final: weights only


def test_standard_optimizer_with_accumulation_and_clipping_matches_one_process(configs, tmp_path):
    single, dist = configs
    kv = dict(
        optimizer_in_bwd=False, gradient_accumulation_steps=2, clip_grad_norm=0.5, batch_size=2, save_every_n_steps=None
    )
    result = _tune_dist(dist, tmp_path / "dist", *_overrides(**kv), "epochs=1")
    _ok(result)
    assert "global batch 2 = 1 per rank x 2 ranks; x 2 accumulation steps = 4 examples" in result.stderr
    run_single_device(single, output_dir=str(tmp_path / "single"), epochs=1, **kv)
    from torchtune.utils.metric_logging import read_metrics

    d = list(read_metrics(tmp_path / "dist" / "logs" / "metrics.jsonl"))
    s = list(read_metrics(tmp_path / "single" / "logs" / "metrics.jsonl"))
    assert len(d) == len(s) == 3
    assert [r["loss"] for r in d] == pytest.approx([r["loss"] for r in s], abs=1e-5, rel=0)
    # the norm clipped by is the global one (summed over both ranks' shards)
    assert [r["grad_norm"] for r in d] == pytest.approx([r["grad_norm"] for r in s], rel=1e-5)
    assert all(r["grad_norm"] > 0.5 for r in d)  # so clipping was active


def test_layer_grouped_optimizer_in_backward_matches_one_process(configs, base_run, tmp_path):
    """One optimizer per decoder layer, stepped once FSDP has reduce-scattered the layer's gradients."""
    _, dist = configs
    seed = f"seed={_drawn_seed(base_run / 'dist')}"
    extra = ("optimizer_in_bwd_group=layer", "epochs=1", "save_every_n_steps=null", seed)
    _ok(_tune_dist(dist, tmp_path / "dist", *extra))
    assert read_losses(tmp_path / "dist") == pytest.approx(read_losses(base_run / "single")[:3], abs=1e-5, rel=0)


@pytest.mark.parametrize(("resume_from", "nproc"), [("step_4", True), ("epoch_0", False)])
def test_resume_continues_the_run_on_two_or_one_process(configs, base_run, tmp_path, resume_from, nproc):
    _, dist = configs
    state = base_run / "dist" / resume_from / "recipe_state.pt"
    result = _tune_dist(
        dist,
        tmp_path / "resumed",
        "resume_from_checkpoint=True",
        f"checkpointer.recipe_checkpoint={state}",
        "seed=null",  # the checkpoint's seed, on every rank
        nproc=nproc,
    )
    _ok(result)
    full, resumed = read_losses(base_run / "dist"), read_losses(tmp_path / "resumed")
    done = 4 if resume_from == "step_4" else 3
    assert len(resumed) == len(full) - done
    assert resumed == pytest.approx(full[done:], abs=1e-5, rel=0)


def test_a_second_run_into_the_output_dir_stops_every_rank_and_changes_nothing(configs, base_run, tmp_path):
    _, dist = configs
    out = tmp_path / "dist"
    shutil.copytree(base_run / "dist", out)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    result = _tune_dist(dist, out)
    message = " ".join(result.stderr.split())
    assert result.returncode == 1, result.stderr[-3000:]
    assert message.count("Error:") == 1 and f"output_dir={out} already holds another run" in message
    assert "nothing to resume: that run finished, epoch_1 is its final checkpoint" in message
    assert "overwrite=True" in message and "Loading" not in message
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_epoch_folder_loads_in_transformers_with_the_models_logits(base_run):
    """epoch_0 holds the HF weights and the sharded state of the same model: transformers' logits on the
    HF folder equal our model's on the sharded weights; the final folder equals the one-process run's."""
    import torch.distributed.checkpoint as dcp
    import transformers

    from tests._helpers.tiny_run import TINY_DIMS
    from torchtune.models.llama2 import llama2

    folder = base_run / "dist" / "epoch_0"
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ours = llama2(vocab_size=hf.config.vocab_size, **TINY_DIMS).eval()
    state = {"model": ours.state_dict()}
    dcp.load(state, checkpoint_id=str(folder / "sharded_state"), no_dist=True)
    ours.load_state_dict(state["model"])
    tokens = torch.randint(0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), atol=1e-5, rtol=0)
        final = transformers.LlamaForCausalLM.from_pretrained(base_run / "dist" / "epoch_1").eval()
        single = transformers.LlamaForCausalLM.from_pretrained(base_run / "single" / "epoch_1").eval()
        torch.testing.assert_close(final(tokens).logits, single(tokens).logits, atol=1e-4, rtol=0)


# Started by every Python process that has its folder first on PYTHONPATH: in the worker of rank 1 it
# makes the process SIGKILL itself once its shard of the named step checkpoint is written and before
# the folder is published (``_own_files`` runs between the two), so the kill lands inside that window
# on every run, however loaded the machine, where a test polling the folder from outside can miss it.
_KILL_RANK_1_MID_SAVE = """
import os
import signal

if os.environ.get("RANK") == "1" and os.environ.get("KILL_RANK_1_AFTER_SHARD_OF"):
    import torchtune.training._distributed_checkpoint as _checkpoint

    _own_files = _checkpoint._own_files

    def _kill_after_shard(folder, rank):
        if os.environ["KILL_RANK_1_AFTER_SHARD_OF"] in folder.name:
            os.kill(os.getpid(), signal.SIGKILL)
        return _own_files(folder, rank)

    _checkpoint._own_files = _kill_after_shard
"""


def test_kill_of_a_rank_during_a_step_save_leaves_the_previous_checkpoint(configs, tmp_path):
    from torchtune.utils._checkpointing import verify_manifest

    _, dist = configs
    out = tmp_path / "out"
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_KILL_RANK_1_MID_SAVE)
    cmd = [TUNE, "run", *NPROC, "full_finetune_distributed", "--config", str(dist), f"output_dir={out}"]
    pythonpath = os.pathsep.join(p for p in (str(inject), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": pythonpath,
        "KILL_RANK_1_AFTER_SHARD_OF": "step_4",
    }
    launcher = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600)
    output = launcher.stdout
    # rank 1 died with its shard of step_4 written and the folder unpublished
    assert list(out.glob(".tmp-step_4-*/sharded_state/__1_*.distcp")), output[-3000:]
    assert launcher.returncode != 0, output[-3000:]
    assert not (out / "step_4").exists()
    verify_manifest(out / "step_2")  # complete and intact: sizes and checksums of every file
    import torch.distributed.checkpoint as dcp

    from torchtune.models.llama2 import llama2

    cfg = OmegaConf.load(dist)
    model = llama2(**{k: v for k, v in cfg.model.items() if k != "_component_"})
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(out / "step_2" / "sharded_state"), no_dist=True)  # loadable


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nodes_started_with_different_configs_fail_with_one_message(configs, tmp_path):
    """Two "nodes" (two launchers meeting at one rendezvous) with different overrides."""
    _, dist = configs
    rdzv = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d"]
    rdzv += ["--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "disagree"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    nodes = [
        subprocess.Popen(
            [
                TUNE,
                "run",
                *rdzv,
                "full_finetune_distributed",
                "--config",
                str(dist),
                f"output_dir={tmp_path}",
                f"seed={s}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for s in (1, 2)
    ]
    try:
        outputs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert all(node.returncode != 0 for node in nodes)
    stderr = "\n".join(err for _, err in outputs)
    assert stderr.count("different configs") == 1, stderr[-4000:]
    message = " ".join(stderr.split())
    assert "seed: rank 0=1, rank 1=2" in message or "seed: rank 0=2, rank 1=1" in message


def test_nproc_with_a_single_device_recipe_is_refused_before_starting(configs):
    single, _ = configs
    result = run_tune(["run", *NPROC, "full_finetune_single_device", "--config", str(single)])
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert "runs in one process" in message and "full_finetune_distributed" in message
    assert "torch.distributed.run" not in result.stderr and "OMP_NUM_THREADS" not in result.stderr  # nothing started


def test_batch_that_does_not_split_is_refused_before_starting(configs):
    _, dist = configs
    result = run_tune(["run", "--nproc_per_node", "3", "full_finetune_distributed", "--config", str(dist)])
    assert result.returncode == 2
    assert "batch_size=4 (the global batch) does not split evenly over 3 processes" in " ".join(result.stderr.split())


def test_backend_that_does_not_fit_the_device_is_refused(configs):
    _, dist = configs
    result = run_tune(["run", *NPROC, "full_finetune_distributed", "--config", str(dist), "dist_backend=nccl"])
    assert result.returncode == 2
    assert "dist_backend: nccl does not work with device: cpu" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    "optimizer", ["bitsandbytes.optim.AdamW8bit", "bitsandbytes.optim.PagedAdamW", "torchao.optim.AdamW4bit"]
)
def test_optimizers_that_cannot_step_shards_are_refused_naming_the_alternative(configs, optimizer):
    from recipes.full_finetune_distributed import validate_config
    from torchtune._errors import ConfigError

    _, dist = configs
    cfg = OmegaConf.load(dist)
    cfg.optimizer = {"_component_": optimizer, "lr": 1e-3}
    with pytest.raises(ConfigError, match="torchao.optim.AdamW8bit"):
        validate_config(cfg)


def _failed_resume(configs, folder: Path, out: Path, *extra: str) -> str:
    """A 2-process resume from ``folder`` that must fail: every rank exits non-zero, one message (rank
    0's), no traceback. Returns the message with its line breaks joined."""
    _, dist = configs
    state = folder / "recipe_state.pt"
    result = _tune_dist(
        dist, out, "resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={state}", "seed=null", *extra
    )
    assert result.returncode != 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr[-6000:]
    assert [line.startswith("Error:") for line in result.stderr.splitlines()].count(True) == 1, result.stderr[-6000:]
    message = " ".join(result.stderr.split())
    assert str(folder) in message, message[-3000:]  # which folder
    return message


@pytest.fixture
def step_copy(base_run, tmp_path):
    """A copy of the 2-process run's step_4 folder, for a test to damage."""
    import shutil

    return Path(shutil.copytree(base_run / "dist" / "step_4", tmp_path / "ckpt" / "step_4"))


def test_resume_from_a_single_device_checkpoint_is_refused(configs, base_run, tmp_path):
    folder = base_run / "single" / "epoch_0"
    message = _failed_resume(configs, folder, tmp_path / "o")
    assert "written by the single-device recipe" in message and "checkpointer.recipe_checkpoint" in message


def test_resume_with_a_changed_optimizer_names_the_folder_and_the_fix(configs, base_run, tmp_path):
    """The saved AdamW state has no SGD momentum: torch.distributed.checkpoint raises CheckpointException
    (a BaseException) on every rank."""
    folder = base_run / "dist" / "step_4"
    message = _failed_resume(
        configs, folder, tmp_path / "o", "optimizer._component_=torch.optim.SGD", "+optimizer.momentum=0.9"
    )
    assert "momentum_buffer" in message and "this run's optimizer (SGD) keeps other state" in message
    assert "checkpointer.recipe_checkpoint" in message


def test_resume_from_a_folder_without_manifest_is_refused(configs, step_copy, tmp_path):
    (step_copy / "manifest.json").unlink()
    message = _failed_resume(configs, step_copy, tmp_path / "o")
    assert "manifest.json" in message and "checkpointer.recipe_checkpoint" in message


def test_resume_with_a_missing_shard_is_refused(configs, step_copy, tmp_path):
    (step_copy / "sharded_state" / "__1_0.distcp").unlink()
    message = _failed_resume(configs, step_copy, tmp_path / "o")
    assert "__1_0.distcp is missing" in message and "checkpointer.recipe_checkpoint" in message


def test_resume_with_a_damaged_shard_is_refused(configs, step_copy, tmp_path):
    shard = step_copy / "sharded_state" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    message = _failed_resume(configs, step_copy, tmp_path / "o")
    assert "__0_0.distcp does not match the checksum" in message and "checkpointer.recipe_checkpoint" in message


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
