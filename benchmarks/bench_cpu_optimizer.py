"""The CPU optimizer step of offloaded training: parameters a second, per core (one thread) and on all cores.

Rows, each stepping one ``--rows`` x ``--cols`` parameter (16M elements by default) with a fresh gradient:

- ours: ``torchtune.training.CPUAdamW`` (bf16 weights and gradients, bf16 stochastic rounding) for each
  state format (``8bit``, ``bf16``, ``fp32``), ``CPUSGD`` with momentum, and CPUAdamW's PyTorch fallback
  (the same maths without the C kernel: what a machine without a compiler runs);
- torch ``AdamW(fused=True)`` on fp32 weights, gradients and moments;
- torchao ``AdamW8bit`` (bf16 weights, ``bf16_stochastic_round``) on the CPU;
- DeepSpeed's ``DeepSpeedCPUAdam`` (fp32; bf16 parameters with its default fp32 moments; bf16 parameters and
  moments), when it imports here, or from ``--deepspeed-python``: a second process (e.g. a venv that has
  DeepSpeed, docs/speed.md) serving its rows one step at a time.

Every row takes one step per repeat, round-robin with a rotating first row (DeepSpeed's in its process too, in
the same rotation), all one-thread repeats before the wider ones, after one warm-up step each (DeepSpeed builds
its op with ninja on first use; torchao compiles its step). Printed: the median over repeats of wall time and
of CPU time: at one thread the rate per CPU-second of the stepping thread (the core's busy time, which other
jobs on a busy machine do not stretch, unlike the wall time beside it), at more threads the wall rate and the
process's CPU seconds; and each row's per-core ratio to DeepSpeed's bf16-parameter row (its default
fp32 state) from the one-thread CPU times. Compare rows of one run only.

    .venv/bin/python benchmarks/bench_cpu_optimizer.py --repeats 7
    .venv/bin/python benchmarks/bench_cpu_optimizer.py --deepspeed-python /work/tt/dsenv/bin/python
    .venv/bin/python benchmarks/bench_cpu_optimizer.py --smoke        # tiny sizes, seconds (the test's)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

OURS = ["ours AdamW 8bit", "ours AdamW bf16", "ours AdamW fp32", "ours SGD momentum bf16", "ours AdamW bf16 fallback"]
PEERS = ["torch AdamW fused fp32", "torchao AdamW8bit"]
DEEPSPEED = ["DeepSpeedCPUAdam fp32", "DeepSpeedCPUAdam bf16 params", "DeepSpeedCPUAdam bf16 params+state"]
REFERENCE = "DeepSpeedCPUAdam bf16 params"
ADAMW = dict(lr=2e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _param(shape: Tuple[int, int], dtype: torch.dtype) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(0)
    return torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype))


def _grad(p: torch.Tensor) -> torch.Tensor:
    return (torch.randn(p.shape) * 1e-3).to(p.dtype)


def build(row: str, shape: Tuple[int, int]) -> Callable[[], None]:
    """A function that takes one step of ``row`` on its own parameter (a fresh gradient each time, not timed)."""
    if row.startswith("ours"):
        from torchtune.modules import _native_kernels
        from torchtune.training import CPUSGD, CPUAdamW

        p = _param(shape, torch.bfloat16)
        if row.startswith("ours SGD"):
            opt = CPUSGD([p], lr=1e-3, momentum=0.9, state_dtype="bf16")
        else:
            opt = CPUAdamW([p], state_dtype=row.split()[2], **ADAMW)
        if row.endswith("fallback"):

            def step() -> None:
                with _native_kernels.disabled():
                    opt.step()

            return _timed(p, step)
        return _timed(p, opt.step)
    if row == "torch AdamW fused fp32":
        p = _param(shape, torch.float32)
        return _timed(p, torch.optim.AdamW([p], fused=True, **ADAMW).step)
    if row == "torchao AdamW8bit":
        from torchao.optim import AdamW8bit

        p = _param(shape, torch.bfloat16)
        return _timed(p, AdamW8bit([p], bf16_stochastic_round=True, **ADAMW).step)
    if row in DEEPSPEED:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        p = _param(shape, torch.float32 if row.endswith("fp32") else torch.bfloat16)
        opt = DeepSpeedCPUAdam([p], fp32_optimizer_states=not row.endswith("+state"), **ADAMW)
        return _timed(p, opt.step)
    raise SystemExit(f"unknown row {row!r}")


def _timed(p: torch.nn.Parameter, step: Callable[[], object]) -> Callable[[], Tuple[float, float]]:
    def run() -> Tuple[float, float]:
        p.grad = _grad(p)
        # one thread: the calling thread's CPU time is all the work (an idle OpenMP worker of an earlier
        # multi-threaded row may still spin, counted by process_time); more: every thread's
        clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
        wall, cpu = time.perf_counter(), clock()
        step()
        return time.perf_counter() - wall, clock() - cpu

    return run


def _deepspeed_here() -> bool:
    try:
        import deepspeed.ops.adam  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure: the rows come from elsewhere or not at all
        return False
    return True


class _Served:
    """DeepSpeed's rows in another Python (``--serve``): one request a step, answered with its times."""

    def __init__(self, python: str, shape: Tuple[int, int]) -> None:
        cmd = [python, str(Path(__file__).resolve()), "--serve", "--rows", str(shape[0]), "--cols", str(shape[1])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def step(self, row: str, threads: int) -> Tuple[float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"row": row, "threads": threads}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the DeepSpeed process ended (exit {self.proc.wait()}); run it by hand to see why")
        reply = json.loads(line)
        return reply["wall"], reply["cpu"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def serve(shape: Tuple[int, int]) -> int:
    """Answer step requests on stdin (one JSON line each) with their times on stdout."""
    # everything else DeepSpeed prints (Python or C++) goes to stderr: stdout carries the replies only
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    steppers: Dict[str, Callable[[], Tuple[float, float]]] = {}
    for line in sys.stdin:
        request = json.loads(line)
        torch.set_num_threads(request["threads"])
        if request["row"] not in steppers:
            steppers[request["row"]] = build(request["row"], shape)
            steppers[request["row"]]()  # warm-up: builds DeepSpeed's op on first use
        wall, cpu = steppers[request["row"]]()
        print(json.dumps({"wall": wall, "cpu": cpu}), file=replies, flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the all-cores figure's threads")
    parser.add_argument("--only", default="", help="comma-separated rows (default: every row that can run)")
    parser.add_argument("--deepspeed-python", default="", help="a Python with DeepSpeed for its rows")
    parser.add_argument("--smoke", action="store_true", help="a 64 x 1024 parameter, one repeat (seconds)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = (64, 1024) if args.smoke else (args.rows, args.cols)
    if args.serve:
        return serve(shape)
    repeats = 1 if args.smoke else args.repeats
    rows = [*OURS, *PEERS]
    served: Optional[_Served] = None
    if _deepspeed_here():
        rows += DEEPSPEED
    elif args.deepspeed_python:
        served = _Served(args.deepspeed_python, shape)
        rows += DEEPSPEED
    if args.only:
        rows = [r for r in rows if r in args.only.split(",")]
    counts = sorted({1, args.threads})
    local: Dict[str, Callable[[], Tuple[float, float]]] = {}
    failed = []
    for row in list(rows):
        if row in DEEPSPEED and served is not None:
            continue
        try:
            local[row] = build(row, shape)
            local[row]()  # warm-up
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run here (a compile failing) drops its row
            failed.append(f"{row}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            rows.remove(row)
            local.pop(row, None)
    times: Dict[Tuple[str, int], List[Tuple[float, float]]] = {(r, t): [] for r in rows for t in counts}
    threads_before = torch.get_num_threads()
    try:
        for threads in counts:  # every one-thread step first: no OpenMP worker left spinning from a wider one
            for repeat in range(repeats):
                for row in rows[repeat % len(rows) :] + rows[: repeat % len(rows)]:  # each row leads once in turn
                    torch.set_num_threads(threads)
                    result = local[row]() if row in local else served.step(row, threads)  # type: ignore[union-attr]
                    times[(row, threads)].append(result)
    finally:
        torch.set_num_threads(threads_before)
        if served is not None:
            served.close()
    n = shape[0] * shape[1]
    print(f"{n / 1e6:.2f}M-element parameter ({shape[0]} x {shape[1]}), {repeats} repeats, interleaved; medians")
    many = [t for t in counts if t > 1]
    header = "| row | 1 thread: M params per CPU-second (wall M params/s) | "
    header += "".join(f"{t} threads: M params/s (CPU s a step) | " for t in many)
    print(header + "per core vs DeepSpeed bf16 params (CPU time) |")
    print("|---|---|" + "---|" * len(many) + "---|")
    wall = {key: statistics.median(x[0] for x in runs) for key, runs in times.items()}
    cpu = {key: statistics.median(x[1] for x in runs) for key, runs in times.items()}
    for row in rows:
        # one thread: its CPU time is the core's busy time, which other jobs on a busy machine do not stretch
        cells = [f"{n / max(cpu[(row, 1)], 1e-9) / 1e6:,.0f} ({n / wall[(row, 1)] / 1e6:,.0f})"]
        cells += [f"{n / wall[(row, t)] / 1e6:,.0f} ({cpu[(row, t)]:.3f})" for t in many]
        ratio = f"{cpu[(REFERENCE, 1)] / max(cpu[(row, 1)], 1e-9):.2f}x" if (REFERENCE, 1) in cpu else "-"
        print(f"| {row} | " + " | ".join(cells) + f" | {ratio} |")
    for line in failed:
        print(f"(left out, it failed here: {line})")
    if REFERENCE not in rows:
        print("(DeepSpeed not importable here: give --deepspeed-python, a Python that has it; see docs/speed.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
