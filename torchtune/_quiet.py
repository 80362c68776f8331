"""Known messages of other libraries that mislead a user of ``tune``, silenced one by one.

Only the exact messages listed here are dropped; everything else those libraries log still shows.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

# (logger name, start of the message). bitsandbytes logs the first on every import on a CPU with
# AVX512-BF16 when the optional `kernels` package is missing; it concerns only its 4-bit CPU matmul,
# which no recipe here uses, yet it looks like a failure on every command.
KNOWN_NOISE = (("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),)


# What a package logs while it is imported about parts of it no recipe here uses, dropped during that import
# only (``quiet_import``): torchao tries to load its CUDA kernel libraries (mxfp8, CUTLASS for sm90a) and logs
# "Failed to load ..." for each on a machine or Python they were not built for, and registers an Enum with
# torch.utils._pytree, which warns that this is deprecated; its optimizers work all the same.
IMPORT_NOISE = {
    "torchao": (("torchao", "Failed to load "), ("torch.utils._pytree", "%s is an Enum subclass")),
}


class _DropMessage(logging.Filter):
    """Drops the records whose unformatted message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def silence_known_noise() -> None:
    """Install a filter for each ``KNOWN_NOISE`` message on its logger (before that library is imported).

    A logger's filters apply to the records it creates; the logger object is the one the library gets
    from ``logging.getLogger(__name__)`` later. Calling this twice installs nothing more.
    """
    for name, prefix in KNOWN_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropMessage(prefix))


@contextlib.contextmanager
def quiet_import(module: str) -> Iterator[None]:
    """Inside: the ``IMPORT_NOISE`` of ``module``'s package is dropped, if that package is imported now (its
    logs after the import, warnings of real use included, still show)."""
    package = module.split(".")[0]
    noise = IMPORT_NOISE.get(package, ()) if package not in sys.modules else ()
    added = [(logging.getLogger(name), _DropMessage(prefix)) for name, prefix in noise]
    for logger, f in added:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in added:
            logger.removeFilter(f)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Inside: no ``datasets`` progress bars, and none of its log lines below CRITICAL.

    Loading a local file shows a "Generating train split" bar, and a file that does not parse makes
    ``datasets`` log the same pyarrow error twice before it raises; the caller turns that exception into
    one message, so the lines before it only repeat it. Both settings are restored on exit.
    """
    import datasets
    from datasets.utils import logging as datasets_logging

    bars_were_on = datasets.is_progress_bar_enabled()
    verbosity = datasets_logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()


# torchrun's lines about ending the processes of a run, which the `tune run --nproc_per_node` launcher says in
# one message of its own once they have ended (what was saved, which process failed, the resume command).
LAUNCHER_NOISE = (
    ("torch.distributed.elastic.agent.server.api", "Received %s death signal"),
    ("torch.distributed.elastic.multiprocessing.api", "Sending process %s closing signal"),
    ("torch.distributed.elastic.multiprocessing.api", "failed (exitcode: %s)"),
)


class _AnnounceStop(logging.Filter):
    """torchrun's "Received SIGINT death signal" becomes what the signal does to a run of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(LAUNCHER_NOISE[0][1]) and record.args:
            import signal
            import sys

            name = signal.Signals(int(record.args[0])).name
            print(
                f"\nReceived {name}: every process finishes its step and saves a checkpoint, then the run stops "
                f"(send {name} again to stop at once, without saving).",
                file=sys.stderr,
                flush=True,
            )
        return True


@contextlib.contextmanager
def quiet_launcher() -> Iterator[None]:
    """Inside: torchrun's ``LAUNCHER_NOISE`` lines are dropped, and its notice of a stop signal is said in our words."""
    filters = []
    for name, prefix in LAUNCHER_NOISE:
        logger = logging.getLogger(name)
        added = [_AnnounceStop()] if prefix == LAUNCHER_NOISE[0][1] else []
        added.append(_DropMessage(prefix))
        for f in added:
            logger.addFilter(f)
        filters += [(logger, f) for f in added]
    try:
        yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)
