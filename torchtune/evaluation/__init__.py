"""Scoring a model with EleutherAI's lm-evaluation-harness (the optional ``eval`` extra).

What the eval recipe (and the finetune recipe's ``eval_after_training``) composes::

    settings = evaluation.eval_settings(cfg)                 # the config's keys, checked
    tasks = evaluation.resolve_tasks(settings.tasks)         # names or YAML paths; unknown -> close matches
    lm = evaluation.build_lm(model, tokenizer, settings)     # TuneLM: a TemplateLM on our model
    results = evaluation.run_tasks(lm, tasks, settings)      # lm-eval's simple_evaluate
    print(evaluation.results_table(results))
    evaluation.write_results(results, path)

Importing this package does not import lm-eval; the functions above do, with an install hint when it
is missing, and so does ``torchtune.evaluation.TuneLM`` (the wrapper, an lm-eval ``TemplateLM``), which
is imported on first use.
"""

from typing import Any

from torchtune.evaluation._harness import (
    BUNDLED_TASKS_DIR,
    INSTALL_COMMAND,
    EvalSettings,
    ResolvedTasks,
    build_lm,
    check_writable,
    eval_settings,
    import_lm_eval,
    primary_scores,
    resolve_tasks,
    results_path,
    results_table,
    run_tasks,
    score_changes,
    write_results,
)

__all__ = [
    "TuneLM",
    "BUNDLED_TASKS_DIR",
    "EvalSettings",
    "INSTALL_COMMAND",
    "ResolvedTasks",
    "build_lm",
    "check_writable",
    "eval_settings",
    "import_lm_eval",
    "primary_scores",
    "score_changes",
    "resolve_tasks",
    "results_path",
    "results_table",
    "run_tasks",
    "write_results",
]


def __getattr__(name: str) -> Any:
    # TuneLM subclasses lm-eval's TemplateLM: importing it imports lm-eval, so only when asked for.
    if name == "TuneLM":
        import_lm_eval()
        from torchtune.evaluation._lm import TuneLM

        return TuneLM
    raise AttributeError(f"module 'torchtune.evaluation' has no attribute {name!r}")
