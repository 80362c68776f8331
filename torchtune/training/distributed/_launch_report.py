"""What the processes of a distributed run tell the ``tune run --nproc_per_node N`` launcher that started them.

The launcher (``torchtune/_cli/run.py``) knows what no single process knows: its own command line (the torchrun
options a resume needs again), and how each process ended (torchrun's exit codes). A process knows why it ended.
So the launcher makes a folder and names it in ``TUNE_LAUNCH_REPORT``, which torchrun passes on to every process;
a process writes ``rank<R>.json`` there instead of printing, and the launcher prints one message for the run:

- ``{"event": "stopped", ...}`` (rank 0): a stop by SIGINT/SIGTERM saved ``folder`` after ``step``; the launcher
  prints the resume command with its own torchrun options;
- ``{"event": "lost_peer", "cause": ...}``: a collective failed because another process of the run is gone; the
  launcher names that process (its exit code says how it ended) and stays silent about the ones that lost it.

Without the variable (the recipe started by ``torchrun`` itself, or one process) each process prints as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = [
    "LAUNCH_REPORT_ENV",
    "is_lost_peer_error",
    "launcher_reports",
    "read_launch_reports",
    "report_to_launcher",
]

LAUNCH_REPORT_ENV = "TUNE_LAUNCH_REPORT"

# How a collective fails when a peer process is gone: gloo's TCP transport (the peer's sockets closed by the
# kernel when it died), NCCL's communicator aborted, or torch.distributed's own network/store errors.
_LOST_PEER_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "gloo/transport",
    "NCCL communicator was aborted",
    "NCCL Error 6: remote process exited",
)


def launcher_reports() -> bool:
    """True in a process started by ``tune run --nproc_per_node``: the launcher prints the run's messages."""
    folder = os.environ.get(LAUNCH_REPORT_ENV)
    return bool(folder) and Path(folder).is_dir()


def report_to_launcher(event: str, rank: int, **fields: Any) -> bool:
    """Write ``{"event": event, "rank": rank, **fields}`` for the launcher; False (nothing written) when this
    process was not started by ``tune run --nproc_per_node`` and must print what it has to say itself."""
    if not launcher_reports():
        return False
    path = Path(os.environ[LAUNCH_REPORT_ENV]) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"event": event, "rank": rank, **fields}), encoding="utf-8")
    os.replace(tmp, path)  # the launcher reads whole files only
    return True


def read_launch_reports(folder: Path) -> Dict[int, Dict[str, Any]]:
    """The reports the processes wrote into ``folder``, by rank."""
    reports: Dict[int, Dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            reports[int(report["rank"])] = report
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return reports


def is_lost_peer_error(exc: Optional[BaseException]) -> bool:
    """True when ``exc`` (or an exception it was raised from) is a collective that failed because another
    process of the run is gone: its message then says nothing about this process."""
    import torch.distributed as dist

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, getattr(dist, "DistNetworkError", ())):
            return True
        if isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _LOST_PEER_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
