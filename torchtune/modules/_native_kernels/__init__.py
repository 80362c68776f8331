"""The C kernels of bf16 stochastic rounding (``stochastic_rounding.c``), RoPE's rotation (``rope.c``) and the CPU
optimizers' step (``cpu_optimizer.c``: CPUAdamW, CPUSGD) on a CPU, built once per machine into one library.

RoPE in PyTorch ops is ten passes over the queries and keys each way (an fp32 copy, four products, a sum,
a difference, a stack, the bf16 copy; backward as many): on a CPU about 5% of a 168M model's step. The C
loop reads each element once and writes it once, with the same bits (``tests/torchtune/modules/
test_rope_kernel.py``).

On a CPU, Inductor's code for the rounding reinterprets float bits one element at a time, and every process
pays Dynamo and Inductor's start-up (about 4 s with a warm cache, 20 s cold) before its first step. The C
loops compute the same bits (tests pin both to the definition) about three times faster, and loading them
takes milliseconds. A large tensor is split into one range per torch thread. Where torch runs on GNU OpenMP
(``libgomp.so.1``, as its Linux wheels do) the kernels are built with ``-fopenmp`` and the ranges run on
torch's own thread pool: the build's ``libgomp.so.1`` is the runtime torch already loaded, and its workers,
still spinning for work after the torch op before, take their range at once (ranges on threads of our own
waited for those spinning workers to yield the cores: a whole 168M-model AdamW step took 1.6x as long).
Elsewhere each range is one call on a thread of a small pool (ctypes releases the GIL). Never a second
OpenMP runtime: one that appears when the library loads is left idle, and the pool used, said once.
They are compiled with the C compiler Inductor would use (``CC``, else ``cc`` or ``gcc``) into a cache
folder keyed by the source, the flags, the compiler's version and this CPU's instruction set
(``-march=native``): a folder shared by machines of different CPUs never hands one another's build. The build
is written to a temporary file and renamed into place, so concurrent ranks or an interrupted build never leave
a half-written library.

The library is built (or loaded from the cache) the first time a kernel is asked to run on host tensors, never
for tensors elsewhere: a GPU run, whose rounding and RoPE run on the device, neither builds nor loads it. The
compiler gets ``TUNE_KERNEL_BUILD_TIMEOUT`` seconds (default 180); a compiler that hangs is stopped and the run
goes on without the library. Without a compiler, after a failed or timed-out build (or with
``TUNE_NATIVE_KERNELS=0``) ``library()`` is None and the same arithmetic runs as PyTorch operations (rounding
through Inductor where it compiles), to the same bits, said once in the log with how much slower it is.
``TUNE_KERNEL_CACHE`` moves the cache folder (default: ``$XDG_CACHE_HOME/plaintune/kernels``, i.e.
``~/.cache/plaintune/kernels``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import torch

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("stochastic_rounding.c", "rope.c", "cpu_optimizer.c")]
# IEEE arithmetic as torch's (no FMA contraction); -fno-math-errno only lets sqrtf vectorise
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
# x86: GCC vectorises 256 bits wide even where the CPU has 512-bit registers; the optimizer kernels run
# about 10% faster with the whole width (measured: benchmarks/bench_cpu_optimizer.py)
X86_FLAGS = ["-mprefer-vector-width=512"]
ENV_SWITCH = "TUNE_NATIVE_KERNELS"
ENV_CACHE = "TUNE_KERNEL_CACHE"
ENV_TIMEOUT = "TUNE_KERNEL_BUILD_TIMEOUT"
# seconds the compiler may take (a build takes 5-10 s on a busy 2-core VM); past it the run goes on without
BUILD_TIMEOUT_S = 180.0
# What the PyTorch kernels cost instead, measured on one core of our build VM (docs/speed.md): the fallback's
# one log line says it
SLOWER = "CPUAdamW/CPUSGD's step about 40x slower, stochastic rounding about 3x (24x where Inductor cannot compile)"

_loaded: Optional[ctypes.CDLL] = None
_tried = False
_off = 0  # > 0 inside ``disabled()``


def _openmp_runtimes() -> set:
    """The OpenMP runtimes mapped into this process (Linux; empty elsewhere)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    names = ("libgomp", "libiomp", "libomp")
    return {line.split()[-1] for line in maps.splitlines() if Path(line.split()[-1]).name.startswith(names)}


def _torch_openmp() -> bool:
    """torch runs on GNU OpenMP under the soname ``libgomp.so.1``, the one a ``-fopenmp`` build depends on: the
    loader then hands the build torch's runtime, not a second one. (Wheels that bundle a renamed copy of their
    own, sentencepiece's ``libgomp-<hash>.so``, keep it to themselves.)"""
    return torch.backends.openmp.is_available() and any(Path(r).name == "libgomp.so.1" for r in _openmp_runtimes())


def _flags() -> list:
    """``FLAGS``, with ``-fopenmp`` where torch's OpenMP runtime can run the kernels' threads."""
    import platform

    extra = X86_FLAGS if platform.machine().lower() in ("x86_64", "amd64", "i686", "i386") else []
    return [("-fopenmp" if f == "-fopenmp-simd" and _torch_openmp() else f) for f in FLAGS] + extra


def _timeout() -> float:
    return float(os.environ.get(ENV_TIMEOUT) or BUILD_TIMEOUT_S)


def _compiler() -> Optional[str]:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "plaintune" / "kernels"


def _build(cc: str, target: Path) -> None:
    """Compile into ``target`` atomically (a temporary file renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *_flags(), *map(str, SOURCES), "-o", tmp], capture_output=True, text=True, timeout=_timeout()
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(proc.stderr.strip().splitlines() or ['(no output)'])[-1]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path) -> ctypes.CDLL:
    before = _openmp_runtimes()
    lib = ctypes.CDLL(str(path))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.tune_round.argtypes = [p, p, i64, i64, p, i32]
    lib.tune_round.restype = i64
    lib.tune_adam.argtypes = [p, p, p, p, i64, i64, p, p, i32, i32, i32]
    lib.tune_adam.restype = i64
    for name, data in (("tune_rope_bf16", p), ("tune_rope_f32", p)):
        getattr(lib, name).argtypes = [data, data, p, i64, i64, i64, i64, i64, i32, i32]
        getattr(lib, name).restype = None
    lib.tune_cpu_adam.argtypes = [p, p, p, p, p, p, i64, i64, i64, p, p, i32, i32, i32, i32, i32]
    lib.tune_cpu_adam.restype = i64
    lib.tune_cpu_sgd.argtypes = [p, p, p, p, i64, i64, i64, p, p, i32, i32, i32, i32, i32, i32, i32]
    lib.tune_cpu_sgd.restype = i64
    lib.threaded = hasattr(lib, "tune_adam_threads")  # built with -fopenmp
    added = _openmp_runtimes() - before
    if lib.threaded and added:  # not torch's runtime after all: leave it idle
        log.warning(
            "The C kernels loaded an OpenMP runtime beside torch's (%s): left idle; stochastic rounding splits "
            "large tensors over threads of its own instead, RoPE runs on one thread (the same bits).",
            ", ".join(sorted(added)),
        )
        lib.threaded = False
    if lib.threaded:
        lib.tune_round_threads.argtypes = [p, p, i64, p, i32, i32]
        lib.tune_round_threads.restype = i64
        lib.tune_adam_threads.argtypes = [p, p, p, p, i64, p, p, i32, i32, i32, i32]
        lib.tune_adam_threads.restype = i64
        lib.tune_cpu_adam_threads.argtypes = [p, p, p, p, p, p, i64, i64, p, p, i32, i32, i32, i32, i32, i32]
        lib.tune_cpu_adam_threads.restype = i64
        lib.tune_cpu_sgd_threads.argtypes = [p, p, p, p, i64, i64, p, p, i32, i32, i32, i32, i32, i32, i32, i32]
        lib.tune_cpu_sgd_threads.restype = i64
    return lib


def library_path(cc: str) -> Path:
    """Where the build for this source, these flags, ``cc``'s version and this CPU lies in the cache."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=_timeout()).stdout
    texts = [src.read_text() for src in SOURCES]
    key = hashlib.sha256("\0".join([*texts, " ".join(_flags()), version, _cpu_flags()]).encode())
    return _cache_dir() / f"stochastic_rounding_{key.hexdigest()[:20]}.so"


def library() -> Optional[ctypes.CDLL]:
    """The loaded kernels, built on first use; None where they cannot be (said once)."""
    global _loaded, _tried
    if _off:
        return None
    if _tried:
        return _loaded
    _tried = True
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    cc = _compiler()
    if cc is None:
        log.warning(
            "No C compiler found: the CPU kernels (optimizer step, stochastic rounding, RoPE) run as PyTorch "
            "operations instead: the same bits, %s. Install gcc or clang (or set CC) to build them.",
            SLOWER,
        )
        return None
    try:
        path = library_path(cc)
        if not path.exists():
            _build(cc, path)
        try:
            _loaded = _load(path)
        except OSError:  # a damaged cache entry: build it again
            _build(cc, path)
            _loaded = _load(path)
    except Exception as error:  # noqa: BLE001 - any build or load failure: the PyTorch kernels still work
        why = f"{_timeout():g} s passed" if isinstance(error, subprocess.TimeoutExpired) else str(error)
        log.warning(
            "The CPU kernels (optimizer step, stochastic rounding, RoPE) could not be built (%s: %s); the PyTorch "
            "operations run instead: the same bits, %s.",
            type(error).__name__,
            why,
            SLOWER,
        )
        _loaded = None
    return _loaded


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The PyTorch kernels inside, as without a C compiler (benchmarks compare the two)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def _keys(keys: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_uint32 * len(keys))(*keys)


def _usable(*tensors: torch.Tensor) -> bool:
    """Contiguous host tensors with memory behind them: the only ones the kernels take, so a run on a GPU, and
    the estimator's fake tensors, never build the library."""
    return all(t.device.type == "cpu" and t.is_contiguous() and not _is_fake(t) for t in tensors)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


_SPLIT_MIN = 1 << 18  # below this a tensor is one call: a thread hand-off would cost more than it saves
_pool: Optional[ThreadPoolExecutor] = None
_pool_size = 0


def _in_ranges(call: Callable[[int, int], int], threaded: Optional[Callable[[int], int]], n: int) -> int:
    """``call(start, end)`` over ``n`` elements split into one range per torch thread, run at once, the sum of
    their counts: by ``threaded(threads)`` on torch's OpenMP threads where the library has it, else on pool
    threads (ctypes releases the GIL; idle pool threads wait without spinning), the calling thread taking the
    first range."""
    global _pool, _pool_size
    threads = max(1, torch.get_num_threads())
    if threads == 1 or n < _SPLIT_MIN:
        return call(0, n)
    if threaded is not None:
        return threaded(threads)
    if _pool_size < threads - 1:
        _pool, _pool_size = ThreadPoolExecutor(threads - 1, thread_name_prefix="tune-rounding"), threads - 1
    bounds = [n * k // threads // 64 * 64 for k in range(threads)] + [n]
    rest = [_pool.submit(call, bounds[k], bounds[k + 1]) for k in range(1, threads)]
    return call(bounds[0], bounds[1]) + sum(f.result() for f in rest)


def round_into(src: torch.Tensor, dst: torch.Tensor, keys: Sequence[int], count: bool) -> Optional[int]:
    """``tune_round`` on flat fp32 ``src`` into bf16 ``dst``; None (nothing done) where it does not apply."""
    if not _usable(src, dst):
        return None  # not host tensors: nothing is built for them
    lib = library()
    if lib is None:
        return None
    key = _keys(keys)
    s, d, n = src.data_ptr(), dst.data_ptr(), src.numel()
    threaded = (lambda threads: lib.tune_round_threads(s, d, n, key, int(count), threads)) if lib.threaded else None
    return _in_ranges(lambda a, b: lib.tune_round(s + 4 * a, d + 2 * a, a, b - a, key, int(count)), threaded, n)


def adam(
    tensors: Sequence[torch.Tensor],
    keys: Sequence[int],
    scalars: torch.Tensor,
    decoupled: bool,
    maximize: bool,
    count: bool,
) -> Optional[int]:
    """``tune_adam`` on flat bf16 (w, g, m, v); None (nothing done) where it does not apply."""
    if not _usable(*tensors, scalars) or scalars.dtype != torch.float32:
        return None
    lib = library()
    if lib is None:
        return None
    key, flags = _keys(keys), (int(decoupled), int(maximize), int(count))
    w, g, m, v = (t.data_ptr() for t in tensors)
    s = scalars.data_ptr()

    n = tensors[0].numel()

    def call(a: int, b: int) -> int:
        return lib.tune_adam(w + 2 * a, g + 2 * a, m + 2 * a, v + 2 * a, a, b - a, s, key, *flags)

    def threaded(threads: int) -> int:
        return lib.tune_adam_threads(w, g, m, v, n, s, key, *flags, threads)

    return _in_ranges(call, threaded if lib.threaded else None, n)


def _in_blocks(call: Callable[[int, int], int], threaded: Optional[Callable[[int], int]], blocks: int) -> int:
    """``call(k0, k1)`` over ``blocks`` blocks of 256 elements split into one range per torch thread, as
    ``_in_ranges`` splits elements (a block is never split: its 8-bit scale is one value)."""
    global _pool, _pool_size
    threads = max(1, torch.get_num_threads())
    if threads == 1 or blocks * 256 < _SPLIT_MIN:
        return call(0, blocks)
    if threaded is not None:
        return threaded(threads)
    if _pool_size < threads - 1:
        _pool, _pool_size = ThreadPoolExecutor(threads - 1, thread_name_prefix="tune-rounding"), threads - 1
    bounds = [blocks * k // threads for k in range(threads)] + [blocks]
    rest = [_pool.submit(call, bounds[k], bounds[k + 1]) for k in range(1, threads)]
    return call(bounds[0], bounds[1]) + sum(f.result() for f in rest)


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _optimizer_call(
    tensors: Sequence[Optional[torch.Tensor]], scales: Sequence[Optional[torch.Tensor]], s: torch.Tensor
):
    """(library, pointers, scalars) of a CPUAdamW/CPUSGD step, or None where the kernels do not apply."""
    present = [t for t in (*tensors, *scales, s) if t is not None]
    if not _usable(*present) or s.dtype != torch.float32:
        return None
    lib = library()
    if lib is None:
        return None
    return lib, [_ptr(t) for t in tensors], [_ptr(t) for t in scales]


def cpu_adam(tensors, scales, cols: int, s: torch.Tensor, key: Sequence[int], formats, flags) -> Optional[int]:
    """``tune_cpu_adam`` on (w, g, m, v) with the 8-bit scales (ms, vs) of a tensor whose rows are ``cols``
    long; formats (weight, gradient, state), flags (maximize, count). The count of changed bf16 weights; None
    (nothing done) where it does not apply."""
    found = _optimizer_call(tensors, scales, s)
    if found is None:
        return None
    lib, (w, g, m, v), (ms, vs) = found
    blocks = tensors[0].numel() // cols * -(-cols // 256)
    k, sp, (maximize, count) = _keys(key), s.data_ptr(), flags
    args = (*formats, int(maximize), int(count))

    def call(k0: int, k1: int) -> int:
        return lib.tune_cpu_adam(w, g, m, v, ms, vs, cols, k0, k1, sp, k, *args)

    def threaded(threads: int) -> int:
        return lib.tune_cpu_adam_threads(w, g, m, v, ms, vs, cols, blocks, sp, k, *args, threads)

    return _in_blocks(call, threaded if lib.threaded else None, blocks)


def cpu_sgd(tensors, scales, cols: int, s: torch.Tensor, key: Sequence[int], formats, flags) -> Optional[int]:
    """``tune_cpu_sgd`` on (w, g, momentum buffer or None) with its 8-bit scale; formats (weight, gradient,
    buffer: -1 none), flags (maximize, nesterov, first, count); as ``cpu_adam``."""
    found = _optimizer_call(tensors, scales, s)
    if found is None:
        return None
    lib, (w, g, b), (bs,) = found
    blocks = tensors[0].numel() // cols * -(-cols // 256)
    k, sp = _keys(key), s.data_ptr()
    args = (*formats, *(int(f) for f in flags))

    def call(k0: int, k1: int) -> int:
        return lib.tune_cpu_sgd(w, g, b, bs, cols, k0, k1, sp, k, *args)

    def threaded(threads: int) -> int:
        return lib.tune_cpu_sgd_threads(w, g, b, bs, cols, blocks, sp, k, *args, threads)

    return _in_blocks(call, threaded if lib.threaded else None, blocks)


_ROPE = {torch.bfloat16: "tune_rope_bf16", torch.float32: "tune_rope_f32"}


def rope(x: torch.Tensor, table: torch.Tensor, table_stride: int, inverse: bool) -> Optional[torch.Tensor]:
    """``tune_rope_*``: ``x`` ``[b, s, heads, dim]`` rotated by ``table`` (fp32 ``[rows, dim // 2, 2]``, row
    ``b * table_stride + s``), by minus the angles where ``inverse``; None (nothing done) where it does not apply:
    no library, not a contiguous CPU bf16/fp32 tensor, a table that is not contiguous fp32."""
    if x.dtype not in _ROPE or x.dim() != 4 or not _usable(x, table) or table.dtype != torch.float32:
        return None
    lib = library()
    if lib is None:
        return None
    batch, seq, heads, dim = x.shape
    out = torch.empty_like(x)
    threads = max(1, torch.get_num_threads()) if lib.threaded else 1
    getattr(lib, _ROPE[x.dtype])(
        x.data_ptr(), out.data_ptr(), table.data_ptr(), batch, seq, heads, dim, table_stride, int(inverse), threads
    )
    return out
