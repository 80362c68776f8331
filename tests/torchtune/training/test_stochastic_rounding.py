"""Stochastic rounding of bf16 updates: unbiased, seeded, and the same for every optimizer family."""

import contextlib

import pytest
import torch
from omegaconf import OmegaConf

from torchtune import ConfigError
from torchtune.training import (
    StochasticRounding,
    WeightChangeTracker,
    build_stochastic_rounding,
    check_stochastic_rounding,
    step_optimizer,
    step_parameter,
)

OPTIMIZERS = [
    ("torch.optim.AdamW", {}),
    ("torch.optim.AdamW", {"foreach": False}),
    ("torch.optim.AdamW", {"fused": True}),
    ("bitsandbytes.optim.PagedAdamW", {}),
    ("bitsandbytes.optim.PagedAdamW8bit", {}),
    ("bitsandbytes.optim.AdamW8bit", {}),
    ("torchao.optim.AdamW8bit", {}),
    ("torchao.optim.AdamW4bit", {}),
]


@pytest.fixture(params=["c", "inductor"])
def kernel(request, monkeypatch):
    """The kernel a CPU run uses (``c``: torchtune/modules/_native_kernels/stochastic_rounding.c, built once per
    machine) or, with it switched off, the one Inductor compiles (what a GPU runs). Returns a check that the kernel
    ran for ``name`` (``round`` or ``adam``)."""
    import torchtune.training.optim._stochastic_rounding as sr
    from torchtune.modules import _native_kernels

    if request.param == "inductor":
        monkeypatch.setattr(_native_kernels, "library", lambda: None)

        def ran(name):
            assert sr._FUSED_BROKEN is None and name in sr._COMPILED, sr._FUSED_BROKEN

        return ran
    assert _native_kernels.library() is not None  # a C compiler: the one Inductor needs on a CPU
    calls = []
    for name, attr in (("round", "round_into"), ("adam", "adam")):
        real = getattr(_native_kernels, attr)
        monkeypatch.setattr(_native_kernels, attr, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))

    def ran(name):
        assert name in calls, calls

    return ran


def _cls(component):
    import importlib

    module, name = component.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_rounding_is_unbiased_onto_the_two_neighbours():
    # 1 + k/8 of a bf16 step (2^-7 at 1.0): each value must round to 1 or 1 + 2^-7, up with odds k/8.
    ulp = 2.0**-7
    fractions = torch.arange(8, dtype=torch.float32) / 8
    src = (1.0 + fractions * ulp).repeat_interleave(20000)
    dst = torch.empty_like(src, dtype=torch.bfloat16)
    StochasticRounding(seed=0, device=torch.device("cpu")).round_(dst, src.clone())
    assert set(dst.float().unique().tolist()) <= {1.0, 1.0 + ulp}
    share_up = ((dst.float() - 1.0) / ulp).view(8, -1).mean(dim=1)
    torch.testing.assert_close(share_up, fractions, atol=0.012, rtol=0)
    # values already on the bf16 grid never move, negative values round symmetrically
    exact = torch.tensor([1.0, -2.5, 0.0, 3.0 * 2**-20])
    out = torch.empty_like(exact, dtype=torch.bfloat16)
    StochasticRounding(seed=1, device=torch.device("cpu")).round_(out, exact.clone())
    assert torch.equal(out.float(), exact)
    neg = torch.empty_like(src, dtype=torch.bfloat16)
    StochasticRounding(seed=0, device=torch.device("cpu")).round_(neg, -src.clone())
    assert torch.equal(neg, -dst)


def test_rounding_stream_is_seeded_and_resumes_from_its_state():
    src = torch.rand(10000) + 1.0
    a, b = (
        StochasticRounding(seed=3, device=torch.device("cpu")),
        StochasticRounding(seed=3, device=torch.device("cpu")),
    )
    out = [torch.empty(10000, dtype=torch.bfloat16) for _ in range(4)]
    a.round_(out[0], src.clone())
    saved = a.state_dict()
    a.round_(out[1], src.clone())
    b.load_state_dict(saved)
    b.round_(out[2], src.clone())
    assert torch.equal(out[1], out[2])  # continued from the saved position
    assert not torch.equal(out[0], out[1])  # and the stream moves on
    StochasticRounding(seed=4, device=torch.device("cpu")).round_(out[3], src.clone())
    assert not torch.equal(out[0], out[3])


def _run(component, kwargs, rounding, steps=30, lr=1e-4, dtype=torch.bfloat16, count_last=False):
    """A 64 x 64 weight near 1 (bf16 step 2^-7) pushed by gradients of one sign per element."""
    torch.manual_seed(0)
    init = 1.0 + 0.25 * torch.rand(64, 64)
    signs = torch.randn(64, 64).sign()
    param = torch.nn.Parameter(init.to(dtype, copy=True))
    opt = _cls(component)(
        [param], lr=lr, weight_decay=0.0, **kwargs, **(rounding.optimizer_kwargs(component) if rounding else {})
    )
    changes = WeightChangeTracker()
    for i in range(steps):
        param.grad = (signs * (1.0 + 0.1 * i)).to(dtype)
        before = param.detach().clone()
        if count_last and i == steps - 1:
            changes.arm(torch.device("cpu"))
        step_parameter(opt, param, rounding=rounding, changes=changes)
        assert param.grad is None and param.dtype == dtype
    moved = (param.detach() != before).float().mean().item() if count_last else None
    return init.to(dtype).float(), param.detach().float(), opt, changes.pop() if count_last else None, moved


@pytest.mark.parametrize("component,kwargs", OPTIMIZERS, ids=lambda x: x if isinstance(x, str) else str(x))
def test_every_optimizer_family_keeps_small_bf16_updates(component, kwargs):
    ref_init, ref, _, _, _ = _run(component, kwargs, None, dtype=torch.float32)
    want = (ref - ref_init).abs().mean().item()  # fp32: about 30 steps x lr
    init, nearest, plain_opt, _, _ = _run(component, kwargs, None)
    assert torch.equal(nearest, init)  # round-to-nearest: every update is lost
    rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
    init, stochastic, opt, share, moved = _run(component, kwargs, rounding, count_last=True)
    got = (stochastic - init).abs().mean().item()
    assert got == pytest.approx(want, rel=0.15), (got, want)
    assert share == pytest.approx(moved) and 0 < share < 0.5  # weights_changed counts what moved
    # the state keeps the dtypes a bf16 run has (bf16 for torch, fp32/8-bit for bitsandbytes/torchao)
    param_state = next(iter(opt.state.values()))
    plain_state = next(iter(plain_opt.state.values()))
    assert {k: getattr(v, "dtype", None) for k, v in param_state.items()} == {
        k: getattr(v, "dtype", None) for k, v in plain_state.items()
    }


def test_torchao_rounding_draws_from_its_own_stream_not_the_global_one():
    from torchao.optim import AdamW8bit

    def run(seed):
        param = torch.nn.Parameter(torch.linspace(1.0, 2.0, 4096).bfloat16())
        rounding = StochasticRounding(seed=seed, device=torch.device("cpu"))
        opt = AdamW8bit([param], lr=1e-3, **rounding.optimizer_kwargs("torchao.optim.AdamW8bit"))
        param.grad = torch.ones_like(param)
        torch.manual_seed(123)
        global_before = torch.get_rng_state()
        step_parameter(opt, param, rounding=rounding)
        assert torch.equal(torch.get_rng_state(), global_before)  # the global generator did not move
        return param.detach().clone()

    first = run(0)
    assert torch.equal(first, run(0)) and not torch.equal(first, run(9))


def test_standard_step_rounds_each_parameter_as_in_backward_does():
    torch.manual_seed(0)
    weights = [torch.rand(32, 16) + 1.0, torch.rand(16) + 1.0]
    grads = [torch.randn_like(w) for w in weights]

    def run(standard):
        params = [torch.nn.Parameter(w.bfloat16()) for w in weights]
        rounding = StochasticRounding(seed=5, device=torch.device("cpu"))
        opts = [torch.optim.AdamW(params, lr=1e-3)] if standard else [torch.optim.AdamW([p], lr=1e-3) for p in params]
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g.bfloat16()
            if standard:
                step_optimizer(opts[0], params, rounding=rounding)
            else:
                for opt, p in zip(opts, params):
                    step_parameter(opt, p, rounding=rounding)
        return params

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)
        assert a.grad is None


def _cfg(**over):
    base = {"dtype": "bf16", "bf16_stochastic_rounding": True, "optimizer": {"_component_": "torch.optim.AdamW"}}
    cfg = OmegaConf.create(base)
    for key, value in over.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@pytest.mark.parametrize(
    "over,message",
    [
        ({"bf16_stochastic_rounding": "yes"}, "bf16_stochastic_rounding must be True or False"),
        ({"optimizer._component_": "my.Lion"}, "optimizer._component_=my.Lion is none of them"),
        (
            {"optimizer._component_": "torchao.optim.AdamW8bit", "optimizer.bf16_stochastic_round": False},
            "optimizer.bf16_stochastic_round=False disagrees with bf16_stochastic_rounding=True",
        ),
        (
            {"optimizer._component_": "torchtune.training.CPUAdamW", "bf16_stochastic_rounding": False},
            "rounds bf16 weights and state stochastically itself",
        ),
    ],
)
def test_config_checks_name_the_key(over, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_stochastic_rounding(_cfg(**over))


def test_config_checks_pass_what_works(caplog):
    check_stochastic_rounding(_cfg())
    check_stochastic_rounding(_cfg(dtype="fp32"))  # allowed, and does nothing:
    with caplog.at_level("INFO", logger="torchtune"):
        assert build_stochastic_rounding(True, dtype=torch.float32, seed=0, device=torch.device("cpu")) is None
    assert "bf16_stochastic_rounding=True has no effect with torch.float32 weights" in caplog.text
    check_stochastic_rounding(_cfg(**{"optimizer._component_": "my.Lion", "bf16_stochastic_rounding": False}))
    check_stochastic_rounding(_cfg(**{"optimizer._component_": "torchao.optim.AdamW4bit"}))


@pytest.mark.parametrize(
    "cls,kwargs", [(torch.optim.AdamW, {}), (torch.optim.AdamW, {"fused": True}), (torch.optim.SGD, {"momentum": 0.9})]
)
def test_elementwise_torch_optimizers_step_in_slices_with_the_same_result(monkeypatch, cls, kwargs):
    """AdamW/SGD step large parameters slice by slice (bounded fp32 copies); the result is the whole step's."""
    import torchtune.training.optim._stochastic_rounding as sr

    def run(slice_size, elementwise):
        monkeypatch.setattr(sr, "_SLICE", slice_size)
        monkeypatch.setattr(sr, "_ELEMENTWISE", sr._ELEMENTWISE if elementwise else ())
        torch.manual_seed(0)
        param = torch.nn.Parameter((torch.rand(64, 64) + 1).bfloat16())
        opt = cls([param], lr=1e-3, **kwargs)
        rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
        for _ in range(3):
            param.grad = torch.randn(64, 64).bfloat16()
            step_parameter(opt, param, rounding=rounding)
        return param.detach().clone(), dict(opt.state[param])

    sliced, sliced_state = run(1000, True)  # 5 slices, the last one short
    whole, whole_state = run(1 << 30, False)  # the parameter swapped to fp32 whole
    assert torch.equal(sliced, whole)
    assert sliced_state.keys() == whole_state.keys()
    for key, value in whole_state.items():
        assert torch.equal(sliced_state[key], value) and sliced_state[key].dtype == value.dtype, key


@pytest.mark.parametrize("component", [c for c, _ in OPTIMIZERS if c.startswith("bitsandbytes.")])
def test_bitsandbytes_in_backward_step_skips_its_device_syncs(monkeypatch, component):
    """bitsandbytes' step() synchronises the device after every parameter (paged: twice); the in-backward
    step runs the same update without them, to the same bits."""
    import bitsandbytes.optim.optimizer as bnb_optimizer

    syncs = []
    real = bnb_optimizer.sync_gpu
    monkeypatch.setattr(bnb_optimizer, "sync_gpu", lambda t: syncs.append(t) or real(t))

    def run(in_backward, rounding):
        torch.manual_seed(0)
        param = torch.nn.Parameter((torch.rand(64, 64) + 1).bfloat16())
        opt = _cls(component)([param], lr=1e-3)
        for _ in range(3):
            param.grad = torch.randn(64, 64).bfloat16()
            step_parameter(opt, param, rounding=rounding, in_backward=in_backward)
        return param.detach().clone()

    own = run(False, None)
    assert len(syncs) == 3 * (2 if "Paged" in component else 1)
    syncs.clear()
    assert torch.equal(run(True, None), own) and syncs == []
    run(True, StochasticRounding(seed=0, device=torch.device("cpu")))  # rounded: one fused pass (_fused_step)
    assert syncs == []


def test_compiled_rounding_is_unbiased_resumes_exactly_and_counts(kernel):
    """The rounding kernel (C on a CPU, Inductor's on CUDA): a million draws land on the
    two bf16 neighbours with the right odds, a resume from the saved counters draws the same bits, the
    global generator is untouched, and the count of changed weights is exact."""
    import torchtune.training.optim._stochastic_rounding as sr

    ulp = 2.0**-7
    fractions = torch.arange(8, dtype=torch.float32) / 8
    src = (1.0 + fractions * ulp).repeat_interleave(sr._COMPILE_MIN // 8)  # 1,048,576 draws
    rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
    dst = torch.empty_like(src, dtype=torch.bfloat16)
    global_before = torch.get_rng_state()
    rounding.round_(dst, src)
    kernel("round")
    assert torch.equal(torch.get_rng_state(), global_before)
    assert set(dst.float().unique().tolist()) <= {1.0, 1.0 + ulp}
    share_up = ((dst.float() - 1.0) / ulp).view(8, -1).mean(dim=1)
    # binomial standard error at p = 1/2 over 131,072 draws: 0.0014; 4 of them
    torch.testing.assert_close(share_up, fractions, atol=0.0056, rtol=0)
    neg = torch.empty_like(dst)
    rounding.round_(neg, -src)
    share_down = ((-neg.float() - 1.0) / ulp).view(8, -1).mean(dim=1)
    torch.testing.assert_close(share_down, fractions, atol=0.0056, rtol=0)

    saved = rounding.state_dict()
    first, again = dst.clone(), dst.clone()
    changes = WeightChangeTracker()
    changes.arm(torch.device("cpu"))
    rounding.round_(first, src, changes)
    resumed = StochasticRounding(seed=0, device=torch.device("cpu"))
    resumed.load_state_dict(saved)
    resumed.round_(again, src)
    assert torch.equal(first, again)  # the resumed stream draws the same bits
    assert not torch.equal(first, dst)  # and each call its own
    assert changes.pop() == (first != dst).sum().item() / dst.numel()


def test_random_bits_are_uniform_and_independent():
    """Each of the 16 bits an element gets is 1 half the time over a million elements, independently of its
    neighbour's and of the same element's bits in the next call (within 4 standard errors, 0.002)."""
    from torchtune.training.optim._stochastic_rounding import _hash16, _key_tensor

    rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
    index = torch.arange(1 << 20, dtype=torch.int32)
    first, second = (_hash16(index, *_key_tensor(rounding.next_key(), index.device)) for _ in range(2))
    assert int(first.min()) >= 0 and int(first.max()) < 1 << 16
    bits = torch.arange(16)
    ones = (first.unsqueeze(1) >> bits) & 1
    torch.testing.assert_close(ones.float().mean(0), torch.full((16,), 0.5), atol=0.002, rtol=0)
    for other in (first.roll(1), second):  # the neighbour, the next call
        agree = (((first ^ other).unsqueeze(1) >> bits) & 1) == 0
        torch.testing.assert_close(agree.float().mean(0), torch.full((16,), 0.5), atol=0.002, rtol=0)


def _hash16_reference(index: torch.Tensor, base: int, salt: int) -> torch.Tensor:
    """The hash in exact unsigned 32-bit arithmetic on int64 (masks instead of wrap-around)."""
    m32 = (1 << 32) - 1
    x = ((index + base) & m32) ^ salt
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & m32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & m32
    x = x ^ (x >> 15)
    return x >> 16


@pytest.mark.parametrize("path", ["c", "inductor", "plain"])
def test_rounding_adds_the_hash_below_bf16s_bits_and_truncates(path, monkeypatch):
    """The definition, on the integer view of fp32: ``(bits + hash) & 0xFFFF0000``, with the hash in exact
    unsigned arithmetic. The kernels reach it with int32 wrap-around and float arithmetic only (no
    reinterpretation of bits, which a compiled CPU kernel does one element at a time), so it is pinned here
    bit for bit, over random values of every magnitude and the edges: zeros, subnormals, the largest
    finite values (which round up to infinity), infinities and NaN."""
    numel = (1 << 20) + 4099
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(numel, generator=gen) * torch.exp2(torch.randint(-140, 128, (numel,), generator=gen).float())
    edges = torch.tensor(
        [0.0, -0.0, 1e-45, -1e-45, 1e-40, 2.0**-126, 3.4028235e38, -3.4028235e38, 3.3961e38, 1.0, -1.0]
        + [float("inf"), float("-inf"), float("nan")]
    )
    src[: edges.numel() * 64] = edges.repeat(64)
    import torchtune.training.optim._stochastic_rounding as sr
    from torchtune.modules import _native_kernels

    if path == "inductor":
        monkeypatch.setattr(_native_kernels, "library", lambda: None)
    rounding = StochasticRounding(seed=5, device=torch.device("cpu"), fused=path != "plain")
    key = rounding.next_key()
    dst = torch.zeros(numel, dtype=torch.bfloat16)
    rounding.round_(dst, src, key=key, offset=12345)
    noise = _hash16_reference(torch.arange(numel) + 12345, *key).to(torch.int32)
    expected = ((src.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)
    finite = torch.isfinite(src)
    assert torch.equal(dst[finite].view(torch.int16), expected[finite].view(torch.int16))
    assert torch.equal(dst[src.isinf()], src[src.isinf()].bfloat16()) and dst[src.isnan()].isnan().all()
    if path == "inductor":
        assert sr._FUSED_BROKEN is None and "round" in sr._COMPILED, sr._FUSED_BROKEN
    elif path == "c":
        assert _native_kernels.library() is not None


def test_c_inductor_and_plain_kernels_write_the_same_bits(monkeypatch):
    """The three ways a rounding runs: the C kernel (a CPU), Inductor's (a GPU, or a CPU without a C
    compiler) and plain PyTorch on chunks (not fused, or where neither builds): bitwise the same rounding,
    and the same bits for the one-pass AdamW step up to an FMA contraction (one bf16 step, rarely)."""
    import torchtune.training.optim._stochastic_rounding as sr
    from torchtune.modules import _native_kernels

    numel = (1 << 20) + 4099
    torch.manual_seed(0)
    src = torch.randn(numel)

    def run(path, fn):
        with pytest.MonkeyPatch.context() as mp:
            if path == "inductor":
                mp.setattr(_native_kernels, "library", lambda: None)
            return fn(path != "plain")

    def rounded(fused):
        dst = torch.empty(numel, dtype=torch.bfloat16)
        StochasticRounding(seed=2, device=torch.device("cpu"), fused=fused).round_(dst, src)
        return dst

    c, inductor, plain = (run(path, rounded) for path in ("c", "inductor", "plain"))
    assert torch.equal(c, plain) and torch.equal(inductor, plain)

    def adam(fused):
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.randn(numel).bfloat16())
        opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.1)
        rounding = StochasticRounding(seed=2, device=torch.device("cpu"), fused=fused)
        for _ in range(2):
            param.grad = torch.randn(numel).bfloat16()
            step_parameter(opt, param, rounding=rounding)
        return [param.detach(), opt.state[param]["exp_avg"], opt.state[param]["exp_avg_sq"]]

    results = {path: run(path, adam) for path in ("c", "inductor", "plain")}
    assert "adam" in sr._COMPILED and sr._FUSED_BROKEN is None
    for path in ("c", "inductor"):
        for a, b in zip(results[path], results["plain"]):
            # the same bits; a compiler may contract a multiply-add into an FMA where eager rounds twice,
            # which moves a few fp32 results across a rounding boundary (one bf16 step), or a moment that
            # cancels to about 1e-9 to exactly 0
            assert (a != b).float().mean() < 1e-3
            step = torch.finfo(torch.bfloat16).eps * torch.maximum(a.float().abs(), b.float().abs())
            assert ((a.float() - b.float()).abs() <= step + 1e-8).all()


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (torch.optim.AdamW, {"weight_decay": 0.1}),
        (torch.optim.Adam, {"weight_decay": 0.1}),
        (torch.optim.Adam, {"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}),
        (torch.optim.AdamW, {"betas": (0.8, 0.99), "eps": 1e-6, "foreach": False}),
    ],
)
def test_fused_adam_step_is_torchs_update_with_the_same_bits(monkeypatch, cls, kwargs):
    """The one-pass Adam/AdamW step (bf16 in, fp32 in registers, bf16 out) against torch's own step on fp32
    slices, with the same random bits: torch's update to fp32 rounding, so at most a bf16 step apart where
    the two fp32 results straddle a rounding boundary, and the same state (keys, dtypes, step count)."""
    import torchtune.training.optim._stochastic_rounding as sr

    def run(fused_step):
        if not fused_step:
            monkeypatch.setattr(sr, "_step_adam_fused", lambda *a: False)
        torch.manual_seed(0)
        param = torch.nn.Parameter((torch.rand(64, 96) + 0.5).bfloat16())
        opt = cls([param], lr=1e-2, **kwargs)
        rounding = StochasticRounding(seed=1, device=torch.device("cpu"))
        for _ in range(3):
            param.grad = torch.randn(64, 96).bfloat16()
            step_parameter(opt, param, rounding=rounding)
        monkeypatch.undo()
        return param.detach(), opt.state[param]

    (fused_w, fused_state), (ref_w, ref_state) = run(True), run(False)
    assert {k: (v.dtype, v.shape) for k, v in fused_state.items()} == {
        k: (v.dtype, v.shape) for k, v in ref_state.items()
    }
    assert fused_state["step"] == ref_state["step"] == 3
    for got, want in (
        (fused_w, ref_w),
        (fused_state["exp_avg"], ref_state["exp_avg"]),
        (fused_state["exp_avg_sq"], ref_state["exp_avg_sq"]),
    ):
        assert (got != want).float().mean() < 0.01
        ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(1e-30)
        assert ((got.float() - want.float()).abs() <= ulp + 1e-30).all()


def test_one_pass_adam_step_runs_the_optimizer_step_hooks():
    """The one-pass step never calls ``optimizer.step()``, yet it is that optimizer's step: torch's global
    and per-optimizer step hooks fire around it, once each, in torch's order (the memory estimator finds
    the optimizer state through the global pre-hook; without it the state was counted as temporaries)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    import torchtune.training.optim._stochastic_rounding as sr

    param = torch.nn.Parameter(torch.ones(8, 8, dtype=torch.bfloat16))
    opt = torch.optim.AdamW([param], lr=1e-2)
    calls = []
    handles = [
        register_optimizer_step_pre_hook(lambda o, a, k: calls.append(("global pre", o))),
        opt.register_step_pre_hook(lambda o, a, k: calls.append(("pre", o))),
        opt.register_step_post_hook(lambda o, a, k: calls.append(("post", o))),
        register_optimizer_step_post_hook(lambda o, a, k: calls.append(("global post", o))),
    ]
    try:
        param.grad = torch.full((8, 8), 0.5, dtype=torch.bfloat16)
        fused = sr._step_adam_fused
        used = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sr, "_step_adam_fused", lambda *a: used.append(True) or fused(*a))
            step_parameter(opt, param, rounding=StochasticRounding(seed=0, device=torch.device("cpu")))
    finally:
        for handle in handles:
            handle.remove()
    assert used == [True] and opt.state[param]["step"] == 1  # the one-pass path took the step
    assert calls == [("global pre", opt), ("pre", opt), ("post", opt), ("global post", opt)]


def test_compiled_adam_step_allocates_no_copy_of_the_parameter(kernel):
    """The one-pass AdamW step (C or Inductor's kernel) of a parameter of 2^20 elements reads and writes its
    bf16 tensors in place: the allocator (torch.profiler's memory events) sees nothing as large as a quarter of one fp32
    copy; the estimator's fake run of the same step allocates nothing that large either."""

    param = torch.nn.Parameter(torch.rand(1024, 1024).bfloat16())
    opt = torch.optim.AdamW([param], lr=1e-3)
    rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
    param.grad = torch.randn(1024, 1024).bfloat16()
    step_parameter(opt, param, rounding=rounding)  # makes the state (bf16 moments) and compiles
    kernel("adam")
    param.grad = torch.randn(1024, 1024).bfloat16()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step_parameter(opt, param, rounding=rounding)
    sizes = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]
    assert max(sizes, default=0) < param.numel(), max(sizes)
    # a logged step counts the weights it changed inside the same kernel
    changes, before = WeightChangeTracker(), param.detach().clone()
    changes.arm(torch.device("cpu"))
    param.grad = torch.randn(1024, 1024).bfloat16()
    step_parameter(opt, param, rounding=rounding, changes=changes)
    assert changes.pop() == (param.detach() != before).sum().item() / param.numel()

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    fake_sizes = []

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = {
                a.untyped_storage()._cdata
                for a in torch.utils._pytree.tree_leaves((args, kwargs))
                if torch.is_tensor(a)
            }
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if torch.is_tensor(t) and t.untyped_storage()._cdata not in ins:
                    fake_sizes.append(t.untyped_storage().nbytes())
            return out

    with FakeTensorMode():
        fake = torch.nn.Parameter(torch.empty(1024, 1024, dtype=torch.bfloat16))
        fake_opt = torch.optim.AdamW([fake], lr=1e-3)
        for step in range(2):
            fake.grad = torch.empty_like(fake)
            with Allocations() if step == 1 else contextlib.nullcontext():
                step_parameter(fake_opt, fake, rounding=StochasticRounding(seed=0, device=torch.device("cpu")))
    assert max(fake_sizes, default=0) < fake.numel(), fake_sizes  # the kernel's in-place writes: nothing


def test_adam_variants_the_one_pass_does_not_cover_take_the_slice_path():
    """amsgrad keeps a third moment the one pass does not write: it is stepped on fp32 slices."""
    param = torch.nn.Parameter(torch.ones(8, 8, dtype=torch.bfloat16))
    opt = torch.optim.AdamW([param], lr=1e-3, amsgrad=True)
    param.grad = torch.ones_like(param)
    step_parameter(opt, param, rounding=StochasticRounding(seed=0, device=torch.device("cpu")))
    assert set(opt.state[param]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    assert opt.state[param]["max_exp_avg_sq"].dtype == torch.bfloat16


def test_older_generator_state_loads_as_a_new_stream_and_unknown_state_is_refused(caplog):
    old = {"generator": torch.Generator().manual_seed(5).get_state(), "state_generators": {}}
    rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
    with caplog.at_level("INFO", logger="torchtune"):
        rounding.load_state_dict(old)
    assert "older generator state" in caplog.text
    assert rounding.next_key() != StochasticRounding(seed=0, device=torch.device("cpu")).next_key()
    with pytest.raises(ValueError, match="neither counters nor a generator"):
        rounding.load_state_dict({"something": 1})


@pytest.mark.parametrize("component", ["torch.optim.AdamW", "bitsandbytes.optim.PagedAdamW"])
def test_rounding_allocates_no_fp32_copy_of_a_whole_parameter(monkeypatch, component):
    """A rounded step of a large parameter makes fp32 copies (weight, gradient, moments, noise) of one
    slice at a time: no 4-byte tensor larger than a slice is ever allocated."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import torchtune.training.optim._stochastic_rounding as sr

    slice_ = 4096
    monkeypatch.setattr(sr, "_SLICE", slice_)
    monkeypatch.setattr(sr, "_CHUNK", slice_)  # the plain rounding path's chunk (this parameter is not compiled)
    sizes = []

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {
                a.untyped_storage().data_ptr()
                for a in torch.utils._pytree.tree_leaves((args, kwargs))
                if isinstance(a, torch.Tensor)
            }
            for t in out if isinstance(out, (tuple, list)) else (out,):
                # a new 4-byte storage (not a view or an in-place result of an input)
                if (
                    isinstance(t, torch.Tensor)
                    and t.element_size() == 4
                    and t.untyped_storage().data_ptr() not in inputs
                ):
                    sizes.append(t.numel())
            return out

    param = torch.nn.Parameter((torch.rand(64, 1024) + 1).bfloat16())  # 16 slices
    opt = _cls(component)([param], lr=1e-3)
    rounding = StochasticRounding(seed=0, device=torch.device("cpu"))
    for step in range(2):  # the first step makes the optimizer's state; the second is measured
        param.grad = torch.randn(64, 1024).bfloat16()
        with Allocations() if step == 1 else contextlib.nullcontext():
            step_parameter(opt, param, rounding=rounding, in_backward=True)
    # torch's AdamW steps in one pass (the C kernel on a CPU): no 4-byte tensor at all
    assert (sizes or component == "torch.optim.AdamW") and max(sizes, default=0) <= slice_, sizes
    assert param.dtype == torch.bfloat16


def test_adamw_on_bf16_weights_decays_exp_avg_sq_as_fp32_does():
    """beta2 = 0.999: each step multiplies exp_avg_sq by 0.999, which bf16 rounds back to the old value
    (half a bf16 step is 2^-9 = 0.2% of it). With the moments stochastically rounded they decay as an fp32
    run's: after 1,000 steps (200 of large gradients, 800 of 100x smaller ones) the mean exp_avg_sq is within
    2% of fp32's; rounded to nearest it is stuck more than 2x above it."""

    def run(dtype, rounding):
        torch.manual_seed(0)
        param = torch.nn.Parameter((torch.rand(4096) + 1).to(dtype))
        opt = torch.optim.AdamW([param], lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
        for i in range(1000):
            scale = 1.0 if i < 200 else 0.01
            param.grad = (scale * torch.randn(4096)).to(dtype)
            step_parameter(opt, param, rounding=rounding)
        return opt.state[param]["exp_avg_sq"].float().mean().item()

    fp32 = run(torch.float32, None)
    sr = run(torch.bfloat16, StochasticRounding(seed=0, device=torch.device("cpu")))
    nearest = run(torch.bfloat16, None)
    assert sr == pytest.approx(fp32, rel=0.02), (sr, fp32)
    assert nearest > 2 * fp32, (nearest, fp32)


def test_every_shipped_bf16_config_rounds_its_updates():
    """The decaying path above is what the shipped configs train with: every config with bf16 weights and a
    training recipe (single-device or distributed) sets bf16_stochastic_rounding: True."""
    from omegaconf import OmegaConf

    from torchtune import _recipe_registry as registry

    checked = []
    for recipe in registry.get_all_recipes():
        for config in recipe.configs:
            cfg = OmegaConf.load(config.path)
            if "bf16_stochastic_rounding" not in cfg and "optimizer" not in cfg:
                continue  # eval and generation configs train nothing
            if cfg.get("dtype") == "bf16":
                checked.append(config.name)
                assert cfg.bf16_stochastic_rounding is True, config.name
    assert "llama2/7B_full_single_device" in checked and "llama2/70B_full" in checked
