"""optimizer_in_bwd_group: layer steps each decoder layer's parameters together, with the losses of one
optimizer per parameter, at most one layer's gradients alive, and checkpoints that fit either grouping."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from torchtune import config, training
from torchtune._errors import ConfigError
from torchtune.models.llama2 import llama2

VOCAB = 128
ADAMW = {"_component_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.01}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return llama2(vocab_size=VOCAB, num_layers=3, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64)


def _batches(n: int = 5) -> list:
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        tokens = torch.randint(1, VOCAB, (2, 24), generator=gen)
        labels = tokens.clone()
        labels[:, :8] = -100  # a prompt
        out.append({"tokens": tokens, "labels": labels})
    return out


def _step(group: str, optimizer: dict = ADAMW, model=None):
    model = model if model is not None else _model()
    opt = training.build_optimizer(OmegaConf.create(optimizer), model, optimizer_in_bwd=True, in_bwd_group=group)
    loss = config.instantiate({"_component_": "torchtune.modules.loss.ChunkedCrossEntropyLoss", "num_output_chunks": 2})
    return training.TrainStep(model, opt, loss, device=torch.device("cpu"))


def test_layer_groups_hold_each_layers_parameters_and_the_rest_one_each():
    model = _model()
    groups = training.in_bwd_groups(model, "layer")
    names = [name for name, _ in model.named_parameters()]
    assert [n for g in groups for n in g] == names  # every parameter once, in order
    layer_groups = [g for g in groups if g[0].startswith("layers.")]
    assert len(layer_groups) == 3
    assert all(len(g) == 9 and {n.split(".")[1] for n in g} == {str(i)} for i, g in enumerate(layer_groups))
    assert [g for g in groups if not g[0].startswith("layers.")] == [
        ["tok_embeddings.weight"],
        ["norm.scale"],
        ["output.weight"],
    ]
    assert training.in_bwd_groups(model, "param") == [[n] for n in names]


@pytest.mark.parametrize("fused", [True, False])
def test_layer_grouping_gives_the_per_parameter_losses(fused):
    batches = _batches()
    losses = {}
    for group in ("param", "layer"):
        step = _step(group, {**ADAMW, "fused": fused})
        losses[group] = [float(step(b)) for b in batches]
        weights = {k: v.clone() for k, v in step.model.state_dict().items()}
        losses[group + "_weights"] = weights
    assert losses["param"][-1] < losses["param"][0]
    for a, b in zip(losses["layer"], losses["param"]):
        assert abs(a - b) <= 1e-6, (losses["layer"], losses["param"])
    for name, w in losses["param_weights"].items():
        torch.testing.assert_close(losses["layer_weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("group, bound", [("param", 1), ("layer", 9)])
def test_at_most_one_layers_gradients_exist_during_backward(group, bound):
    model = _model()
    params = list(model.parameters())
    alive = []
    # registered before the optimizer's hooks, so each runs with the just-completed gradient alive
    for p in params:
        p.register_post_accumulate_grad_hook(lambda _: alive.append(sum(q.grad is not None for q in params)))
    step = _step(group, model=model)
    for b in _batches(2):
        step(b)
        assert all(p.grad is None for p in params)  # nothing left after the step
    assert max(alive) == bound


def test_state_saved_with_one_grouping_resumes_with_the_other():
    batches = _batches(4)
    straight = _step("layer")
    expected = [float(straight(b)) for b in batches]

    first = _step("layer")
    [first(b) for b in batches[:2]]
    state = first.optimizer.state_dict()
    per_param = _step("param")
    assert set(state) == set(per_param.optimizer.state_dict())  # keyed by parameter name either way
    # a fresh model with the trained weights: the first model's layer hooks still sit on its parameters
    model = _model()
    model.load_state_dict(first.model.state_dict())
    resumed = _step("param", model=model)
    resumed.optimizer.load_state_dict(state)
    got = [float(resumed(b)) for b in batches[2:]]
    for a, b in zip(got, expected[2:]):
        assert abs(a - b) <= 1e-6, (got, expected)
    # and back: the per-parameter state loads into a layer grouping
    again = _step("layer", model=_model())
    again.optimizer.load_state_dict(resumed.optimizer.state_dict())
    step_of = {n: s["state"][0]["step"] for n, s in again.optimizer.state_dict().items()}
    assert set(float(v) for v in step_of.values()) == {4.0}


class _TwoLayers(nn.Module):
    """A model with ``.layers`` where one layer parameter gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.layers[1].unused = nn.Parameter(torch.ones(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_whose_parameter_gets_no_gradient_is_stepped_after_backward():
    torch.manual_seed(0)
    model = _TwoLayers()
    opt = training.build_optimizer(
        OmegaConf.create({"_component_": "torch.optim.SGD", "lr": 0.1}),
        model,
        optimizer_in_bwd=True,
        in_bwd_group="layer",
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(2, 4)).sum().backward()
    assert model.layers[1].weight.grad is not None  # waiting for 'unused', which never comes
    assert model.layers[0].weight.grad is None  # the complete layer stepped in backward
    training.step_optimizer(opt, model.parameters())
    assert all(p.grad is None for p in model.parameters())
    assert not torch.equal(model.layers[1].weight, before["layers.1.weight"])
    assert torch.equal(model.layers[1].unused, before["layers.1.unused"])


def test_bad_grouping_is_a_config_error():
    with pytest.raises(ConfigError, match="optimizer_in_bwd_group='block'"):
        training.in_bwd_groups(_model(), "block")
    with pytest.raises(ConfigError, match="needs a model whose decoder layers are model.layers"):
        training.in_bwd_groups(nn.Linear(2, 2), "layer")
    cfg = OmegaConf.create(
        {
            "optimizer_in_bwd": True,
            "optimizer_in_bwd_group": "Layer",
            "gradient_accumulation_steps": 1,
            "clip_grad_norm": None,
            "optimizer": ADAMW,
        }
    )
    with pytest.raises(ConfigError, match="optimizer_in_bwd_group='Layer' is not a grouping"):
        training.check_optimizer_settings(cfg)


def test_the_memory_estimate_counts_one_layers_gradients():
    from torchtune.config import load_config
    from torchtune.training.estimate._memory_estimator import estimate_recipe_memory

    def estimate(group):
        cfg = load_config(
            "llama2/7B_full_low_memory",
            [
                "model._component_=torchtune.models.llama2.llama2_tiny",
                "+model.vocab_size=256",
                "+model.num_layers=2",
                "+model.embed_dim=256",
                "+model.num_heads=4",
                "+model.num_kv_heads=4",
                "optimizer._component_=torch.optim.SGD",
                "~optimizer.weight_decay",
                "dtype=fp32",
                "enable_activation_checkpointing=False",
                f"optimizer_in_bwd_group={group}",
            ],
        )
        return estimate_recipe_memory(cfg, seq_len=16, batch_size=1)

    per_param, per_layer = estimate("param"), estimate("layer")
    from torchtune.models.llama2 import llama2_tiny

    layer = llama2_tiny(vocab_size=256, num_layers=2, embed_dim=256, num_heads=4, num_kv_heads=4).layers[0]
    layer_grad_bytes = sum(-(-p.numel() * 4 // 512) * 512 for p in layer.parameters())
    # tiny activations: the peak is in a layer's backward, where the layer grouping holds that layer's
    # gradients and the per-parameter one at most one parameter's
    assert per_layer.breakdown["gradients"] >= layer_grad_bytes // 2
    assert per_param.breakdown["gradients"] < layer_grad_bytes // 2
    assert per_param.peak_bytes < per_layer.peak_bytes <= per_param.peak_bytes + layer_grad_bytes
    assert any("optimizer_in_bwd_group=layer" in note for note in per_layer.notes)


def test_a_leftover_layer_step_is_rounded_and_counted_as_the_hooks_steps_are():
    """bf16 weights: the step OptimInBackwardWrapper.step() takes after backward is stochastically rounded
    (an SGD update of a fifth of a bf16 step moves weights; rounded to nearest it would move none) and
    counted in weight_changes, as a step inside backward is."""
    torch.manual_seed(0)
    model = _TwoLayers().to(torch.bfloat16)
    with torch.no_grad():
        model.layers[1].weight.fill_(1.5)  # bf16 step 2^-7 here; the update is 0.2 of it
    rounding = training.StochasticRounding(seed=0, device=torch.device("cpu"))
    changes = training.WeightChangeTracker()
    opt = training.build_optimizer(
        OmegaConf.create({"_component_": "torch.optim.SGD", "lr": 0.2 * 2**-7}),
        model,
        optimizer_in_bwd=True,
        in_bwd_group="layer",
        rounding=rounding,
        weight_changes=changes,
    )
    changes.arm(torch.device("cpu"))
    model(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    model.layers[1].weight.grad = torch.ones_like(model.layers[1].weight)  # a known update of 0.2 ulp
    training.step_optimizer(opt, model.parameters())
    moved = (model.layers[1].weight != 1.5).float().mean().item()
    assert 0 < moved < 0.6  # about a fifth of the 16 elements moved one bf16 step (to nearest: none)
    assert changes.pop() > 0
