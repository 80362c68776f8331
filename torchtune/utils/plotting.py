"""Plot a run's ``metrics.jsonl`` (loss and learning rate against step) into a PNG.

matplotlib is optional (``pip install matplotlib``, or the ``plot`` extra), imported only when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from torchtune._errors import TuneError

# Held-out / evaluation losses a run may log next to its training loss; drawn as markers when present.
_EVAL_LOSS_KEYS = ("heldout_loss", "eval_loss", "val_loss")


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of ``key``; a step logged twice (a resumed run re-logging it) keeps the last."""
    by_step: dict[float, float] = {}
    for row in rows:
        value, step = row.get(key), row.get("step")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(step, (int, float)):
            by_step[step] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def plotted_series(metrics_jsonl_path: Union[str, Path]) -> list[str]:
    """The curves ``plot_metrics`` draws from this file: ``loss``, any held-out losses, ``lr``."""
    from torchtune.training.metric_logging import read_metrics

    rows = read_metrics(Path(metrics_jsonl_path).expanduser())
    return [key for key in ("loss", *_EVAL_LOSS_KEYS, "lr") if _series(rows, key)[1]]


def _import_pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise TuneError("Plotting needs matplotlib, which is not installed: pip install matplotlib") from exc
    matplotlib.use("Agg")  # files only: works without a display and never opens a window
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(metrics_jsonl_path: Union[str, Path], png_path: Union[str, Path], title: Optional[str] = None) -> Path:
    """Draw loss (top) and learning rate (bottom) against step from ``metrics_jsonl_path`` into ``png_path``.

    The file holds one JSON object per line with at least ``step``, ``loss`` and ``lr`` (what
    ``DiskLogger`` writes); rows without a key are skipped for that curve, and held-out losses
    (``heldout_loss`` / ``eval_loss`` / ``val_loss``) are drawn over the training loss when logged.

    Returns:
        The PNG's path.

    Raises:
        TuneError: the file is missing, has no ``loss`` values, or matplotlib is not installed.
    """
    from torchtune.training.metric_logging import read_metrics

    metrics_path = Path(metrics_jsonl_path).expanduser()
    if not metrics_path.is_file():
        raise TuneError(
            f"The metrics file {metrics_path} does not exist. A run writes it to "
            f"<output_dir>/logs/metrics.jsonl when metric_logger is "
            f"torchtune.training.metric_logging.DiskLogger; pass that run's output_dir."
        )
    rows = read_metrics(metrics_path)
    loss_steps, losses = _series(rows, "loss")
    if not losses:
        raise TuneError(
            f"{metrics_path} has no 'loss' values to plot ({len(rows)} rows read). Is it a "
            f"metrics.jsonl written by a training run?"
        )
    lr_steps, lrs = _series(rows, "lr")

    plt = _import_pyplot()
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    try:
        ax_loss.plot(loss_steps, losses, label="train loss", linewidth=1.2)
        for key in _EVAL_LOSS_KEYS:
            steps, values = _series(rows, key)
            if values:
                ax_loss.plot(steps, values, "o-", label=key.replace("_", " "), markersize=4)
        ax_loss.set_ylabel("loss")
        ax_loss.grid(True, alpha=0.3)
        ax_loss.legend(loc="upper right")
        ax_loss.set_title(
            title
            or f"{metrics_path.parent.parent.name or metrics_path.name}: "
            f"{len(losses)} steps, last loss {losses[-1]:.4f}"
        )
        if lrs:
            ax_lr.plot(lr_steps, lrs, color="tab:orange", linewidth=1.2)
        else:
            ax_lr.text(0.5, 0.5, "no 'lr' values logged", ha="center", va="center", transform=ax_lr.transAxes)
        ax_lr.set_ylabel("learning rate")
        ax_lr.set_xlabel("step")
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax_lr.grid(True, alpha=0.3)
        fig.tight_layout()
        out = Path(png_path).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
