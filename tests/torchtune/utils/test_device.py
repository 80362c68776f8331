"""bf16 needs native support on the configured GPU; CPU and fp32 need nothing."""

import pytest
import torch

from torchtune._errors import TuneError
from torchtune.utils import get_dtype


class _FakeCards:
    """Two CUDA devices as the torch.cuda queries would describe them (this machine may have none)."""

    def __init__(self, monkeypatch, cards):
        self.asked = []
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", self._capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: cards[index][0])
        self.cards = cards

    def _capability(self, index):
        self.asked.append(index)
        return self.cards[index][1]


def test_bf16_on_a_card_that_only_emulates_it_names_the_card(monkeypatch):
    cards = _FakeCards(monkeypatch, {0: ("NVIDIA A100-SXM4-80GB", (8, 0)), 1: ("Tesla T4", (7, 5))})
    with pytest.raises(TuneError) as info:
        get_dtype("bf16", torch.device("cuda", 1))
    message = " ".join(str(info.value).split())
    assert cards.asked == [1]  # the configured device, not the current one (cuda:0 would pass)
    assert "cuda:1 is a Tesla T4 (compute capability 7.5)" in message
    assert "dtype=fp32" in message and "compute capability 8.0 or newer" in message


def test_bf16_on_ampere_or_newer_and_fp32_anywhere(monkeypatch):
    cards = _FakeCards(monkeypatch, {0: ("Tesla V100-SXM2-16GB", (7, 0)), 1: ("NVIDIA H100", (9, 0))})
    assert get_dtype("bfloat16", torch.device("cuda", 1)) is torch.bfloat16
    assert get_dtype("fp32", torch.device("cuda", 0)) is torch.float32  # no check needed for fp32
    with pytest.raises(TuneError, match="Tesla V100"):
        get_dtype("bf16", torch.device("cuda"))  # no index: the current device is the one used
    assert cards.asked == [1, 0]


def test_bf16_on_cpu_needs_no_gpu():
    assert get_dtype("bf16", torch.device("cpu")) is torch.bfloat16
