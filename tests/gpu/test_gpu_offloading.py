"""Activation offloading on a real GPU: the same gradients, about one layer input in flight in forward,
copies back that overlap backward compute, and weights never moved (also compiled).

Run with ``make test-gpu``; skipped with the reason where PyTorch sees no CUDA GPU.
"""

import json

import pytest
import torch

from torchtune.models.llama2 import llama2
from torchtune.modules import TransformerDecoderLayer
from torchtune.training._activations import (
    CudaCopies,
    NoOpManager,
    OffloadActivations,
    get_act_offloading_ctx_manager,
    set_activation_checkpointing,
)

pytestmark = pytest.mark.gpu

LAYERS, DIM, HEADS, BATCH, SEQ, VOCAB = 8, 512, 8, 4, 2048, 256
LAYER_INPUT = BATCH * SEQ * DIM * 4  # one fp32 layer input, a checkpoint boundary: 16 MiB


def _model(layers: int = LAYERS) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = llama2(
            vocab_size=VOCAB, num_layers=layers, num_heads=HEADS, num_kv_heads=HEADS, embed_dim=DIM, max_seq_len=SEQ
        )
    set_activation_checkpointing(model, TransformerDecoderLayer)
    return model


def _tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator).cuda()


def _step(model, ctx, tokens):
    with ctx:
        loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
    torch.cuda.synchronize()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("use_streams", [True, False])
def test_offloading_on_and_off_give_equal_gradients(use_streams):
    model, tokens = _model(), _tokens()
    want_loss, want = _step(model, NoOpManager(), tokens)
    ctx = OffloadActivations(model=model, use_streams=use_streams)
    for _ in range(2):  # the second step reuses the streams and the cached pinned buffers
        loss, got = _step(model, ctx, tokens)
        assert ctx.offloaded_tensors >= LAYERS and ctx.offloaded_bytes >= LAYERS * LAYER_INPUT
        torch.testing.assert_close(loss, want_loss, rtol=0, atol=0)  # the forward is untouched
        for name in want:
            # attention's backward kernels may add in another order from run to run
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def _memory_at_each_layer(model, ctx, tokens):
    """``memory_allocated`` as each decoder layer starts its forward, and the step's peak above the start."""
    seen = []
    hooks = [
        layer.register_forward_pre_hook(lambda *_: seen.append(torch.cuda.memory_allocated())) for layer in model.layers
    ]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    try:
        _step(model, ctx, tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return seen[:LAYERS], torch.cuda.max_memory_allocated() - start


def test_offloading_keeps_about_one_layer_input_in_flight():
    """However far the CPU runs ahead of the GPU, forward holds about one layer input for its copy,
    where checkpointing alone keeps every layer's input on the device until backward."""
    model, tokens = _model(), _tokens()
    ctx = OffloadActivations(model=model)
    _memory_at_each_layer(model, ctx, tokens)  # warm-up: pinned buffers, streams, cuBLAS workspace
    kept, kept_peak = _memory_at_each_layer(model, NoOpManager(), tokens)
    moved, moved_peak = _memory_at_each_layer(model, ctx, tokens)
    growth_kept = [m - kept[0] for m in kept]
    growth_moved = [m - moved[0] for m in moved]
    # the measurement can see a layer input: checkpointing alone grows by one per layer
    assert growth_kept[-1] >= (LAYERS - 1) * LAYER_INPUT * 0.95, growth_kept
    # offloaded: the previous layer's input waits for its copy, nothing older is held
    assert max(growth_moved) <= 1.5 * LAYER_INPUT, growth_moved
    # backward holds the layer input in use and the one being brought back, not all of them
    assert kept_peak - moved_peak >= (LAYERS - 4) * LAYER_INPUT, (kept_peak, moved_peak)


def test_copies_back_overlap_backward_compute(tmp_path):
    """In a profile of one step, most host->device time runs while a compute kernel runs on another stream."""
    from torch.profiler import ProfilerActivity, profile

    model, tokens = _model(), _tokens()
    ctx = OffloadActivations(model=model)
    _step(model, ctx, tokens)  # warm-up
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _step(model, ctx, tokens)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies_back = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    if not kernels:
        pytest.skip("the profiler recorded no CUDA kernels here (CUPTI unavailable)")
    assert len(copies_back) >= LAYERS, [e.get("name") for e in events if e.get("cat") == "gpu_memcpy"][:20]

    def stream(e):
        return e.get("args", {}).get("stream")

    def overlap(copy):
        start, end = copy["ts"], copy["ts"] + copy["dur"]
        covered = 0.0
        for k in kernels:
            if stream(k) != stream(copy):
                covered += max(0.0, min(end, k["ts"] + k["dur"]) - max(start, k["ts"]))
        return min(covered, copy["dur"])

    total = sum(c["dur"] for c in copies_back)
    overlapped = sum(overlap(c) for c in copies_back)
    assert overlapped >= 0.5 * total, f"{overlapped:.0f} of {total:.0f} us of copies back overlap compute"


class _Watch(CudaCopies):
    """The real CUDA engine, noting the storage of every tensor copied to the host."""

    def __init__(self):
        self.sources = []

    def copy(self, dst, src, non_blocking=True):
        if dst.device.type == "cpu":
            self.sources.append(src.untyped_storage()._cdata)
        super().copy(dst, src, non_blocking)


def test_compiled_layers_never_offload_weights():
    """Inductor may save transposed weights for backward: they share the weight's storage and stay put."""
    model, tokens = _model(layers=2), _tokens()
    want_loss, want = _step(model, NoOpManager(), tokens)
    for layer in model.layers:
        layer.compile()
    watch = _Watch()
    ctx = get_act_offloading_ctx_manager(model, True, copies=watch)
    loss, got = _step(model, ctx, tokens)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    assert watch.sources and not params & set(watch.sources)
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-5)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-5, msg=name)
