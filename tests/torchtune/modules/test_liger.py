"""liger-kernel's real kernels (under Triton's interpreter, on CPU: tests/_helpers/liger.py) against our plain
PyTorch path: every family's model with ``apply_liger_kernels`` (RMSNorm in Llama's and Gemma's casting,
RoPE of every kind with grouped-query heads, packed positions and a partial rotation, SwiGLU), the fused
linear cross-entropy, a few training steps with every liger option on; and the estimator's stand-ins,
which must allocate and save what liger-kernel's ops do. Skipped where liger-kernel is not installed."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests._helpers.close import assert_all_close, assert_close
from tests._helpers.liger import interpreted_liger
from torchtune import config, training
from torchtune.models.gemma3 import gemma3_tiny
from torchtune.models.llama2 import llama2
from torchtune.models.llama3_1 import llama3_1
from torchtune.models.mistral import mistral
from torchtune.models.phi4 import phi4
from torchtune.models.qwen3 import qwen3
from torchtune.modules import _liger
from torchtune.modules.loss import CrossEntropyLoss, LigerLinearCrossEntropyLoss

VOCAB = 67  # odd sizes everywhere: no kernel may rely on powers of two
# 6 query heads over 2 key/value heads (grouped-query), head_dim 8 (10 for Qwen3), 52 feed-forward channels
FAMILIES = {
    "llama2": lambda: llama2(VOCAB, 2, 6, 2, 48, 52, intermediate_dim=32),
    "llama3_1": lambda: llama3_1(VOCAB, 2, 6, 2, 48, 32, intermediate_dim=52, old_context_len=16),
    "qwen3": lambda: qwen3(VOCAB, 2, 6, 2, 48, 52, 32, head_dim=10),
    "mistral": lambda: mistral(VOCAB, 2, 6, 2, 48, 52, 32, sliding_window=5),
    # partial rotation (6 of 8 channels) with LongRoPE's long table (positions past 8)
    "phi4": lambda: phi4(
        VOCAB,
        2,
        6,
        2,
        48,
        52,
        32,
        rotary_dim=6,
        rope_short_factor=[1.0, 1.5, 2.0],
        rope_long_factor=[2.0, 3.0, 5.0],
        rope_original_max_seq_len=8,
        rope_scale_factor=4.0,
    ),
    # Gemma's norms (1 + scale, fp32), q/k norms, post-norms; its GELU-gated MLP stays plain
    "gemma3": lambda: gemma3_tiny(VOCAB, 3, 6, 2, 48, 8, 52, 32, sliding_window_size=5),
}
EXPECTED = {  # modules replaced: norms (2 a layer + final, + q/k norms, + Gemma's post-norms), ropes, MLPs
    "llama2": {"rms_norm": 5, "rope": 1, "swiglu": 2},
    "llama3_1": {"rms_norm": 5, "rope": 1, "swiglu": 2},
    "qwen3": {"rms_norm": 9, "rope": 1, "swiglu": 2},
    "mistral": {"rms_norm": 5, "rope": 1, "swiglu": 2},
    "phi4": {"rms_norm": 5, "rope": 1, "swiglu": 2},
    "gemma3": {"rms_norm": 19, "rope": 2, "swiglu": 0},
}


@pytest.fixture(scope="module", autouse=True)
def _interpreted_liger():
    yield from interpreted_liger()


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = FAMILIES[family]()
    with torch.no_grad():
        for p in model.parameters():  # norm scales away from their init too (Gemma's start at 0)
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def _packed_batch():
    """Two rows; the second packs sequences of 7 and 4 tokens (positions restart, block-diagonal mask)."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 11), generator=g)
    input_pos = torch.stack([torch.arange(11), torch.cat([torch.arange(7), torch.arange(4)])])
    segment = torch.stack([torch.zeros(11, dtype=torch.long), (torch.arange(11) >= 7).long()])
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    mask = causal & (segment[:, :, None] == segment[:, None, :])
    return tokens, mask, input_pos


def _logits_and_grads(model, tokens, mask, input_pos, weights):
    model.zero_grad()
    logits = model(tokens, mask=mask, input_pos=input_pos)
    (logits * weights).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("packed", [False, True], ids=["causal", "packed"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_with_liger_kernels_matches_the_plain_model(family, packed):
    plain = _model(family)
    liger = copy.deepcopy(plain)
    assert _liger.apply_liger_kernels(liger) == EXPECTED[family]
    assert liger.state_dict().keys() == plain.state_dict().keys()
    tokens, mask, input_pos = _packed_batch() if packed else (_packed_batch()[0], None, None)
    weights = torch.randn(2, 11, VOCAB, generator=torch.Generator().manual_seed(2))
    logits, grads = _logits_and_grads(plain, tokens, mask, input_pos, weights)
    liger_logits, liger_grads = _logits_and_grads(liger, tokens, mask, input_pos, weights)
    # fp32 sums in another order (NumPy's in the interpreted kernels, ATen's per CPU): measured at most 6 ulps of
    # max|logits| and 17 of max|grad| on AVX512, AVX2 and default kernels (ATEN_CPU_CAPABILITY); 4x that allowed
    assert_close(liger_logits, logits, ulps=24, name="logits")
    assert_all_close(liger_grads, grads, ulps=64)


def _loss_and_grads(loss_fn, hidden, weight, labels, scale=1.0):
    hidden = hidden.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    output = torch.nn.Linear(hidden.size(-1), weight.size(0), bias=False)
    output.weight = torch.nn.Parameter(weight)
    loss = loss_fn(output, hidden, labels)
    (loss * scale).backward()
    return loss.detach(), hidden.grad, output.weight.grad


@pytest.mark.parametrize("scale", [1.0, 0.37], ids=["unscaled", "scaled"])  # a micro-batch's share scales it
def test_fused_linear_cross_entropy_matches_the_plain_loss(scale):
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(13, 24, generator=g), torch.randn(1001, 24, generator=g) * 0.2
    labels = torch.randint(0, 1001, (13,), generator=g)
    labels[[2, 5]] = -100  # left out, as when every position is passed
    expected = _loss_and_grads(CrossEntropyLoss(), hidden, weight, labels, scale)
    got = _loss_and_grads(LigerLinearCrossEntropyLoss(), hidden, weight, labels, scale)
    # one 24-long product and a 1001-long softmax sum, chunked by liger: measured at most 9 ulps of the largest value
    for what, a, b in zip(["loss", "grad of hidden", "grad of weight"], got, expected):
        assert_close(a, b, ulps=32, name=what)


def test_fused_linear_cross_entropy_of_no_labelled_position_is_zero():
    loss, grad_h, grad_w = _loss_and_grads(
        LigerLinearCrossEntropyLoss(), torch.randn(0, 24), torch.randn(101, 24), torch.zeros(0, dtype=torch.long)
    )
    assert loss.item() == 0.0 and grad_w.abs().sum().item() == 0.0 and grad_h.shape == (0, 24)


def test_a_few_training_steps_with_every_liger_option_match_the_plain_ones():
    """The recipe's step (TrainStep.from_config: build_model, in-backward AdamW, loss) on llama2/tiny_full;
    the recipe itself refuses liger off CUDA, so the step it runs is what is compared here."""
    g = torch.Generator().manual_seed(4)
    batch = {"tokens": torch.randint(0, 1000, (2, 12), generator=g), "labels": torch.randint(0, 1000, (2, 12))}
    batch["labels"][:, :3] = -100  # prompts: only the labelled positions reach the loss

    def losses(*overrides):
        # small: the interpreter runs each kernel instance as Python (~10 ms); a plain optimizer for a fast step
        small = ["model.num_layers=2", "model.embed_dim=64", "model.intermediate_dim=96"]
        small += ["optimizer._component_=torch.optim.AdamW"]
        cfg = config.load_config("llama2/tiny_full", ["dtype=fp32", "device=cpu", "seed=0", *small, *overrides])
        torch.manual_seed(0)
        step = training.TrainStep.from_config(cfg, device=torch.device("cpu"), dtype=torch.float32)
        assert isinstance(step.model.norm, _liger.LigerRMSNorm) == ("liger_kernels=True" in overrides)
        return torch.stack([step(batch) for _ in range(3)])

    plain = losses()
    liger_loss = ["loss._component_=torchtune.modules.loss.LigerLinearCrossEntropyLoss", "~loss.num_output_chunks"]
    liger = losses("liger_kernels=True", *liger_loss)
    assert plain[0] > plain[-1]  # it trains
    torch.testing.assert_close(liger, plain, rtol=1e-5, atol=1e-5)


# --- the estimator's stand-ins: what liger-kernel's ops allocate and save ----------------------------------


def _signature(fn, *inputs):
    """(output, saved tensors, input gradients) as (shape, dtype) of ``fn(*inputs)`` and its backward."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward([o for o in outs], [torch.ones_like(o) for o in outs])
    shapes = lambda ts: [(tuple(t.shape), t.dtype) for t in ts]  # noqa: E731
    grads = [x.grad for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    return shapes(outs), saved, shapes(grads)


def _rope_inputs():
    q = torch.randn(2, 11, 6, 8).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 11, 2, 8).transpose(1, 2).requires_grad_()
    return q, k, torch.randn(2, 11, 4), torch.randn(2, 11, 4)


OPS = {
    "rms_norm": (
        lambda: (torch.randn(2, 11, 48, requires_grad=True), torch.randn(48, requires_grad=True)),
        lambda x, w: _liger.rms_norm(x, w, 1e-6, False),
    ),
    "swiglu": (
        lambda: (torch.randn(2, 11, 52, requires_grad=True), torch.randn(2, 11, 52, requires_grad=True)),
        lambda a, b: _liger.silu_mul(a * 1.0, b * 1.0),  # the kernel's backward overwrites its inputs
    ),
    "rope": (_rope_inputs, lambda q, k, cos, sin: _liger.rope(q * 1.0, k * 1.0, cos, sin, 8)),
    "fused_linear_cross_entropy": (
        lambda: (torch.randn(13, 24, requires_grad=True), torch.randn(1001, 24, requires_grad=True)),
        lambda h, w: _liger.fused_linear_cross_entropy(h, w, None, torch.randint(0, 1001, (13,)), -100, None),
    ),
}


@pytest.mark.parametrize("op", list(OPS))
def test_the_estimators_stand_in_allocates_and_saves_what_liger_does(op):
    make_inputs, fn = OPS[op]
    torch.manual_seed(5)
    real = _signature(fn, *make_inputs())
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = _signature(fn, *make_inputs())
    assert fake == real
