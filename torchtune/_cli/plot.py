"""``tune plot OUTPUT_DIR [--out PNG]``: loss and learning-rate curves of a run, as a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtune._errors import TuneError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune plot``."""
    parser = subparsers.add_parser(
        "plot",
        allow_abbrev=False,
        help="plot a run's loss and learning rate into a PNG",
        description="Draw loss (and validation loss, when logged) and learning rate against step from "
        "OUTPUT_DIR/logs/metrics.jsonl (what every run writes) into a PNG. Needs matplotlib: "
        "pip install matplotlib.",
    )
    parser.add_argument(
        "output_dir",
        metavar="OUTPUT_DIR",
        type=Path,
        help="the run's output_dir (or its logs/ folder, or a metrics.jsonl file)",
    )
    parser.add_argument(
        "--out", metavar="PNG", type=Path, default=None, help="where to write the PNG (default: OUTPUT_DIR/metrics.png)"
    )
    parser.set_defaults(func=plot_command)
    return parser


def find_metrics_file(path: Path) -> Path:
    """``metrics.jsonl`` for a run's output_dir, its ``logs/`` folder, or the file itself."""
    path = path.expanduser()
    if path.is_file():
        return path
    for candidate in (path / "logs" / "metrics.jsonl", path / "metrics.jsonl"):
        if candidate.is_file():
            return candidate
    if not path.exists():
        raise TuneError(
            f"{path} does not exist. Pass the output_dir of a training run (the config's "
            f"output_dir key), e.g. `tune plot /tmp/torchtune/demo`."
        )
    raise TuneError(
        f"{path} holds no logs/metrics.jsonl. A run writes it when its metric_logger is "
        f"torchtune.utils.metric_logging.DiskLogger with log_dir=${{output_dir}}/logs; pass "
        f"that run's output_dir."
    )


def plot_command(args: argparse.Namespace) -> int:
    """Handler of ``tune plot``."""
    from torchtune.utils.plotting import plot_metrics, plotted_series

    metrics = find_metrics_file(args.output_dir)
    default_dir = metrics.parent.parent if metrics.parent.name == "logs" else metrics.parent
    out = args.out if args.out is not None else default_dir / "metrics.png"
    written = plot_metrics(metrics, out)
    print(f"Wrote {written} ({', '.join(plotted_series(metrics))} against step)")
    return 0
