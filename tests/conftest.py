"""Test-wide settings: offline, one thread, and the ``gpu`` marker.

The models in these tests are tiny: with several OpenMP threads on a 2-core machine each small
matmul pays thread wake-up costs far larger than the work (measured ~48 ms vs ~0.1 ms). The
environment is set before torch is imported so `tune` subprocesses inherit it too.

GPUs are not hidden: tests that are about the CPU path say ``device=cpu`` themselves (the tiny
configs do), tests that are about a machine without a GPU hide it in their own subprocess, and tests
marked ``gpu`` run where PyTorch sees a CUDA GPU and are skipped with a reason elsewhere
(``make test-gpu`` runs them).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)

# Without a CUDA GPU, Triton kernels can only run under Triton's interpreter, which @triton.jit picks when a
# kernel is defined: set before anything imports Triton (bitsandbytes, torchao and liger-kernel do), so
# liger-kernel's kernels run on CPU tensors (tests/torchtune/modules/test_liger.py). Nothing else here
# launches a Triton kernel on the CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with a reason where PyTorch sees none")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    reason = (
        f"needs a CUDA GPU: PyTorch {torch.__version__} sees none on this machine (run with `make test-gpu` on one)"
    )
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(tmp_path_factory):
    """A tiny Llama 3-style tokenizer folder (``original/tokenizer.model``, ``tokenizer.json``,
    ``tokenizer_config.json``), made once per session: training the BPE takes a few seconds."""
    from tests._helpers.llama3_tokenizer import make_llama3_tokenizer_files

    return make_llama3_tokenizer_files(tmp_path_factory.mktemp("llama3_tokenizer"))


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory, llama3_tokenizer_dir):
    """``family -> folder``: a tiny tokenizer folder with that family's chat template (qwen2_5, qwen3,
    mistral, phi4, phi4_mini, gemma3, llama3), each made once per session on first use (training the
    BPE takes a second or two)."""
    made = {"llama3": llama3_tokenizer_dir}

    def folder(family: str):
        if family not in made:
            if family == "gemma3":
                from tests._helpers.gemma3_tokenizer import make_gemma3_tokenizer

                made[family] = make_gemma3_tokenizer(tmp_path_factory.mktemp(family)).parent
            else:
                from tests._helpers.hf_tokenizers import make_hf_tokenizer_folder

                made[family] = make_hf_tokenizer_folder(tmp_path_factory.mktemp(family), family)
        return made[family]

    return folder
