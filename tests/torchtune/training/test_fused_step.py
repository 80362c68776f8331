"""bitsandbytes' Adam step in one pass with stochastic rounding (``_fused_step``): bitsandbytes' own update
maths (its CPU backend), the rounding's definition, the compiled kernel's bits, the multi-tensor step of
small parameters, and what a step launches on the CUDA code path."""

import pytest
import torch

from torchtune.training import StochasticRounding, WeightChangeTracker, step_parameter
from torchtune.training.optim import _fused_step as fs

bnb = pytest.importorskip("bitsandbytes")
CPU = torch.device("cpu")


def _opt(component, params, **kwargs):
    return getattr(bnb.optim, component)(params, lr=1e-3, weight_decay=kwargs.pop("weight_decay", 0.0), **kwargs)


def _state_values(state):
    """The moments as fp32 values (8-bit: dequantized with bitsandbytes' own function)."""
    if state["state1"].dtype == torch.float32:
        return state["state1"].clone(), state["state2"].clone()
    dq = torch.ops.bitsandbytes.dequantize_blockwise
    return (
        dq(state["state1"], state["absmax1"], state["qmap1"], 256, torch.float32),
        dq(state["state2"], state["absmax2"], state["qmap2"], 256, torch.float32),
    )


def _reference_step(component, w, g, state, weight_decay, patch):
    """bitsandbytes' own update (its CPU backend) of fp32 copies of ``w``/``g`` from ``state``: the fp32 weight
    before any rounding, and the moments it computed before requantizing them (captured in the call)."""
    from bitsandbytes.backends.cpu import ops as cpu_ops

    p = torch.nn.Parameter(w.float())
    opt = _opt(component, [p], weight_decay=weight_decay)
    p.grad = g.float()
    opt.step()  # makes the state; overwritten below with ``state`` and stepped again
    opt.state[p].update({k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()})
    opt.state[p]["step"] = state["step"]
    p.data.copy_(w.float())
    captured = []
    real = cpu_ops._quant_blockwise_fp32_direct
    patch.setattr(cpu_ops, "_quant_blockwise_fp32_direct", lambda a, *r: captured.append(a.clone()) or real(a, *r))
    opt.step()
    patch.undo()
    moments = captured if captured else [opt.state[p]["state1"].clone(), opt.state[p]["state2"].clone()]
    return p.detach().clone(), moments


@pytest.mark.parametrize("component", ["PagedAdamW", "AdamW8bit", "PagedAdamW8bit"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_step_is_bitsandbytes_update_rounded_with_the_weights_stream(component, weight_decay):
    """Three steps of a 64 x 80 bf16 weight (20 blocks of 256): each step's moments are bitsandbytes' (8-bit:
    the values it computed, requantized to the nearest code), and the weight is bitsandbytes' fp32 result
    rounded by ``StochasticRounding.round_`` with the weights' key of that call."""
    torch.manual_seed(0)
    param = torch.nn.Parameter((torch.rand(64, 80) + 0.5).bfloat16())
    opt = _opt(component, [param], weight_decay=weight_decay)
    rounding, twin = StochasticRounding(seed=3, device=CPU), StochasticRounding(seed=3, device=CPU)
    for step in range(3):
        grad = (torch.randn(64, 80) * (1 + step)).bfloat16()
        before = param.detach().clone()
        state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[param].items()}
        param.grad = grad
        assert fs.bnb_adam_step(opt, param, rounding, None) and param.grad is None
        key = twin.next_key()  # one key of the weights' stream per step
        if step == 0:
            continue  # the state was made by the step: compared from the second step on
        with pytest.MonkeyPatch.context() as patch:
            want_w, want_moments = _reference_step(component, before, grad, state, weight_decay, patch)
        expected = torch.empty_like(before)
        twin.round_(expected, want_w, key=key)
        got_moments = _state_values(opt.state[param])
        if "8bit" in component:
            code = [opt.state[param]["qmap1"], opt.state[param]["qmap2"]]
            for got, want, table in zip(got_moments, want_moments, code):
                blocks = want.view(-1, 256)
                absmax = blocks.abs().amax(1, keepdim=True)
                nearest = table[((blocks / absmax).reshape(-1, 1) - table).abs().argmin(1)].view(-1, 256) * absmax
                torch.testing.assert_close(got.view(-1, 256), nearest, rtol=1e-6, atol=0)
        else:
            for got, want in zip(got_moments, want_moments):
                # fp32: bitsandbytes' add(alpha=) rounds once (a fused multiply-add on this CPU), our product
                # and sum twice: one fp32 step of the larger term apart where the two terms cancel
                torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)
        same = (param.detach() == expected).float().mean().item()
        assert same >= 0.999, same  # the rest one bf16 step apart (an fp32 ulp on the far side of a step)
        assert ((param.detach().float() - expected.float()).abs() <= expected.float().abs() * 2**-7).all()


def test_the_eight_bit_codes_are_the_nearest_entries():
    code = bnb.functional.create_dynamic_map(signed=True).float()
    x = torch.linspace(-1, 1, 10001)
    want = (x[:, None] - code[None]).abs().argmin(1)
    got = fs._nearest_code(code, x)
    # ties aside (the midpoint in fp32), the nearest entry
    assert (got == want).float().mean() > 0.999
    assert ((code[got] - x).abs() <= (code[want] - x).abs() + 1e-7).all()


def test_compiled_kernels_give_the_eager_bits(monkeypatch):
    """The kernel Inductor compiles (what a GPU runs; here Inductor's CPU kernel, forced for small tensors)
    writes the weights and state the eager arithmetic writes; it is one kernel, compiled once for every
    step (the keys and step scalars are its arguments, not constants)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    import torchtune.training.optim._stochastic_rounding as sr

    results = {}
    for compiled in (False, True):
        monkeypatch.setattr(sr, "_COMPILE_MIN", 0 if compiled else 1 << 40)
        monkeypatch.setattr(sr, "_COMPILED", {})
        torch._dynamo.reset()
        counters.clear()
        out = []
        for component in ("PagedAdamW", "AdamW8bit"):
            torch.manual_seed(0)
            param = torch.nn.Parameter((torch.rand(48, 128) + 0.5).bfloat16())
            opt = _opt(component, [param])
            rounding = StochasticRounding(seed=0, device=CPU)
            for step in range(3):
                param.grad = torch.randn(48, 128).bfloat16()
                if compiled and step == 0:
                    _, code = run_and_get_code(fs.bnb_adam_step, opt, param, rounding, None)
                    assert sum(c.count("async_compile.cpp_pybinding(") for c in code) == 1, component
                else:
                    fs.bnb_adam_step(opt, param, rounding, None)
            out.append((param.detach().clone(), *_state_values(opt.state[param])))
        if compiled:
            assert sr._FUSED_BROKEN is None
            assert counters["stats"]["unique_graphs"] == 2  # one per kernel, however the step's scalars change
        results[compiled] = out
    for eager, compiled in zip(results[False], results[True]):
        assert (eager[0] == compiled[0]).float().mean() > 0.999
        torch.testing.assert_close(eager[1], compiled[1], rtol=2e-6, atol=1e-7)
        torch.testing.assert_close(eager[2], compiled[2], rtol=2e-6, atol=1e-7)


def _tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 512, bias=False),
        torch.nn.LayerNorm(512, elementwise_affine=True, bias=False),
        torch.nn.Linear(512, 64, bias=False),
        torch.nn.LayerNorm(64, bias=False),
    ).to(torch.bfloat16)


@pytest.mark.parametrize("component", ["PagedAdamW", "AdamW8bit"])
def test_small_parameters_are_stepped_together_at_the_end_of_backward(component):
    """In backward the norm scales (512 and 64 elements) are deferred and stepped in one multi-tensor call:
    their moments are those of stepping each on its own, their weights bitsandbytes' fp32 result rounded
    with one key over the concatenation, and the big weights are stepped by their own hooks."""
    from torchtune.training.optim._optimizer import register_optim_in_bwd_hooks

    def run(together):
        model = _tiny_model()
        names = [n for n, _ in model.named_parameters()]
        optims = {n: _opt(component, [p]) for n, p in model.named_parameters()}
        rounding = StochasticRounding(seed=1, device=CPU)
        changes = WeightChangeTracker()
        if together:
            register_optim_in_bwd_hooks(model, optims, rounding=rounding, weight_changes=changes)
        else:
            for name, p in model.named_parameters():
                p.register_post_accumulate_grad_hook(
                    lambda q, o=optims[name]: step_parameter(o, q, rounding=rounding, in_backward=True)
                )
        x = torch.randn(8, 64).bfloat16()
        changes.arm(CPU)
        model(x).float().pow(2).mean().backward()  # one step: the next would see other weights
        assert all(p.grad is None for p in model.parameters())
        states = {n: _state_values(optims[n].state[p]) for n, p in zip(names, model.parameters())}
        return model, states, changes.pop()

    together, states, share = run(True)
    alone, alone_states, _ = run(False)
    for name in states:
        for got, want in zip(states[name], alone_states[name]):
            torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-12)
    assert 0 < share <= 1
    big = [n for n, p in together.named_parameters() if p.numel() >= fs.SMALL]
    assert not big  # this model is all small: every parameter went through the multi-tensor call
    for a, b in zip(together.parameters(), alone.parameters()):
        # rounded with other bits, each weight is one of the two bf16 neighbours of the same fp32 value
        assert ((a.detach().float() - b.detach().float()).abs() <= b.detach().float().abs() * 2**-7 + 1e-30).all()


def test_a_parameter_outside_backward_is_not_deferred():
    model = _tiny_model()
    param = model[1].weight
    opt = _opt("PagedAdamW", [param])
    param.grad = torch.ones_like(param)
    assert not fs.SmallParamSteps(StochasticRounding(seed=0, device=CPU)).defer(opt, param)


def test_a_kernel_that_cannot_be_built_stops_a_gpu_run_and_is_said_once_on_a_cpu(monkeypatch, caplog):
    """On a GPU the run stops with the reason (the plain path would launch dozens of kernels per tensor); on a
    CPU the plain path runs, said once with what it costs. (A meta tensor plays the GPU's: no compile runs.)"""
    import torchtune.training.optim._stochastic_rounding as sr
    from torchtune import TuneError

    def broken(fn, **kwargs):
        raise RuntimeError("no working Triton here")

    monkeypatch.setattr(sr, "_COMPILED", {})
    monkeypatch.setattr(sr, "_FUSED_BROKEN", None)
    monkeypatch.setattr(torch, "compile", broken)
    with pytest.raises(TuneError, match="no working Triton here.*bf16_stochastic_rounding=False"):
        sr._run_compiled("fused_bnb32", fs._bnb32_into, torch.empty(4, device="meta"))
    with caplog.at_level("WARNING", logger="torchtune"):
        assert sr._run_compiled("fused_bnb32", fs._bnb32_into, torch.empty(4)) == (False, None)
        assert sr._run_compiled("fused_bnb32", fs._bnb32_into, torch.empty(4)) == (False, None)
    said = [r.getMessage() for r in caplog.records if "plain PyTorch path" in r.getMessage()]
    assert len(said) == 1 and f"about {sr._PLAIN_PASSES} separate passes" in said[0]


def test_the_plain_paths_passes_are_what_the_warning_says():
    """The plain rounding of one chunk launches ``_PLAIN_PASSES`` kernels (and copies its key to the device)."""
    import torchtune.training.optim._stochastic_rounding as sr
    from torchtune.training.estimate import _launch_counter as lc

    counter = lc.LaunchCounter()
    with lc.counting(counter):
        src = torch.empty(1000, device=lc.DEVICE)
        dst = torch.empty(1000, dtype=torch.bfloat16, device=lc.DEVICE)
        counter.reset()
        sr._chunked(sr._round_into, 1000, lc.DEVICE, False, (1, 2), src, dst)
    c = counter.count()
    assert c.total == sr._PLAIN_PASSES + 1 and c.h2d_pinned == 1


def test_a_logged_steps_norm_and_weight_count_come_from_the_kernels():
    """On a logged step the fused kernels sum the gradients' squares and count the changed weights: the norm is
    the gradients' own, and the count what moved (a big parameter alone, the small ones in their call)."""
    from torchtune.training import GradNormTracker
    from torchtune.training.optim._optimizer import register_optim_in_bwd_hooks

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False), torch.nn.LayerNorm(512, bias=False))
    model = model.to(torch.bfloat16)
    optims = {n: _opt("PagedAdamW", [p]) for n, p in model.named_parameters()}
    norm, changes = GradNormTracker(), WeightChangeTracker()
    register_optim_in_bwd_hooks(
        model, optims, norm, rounding=StochasticRounding(seed=0, device=CPU), weight_changes=changes
    )
    x = torch.randn(4, 256).bfloat16()
    grads = {}
    for n, p in model.named_parameters():
        p.register_hook(lambda g, n=n: grads.__setitem__(n, g.detach().float().clone()))
    before = [p.detach().clone() for p in model.parameters()]
    norm.arm(CPU)
    changes.arm(CPU)
    model(x).float().pow(2).mean().backward()
    want = torch.sqrt(sum(g.pow(2).sum() for g in grads.values())).item()
    assert norm.pop() == pytest.approx(want, rel=1e-5)
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
    assert changes.pop() == pytest.approx(moved / sum(p.numel() for p in model.parameters()))
