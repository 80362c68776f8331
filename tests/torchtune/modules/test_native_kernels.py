"""Building, caching and falling back from the C kernels of stochastic rounding (``_native_kernels``)."""

import logging
import os

import pytest
import torch

from torchtune.modules import _native_kernels
from torchtune.training import StochasticRounding


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
    assert "No C compiler" in caplog.text
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
    assert "could not be built" in caplog.text and "PyTorch operations run instead" in caplog.text
    assert not list(fresh.glob("*.so")) and not list(fresh.glob("*.tmp"))  # no half-written library left


def test_built_with_torchs_own_openmp_runtime_and_no_second_one(fresh):
    """On Linux torch runs on GNU OpenMP (libgomp.so.1): the kernels are built with -fopenmp (a new build
    in an empty cache, loaded for the first time), and loading them maps no other OpenMP runtime: their
    threads are torch's pool."""
    if not _native_kernels._torch_openmp():
        pytest.skip("torch does not run on GNU OpenMP's libgomp.so.1 here: the kernels use a thread pool")
    before = _native_kernels._openmp_runtimes()
    lib = _native_kernels.library()
    assert "-fopenmp" in _native_kernels._flags() and lib.threaded
    assert _native_kernels._openmp_runtimes() == before


@pytest.mark.parametrize("openmp", [True, False], ids=["torch's OpenMP threads", "a thread pool"])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_large_tensor_split_over_threads_gets_the_same_bits(threads, openmp, monkeypatch):
    """Split into one range per torch thread (ranges aligned to 64 elements), on torch's OpenMP threads or on
    a pool's, the bits of every element are those of the whole tensor in one pass (the plain path), for the
    rounding and for the Adam step, changed-element counts included."""
    lib = _native_kernels.library()
    if openmp and not lib.threaded:
        pytest.skip("the kernels were not built with torch's OpenMP runtime here")
    monkeypatch.setattr(lib, "threaded", openmp)
    numel = (1 << 18) * 3 + 4099
    gen = torch.Generator().manual_seed(1)
    src = torch.randn(numel, generator=gen)
    w, g, m = (torch.randn(numel, generator=gen).to(torch.bfloat16) for _ in range(3))
    v = torch.rand(numel, generator=gen).to(torch.bfloat16)
    scalars = torch.tensor([1.0, 0.0, 0.1, 0.999, 0.001, -1e-3, 0.5, 1e-8])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = []
        for fused in (True, False):
            dst = torch.zeros(numel, dtype=torch.bfloat16)
            StochasticRounding(seed=4, device=torch.device("cpu"), fused=fused).round_(dst, src)
            out.append(dst)
        whole = [t.clone() for t in (w, g, m, v)]
        changed = _native_kernels.adam(whole, range(6), scalars, True, False, True)
        monkeypatch.setattr(_native_kernels, "_SPLIT_MIN", 1 << 62)
        one = [t.clone() for t in (w, g, m, v)]
        changed_one = _native_kernels.adam(one, range(6), scalars, True, False, True)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*out)
    assert changed == changed_one > 0
    assert all(torch.equal(a, b) for a, b in zip(whole, one))


def test_a_second_openmp_runtime_is_left_idle(fresh, monkeypatch, caplog):
    """Where loading the -fopenmp build maps an OpenMP runtime torch did not load (torch on Intel's, a
    renamed libgomp), its threads would fight torch's: the kernels split over their own pool instead."""
    if not _native_kernels._torch_openmp():
        pytest.skip("no -fopenmp build here")
    seen = iter([{"/torch/lib/libgomp.so.1"}, {"/torch/lib/libgomp.so.1", "/usr/lib/libgomp.so.1"}])
    monkeypatch.setattr(_native_kernels, "_openmp_runtimes", lambda: next(seen, {"/torch/lib/libgomp.so.1"}))
    monkeypatch.setattr(_native_kernels, "_torch_openmp", lambda: True)
    with caplog.at_level(logging.WARNING, logger=_native_kernels.__name__):
        lib = _native_kernels.library()
    assert lib is not None and not lib.threaded
    assert "/usr/lib/libgomp.so.1" in caplog.text and "threads of its own" in caplog.text
    assert torch.equal(_round(), _round(fused=False))


def test_a_hanging_compiler_is_stopped_and_the_run_goes_on(fresh, monkeypatch, tmp_path, caplog):
    """A compiler that never returns (a stuck licence server, a full disk's retries): the build is given up after
    TUNE_KERNEL_BUILD_TIMEOUT seconds, with one warning saying what runs instead and how much slower."""
    import time

    hang = tmp_path / "hanging-cc"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setenv("CC", str(hang))
    monkeypatch.setenv(_native_kernels.ENV_TIMEOUT, "1")
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=_native_kernels.__name__):
        assert _native_kernels.library() is None
    assert time.monotonic() - start < 10
    (record,) = [r for r in caplog.records if "could not be built" in r.getMessage()]
    assert "TimeoutExpired: 1 s passed" in record.getMessage() and "40x slower" in record.getMessage()
    assert not list(fresh.glob("*.so"))


def test_nothing_is_built_for_tensors_off_the_host(fresh, monkeypatch):
    """A GPU run's rounding, optimizer step and RoPE never build or load the CPU library (here: meta tensors,
    which stand for any device but the CPU, and the estimator's fake ones)."""
    monkeypatch.setattr(_native_kernels, "library", lambda: pytest.fail("built for tensors off the host"))
    meta = torch.empty(1024, device="meta")
    half = torch.empty(1024, device="meta", dtype=torch.bfloat16)
    scalars = torch.zeros(9)
    assert _native_kernels.round_into(meta, half, [1, 2], False) is None
    assert _native_kernels.adam((half, half, half, half), [1] * 6, scalars, True, False, False) is None
    assert (
        _native_kernels.cpu_adam((half, half, half, half), (None, None), 1024, scalars, (1, 2), (1, 1, 1), (0, 0))
        is None
    )
    assert _native_kernels.rope(half.view(1, 4, 4, 64), torch.zeros(4, 32, 2), 0, False) is None
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(1024, dtype=torch.bfloat16)
        assert _native_kernels.cpu_adam((fake,) * 4, (None, None), 1024, scalars, (1, 2), (1, 1, 1), (0, 0)) is None
    assert not fresh.exists()
