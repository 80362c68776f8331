"""``eval_after_training``: the final model of a finetune scored on lm-eval tasks, as ``eleuther_eval``
scores a checkpoint. lm-eval is imported only when the node is set (``torchtune.evaluation`` is lazy)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Dict, Optional

from torch import nn

from torchtune import evaluation
from torchtune._errors import ConfigError

log = logging.getLogger("torchtune")

__all__ = ["EVAL_AFTER_TRAINING_KEYS", "EvalAfterTraining"]

# The keys of eval_after_training (those of the eleuther_eval recipe that say what to evaluate).
EVAL_AFTER_TRAINING_KEYS = ("tasks", "limit", "num_fewshot", "batch_size", "max_seq_length")


class EvalAfterTraining:
    """The checked ``eval_after_training`` node of a config; ``settings`` is None when it is null (no eval).

    Raises:
        ConfigError: a node that is not a mapping of exactly ``EVAL_AFTER_TRAINING_KEYS``, or a bad value.
    """

    def __init__(self, cfg: Any) -> None:
        from omegaconf import DictConfig

        node = cfg.eval_after_training
        self.settings: Optional[evaluation.EvalSettings] = None
        self._tasks: Optional[evaluation.ResolvedTasks] = None
        if node is None:
            return
        if not isinstance(node, DictConfig) or set(node.keys()) != set(EVAL_AFTER_TRAINING_KEYS):
            raise ConfigError(
                "eval_after_training must be null (no eval) or a mapping of exactly "
                f"{', '.join(EVAL_AFTER_TRAINING_KEYS)}, e.g. eval_after_training={{tasks: [truthfulqa_mc2], "
                f"limit: null, num_fewshot: null, batch_size: 8, max_seq_length: null}}; got {node!r}."
            )
        seed = cfg.seed if cfg.seed is not None else 1234
        self.settings = evaluation.eval_settings(node, prefix="eval_after_training.", seed=seed)

    def resolve_tasks(self) -> None:
        """Before training: a missing lm-eval or a typo in a task name stops the run now, not after it."""
        if self.settings is not None:
            evaluation.import_lm_eval()
            self._tasks = evaluation.resolve_tasks(self.settings.tasks)

    def score(
        self,
        model: nn.Module,
        tokenizer: Any,
        metrics: Any,
        *,
        step: int,
        checkpoint: Optional[Path],
    ) -> Optional[Dict[str, Any]]:
        """Score ``model`` on the tasks (nothing when the node is null); where ``metrics`` (the run's
        ``StepMetrics``) writes, print lm-eval's table, log ``eval/<task>/<metric>`` to its logger and
        write ``eval_results.json`` into ``checkpoint``; returns lm-eval's results there.

        Every process of a sharded model calls it: each runs the same requests in the same batches, so
        the forward passes (and FSDP's all-gathers in them) match; only rank 0 reports.
        """
        writes = metrics.writes
        if self.settings is None or self._tasks is None:
            return None
        start = time.perf_counter()
        lm = evaluation.build_lm(model, tokenizer, self.settings)
        results = evaluation.run_tasks(lm, self._tasks, self.settings, reporting=writes)
        model.train()  # build_lm put it in eval mode
        if not writes:
            return None
        print(evaluation.results_table(results))
        scores = evaluation.primary_scores(results)
        metrics.logger.log_dict(
            {f"eval/{task}/{metric}": value for task, metrics in scores.items() for metric, value in metrics.items()},
            step=step,
        )
        if checkpoint is not None:
            path = evaluation.write_results(
                results,
                Path(checkpoint) / "eval_results.json",
                extra={"checkpoint_dir": str(checkpoint), "settings": self.settings.as_dict()},
            )
            log.info("Scores of the final model written to %s (%.0f s)", path, time.perf_counter() - start)
        return results
