"""The shipped full_finetune_distributed configs for real models: each header states per-GPU figures
in one format, and the headline one -- Llama2-7B on ONE GPU with fsdp_cpu_offload -- is what
`tune estimate-memory` prints today and is under 8 GB."""

import re
import subprocess

import pytest

from tests._helpers.tiny_run import REPO_ROOT, TUNE
from torchtune import _recipe_registry as registry

CONFIGS = [
    "llama2/7B_full_distributed",
    "llama2/13B_full_distributed",
    "llama2/70B_full_distributed",
    "llama3_1/8B_full_distributed",
    "qwen3/8B_full_distributed",
    "qwen3/14B_full_distributed",
    "qwen3/32B_full_distributed",
    "qwen2_5/7B_full_distributed",
    "qwen2_5/14B_full_distributed",
    "qwen2_5/32B_full_distributed",
    "mistral/7B_full_distributed",
    "phi4/14B_full_distributed",
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
    stated = float(re.search(r"fsdp_cpu_offload=True on 1 GPU: ([\d.]+) GB", _header(name)).group(1))
    proc = subprocess.run(
        [TUNE, "estimate-memory", "--config", name, "fsdp_cpu_offload=True"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    printed = float(re.search(r"on 1 GPU: +([\d.]+) GB per GPU", proc.stdout).group(1))
    assert stated == pytest.approx(printed, abs=0.011)
    assert printed < 8
