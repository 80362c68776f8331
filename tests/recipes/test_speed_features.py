"""Speed features of the recipe: the logged tokens/s count, no host syncs in unlogged steps,
compile with optimizer-in-backward hooks, packed datasets."""

import math
import traceback
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

import recipes.full_finetune_single_device as recipe_module
import torchtune.training.run._loop as training_loop
from benchmarks.bench_step import count_tokens
from recipes.full_finetune_single_device import FullFinetuneRecipeSingleDevice
from tests._helpers.tiny_run import make_tiny_run, read_losses
from torchtune import training

RECIPE_FILE = str(Path(recipe_module.__file__).resolve())
TRAINING_DIR = str(Path(training.__file__).resolve().parent)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("speed"))


def _recipe(config_path: Path, **overrides) -> FullFinetuneRecipeSingleDevice:
    cfg = OmegaConf.load(config_path)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    recipe = FullFinetuneRecipeSingleDevice(cfg)
    recipe.setup()
    return recipe


def _train(recipe: FullFinetuneRecipeSingleDevice) -> FullFinetuneRecipeSingleDevice:
    try:
        recipe.train()
    finally:
        recipe.cleanup()
    return recipe


class _OneSecondPerCall:
    """A ``time`` module whose ``perf_counter`` advances exactly 1 s per call."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
def test_logged_tokens_per_second_is_the_benchmark_count(tiny, tmp_path, monkeypatch, optimizer_in_bwd):
    # With a clock that ticks 1 s between the interval's start and its log, tokens_per_second is the
    # token count itself, which must be what benchmarks/bench_step.py counts for the same batches.
    from torchtune.training.metric_logging import read_metrics

    monkeypatch.setattr(training_loop, "time", _OneSecondPerCall())
    out = tmp_path / "o"
    recipe = _train(_recipe(tiny, output_dir=str(out), epochs=1, optimizer_in_bwd=optimizer_in_bwd))
    logged = [row["tokens_per_second"] for row in read_metrics(out / "logs" / "metrics.jsonl")]

    recipe._data.sampler.set_epoch(0)  # same seed and epoch: the same batches, in the same order
    batches = list(recipe._data.dataloader)
    expected = [count_tokens(b) for b in batches]
    assert len(logged) == len(expected) == 6
    assert logged == expected
    # non-padding tokens, not the padded batch size: the tiny data is padded
    assert sum(expected) < sum(b["tokens"].numel() for b in batches)


class _ScalarReads(TorchDispatchMode):
    """Records where each tensor -> Python scalar read (``item()``, ``int(t)``, ...) happens: on an
    accelerator each one waits for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = []
        self._last = None  # the storage of the last read: the elements of one tolist() are one read

    def _record(self) -> None:
        stack = traceback.extract_stack()
        self.calls.append(
            (
                [f.name for f in stack if f.filename == RECIPE_FILE],
                [f.name for f in stack if f.filename.startswith(TRAINING_DIR)],
                any("torch/utils/data" in f.filename for f in stack),
            )
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
            storage = args[0].untyped_storage()._cdata
            if storage != self._last:
                self._record()
            self._last = storage
        else:
            self._last = None
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        # a CPU tensor's tolist() reads its memory without an op (on a GPU it is a copy to the host)
        self._tolist = torch.Tensor.tolist

        def tolist(t):
            self._record()
            with torch.utils._python_dispatch._disable_current_modes():
                return self._tolist(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


def _classify(calls):
    kinds = []
    for recipe_frames, training_frames, in_dataloader in calls:
        if training_frames[-1:] == ["check"]:
            kinds.append("nan_check")  # NonFiniteLossGuard.check: before a log or a save
        elif training_frames[-1:] == ["num_tokens"]:
            kinds.append("num_tokens")
        elif training_frames[-1:] == ["num_label_tokens"]:
            kinds.append("num_label_tokens")
        elif "save_checkpoint" in recipe_frames:
            kinds.append("checkpoint")
        elif in_dataloader:
            kinds.append("data")  # collate on the host, before the batch moves to the device
        else:  # in the loop, the step or the hooks
            kinds.append("step:" + ">".join(recipe_frames) + "|" + ">".join(training_frames))
    return kinds


@pytest.mark.parametrize("optimizer_in_bwd", [True, False])
@pytest.mark.parametrize("log_every_n_steps", [1000, 1])
def test_no_host_sync_in_steps_that_are_not_logged(tiny, tmp_path, optimizer_in_bwd, log_every_n_steps):
    # Fused AdamW, as the shipped configs use. (The unfused single-tensor AdamW reads its step count
    # with item() from a host tensor: not a device sync, but on CPU it looks like one.)
    recipe = _recipe(
        tiny,
        output_dir=str(tmp_path / "o"),
        epochs=1,
        optimizer_in_bwd=optimizer_in_bwd,
        log_every_n_steps=log_every_n_steps,
        **{"optimizer.fused": True},
    )
    recorder = _ScalarReads()
    with recorder:
        _train(recipe)
    kinds = _classify(recorder.calls)
    steps = recipe.global_step
    assert steps == 6
    assert kinds.count("num_tokens") == steps  # counted on the host batch, never on the device
    assert kinds.count("num_label_tokens") == steps  # likewise
    step_syncs = [k for k in kinds if k.startswith("step:")]
    if log_every_n_steps > steps:  # nothing logged: no sync at all while training
        assert step_syncs == []
        assert kinds.count("nan_check") == 1  # once, before the epoch's checkpoint
    else:  # the detector does see syncs: one per logged step, which reads the loss, the gradient norm and
        # the NaN guard at once (fp32 weights: no weights_changed count); the guard's checks read nothing more
        assert step_syncs == ["step:train|log_step"] * steps
        assert kinds.count("nan_check") == 0
        assert not any("forward_backward" in k or "step_optimizer" in k for k in step_syncs)


def test_compile_gives_the_same_losses_with_in_backward_hooks(tiny, tmp_path):
    # compile: True compiles each decoder layer in place; the in-backward hooks sit on the same
    # parameters and must still step them. fp32, so eager and compiled agree to rounding.
    # Packed data: every batch has the same shape, so each layer compiles once (padded batches of
    # varying length would recompile with dynamic shapes and double the compile time).
    same = {
        "epochs": 1,
        "optimizer_in_bwd": True,
        "dataset.packed": True,
        "dataset.max_seq_len": 128,
        "max_steps_per_epoch": 4,
    }
    eager_dir, compiled_dir = tmp_path / "eager", tmp_path / "compiled"
    _train(_recipe(tiny, output_dir=str(eager_dir), **same))
    torch._dynamo.reset()  # counts only this run's compiles, not an earlier test's cache
    counters = torch._dynamo.utils.counters
    counters.clear()
    recipe = _train(_recipe(tiny, output_dir=str(compiled_dir), compile=True, **same))
    assert all(
        hasattr(layer, "_compiled_call_impl") and layer._compiled_call_impl is not None
        for layer in recipe._model.layers
    )
    eager, compiled = read_losses(eager_dir), read_losses(compiled_dir)
    assert len(eager) == len(compiled) == 4
    assert compiled == pytest.approx(eager, abs=1e-5)
    assert compiled[-1] < compiled[0]  # the hooks did step the parameters
    # The work compile did, not the time it took (a busy machine makes any time limit flaky): both
    # layers and all 4 steps share one graph of one frame, with no graph break and no recompile.
    stats = {k: dict(v) for k, v in counters.items() if v}
    assert counters["frames"]["ok"] == 1 and counters["stats"]["unique_graphs"] == 1, stats
    assert not counters["graph_break"] and not counters["recompiles"], stats


def test_packed_dataset_trains_in_fewer_steps_with_the_block_mask(tiny, tmp_path, monkeypatch):
    # The same examples, none cut (the tiny ones are 60-130 tokens with the Alpaca template), so
    # packs of 512 tokens hold several of them.
    same = {"dataset.max_seq_len": 512, "model.max_seq_len": 512, "batch_size": 2}
    unpacked = _train(_recipe(tiny, output_dir=str(tmp_path / "u"), epochs=1, **same))
    packed = _recipe(tiny, output_dir=str(tmp_path / "p"), epochs=1, **same, **{"dataset.packed": True})
    seen = []
    forward = packed._model.forward

    def recording_forward(tokens, *, mask=None, input_pos=None, **kw):
        seen.append((tokens.shape, mask, input_pos))
        return forward(tokens, mask=mask, input_pos=input_pos, **kw)

    monkeypatch.setattr(packed._model, "forward", recording_forward)
    _train(packed)

    losses = read_losses(tmp_path / "p")
    assert all(math.isfinite(x) for x in losses)
    assert unpacked.global_step == 12
    assert 2 <= packed.global_step < unpacked.global_step
    assert losses[-1] < losses[0]
    # the recipe hands the model the block-causal mask and per-example positions
    shape, mask, input_pos = seen[0]
    assert mask is not None and mask.shape == (shape[0], shape[1], shape[1]) and mask.dtype == torch.bool
    assert input_pos is not None and input_pos.shape == shape
    assert (input_pos == 0).sum() > shape[0]  # several examples per sequence restart at position 0
    assert not mask[0].equal(torch.tril(torch.ones(shape[1], shape[1], dtype=torch.bool)))
