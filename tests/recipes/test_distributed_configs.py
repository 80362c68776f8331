"""The shipped full_finetune_distributed configs for real models: each header states per-GPU figures
in one format, and the headline one -- Llama2-7B on ONE GPU with fsdp_cpu_offload -- is what
`tune estimate-memory` prints today and is under 8 GB."""

import re

import pytest

from tests._helpers.estimate_memory import printed
from torchtune import _recipe_registry as registry

CONFIGS = [
    "llama2/7B_full_distributed",
    "llama2/13B_full_distributed",
    "llama2/70B_full_distributed",
    "llama3_1/8B_full_distributed",
]


def _header(name):
    return registry.get_config(name).path.read_text().split("\n\n")[0].replace("\n#", "")


@pytest.mark.parametrize("name", CONFIGS)
def test_header_states_per_gpu_figures_and_the_command(name):
    header = _header(name)
    one, two, eight = (
        float(x) for x in re.search(r"1 GPU: ([\d.]+) GB, 2 GPUs: ([\d.]+) GB, 8 GPUs: ([\d.]+) GB", header).groups()
    )
    assert eight < two < one
    assert "estimated (fake tensors)" in header
    assert f"tune estimate-memory --config {name} --world-size 1,2,8" in header
    assert registry.recipe_for_config(name).name == "full_finetune_distributed"


def test_llama2_7b_on_one_gpu_with_cpu_offload_is_under_8_gb():
    name = "llama2/7B_full_distributed"
    stated = re.search(r"fsdp_cpu_offload=True on 1 GPU: ([\d.]+) GB", _header(name)).group(1)
    stdout = printed(f"tune estimate-memory --config {name} fsdp_cpu_offload=True")  # once per session
    per_gpu = re.search(r"on 1 GPU: +([\d.]+) GB per GPU", stdout).group(1)
    assert stated == per_gpu
    assert float(per_gpu) < 8
