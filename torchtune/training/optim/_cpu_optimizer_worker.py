"""The optimizer step on the CPU, overlapped with backward, for FSDP2 with ``fsdp_cpu_offload: True``.

With CPU offload every sharded parameter, its gradient and its optimizer state live in host memory,
and with optimizer in backward FSDP2 runs a parameter's post-accumulate-grad hook right after copying
its reduce-scattered gradient to the host (a blocking copy whenever such a hook exists, so the
gradient is complete when the hook runs). Stepping in the hook itself would stall backward for the
whole CPU step of that parameter, layer after layer. Here the hook only hands the step to one worker
thread and returns; the main thread goes on launching the next layers' backward while the worker
steps the parameters in the order their gradients arrived. Torch's CPU kernels release the GIL, so
the thread runs truly in parallel with the main thread.

Bitwise the same as stepping in the hook: the worker is one thread taking jobs first in, first out,
each job is exactly what the hook would have done (``step_parameter``, with bf16 stochastic rounding
drawing from the run's generators in the same order), and the training step waits for the worker
before anything reads the parameters again (``WorkerOptimInBackward.step``, called by
``step_optimizer``; also before a checkpoint reads the optimizer state).

Host memory: a gradient lives until its step ran. When the CPU step is slower than backward the
gradients of the parameters waiting for it pile up; ``max_pending_bytes`` bounds them (the hook then
waits for the worker, which slows backward only when the CPU is the bottleneck anyway).

Cores: the main thread needs a core to launch kernels and run FSDP2's copies (the autograd engine's
device thread another). The worker pins itself to the cores this process may use except the first
``reserve_cores`` and sets its own intra-op (OpenMP) thread count to the cores it has, so its
vectorised kernels use every other core without taking the main thread's. ``torch.set_num_threads`` in
the worker changes the count for threads whose OpenMP team is created afterwards; the main thread,
which ran ops before, keeps its own team.

Errors: a step that raises stops the worker; the exception is raised again in the main thread by the
next hook (which ends backward) or by ``wait()`` at the end of the step, never swallowed.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any, Callable, List, Mapping, Optional, Tuple

import torch
from torch.optim import Optimizer

from torchtune._errors import TuneError
from torchtune.utils._checkpointing._checkpoint_utils import OptimInBackwardWrapper

log = logging.getLogger("torchtune")

__all__ = ["CPUOptimizerWorker", "WorkerOptimInBackward", "worker_cores"]

# Gradients waiting for the worker, at most (bf16: 1 GB is 500M elements, about two decoder layers of
# an 8B model); the estimator counts this much host RAM for them.
DEFAULT_MAX_PENDING_BYTES = 1 << 30


def worker_cores(reserve_cores: int = 1) -> List[int]:
    """The CPU cores the worker pins itself to: those this process may use, less the first
    ``reserve_cores`` (left to the main thread); all of them when there are no more than that."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return cores[reserve_cores:] if len(cores) > reserve_cores else cores


class CPUOptimizerWorker:
    """One thread that runs submitted optimizer steps in order, while the caller goes on.

    Args:
        reserve_cores: cores left to the main thread (see the module docstring); ``None``: do not pin
            and keep the intra-op thread count (tests, and machines where pinning is not wanted).
        max_pending_bytes: gradient bytes that may wait for the worker; ``submit`` blocks above it.
    """

    def __init__(self, *, reserve_cores: Optional[int] = 1, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        self.max_pending_bytes = int(max_pending_bytes)
        self.cores = worker_cores(reserve_cores) if reserve_cores is not None else None
        self._jobs: "queue.Queue[Optional[Tuple[Callable[[], None], int]]]" = queue.Queue()
        self._pending = 0  # bytes submitted and not yet done
        self._unfinished = 0  # jobs submitted and not yet done
        self._done = threading.Condition()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="cpu-optimizer-worker", daemon=True)
        self._thread.start()

    # ---- the caller's side (the main thread, from gradient hooks) -----------------------------------
    def submit(self, job: Callable[[], None], nbytes: int = 0) -> None:
        """Queue ``job`` (run with grad mode off, as a hook runs in backward); ``nbytes`` of gradient
        stay alive until it ran. Raises the worker's error if an earlier job failed."""
        with self._done:
            self._raise_if_failed()
            # a lone job larger than the bound still goes when nothing else waits
            while self._pending and self._pending + nbytes > self.max_pending_bytes and self._error is None:
                self._done.wait()
            self._raise_if_failed()
            self._pending += nbytes
            self._unfinished += 1
        self._jobs.put((job, nbytes))

    def wait(self) -> None:
        """Block until every submitted job ran; raise the first error a job raised (then the worker is
        clear again: the failed step's run is over, and a caller that goes on starts afresh)."""
        with self._done:
            while self._unfinished:
                self._done.wait()
            self._raise_if_failed(clear=True)

    def close(self) -> None:
        """Finish the queued jobs and end the thread."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _raise_if_failed(self, clear: bool = False) -> None:
        error = self._error
        if error is None:
            return
        if clear:
            self._error = None
        raise TuneError(
            f"The optimizer step on the CPU worker failed: {type(error).__name__}: {error}. The weights of the "
            "parameters stepped after it are not updated; the run stops here (resume from the last checkpoint)."
        ) from error

    # ---- the worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        if self.cores is not None:
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, self.cores)  # 0: this thread (Linux); its OpenMP team inherits it
            torch.set_num_threads(len(self.cores))
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, nbytes = item
            try:
                if self._error is None:  # after a failure, the rest of the step is dropped, not run
                    with torch.no_grad():
                        job()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread by submit/wait
                self._error = exc
            finally:
                del job, item  # the job holds the parameter and, through it, the gradient
                with self._done:
                    self._pending -= nbytes
                    self._unfinished -= 1
                    self._done.notify_all()


class WorkerOptimInBackward(OptimInBackwardWrapper):
    """``OptimInBackwardWrapper`` whose hooks step on a ``CPUOptimizerWorker``: every method that reads
    or changes the parameters or the optimizer state waits for the worker first."""

    def __init__(
        self,
        optim_map: Mapping[str, Optimizer],
        worker: CPUOptimizerWorker,
        step_group: Optional[Callable[[Optimizer, List[torch.Tensor]], None]] = None,
    ) -> None:
        super().__init__(optim_map, step_group=step_group)
        self.worker = worker

    def wait(self) -> None:
        """The end of backward's steps: every parameter stepped (raises a failed step's error)."""
        self.worker.wait()

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> None:  # type: ignore[override]
        self.wait()
        return super().step(closure)

    def state_dict(self) -> Any:  # type: ignore[override]
        self.wait()
        return super().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        self.wait()
        super().load_state_dict(state_dict)


def grad_bytes(params: List[torch.Tensor]) -> int:
    """Bytes of the (local) gradients of ``params`` that a queued step keeps alive."""
    total = 0
    for p in params:
        g = p.grad
        if g is not None:
            local = g.to_local() if hasattr(g, "to_local") else g
            total += local.numel() * local.element_size()
    return total
