"""A run never loses work: atomic checkpoints under kill -9 and a full disk, safe and checked loading,
graceful SIGINT/SIGTERM stops that resume exactly, the NaN guard, pruning and a bounded footprint.

Subprocesses are used only where a process must really die or receive a signal; everything else runs
the recipe in-process through ``recipe_main(argv)`` (the same parsing and error printing as ``tune``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recipes.full_finetune_single_device import RECIPE_NAME, recipe_main
from tests._helpers.tiny_run import REPO_ROOT, TUNE, make_tiny_run, read_losses, run_recipe, run_tune
from torchtune import training
from torchtune.training.metric_logging import read_metrics
from torchtune.utils._checkpointing import find_latest_checkpoint, verify_manifest
from torchtune.utils._checkpointing._manifest import MANIFEST_NAME, build_manifest

# The run every test compares against: 2 epochs x 6 steps, resumable step checkpoints every 4 steps.
# Saves, in order: step_4, epoch_0 (step 6), step_8, epoch_1 (final, weights only).
RUN = ["save_every_n_steps=4"]
ENV = {"PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _main(config: Path, *overrides: str) -> int:
    """Run the recipe in-process as `tune run` would; return its exit status."""
    try:
        recipe_main(["--config", str(config), *overrides])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _resume_args(folder: Path) -> list:
    return ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={folder / 'recipe_state.pt'}"]


def _flat(text: str) -> str:
    """Error paragraphs are wrapped for the terminal; compare with the line breaks undone."""
    return " ".join(text.split())


def _final_weights(output_dir: Path) -> dict:
    return load_file(str(Path(output_dir) / "epoch_1" / "model-00001-of-00001.safetensors"))


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory) -> Path:
    """An uninterrupted run; read-only for the tests (copy a folder before damaging it)."""
    out = tmp_path_factory.mktemp("reference") / "out"
    assert _main(tiny, f"output_dir={out}", *RUN) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "epoch_0",
        "epoch_1",
        "logs",
        "step_4",
        "step_8",
        "torchtune_config.yaml",  # the resolved config, written by the listed DiskLogger as torchtune does
    ]
    assert len(read_losses(out)) == 12
    return out


@pytest.fixture
def components(tmp_path, monkeypatch) -> str:
    """A module of config components for these tests, importable by its `_component_` path."""
    folder = tmp_path / "components"
    folder.mkdir()
    (folder / "reliability_components.py").write_text(
        textwrap.dedent('''
        import os
        import psutil
        from torchtune.modules.loss import CrossEntropyLoss
        from torchtune.training.metric_logging import DiskLogger

        class SignalAtStep(DiskLogger):
            """Logs like DiskLogger, and sends this process `signum` when step `at_step` is logged."""
            def __init__(self, log_dir, at_step, signum, **kw):
                super().__init__(log_dir, **kw)
                self.at_step, self.signum = at_step, signum
            def log_dict(self, payload, step):
                super().log_dict(payload, step)
                if step == self.at_step:
                    os.kill(os.getpid(), self.signum)

        class SignalInBackward(CrossEntropyLoss):
            """The recipe's loss; at its `at_call`-th call it arms a hook that sends this process `signum`
            from inside backward: after the output projection's gradient (in backward mode its step has
            run), before any decoder layer's gradient."""
            def __init__(self, at_call, signum):
                super().__init__()
                self.at_call, self.signum, self.calls, self.fired = at_call, signum, 0, False
            def forward(self, output_proj, hidden, labels):
                self.calls += 1
                if self.calls == self.at_call and hidden.requires_grad:
                    hidden.register_hook(self._signal)
                return super().forward(output_proj, hidden, labels)
            def _signal(self, grad):
                self.fired = True
                os.kill(os.getpid(), self.signum)

        class RssLogger(DiskLogger):
            """Logs like DiskLogger and records this process's resident memory at every step."""
            def __init__(self, log_dir, **kw):
                super().__init__(log_dir, **kw)
                self.rss = {}
            def log_dict(self, payload, step):
                super().log_dict(payload, step)
                self.rss[step] = psutil.Process().memory_info().rss
    ''')
    )
    monkeypatch.syspath_prepend(str(folder))
    return "reliability_components"


# ---------------------------------------------------------------------------------------------------
# 1. atomic checkpoints: kill -9 in the middle of a save, and a full disk
# ---------------------------------------------------------------------------------------------------
CRASHING_DRIVER = '''
"""`tune ...` whose 2nd safetensors write stops halfway through the file and kills the process."""
import os, signal, sys
from torchtune.training.checkpointing import _checkpointer

real_write, calls = _checkpointer._write_safetensors_file, []

def write_then_die(path, specs, tensors):
    calls.append(path)
    digest = real_write(path, specs, tensors)
    if len(calls) < 2:
        return digest
    with open(path, "r+b") as f:  # only the first half reached the disk
        f.truncate(os.path.getsize(path) // 2)
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)

_checkpointer._write_safetensors_file = write_then_die
from torchtune._cli.tune import main
sys.exit(main(sys.argv[1:]))
'''


@pytest.fixture(scope="module")
def crashing_run(tiny, tmp_path_factory):
    """Starts the run that is killed in its 2nd save; requested before `reference`, so they overlap."""
    folder = tmp_path_factory.mktemp("crash")
    (folder / "crash_in_save.py").write_text(CRASHING_DRIVER)
    out, stderr = folder / "out", open(folder / "stderr.txt", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(folder / "crash_in_save.py"),
            "run",
            "full_finetune_single_device",
            "--config",
            str(tiny),
            f"output_dir={out}",
            *RUN,
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=REPO_ROOT,
        env={**os.environ, **ENV, "PYTHONPATH": str(REPO_ROOT)},
    )
    yield proc, out, folder / "stderr.txt"
    if proc.poll() is None:
        proc.kill()
    stderr.close()


def test_kill_during_save_keeps_previous_checkpoint_and_resume_is_exact(tiny, crashing_run, reference):
    proc, out, stderr = crashing_run
    assert proc.wait(timeout=300) == -signal.SIGKILL, stderr.read_text()[-3000:]

    # Killed while writing epoch_0: the half-written folder never got the final name.
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-epoch_0-"), sorted(os.listdir(out))
    assert not (out / "epoch_0").exists()
    assert find_latest_checkpoint(out) == out / "step_4"
    assert verify_manifest(out / "step_4")["step"] == 4

    # The resume command for the previous checkpoint works, into the same output_dir.
    assert _main(tiny, f"output_dir={out}", *RUN, *_resume_args(out / "step_4")) == 0
    ref = read_losses(reference)
    # 6 steps logged before the kill; the resume drops the lines of steps 5 and 6 and logs them again
    assert [r["step"] for r in read_metrics(out / "logs" / "metrics.jsonl") if "loss" in r] == list(range(1, 13))
    assert read_losses(out) == ref  # identical, and no step twice
    _assert_same_weights(_final_weights(out), _final_weights(reference))
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]  # the next save cleaned up


def test_full_disk_during_save_is_reported_and_previous_kept(tiny, reference, tmp_path, monkeypatch, capsys):
    import errno

    out = tmp_path / "out"
    real_save, calls = torch.save, []

    def save_on_full_disk(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) < 2:  # step_4's recipe_state.pt; the 2nd (epoch_0's) finds the disk full
            return real_save(obj, f, *args, **kwargs)
        f.write(b"\0" * 100)  # a partial file, as a real full disk leaves
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f.path))

    monkeypatch.setattr(torch, "save", save_on_full_disk)
    assert _main(tiny, f"output_dir={out}", *RUN) == 1
    monkeypatch.undo()
    err = _flat(capsys.readouterr().err)
    assert "Traceback" not in err
    assert f"Saving the checkpoint {out / 'epoch_0'} failed: the disk is full" in err
    assert f"the previous checkpoint {out / 'step_4'} is kept" in err
    assert str(out / "step_4" / "recipe_state.pt") in err
    assert sorted(p.name for p in out.iterdir()) == [
        "logs",
        "step_4",
        "torchtune_config.yaml",
    ]  # partial folder removed
    verify_manifest(out / "step_4")

    assert _main(tiny, f"output_dir={out}", *RUN, *_resume_args(out / "step_4")) == 0
    ref = read_losses(reference)
    assert read_losses(out) == ref  # steps 5 and 6 logged again, once each
    _assert_same_weights(_final_weights(out), _final_weights(reference))


# ---------------------------------------------------------------------------------------------------
# 2. safe loading: damaged files are named, with the checkpoint to fall back to; weights_only loads
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
@pytest.mark.parametrize("file", ["model-00001-of-00001.safetensors", "recipe_state.pt"])
def test_damaged_checkpoint_names_file_and_fallback(tiny, reference, tmp_path, capsys, file, damage):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    path = out / "step_8" / file
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    resumed = tmp_path / "resumed"
    assert _main(tiny, f"output_dir={resumed}", *RUN, *_resume_args(out / "step_8")) == 1
    err = _flat(capsys.readouterr().err)
    assert "Traceback" not in err
    assert f"Checkpoint file {path}" in err
    assert ("truncated" if damage == "truncate" else "corrupted") in err
    # The newest complete checkpoint before step 8 is epoch_0 (step 6), and the key to set is named.
    fallback = out / "epoch_0" / "recipe_state.pt"
    assert f"checkpointer.recipe_checkpoint={fallback}" in err
    assert not resumed.exists() or not any(resumed.glob("step_*"))

    if file == "model-00001-of-00001.safetensors" and damage == "corrupt":  # the suggested fallback really resumes
        assert (
            _main(
                tiny,
                f"output_dir={resumed}",
                *RUN,
                f"checkpointer.recipe_checkpoint={fallback}",
                "resume_from_checkpoint=True",
            )
            == 0
        )
        assert read_losses(resumed) == read_losses(reference)[6:]


class _RunsCodeWhenUnpickled:
    """Unpickling this creates a marker folder: what a malicious recipe_state.pt could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_recipe_state_loads_weights_only_mapped_and_refuses_code(tiny, reference, tmp_path, capsys, monkeypatch):
    state_path = reference / "step_4" / "recipe_state.pt"
    # What we save is loadable with weights_only=True and no allow-list: tensors and primitives only.
    state = torch.load(state_path, weights_only=True)
    assert state["global_step"] == 4 and state["optimizer_in_bwd"] is True

    calls = []
    real_load = torch.load

    def spy(f, *args, **kwargs):
        calls.append((Path(f).name, kwargs.get("weights_only"), kwargs.get("mmap")))
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    assert _main(tiny, f"output_dir={tmp_path / 'ok'}", "epochs=1", *_resume_args(reference / "step_4")) == 0
    monkeypatch.undo()
    assert calls == [("recipe_state.pt", True, True)]  # weights come from safetensors, not pickle

    # A recipe_state.pt carrying a pickled object (with a matching manifest) is refused, unrun.
    folder = tmp_path / "step_4"
    shutil.copytree(reference / "step_4", folder)
    marker = tmp_path / "code_ran"
    torch.save({**state, "extra": _RunsCodeWhenUnpickled(marker)}, folder / "recipe_state.pt")
    (folder / MANIFEST_NAME).write_text(json.dumps(build_manifest(folder, step=4, epoch=0, intermediate=True)))
    assert _main(tiny, f"output_dir={tmp_path / 'bad'}", *_resume_args(folder)) == 1
    err = _flat(capsys.readouterr().err)
    assert "Traceback" not in err and str(folder / "recipe_state.pt") in err and "weights_only=True" in err
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# 3. graceful stop: SIGINT to a real `tune` process, resumed with the command it prints; SIGTERM
# ---------------------------------------------------------------------------------------------------
def test_sigint_saves_and_printed_command_resumes_exactly(tiny, reference, tmp_path):
    out = tmp_path / "out"
    metrics = out / "logs" / "metrics.jsonl"
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            [TUNE, "run", "full_finetune_single_device", "--config", str(tiny), f"output_dir={out}", *RUN],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **ENV},
            cwd=REPO_ROOT,
        )
        try:
            deadline = time.monotonic() + 240
            while not (metrics.exists() and metrics.read_text().strip()):
                assert proc.poll() is None and time.monotonic() < deadline, stderr_path.read_text()[-3000:]
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = stderr_path.read_text()
    assert rc == 128 + signal.SIGINT, err[-3000:]
    assert "Traceback" not in err
    stopped_at = int(re.search(r"Stopped by SIGINT after step (\d+)", err).group(1))
    assert 1 <= stopped_at < 12
    assert [r["step"] for r in read_metrics(metrics)] == list(range(1, stopped_at + 1))

    command = shlex.split(re.search(r"Resume with:\n\s+(.+)", err).group(1))
    assert command[:3] == ["tune", "run", "full_finetune_single_device"]
    assert command[-1].startswith("checkpointer.recipe_checkpoint=")
    assert Path(command[-1].split("=", 1)[1]).is_file()
    resumed = run_tune(command[1:], env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_losses(out) == read_losses(reference)  # every step once, identical to no interruption
    _assert_same_weights(_final_weights(out), _final_weights(reference))


@pytest.mark.parametrize("copied", [False, True])
def test_resume_command_names_the_recipe_that_ran(tmp_path, monkeypatch, copied):
    from torchtune._recipe_registry import get_recipe

    script = str(tmp_path / "my recipe.py") if copied else str(get_recipe("full_finetune_single_device").path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            script,
            "--config",
            "/cfg/run.yaml",
            "output_dir=/out",
            "seed=3",
            "resume_from_checkpoint=True",
            "checkpointer.recipe_checkpoint=/old.pt",
        ],
    )
    # resume_command reads only sys.argv: no recipe needs to be built for it.
    command = training.resume_command(RECIPE_NAME, Path("/out/step_7/recipe_state.pt"))
    assert shlex.split(command) == [
        "tune",
        "run",
        script if copied else "full_finetune_single_device",
        "--config",
        "/cfg/run.yaml",
        "output_dir=/out",
        "seed=3",
        "resume_from_checkpoint=True",
        "checkpointer.recipe_checkpoint=/out/step_7/recipe_state.pt",
    ]


@pytest.mark.parametrize("at_step", [3, 4])  # 4: the signal comes with a scheduled save (save_every_n_steps=4)
def test_sigterm_finishes_the_step_and_saves_once(tiny, reference, tmp_path, components, capsys, monkeypatch, at_step):
    from torchtune.training.checkpointing import _checkpointer

    saves = []
    real_save = _checkpointer.write_folder_atomically
    monkeypatch.setattr(
        _checkpointer,
        "write_folder_atomically",
        lambda destination, *a, **kw: saves.append(destination.name) or real_save(destination, *a, **kw),
    )
    out = tmp_path / "out"
    handler_before = signal.getsignal(signal.SIGTERM)
    rc = _main(
        tiny,
        f"output_dir={out}",
        *RUN,
        f"metric_logger={components}.SignalAtStep",
        f"+metric_logger.at_step={at_step}",
        f"+metric_logger.signum={int(signal.SIGTERM)}",
    )
    assert rc == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler_before
    err = capsys.readouterr().err
    folder = out / f"step_{at_step}"
    assert f"Stopped by SIGTERM after step {at_step}; checkpoint saved to {folder}" in err
    assert f"resume_from_checkpoint=True checkpointer.recipe_checkpoint={folder / 'recipe_state.pt'}" in err
    assert saves == [f"step_{at_step}"]  # the step finished, then one save; none after the signal's step
    assert verify_manifest(folder)["step"] == at_step

    assert _main(tiny, f"output_dir={out}", *RUN, *_resume_args(folder)) == 0
    assert read_losses(out) == read_losses(reference)


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
def test_sigterm_mid_backward_finishes_the_step_then_stops(
    tiny, reference, tmp_path, components, capsys, optimizer_in_bwd
):
    """The signal lands inside backward of step 3 (in backward mode some parameters are already updated,
    the rest are not): the step completes, then one checkpoint, and resuming from it is exact."""
    out = tmp_path / "out"
    mode = f"optimizer_in_bwd={optimizer_in_bwd}"
    rc = _main(
        tiny,
        f"output_dir={out}",
        *RUN,
        mode,
        f"loss._component_={components}.SignalInBackward",
        "+loss.at_call=3",
        f"+loss.signum={int(signal.SIGTERM)}",
    )
    assert rc == 128 + signal.SIGTERM
    folder = out / "step_3"
    assert f"Stopped by SIGTERM after step 3; checkpoint saved to {folder}" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(out / "logs" / "metrics.jsonl")] == [1, 2, 3]
    assert verify_manifest(folder)["step"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["logs", "step_3", "torchtune_config.yaml"]
    assert _main(tiny, f"output_dir={out}", *RUN, mode, *_resume_args(folder)) == 0
    full = reference  # an uninterrupted in-backward run; the standard mode needs its own
    if not optimizer_in_bwd:
        full = tmp_path / "full"
        assert _main(tiny, f"output_dir={full}", *RUN, mode) == 0
    assert read_losses(out) == read_losses(full)  # 3 steps, a stop mid-backward, a resume: identical
    _assert_same_weights(_final_weights(out), _final_weights(full))


# ---------------------------------------------------------------------------------------------------
# 4. divergence guard
# ---------------------------------------------------------------------------------------------------
def test_nan_loss_stops_naming_the_step_and_keeps_last_good_checkpoint(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    # An absurd learning rate: the weights blow up and the loss of step 4 is NaN (steps 1-3 finite: the
    # warm-up's first step trains at LR 0, and the loss of a step is that of the weights before its update).
    rc = _main(tiny, f"output_dir={out}", "optimizer.lr=1e30", "save_every_n_steps=1", "epochs=1")
    assert rc == 1
    err = _flat(capsys.readouterr().err)
    assert "Traceback" not in err
    assert "The loss became NaN or infinite at step 4 (epoch 0)" in err, err[-2000:]
    assert f"The last good checkpoint is {out / 'step_3'}" in err
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "logs") == ["step_1", "step_2", "step_3"]
    assert [r["step"] for r in read_metrics(out / "logs" / "metrics.jsonl")] == [1, 2, 3]
    verify_manifest(out / "step_3")


# ---------------------------------------------------------------------------------------------------
# 6. bounded footprint: pruning (never the resumed-from folder) and no host-memory growth
# ---------------------------------------------------------------------------------------------------
def test_pruning_and_host_memory_stay_bounded(tiny, tmp_path, components):
    from omegaconf import OmegaConf

    out = tmp_path / "out"
    cfg = OmegaConf.load(tiny)
    cfg.output_dir = str(out)
    cfg.epochs, cfg.save_every_n_steps, cfg.keep_last_n_checkpoints = 4, 2, 2
    cfg.metric_logger = {"_component_": f"{components}.RssLogger", "log_dir": "${output_dir}/logs"}
    recipe = run_recipe(cfg)
    rss = next(logger.rss for logger in recipe._metric_logger.loggers if hasattr(logger, "rss"))
    assert sorted(rss) == list(range(1, 25))
    # Between steps 5-7 and 18-20 lie 5 step saves and 2 epoch saves. Measured: < 1.1 MB of growth;
    # keeping each step's loss with its autograd graph (about 0.3 MB a step here) gives ~5 MB.
    growth_mb = (max(rss[s] for s in range(18, 21)) - min(rss[s] for s in range(5, 8))) / 2**20
    assert growth_mb < 3.0, {s: round(v / 2**20, 1) for s, v in rss.items()}
    # 6 steps per epoch, step saves every 2 steps inside an epoch: 2, 4, 8, 10, 14, 16, 20, 22.
    names = sorted(p.name for p in out.iterdir())
    assert names == ["epoch_0", "epoch_1", "epoch_2", "epoch_3", "logs", "step_20", "step_22", "torchtune_config.yaml"]

    # Resuming from step_20 into the same folder, keeping 1: the resumed-from folder is never pruned.
    cfg.epochs, cfg.keep_last_n_checkpoints = 5, 1
    cfg.resume_from_checkpoint = True
    cfg.checkpointer.recipe_checkpoint = str(out / "step_20" / "recipe_state.pt")
    cfg.metric_logger = {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": "${output_dir}/logs"}
    recipe = run_recipe(cfg)
    assert sorted(p.name for p in out.glob("step_*")) == ["step_20", "step_28"]
    assert (out / "epoch_4").is_dir()
