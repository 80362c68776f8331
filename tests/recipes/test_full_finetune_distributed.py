"""full_finetune_distributed through the real `tune run --nproc_per_node 2` (gloo, CPU, tiny model).

Two processes must train exactly what one process trains with the same global batch and seed (both
optimizer modes; with ``seed: null`` the ranks share rank 0's drawn seed) and compute its validation loss
(each rank on its share), resume on 2 or 1 processes with the losses of the uninterrupted run, survive a
rank killed mid-save, write a final folder that transformers loads and that eval_after_training scores as
eleuther_eval does, and refuse bad launches with one message each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests._helpers.tiny_run import TUNE, alpaca_examples, distributed_config, make_tiny_run, read_losses, run_tune
from tests._helpers.tiny_run import run_recipe as run_single_device

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
    cfg = OmegaConf.load(single)
    # 5 held-out examples, 2 per rank's batch: rank 0 gets 3 (2 batches), rank 1 gets 2 (1 batch, then a
    # forward pass that does not count, so that both ranks run the same FSDP collectives)
    heldout = root / "heldout.json"
    heldout.write_text(json.dumps(alpaca_examples(29)[24:]))
    cfg.validation_dataset = {**OmegaConf.to_container(cfg.dataset), "data_files": str(heldout)}
    OmegaConf.save(cfg, single)
    return single, distributed_config(single, root / "dist.yaml")


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
    assert sorted(p.name for p in (base_run / "dist").glob("*_*") if p.is_dir()) == [
        "epoch_0",
        "epoch_1",
        "step_2",
        "step_4",
    ]
    assert (base_run / "dist" / "step_2" / "sharded_state" / "__1_0.distcp").is_file()
    assert (base_run / "dist" / "epoch_0" / "model-00001-of-00001.safetensors").is_file()
    assert not (base_run / "dist" / "epoch_1" / "recipe_state.pt").exists()  # final: weights only


def test_validation_split_over_ranks_gives_the_one_process_loss(base_run):
    from torchtune.training.metric_logging import read_metrics

    def val_losses(run: Path) -> list:
        return [row["val_loss"] for row in read_metrics(run / "logs" / "metrics.jsonl") if "val_loss" in row]

    dist, single = val_losses(base_run / "dist"), val_losses(base_run / "single")
    assert len(dist) == len(single) == 2  # at each epoch end
    assert dist == pytest.approx(single, abs=1e-5, rel=0)


def test_standard_optimizer_with_accumulation_and_clipping_matches_one_process(configs, tmp_path):
    single, dist = configs
    kv = dict(optimizer_in_bwd=False, gradient_accumulation_steps=2, clip_grad_norm=0.5, save_every_n_steps=None)
    result = _tune_dist(dist, tmp_path / "dist", *_overrides(**kv), "global_batch_size=2", "epochs=1")
    _ok(result)
    assert "batch: 1 per rank x 2 ranks = global batch 2; x 2 accumulation steps = 4 examples" in result.stderr
    run_single_device(single, output_dir=str(tmp_path / "single"), epochs=1, batch_size=2, **kv)
    from torchtune.training.metric_logging import read_metrics

    d = [r for r in read_metrics(tmp_path / "dist" / "logs" / "metrics.jsonl") if "loss" in r]
    s = [r for r in read_metrics(tmp_path / "single" / "logs" / "metrics.jsonl") if "loss" in r]
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


def _base_model_dir(configs) -> Path:
    return Path(str(OmegaConf.load(configs[1]).checkpointer.checkpoint_dir))


def _export(*argv) -> tuple[int, str]:
    """``tune export`` in this process; (exit status, stderr with its line breaks joined)."""
    import contextlib
    import io

    from torchtune._cli.tune import main as tune_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = tune_main(["export", *map(str, argv)])
    return rc, " ".join(err.getvalue().split())


@pytest.fixture(scope="module")
def exported_step(configs, base_run, tmp_path_factory) -> Path:
    """The 2-process run's step_4 (sharded state only) exported to a HF folder, in several files."""
    out = tmp_path_factory.mktemp("export") / "step_4_hf"
    rc, err = _export(
        base_run / "dist" / "step_4", "--output-dir", out, "--base-model-dir", _base_model_dir(configs),
        "--max-shard-size", "40KB",
    )  # fmt: skip
    assert rc == 0, err
    return out


def test_step_folder_exports_to_hf_with_the_models_logits(base_run, exported_step):
    """transformers' logits on the exported folder equal the run's model at step 4 (its sharded weights
    loaded into our llama2), fp32, 1e-5; the folder has what vLLM and from_pretrained read."""
    import json

    import torch.distributed.checkpoint as dcp
    import transformers

    from tests._helpers.tiny_run import TINY_DIMS
    from torchtune.models.llama2 import llama2

    config = json.loads((exported_step / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    index = json.loads((exported_step / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert (exported_step / "tokenizer.model").is_file() and (exported_step / "generation_config.json").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported_step, attn_implementation="eager").eval()
    ours = llama2(vocab_size=config["vocab_size"], **TINY_DIMS).eval()
    state = {"model": ours.state_dict()}
    dcp.load(state, checkpoint_id=str(base_run / "dist" / "step_4" / "sharded_state"), no_dist=True)
    ours.load_state_dict(state["model"])
    tokens = torch.randint(0, config["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), atol=1e-5, rtol=0)


@pytest.mark.parametrize("epoch", ["epoch_0", "epoch_1"])
def test_epoch_folders_export_with_their_own_weights(base_run, tmp_path, epoch):
    """A distributed epoch_N (HF weights, beside the sharded state unless final) exports its HF weights as
    they are, with no --base-model-dir and without the training state."""
    from safetensors.torch import load_file

    out = tmp_path / "hf"
    rc, err = _export(base_run / "dist" / epoch, "--output-dir", out)
    assert rc == 0, err
    assert not (out / "sharded_state").exists() and not (out / "recipe_state.pt").exists()
    exported, saved = (
        load_file(out / "model.safetensors"),
        load_file(base_run / "dist" / epoch / "model-00001-of-00001.safetensors"),
    )
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)


def test_eleuther_eval_scores_the_step_folder_itself(configs, base_run, exported_step, tmp_path, monkeypatch):
    """eleuther_eval on the sharded step_4 gives the scores of its exported HF folder."""
    pytest.importorskip("lm_eval")
    import json

    from torchtune._cli.tune import main as tune_main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    run = OmegaConf.load(configs[1])
    common = [f"model.{k}={v}" for k, v in run.model.items() if k != "_component_"]
    common += ["~model.intermediate_dim", f"tokenizer.path={run.tokenizer.path}", "tasks=[demo_mc]", "limit=8"]
    scores = {}
    folders = {
        "step": [f"checkpointer.checkpoint_dir={base_run / 'dist' / 'step_4'}"],  # checkpoint_files: not read
        "export": [
            f"checkpointer.checkpoint_dir={exported_step}",
            "checkpointer.checkpoint_files=[model.safetensors.index.json]",
        ],
    }
    for name, folder in folders.items():
        out = tmp_path / f"{name}.json"
        argv = ["run", "eleuther_eval", "--config", "llama2/tiny_eval", *common, f"results_file={out}"]
        assert tune_main([*argv, *folder]) == 0
        scores[name] = json.loads(out.read_text())["results"]["demo_mc"]
    for metric in ("acc,none", "acc_norm,none"):
        assert scores["step"][metric] == pytest.approx(scores["export"][metric], abs=1e-6), metric


@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        (
            "no_base",
            ["step checkpoint of full_finetune_distributed", "--base-model-dir", "checkpointer.checkpoint_dir"],
        ),
        ("damaged_shard", ["__0_0.distcp does not match the checksum", "cannot be read"]),
        ("missing_shard", ["__1_0.distcp is missing"]),
        ("no_manifest", ["has no manifest.json", "unfinished save"]),
        ("unknown_model_type", ["model_type 'mamba'", "does not implement"]),
        ("more_layers", ["are not those of the model", "in the base model but not in the checkpoint: model.layers.2."]),
        ("wider", ["are not those of the model in", "model.embed_tokens.weight: (400, 32) vs (400, 64)"]),
    ],
)
def test_bad_step_folders_get_one_message_and_write_nothing(configs, step_copy, tmp_path, case, fragments):
    base, out = _base_model_dir(configs), tmp_path / "hf"
    if case == "damaged_shard":
        shard = step_copy / "sharded_state" / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif case == "missing_shard":
        (step_copy / "sharded_state" / "__1_0.distcp").unlink()
    elif case == "no_manifest":
        (step_copy / "manifest.json").unlink()
    elif case == "unknown_model_type":
        base = Path(shutil.copytree(base, tmp_path / "base"))
        config = json.loads((base / "config.json").read_text())
        (base / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    elif case in ("more_layers", "wider"):  # the folder of another model (config.json and weights)
        from tests._helpers.tiny_run import make_hf_checkpoint

        vocab = json.loads((base / "config.json").read_text())["vocab_size"]
        dims = {"num_layers": 4} if case == "more_layers" else {"embed_dim": 64}
        base = make_hf_checkpoint(tmp_path / "base", vocab_size=vocab, **dims)
    argv = [step_copy, "--output-dir", out] + ([] if case == "no_base" else ["--base-model-dir", base])
    rc, err = _export(*argv)
    assert rc != 0
    assert err.count("Error:") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_eval_after_training_scores_the_sharded_final_model_as_eleuther_eval_does(configs, tmp_path, monkeypatch):
    """Both ranks run lm-eval's requests on the sharded model; rank 0 prints the table once and writes the
    scores into the final folder, and eleuther_eval on that folder gives the same numbers."""
    from torchtune._cli.tune import main as tune_main

    _, dist = configs
    node = "{tasks: [demo_mc], limit: 6, num_fewshot: null, batch_size: 4, max_seq_length: null}"
    result = _tune_dist(dist, tmp_path / "dist", "epochs=1", "max_steps_per_epoch=1", f"eval_after_training={node}")
    _ok(result)
    assert result.stdout.replace(" ", "").count("|demo_mc|") == 1, result.stdout[-3000:]
    final = tmp_path / "dist" / "epoch_0"
    saved = json.loads((final / "eval_results.json").read_text())["results"]["demo_mc"]
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    cfg = OmegaConf.load(dist)
    model_keys = [f"model.{k}={v}" for k, v in cfg.model.items() if k != "_component_"]
    rc = tune_main(
        ["run", "eleuther_eval", "--config", "llama2/tiny_eval", f"checkpointer.checkpoint_dir={final}"]
        + [f"tokenizer.path={cfg.tokenizer.path}", *model_keys, "~model.intermediate_dim", "tasks=[demo_mc]", "limit=6"]
        + [f"results_file={tmp_path / 'again.json'}"]
    )
    assert rc == 0
    scores = json.loads((tmp_path / "again.json").read_text())["results"]["demo_mc"]
    assert scores["acc,none"] == pytest.approx(saved["acc,none"], abs=1e-6)
    assert scores["acc_norm,none"] == pytest.approx(saved["acc_norm,none"], abs=1e-6)


def test_missing_data_column_stops_every_rank_with_one_message_before_any_weight_is_read(configs, tmp_path):
    _, dist = configs
    data = tmp_path / "no_output.json"
    data.write_text(json.dumps([{k: v for k, v in row.items() if k != "output"} for row in alpaca_examples(8)]))
    result = _tune_dist(dist, tmp_path / "o", f"dataset.data_files={data}")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr[-6000:]
    assert [line.startswith("Error:") for line in result.stderr.splitlines()].count(True) == 1, result.stderr[-6000:]
    message = " ".join(result.stderr.split())
    assert "has no column(s) 'output'" in message and "Sharded over" not in message  # no rank loaded weights


# Started by every Python process that has its folder first on PYTHONPATH: in the worker of rank 1 it
# makes the process SIGKILL itself once its shard of the named step checkpoint is written and before
# the folder is published (``_own_files`` runs between the two), so the kill lands inside that window
# on every run, however loaded the machine, where a test polling the folder from outside can miss it.
_KILL_RANK_1_MID_SAVE = """
import os
import signal

if os.environ.get("RANK") == "1" and os.environ.get("KILL_RANK_1_AFTER_SHARD_OF"):
    import torchtune.training.distributed._checkpoint as _checkpoint

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
    assert launcher.returncode == 1, output[-3000:]
    # one message, from the launcher, naming the process that died; the survivor's lost connection is not shown
    assert "Traceback" not in output and "[rank" not in output, output[-6000:]
    assert output.count("was killed by") == 1 and "Rank 1 (pid " in output and "was killed by SIGKILL" in output
    assert f"The last complete checkpoint is {out}/epoch_0; resume with:" in output  # step 3, after step_2
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
    assert "global_batch_size=4 does not split evenly over 3 processes" in " ".join(result.stderr.split())


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


def test_bf16_rounded_run_resumes_exactly_on_two_processes(configs, tmp_path):
    """bf16 weights with bf16_stochastic_rounding (as the shipped distributed configs train): each rank
    rounds its shards with its own stream, saved with the step checkpoint, so a resume on 2 processes
    continues the uninterrupted losses exactly."""
    _, dist = configs
    # 4 steps, resumed from step 2: step 4's loss depends on how step 3 was rounded
    kv = ("dtype=bf16", "bf16_stochastic_rounding=True", "seed=7", "epochs=1", "max_steps_per_epoch=4")
    _ok(_tune_dist(dist, tmp_path / "full", *kv))
    state = tmp_path / "full" / "step_2" / "recipe_state.pt"
    rounding = torch.load(state, weights_only=False)["stochastic_rounding"]
    assert len(rounding["per_rank"]) == 2
    _ok(
        _tune_dist(
            dist, tmp_path / "resumed", *kv, "resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={state}"
        )
    )
    full, resumed = read_losses(tmp_path / "full"), read_losses(tmp_path / "resumed")
    assert len(full) == 4 and resumed == full[2:]


# Config components the workers import (their folder is put on PYTHONPATH): rank 0's metric logger sends its
# launcher (the `tune` process, the workers' parent) a signal when a step is logged, as a Ctrl-C or a scheduler's
# SIGTERM would; a loss kills one rank's process with SIGKILL at its n-th training step.
_COMPONENTS = """
import os
import signal

from torchtune.modules.loss import CrossEntropyLoss
from torchtune.training.metric_logging import DiskLogger


class SignalLauncherAt(DiskLogger):
    def __init__(self, log_dir, sigint_at=None, sigterm_at=None, **kw):
        super().__init__(log_dir, **kw)
        self.at = {sigint_at: signal.SIGINT, sigterm_at: signal.SIGTERM}

    def log_dict(self, payload, step):
        super().log_dict(payload, step)
        if "loss" in payload and step in self.at:
            os.kill(os.getppid(), self.at[step])


class KillRankAt(CrossEntropyLoss):
    def __init__(self, rank, at_step):
        super().__init__()
        self.rank, self.at_step, self.steps = str(rank), at_step, 0

    def forward(self, output_proj, hidden, labels):
        if hidden.requires_grad:
            self.steps += 1
            if self.steps == self.at_step and os.environ.get("RANK") == self.rank:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(output_proj, hidden, labels)
"""


@pytest.fixture
def components_env(tmp_path) -> dict:
    folder = tmp_path / "components"
    folder.mkdir()
    (folder / "dist_components.py").write_text(_COMPONENTS)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)}


def _one_stop(result: subprocess.CompletedProcess, name: str) -> tuple:
    """(step, folder, resume command) of the one stop message of ``result``; nothing else alarming printed."""
    import re

    err = result.stderr
    assert "Traceback" not in err + result.stdout and "[rank" not in err, err[-6000:]
    assert err.count(f"Received {name}") == 1 and err.count("Stopped by") == 1, err[-6000:]
    found = re.search(rf"Stopped by {name} after step (\d+); checkpoint saved to (\S+)\.\nResume with:\n  (.+)\n", err)
    assert found, err[-3000:]
    return int(found.group(1)), Path(found.group(2)), found.group(3)


def test_sigint_and_sigterm_to_the_launcher_save_on_every_rank_and_print_the_exact_resume_command(
    configs, tmp_path, components_env
):
    """Ctrl-C (SIGINT) reaches `tune`, the launcher: every process finishes its step, saves, exits 130; the
    launcher prints one message whose command, torchrun options included, resumes on two processes, where
    a SIGTERM (a scheduler's) does the same with 143 and a new LR given on resume is used."""
    import shlex

    _, dist = configs
    out = tmp_path / "out"
    logger = ["metric_logger._component_=dist_components.SignalLauncherAt", "+metric_logger.sigint_at=2"]
    first = run_tune(
        ["run", *NPROC, "full_finetune_distributed", "--config", str(dist), f"output_dir={out}", *logger],
        env=components_env,
    )
    assert first.returncode == 130, first.stderr[-6000:]
    step, folder, command = _one_stop(first, "SIGINT")
    assert step in (2, 3) and folder == out / f"step_{step}" and (folder / "recipe_state.pt").is_file()
    assert command.startswith(f"tune run {' '.join(NPROC)} full_finetune_distributed --config {dist} ")
    assert command.endswith(f"resume_from_checkpoint=True checkpointer.recipe_checkpoint={folder}/recipe_state.pt")

    args = shlex.split(command)[1:] + ["+metric_logger.sigterm_at=5", "optimizer.lr=1e-4"]
    second = run_tune(args, env=components_env)
    assert second.returncode == 143, second.stderr[-6000:]
    assert "batch: 2 per rank x 2 ranks = global batch 4" in second.stderr  # resumed on two processes
    assert "Resuming with optimizer.lr=0.0001 (the checkpoint's run had 0.001)" in " ".join(second.stderr.split())
    step2, folder2, command2 = _one_stop(second, "SIGTERM")
    assert step2 in (5, 6) and (folder2 / "recipe_state.pt").is_file() and command2.startswith("tune run --standalone")
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, step2 + 1))  # each step once


def test_a_rank_killed_mid_step_ends_the_other_with_one_message_naming_it(configs, tmp_path, components_env):
    _, dist = configs
    out = tmp_path / "out"
    kill = ["loss._component_=dist_components.KillRankAt", "+loss.rank=1", "+loss.at_step=3"]
    result = run_tune(
        ["run", *NPROC, "full_finetune_distributed", "--config", str(dist), f"output_dir={out}", *kill],
        env=components_env,
    )
    err = result.stderr
    assert result.returncode == 1, err[-6000:]
    assert "Traceback" not in err + result.stdout and "[rank" not in err and "gloo" not in err, err[-6000:]
    message = " ".join(err.split())
    assert message.count("was killed by") == 1 and "Rank 1 (pid " in message and "was killed by SIGKILL" in message
    assert f"The last complete checkpoint is {out}/step_2; resume with: tune run {' '.join(NPROC)} " in message


def test_validate_accepts_the_resume_that_tune_run_accepts(configs, base_run, tmp_path, capsys):
    """A step folder of this recipe holds shards, no model.safetensors: `tune validate` checks it as the recipe
    reads it (the base folder's headers, the sharded resume state), and refuses what the recipe refuses."""
    from torchtune._cli.tune import main

    _, dist = configs
    state = base_run / "dist" / "step_2" / "recipe_state.pt"
    args = ["validate", str(dist), "--recipe", "full_finetune_distributed", f"output_dir={tmp_path / 'out'}"]
    resume = ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={state}", "seed=null"]
    assert main([*args, *resume]) == 0, capsys.readouterr().err
    assert f"resume state {state}: step 2" in capsys.readouterr().out
    other = ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={base_run}/single/step_2/recipe_state.pt"]
    assert main([*args, *other]) != 0
    assert "was written by the single-device recipe" in " ".join(capsys.readouterr().err.split())
