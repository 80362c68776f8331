"""Building, caching and falling back from the C kernels of stochastic rounding (``_native_kernels``)."""

import logging
import os

import pytest
import torch

from torchtune.training import StochasticRounding, _native_kernels


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not loaded the kernels yet, with its own cache folder."""
    monkeypatch.setattr(_native_kernels, "_loaded", None)
    monkeypatch.setattr(_native_kernels, "_tried", False)
    monkeypatch.setenv(_native_kernels.ENV_CACHE, str(tmp_path / "kernels"))
    return tmp_path / "kernels"


def _round(fused=True):
    src = torch.linspace(-3, 3, 5000)
    dst = torch.empty(5000, dtype=torch.bfloat16)
    StochasticRounding(seed=3, device=torch.device("cpu"), fused=fused).round_(dst, src)
    return dst


def test_built_once_into_the_cache_and_reused(fresh, monkeypatch):
    assert _native_kernels.library() is not None
    (built,) = fresh.glob("stochastic_rounding_*.so")
    assert not list(fresh.glob("*.tmp"))  # written to a temporary file and renamed into place
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(_native_kernels, "_loaded", None)
    monkeypatch.setattr(_native_kernels, "_tried", False)
    monkeypatch.setattr(_native_kernels, "_build", lambda *a: pytest.fail("rebuilt a cached library"))
    assert _native_kernels.library() is not None
    assert built.stat().st_mtime_ns == stamp
    assert torch.equal(_round(), _round(fused=False))  # the C kernel's bits are the plain path's


def test_a_damaged_cache_entry_is_rebuilt(fresh):
    """A file in the cache that does not load (another process's crash, a full disk) is built again."""
    path = _native_kernels.library_path(_native_kernels._compiler())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    assert _native_kernels.library() is not None
    assert path.read_bytes()[:4] == b"\x7fELF"


def test_another_cpu_or_compiler_gets_its_own_build(fresh, monkeypatch):
    assert _native_kernels.library() is not None
    monkeypatch.setattr(_native_kernels, "_loaded", None)
    monkeypatch.setattr(_native_kernels, "_tried", False)
    monkeypatch.setattr(_native_kernels, "_cpu_flags", lambda: "flags : fpu sse2 (another machine)")
    assert _native_kernels.library() is not None
    assert len(list(fresh.glob("stochastic_rounding_*.so"))) == 2  # -march=native builds never shared


def test_without_a_compiler_or_switched_off_the_pytorch_kernels_round(fresh, monkeypatch, caplog):
    expected = _round(fused=False)
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", os.devnull)
    with caplog.at_level(logging.INFO, logger=_native_kernels.__name__):
        assert _native_kernels.library() is None
    assert "no C compiler" in caplog.text
    monkeypatch.undo()
    monkeypatch.setattr(_native_kernels, "_loaded", None)
    monkeypatch.setattr(_native_kernels, "_tried", False)
    monkeypatch.setenv(_native_kernels.ENV_SWITCH, "0")
    assert _native_kernels.library() is None
    assert torch.equal(_round(), expected)
    assert not fresh.exists()  # nothing was built


def test_a_failing_build_falls_back_and_says_why(fresh, monkeypatch, caplog):
    monkeypatch.setattr(_native_kernels, "FLAGS", [*_native_kernels.FLAGS, "-no-such-flag"])
    with caplog.at_level(logging.WARNING, logger=_native_kernels.__name__):
        assert _native_kernels.library() is None
    assert "could not be built" in caplog.text and "PyTorch kernels" in caplog.text
    assert not list(fresh.glob("*.so")) and not list(fresh.glob("*.tmp"))  # no half-written library left


@pytest.mark.parametrize("threads", [1, 3])
def test_a_large_tensor_split_over_threads_gets_the_same_bits(threads):
    """Split into one range per torch thread (each its own call, ranges aligned to 64 elements), the bits
    of every element are those of the whole tensor in one pass (the plain path)."""
    numel = (1 << 18) * 3 + 4099
    src = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = []
        for fused in (True, False):
            dst = torch.zeros(numel, dtype=torch.bfloat16)
            StochasticRounding(seed=4, device=torch.device("cpu"), fused=fused).round_(dst, src)
            out.append(dst)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*out)
