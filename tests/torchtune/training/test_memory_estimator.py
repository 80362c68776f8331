"""tune estimate-memory's engine: each memory saver lowers the estimate by the expected amount,
categories add up, the fake run agrees with a real run, and the 7B targets hold."""

import pytest
import torch

from torchtune.config import load_config
from torchtune.training.estimate._memory_estimator import (
    CATEGORIES,
    StorageCounter,
    estimate_recipe_memory,
    measure_state_layout,
)

LAYERS, DIM, BATCH, SEQ = 3, 128, 2, 128
BSD4 = BATCH * SEQ * DIM * 4  # one fp32 layer input (a checkpoint boundary): 131072 bytes


def _cfg(*extra, vocab=512):
    return load_config(
        "llama2/7B_full_low_memory",
        [
            "model._component_=torchtune.models.llama2.llama2_tiny",
            f"+model.vocab_size={vocab}",
            f"+model.num_layers={LAYERS}",
            f"+model.embed_dim={DIM}",
            "+model.num_heads=4",
            "+model.num_kv_heads=4",
            "optimizer._component_=torch.optim.SGD",
            "~optimizer.weight_decay",
            "dtype=fp32",
            *extra,
        ],
    )


def _estimate(*extra, vocab=512, fake=True, attention="target"):
    return estimate_recipe_memory(
        _cfg(*extra, vocab=vocab), seq_len=SEQ, batch_size=BATCH, fake=fake, attention=attention
    )


def test_categories_add_up_to_total():
    est = _estimate()
    assert set(est.breakdown) == set(CATEGORIES)
    assert sum(est.breakdown.values()) == est.peak_bytes
    assert est.breakdown["weights"] == sum(-(-p // 512) * 512 for p in _param_bytes())
    assert "total" in est.format() and est.as_gb()["total"] == pytest.approx(est.peak_bytes / 1e9)


def _param_bytes():
    from torchtune.models.llama2 import llama2_tiny

    torch.manual_seed(0)
    model = llama2_tiny(vocab_size=512, num_layers=LAYERS, embed_dim=DIM, num_heads=4, num_kv_heads=4)
    return [p.numel() * 4 for p in model.parameters()] + [b.numel() * b.element_size() for b in model.buffers()]


def test_fake_estimate_matches_real_cpu_run():
    fake = _estimate(attention="native")  # the CPU's own attention kernel, as the real CPU run has
    real = _estimate(fake=False)
    # the same counting on real tensors
    assert fake.peak_bytes == real.peak_bytes
    assert fake.breakdown == real.breakdown
    assert fake.breakdown["weights"] == real.breakdown["weights"]
    assert fake.breakdown["activations"] == real.breakdown["activations"]
    assert fake.host_offload_peak_bytes == real.host_offload_peak_bytes


def test_activation_checkpointing_keeps_only_layer_inputs():
    on = _estimate("enable_activation_offloading=False")
    off = _estimate("enable_activation_offloading=False", "enable_activation_checkpointing=False")
    # with checkpointing the saved activations are the LAYERS layer inputs (+ token ids)
    assert LAYERS * BSD4 <= on.breakdown["activations"] <= LAYERS * BSD4 + 8192
    # without, every layer keeps ~25 such tensors (norms, q/k/v, rotary, attention, MLP)
    assert off.breakdown["activations"] >= LAYERS * 20 * BSD4
    assert off.peak_bytes - on.peak_bytes >= (LAYERS - 1) * 20 * BSD4


def test_activation_offloading_moves_layer_inputs_to_host():
    kept = _estimate("enable_activation_offloading=False")
    moved = _estimate()
    # at the peak, all but the layer input being back-propagated and the one brought back ahead of it
    # (prefetch=1, copies modelled as the GPU runs them, not as instant) wait in host memory
    assert kept.peak_bytes - moved.peak_bytes == (LAYERS - 2) * BSD4
    assert BSD4 <= moved.breakdown["activations"] <= 2 * BSD4 + 8192
    assert moved.host_offload_peak_bytes >= LAYERS * BSD4


def test_chunked_loss_never_holds_full_fp32_logits():
    vocab = 4096
    logits_fp32 = BATCH * SEQ * vocab * 4  # 4.2 MB
    plain = _estimate(
        "loss._component_=torchtune.modules.loss.CrossEntropyLoss", "~loss.num_output_chunks", vocab=vocab
    )
    chunked = _estimate(vocab=vocab)
    assert plain.breakdown["activations"] >= logits_fp32  # the fp32 log-probs saved for backward
    assert chunked.breakdown["activations"] < logits_fp32 / 8
    assert plain.peak_bytes - chunked.peak_bytes >= logits_fp32


def test_liger_loss_is_counted_below_the_plain_loss_at_a_large_vocabulary():
    """liger-kernel's fused loss never holds the logits of more than a chunk of rows: on the estimator's fake
    tensors its stand-in allocates what the kernel does (tests/torchtune/modules/test_liger.py checks that)."""
    vocab = 32000
    logits_fp32 = BATCH * SEQ * vocab * 4  # 32.8 MB
    plain = _estimate(
        "loss._component_=torchtune.modules.loss.CrossEntropyLoss", "~loss.num_output_chunks", vocab=vocab
    )
    liger = _estimate(
        "loss._component_=torchtune.modules.loss.LigerLinearCrossEntropyLoss", "~loss.num_output_chunks", vocab=vocab
    )
    assert plain.peak_bytes - liger.peak_bytes >= 2 * logits_fp32  # the fp32 logits and their log-probs


def test_liger_kernels_are_counted_and_save_less_than_the_plain_modules():
    """Without activation checkpointing every layer's saved tensors count: liger-kernel's SwiGLU saves the gate
    and up projections but not silu(gate). Its RMSNorm saves what ours saves (the input and an fp32 number
    per row), and its kernels keep a few bytes a token more elsewhere (64 here, 6% of silu(gate))."""
    off = ["enable_activation_checkpointing=False", "enable_activation_offloading=False"]
    plain, liger = _estimate(*off), _estimate(*off, "liger_kernels=True")
    silu = BATCH * SEQ * _intermediate_dim() * 4  # silu(gate) of one layer, fp32
    assert plain.breakdown["activations"] - liger.breakdown["activations"] >= LAYERS * (silu - BATCH * SEQ * 64)


def _intermediate_dim() -> int:
    from torchtune.models.llama2 import llama2_tiny

    with torch.device("meta"):
        model = llama2_tiny(vocab_size=512, num_layers=1, embed_dim=DIM, num_heads=4, num_kv_heads=4)
    return model.layers[0].mlp.w1.out_features


def test_counter_frees_and_peaks():
    counter = StorageCounter()
    with counter:
        a = torch.empty(1000)  # 4000 bytes -> 4096
        b = a.view(10, 100)  # same storage: not counted again
        c = torch.empty(10)  # 40 bytes -> 512
        del a, b
        d = torch.empty(0)  # nothing allocated
    assert counter.peak == 4096 + 512
    assert counter.current == 512
    del c, d


def test_state_layout_of_bitsandbytes_classes():
    bnb = pytest.importorskip("bitsandbytes")
    n = 4096 * 4096
    dev, paged = measure_state_layout(bnb.optim.PagedAdamW, {"lr": 1e-5}, n, torch.bfloat16)
    assert (dev, paged) == (0, 8 * n)  # two fp32 moments, both in managed memory
    dev, paged = measure_state_layout(bnb.optim.PagedAdamW8bit, {"lr": 1e-5}, n, torch.bfloat16)
    assert paged == 2 * n  # two uint8 moments
    assert dev == 2 * 4 * (n // 256) + 2 * 256 * 4  # fp32 absmax per 256-block + quantization maps
    dev, paged = measure_state_layout(bnb.optim.PagedAdamW8bit, {"lr": 1e-5}, 4096, torch.bfloat16)
    assert paged == 0  # below 1e5 elements bitsandbytes keeps state on the device


@pytest.mark.timeout(600)
def test_llama2_7b_low_memory_targets():
    """The promise: Llama2-7B full finetune under 16 GB, with room to spare (batch 2)."""
    pytest.importorskip("bitsandbytes")
    results = {}
    for optimizer in ("bitsandbytes.optim.PagedAdamW", "bitsandbytes.optim.PagedAdamW8bit"):
        for seq_len in (512, 2048):
            cfg = load_config("llama2/7B_full_low_memory", [f"optimizer._component_={optimizer}"])
            results[optimizer, seq_len] = estimate_recipe_memory(cfg, seq_len=seq_len, batch_size=2)
    for (optimizer, seq_len), est in results.items():
        gb = est.peak_bytes / 1e9
        assert est.breakdown["weights"] / 1e9 == pytest.approx(13.48, abs=0.01)
        assert sum(est.breakdown.values()) == est.peak_bytes
        assert gb <= (14.2 if seq_len == 512 else 15.0), (optimizer, seq_len, est.format())
    assert results["bitsandbytes.optim.PagedAdamW", 512].paged_optimizer_bytes / 1e9 == pytest.approx(53.9, abs=0.1)
    assert results["bitsandbytes.optim.PagedAdamW8bit", 512].paged_optimizer_bytes / 1e9 == pytest.approx(13.5, abs=0.1)


def _allocator_peak(fn) -> int:
    """Peak of the bytes the CPU allocator itself reports (the profiler's memory events) while ``fn`` runs:
    a count independent of the estimator's dispatch-mode bookkeeping."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("enable_activation_checkpointing=False",),
        ("optimizer_in_bwd=False",),
    ],
    ids=["checkpointing", "no-checkpointing", "standard-optimizer"],
)
def test_estimate_matches_the_cpu_allocators_own_count(extra):
    """The fake estimate against a real CPU run of the same steps, measured by the allocator (every byte
    malloc'd for tensors, weights included), not by the estimator's counter."""
    from torchtune import training

    cfg = _cfg("optimizer._component_=torch.optim.AdamW", "enable_activation_offloading=False", *extra)
    estimate = estimate_recipe_memory(cfg, seq_len=SEQ, batch_size=BATCH, attention="native")

    def run() -> None:
        step = training.TrainStep.from_config(cfg, device=torch.device("cpu"), dtype=torch.float32)
        data = {"tokens": torch.randint(0, 512, (BATCH, SEQ)), "labels": torch.randint(0, 512, (BATCH, SEQ))}
        for _ in range(2):
            step(data)

    real = _allocator_peak(run)
    assert real > 10 * BSD4  # weights, AdamW moments, activations: a real peak, not noise
    # the estimate rounds every block up to 512 bytes, as the CUDA allocator does: a little above
    assert real <= estimate.peak_bytes <= real * 1.005, (estimate.peak_bytes, real)


def test_counter_kinds_and_release():
    """Host, managed and mapped memory are counted apart from the device; released pages stop counting,
    also when the tensor is viewed again later."""
    counter = StorageCounter(cpu_is_host=True)
    with counter:
        device = torch.empty(1024, device="meta")  # meta stands for the device here
        host = torch.empty(256)  # CPU: the host
        with counter.managed():
            paged = torch.empty(512)
        with counter.mapped():
            mapped = torch.empty(128)
        assert counter.current_bytes("device") == 4096
        assert counter.current_bytes("host") == 1024
        assert counter.current_bytes("managed") == 2048
        assert counter.current_bytes("mapped") == 512
        assert counter.current_bytes("host_ram") == 1024 + 2048  # host + managed
        counter.release(mapped, "mapped")
        mapped.view(2, 64).add_(1)  # a view of a released storage is not counted again
        assert counter.current_bytes("mapped") == 0 and counter.current_bytes("host") == 1024
        del paged
        assert counter.current_bytes("host_ram") == 1024
    del device, host, mapped


@pytest.mark.parametrize("shape", [(600, 300), (300, 700)], ids=["tall", "wide"])
def test_low_rank_state_solved_from_small_matrices_equals_a_real_step(shape):
    """APOLLO's and GaLore's state (low-rank moments, projector) of a large matrix, solved from four small
    ones, is what one real step of the class makes on that matrix."""
    apollo = pytest.importorskip("apollo_torch")
    galore = pytest.importorskip("galore_torch")
    from torchtune.training.estimate._memory_estimator import _measured_low_rank_bytes, measure_low_rank_state

    for cls, group in [
        (
            apollo.APOLLOAdamW,
            {
                "rank": 4,
                "proj": "random",
                "scale_type": "channel",
                "scale": 1,
                "update_proj_gap": 200,
                "proj_type": "std",
            },
        ),
        (galore.GaLoreAdamW, {"rank": 8, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}),
    ]:
        kwargs = {"lr": 1e-3, **({"no_deprecation_warning": True} if cls is galore.GaLoreAdamW else {})}
        solved = measure_low_rank_state(cls, kwargs, group, shape, torch.float32)
        assert solved == _measured_low_rank_bytes(cls, kwargs, group, shape, torch.float32)
        m, n = shape
        if cls is apollo.APOLLOAdamW:
            assert solved < 0.2 * m * n * 4  # far below one fp32 copy of the matrix: it is low-rank
        else:  # GaLore's fp32 projection is a view of the square SVD factor, which it keeps alive
            assert solved >= min(m, n) ** 2 * 4


def test_paged_state_reports_bytes_and_pcie_seconds_per_step():
    from torchtune.training.estimate._memory_estimator import PCIE_GB_PER_S, MemoryEstimate

    est = MemoryEstimate(peak_bytes=1, breakdown={c: 0 for c in CATEGORIES}, paged_optimizer_bytes=int(53.91e9))
    line = next(x for x in est.format().splitlines() if "paged per step" in x)
    seconds = 53.91 / PCIE_GB_PER_S
    assert "53.91 GB in + 53.91 GB out" in line and f"{seconds:.1f} s" in line and f"{2 * seconds:.1f} s" in line
    assert "estimated" in line
    plain = MemoryEstimate(peak_bytes=1, breakdown={c: 0 for c in CATEGORIES})
    assert "paged per step" not in plain.format()  # nothing paged: nothing crosses PCIe


@pytest.mark.timeout(1200)
def test_llama2_7b_16gb_apollo_mini_fits_without_paging():
    """The 16 GB promise without paging: every phase at most 15.0 GB on the device, host RAM at most 4 GB,
    nothing paged (batch 2 x 2048), and the figures are those of the config's header."""
    pytest.importorskip("apollo_torch")
    pytest.importorskip("torchao")
    from torchtune.config._load import resolve_config_path
    from torchtune.training.estimate._checkpoint_memory import estimate_run_memory

    cfg = load_config("llama2/7B_full_16gb_apollo_mini", [])
    est = estimate_run_memory(cfg, seq_len=2048, batch_size=2)
    peaks = {p.name: p.device_peak / 1e9 for p in est.phases}
    assert max(peaks.values()) <= 15.0, peaks
    assert max(p.host_ram_peak for p in est.phases) / 1e9 <= 4.0
    assert est.steps.paged_optimizer_bytes == 0 and all(p.managed_peak == 0 for p in est.phases)
    header = resolve_config_path("llama2/7B_full_16gb_apollo_mini").read_text()
    assert f"device peak {max(peaks.values()):.2f} GB" in header
    assert f"{max(p.host_ram_peak for p in est.phases) / 1e9:.2f} GB" in header
