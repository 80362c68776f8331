"""Host memory of a resume, measured: peak resident set (VmHWM) while the optimizer state is restored.

The bound (issue 17): the restored state once, plus one parameter's worth. Reading ``recipe_state.pt``
whole (no mmap) and then letting bitsandbytes' ``load_state_dict`` deep-copy it held it twice or
three times; mapping it and copying into the optimizer without releasing the mapped pages, twice.
Each resume runs in a fresh process so that its peak is its own.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchtune.utils import OptimInBackwardWrapper
from torchtune.utils._checkpointing._streaming_write import save_torch

MB = 1 << 20
NUM_PARAMS, NUMEL = 8, 1 << 21  # 8 parameters of 8 MB (fp32): 64 MB of weights, 128 MB of Adam state
SLACK = 12 * MB  # Python objects, pickle and allocator bookkeeping of the load itself

SCRIPT = r"""
import gc, json, sys
import torch
from torchtune.training import load_optimizer_state
from torchtune.utils._checkpointing import load_recipe_state

sys.path.insert(0, sys.argv[1])
from test_resume_memory import build, state_sums

optimizer, inner, params = build(*sys.argv[2:4])

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

gc.collect()
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # restart the peak (VmHWM) from here
state = load_recipe_state(sys.argv[4])
load_optimizer_state(optimizer, state["optimizer"])
del state
gc.collect()
state_bytes = sum(
    v.numel() * v.element_size() for opt in inner for s in opt.state.values() for v in s.values() if torch.is_tensor(v)
)
result = {"before": before, "peak": status("VmHWM"), "after": status("VmRSS"), "state_bytes": state_bytes}
print(json.dumps({**result, "sums": state_sums(inner, params)}))
"""


def build(mode: str, component: str):
    """The parameters and optimizer(s) of the run, the same in the saving and the resuming process."""
    module, _, name = component.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    torch.manual_seed(0)
    params = {f"layers.{i}.w": torch.nn.Parameter(torch.randn(NUMEL)) for i in range(NUM_PARAMS)}
    if mode == "in_bwd":
        optimizer = OptimInBackwardWrapper({n: cls([p], lr=1e-3) for n, p in params.items()})
        return optimizer, list(optimizer.optim_map.values()), params
    optimizer = cls(list(params.values()), lr=1e-3)
    return optimizer, [optimizer], params


def state_sums(inner, params) -> list:
    return [
        float(v.double().sum())
        for opt in inner
        for p in params.values()
        if p in opt.state
        for _, v in sorted(opt.state[p].items())
        if torch.is_tensor(v) and v.numel() > 1
    ]


def _save(path: Path, mode: str, component: str) -> list:
    optimizer, inner, params = build(mode, component)
    for p in params.values():
        p.grad = torch.randn_like(p)
    for opt in inner:
        opt.step()
    save_torch({"optimizer": optimizer.state_dict()}, path)
    return state_sums(inner, params)


def _resume(path: Path, mode: str, component: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(Path(__file__).parent), mode, component, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak RSS")
@pytest.mark.parametrize(
    "mode, component",
    [
        ("in_bwd", "torch.optim.AdamW"),  # torch keeps CPU state as loaded: the mapped pages must be let go
        ("standard", "bitsandbytes.optim.PagedAdamW"),  # bitsandbytes deep-copies whatever it is given
    ],
)
def test_resume_holds_the_optimizer_state_once_plus_one_parameter(tmp_path, mode, component):
    path = tmp_path / "recipe_state.pt"
    saved = _save(path, mode, component)
    resumed = _resume(path, mode, component)
    assert resumed["sums"] == saved  # the state came back exactly
    state, one_param = resumed["state_bytes"], 2 * NUMEL * 4  # exp_avg + exp_avg_sq of one parameter
    assert state >= 2 * NUM_PARAMS * NUMEL * 4
    growth = resumed["peak"] - resumed["before"]
    print(
        f"{mode} {component}: peak +{growth / MB:.1f} MB, after +{(resumed['after'] - resumed['before']) / MB:.1f} MB"
    )
    # the transient budget (one parameter + slack) is a fraction of the state: twice the state cannot pass
    assert one_param + SLACK < state / 4
    assert growth <= state + one_param + SLACK, (
        f"resume peaked {growth / MB:.0f} MB above the model, for {state / MB:.0f} MB of optimizer state "
        f"(bound: state + one parameter's {one_param / MB:.0f} MB + {SLACK / MB:.0f} MB)"
    )
    assert resumed["after"] - resumed["before"] <= state + SLACK
