"""CPUAdamW and CPUSGD: the C kernel against the PyTorch form of the same maths (bitwise), the rounding stream
and the 8-bit code pinned, thread-count independence, an exact resume, and the maths being AdamW's and SGD's."""

import io
import itertools
import struct

import pytest
import torch

from torchtune import training
from torchtune.modules import _native_kernels
from torchtune.training import CPUSGD, CPUAdamW
from torchtune.training.optim import _cpu_optimizers as co

FORMATS = {0: torch.float32, 1: torch.bfloat16, 2: torch.uint8}


@pytest.fixture(scope="module")
def lib():
    library = _native_kernels.library()
    assert library is not None  # a C compiler: the one Inductor needs on a CPU too
    return library


def _state(rows, cols, fmt, seed, signed):
    g = torch.Generator().manual_seed(seed)
    nb = -(-cols // co.BLOCK)
    if fmt == 2:
        codes = torch.randint(0, 256 if signed else 249, (rows, cols), dtype=torch.uint8, generator=g)
        return codes, torch.rand(rows, nb, generator=g)
    x = torch.randn(rows, cols, generator=g)
    return (x if signed else x.abs()).to(FORMATS[fmt]), None


def _tensors(rows, cols, wf, gf):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g).to(FORMATS[wf]), torch.randn(rows, cols, generator=g).to(FORMATS[gf])


ADAM_CASES = list(itertools.product((0, 1), (0, 1), (0, 1, 2)))


@pytest.mark.parametrize("wf,gf,sf", ADAM_CASES, ids=[f"w{a}-g{b}-s{c}" for a, b, c in ADAM_CASES])
def test_adam_kernel_is_the_pytorch_maths_to_the_bit(lib, wf, gf, sf):
    rows, cols = 19, 600  # a partial last block in every row
    w, g = _tensors(rows, cols, wf, gf)
    s = co.adam_scalars({"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-8, "betas": (0.9, 0.999)}, 3)
    results = []
    for path in (_native_kernels.cpu_adam, co._adam_torch):
        (m, ms), (v, vs) = _state(rows, cols, sf, 1, True), _state(rows, cols, sf, 2, False)
        ww = w.clone()
        changed = path((ww, g, m, v), (ms, vs), cols, s, (0x1234, 0xABCD), (wf, gf, sf), (False, True))
        results.append((ww, m, v, ms, vs, changed))
    (w1, *rest1), (w2, *rest2) = results
    assert torch.equal(w1, w2)
    for a, b in zip(rest1, rest2):
        assert (a is None and b is None) or (torch.equal(a, b) if torch.is_tensor(a) else a == b)
    if wf == 1:
        assert 0 < results[0][-1] == int((w1 != w).sum())  # the count is of the weights that moved


SGD_CASES = [
    (wf, gf, sf, nesterov, first)
    for wf, gf in ((1, 1), (1, 0), (0, 0))
    for sf in (-1, 0, 1, 2)
    for nesterov, first in ((False, False), (True, False), (False, True))
]


@pytest.mark.parametrize("wf,gf,sf,nesterov,first", SGD_CASES)
def test_sgd_kernel_is_the_pytorch_maths_to_the_bit(lib, wf, gf, sf, nesterov, first):
    rows, cols = 7, 300
    w, g = _tensors(rows, cols, wf, gf)
    s = torch.tensor([0.01, 0.9, 0.9, -0.05], dtype=torch.float32)
    results = []
    for path in (_native_kernels.cpu_sgd, co._sgd_torch):
        b, bs = _state(rows, cols, sf, 1, True) if sf >= 0 else (None, None)
        ww = w.clone()
        changed = path((ww, g, b), (bs,), cols, s, (7, 9), (wf, gf, sf), (True, nesterov, first, True))
        results.append((ww, b, bs, changed))
    for a, b in zip(*results):
        assert (a is None and b is None) or (torch.equal(a, b) if torch.is_tensor(a) else a == b)


def _hash(i: int, base: int, salt: int) -> int:
    """The element hash of cpu_optimizer.c in Python integers."""
    x = ((i + base) & 0xFFFFFFFF) ^ salt
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def test_rounding_stream_is_pinned():
    index = [0, 1, 255, 1 << 20, (1 << 31) - 1]
    want = [0xA9A758FC, 0x9C913921, 0xD1B3ADE0, 0xB16748EF, 0xCF6B3480]
    assert [_hash(i, 0x01234567, 0x89ABCDEF) for i in index] == want
    got = co.hash32(torch.tensor(index, dtype=torch.int32), 0x01234567, 0x89ABCDEF).tolist()
    assert [h & 0xFFFFFFFF for h in got] == want
    # the top 16 bits are stochastic_rounding.c's hash16 of the same key: one stream definition
    from torchtune.training.optim._stochastic_rounding import _hash16

    assert _hash16(torch.tensor(index, dtype=torch.int32), 0x01234567, 0x89ABCDEF - (1 << 32)).tolist() == [
        w >> 16 for w in want
    ]
    assert co.rounding_key(0, "layers.0.attn.q_proj.weight", 1) == (0x1DCAAEE6, 0x7271C8BD)
    keys = {co.rounding_key(seed, name, step) for seed in (0, 1) for name in ("a", "b") for step in (1, 2)}
    assert len(keys) == 8  # (seed, name, step) each change the key


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def test_rounding_bits_sit_where_the_definition_puts_them(lib):
    """The bf16 weight rounds with the hash's top 16 bits, bf16 moments with bits 8-15 and 0-7 (a half below):
    a step whose fp32 results are known constants, checked element by element in Python integers."""
    n, key = 512, (0x1357, 0x2468)
    w, g = torch.ones(1, n).bfloat16(), torch.ones(1, n)
    m, v = torch.zeros(1, n).bfloat16(), torch.zeros(1, n).bfloat16()
    s = torch.tensor([1 + 0.3 * 2**-7, 0.0, 0.0, 0.3, 0.0, 0.7, 0.0, 1.0, 1.0], dtype=torch.float32)
    _native_kernels.cpu_adam((w, g, m, v), (None, None), n, s, key, (1, 0, 1), (False, False))
    w32, m32, v32 = (_f32_bits(float(x)) for x in (s[0], s[3], s[5]))  # w * decay, (1 - b1) g, (1 - b2) g g
    for i in range(n):
        h = _hash(i, *key)
        assert w.view(torch.int16)[0, i].item() & 0xFFFF == (w32 + (h >> 16)) >> 16
        assert m.view(torch.int16)[0, i].item() & 0xFFFF == (m32 + (((h >> 8) & 0xFF) << 8 | 0x80)) >> 16
        assert v.view(torch.int16)[0, i].item() & 0xFFFF == (v32 + ((h & 0xFF) << 8 | 0x80)) >> 16
    assert 0.2 < (w.float() > 1.0).float().mean() < 0.4  # about 0.3 of a step: up three times in ten


def _q8_reference(x: float, scale: float, noise8: int, signed: bool) -> int:
    """One element's code, from the definition, in Python floats (struct for fp32 rounding)."""

    def f32(y):
        return struct.unpack("<f", struct.pack("<f", y))[0]

    def bits(y):
        return struct.unpack("<I", struct.pack("<f", y))[0]

    inv = f32(1.0 / scale) if scale > 0 else 0.0
    q = f32(f32(abs(x) * inv) * (2.0**-112 if signed else 2.0**-96))
    code = min((bits(q) + (noise8 << 12 | 0x800)) >> 20, 0x78 if signed else 0xF8)
    return code | (0x80 if signed and bits(f32(x)) >> 31 else 0)


@pytest.mark.parametrize("signed", [True, False])
def test_8bit_block_quantiser_against_its_definition(signed):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 300, generator=g) * torch.logspace(-6, 0, 300)  # six decades in every block
    if not signed:
        x = x.abs()
    x[2, 256:] = 0.0  # an all-zero block: scale 0, codes 0
    noise = torch.randint(0, 256, x.shape, generator=g, dtype=torch.int32)
    codes, scale = co.q8_encode(x, noise, signed)
    assert torch.equal(scale[:, 0], x[:, :256].abs().amax(dim=1)) and scale[2, 1] == 0
    for r, c in [(0, 0), (0, 255), (1, 256), (1, 299), (2, 17), (2, 260)] + [(r, c) for r in range(3) for c in (5, 77)]:
        want = _q8_reference(float(x[r, c]), float(scale[r, c // 256]), int(noise[r, c]), signed)
        assert int(codes[r, c]) == want, (r, c)
    # decoded within one code step (an eighth of the value) of the value, down to 2^-17 (2^-33) of the scale
    decoded = co.q8_decode(codes, scale, signed)
    big = x.abs() > co._per_element(scale, 300) * 2.0**-14
    assert ((decoded - x).abs()[big] <= x.abs()[big] / 8).all()
    # and unbiased: the mean of many roundings of one value is the value
    value = torch.full((1, 256), 0.3)
    value[0, 0] = 1.0  # the scale
    draws = torch.stack(
        [
            co.q8_decode(*co.q8_encode(value, torch.randint(0, 256, (1, 256), generator=g), signed), signed)[0, 1:]
            for _ in range(40)
        ]
    )
    assert draws.mean().item() == pytest.approx(0.3, rel=2e-3)


def test_thread_count_does_not_change_a_bit(lib, monkeypatch):
    rows, cols = 1024, 1000  # over the split threshold
    w, g = _tensors(rows, cols, 1, 1)

    def run(threads, threaded):
        monkeypatch.setattr(lib, "threaded", threaded)
        torch.set_num_threads(threads)
        (m, ms), (v, vs) = _state(rows, cols, 2, 1, True), _state(rows, cols, 2, 2, False)
        ww = w.clone()
        s = co.adam_scalars({"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-8, "betas": (0.9, 0.999)}, 5)
        _native_kernels.cpu_adam((ww, g, m, v), (ms, vs), cols, s, (1, 2), (1, 1, 2), (False, False))
        return ww, m, v, ms, vs

    threads = torch.get_num_threads()
    try:
        one = run(1, lib.threaded)
        for other in (run(3, lib.threaded), run(3, False)):  # torch's OpenMP threads, and a pool of our own
            assert all(torch.equal(a, b) for a, b in zip(one, other))
    finally:
        torch.set_num_threads(threads)


def _params():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.nn.Parameter(torch.randn(32, 512, generator=g).bfloat16()),
        "norm": torch.nn.Parameter((1 + 0.1 * torch.randn(512, generator=g)).bfloat16()),
    }


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return {"w": torch.randn(32, 512, generator=g).bfloat16(), "norm": torch.randn(512, generator=g).bfloat16()}


@pytest.mark.parametrize("cls,kwargs", [(CPUAdamW, {}), (CPUSGD, {"momentum": 0.9})], ids=["adamw", "sgd"])
@pytest.mark.parametrize("state_dtype", co.STATE_DTYPES)
def test_state_saved_and_loaded_resumes_bit_exactly(cls, kwargs, state_dtype):
    def build(params):
        return cls(list(params.items()), lr=1e-2, state_dtype=state_dtype, seed=5, **kwargs)

    def step(opt, params, i):
        for name, grad in _grads(i).items():
            params[name].grad = grad
        opt.step()

    straight = _params()
    opt = build(straight)
    for i in range(3):
        step(opt, straight, i)

    first = _params()
    opt = build(first)
    for i in range(2):
        step(opt, first, i)
    buffer = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "w": {k: p.detach().clone() for k, p in first.items()}}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = _params()
    with torch.no_grad():
        for name, p in resumed.items():
            p.copy_(saved["w"][name])
    opt = build(resumed)
    opt.load_state_dict(saved["opt"])
    step(opt, resumed, 2)
    for name in straight:
        assert torch.equal(resumed[name], straight[name]), name
    formats = {k: v.dtype for k, v in opt.state[resumed["w"]].items()}
    assert (
        formats[next(iter(opt._state_names))]
        == {"fp32": torch.float32, "bf16": torch.bfloat16, "8bit": torch.uint8}[state_dtype]
    )
    assert opt.state[resumed["norm"]][opt._state_names[0]].dtype != torch.uint8  # 1-D: bf16 (or fp32) state


def test_fp32_steps_are_torchs_adamw_and_sgd_within_rounding():
    """fp32 weights and state: the same updates as torch.optim (which orders the operations differently)."""
    for ours, theirs, kwargs in (
        (CPUAdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
        (CPUSGD, torch.optim.SGD, dict(lr=1e-2, momentum=0.9, weight_decay=0.1, nesterov=True)),
    ):
        a = torch.nn.Parameter(torch.randn(64, 300, generator=torch.Generator().manual_seed(0)))
        b = torch.nn.Parameter(a.detach().clone())
        opt_a, opt_b = ours([a], state_dtype="fp32", **kwargs), theirs([b], **kwargs)
        for i in range(5):
            grad = torch.randn(64, 300, generator=torch.Generator().manual_seed(i))
            a.grad, b.grad = grad.clone(), grad.clone()
            opt_a.step()
            opt_b.step()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("state_dtype", co.STATE_DTYPES)
def test_bf16_weights_follow_fp32_adamw(state_dtype):
    """bf16 weights and bf16/8-bit moments, rounded stochastically, track fp32 AdamW over 200 steps of a noisy
    linear regression (round to nearest would lose every update below half a bf16 step)."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(8, 256, generator=g)
    ref = torch.nn.Parameter(torch.zeros(8, 256) + 1.0)
    ours = torch.nn.Parameter(ref.detach().bfloat16())
    opt_ref = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.0)
    opt = CPUAdamW([ours], lr=1e-3, weight_decay=0.0, state_dtype=state_dtype)
    for _ in range(200):
        noise = 0.5 * torch.randn(8, 256, generator=g)
        ref.grad = ref.detach() - target + noise
        ours.grad = (ours.detach().float() - target + noise).bfloat16()
        opt_ref.step()
        opt.step()
    moved_ref, moved = (ref.detach() - 1.0).mean(), (ours.detach().float() - 1.0).mean()
    # the average movement is fp32's (each element's own is within a few bf16 steps, 2^-7 near 1: the rounding's
    # noise); updates of lr = 1e-3 are an eighth of a bf16 step: rounded to nearest none would move at all
    assert moved_ref.abs() > 0.05 and moved.item() == pytest.approx(moved_ref.item(), rel=0.03)
    assert (ours.detach().float() - ref.detach()).abs().mean() < 3 * 2**-7


def test_recipe_builds_it_with_names_and_the_runs_seed():
    from omegaconf import OmegaConf

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).bfloat16()
    rounding = training.build_stochastic_rounding(True, dtype=torch.bfloat16, seed=3, device=torch.device("cpu"))
    cfg = OmegaConf.create({"_component_": "torchtune.training.CPUAdamW", "lr": 1e-3, "state_dtype": "8bit"})
    wrapper = training.build_optimizer(cfg, model, optimizer_in_bwd=True, rounding=rounding)
    opt = wrapper.optim_map["1.weight"]
    assert opt.param_groups[0]["param_names"] == ["1.weight"]
    assert opt.seed == rounding.optimizer_kwargs("torchtune.training.CPUAdamW")["seed"] != 0
    # stepped in backward through step_parameter, the weight-change share counted
    changes = training.WeightChangeTracker()
    changes.arm(torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model[1].weight.grad = torch.ones(8, 8).bfloat16()
    training.step_parameter(opt, model[1].weight, rounding=rounding, changes=changes)
    moved = int((model[1].weight != before["1.weight"]).sum())
    assert model[1].weight.grad is None and changes.pop() == pytest.approx(moved / 64) and moved > 0
