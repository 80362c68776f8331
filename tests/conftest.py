"""Test-wide settings: CPU only, offline, one thread.

The models in these tests are tiny: with several OpenMP threads on a 2-core machine each small
matmul pays thread wake-up costs far larger than the work (measured ~48 ms vs ~0.1 ms). The
environment is set before torch is imported so `tune` subprocesses inherit it too.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(tmp_path_factory):
    """A tiny Llama 3-style tokenizer folder (``original/tokenizer.model``, ``tokenizer.json``,
    ``tokenizer_config.json``), made once per session: training the BPE takes a few seconds."""
    from tests._helpers.llama3_tokenizer import make_llama3_tokenizer_files

    return make_llama3_tokenizer_files(tmp_path_factory.mktemp("llama3_tokenizer"))
